//! End to end: eviction under memory pressure, on real cgroups with the
//! real control plane, both runtimes. The node's pods get a private
//! cgroup root whose `kubepods` is capped at 600 MiB by node allocatable
//! (systemReserved = the machine's memory − 600 MiB), so the test never
//! starves the machine; `allocatableMemory.available < 150Mi` is the hard
//! threshold. A BestEffort pod ramping its memory at about 100 MiB/s and
//! another at about 20 MiB/s (up to 100 MiB), beside an idle Burstable
//! and an idle Guaranteed pod:
//! - the hog is evicted as upstream's are (phase Failed, reason
//!   `Evicted`, upstream's message, `DisruptionTarget` condition, an
//!   `Evicted` event, `kubelet_evictions` counted), with no kernel OOM
//!   kill in the pods' cgroup (its counters and `dmesg`);
//! - the others keep running;
//! - `MemoryPressure` is set, a BestEffort pod created meanwhile is
//!   refused (`Evicted`, "The node had condition: [MemoryPressure]. "),
//!   the controller-manager taints the node `memory-pressure:NoSchedule`;
//!   both go once the transition period (10 s here) has passed.
//!
//! And a static pod holding 350 MiB (critical: never evicted, though it
//! uses the most) beside an API pod ramping at about 20 MiB/s: the API
//! pod is evicted, the static one keeps running.
//!
//! Disk: the node's root dir on a 300 MiB loop-mounted ext4,
//! `nodefs.available<120Mi`; a pod filling an emptyDir → a finished pod's
//! dead container and log, and the unused image, are reclaimed first, then
//! the writer is evicted (`ephemeral-storage`), its emptyDir freed, `DiskPressure` set and cleared; a pod over its
//! emptyDir `sizeLimit` is evicted at once with upstream's message.
//!
//! Ephemeral storage: a container writing 24 MiB into its own root
//! filesystem (its writable layer) with a 10Mi `ephemeral-storage` limit is
//! evicted with upstream's container message (its pod's total limit
//! 110Mi) or its pod's (a pod of one container), no disk pressure needed;
//! a container within its limit keeps running, BestEffort.
//!
//! PIDs: `podPidsLimit: 300` is the pod cgroup's `pids.max` with either
//! runtime; a fork bomb stops there, `pid.available` set 150 tasks above
//! the node's count is met, the bomb is evicted (`PIDPressure` set), an
//! idle pod beside it keeps running.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};

crate::both_runtimes!(
    memory_pressure_evicts_the_hog_and_spares_the_rest,
    a_critical_static_pod_is_spared_though_it_uses_most,
    disk_pressure_collects_images_then_evicts_the_writer,
    a_fork_bomb_is_bounded_by_the_pod_pids_limit_and_evicted,
    a_container_over_its_ephemeral_storage_limit_is_evicted
);

/// `pid.available` is the whole machine's: the fork-bomb test runs alone
/// (write), the others beside each other (read), so their processes do not
/// move its threshold.
static PIDS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

const BB: &str = "kinglet.test/busybox:1";
const MI: u64 = 1 << 20;

fn mem_total() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Removes the test's cgroup root from every hierarchy, deepest first.
fn remove_cgroups(root: &str) {
    fn rm(dir: &std::path::Path) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rm(&e.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        rm(&h.path().join(root));
    }
    rm(&std::path::Path::new("/sys/fs/cgroup").join(root));
}

/// Kernel OOM kills in the pods' cgroup and below: v1 counts a kill in
/// the cgroup of the task killed (a container's), so the subtree is
/// summed; v2's `memory.events` is hierarchical.
fn oom_kills(root: &str) -> u64 {
    fn count(text: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
    fn walk(dir: &std::path::Path) -> u64 {
        let own = std::fs::read_to_string(dir.join("memory.oom_control")).map_or(0, |t| count(&t));
        let children: u64 = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| walk(&e.path()))
            .sum();
        own + children
    }
    let v1 = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory/{root}/kubepods"));
    if v1.exists() {
        return walk(&v1);
    }
    let v2 = format!("/sys/fs/cgroup/{root}/kubepods/memory.events");
    std::fs::read_to_string(v2).map_or(0, |t| count(&t))
}

