//! The runtime interface: what kinglet's node and pod logic may ask of a
//! container runtime, shaped after CRI's `runtime.v1` services so that the
//! in-process runtime (`runtimes/oci`) and the containerd client
//! (`runtimes/cri`) are interchangeable.
//!
//! The surface grows with the work that needs it: today it carries the calls
//! the node agent makes (`Version`, `Status`); sandboxes, containers, images,
//! logs, exec and stats join as the pod lifecycle lands. Every method returns
//! a boxed future so the agent can hold one `Arc<dyn Runtime>` chosen at start.

use std::future::Future;
use std::pin::Pin;

pub mod backoff;
pub mod cgstats;
pub mod disk;
pub mod exec;
pub mod fake;
pub mod image;
pub mod logs;
pub mod podcgroup;

/// A future returned by a runtime call.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Errors any runtime may return; implementations add context in the message.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime cannot be reached at all (socket gone, daemon restarting).
    #[error("container runtime is unavailable: {0}")]
    Unavailable(String),
    /// The container, sandbox or image named does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Anything else the runtime reported.
    #[error("container runtime error: {0}")]
    Other(String),
    /// A CRI call this runtime does not offer.
    #[error("{0} is not supported by this container runtime")]
    Unsupported(&'static str),
    /// The call's own timeout passed (an exec past its deadline).
    #[error("{0}")]
    DeadlineExceeded(String),
}

/// Why a runtime cannot mount images as volumes.
#[derive(Debug, thiserror::Error)]
pub enum ImageMountsError {
    #[error("image volumes are not supported by this container runtime")]
    Unsupported,
    #[error("image volumes need containerd 2.1 or newer; the runtime is {name} {version}")]
    TooOld { name: String, version: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

fn unsupported<'a, T: Send + 'a>(call: &'static str) -> BoxFuture<'a, Result<T, RuntimeError>> {
    Box::pin(async move { Err(RuntimeError::Unsupported(call)) })
}

/// What CRI's `Version` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// e.g. `containerd` or `kinglet-oci`.
    pub runtime_name: String,
    /// e.g. `1.6.20`.
    pub runtime_version: String,
    /// The CRI API version spoken, `v1`.
    pub runtime_api_version: String,
}

impl RuntimeVersion {
    /// The `nodeInfo.containerRuntimeVersion` string, `<name>://<version>`.
    pub fn node_info(&self) -> String {
        format!("{}://{}", self.runtime_name, self.runtime_version)
    }
}

/// One CRI runtime condition (`RuntimeReady`, `NetworkReady`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeCondition {
    pub kind: ConditionKind,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The two conditions CRI defines and the kubelet requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionKind {
    RuntimeReady,
    NetworkReady,
}

/// What CRI's `Status` answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStatus {
    pub conditions: Vec<RuntimeCondition>,
    /// The default handler runs pods in user namespaces of their own
    /// (CRI `RuntimeHandlerFeatures.user_namespaces`): `hostUsers: false`
    /// pods are refused otherwise, as upstream refuses them.
    pub user_namespaces: bool,
}

impl RuntimeStatus {
    /// The condition of that kind; a missing condition counts as not ready,
    /// as the upstream kubelet treats it.
    pub fn condition(&self, kind: ConditionKind) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// Whether the condition of that kind is present and true.
    pub fn is_ready(&self, kind: ConditionKind) -> bool {
        self.condition(kind).is_some_and(|c| c.status)
    }
}

/// What a pod sandbox is made from (CRI `PodSandboxConfig`, the parts
/// kinglet uses).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    pub pod_uid: String,
    pub pod_name: String,
    pub namespace: String,
    pub hostname: String,
    /// `/var/log/pods/<namespace>_<name>_<uid>`.
    pub log_directory: String,
    pub host_network: bool,
    pub host_pid: bool,
    pub host_ipc: bool,
    /// `kubepods/<qos>/pod<uid>` (cgroupfs driver).
    pub cgroup_parent: String,
    /// Lines of the pod's `/etc/resolv.conf` (the runtime's to write, as
    /// CRI's `DNSConfig`; the pod's `/etc/hosts` and termination-message
    /// files are kubelet files, given as plain mounts).
    pub resolv_conf: String,
    /// `hostPort`s of the pod's containers (CRI `PortMapping`).
    pub port_mappings: Vec<PortMapping>,
    /// The pod's `securityContext.sysctls`.
    pub sysctls: Vec<(String, String)>,
    /// `podPidsLimit`: the pod cgroup's `pids.max` ([`podcgroup`]).
    pub pids_limit: Option<i64>,
    /// Whether any of the pod's containers is privileged: CRI runtimes
    /// refuse a privileged container in a sandbox not made privileged.
    pub privileged: bool,
}

