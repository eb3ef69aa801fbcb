//! End to end: pods from the real API server on a kinglet node (Node
//! authorizer and NodeRestriction on): a Deployment placed by the real
//! scheduler reaches Running, statuses and events reach the API, a static
//! pod gets its mirror pod, deleted pods are removed, and the last API
//! snapshot brings pods back when the API server is unreachable.

mod common;

use std::time::Duration;

use common::pods::running;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const BB: &str = "kinglet.test/busybox:1";

crate::both_runtimes!(
    a_deployment_runs_and_static_pods_are_mirrored,
    restart_policy_never_fails_in_the_api_and_checkpoint_restores_pods,
    admission_rejects_pods_that_do_not_fit,
    env_reads_configmaps_and_secrets_through_the_node_authorizer,
    image_pull_secrets_authenticate_pulls,
    credential_provider_plugins_authenticate_pulls,
    a_pod_asking_its_own_user_namespace_is_refused_not_run_as_the_host,
);

fn from_yaml<T: serde::de::DeserializeOwned>(y: &str) -> T {
    let v: serde_json::Value = serde_saphyr::from_str(y).unwrap();
    serde_json::from_value(v).unwrap()
}

struct Joined {
    k: Kinglet,
    _dir: tempfile::TempDir,
    manifests: std::path::PathBuf,
}

fn join(rt: Rt, prefix: &str) -> Joined {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let name = unique_name(prefix);
    // The image is there before the node is: pods never wait on a pull.
    let k = Kinglet::start_rt(
        rt,
        &name,
        &format!("{FAST_CONFIG}staticPodPath: {}\n", manifests.display()),
        true,
        &["--pod-log-dir", dir.path().join("logs").to_str().unwrap()],
        &[common::pods::busybox_archive()],
    );
    Joined {
        k,
        _dir: dir,
        manifests,
    }
}

