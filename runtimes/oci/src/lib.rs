//! The in-process runtime: containers run through youki's `libcontainer`
//! with no container daemon. kinglet prepares sandboxes, root filesystems
//! (overlayfs over the image store's shared layers) and OCI specs; the
//! monitor process (`monitor/`) creates, watches and reaps the containers
//! and writes their logs.
//!
//! Layout under the runtime dir (`<root-dir>/runtime/oci`):
//! - `sandboxes/<id>/`: `meta.json`, the pod's `resolv.conf` and
//!   `hostname` (its `/etc/hosts` and termination-message files are the
//!   kubelet's, given as mounts);
//! - `containers/<id>/`: `meta.json`, `config.json`, `rootfs/` (an overlay
//!   mount, or a flattened copy), `upper/`, `work/`;
//! - `monitor/`: the monitor's socket, records and libcontainer state.
//!
//! The parts: `bundle.rs` and `spec.rs` make a container's bundle;
//! `network.rs` a pod's namespaces and its CNI network (host network pods
//! share the node's); `sessions.rs` exec, attach and terminals;
//! `status.rs` what is reported of containers and their cgroups' usage;
//! `resize.rs` a running container's cgroup changed in place;
//! `images/` the image store; this file the `Runtime` trait over them.

mod bundle;
mod cdi;
pub mod container;
mod devices;
mod events;
pub mod images;
pub mod monitor;
pub mod network;
pub mod procid;
mod pty;
pub mod resize;
mod sessions;
pub mod spec;
mod status;

use status::*;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kinglet_runtime::exec::{ExecOptions, ExecSession, PortStream};
use kinglet_runtime::podcgroup::{self, Hierarchy};
use kinglet_runtime::{
    BoxFuture, ConditionKind, ContainerConfig, ContainerState, ContainerStatus, FsUsage,
    ImageFailure, ImageInfo, PullAuth, Runtime, RuntimeCondition, RuntimeError, RuntimeStatus,
    RuntimeVersion, SandboxConfig, SandboxStatus, Usage, WaitingReason,
};
use serde::{Deserialize, Serialize};

use images::auth::Credentials;
use images::registry::Puller;
use images::{ImageRecord, ImageStore};
use monitor::{Client, Request};

/// The name reported in `nodeInfo.containerRuntimeVersion`.
pub const RUNTIME_NAME: &str = "kinglet-oci";