/// OOM kills the kernel logged for a memory cgroup under `root`
/// (`oom-kill:…,oom_memcg=/<root>/…` lines of `dmesg`).
fn dmesg_oom_kills(root: &str) -> usize {
    let out = std::process::Command::new("dmesg").output().unwrap();
    assert!(out.status.success(), "dmesg: {out:?}");
    let needle = format!("oom_memcg=/{root}/");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("oom-kill:") && l.contains(&needle))
        .count()
}

/// The node's `/metrics`, with the cluster admin's client certificate.
fn node_metrics(k: &Kinglet) -> String {
    let pki = cluster_dir().join("pki");
    let out = std::process::Command::new("curl")
        .args(["-sfk", "--cert"])
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .arg(format!("https://127.0.0.1:{}/metrics", k.api_port))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn create(pods: &Api<Pod>, node: &str, name: &str, container: serde_json::Value) {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                 "restartPolicy": "Never", "containers": [container]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
}

async fn phase(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get(name).await.ok()?.status?.phase
}

/// Waits up to `secs` for pod `name` to fail; its status.
async fn failed(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    secs: u64,
) -> k8s_openapi::api::core::v1::PodStatus {
    wait_for(what, Duration::from_secs(secs), || async {
        let s = pods.get(name).await.ok()?.status?;
        (s.phase.as_deref() == Some("Failed")).then_some(s)
    })
    .await
}

fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key && t.effect == "NoSchedule"))
}

/// A node whose pods' cgroup is capped at 600 MiB with a hard threshold
/// at 150 MiB available; `extra` config lines. (node, its cgroup root).
async fn small_node(rt: Rt, prefix: &str, extra: &str) -> (Kinglet, String) {
    let admin = admin().await;
    let name = unique_name(&format!("{prefix}-{}", format!("{rt:?}").to_lowercase()));
    let root = format!("kinglet-{name}");
    let reserved = mem_total() - 600 * MI;
    let config = format!(
        "{FAST_CONFIG}cgroupRoot: /{root}\nsystemReserved: {{memory: \"{reserved}\"}}\nevictionHard: {{allocatableMemory.available: 150Mi}}\nevictionPressureTransitionPeriod: 10s\n{extra}"
    );
    let k = Kinglet::start_rt(rt, &name, &config, true, &[], &[pods::busybox_archive()]);
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(60)).await;
    (k, root)
}

/// Stops the node, deletes its Node, then removes its cgroup root (the
/// node and its runtime gone first, so nothing holds the cgroups).
async fn retire(mut k: Kinglet, root: &str) {
    k.terminate(Duration::from_secs(5));
    let nodes: Api<Node> = Api::all(admin().await);
    let _ = nodes.delete(&k.name, &Default::default()).await;
    drop(k);
    remove_cgroups(root);
}

/// Anonymous memory at `per_tenth` MiB every 0.1 s (about 10× that a
/// second), up to `mib` if given, then held.
fn ramp(per_tenth: u32, mib: Option<u32>) -> String {
    let until = mib.map_or(String::new(), |m| format!("i<{m}"));
    format!(
        r#"awk 'BEGIN{{ b=sprintf("%1048576s",""); for(i=0;{until};i++){{ a[i]=b i; if(i%{per_tenth}=={}) system("sleep 0.1") }}; system("sleep 3600") }}'"#,
        per_tenth - 1
    )
}

