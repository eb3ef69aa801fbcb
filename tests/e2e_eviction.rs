//! End to end: eviction under memory pressure, on real cgroups with the
//! real control plane, both runtimes. The node's pods get a private
//! cgroup root whose `kubepods` is capped at 600 MiB by node allocatable
//! (systemReserved = the machine's memory − 600 MiB), so the test never
//! starves the machine; `allocatableMemory.available < 150Mi` is the hard
//! threshold. A BestEffort pod ramping its memory at about 100 MiB/s,
//! beside an idle Burstable and an idle Guaranteed pod:
//! - the hog is evicted as upstream's are (phase Failed, reason
//!   `Evicted`, upstream's message, `DisruptionTarget` condition, an
//!   `Evicted` event), with no kernel OOM kill in the pods' cgroup;
//! - the others keep running;
//! - `MemoryPressure` is set, a BestEffort pod created meanwhile is
//!   refused (`Evicted`, "The node had condition: [MemoryPressure]. "),
//!   the controller-manager taints the node `memory-pressure:NoSchedule`;
//!   both go once the transition period (10 s here) has passed.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};

crate::both_runtimes!(memory_pressure_evicts_the_hog_and_spares_the_rest);

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

/// `oom_kill` of the pods' cgroup (v1 `memory.oom_control`, v2
/// `memory.events`).
fn oom_kills(root: &str) -> u64 {
    let v1 = format!("/sys/fs/cgroup/memory/{root}/kubepods/memory.oom_control");
    let v2 = format!("/sys/fs/cgroup/{root}/kubepods/memory.events");
    let text = std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
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

fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key && t.effect == "NoSchedule"))
}

async fn memory_pressure_evicts_the_hog_and_spares_the_rest(rt: Rt) {
    let admin = admin().await;
    let name = unique_name(&format!("kl-evict-{}", format!("{rt:?}").to_lowercase()));
    let root = format!("kinglet-{name}");
    let reserved = mem_total() - 600 * MI;
    let config = format!(
        "{FAST_CONFIG}cgroupRoot: /{root}\nsystemReserved: {{memory: \"{reserved}\"}}\nevictionHard: {{allocatableMemory.available: 150Mi}}\nevictionPressureTransitionPeriod: 10s\n"
    );
    let mut k = Kinglet::start_rt(rt, &name, &config, true, &[], &[pods::busybox_archive()]);
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(60)).await;
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
    let (burstable, guaranteed, hog) = (
        format!("{name}-b"),
        format!("{name}-g"),
        format!("{name}-hog"),
    );
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
    // About 100 MiB/s of anonymous memory, kept.
    let ramp = r#"awk 'BEGIN{ b=sprintf("%1048576s",""); for(i=0;;i++){ a[i]=b i; if(i%10==9) system("sleep 0.1") } }'"#;
    create(
        &pods,
        &name,
        &hog,
        serde_json::json!({"name": "hog", "image": BB,
        "command": ["sh", "-c", ramp]}),
    )
    .await;
    wait_for("the hog runs", Duration::from_secs(60), || async {
        (phase(&pods, &hog).await.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let started = Instant::now();
    let failed = wait_for("the hog is evicted", Duration::from_secs(60), || async {
        let p = pods.get(&hog).await.ok()?;
        let s = p.status?;
        (s.phase.as_deref() == Some("Failed")).then_some(s)
    })
    .await;
    eprintln!(
        "figure: eviction {rt:?}: hog evicted {:?} after it started ramping",
        started.elapsed()
    );
    assert_eq!(failed.reason.as_deref(), Some("Evicted"), "{failed:?}");
    let msg = failed.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(
            "The node was low on resource: memory. Threshold quantity: 150Mi, available: "
        ),
        "{msg}"
    );
    assert!(msg.contains("Container hog was using "), "{msg}");
    let disruption = failed
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .unwrap_or_else(|| panic!("no DisruptionTarget: {failed:?}"));
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    assert_eq!(oom_kills(&root), 0, "the kernel OOM killer acted first");
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
    let s = wait_for(
        "the BestEffort pod refused",
        Duration::from_secs(20),
        || async {
            let s = pods.get(&refused).await.ok()?.status?;
            (s.phase.as_deref() == Some("Failed")).then_some(s)
        },
    )
    .await;
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("The node had condition: [MemoryPressure]. ")
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
    for p in [&burstable, &guaranteed] {
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
    delete_pods(&pods, &[burstable, guaranteed, hog, refused]).await;
    k.terminate(Duration::from_secs(5));
    let _ = nodes.delete(&name, &Default::default()).await;
    remove_cgroups(&root);
}