/// One `hostPort` of a container: traffic to `host_ip:host_port` goes to
/// the pod's `container_port`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortMapping {
    /// `tcp`, `udp` or `sctp` (lower case, as CNI's portmap wants it).
    pub protocol: String,
    pub container_port: i32,
    pub host_port: i32,
    /// Empty: all addresses.
    pub host_ip: String,
}

/// A bind mount into a container, or (CRI's image mounts) an image's
/// filesystem mounted read-only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mount {
    /// Empty for an image mount.
    pub host_path: String,
    pub container_path: String,
    pub readonly: bool,
    /// An image volume: the image reference the pull returned.
    pub image: String,
    /// A path inside that image to mount instead of its root.
    pub image_sub_path: String,
    /// `mountPropagation` (CRI `MountPropagation`).
    pub propagation: Propagation,
}

/// How mounts propagate between the host and a container's mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Propagation {
    /// `rprivate`: neither way (the default).
    #[default]
    Private,
    /// `rslave`: mounts made on the host appear in the container.
    HostToContainer,
    /// `rshared`: both ways (privileged containers only).
    Bidirectional,
}

/// A host device node given to a container (CRI `Device`): what a device
/// plugin's `Allocate` or a CDI spec asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Device {
    /// The device node on the host (a directory: every device node in it).
    pub host_path: String,
    /// Where it appears in the container; empty: the host path.
    pub container_path: String,
    /// The cgroup access it gets: any of `r`, `w`, `m`; empty: `rwm`.
    pub permissions: String,
}

/// What a container is made from (CRI `ContainerConfig`, the parts kinglet
/// uses), already merged with the image's defaults by the caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerConfig {
    pub name: String,
    /// The restart count this container is created for.
    pub attempt: u32,
    /// The image reference as the pod names it.
    pub image: String,
    /// `command` of the pod spec (replaces the image's Entrypoint if set).
    pub command: Vec<String>,
    /// `args` of the pod spec (replace the image's Cmd if set).
    pub args: Vec<String>,
    /// Added to (and overriding) the image's environment.
    pub env: Vec<(String, String)>,
    /// Empty: the image's WorkingDir.
    pub working_dir: String,
    /// None: the image's User.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub supplemental_groups: Vec<u32>,
    /// Relative to the sandbox log directory: `<name>/<attempt>.log`.
    pub log_path: String,
    pub mounts: Vec<Mount>,
    pub memory_limit: Option<i64>,
    /// Memory plus swap (CRI `memory_swap_limit_in_bytes`, cgroup v1's
    /// `memory.memsw.limit_in_bytes`).
    pub memory_swap_limit: Option<i64>,
    /// cgroup v2 files to write (CRI `unified`): `memory.swap.max`.
    pub unified: std::collections::BTreeMap<String, String>,
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub pids_limit: Option<i64>,
    pub oom_score_adj: Option<i32>,
    pub privileged: bool,
    pub readonly_rootfs: bool,
    pub no_new_privileges: bool,
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    pub sysctls: Vec<(String, String)>,
    /// `seccompProfile: RuntimeDefault` (container's, else the pod's).
    pub seccomp_runtime_default: bool,
    /// `stdin`, `stdinOnce`, `tty` of the pod spec (what attach needs).
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    /// An ephemeral container's `targetContainerName`, resolved: the ID of
    /// the container whose PID namespace it joins (CRI
    /// `NamespaceMode::TARGET` with `target_id`). Ignored with `hostPID`.
    pub pid_target: Option<String>,
    /// Host devices the container may use without being privileged (its
    /// device plugins' allocations, resolved CDI devices).
    pub devices: Vec<Device>,
    /// Container annotations (a device plugin's `Allocate` may set some
    /// for the runtime's hooks): CRI annotations, OCI annotations in
    /// process.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Fully qualified CDI device names (`vendor.com/class=name`) the
    /// runtime resolves from the CDI specs in `/etc/cdi` and `/var/run/cdi`.
    pub cdi_devices: Vec<String>,
}

/// The cgroup settings an in-place resize changes (CRI
/// `LinuxContainerResources`, the parts kinglet sets). `None` is "no
/// limit": a quota or memory limit that was set is lifted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub cpu_shares: u64,
    /// Microseconds per 100 ms period.
    pub cpu_quota: Option<i64>,
    pub memory_limit: Option<i64>,
    /// Memory plus swap (cgroup v1's `memory.memsw.limit_in_bytes`).
    pub memory_swap_limit: Option<i64>,
    /// cgroup v2 files to write (CRI `unified`): `memory.swap.max`.
    pub unified: std::collections::BTreeMap<String, String>,
}

impl ContainerConfig {
    /// The resources part of the config, as a resize sets it.
    pub fn resources(&self) -> ContainerResources {
        ContainerResources {
            cpu_shares: self.cpu_shares.unwrap_or(2),
            cpu_quota: self.cpu_quota,
            memory_limit: self.memory_limit,
            memory_swap_limit: self.memory_swap_limit,
            unified: self.unified.clone(),
        }
    }
}

