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

/// `kinglet.test/busybox-usr2:1`: busybox again with another stop signal,
/// so another image ID on the same layers (a second image to collect).
pub fn busybox_usr2_archive() -> &'static Path {
    static A: OnceLock<PathBuf> = OnceLock::new();
    A.get_or_init(|| build_busybox("busybox-usr2", &["kinglet.test/busybox-usr2:1", "SIGUSR2"]))
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

/// Upstream's sample device plugin (built from its Go module), as
/// `kinglet.test/sample-device-plugin:<version>`.
pub fn sample_device_plugin_archive() -> &'static Path {
    static A: OnceLock<PathBuf> = OnceLock::new();
    A.get_or_init(|| build_image("sample-device-plugin.sh", "sample-device-plugin", &[]))
}

fn build_image(script: &str, stem: &str, args: &[&str]) -> PathBuf {
    // In the cluster dir, one file of each kind per test process, those of
    // earlier runs removed: runs leave nothing behind in /tmp.
    let dir = super::cluster_dir().join("images");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{stem}-{}.tar", std::process::id()));
    let st = Command::new(super::repo().join("tests/images").join(script))
        .arg(&out)
        .args(args)
        .status()
        .unwrap();
    assert!(st.success());
    // Another test binary running beside this one keeps its own: only the
    // archives of processes that have ended go.
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix(&format!("{stem}-"))
            .and_then(|rest| rest.trim_end_matches(".tar").parse::<u32>().ok());
        let ended = owner.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
        if e.path() != out && ended {
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
    unmount_under(root);
    for cg in pod_cgroups(root) {
        let _ = std::fs::remove_dir(cg);
    }
}

/// Unmounts (lazily) everything mounted under `root`, deepest first.
fn unmount_under(root: &Path) {
    for m in mounts_under(root).iter().rev() {
        let _ = Command::new("umount").args(["-l", m]).status();
    }
}

/// A private CNI network for a test node: a bridge conflist with
/// host-local addresses from `subnet` (kept under `dir/ipam`) in
/// `dir/net.d`; the bridge goes when this is dropped.
pub struct BridgeNet {
    pub conf: PathBuf,
    pub bridge: String,
}

impl BridgeNet {
    pub fn new(dir: &Path, name: &str, bridge: String, subnet: &str) -> Self {
        let conf = dir.join("net.d");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(
            conf.join(format!("10-{name}.conflist")),
            serde_json::to_vec(&serde_json::json!({
                "cniVersion": "1.0.0", "name": name,
                "plugins": [{"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                             "dataDir": dir.join("ipam")}}]
            }))
            .unwrap(),
        )
        .unwrap();
        BridgeNet { conf, bridge }
    }

    /// kinglet's arguments for pods on this network with their logs under
    /// `logs`: the conflist dir, Debian's and upstream's plugin dirs.
    pub fn args(&self, logs: &Path) -> Vec<String> {
        let (logs, conf) = (logs.display(), self.conf.display());
        [
            "--pod-log-dir",
            &logs.to_string(),
            "--cni-conf-dir",
            &conf.to_string(),
        ]
        .into_iter()
        .chain(["--cni-bin-dir", "/usr/lib/cni:/opt/cni/bin"])
        .map(String::from)
        .collect()
    }
}

impl Drop for BridgeNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

/// Creates pod `name` bound to `node` (grace period 1 s) without waiting.
pub async fn create_bound(
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
}

/// Creates pod `name` on `node` with the rest of its `spec` (a 1 s grace
/// period) and waits until it runs.
pub async fn create_running(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    node: &str,
    name: &str,
    spec: serde_json::Value,
) {
    create_bound(pods, node, name, spec).await;
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

/// The pids of the monitor serving `root`'s in-process runtime.
pub fn monitor_pids(root: &Path) -> Vec<i32> {
    let dir = root.join("runtime/oci/monitor");
    let needle = format!("monitor\0--dir\0{}\0", dir.display());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        // The monitor leads its session; a process it forked that has not
        // exec'd yet shares its command line, not that.
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let sid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(3)?.parse::<i32>().ok());
        if String::from_utf8_lossy(&cmdline).contains(&needle) && sid == Some(pid) {
            out.push(pid);
        }
    }
    out
}

/// The pods' cgroup dirs under every hierarchy, from the sandboxes' meta.
pub fn pod_cgroups(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root.join("runtime/oci/sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let meta: serde_json::Value = std::fs::read(e.path().join("meta.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let Some(parent) = meta["cgroup_parent"]
            .as_str()
            .map(|p| p.trim_start_matches('/'))
        else {
            continue;
        };
        if parent.is_empty() {
            continue;
        }
        out.push(Path::new("/sys/fs/cgroup").join(parent));
        for base in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            out.push(base.path().join(parent));
        }
    }
    out.retain(|p| p.is_dir());
    out
}

/// Every cgroup dir at or below `dir`, deepest first.
fn cgroup_tree(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(cgroup_tree(&e.path()));
        }
    }
    out.push(dir.to_path_buf());
    out
}

/// What a reboot takes from a node of the in-process runtime, and only
/// that: every process it ran (the monitor, the containers), every mount
/// under its root dir (rootfs overlays, the pods' namespace files, tmpfs
/// volumes) and the pods' cgroups. Every file stays as it was — the
/// monitor's records naming pids, the sandboxes with their (now unmounted)
/// namespace files, container dirs, libcontainer's state, the API
/// checkpoint — as on a disk after a power cut. kinglet must be stopped.
pub fn simulate_reboot(root: &Path) {
    let cgroups = pod_cgroups(root);
    for _ in 0..200 {
        let mut pids = monitor_pids(root);
        for cg in &cgroups {
            for d in cgroup_tree(cg) {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        if pids.is_empty() {
            break;
        }
        for p in pids {
            // SAFETY: kill(2) on processes of this test's own node.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        monitor_pids(root).is_empty(),
        "the monitor survived SIGKILL"
    );
    unmount_under(root);
    for cg in &cgroups {
        for d in cgroup_tree(cg) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Mounts under `root` (what a node left mounted).
pub fn mounts_under(root: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(root.to_str().unwrap()))
        .map(String::from)
        .collect()
}

/// A small ext4 on a loop device mounted at `at` (lazily unmounted and
/// deleted when dropped).
pub struct LoopFs {
    pub at: std::path::PathBuf,
    image: std::path::PathBuf,
}

impl LoopFs {
    pub fn mount(at: &std::path::Path, mib: u64) -> LoopFs {
        let image = at.with_extension("img");
        let run = |cmd: &str, args: &[&str]| {
            super::output_ok(std::process::Command::new(cmd).args(args));
        };
        let img = image.display().to_string();
        run("truncate", &["-s", &format!("{mib}M"), &img]);
        run("mkfs.ext4", &["-q", "-F", &img]);
        run("mount", &["-o", "loop", &img, &at.display().to_string()]);
        LoopFs {
            at: at.to_path_buf(),
            image,
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .status();
        let _ = std::fs::remove_file(&self.image);
    }
}