async fn a_deployment_runs_and_static_pods_are_mirrored(rt: Rt) {
    let admin = admin().await;
    let j = join(rt, "kl-api");
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &j.k.name, Duration::from_secs(20)).await;
    let ns = "default";
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let dname = j.k.name.clone();
    let d: Deployment = from_yaml(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {dname}}}\nspec:\n  replicas: 3\n  selector: {{matchLabels: {{app: {dname}}}}}\n  template:\n    metadata: {{labels: {{app: {dname}}}}}\n    spec:\n      nodeSelector: {{kubernetes.io/hostname: {dname}}}\n      terminationGracePeriodSeconds: 2\n      containers:\n      - name: c\n        image: {BB}\n        imagePullPolicy: IfNotPresent\n        command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']\n"
    ));
    let t0 = std::time::Instant::now();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let lp = ListParams::default().labels(&format!("app={dname}"));
    let list = wait_for("3 replicas Running", Duration::from_secs(60), || async {
        let l = pods.list(&lp).await.ok()?;
        (l.items.len() == 3 && l.items.iter().all(running)).then_some(l)
    })
    .await;
    eprintln!(
        "figure: deployment of 3 replicas Running in the API after {:?}",
        t0.elapsed()
    );
    for p in &list.items {
        let st = p.status.as_ref().unwrap();
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some(dname.as_str())
        );
        let c = &st.container_statuses.as_ref().unwrap()[0];
        assert!(
            c.container_id
                .as_deref()
                .unwrap()
                .starts_with(j.k.id_scheme())
        );
        assert!(c.image_id.contains("sha256:"));
        let types: Vec<&str> = st
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.status == "True")
            .map(|c| c.type_.as_str())
            .collect();
        for t in [
            "PodScheduled",
            "PodReadyToStartContainers",
            "Initialized",
            "ContainersReady",
            "Ready",
        ] {
            assert!(types.contains(&t), "{t} not True: {types:?}");
        }
        assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    }
    // Events reach the API.
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    let first = list.items[0].metadata.name.clone().unwrap();
    wait_for("Started event", Duration::from_secs(15), || async {
        let evs = events.list(&ListParams::default()).await.ok()?;
        evs.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Started")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(first.as_str())
            })
            .then_some(())
    })
    .await;

    // A static pod appears in the API as its mirror pod.
    std::fs::write(
        j.manifests.join("static.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sleep, '1000']}}\n"),
    )
    .unwrap();
    let mirror_name = format!("web-{dname}");
    let mirror = wait_for("mirror pod Running", Duration::from_secs(30), || async {
        pods.get_opt(&mirror_name)
            .await
            .ok()
            .flatten()
            .filter(running)
    })
    .await;
    let ann = mirror.metadata.annotations.clone().unwrap();
    assert!(ann.contains_key("kubernetes.io/config.mirror"));
    assert_eq!(mirror.metadata.owner_references.unwrap()[0].kind, "Node");

    // Deleting the deployment: pods terminate and are removed from the API.
    deployments
        .delete(&dname, &DeleteParams::foreground())
        .await
        .unwrap();
    wait_for("pods deleted", Duration::from_secs(60), || async {
        pods.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    std::fs::remove_file(j.manifests.join("static.yaml")).unwrap();
    wait_for("mirror pod deleted", Duration::from_secs(60), || async {
        pods.get_opt(&mirror_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

async fn restart_policy_never_fails_in_the_api_and_checkpoint_restores_pods(rt: Rt) {
    let admin = admin().await;
    let mut j = join(rt, "kl-api2");
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &j.k.name, Duration::from_secs(20)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let name = j.k.name.clone();
    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-never}}\nspec:\n  nodeName: {name}\n  restartPolicy: Never\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sh, -c, 'exit 3']}}\n"
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
    let failed = wait_for("Failed", Duration::from_secs(30), || async {
        pods.get_opt(&format!("{name}-never"))
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
    })
    .await;
    let t = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));

    let keep: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-keep}}\nspec:\n  nodeName: {name}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sleep, '1001']}}\n"
    ));
    pods.create(&PostParams::default(), &keep).await.unwrap();
    wait_for("keep Running", Duration::from_secs(30), || async {
        pods.get_opt(&format!("{name}-keep"))
            .await
            .ok()
            .flatten()
            .filter(running)
    })
    .await;
    // The node "reboots" while the API server is unreachable: kinglet and
    // every container go; it starts again pointed at a dead API address.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(j.k.pid() as i32, libc::SIGKILL) };
    let _ = j.k.terminate(Duration::from_secs(5));
    j.k.reboot_runtime(&[common::pods::busybox_archive()]);
    let dead = j.k.dir.path().join("dead.kubeconfig");
    let kc = std::fs::read_to_string(node_kubeconfig(&name)).unwrap();
    let port = cluster_port();
    std::fs::write(
        &dead,
        kc.replace(&format!("127.0.0.1:{port}"), "127.0.0.1:1"),
    )
    .unwrap();
    j.k.kubeconfig_override = Some(dead);
    j.k.spawn();
    let root = j.k.dir.path().join("root");
    wait_for(
        "the checkpointed pod running again without the API",
        Duration::from_secs(30),
        || async {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_kinglet"))
                .arg("--root-dir")
                .arg(&root)
                .args(["pods", "ls"])
                .output()
                .ok()?;
            let t = String::from_utf8_lossy(&out.stdout).into_owned();
            t.lines()
                .any(|l| l.contains(&format!("{name}-keep")) && l.contains("Running"))
                .then_some(())
        },
    )
    .await;
    let _ = pods
        .delete(&format!("{name}-never"), &DeleteParams::default())
        .await;
    let _ = pods
        .delete(
            &format!("{name}-keep"),
            &DeleteParams::default().grace_period(0),
        )
        .await;
}