/// CRI container states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// A container as the runtime reports it (CRI `ContainerStatus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatus {
    pub id: String,
    pub sandbox_id: String,
    pub pod_uid: String,
    pub name: String,
    pub attempt: u32,
    pub image: String,
    /// `repo@sha256:...` or the image ID.
    pub image_ref: String,
    pub image_id: String,
    pub state: ContainerState,
    /// Unix nanoseconds; 0 when not yet.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// `OOMKilled`, `Error`, `Completed` when exited.
    pub reason: String,
    pub message: String,
    pub log_path: String,
    pub pid: i32,
}

/// A pod sandbox as the runtime reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxStatus {
    pub id: String,
    pub pod_uid: String,
    pub ready: bool,
    pub ip: Option<String>,
    pub created_at: i64,
}

/// An image as the runtime reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub size: u64,
    /// The image's user as a number (CRI `Image.uid`), when it is one.
    pub uid: Option<i64>,
    /// The image's user as a name (CRI `Image.username`), when it is one.
    pub username: String,
    /// Never garbage-collected (CRI `Image.pinned`: the sandbox image).
    pub pinned: bool,
}

impl ImageInfo {
    /// Fills `uid`/`username` from an image config's `User` (`uid[:gid]`
    /// or `name[:group]`), as containerd reports them; empty: neither.
    pub fn with_user(mut self, user: &str) -> Self {
        let u = user.split(':').next().unwrap_or("");
        match u.parse::<i64>() {
            Ok(n) => self.uid = Some(n),
            Err(_) => self.username = u.to_string(),
        }
        self
    }
}

/// Usage of the filesystem images live on (CRI `ImageFsInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub mountpoint: String,
    pub used_bytes: u64,
    pub inodes_used: u64,
}

/// What CRI's `ExecSync` answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Resource usage of a container or a pod sandbox (CRI stats, the parts
/// eviction and `/stats` need).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Container or sandbox ID.
    pub id: String,
    pub pod_uid: String,
    /// Cumulative CPU time.
    pub cpu_usage_core_nanos: u64,
    pub memory_working_set_bytes: u64,
    /// A container's writable layer on disk (CRI `writable_layer`); 0
    /// for sandboxes and where the runtime cannot tell.
    pub writable_layer_bytes: u64,
    /// A sandbox's network interfaces, the default first (CRI
    /// `NetworkUsage`); empty where the runtime does not tell.
    pub network: Vec<InterfaceUsage>,
}

/// One network interface's counters (CRI `NetworkInterfaceUsage`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceUsage {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// Credentials for one pull.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullAuth {
    pub username: String,
    pub password: String,
}

/// Why a container waits: upstream's reasons (`pkg/kubelet/container` and
/// `images/types.go`), spelled as upstream spells them in
/// `state.waiting.reason` and in Events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitingReason {
    ContainerCreating,
    PodInitializing,
    CrashLoopBackOff,
    ErrImagePull,
    ImagePullBackOff,
    InvalidImageName,
    ErrImageNeverPull,
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    PostStartHookError,
}

impl WaitingReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitingReason::ContainerCreating => "ContainerCreating",
            WaitingReason::PodInitializing => "PodInitializing",
            WaitingReason::CrashLoopBackOff => "CrashLoopBackOff",
            WaitingReason::ErrImagePull => "ErrImagePull",
            WaitingReason::ImagePullBackOff => "ImagePullBackOff",
            WaitingReason::InvalidImageName => "InvalidImageName",
            WaitingReason::ErrImageNeverPull => "ErrImageNeverPull",
            WaitingReason::CreateContainerConfigError => "CreateContainerConfigError",
            WaitingReason::CreateContainerError => "CreateContainerError",
            WaitingReason::RunContainerError => "RunContainerError",
            WaitingReason::PostStartHookError => "PostStartHookError",
        }
    }

    /// A failure of the image pull itself (the pull back-off applies).
    pub fn is_pull_failure(self) -> bool {
        matches!(
            self,
            WaitingReason::ErrImagePull | WaitingReason::ImagePullBackOff
        )
    }
}

impl std::fmt::Display for WaitingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an image could not be had: `ErrImagePull`, `InvalidImageName` or
/// `ErrImageNeverPull`, and upstream's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFailure {
    pub reason: WaitingReason,
    pub message: String,
}

/// A container runtime as the node agent and pod workers see it.
pub trait Runtime: Send + Sync {
    /// CRI `Version`.
    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>>;
    /// CRI `Status`.
    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>>;