/// The cgroup hierarchy mounted at `root` (normally `/sys/fs/cgroup`), or
/// none where neither the unified hierarchy nor a v1 `memory` controller
/// is there to run containers in.
pub fn detect_cgroups(root: &Path) -> Option<Hierarchy> {
    match Hierarchy::detect(root) {
        Hierarchy::V2 => Some(Hierarchy::V2),
        Hierarchy::V1 if root.join("memory").is_dir() => Some(Hierarchy::V1),
        Hierarchy::V1 => None,
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SandboxMeta {
    pod_uid: String,
    pod_name: String,
    namespace: String,
    cgroup_parent: String,
    created_at: i64,
    /// The pod's network namespace file, when it has its own network.
    #[serde(default)]
    netns: Option<PathBuf>,
    #[serde(default)]
    ip: Option<String>,
    /// The pod's shared IPC and UTS namespace files.
    #[serde(default)]
    ipc: Option<PathBuf>,
    #[serde(default)]
    uts: Option<PathBuf>,
    /// The boot it was made in: a sandbox of an earlier boot is dead.
    #[serde(default)]
    boot_id: String,
    /// Set while the sandbox is being made (recorded first, so a crash
    /// midway still tears down what was made): one a crash left half
    /// made, its network perhaps not set up, is not ready.
    #[serde(default)]
    setting_up: bool,
}

impl SandboxMeta {
    /// Whether the sandbox still stands: made in this boot (`boot`), and
    /// each namespace it made still bound at its file. A reboot takes the
    /// namespaces (and so does a simulated one that unmounts them); the
    /// pod then gets a new sandbox, as upstream makes one for a sandbox
    /// that is not ready.
    fn ready(&self, boot: &str) -> bool {
        if self.setting_up || !procid::same_boot(&self.boot_id, boot) {
            return false;
        }
        [&self.netns, &self.ipc, &self.uts]
            .into_iter()
            .flatten()
            .all(|p| network::is_namespace(p))
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ContainerMeta {
    sandbox_id: String,
    pod_uid: String,
    name: String,
    attempt: u32,
    image: String,
    image_ref: String,
    image_id: String,
    log_path: String,
    overlay: bool,
    /// The image's STOPSIGNAL; 0: SIGTERM.
    #[serde(default)]
    stop_signal: i32,
    /// Why the start failed before the process ran (reported as an exit
    /// with upstream's `StartError`), and when.
    #[serde(default)]
    start_error: Option<(String, i64)>,
}

/// The monitor's answer as the runtime's error: a container it does not
/// know is CRI's `NotFound`.
fn from_monitor(e: monitor::MonitorError) -> RuntimeError {
    match e {
        monitor::MonitorError::NotFound(m) => RuntimeError::NotFound(m),
        e => RuntimeError::Other(e.to_string()),
    }
}

fn rt_err(what: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Other(format!("{what}: {e}"))
}

fn write_json_atomic(path: &Path, v: &impl Serialize) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(v).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, path)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn new_id() -> String {
    let mut b = [0u8; 32];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    hex::encode(b)
}

/// The in-process runtime.
pub struct OciRuntime {
    dir: PathBuf,
    cgroup_root: PathBuf,
    store: Arc<ImageStore>,
    puller: Arc<Puller>,
    monitor: Client,
    /// Pod networking; `None`: every pod shares the host network.
    cni: Option<network::Cni>,
    /// kinglet itself, for the helper processes it starts.
    exe: std::sync::OnceLock<PathBuf>,
    /// containerLogMaxSize (bytes) and containerLogMaxFiles.
    log_rotation: (u64, u32),
    /// Container events from the monitor.
    events: events::Events,
    /// This boot's ID, read once: sandboxes record it and are judged by it.
    boot_id: String,
    /// Containers' writable layers (bytes) by ID, with when they were
    /// measured: walked at most every [`WRITABLE_TTL`], as containerd
    /// refreshes its own, so a memory eviction's stats call never waits on
    /// a disk walk more than once in that time.
    writable: Arc<std::sync::Mutex<HashMap<String, (Instant, u64)>>>,
    /// Where CDI specs are, lowest priority first.
    cdi_spec_dirs: Vec<PathBuf>,
}

/// How long a writable-layer measurement stands.
const WRITABLE_TTL: Duration = Duration::from_secs(10);

/// Runs blocking filesystem work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| rt_err("blocking task", e))?
}

impl OciRuntime {
    /// Runs `kinglet netns` to make the pod's namespaces: unshare needs a
    /// process without threads.
    async fn make_namespaces(&self, ns: &network::PodNamespaces) -> Result<(), RuntimeError> {
        if ns.files().is_empty() {
            return Ok(());
        }
        let exe = self
            .exe
            .get()
            .cloned()
            .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("netns");
        if let Some(p) = &ns.net {
            cmd.arg("--net").arg(p);
        }
        if let Some(p) = &ns.ipc {
            cmd.arg("--ipc").arg(p);
        }
        if let Some((p, h)) = &ns.uts {
            cmd.arg("--uts").arg(p).arg("--hostname").arg(h);
        }
        let out = cmd.output().await.map_err(|e| rt_err("namespaces", e))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(RuntimeError::Other(format!(
                "creating the pod namespaces failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// A runtime keeping its state under `dir`, using the cgroup hierarchy
    /// at `cgroup_root` and images from `puller`'s store.
    pub fn new(
        dir: impl Into<PathBuf>,
        cgroup_root: impl Into<PathBuf>,
        puller: Arc<Puller>,
    ) -> Self {
        let dir = dir.into();
        OciRuntime {
            monitor: Client::new(&dir.join("monitor")),
            store: puller.store().clone(),
            puller,
            dir,
            cgroup_root: cgroup_root.into(),
            cni: None,
            exe: std::sync::OnceLock::new(),
            log_rotation: (10 << 20, 5),
            events: events::Events::new(),
            boot_id: procid::boot_id(),
            writable: Arc::default(),
            cdi_spec_dirs: cdi::SPEC_DIRS.iter().map(PathBuf::from).collect(),
        }
    }

    /// Reads CDI specs from `dirs` (lowest priority first) instead of
    /// `/etc/cdi` and `/var/run/cdi`.
    pub fn with_cdi_spec_dirs(mut self, dirs: Vec<PathBuf>) -> Self {
        self.cdi_spec_dirs = dirs;
        self
    }

    /// Gives pods their own network through CNI.
    /// Rotates container logs at `max_size` bytes keeping `max_files`
    /// (containerLogMaxSize, containerLogMaxFiles).
    pub fn with_log_rotation(mut self, max_size: u64, max_files: u32) -> Self {
        self.log_rotation = (max_size, max_files);
        self
    }

    pub fn with_cni(mut self, cni: network::Cni) -> Self {
        self.cni = Some(cni);
        self
    }

    /// Starts (or finds) the monitor, using `exe` (kinglet itself).
    pub async fn start_monitor(&self, exe: &Path) -> Result<(), RuntimeError> {
        let _ = self.exe.set(exe.to_path_buf());
        for d in ["sandboxes", "containers", "monitor"] {
            std::fs::create_dir_all(self.dir.join(d)).map_err(|e| rt_err("runtime dir", e))?;
        }
        // Followed even if no monitor answers yet: the event task retries
        // (and wakes the PLEG every second meanwhile).
        let dir = self.dir.join("monitor");
        self.events
            .follow(self.monitor.clone(), exe.to_path_buf(), dir.clone());
        self.monitor
            .ensure_running(exe, &dir)
            .await
            .map_err(|e| RuntimeError::Unavailable(e.to_string()))?;
        self.sweep_orphans().await;
        Ok(())
    }

    /// Stops the monitor, which must run no container any more (the
    /// demo's end: a node agent leaves it running, so pods outlive the
    /// agent). Following its events stops first, or that would start a
    /// new monitor.
    pub async fn stop_monitor(&self) -> Result<(), RuntimeError> {
        self.events.stop();
        // The monitor exits before it answers, so the call's own result
        // says nothing; whether it still answers a ping does.
        let answer = self.monitor.call(&monitor::Request::Exit).await;
        if self.monitor.ping().await {
            let why = answer.err().map(|e| e.to_string()).unwrap_or_default();
            return Err(RuntimeError::Other(format!(
                "the monitor still runs: {why}"
            )));
        }
        Ok(())
    }

    /// Removes what a crash of kinglet between making a container's bundle
    /// and handing it to the monitor left behind: container dirs (and their
    /// rootfs mounts) the monitor has no record of and that record no start
    /// failure. Run at start, before any pod worker creates containers.
    async fn sweep_orphans(&self) {
        let Ok(records) = self.monitor.list().await else {
            return;
        };
        let known: std::collections::HashSet<String> = records.into_iter().map(|r| r.id).collect();
        let containers = self.dir.join("containers");
        let swept = blocking(move || {
            let mut swept = Vec::new();
            for e in std::fs::read_dir(&containers)
                .into_iter()
                .flatten()
                .flatten()
            {
                let id = e.file_name().to_string_lossy().into_owned();
                let meta = read_json::<ContainerMeta>(&e.path().join("meta.json"));
                if known.contains(&id) || meta.is_some_and(|m| m.start_error.is_some()) {
                    continue;
                }
                bundle::teardown(&e.path());
                swept.push(id);
            }
            Ok(swept)
        })
        .await
        .unwrap_or_default();
        if !swept.is_empty() {
            tracing::info!(containers = ?swept, "removed container dirs a crash left without a monitor record");
        }
        let sandboxes = self.dir.join("sandboxes");
        let swept = blocking(move || Ok(sweep_unrecorded_sandboxes(&sandboxes)))
            .await
            .unwrap_or_default();
        if !swept.is_empty() {
            tracing::info!(sandboxes = ?swept, "removed sandbox dirs a crash left without a record");
        }
    }

    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    async fn runtime_condition(&self) -> RuntimeCondition {
        let not_ready = |reason: &str, message: String| RuntimeCondition {
            kind: ConditionKind::RuntimeReady,
            status: false,
            reason: reason.into(),
            message,
        };
        if detect_cgroups(&self.cgroup_root).is_none() {
            return not_ready(
                "CgroupsUnavailable",
                format!("no cgroup hierarchy at {}", self.cgroup_root.display()),
            );
        }
        if let Err(e) = probe_writable(&self.dir).await {
            return not_ready(
                "StateDirUnwritable",
                format!("state dir {}: {e}", self.dir.display()),
            );
        }
        if !self.monitor.ping().await {
            return not_ready(
                "MonitorUnavailable",
                "the container monitor does not answer".into(),
            );
        }
        RuntimeCondition {
            kind: ConditionKind::RuntimeReady,
            status: true,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn container_dir(&self, id: &str) -> PathBuf {
        self.dir.join("containers").join(id)
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.dir.join("sandboxes").join(id)
    }

    /// Removes the pod-level cgroup under every hierarchy (libcontainer
    /// removes each container's own).
    fn remove_pod_cgroup(&self, parent: &str) {
        if parent.is_empty() {
            return;
        }
        let parent = parent.trim_start_matches('/');
        match detect_cgroups(&self.cgroup_root) {
            Some(Hierarchy::V2) => rmdir_cgroups(&self.cgroup_root.join(parent)),
            _ => {
                if let Ok(rd) = std::fs::read_dir(&self.cgroup_root) {
                    for e in rd.flatten() {
                        rmdir_cgroups(&e.path().join(parent));
                    }
                }
            }
        }
    }

    /// The container's image and its image volumes' (by mount index), as
    /// the store has them.
    fn images_of(
        &self,
        cfg: &ContainerConfig,
    ) -> Result<(ImageRecord, Vec<(usize, ImageRecord)>), RuntimeError> {
        let index = self
            .store
            .read_index()
            .map_err(|e| rt_err("image store", e))?;
        let image = index
            .find(&cfg.image)
            .cloned()
            .ok_or_else(|| RuntimeError::Other(format!("image {:?} is not present", cfg.image)))?;
        let mut mounts = Vec::new();
        let volumes = cfg.mounts.iter().enumerate();
        for (i, m) in volumes.filter(|(_, m)| !m.image.is_empty()) {
            let img = index.find(&m.image).cloned().ok_or_else(|| {
                RuntimeError::Other(format!(
                    "image {:?} of an image volume is not present",
                    m.image
                ))
            })?;
            mounts.push((i, img));
        }
        Ok((image, mounts))
    }

    /// The sandbox's namespaces made and, with CNI and its own network, the
    /// pod's network added (its IP); undone on failure.
    async fn sandbox_network(
        &self,
        id: &str,
        cfg: &SandboxConfig,
        ns: &network::PodNamespaces,
    ) -> Result<Option<String>, RuntimeError> {
        let pod = network::PodRef {
            namespace: cfg.namespace.clone(),
            name: cfg.pod_name.clone(),
            uid: cfg.pod_uid.clone(),
        };
        let made = self.make_namespaces(ns).await;
        let added = match (made, &self.cni, &ns.net) {
            (Err(e), _, _) => Err(e),
            (Ok(()), Some(cni), Some(netns)) => cni
                .add(id, netns, &pod, &port_mappings_json(&cfg.port_mappings))
                .await
                .map_err(|e| RuntimeError::Other(e.to_string())),
            (Ok(()), _, _) => Ok(None),
        };
        if added.is_err() {
            if let (Some(cni), Some(netns)) = (&self.cni, &ns.net) {
                let _ = cni.del(id, netns, &pod).await;
            }
            for f in ns.files() {
                network::remove_netns(f);
            }
        }
        added
    }

    /// Removes a container's directory (and unmounts its rootfs) off the
    /// async thread.
    async fn teardown_container_dir(&self, id: &str) {
        let dir = self.container_dir(id);
        let _ = blocking(move || {
            bundle::teardown(&dir);
            Ok(())
        })
        .await;
    }

    /// CRI `StopContainer`: the stop signal, then SIGKILL after `timeout`.
    /// Waits for the monitor's exit event (with a 1 s re-check, in case the
    /// event stream is down) rather than polling.
    async fn stop(&self, id: &str, timeout: Duration) -> Result<(), RuntimeError> {
        let path = self.container_dir(id).join("meta.json");
        let signal = blocking(move || Ok(read_json::<ContainerMeta>(&path)))
            .await?
            .map(|m| m.stop_signal)
            .filter(|s| *s > 0)
            .unwrap_or(libc::SIGTERM);
        let mut events = self.events.subscribe();
        match self.exited(id).await {
            Ok(true) | Err(_) => return Ok(()),
            Ok(false) => {}
        }
        if !timeout.is_zero() {
            self.kill(id, signal).await;
            if self.wait_exit(id, &mut events, timeout).await {
                return Ok(());
            }
        }
        self.kill(id, libc::SIGKILL).await;
        if self
            .wait_exit(id, &mut events, Duration::from_secs(5))
            .await
        {
            return Ok(());
        }
        Err(RuntimeError::Other(format!(
            "container {id} did not stop after SIGKILL"
        )))
    }

    async fn kill(&self, id: &str, signal: i32) {
        let req = Request::Kill {
            id: id.into(),
            signal,
        };
        if let Err(e) = self.monitor.call(&req).await {
            tracing::debug!(container = id, signal, error = %e, "signalling a container");
        }
    }

    /// The PID namespace of running container `id`, which an ephemeral
    /// container with `targetContainerName` joins: its process as the
    /// monitor recorded it, and only while it is that process still (same
    /// boot, same start time: never a PID reused by another).
    async fn pid_namespace_of(&self, id: &str) -> Result<PathBuf, RuntimeError> {
        let r = self
            .monitor
            .record(&Request::State { id: id.into() })
            .await
            .map_err(from_monitor)?;
        if r.status != "running" || !r.identity().is_alive(&self.boot_id) {
            return Err(RuntimeError::Other(format!(
                "target container {id} is not running"
            )));
        }
        Ok(PathBuf::from(format!("/proc/{}/ns/pid", r.pid)))
    }

    /// Whether the monitor records the container as exited.
    async fn exited(&self, id: &str) -> Result<bool, monitor::MonitorError> {
        let r = self
            .monitor
            .record(&Request::State { id: id.into() })
            .await?;
        Ok(r.status == "exited")
    }

    /// Waits up to `limit` for the container to exit.
    async fn wait_exit(
        &self,
        id: &str,
        events: &mut tokio::sync::watch::Receiver<u64>,
        limit: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.exited(id).await {
                Ok(true) | Err(monitor::MonitorError::NotFound(_)) => return true,
                Ok(false) | Err(_) => {}
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            let recheck = (deadline - now).min(Duration::from_secs(1));
            let _ = tokio::time::timeout(recheck, events.changed()).await;
        }
    }
}

/// Removes the cgroup at `dir` with the empty cgroups under it, deepest
/// first: a container's cgroup that a killed monitor left (its processes
/// gone, its delete never run) must not keep the pod's. A cgroup with
/// processes refuses `rmdir` and stays.
fn rmdir_cgroups(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_cgroups(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// CNI's `portMappings` capability argument.
fn port_mappings_json(pm: &[kinglet_runtime::PortMapping]) -> serde_json::Value {
    serde_json::Value::Array(
        pm.iter()
            .map(|p| {
                serde_json::json!({
                    "hostPort": p.host_port,
                    "containerPort": p.container_port,
                    "protocol": p.protocol,
                    "hostIP": p.host_ip,
                })
            })
            .collect(),
    )
}

/// Creates the directory if needed and checks that files can be made in
/// it, without making one: the check runs with every runtime status (every
/// 10 s), and a file created and removed each time cost a journal commit
/// each time (216 KiB a minute on ext4, for nothing, on flash). `access`
/// answers `EROFS` once the filesystem is read-only (as ext4 makes itself
/// on errors), and refuses a directory the process may not write.
async fn probe_writable(dir: &Path) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        rustix::fs::access(
            &dir,
            rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
        )
    })
    .await
    .map_err(std::io::Error::other)?
    .map_err(std::io::Error::from)
}

impl Runtime for OciRuntime {
    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>> {
        Box::pin(async {
            Ok(RuntimeVersion {
                runtime_name: RUNTIME_NAME.into(),
                runtime_version: env!("CARGO_PKG_VERSION").into(),
                runtime_api_version: "v1".into(),
            })
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>> {
        Box::pin(async {
            let runtime = self.runtime_condition().await;
            let network = match self.cni.as_ref().map(|c| c.ready()) {
                Some(Err(e)) => RuntimeCondition {
                    kind: ConditionKind::NetworkReady,
                    status: false,
                    reason: "NetworkPluginNotReady".into(),
                    message: format!("Network plugin returns error: {e}"),
                },
                _ => RuntimeCondition {
                    kind: ConditionKind::NetworkReady,
                    status: true,
                    reason: String::new(),
                    message: String::new(),
                },
            };
            Ok(RuntimeStatus {
                conditions: vec![runtime, network],
                // libcontainer 0.7 cannot idmap a pod's volumes yet.
                user_namespaces: false,
            })
        })
    }

    fn run_pod_sandbox<'a>(
        &'a self,
        cfg: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<SandboxStatus, RuntimeError>> {
        Box::pin(async move {
            let id = new_id();
            let dir = self.sandbox_dir(&id);
            let (d, c) = (dir.clone(), cfg.clone());
            blocking(move || sandbox_files(&d, &c)).await?;
            let mut meta = SandboxMeta {
                pod_uid: cfg.pod_uid.clone(),
                pod_name: cfg.pod_name.clone(),
                namespace: cfg.namespace.clone(),
                cgroup_parent: cfg.cgroup_parent.clone(),
                created_at: jiff::Timestamp::now().as_nanosecond() as i64,
                netns: None,
                ip: None,
                ipc: None,
                uts: None,
                boot_id: self.boot_id.clone(),
                setting_up: true,
            };
            let with_net = self.cni.is_some() && !cfg.host_network;
            let ns = network::PodNamespaces {
                net: with_net.then(|| dir.join("netns")),
                ipc: (!cfg.host_ipc).then(|| dir.join("ipcns")),
                uts: (!cfg.host_network).then(|| (dir.join("utsns"), cfg.hostname.clone())),
            };
            // Recorded first, so a crash midway still tears them down.
            meta.netns = ns.net.clone();
            meta.ipc = ns.ipc.clone();
            meta.uts = ns.uts.as_ref().map(|(p, _)| p.clone());
            write_json_atomic(&dir.join("meta.json"), &meta)
                .map_err(|e| rt_err("sandbox meta", e))?;
            // The pod cgroup's pids.max (podPidsLimit), for all its
            // containers together, as upstream's pod container manager;
            // after the meta, so a crash's teardown removes the cgroup.
            if let Some(limit) = cfg.pids_limit {
                let root = &self.cgroup_root;
                if let Err(e) = podcgroup::set_pids_limit(root, &cfg.cgroup_parent, limit) {
                    self.remove_pod_cgroup(&cfg.cgroup_parent);
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(rt_err("pod pids limit", e));
                }
            }
            meta.ip = self.sandbox_network(&id, cfg, &ns).await.inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&dir);
            })?;
            meta.setting_up = false;
            write_json_atomic(&dir.join("meta.json"), &meta)
                .map_err(|e| rt_err("sandbox meta", e))?;
            Ok(SandboxStatus {
                id,
                pod_uid: meta.pod_uid,
                ready: true,
                ip: meta.ip,
                created_at: meta.created_at,
            })
        })
    }

    fn remove_pod_sandbox<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let dir = self.sandbox_dir(id);
            if let Some(meta) = read_json::<SandboxMeta>(&dir.join("meta.json")) {
                if let Some(netns) = &meta.netns {
                    let pod = network::PodRef {
                        namespace: meta.namespace.clone(),
                        name: meta.pod_name.clone(),
                        uid: meta.pod_uid.clone(),
                    };
                    // A namespace a reboot took is passed as none: the
                    // plugins then only release what lives outside it (the
                    // IP, port mappings), as the CNI spec asks of DEL.
                    let netns = if network::is_namespace(netns) {
                        netns.clone()
                    } else {
                        PathBuf::new()
                    };
                    if let Some(cni) = &self.cni
                        && let Err(e) = cni.del(id, &netns, &pod).await
                    {
                        return Err(RuntimeError::Other(e.to_string()));
                    }
                }
                for f in [&meta.netns, &meta.ipc, &meta.uts].into_iter().flatten() {
                    network::remove_netns(f);
                }
                self.remove_pod_cgroup(&meta.cgroup_parent);
            }
            blocking(move || match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(rt_err("remove sandbox", e)),
            })
            .await
        })
    }

    fn list_pod_sandboxes(&self) -> BoxFuture<'_, Result<Vec<SandboxStatus>, RuntimeError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            if let Ok(rd) = std::fs::read_dir(self.dir.join("sandboxes")) {
                for e in rd.flatten() {
                    if let Some(m) = read_json::<SandboxMeta>(&e.path().join("meta.json")) {
                        out.push(SandboxStatus {
                            id: e.file_name().to_string_lossy().into_owned(),
                            ready: m.ready(&self.boot_id),
                            pod_uid: m.pod_uid,
                            ip: m.ip,
                            created_at: m.created_at,
                        });
                    }
                }
            }
            Ok(out)
        })
    }

    fn create_container<'a>(
        &'a self,
        sandbox_id: &'a str,
        cfg: &'a ContainerConfig,
        sandbox: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<String, RuntimeError>> {
        Box::pin(async move {
            let (image, image_mounts) = self.images_of(cfg)?;
            let join_pid = match cfg.pid_target.as_deref() {
                Some(target) if !sandbox.host_pid => Some(self.pid_namespace_of(target).await?),
                _ => None,
            };
            let id = new_id();
            let dir = self.container_dir(&id);
            let input = bundle::BundleInput {
                store: self.store.clone(),
                id: id.clone(),
                dir: dir.clone(),
                sandbox_dir: self.sandbox_dir(sandbox_id),
                sandbox_meta: read_json::<SandboxMeta>(
                    &self.sandbox_dir(sandbox_id).join("meta.json"),
                ),
                image: image.clone(),
                image_mounts,
                cfg: cfg.clone(),
                sandbox: sandbox.clone(),
                join_pid,
                cdi_spec_dirs: self.cdi_spec_dirs.clone(),
            };
            let made = blocking(move || {
                std::fs::create_dir_all(&input.dir).map_err(|e| rt_err("container dir", e))?;
                bundle::make(&input)
            })
            .await;
            let made = match made {
                Ok(m) => m,
                Err(e) => {
                    self.teardown_container_dir(&id).await;
                    return Err(e);
                }
            };
            let start_error = made.start_error.is_some();
            let meta = container_meta(sandbox_id, cfg, sandbox, &image, made);
            let log_path = PathBuf::from(&meta.log_path);
            if let Err(e) = write_json_atomic(&dir.join("meta.json"), &meta) {
                self.teardown_container_dir(&id).await;
                return Err(rt_err("container meta", e));
            }
            if start_error {
                // Never handed to libcontainer (it would refuse it with a
                // message of its own): the start reports the reason, and the
                // container reads as exited with StartError, as containerd's.
                // Its rootfs is not needed any more.
                let rootfs = dir.join("rootfs");
                let _ = blocking(move || {
                    let _ = rustix::mount::unmount(&rootfs, rustix::mount::UnmountFlags::DETACH);
                    Ok(())
                })
                .await;
                self.store.touch(&image.id);
                return Ok(id);
            }
            let req = Request::Create {
                id: id.clone(),
                bundle: dir.clone(),
                log_path,
                log_max_size: self.log_rotation.0,
                log_max_files: self.log_rotation.1,
                stdin: cfg.stdin,
                stdin_once: cfg.stdin_once,
            };
            if let Err(e) = self.monitor.record(&req).await {
                self.teardown_container_dir(&id).await;
                return Err(RuntimeError::Other(e.to_string()));
            }
            self.store.touch(&image.id);
            Ok(id)
        })
    }

    fn start_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let path = self.container_dir(id).join("meta.json");
            let meta = blocking(move || Ok(read_json::<ContainerMeta>(&path))).await?;
            if let Some((msg, _)) = meta.and_then(|m| m.start_error) {
                return Err(RuntimeError::Other(msg));
            }
            self.monitor
                .record(&Request::Start { id: id.into() })
                .await
                .map(|_| ())
                .map_err(|e| RuntimeError::Other(e.to_string()))
        })
    }

    fn stop_container<'a>(
        &'a self,
        id: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(self.stop(id, timeout))
    }

    fn image_mounts(&self) -> BoxFuture<'_, Result<(), kinglet_runtime::ImageMountsError>> {
        Box::pin(async { Ok(()) })
    }

    fn exec<'a>(
        &'a self,
        id: &'a str,
        opts: &'a ExecOptions,
    ) -> BoxFuture<'a, Result<ExecSession, RuntimeError>> {
        Box::pin(self.exec_session(id, opts))
    }

    fn attach<'a>(
        &'a self,
        id: &'a str,
        opts: &'a ExecOptions,
    ) -> BoxFuture<'a, Result<ExecSession, RuntimeError>> {
        Box::pin(self.attach_session(id, opts))
    }

    fn port_forward<'a>(
        &'a self,
        sandbox_id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<PortStream, RuntimeError>> {
        Box::pin(async move {
            let meta = read_json::<SandboxMeta>(&self.sandbox_dir(sandbox_id).join("meta.json"))
                .ok_or_else(|| RuntimeError::NotFound(format!("pod sandbox {sandbox_id}")))?;
            let tcp = network::connect_in(meta.netns, port)
                .await
                .map_err(|e| RuntimeError::Other(format!("connecting to port {port}: {e}")))?;
            let (r, w) = tcp.into_split();
            Ok(PortStream {
                reader: Box::pin(r),
                writer: Box::pin(w),
            })
        })
    }

    fn update_container_resources<'a>(
        &'a self,
        id: &'a str,
        r: &'a kinglet_runtime::ContainerResources,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let bundle = self.container_dir(id);
            let (root, r) = (self.cgroup_root.clone(), r.clone());
            blocking(move || {
                let cg = container::cgroups_path(&bundle).ok_or_else(|| {
                    RuntimeError::NotFound(format!("container {}", bundle.display()))
                })?;
                resize::apply(&root, &cg, &r).map_err(|e| RuntimeError::Other(e.to_string()))
            })
            .await
        })
    }

    fn remove_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            match self.monitor.call(&Request::Delete { id: id.into() }).await {
                Ok(_) | Err(monitor::MonitorError::NotFound(_)) => {}
                Err(e) => return Err(RuntimeError::Other(e.to_string())),
            }
            self.teardown_container_dir(id).await;
            Ok(())
        })
    }

    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerStatus>, RuntimeError>> {
        Box::pin(async move {
            let records = self
                .monitor
                .list()
                .await
                .map_err(|e| RuntimeError::Unavailable(e.to_string()))?;
            let containers = self.dir.join("containers");
            blocking(move || Ok(statuses(&containers, records))).await
        })
    }

    fn pull_image<'a>(
        &'a self,
        image: &'a str,
        auth: &'a [PullAuth],
    ) -> BoxFuture<'a, Result<ImageInfo, ImageFailure>> {
        Box::pin(async move {
            let creds: Vec<Credentials> = auth
                .iter()
                .map(|a| Credentials {
                    username: a.username.clone(),
                    password: a.password.clone(),
                })
                .collect();
            match self.puller.pull(image, &creds).await {
                Ok(r) => {
                    // The user too, as image_status reports it.
                    let store = self.store.clone();
                    let record = r.clone();
                    let user =
                        tokio::task::spawn_blocking(move || bundle::image_user(&store, &record))
                            .await
                            .unwrap_or_default();
                    Ok(ImageInfo {
                        id: r.id,
                        repo_digests: r.repo_digests.into_iter().collect(),
                        size: r.size,
                        ..Default::default()
                    }
                    .with_user(&user))
                }
                Err(e) => Err(ImageFailure {
                    reason: e.reason(),
                    message: e.to_string(),
                }),
            }
        })
    }

    fn image_status<'a>(
        &'a self,
        image: &'a str,
    ) -> BoxFuture<'a, Result<Option<ImageInfo>, ImageFailure>> {
        Box::pin(async move {
            if let Err(e) = images::parse_reference(image)
                && !image.starts_with("sha256:")
            {
                return Err(ImageFailure {
                    reason: e.reason(),
                    message: e.to_string(),
                });
            }
            let index = self.store.read_index().map_err(|e| ImageFailure {
                reason: WaitingReason::ErrImagePull,
                message: e.to_string(),
            })?;
            let Some(r) = index.find(image) else {
                return Ok(None);
            };
            let info = ImageInfo {
                id: r.id.clone(),
                repo_digests: r.repo_digests.iter().cloned().collect(),
                size: r.size,
                ..Default::default()
            };
            // The user, for runAsNonRoot (the config blob is small).
            let store = self.store.clone();
            let record = r.clone();
            let user = tokio::task::spawn_blocking(move || bundle::image_user(&store, &record))
                .await
                .unwrap_or_default();
            Ok(Some(info.with_user(&user)))
        })
    }

    fn list_images(&self) -> BoxFuture<'_, Result<Vec<ImageInfo>, RuntimeError>> {
        Box::pin(async move {
            let index = self
                .store
                .read_index()
                .map_err(|e| rt_err("image store", e))?;
            Ok(index
                .images
                .values()
                .map(|r| ImageInfo {
                    id: r.id.clone(),
                    repo_tags: index.names_of(&r.id),
                    repo_digests: r.repo_digests.iter().cloned().collect(),
                    size: r.size,
                    ..Default::default()
                })
                .collect())
        })
    }

    fn remove_image<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let store = self.store.clone();
            let image = image.to_string();
            blocking(move || {
                store
                    .remove(&image)
                    .map(|_| ())
                    .map_err(|e| rt_err("remove image", e))
            })
            .await
        })
    }

    fn image_fs_info(&self) -> BoxFuture<'_, Result<Vec<FsUsage>, RuntimeError>> {
        Box::pin(async move {
            let root = self.store.root().to_path_buf();
            let used = tokio::task::spawn_blocking({
                let root = root.clone();
                move || images::du(&root)
            })
            .await
            .unwrap_or(0);
            Ok(vec![FsUsage {
                mountpoint: root.display().to_string(),
                used_bytes: used,
                inodes_used: 0,
            }])
        })
    }

    fn changes(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.events.changes())
    }

    fn container_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        Box::pin(async move {
            let list = self.list_containers().await?;
            let running: Vec<_> = list
                .into_iter()
                .filter(|c| c.state == ContainerState::Running)
                .filter_map(|c| {
                    let meta = read_json::<SandboxMeta>(
                        &self.sandbox_dir(&c.sandbox_id).join("meta.json"),
                    )?;
                    let path = format!("{}/{}", meta.cgroup_parent.trim_end_matches('/'), c.id);
                    Some((path, self.container_dir(&c.id).join("upper"), c))
                })
                .collect();
            let (root, cache) = (self.cgroup_root.clone(), self.writable.clone());
            // cgroup files and (when stale) a walk of each writable layer:
            // off the async thread.
            blocking(move || {
                let now = Instant::now();
                let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
                cache.retain(|id, _| running.iter().any(|(_, _, c)| &c.id == id));
                Ok(running
                    .into_iter()
                    .map(|(path, upper, c)| {
                        let writable = match cache.get(&c.id) {
                            Some((at, bytes)) if now.duration_since(*at) < WRITABLE_TTL => *bytes,
                            _ => {
                                let bytes = kinglet_runtime::disk::du(&upper);
                                cache.insert(c.id.clone(), (now, bytes));
                                bytes
                            }
                        };
                        Usage {
                            writable_layer_bytes: writable,
                            ..cgroup_usage(&root, &path, c.id, c.pod_uid)
                        }
                    })
                    .collect())
            })
            .await
        })
    }

    fn pod_sandbox_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for e in std::fs::read_dir(self.dir.join("sandboxes"))
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Some(m) = read_json::<SandboxMeta>(&e.path().join("meta.json")) {
                    let id = e.file_name().to_string_lossy().into_owned();
                    out.push(cgroup_usage(
                        &self.cgroup_root,
                        &m.cgroup_parent,
                        id,
                        m.pod_uid,
                    ));
                }
            }
            Ok(out)
        })
    }
}