async fn admission_rejects_pods_that_do_not_fit(rt: Rt) {
    let admin = admin().await;
    let j = join(rt, "kl-admit");
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = wait_ready(&nodes, &j.k.name, Duration::from_secs(20)).await;
    let cpus: u32 = node.status.unwrap().allocatable.unwrap()["cpu"]
        .0
        .parse()
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let name = j.k.name.clone();
    // Two pods take all the CPU; a third one cannot fit.
    let half = cpus * 500;
    for i in 0..3 {
        let p: Pod = from_yaml(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-cpu{i}}}\nspec:\n  nodeName: {name}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sleep, '1000'], resources: {{requests: {{cpu: {half}m}}}}}}\n"
        ));
        pods.create(&PostParams::default(), &p).await.unwrap();
        if i < 2 {
            wait_for("admitted pod Running", Duration::from_secs(30), || async {
                pods.get_opt(&format!("{name}-cpu{i}"))
                    .await
                    .ok()
                    .flatten()
                    .filter(running)
            })
            .await;
        }
    }
    let rejected = wait_for("OutOfcpu", Duration::from_secs(30), || async {
        pods.get_opt(&format!("{name}-cpu2"))
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
    })
    .await;
    let st = rejected.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("OutOfcpu"));
    assert!(st.message.unwrap().starts_with(&format!(
        "Pod was rejected: Node didn't have enough resource: cpu, requested: {half}, used: {}",
        2 * half
    )));

    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-sel}}\nspec:\n  nodeName: {name}\n  nodeSelector: {{disktype: ssd}}\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never}}\n"
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
    let sel = wait_for("NodeAffinity", Duration::from_secs(30), || async {
        pods.get_opt(&format!("{name}-sel"))
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("NodeAffinity"))
    })
    .await;
    assert_eq!(sel.status.unwrap().phase.as_deref(), Some("Failed"));

    // An unsafe sysctl is refused before anything runs; a safe one runs.
    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-sysctl}}\nspec:\n  nodeName: {name}\n  securityContext: {{sysctls: [{{name: kernel.msgmax, value: '10000'}}]}}\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never}}\n"
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
    let forbidden = wait_for("SysctlForbidden", Duration::from_secs(30), || async {
        pods.get_opt(&format!("{name}-sysctl"))
            .await
            .ok()
            .flatten()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("SysctlForbidden")
            })
    })
    .await;
    let st = forbidden.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted")
    );
    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-safe}}\nspec:\n  nodeName: {name}\n  terminationGracePeriodSeconds: 1\n  securityContext: {{sysctls: [{{name: kernel.shm_rmid_forced, value: '1'}}]}}\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sh, -c, 'cat /proc/sys/kernel/shm_rmid_forced; sleep 1000']}}\n"
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
    wait_for(
        "a safe sysctl's pod Running",
        Duration::from_secs(30),
        || async {
            pods.get_opt(&format!("{name}-safe"))
                .await
                .ok()
                .flatten()
                .filter(running)
        },
    )
    .await;

    // A pod the apiserver takes but no small node should run: refused by
    // kinglet's own bound, with a reason and an event, never started.
    let containers: Vec<String> = (0..101)
        .map(|i| format!("  - {{name: c{i}, image: {BB}, imagePullPolicy: Never}}"))
        .collect();
    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-huge}}\nspec:\n  nodeName: {name}\n  containers:\n{}\n",
        containers.join("\n")
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
    let huge = wait_for("InvalidPod", Duration::from_secs(30), || async {
        pods.get_opt(&format!("{name}-huge"))
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("InvalidPod"))
    })
    .await;
    let st = huge.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was rejected: spec.containers: Too many: 101: must have at most 100 items")
    );
    assert!(
        st.container_statuses
            .is_none_or(|c| c.iter().all(|c| c.container_id.is_none()))
    );
    for s in ["cpu0", "cpu1", "cpu2", "sel", "sysctl", "safe", "huge"] {
        let _ = pods
            .delete(
                &format!("{name}-{s}"),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }

    // A NoExecute taint an admin puts on the node (kubectl taint): a pod
    // that does not tolerate it is refused, one that does runs.
    let taint = serde_json::json!({"spec": {"taints": [{"key": "kinglet.test/drain", "value": "yes", "effect": "NoExecute"}]}});
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .unwrap();
    for (s, tolerations) in [
        ("untolerated", "[]"),
        ("tolerated", "[{key: kinglet.test/drain, operator: Exists}]"),
    ] {
        let p: Pod = from_yaml(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-{s}}}\nspec:\n  nodeName: {name}\n  terminationGracePeriodSeconds: 1\n  tolerations: {tolerations}\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sleep, '1000']}}\n"
        ));
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    // The taint manager deletes the refused pod soon after: its event
    // stays.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    let refused = wait_for(
        "a TaintToleration event",
        Duration::from_secs(30),
        || async {
            let evs = events.list(&ListParams::default()).await.ok()?;
            evs.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref())
                    == Some(format!("{name}-untolerated").as_str())
                    && e.reason.as_deref() == Some("TaintToleration")
            })
        },
    )
    .await;
    assert_eq!(
        refused.note.as_deref(),
        Some("Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate")
    );
    wait_for(
        "the tolerating pod Running",
        Duration::from_secs(30),
        || async {
            pods.get_opt(&format!("{name}-tolerated"))
                .await
                .ok()
                .flatten()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        },
    )
    .await;
    for s in ["untolerated", "tolerated"] {
        let _ = pods
            .delete(
                &format!("{name}-{s}"),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
}

async fn env_reads_configmaps_and_secrets_through_the_node_authorizer(rt: Rt) {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let admin = admin().await;
    let j = join(rt, "kl-env");
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &j.k.name, Duration::from_secs(20)).await;
    let name = j.k.name.clone();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    cms.create(
        &PostParams::default(),
        &from_yaml(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}-cm}}\ndata: {{greeting: hello, other: two}}\n"
        )),
    )
    .await
    .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &from_yaml(&format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}-s}}\nstringData: {{pw: s3cret}}\n"
            )),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-env}}\nspec:\n  nodeName: {name}\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {BB}\n    imagePullPolicy: Never\n    command: [sh, -c, 'printf \"%s %s %s\" \"$G\" \"$P\" \"$X_other\" > /dev/termination-log']\n    envFrom: [{{configMapRef: {{name: {name}-cm}}, prefix: X_}}]\n    env:\n    - {{name: G, valueFrom: {{configMapKeyRef: {{name: {name}-cm, key: greeting}}}}}}\n    - {{name: P, valueFrom: {{secretKeyRef: {{name: {name}-s, key: pw}}}}}}\n"
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
    let bad: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-badkey}}\nspec:\n  nodeName: {name}\n  containers:\n  - name: c\n    image: {BB}\n    imagePullPolicy: Never\n    env: [{{name: G, valueFrom: {{configMapKeyRef: {{name: {name}-cm, key: nope}}}}}}]\n"
    ));
    pods.create(&PostParams::default(), &bad).await.unwrap();
    let done = wait_for("env pod Succeeded", Duration::from_secs(30), || async {
        pods.get_opt(&format!("{name}-env"))
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
    })
    .await;
    let t = done.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(t.message.as_deref(), Some("hello s3cret two"));
    // The Secret's value is on disk (the container's config, the pod's
    // record of its termination message) but no local user but root reads
    // it; the API checkpoint is root's only too.
    let root = j.k.dir.path().join("root");
    let nobody = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "grep",
            "-rl",
            "s3cret",
        ])
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        nobody.stdout.is_empty(),
        "nobody read: {}",
        String::from_utf8_lossy(&nobody.stdout)
    );
    let by_root = std::process::Command::new("grep")
        .args(["-rl", "s3cret"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        !by_root.stdout.is_empty(),
        "the value is expected on disk, for root"
    );
    // The API checkpoint is sealed in the local store (0600, no value in
    // clear): no file of the store holds it.
    let found = String::from_utf8_lossy(&by_root.stdout).into_owned();
    assert!(!found.contains("/store/"), "in clear in the store: {found}");
    let checkpoint = std::fs::read_dir(root.join("store/api-pods"))
        .unwrap()
        .next()
        .expect("the checkpoint in the store")
        .unwrap()
        .path();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&checkpoint).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "{}", checkpoint.display());
    assert!(!root.join("pods/api-checkpoint.json").exists());
    let waiting = wait_for(
        "CreateContainerConfigError",
        Duration::from_secs(30),
        || async {
            let p = pods.get_opt(&format!("{name}-badkey")).await.ok()??;
            let w = p.status?.container_statuses?[0].state.clone()?.waiting?;
            (w.reason.as_deref() == Some("CreateContainerConfigError")).then_some(w)
        },
    )
    .await;
    assert_eq!(
        waiting.message.as_deref(),
        Some(format!("couldn't find key nope in ConfigMap default/{name}-cm").as_str())
    );
    for p in ["env", "badkey"] {
        let _ = pods
            .delete(
                &format!("{name}-{p}"),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
    let _ = cms
        .delete(&format!("{name}-cm"), &DeleteParams::default())
        .await;
    let _ = secrets
        .delete(&format!("{name}-s"), &DeleteParams::default())
        .await;
}

/// A plain-HTTP registry requiring `user`'s password, holding busybox as
/// `private/busybox:1`: (the registry, the image).
fn private_registry(user: &str, password: &str) -> (common::registry::Registry, String) {
    let reg = common::registry::Registry::start(false, Some((user, password)));
    let image = format!("{}/private/busybox:1", reg.host);
    let flags = reg.push_flags();
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    common::oci::skopeo_copy(
        &format!("oci-archive:{}", common::pods::busybox_archive().display()),
        &format!("docker://{image}"),
        &args,
    );
    (reg, image)
}

/// containerd reaches a plain-HTTP registry only where told to.
fn containerd_trusts_plain_http(k: &Kinglet, reg: &common::registry::Registry) {
    if let Some(sock) = k.containerd_socket() {
        let d = sock.parent().unwrap().join("certs.d").join(&reg.host);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("hosts.toml"),
            format!(
                "server = \"http://{h}\"\n[host.\"http://{h}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                h = reg.host
            ),
        )
        .unwrap();
    }
}

