//! End to end: what only the CRI runtime has, against a private containerd
//! (Debian's, with runc and the CNI plugins; `tests/cluster/containerd-up.sh`):
//! containerd absent when kinglet starts (node NotReady with upstream's
//! reason, then Ready once it answers), containerd restarting under running
//! pods (nothing restarted), and the CRI calls the pod lifecycle does not use
//! yet (ListImages, ImageFsInfo, ExecSync, stats, RemoveImage).
//! The pod suites (`e2e_pods`, `e2e_api_pods`) run over CRI as well.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kinglet_runtime::{ContainerConfig, ContainerState, Runtime, SandboxConfig};
use kube::api::Api;

fn script(name: &str, dir: &Path) -> String {
    run_script(name, &[dir.to_str().unwrap()])
}

/// A containerd of the test's own, stopped and removed when dropped.
struct Containerd {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Containerd {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        Containerd {
            dir: tmp.path().join("containerd"),
            _tmp: tmp,
        }
    }
    fn endpoint(&self) -> String {
        format!("unix://{}", self.dir.join("containerd.sock").display())
    }
    fn up(&self) -> String {
        script("containerd-up.sh", &self.dir)
    }
    fn import(&self, archive: &Path) {
        ctr_import(&self.dir.join("containerd.sock"), archive);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        script("containerd-down.sh", &self.dir);
    }
}

#[tokio::test]
async fn containerd_absent_at_start_then_ready() {
    let admin = admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let cd = Containerd::new();
    let name = unique_name("kl-cri-late");
    let endpoint = cd.endpoint();
    let k = Kinglet::start_rt(
        Rt::Oci,
        &name,
        FAST_CONFIG,
        true,
        &[
            "--runtime",
            "cri",
            "--container-runtime-endpoint",
            endpoint.as_str(),
        ],
        &[],
    );
    let node = wait_for("NotReady node", Duration::from_secs(20), || async {
        nodes.get_opt(&name).await.ok().flatten().filter(|n| {
            condition(n, "Ready").is_some_and(|(s, r)| s == "False" && r == "KubeletNotReady")
        })
    })
    .await;
    let msg = node
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .message
        .unwrap();
    assert!(msg.contains("container runtime is down"), "{msg}");
    assert!(k.log().contains("pods run through CRI"));

    cd.up();
    let node = wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    let v = node
        .status
        .unwrap()
        .node_info
        .unwrap()
        .container_runtime_version;
    assert!(v.starts_with("containerd://1."), "{v}");
}

#[tokio::test]
async fn containerd_restart_loses_no_pod() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let k = Kinglet::start_rt(
        Rt::Cri,
        &unique_name("kl-cri-restart"),
        &format!("staticPodPath: {}\n", manifests.display()),
        false,
        &[],
        &[common::pods::busybox_archive()],
    );
    std::fs::write(
        manifests.join("keep.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: keep}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: kinglet.test/busybox:1, imagePullPolicy: Never, command: [sleep, '3000']}\n",
    )
    .unwrap();
    let root = k.dir.path().join("root");
    let running = |root: &Path| -> Option<(String, i64)> {
        std::fs::read_dir(root.join("pods"))
            .ok()?
            .flatten()
            .find_map(|e| {
                let v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                let c = &v["status"]["containerStatuses"][0];
                (v["status"]["phase"] == "Running" && c["state"]["running"].is_object()).then(
                    || {
                        (
                            c["containerID"].as_str().unwrap_or_default().to_string(),
                            c["restartCount"].as_i64().unwrap_or(-1),
                        )
                    },
                )
            })
    };
    let (id, restarts) = wait_for("keep Running", Duration::from_secs(30), || async {
        running(&root)
    })
    .await;
    assert!(id.starts_with("containerd://"), "{id}");
    assert_eq!(restarts, 0);

    // containerd dies (its shims and containers live on) and comes back.
    let pid = k.containerd_pid().unwrap();
    // SAFETY: kill(2) on the containerd this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    tokio::time::sleep(Duration::from_secs(3)).await;
    k.containerd_up_again();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (id2, restarts2) = wait_for("keep still Running", Duration::from_secs(30), || async {
        running(&root)
    })
    .await;
    assert_eq!((id2, restarts2), (id, 0), "the container was restarted");
    assert!(k.log().contains("ListContainers") || k.log().contains("relisting"));
}