/// Removes the sandbox dirs under `sandboxes` that have no `meta.json`:
/// a crash between making the dir and recording it, or midway through
/// removing it, leaves one that no listing shows and so nothing would
/// ever remove. Nothing outside the dir exists before the record does;
/// the namespace files are unmounted first all the same, in case a crash
/// cut a removal short after the record went. Run at start only, before
/// any worker makes a sandbox (a sandbox being made has no record yet).
fn sweep_unrecorded_sandboxes(sandboxes: &Path) -> Vec<String> {
    let mut swept = Vec::new();
    for e in std::fs::read_dir(sandboxes).into_iter().flatten().flatten() {
        let dir = e.path();
        if dir.join("meta.json").exists() {
            continue;
        }
        for ns in ["netns", "ipcns", "utsns"] {
            let f = dir.join(ns);
            if f.exists() {
                network::remove_netns(&f);
            }
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            swept.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sandbox_a_crash_left_half_made_is_not_ready() {
        let mut m = super::SandboxMeta {
            boot_id: "b1".into(),
            setting_up: true,
            ..Default::default()
        };
        assert!(!m.ready("b1"));
        m.setting_up = false;
        assert!(m.ready("b1"));
    }

    #[test]
    fn sandbox_dirs_without_a_record_are_swept_and_recorded_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let kept = d.path().join("a");
        let half = d.path().join("b");
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::create_dir_all(&half).unwrap();
        std::fs::write(kept.join("meta.json"), "{}").unwrap();
        std::fs::write(half.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        assert_eq!(super::sweep_unrecorded_sandboxes(d.path()), vec!["b"]);
        assert!(kept.join("meta.json").exists());
        assert!(!half.exists());
    }

    #[test]
    fn cgroup_usage_v1_and_v2() {
        let d = tempfile::tempdir().unwrap();
        let v1 = d.path().join("v1");
        let p = "kubepods/besteffort/podu/c1";
        std::fs::create_dir_all(v1.join("cpuacct").join(p)).unwrap();
        std::fs::create_dir_all(v1.join("memory").join(p)).unwrap();
        std::fs::write(v1.join("cpuacct").join(p).join("cpuacct.usage"), "5000\n").unwrap();
        std::fs::write(
            v1.join("memory").join(p).join("memory.usage_in_bytes"),
            "1000\n",
        )
        .unwrap();
        std::fs::write(
            v1.join("memory").join(p).join("memory.stat"),
            "cache 10\ninactive_file 1\ntotal_inactive_file 300\n",
        )
        .unwrap();
        let u = super::cgroup_usage(&v1, p, "c1".into(), "u".into());
        assert_eq!(
            (u.cpu_usage_core_nanos, u.memory_working_set_bytes),
            (5000, 700)
        );

        let v2 = d.path().join("v2");
        std::fs::create_dir_all(v2.join(p)).unwrap();
        std::fs::write(v2.join("cgroup.controllers"), "cpu memory").unwrap();
        std::fs::write(v2.join(p).join("cpu.stat"), "usage_usec 7\nuser_usec 5\n").unwrap();
        std::fs::write(v2.join(p).join("memory.current"), "4096\n").unwrap();
        std::fs::write(v2.join(p).join("memory.stat"), "anon 1\ninactive_file 96\n").unwrap();
        let u = super::cgroup_usage(&v2, p, "c1".into(), "u".into());
        assert_eq!(
            (u.cpu_usage_core_nanos, u.memory_working_set_bytes),
            (7000, 4000)
        );
    }

    use super::*;

    #[test]
    fn detects_cgroup_versions() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(detect_cgroups(dir.path()), None);
        std::fs::create_dir(dir.path().join("memory")).unwrap();
        assert_eq!(detect_cgroups(dir.path()), Some(Hierarchy::V1));
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory").unwrap();
        assert_eq!(detect_cgroups(dir.path()), Some(Hierarchy::V2));
    }

    fn runtime(dir: &Path, cg: &Path, state: &str) -> OciRuntime {
        let store = Arc::new(ImageStore::open(dir.join("images")).unwrap());
        let puller = Arc::new(Puller::new(store, Default::default()));
        OciRuntime::new(dir.join(state), cg, puller)
    }

    #[tokio::test]
    async fn status_reflects_host_checks() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cg");
        let rt = runtime(dir.path(), &cg, "state");
        let st = rt.status().await.unwrap();
        let c = st.condition(ConditionKind::RuntimeReady).unwrap();
        assert!(!c.status);
        assert_eq!(c.reason, "CgroupsUnavailable");

        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "memory").unwrap();
        // Cgroups and state are fine, but no monitor answers yet.
        let st = rt.status().await.unwrap();
        assert_eq!(
            st.condition(ConditionKind::RuntimeReady).unwrap().reason,
            "MonitorUnavailable"
        );
        assert!(dir.path().join("state").is_dir());
        // The check writes nothing: no entry made, the directory unchanged.
        let state = dir.path().join("state");
        let before = std::fs::metadata(&state).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        rt.status().await.unwrap();
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
        assert_eq!(
            std::fs::metadata(&state).unwrap().modified().unwrap(),
            before
        );

        // A state dir that is a file cannot hold state.
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let blocked = runtime(dir.path(), &cg, "file");
        let st = blocked.status().await.unwrap();
        assert_eq!(
            st.condition(ConditionKind::RuntimeReady).unwrap().reason,
            "StateDirUnwritable"
        );
        assert_eq!(
            rt.version().await.unwrap().node_info(),
            "kinglet-oci://0.1.0"
        );
    }
}