async fn image_pull_secrets_authenticate_pulls(rt: Rt) {
    use k8s_openapi::api::core::v1::Secret;
    let admin = admin().await;
    let (reg, image) = private_registry("puller", "s3cret");
    let j = join(rt, "kl-pull");
    containerd_trusts_plain_http(&j.k, &reg);
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &j.k.name, Duration::from_secs(30)).await;
    let name = j.k.name.clone();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let docker_config = serde_json::json!({"auths": {reg.host.clone(): {"username": "puller", "password": "s3cret"}}});
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{name}-pull")},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": docker_config.to_string()},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for (suffix, secret_line) in [
        (
            "with",
            format!("  imagePullSecrets: [{{name: {name}-pull}}]\n"),
        ),
        ("without", String::new()),
    ] {
        let p: Pod = from_yaml(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-{suffix}}}\nspec:\n  nodeName: {name}\n  terminationGracePeriodSeconds: 1\n{secret_line}  containers:\n  - {{name: c, image: '{image}', imagePullPolicy: Always, command: [sleep, '1000']}}\n"
        ));
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    wait_for(
        "the pod with the secret Running",
        Duration::from_secs(60),
        || async {
            pods.get_opt(&format!("{name}-with"))
                .await
                .ok()
                .flatten()
                .filter(running)
        },
    )
    .await;
    let w = wait_for(
        "the pod without it failing to pull",
        Duration::from_secs(60),
        || async {
            let p = pods.get_opt(&format!("{name}-without")).await.ok()??;
            let w = p.status?.container_statuses?[0].state.clone()?.waiting?;
            matches!(
                w.reason.as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
            .then_some(w)
        },
    )
    .await;
    eprintln!("without credentials: {w:?}");
    for suffix in ["with", "without"] {
        let _ = pods
            .delete(
                &format!("{name}-{suffix}"),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
    let _ = secrets
        .delete(&format!("{name}-pull"), &DeleteParams::default())
        .await;
}

/// The audience the test's credential provider asks tokens for.
const PROVIDER_AUDIENCE: &str = "kinglet-test-registry";

/// A credential provider plugin (a script written for the test) in
/// service-account token mode, configured as upstream's
/// `CredentialProviderConfig`: it records each request and answers the
/// registry's credentials, cached by registry.
fn provider_files(dir: &std::path::Path, host: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        "#!/bin/sh\nn=$(ls \"$REQUESTS\" | wc -l)\ncat > \"$REQUESTS/$n.json\"\ncat <<'EOF'\n{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Registry\",\"cacheDuration\":\"5m\",\"auth\":{{\"{host}\":{{\"username\":\"provided\",\"password\":\"t0ken\"}}}}}}\nEOF\n"
    );
    let exe = bin.join("test-registry-provider");
    std::fs::write(&exe, script).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let requests = dir.join("requests");
    std::fs::create_dir_all(&requests).unwrap();
    let config = dir.join("credential-providers.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: test-registry-provider\n  matchImages: [\"{host}\"]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  env: [{{name: REQUESTS, value: \"{}\"}}]\n  tokenAttributes:\n    serviceAccountTokenAudience: {PROVIDER_AUDIENCE}\n    requireServiceAccount: true\n    cacheType: ServiceAccount\n",
            requests.display()
        ),
    )
    .unwrap();
    (config, bin)
}