#[tokio::test]
async fn cri_calls_for_gc_probes_and_stats() {
    let cd = Containerd::new();
    cd.up();
    cd.import(common::pods::busybox_archive());
    let state = tempfile::tempdir().unwrap();
    let rt = kinglet_runtime_cri::CriRuntime::new(&cd.endpoint(), state.path(), "/sys/fs/cgroup")
        .unwrap();
    let v = rt.version().await.unwrap();
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");
    let st = rt.status().await.unwrap();
    assert!(st.is_ready(kinglet_runtime::ConditionKind::RuntimeReady));

    let images = rt.list_images().await.unwrap();
    assert!(
        images
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| t == "kinglet.test/busybox:1")),
        "{images:?}"
    );
    let fs = rt.image_fs_info().await.unwrap();
    // containerd samples the usage every few seconds; where is what counts.
    let root = cd.dir.join("root").display().to_string();
    assert!(fs.iter().any(|f| f.mountpoint.starts_with(&root)), "{fs:?}");

    let uid = format!("cri-calls-{}", std::process::id());
    let sb = SandboxConfig {
        pod_uid: uid.clone(),
        pod_name: "calls".into(),
        namespace: "default".into(),
        hostname: "calls".into(),
        log_directory: state.path().join("logs").display().to_string(),
        host_network: true,
        cgroup_parent: format!("kubepods/besteffort/pod{uid}"),
        resolv_conf: "nameserver 127.0.0.1\n".into(),
        ..Default::default()
    };
    let sandbox = rt.run_pod_sandbox(&sb).await.unwrap().id;
    let cfg = ContainerConfig {
        name: "c".into(),
        image: "kinglet.test/busybox:1".into(),
        command: vec!["sleep".into(), "3000".into()],
        log_path: "c/0.log".into(),
        seccomp_runtime_default: true,
        ..Default::default()
    };
    let id = rt.create_container(&sandbox, &cfg, &sb).await.unwrap();
    rt.start_container(&id).await.unwrap();
    let list = rt.list_containers().await.unwrap();
    let c = list.iter().find(|c| c.id == id).unwrap();
    assert_eq!(
        (c.state, c.pod_uid.as_str()),
        (ContainerState::Running, uid.as_str())
    );

    let out = rt
        .exec_sync(
            &id,
            &[
                "sh".into(),
                "-c".into(),
                "echo hi; echo oops >&2; exit 3".into(),
            ],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_slice(), out.stderr.as_slice()),
        (3, &b"hi\n"[..], &b"oops\n"[..])
    );
    // seccompProfile RuntimeDefault reaches containerd: PID 1 is filtered.
    let out = rt
        .exec_sync(
            &id,
            &["grep".into(), "Seccomp:".into(), "/proc/1/status".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(1),
        Some("2")
    );
    let stats = rt.container_stats().await.unwrap();
    let s = stats.iter().find(|s| s.id == id).expect("container stats");
    assert_eq!(s.pod_uid, uid);
    assert!(s.memory_working_set_bytes > 0, "{s:?}");
    let pstats = rt.pod_sandbox_stats().await.unwrap();
    assert!(
        pstats.iter().any(|s| s.id == sandbox && s.pod_uid == uid),
        "{pstats:?}"
    );

    rt.stop_container(&id, Duration::from_secs(1))
        .await
        .unwrap();
    let c = rt
        .list_containers()
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.id == id)
        .unwrap();
    assert_eq!(c.state, ContainerState::Exited);
    assert_eq!(c.exit_code, 137, "sleep as PID 1 ignores SIGTERM: {c:?}");
    rt.remove_container(&id).await.unwrap();
    rt.remove_pod_sandbox(&sandbox).await.unwrap();
    assert!(
        rt.list_pod_sandboxes()
            .await
            .unwrap()
            .iter()
            .all(|s| s.id != sandbox)
    );
    assert!(!state.path().join("pods").join(&uid).exists());
    for base in [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup",
    ] {
        let p = Path::new(base).join(format!("kubepods/besteffort/pod{uid}"));
        assert!(!p.exists(), "pod cgroup left: {}", p.display());
    }

    rt.remove_image("kinglet.test/busybox:1").await.unwrap();
    assert!(
        rt.image_status("kinglet.test/busybox:1")
            .await
            .unwrap()
            .is_none()
    );
}