async fn memory_pressure_evicts_the_hog_and_spares_the_rest(rt: Rt) {
    let _shared = PIDS.read().await;
    let admin = admin().await;
    let (k, root) = small_node(rt, "kl-evict", "").await;
    let name = k.name.clone();
    let nodes: Api<Node> = Api::all(admin.clone());
    let limit = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/{root}/kubepods/memory.limit_in_bytes"
    ))
    .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/{root}/kubepods/memory.max")))
    .unwrap();
    assert_eq!(
        limit.trim(),
        (600 * MI).to_string(),
        "node allocatable enforced"
    );

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let idle = serde_json::json!(["sleep", "3600"]);
    let (burstable, guaranteed, hog, slow) = (
        format!("{name}-b"),
        format!("{name}-g"),
        format!("{name}-hog"),
        format!("{name}-slow"),
    );
    let oom_lines = dmesg_oom_kills(&root);
    create(
        &pods,
        &name,
        &burstable,
        serde_json::json!({"name": "c", "image": BB, "command": idle,
        "resources": {"requests": {"memory": "10Mi"}}}),
    )
    .await;
    create(
        &pods,
        &name,
        &guaranteed,
        serde_json::json!({"name": "c", "image": BB, "command": idle,
        "resources": {"limits": {"memory": "50Mi", "cpu": "50m"}}}),
    )
    .await;
    for p in [&burstable, &guaranteed] {
        wait_for("the idle pods run", Duration::from_secs(60), || async {
            (phase(&pods, p).await.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }
    // About 20 MiB/s up to 100 MiB, kept: the slower ramp, never the
    // one to go (less memory, same class).
    create(
        &pods,
        &name,
        &slow,
        serde_json::json!({"name": "slow", "image": BB,
        "command": ["sh", "-c", ramp(2, Some(100))]}),
    )
    .await;
    // About 100 MiB/s of anonymous memory, kept.
    create(
        &pods,
        &name,
        &hog,
        serde_json::json!({"name": "hog", "image": BB,
        "command": ["sh", "-c", ramp(10, None)]}),
    )
    .await;
    wait_for("the hog runs", Duration::from_secs(60), || async {
        (phase(&pods, &hog).await.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let started = Instant::now();
    let hog_status = failed(&pods, &hog, "the hog is evicted", 60).await;
    let evicted_at = Instant::now();
    eprintln!(
        "figure: eviction {rt:?}: hog evicted {:?} after it started ramping",
        started.elapsed()
    );
    assert_eq!(
        hog_status.reason.as_deref(),
        Some("Evicted"),
        "{hog_status:?}"
    );
    let msg = hog_status.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(
            "The node was low on resource: memory. Threshold quantity: 150Mi, available: "
        ),
        "{msg}"
    );
    assert!(msg.contains("Container hog was using "), "{msg}");
    let disruption = hog_status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .unwrap_or_else(|| panic!("no DisruptionTarget: {hog_status:?}"));
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    assert_eq!(oom_kills(&root), 0, "the kernel OOM killer acted first");
    assert_eq!(
        dmesg_oom_kills(&root),
        oom_lines,
        "the kernel logged an OOM kill"
    );
    let metrics = node_metrics(&k);
    assert!(
        metrics
            .contains("kubelet_evictions_total{eviction_signal=\"allocatableMemory.available\"} 1"),
        "{metrics}"
    );
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    wait_for("the Evicted event", Duration::from_secs(30), || async {
        let lp = ListParams::default().fields(&format!("involvedObject.name={hog}"));
        let l = events.list(&lp).await.ok()?;
        l.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Evicted"))
            .then_some(())
    })
    .await;

    // Under pressure: the condition, the taint, a BestEffort pod refused.
    let n = wait_for("MemoryPressure", Duration::from_secs(20), || async {
        let n = nodes.get(&name).await.ok()?;
        (condition(&n, "MemoryPressure").map(|c| c.0).as_deref() == Some("True")).then_some(n)
    })
    .await;
    let refused = format!("{name}-be");
    create(
        &pods,
        &name,
        &refused,
        serde_json::json!({"name": "c", "image": BB, "command": idle}),
    )
    .await;
    let s = failed(&pods, &refused, "the BestEffort pod refused", 20).await;
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );
    let _ = n;
    wait_for(
        "the memory-pressure taint",
        Duration::from_secs(30),
        || async {
            let n = nodes.get(&name).await.ok()?;
            has_taint(&n, "node.kubernetes.io/memory-pressure").then_some(())
        },
    )
    .await;
    for p in [&burstable, &guaranteed, &slow] {
        assert_eq!(
            phase(&pods, p).await.as_deref(),
            Some("Running"),
            "{p} was touched"
        );
    }
    // The hog's memory is back: the condition and the taint go after the
    // transition period.
    wait_for(
        "MemoryPressure cleared",
        Duration::from_secs(60),
        || async {
            let n = nodes.get(&name).await.ok()?;
            let cleared = condition(&n, "MemoryPressure").map(|c| c.0).as_deref() == Some("False");
            (cleared && !has_taint(&n, "node.kubernetes.io/memory-pressure")).then_some(())
        },
    )
    .await;
    // Not before the transition period (10 s) from the last time the
    // threshold was met, which was before the hog's Failed status was
    // seen (a status write takes ≤ 1 s here, hence the slack).
    let held = evicted_at.elapsed();
    assert!(
        held >= Duration::from_secs(8),
        "MemoryPressure cleared {held:?} after the eviction, within the 10 s transition period"
    );
    let log = k.log();
    for l in log
        .lines()
        .filter(|l| l.contains("eviction") || l.contains("memcg"))
    {
        eprintln!("{l}");
    }
    let line = log
        .lines()
        .find(|l| l.contains("evicting"))
        .unwrap_or_else(|| panic!("no eviction logged:\n{log}"));
    let field = |k: &str| {
        let rest = line.split(&format!("{k}=")).nth(1).unwrap_or("?");
        match rest.strip_prefix('"') {
            Some(q) => q.split('"').next().unwrap_or("?").to_string(),
            None => rest.split_whitespace().next().unwrap_or("?").to_string(),
        }
    };
    let evictions = log.lines().filter(|l| l.contains("evicting")).count();
    assert_eq!(evictions, 1, "one pod, evicted once:\n{log}");
    eprintln!(
        "figure: eviction {rt:?}: woken by {}, decided in {} after the wake-up",
        field("woken_by"),
        field("decided_in")
    );
    delete_pods(&pods, &[burstable, guaranteed, hog, slow, refused]).await;
    retire(k, &root).await;
}

async fn a_critical_static_pod_is_spared_though_it_uses_most(rt: Rt) {
    let _shared = PIDS.read().await;
    let admin = admin().await;
    let manifests = tempfile::tempdir().unwrap();
    let extra = format!("staticPodPath: {}\n", manifests.path().display());
    let (k, root) = small_node(rt, "kl-spare", &extra).await;
    let name = k.name.clone();
    // The static pod takes 350 MiB and holds it (the script in a YAML
    // single-quoted string: its quotes doubled).
    let big = ramp(10, Some(350)).replace('\'', "''");
    std::fs::write(
        manifests.path().join("big.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: big, namespace: default}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: big\n    image: {BB}\n    command: [sh, -c, '{big}']\n"
        ),
    )
    .unwrap();
    let mirror = format!("big-{name}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    wait_for(
        "the static pod holds 350 MiB",
        Duration::from_secs(90),
        || async {
            let usage = std::fs::read_to_string(format!(
                "/sys/fs/cgroup/memory/{root}/kubepods/memory.usage_in_bytes"
            ))
            .or_else(|_| {
                std::fs::read_to_string(format!("/sys/fs/cgroup/{root}/kubepods/memory.current"))
            })
            .ok()?;
            (usage.trim().parse::<u64>().ok()? >= 345 * MI).then_some(())
        },
    )
    .await;
    // About 20 MiB/s from an API pod: the threshold is met with it near
    // 100 MiB and the static pod at 350.
    let slow = format!("{name}-slow");
    create(
        &pods,
        &name,
        &slow,
        serde_json::json!({"name": "slow", "image": BB,
        "command": ["sh", "-c", ramp(2, None)]}),
    )
    .await;
    let s = failed(&pods, &slow, "the API pod is evicted", 60).await;
    let log = k.log();
    for l in log.lines().filter(|l| l.contains("evicting")) {
        println!("figure: static pod spared {rt:?}: {l}");
    }
    assert_eq!(s.reason.as_deref(), Some("Evicted"), "{s:?}");
    assert_eq!(
        oom_kills(&root),
        0,
        "the kernel OOM killer acted first\n{log}"
    );
    let m = pods.get(&mirror).await.unwrap();
    assert_eq!(
        m.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "the static pod was touched"
    );
    assert_eq!(
        log.lines().filter(|l| l.contains("evicting")).count(),
        1,
        "{log}"
    );
    std::fs::remove_file(manifests.path().join("big.yaml")).unwrap();
    delete_pods(&pods, &[slow]).await;
    wait_for("the static pod stops", Duration::from_secs(30), || async {
        pods.get(&mirror).await.is_err().then_some(())
    })
    .await;
    retire(k, &root).await;
}

async fn disk_pressure_collects_images_then_evicts_the_writer(rt: Rt) {
    let _shared = PIDS.read().await;
    let admin = admin().await;
    let name = unique_name(&format!("kl-disk-{}", format!("{rt:?}").to_lowercase()));
    let config = format!(
        "{FAST_CONFIG}evictionHard: {{nodefs.available: 120Mi}}\nevictionPressureTransitionPeriod: 10s\nimageMinimumGCAge: 0s\n"
    );
    let fs = std::cell::RefCell::new(None);
    let k = Kinglet::start_rt_prepared(
        rt,
        &name,
        &config,
        true,
        &[],
        // The unused image (usr2): collected before any pod is evicted;
        // usr1, which a waiting pod names, is kept.
        &[
            pods::busybox_archive(),
            pods::busybox_usr1_archive(),
            pods::busybox_usr2_archive(),
        ],
        &|root| *fs.borrow_mut() = Some(pods::LoopFs::mount(root, 300)),
    );
    let fs = fs.into_inner().unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(60)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let idle = format!("{name}-idle");
    create(
        &pods,
        &name,
        &idle,
        serde_json::json!({"name": "c", "image": BB,
        "command": ["sleep", "3600"]}),
    )
    .await;
    // A pod whose main container waits on its init container: no
    // container uses its image yet, and image GC must spare it.
    let waiting = format!("{name}-waiting");
    let w: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": waiting},
        "spec": {"nodeName": name, "terminationGracePeriodSeconds": 1,
                 "initContainers": [{"name": "first", "image": BB, "command": ["sleep", "3600"]}],
                 "containers": [{"name": "c", "image": "kinglet.test/busybox-usr1:1",
                                 "command": ["sleep", "3600"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &w).await.unwrap();
    // A finished pod: its dead container and log go before any eviction.
    let done = format!("{name}-done");
    create(
        &pods,
        &name,
        &done,
        serde_json::json!({"name": "c", "image": BB, "command": ["sh", "-c", "echo finished"]}),
    )
    .await;
    wait_for("the finished pod", Duration::from_secs(60), || async {
        (phase(&pods, &done).await.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    let writer = format!("{name}-writer");
    let mut p: serde_json::Value = serde_json::json!({
        "metadata": {"name": writer},
        "spec": {"nodeName": name, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                 "volumes": [{"name": "data", "emptyDir": {}}],
                 "containers": [{"name": "w", "image": BB,
                     "command": ["sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M count=220; sleep 3600"],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}
    });
    let pod: Pod = serde_json::from_value(p.take()).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let s = failed(&pods, &writer, "the writer is evicted", 90).await;
    assert_eq!(s.reason.as_deref(), Some("Evicted"), "{s:?}");
    let msg = s.message.unwrap_or_default();
    assert!(
        msg.starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: 120Mi, available: "),
        "{msg}"
    );
    let log = k.log();
    let reclaimed = log
        .lines()
        .position(|l| l.contains("disk pressure: unused images removed"));
    let evicted = log.lines().position(|l| l.contains("evicting"));
    assert!(
        matches!((reclaimed, evicted), (Some(r), Some(e)) if r < e),
        "image GC did not come first:\n{log}"
    );
    let dead = log
        .lines()
        .position(|l| l.contains("dead containers of finished pods removed containers=1"));
    assert!(
        matches!((dead, evicted), (Some(d), Some(e)) if d < e),
        "the finished pod's container was not reclaimed first:\n{log}"
    );
    let (ok, out) = {
        let o = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(cluster_dir().join("admin.kubeconfig"))
            .args(["logs", &done])
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    assert!(
        !ok || !out.contains("finished"),
        "its log is still served: {out}"
    );
    assert_eq!(
        phase(&pods, &done).await.as_deref(),
        Some("Succeeded"),
        "the finished pod's status changed"
    );
    let first = log
        .lines()
        .find(|l| l.contains("disk pressure: unused images removed"))
        .unwrap_or_default();
    let gc: Vec<&str> = log.lines().filter(|l| l.contains("image")).collect();
    // usr2 only: usr1 is the waiting pod's (both would be 2).
    assert!(
        first.contains("images=1"),
        "not exactly the unused image collected: {first}\n{}",
        gc.join("\n")
    );

    assert_eq!(phase(&pods, &idle).await.as_deref(), Some("Running"));
    // The writer's emptyDir went with its termination: the disk recovers.
    wait_for(
        "DiskPressure set, then cleared",
        Duration::from_secs(60),
        || async {
            let n = nodes.get(&name).await.ok()?;
            (condition(&n, "DiskPressure").map(|c| c.0).as_deref() == Some("False")).then_some(())
        },
    )
    .await;
    let free = nix_free(&fs.at);
    assert!(
        free > 150 * MI,
        "the emptyDir was not freed: {free} bytes free"
    );
    // An emptyDir over its sizeLimit: evicted whatever the node's state.
    let over = format!("{name}-over");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": over},
        "spec": {"nodeName": name, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                 "volumes": [{"name": "small", "emptyDir": {"sizeLimit": "1Mi"}}],
                 "containers": [{"name": "w", "image": BB,
                     "command": ["sh", "-c", "dd if=/dev/zero of=/small/f bs=1M count=4; sleep 3600"],
                     "volumeMounts": [{"name": "small", "mountPath": "/small"}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let s = failed(&pods, &over, "the pod over its sizeLimit is evicted", 60).await;
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("Usage of EmptyDir volume \"small\" exceeds the limit \"1Mi\". ")
    );
    delete_pods(&pods, &[idle, writer, over, done, waiting]).await;
    let _ = nodes.delete(&name, &Default::default()).await;
    // The node (its monitor and runtime, which live on the loop
    // filesystem) goes before the filesystem, or it outlives the unmount.
    drop(k);
    drop(fs);
}

/// Free bytes of the filesystem at `p` (`df`).
fn nix_free(p: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

/// A threshold no node could ever be above (`memory.available<100Ti`):
/// said once and ignored, never a pressure condition or an eviction storm.
#[tokio::test]
async fn a_threshold_above_the_capacity_is_ignored_with_a_clear_line() {
    let _shared = PIDS.read().await;
    let admin = admin().await;
    let name = unique_name("kl-bigthr");
    let config = format!("{FAST_CONFIG}evictionHard: {{memory.available: 100Ti}}\n");
    let mut k = Kinglet::start_rt(
        Rt::Oci,
        &name,
        &config,
        true,
        &[],
        &[pods::busybox_archive()],
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let p = format!("{name}-be");
    create(
        &pods,
        &name,
        &p,
        serde_json::json!({"name": "c", "image": BB,
        "command": ["sleep", "3600"]}),
    )
    .await;
    wait_for("the pod runs", Duration::from_secs(60), || async {
        (phase(&pods, &p).await.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let n = nodes.get(&name).await.unwrap();
    assert_eq!(
        condition(&n, "MemoryPressure").map(|c| c.0).as_deref(),
        Some("False")
    );
    let log = k.log();
    assert!(
        log.contains(
            "evictionHard[memory.available]: the threshold is at or above the signal's capacity"
        ),
        "{log}"
    );
    assert!(!log.contains("evicting"), "{log}");
    delete_pods(&pods, &[p]).await;
    k.terminate(Duration::from_secs(5));
}

/// `pid_max` and the tasks running now (`/proc/loadavg`'s total), the
/// two terms of `pid.available`.
fn pid_terms() -> (u64, u64) {
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap();
    let total = load
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split_once('/'))
        .and_then(|(_, t)| t.parse().ok())
        .unwrap();
    (max, total)
}

async fn a_fork_bomb_is_bounded_by_the_pod_pids_limit_and_evicted(rt: Rt) {
    let _alone = PIDS.write().await;
    let admin = admin().await;
    let name = unique_name(&format!("kl-pids-{}", format!("{rt:?}").to_lowercase()));
    let root = format!("kinglet-{name}");
    // Met once the node has 150 more tasks than now, plus what the agent
    // and its runtime start with (≈60): the bomb adds up to 300.
    let (max, now) = pid_terms();
    let threshold = max - (now + 60 + 150);
    let config = format!(
        "{FAST_CONFIG}cgroupRoot: /{root}\npodPidsLimit: 300\nevictionHard: {{pid.available: \"{threshold}\"}}\nevictionPressureTransitionPeriod: 10s\n"
    );
    let k = Kinglet::start_rt(rt, &name, &config, true, &[], &[pods::busybox_archive()]);
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(60)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let (idle, bomb) = (format!("{name}-idle"), format!("{name}-bomb"));
    create(
        &pods,
        &name,
        &idle,
        serde_json::json!({"name": "c", "image": BB, "command": ["sleep", "3600"]}),
    )
    .await;
    wait_for("the idle pod runs", Duration::from_secs(60), || async {
        (phase(&pods, &idle).await.as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert!(
        pid_terms().1 < now + 60 + 150,
        "the node passed the threshold before the bomb"
    );
    create(
        &pods,
        &name,
        &bomb,
        serde_json::json!({"name": "c", "image": BB,
            // The forking shell dies at the limit ("can't fork"); its
            // sleepers stay, held by the container's first shell.
            "command": ["sh", "-c", "sh -c 'while :; do sleep 3600 & done'; exec sleep 3600"]}),
    )
    .await;
    let uid = wait_for("the bomb runs", Duration::from_secs(60), || async {
        let p = pods.get(&bomb).await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then(|| p.metadata.uid.unwrap())
    })
    .await;
    // Bounded by the pod cgroup, whichever runtime made it.
    let cg = format!("/sys/fs/cgroup/pids/{root}/kubepods/besteffort/pod{uid}");
    let cg = if std::path::Path::new(&cg).exists() {
        cg
    } else {
        format!("/sys/fs/cgroup/{root}/kubepods/besteffort/pod{uid}")
    };
    let read = |f: &str| std::fs::read_to_string(format!("{cg}/{f}")).unwrap_or_default();
    assert_eq!(read("pids.max").trim(), "300", "podPidsLimit on {cg}");
    let peak = wait_for("the bomb at its limit", Duration::from_secs(30), || async {
        let n: u64 = read("pids.current").trim().parse().ok()?;
        (n >= 290).then_some(n)
    })
    .await;
    assert!(peak <= 300, "{peak} tasks in a pod limited to 300");
    let s = failed(&pods, &bomb, "the bomb is evicted", 60).await;
    assert_eq!(s.reason.as_deref(), Some("Evicted"), "{s:?}");
    let msg = s.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(&format!(
            "The node was low on resource: pids. Threshold quantity: {threshold}, available: "
        )),
        "{msg}"
    );
    wait_for("PIDPressure", Duration::from_secs(20), || async {
        let n = nodes.get(&name).await.ok()?;
        (condition(&n, "PIDPressure").map(|c| c.0).as_deref() == Some("True")).then_some(())
    })
    .await;
    assert_eq!(
        phase(&pods, &idle).await.as_deref(),
        Some("Running"),
        "the idle pod was touched"
    );
    let log = k.log();
    assert_eq!(
        log.lines().filter(|l| l.contains("evicting")).count(),
        1,
        "{log}"
    );
    eprintln!(
        "figure: fork bomb {rt:?}: held at {peak} tasks by podPidsLimit 300, evicted on pid.available"
    );
    delete_pods(&pods, &[idle, bomb]).await;
    retire(k, &root).await;
}

async fn a_container_over_its_ephemeral_storage_limit_is_evicted(rt: Rt) {
    let _shared = PIDS.read().await;
    let admin = admin().await;
    let name = unique_name(&format!("kl-eph-{}", format!("{rt:?}").to_lowercase()));
    let mut k = Kinglet::start_rt(
        rt,
        &name,
        FAST_CONFIG,
        true,
        &[],
        &[pods::busybox_archive()],
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(60)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let (within, over, total) = (
        format!("{name}-within"),
        format!("{name}-over"),
        format!("{name}-total"),
    );
    let limited = |c: &str, limit: &str, script: &str| {
        serde_json::json!({"name": c, "image": BB, "command": ["sh", "-c", script],
            "resources": {"limits": {"ephemeral-storage": limit}}})
    };
    let write = |mib: u32| format!("dd if=/dev/zero of=/fill bs=1M count={mib}; sleep 3600");
    create(&pods, &name, &within, limited("c", "10Mi", &write(2))).await;
    // Over its own 10Mi, within the pod's 110Mi: the container's message.
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": over},
        "spec": {"nodeName": name, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                 "containers": [limited("c", "10Mi", &write(24)),
                                limited("roomy", "100Mi", "sleep 3600")]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    // One container, over: the pod's total is met first, as upstream.
    create(&pods, &name, &total, limited("c", "10Mi", &write(24))).await;
    let started = Instant::now();
    // containerd measures writable layers every 10 s; the sync is 10 s.
    let s = failed(&pods, &over, "the writer is evicted", 90).await;
    assert_eq!(s.reason.as_deref(), Some("Evicted"), "{s:?}");
    assert_eq!(
        s.message.as_deref(),
        Some("Container c exceeded its local ephemeral storage limit \"10Mi\". ")
    );
    eprintln!(
        "figure: ephemeral-storage limit {rt:?}: evicted {:?} after creation",
        started.elapsed()
    );
    let s = failed(&pods, &total, "the single writer is evicted", 60).await;
    assert_eq!(
        s.message.as_deref(),
        Some("Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. ")
    );
    assert_eq!(phase(&pods, &within).await.as_deref(), Some("Running"));
    let p = pods.get(&within).await.unwrap();
    assert_eq!(
        p.status.and_then(|s| s.qos_class).as_deref(),
        Some("BestEffort"),
        "an ephemeral-storage limit makes no QoS class"
    );
    let n = nodes.get(&name).await.unwrap();
    assert_eq!(
        condition(&n, "DiskPressure").map(|c| c.0).as_deref(),
        Some("False"),
        "a limit, not node pressure"
    );
    let log = k.log();
    assert!(
        log.lines()
            .any(|l| l.contains("evicting") && l.contains("ephemeralcontainerfs.limit")),
        "{log}"
    );
    delete_pods(&pods, &[within, over, total]).await;
    k.terminate(Duration::from_secs(5));
    let _ = nodes.delete(&name, &Default::default()).await;
}