/// The node may ask tokens for the provider's audience (upstream's
/// `ServiceAccountNodeAudienceRestriction`: an RBAC grant of the verb
/// `request-serviceaccounts-token-audience`).
async fn grant_audience(admin: &kube::Client, node: &str) {
    let rules = serde_json::json!([{"apiGroups": [""], "resources": [PROVIDER_AUDIENCE], "verbs": ["request-serviceaccounts-token-audience"]}]);
    let subject = serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": format!("system:node:{node}")});
    grant_cluster_role(admin, &format!("{node}-audience"), rules, subject).await;
}

/// A pod pulls from a registry requiring a password through a credential
/// provider plugin, as on ECR or Artifact Registry: no pull secret; the
/// plugin is given a token of the pod's service account for its audience,
/// bound to the pod; a second pod of the same registry is answered from
/// the plugin's cache.
async fn credential_provider_plugins_authenticate_pulls(rt: Rt) {
    let admin = admin().await;
    let (reg, image) = private_registry("provided", "t0ken");
    let dir = tempfile::tempdir().unwrap();
    let (config, bin) = provider_files(dir.path(), &reg.host);
    let name = unique_name("kl-provider");
    grant_audience(&admin, &name).await;
    let (config, bin) = (config.display().to_string(), bin.display().to_string());
    let logs = dir.path().join("logs").display().to_string();
    let args = [
        "--pod-log-dir",
        logs.as_str(),
        "--image-credential-provider-config",
        config.as_str(),
        "--image-credential-provider-bin-dir",
        bin.as_str(),
    ];
    let k = Kinglet::start_rt(
        rt,
        &name,
        FAST_CONFIG,
        true,
        &args,
        &[common::pods::busybox_archive()],
    );
    containerd_trusts_plain_http(&k, &reg);
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for i in 0..2 {
        let p: Pod = from_yaml(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-{i}}}\nspec:\n  nodeName: {name}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: '{image}', imagePullPolicy: Always, command: [sleep, '1000']}}\n"
        ));
        pods.create(&PostParams::default(), &p).await.unwrap();
        let running = within(Duration::from_secs(60), || async {
            pods.get_opt(&format!("{name}-{i}"))
                .await
                .ok()
                .flatten()
                .filter(running)
        })
        .await;
        assert!(running.is_some(), "pod {i} not Running:\n{}", k.log());
    }
    let requests: Vec<serde_json::Value> = (0..)
        .map(|n| dir.path().join(format!("requests/{n}.json")))
        .take_while(|p| p.exists())
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    assert_eq!(
        requests.len(),
        1,
        "the second pull is answered from the cache: {requests:?}"
    );
    let req = &requests[0];
    assert_eq!(req["kind"], "CredentialProviderRequest");
    assert_eq!(req["image"], image.as_str());
    let claims = jwt_claims(req["serviceAccountToken"].as_str().expect("a token"));
    assert_eq!(
        claims["aud"],
        serde_json::json!([PROVIDER_AUDIENCE]),
        "{claims}"
    );
    let bound = &claims["kubernetes.io"];
    assert_eq!(bound["pod"]["name"], format!("{name}-0"), "{claims}");
    assert_eq!(bound["serviceaccount"]["name"], "default", "{claims}");
    // Upstream's Pulled event: the pull's time, and with the wait for a
    // pull slot (serializeImagePulls).
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let pulled = wait_for("a Pulled event", Duration::from_secs(15), || async {
        let evs = events.list(&ListParams::default()).await.ok()?;
        evs.items.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref()? == format!("{name}-0");
            (about && e.reason.as_deref() == Some("Pulled")).then_some(e.note?)
        })
    })
    .await;
    let prefix = format!("Successfully pulled image \"{image}\" in ");
    let rest = pulled
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{pulled}"));
    let (took, rest) = rest.split_once(" (").unwrap_or_else(|| panic!("{pulled}"));
    let (waited, size) = rest
        .split_once(" including waiting). Image size: ")
        .unwrap_or_else(|| panic!("{pulled}"));
    for d in [took, waited] {
        assert!(d.ends_with('s') && d.len() > 2, "a Go duration: {pulled}");
    }
    let bytes = size
        .strip_suffix(" bytes.")
        .unwrap_or_else(|| panic!("{pulled}"));
    assert!(bytes.parse::<u64>().is_ok_and(|b| b > 0), "{pulled}");
    for i in 0..2 {
        let _ = pods
            .delete(
                &format!("{name}-{i}"),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
    revoke_cluster_role(&admin, &format!("{name}-audience")).await;
}

/// A JWT's claims (its payload, unverified: the apiserver made it).
fn jwt_claims(token: &str) -> serde_json::Value {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).expect("a JWT");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// `hostUsers: false` asks for a user namespace of the pod's own; neither
/// kinglet's runtime nor this containerd (1.6) has them, so the pod is
/// refused with upstream's event (its containers never start as the
/// host's root), while the same pod without it runs.
async fn a_pod_asking_its_own_user_namespace_is_refused_not_run_as_the_host(rt: Rt) {
    let admin = admin().await;
    let j = join(rt, "kl-userns");
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &j.k.name, Duration::from_secs(30)).await;
    let name = j.k.name.clone();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for (suffix, host_users) in [("own", false), ("host", true)] {
        let p: Pod = from_yaml(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-{suffix}}}\nspec:\n  nodeName: {name}\n  hostUsers: {host_users}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sleep, '1000']}}\n"
        ));
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let own = format!("{name}-own");
    let note = wait_for(
        "FailedCreatePodSandBox",
        Duration::from_secs(30),
        || async {
            let evs = events.list(&ListParams::default()).await.ok()?;
            evs.items.into_iter().find_map(|e| {
                let about = e.regarding.as_ref()?.name.as_deref()? == own;
                (about && e.reason.as_deref() == Some("FailedCreatePodSandBox")).then_some(e.note?)
            })
        },
    )
    .await;
    assert_eq!(
        note,
        "Failed to create pod sandbox: RuntimeClass handler \"\" does not support user namespaces"
    );
    wait_for(
        "the hostUsers: true pod Running",
        Duration::from_secs(30),
        || async {
            pods.get_opt(&format!("{name}-host"))
                .await
                .ok()
                .flatten()
                .filter(running)
        },
    )
    .await;
    let p = pods.get(&own).await.unwrap();
    let st = p.status.unwrap_or_default();
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    let waiting = st.container_statuses.unwrap_or_default()[0]
        .state
        .clone()
        .unwrap_or_default()
        .waiting;
    assert_eq!(
        waiting.and_then(|w| w.reason).as_deref(),
        Some("ContainerCreating")
    );
    for suffix in ["own", "host"] {
        let _ = pods
            .delete(
                &format!("{name}-{suffix}"),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
}