    /// CRI `RunPodSandbox`; returns what it made (ID and, with its own
    /// network, the pod IP), so no second list call is needed.
    fn run_pod_sandbox<'a>(
        &'a self,
        cfg: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<SandboxStatus, RuntimeError>>;
    /// CRI `StopPodSandbox` + `RemovePodSandbox`: what is left of the pod
    /// goes (containers must be stopped first).
    fn remove_pod_sandbox<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>>;
    fn list_pod_sandboxes(&self) -> BoxFuture<'_, Result<Vec<SandboxStatus>, RuntimeError>>;

    /// CRI `CreateContainer`; returns the container ID.
    fn create_container<'a>(
        &'a self,
        sandbox_id: &'a str,
        cfg: &'a ContainerConfig,
        sandbox: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<String, RuntimeError>>;
    fn start_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// CRI `StopContainer`: the container's stop signal (the image's
    /// STOPSIGNAL, else SIGTERM), then SIGKILL after `timeout`.
    fn stop_container<'a>(
        &'a self,
        id: &'a str,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), RuntimeError>>;
    fn remove_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// CRI `UpdateContainerResources`: a running container's CPU and
    /// memory settings changed in place (an in-place pod resize).
    fn update_container_resources<'a>(
        &'a self,
        _id: &'a str,
        _resources: &'a ContainerResources,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        unsupported("UpdateContainerResources")
    }
    /// CRI `ListContainers` with status.
    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerStatus>, RuntimeError>>;

    /// CRI `PullImage`: returns the image reference to run.
    fn pull_image<'a>(
        &'a self,
        image: &'a str,
        auth: &'a [PullAuth],
    ) -> BoxFuture<'a, Result<ImageInfo, ImageFailure>>;
    /// CRI `ImageStatus`: `None` if not present.
    fn image_status<'a>(
        &'a self,
        image: &'a str,
    ) -> BoxFuture<'a, Result<Option<ImageInfo>, ImageFailure>>;

    /// CRI `ListImages` (for image GC).
    fn list_images(&self) -> BoxFuture<'_, Result<Vec<ImageInfo>, RuntimeError>> {
        unsupported("ListImages")
    }
    /// CRI `RemoveImage`.
    fn remove_image<'a>(&'a self, _image: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        unsupported("RemoveImage")
    }
    /// CRI `ImageFsInfo` (for image GC and disk eviction).
    fn image_fs_info(&self) -> BoxFuture<'_, Result<Vec<FsUsage>, RuntimeError>> {
        unsupported("ImageFsInfo")
    }
    /// CRI `Exec`: starts a process in a running container and hands back
    /// its streams and exit ([`exec::ExecSession`]; dropping it kills the
    /// process).
    fn exec<'a>(
        &'a self,
        _id: &'a str,
        _opts: &'a exec::ExecOptions,
    ) -> BoxFuture<'a, Result<exec::ExecSession, RuntimeError>> {
        unsupported("Exec")
    }
    /// CRI `Attach`: the running container's own streams (its stdin when
    /// it was created with one); `exit` resolves when the container's
    /// process ends or the runtime ends the attach.
    fn attach<'a>(
        &'a self,
        _id: &'a str,
        _opts: &'a exec::ExecOptions,
    ) -> BoxFuture<'a, Result<exec::ExecSession, RuntimeError>> {
        unsupported("Attach")
    }
    /// CRI `PortForward`: a byte stream to `port` on the sandbox's
    /// loopback (inside its network namespace), for `kubectl
    /// port-forward`; dropping both halves closes the connection.
    fn port_forward<'a>(
        &'a self,
        _sandbox_id: &'a str,
        _port: u16,
    ) -> BoxFuture<'a, Result<exec::PortStream, RuntimeError>> {
        unsupported("PortForward")
    }
    /// CRI `ExecSync` (exec probes and hooks): by default a thin layer on
    /// [`Runtime::exec`]; a timeout of zero is none.
    fn exec_sync<'a>(
        &'a self,
        id: &'a str,
        cmd: &'a [String],
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<ExecResult, RuntimeError>> {
        Box::pin(async move {
            let opts = exec::ExecOptions {
                cmd: cmd.to_vec(),
                ..Default::default()
            };
            let s = self.exec(id, &opts).await?;
            exec::exec_sync(s, timeout, exec::MAX_EXEC_SYNC_OUTPUT).await
        })
    }
    /// CRI `ListContainerStats`.
    fn container_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        unsupported("ListContainerStats")
    }
    /// CRI `ListPodSandboxStats`.
    fn pod_sandbox_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        unsupported("ListPodSandboxStats")
    }
    /// Whether mounts may name an image (image volumes); `Err` says why not.
    fn image_mounts(&self) -> BoxFuture<'_, Result<(), ImageMountsError>> {
        Box::pin(async { Err(ImageMountsError::Unsupported) })
    }
    /// Signalled when containers change, where the runtime can tell (CRI's
    /// `GetContainerEvents`); the periodic relist stays as the safety net.
    fn changes(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
}
