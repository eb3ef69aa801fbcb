//! Pod test helpers: the busybox image (built offline with umoci and
//! skopeo from Debian's busybox-static) and the cleanup that leaves the
//! machine as a node's tests found it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// An API pod that is Running with every container ready.
pub fn running(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            && s.container_statuses.iter().flatten().all(|c| c.ready)
    })
}

/// The busybox image archive (`kinglet.test/busybox:1`), built once per
/// test binary.
pub fn busybox_archive() -> &'static Path {
    static A: OnceLock<PathBuf> = OnceLock::new();
    A.get_or_init(|| build_busybox("busybox", &[]))
}

/// The same busybox with `STOPSIGNAL SIGUSR1`, as
/// `kinglet.test/busybox-usr1:1`.
pub fn busybox_usr1_archive() -> &'static Path {
    static A: OnceLock<PathBuf> = OnceLock::new();
    A.get_or_init(|| build_busybox("busybox-usr1", &["kinglet.test/busybox-usr1:1", "SIGUSR1"]))
}

/// Upstream's test image agnhost (built from its Go module), as
/// `kinglet.test/agnhost:2.66.1` (the version the control plane pins).
pub fn agnhost_archive() -> &'static Path {
    static A: OnceLock<PathBuf> = OnceLock::new();
    A.get_or_init(|| build_image("agnhost.sh", "agnhost", &[]))
}

fn build_busybox(stem: &str, args: &[&str]) -> PathBuf {
    build_image("busybox.sh", stem, args)
}

fn build_image(script: &str, stem: &str, args: &[&str]) -> PathBuf {
    // In the cluster dir, one file of each kind replaced each run: runs
    // leave nothing behind in /tmp.
    let dir = super::cluster_dir().join("images");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{stem}-{}.tar", std::process::id()));
    let st = Command::new(super::repo().join("tests/images").join(script))
        .arg(&out)
        .args(args)
        .status()
        .unwrap();
    assert!(st.success());
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let same_kind = name
            .strip_prefix(&format!("{stem}-"))
            .is_some_and(|rest| rest.trim_end_matches(".tar").parse::<u32>().is_ok());
        if e.path() != out && same_kind {
            let _ = std::fs::remove_file(e.path());
        }
    }
    out
}

/// Imports the busybox image into the store under `root`.
pub fn import_busybox(root: &Path) {
    import_archive(root, busybox_archive());
}

/// Imports an image archive into the store under `root`.
pub fn import_archive(root: &Path, archive: &Path) {
    super::output_ok(
        Command::new(env!("CARGO_BIN_EXE_kinglet"))
            .arg("--root-dir")
            .arg(root)
            .args(["images", "import"])
            .arg(archive),
    );
}

/// Removes every container, mount, pod cgroup and the monitor that a
/// (stopped) kinglet with this root dir left.
pub fn cleanup_root(root: &Path) {
    super::monitor_cleanup(&root.join("runtime/oci/monitor/monitor.sock"));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for m in mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(root.to_str().unwrap()))
    {
        let _ = Command::new("umount").args(["-l", m]).status();
    }
    if let Ok(rd) = std::fs::read_dir(root.join("runtime/oci/sandboxes")) {
        for e in rd.flatten() {
            let meta: serde_json::Value = std::fs::read(e.path().join("meta.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            if let Some(parent) = meta["cgroup_parent"].as_str() {
                for base in std::fs::read_dir("/sys/fs/cgroup")
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let _ = std::fs::remove_dir(base.path().join(parent));
                }
                let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(parent));
            }
        }
    }
}

/// Creates pod `name` on `node` with the rest of its `spec` (a 1 s grace
/// period) and waits until it runs.
pub async fn create_running(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    node: &str,
    name: &str,
    mut spec: serde_json::Value,
) {
    spec["nodeName"] = node.into();
    spec["terminationGracePeriodSeconds"] = 1.into();
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &p)
        .await
        .unwrap();
    super::wait_for(
        "the pod runs",
        std::time::Duration::from_secs(60),
        || async {
            let p = pods.get(name).await.ok()?;
            (p.status?.phase? == "Running").then_some(())
        },
    )
    .await;
}
