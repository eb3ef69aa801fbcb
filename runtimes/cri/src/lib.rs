//! kinglet's CRI runtime: a tonic client of CRI's `runtime.v1`
//! RuntimeService and ImageService over a unix socket (containerd's), behind
//! the same [`Runtime`] trait as the in-process runtime, so the pod
//! lifecycle drives either unchanged.
//!
//! What CRI leaves to the kubelet of the runtime's side is done here, as
//! upstream's `kuberuntime` does: pod cgroups removed with their sandbox
//! (the pod's `/etc/hosts` and termination-message files come from the pod
//! side as plain mounts), container log rotation through
//! `ReopenContainerLog`, and the PLEG's change detection (`GetContainerEvents`
//! where the runtime streams them; the relist otherwise).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use kinglet_runtime::backoff::Backoff;
use kinglet_runtime::exec::{ExecOptions, ExecSession, PortStream};
use kinglet_runtime::{
    BoxFuture, ConditionKind, ContainerConfig, ContainerState, ContainerStatus, ExecResult,
    FsUsage, ImageFailure, ImageInfo, PullAuth, Runtime, RuntimeCondition, RuntimeError,
    RuntimeStatus, RuntimeVersion, SandboxConfig, SandboxStatus, Usage, WaitingReason,
};
use tokio::sync::Notify;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info};

mod convert;
pub mod logs;
pub mod streaming;

use convert::*;

#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("runtime.v1");
}

use proto::image_service_client::ImageServiceClient;
use proto::runtime_service_client::RuntimeServiceClient;

/// The labels upstream's kubelet puts on sandboxes and containers; other
/// CRI clients (crictl, kubelet tooling) read them.
const POD_NAME: &str = "io.kubernetes.pod.name";
const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const POD_UID: &str = "io.kubernetes.pod.uid";
const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// Upstream's default `runtimeRequestTimeout`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Status and Version answer fast or the runtime counts as down.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors setting the client up.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("container runtime endpoint {0:?}: only unix:// endpoints are supported")]
    Endpoint(String),
}

/// A container's status, fetched once per state it is seen in: the list
/// says when it changed.
#[derive(Clone)]
struct Cached {
    state: i32,
    status: ContainerStatus,
}

/// The CRI runtime.
pub struct CriRuntime {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    /// Per-pod records of its own: `pods/<uid>/cgroup-parent`.
    dir: PathBuf,
    cgroup_root: PathBuf,
    statuses: Mutex<HashMap<String, Cached>>,
    sandbox_ips: Mutex<HashMap<String, Option<String>>>,
    changes: Arc<Notify>,
}

/// An `ExecSync` past its timeout: the request's own deadline, or
/// containerd's "timeout 1s exceeded: context deadline exceeded" (as
/// upstream's remote runtime turns both into a timeout error).
fn exec_sync_err(s: tonic::Status, timeout: Duration) -> RuntimeError {
    let timed_out = s.code() == tonic::Code::DeadlineExceeded
        || (!timeout.is_zero() && s.message().contains("deadline exceeded"));
    if timed_out {
        return RuntimeError::DeadlineExceeded(format!(
            "command timed out after {}s",
            timeout.as_secs_f64()
        ));
    }
    status_err("ExecSync", s)
}

/// containerd ≥ 2.1 (or CRI-O ≥ 1.31) mounts images.
fn image_mounts_supported(name: &str, version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    match name {
        "containerd" => (major, minor) >= (2, 1),
        "cri-o" => (major, minor) >= (1, 31),
        _ => false,
    }
}

fn status_err(call: &str, s: tonic::Status) -> RuntimeError {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
            RuntimeError::Unavailable(format!("{call}: {}", s.message()))
        }
        tonic::Code::NotFound => RuntimeError::NotFound(format!("{call}: {}", s.message())),
        tonic::Code::Unknown if s.message().contains("transport") => {
            RuntimeError::Unavailable(format!("{call}: {}", s.message()))
        }
        _ => RuntimeError::Other(format!("{call}: {}", s.message())),
    }
}

fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// The socket path of a `unix://` endpoint (a bare path is accepted too,
/// as upstream does with a deprecation warning).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    match endpoint.strip_prefix("unix://") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        None if endpoint.starts_with('/') => Ok(PathBuf::from(endpoint)),
        _ => Err(CriError::Endpoint(endpoint.into())),
    }
}

impl CriRuntime {
    /// A client of the runtime at `endpoint` (`unix:///run/containerd/containerd.sock`).
    /// Nothing is dialled yet: a runtime that is absent now is reported by
    /// `status` until it answers, and the channel reconnects by itself after
    /// the runtime restarts.
    pub fn new(
        endpoint: &str,
        dir: impl Into<PathBuf>,
        cgroup_root: impl Into<PathBuf>,
    ) -> Result<Self, CriError> {
        let path = socket_path(endpoint)?;
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(2))
            .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }));
        Ok(CriRuntime {
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20),
            images: ImageServiceClient::new(channel).max_decoding_message_size(16 << 20),
            dir: dir.into(),
            cgroup_root: cgroup_root.into(),
            statuses: Mutex::new(HashMap::new()),
            sandbox_ips: Mutex::new(HashMap::new()),
            changes: Arc::new(Notify::new()),
        })
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.dir.join("pods").join(uid)
    }

    /// Streams container events and wakes the pod manager on each. While no
    /// stream can be had (containerd before 1.7 has none; a restarting
    /// containerd) it wakes the pod manager every second instead, which is
    /// upstream's generic PLEG: the manager's own relist runs only every
    /// 10 s for a runtime that offers events.
    pub async fn watch_events(&self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        loop {
            let mut no_stream_ever = false;
            let mut client = self.rt();
            let stream = tokio::select! {
                _ = &mut shutdown => return,
                r = client.get_container_events(proto::GetEventsRequest {}) => r,
            };
            match stream {
                Ok(s) => {
                    info!("container runtime streams container events");
                    backoff.reset();
                    let mut s = s.into_inner();
                    loop {
                        tokio::select! {
                            _ = &mut shutdown => return,
                            m = s.message() => match m {
                                Ok(Some(e)) => {
                                    debug!(container = %e.container_id, kind = e.container_event_type, "container event");
                                    self.changes.notify_one();
                                }
                                Ok(None) | Err(_) => break,
                            }
                        }
                    }
                }
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    info!("container runtime has no container events: relisting every second");
                    // No stream will ever come: the wake-ups below, forever.
                    no_stream_ever = true;
                }
                Err(_) => {}
            }
            // Meanwhile, a relist every second (the stream's back-off can
            // be long; without a stream at all it lasts).
            let delay = if no_stream_ever {
                Duration::MAX
            } else {
                backoff.next_delay()
            };
            let until = tokio::time::Instant::now().checked_add(delay);
            while until.is_none_or(|u| tokio::time::Instant::now() < u) {
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => self.changes.notify_one(),
                }
            }
        }
    }

    /// Removes what is left of a pod's cgroups (CRI runtimes remove only
    /// their containers' cgroups; the pod level is the kubelet's).
    fn remove_pod_cgroup(&self, parent: &str) {
        let parent = parent.trim_start_matches('/');
        if parent.is_empty() {
            return;
        }
        let _ = std::fs::remove_dir(self.cgroup_root.join(parent));
        for e in std::fs::read_dir(&self.cgroup_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::remove_dir(e.path().join(parent));
        }
    }

    async fn fetch_status(&self, id: &str) -> Result<proto::ContainerStatus, RuntimeError> {
        self.rt()
            .container_status(request(
                proto::ContainerStatusRequest {
                    container_id: id.into(),
                    verbose: false,
                },
                REQUEST_TIMEOUT,
            ))
            .await
            .map_err(|e| status_err("ContainerStatus", e))?
            .into_inner()
            .status
            .ok_or_else(|| RuntimeError::Other(format!("ContainerStatus {id}: empty answer")))
    }

    async fn sandbox_ip(&self, id: &str) -> Option<String> {
        if let Some(ip) = self.sandbox_ips.lock().ok()?.get(id) {
            return ip.clone();
        }
        let st = self
            .rt()
            .pod_sandbox_status(request(
                proto::PodSandboxStatusRequest {
                    pod_sandbox_id: id.into(),
                    verbose: false,
                },
                REQUEST_TIMEOUT,
            ))
            .await
            .ok()?
            .into_inner()
            .status?;
        let ip = st.network.map(|n| n.ip).filter(|ip| !ip.is_empty());
        if let Ok(mut m) = self.sandbox_ips.lock() {
            m.insert(id.into(), ip.clone());
        }
        ip
    }
}

impl CriRuntime {
    /// The runtime's configured sandbox image, from `Status`'s verbose
    /// info (containerd: `config.sandboxImage`), if it says.
    async fn sandbox_image(&self) -> Option<String> {
        let r = self
            .rt()
            .status(request(
                proto::StatusRequest { verbose: true },
                STATUS_TIMEOUT,
            ))
            .await
            .ok()?
            .into_inner();
        let config: serde_json::Value = serde_json::from_str(r.info.get("config")?).ok()?;
        Some(config.get("sandboxImage")?.as_str()?.to_string())
    }
}

impl Runtime for CriRuntime {
    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>> {
        Box::pin(async move {
            let v = self
                .rt()
                .version(request(
                    proto::VersionRequest {
                        version: "v1".into(),
                    },
                    STATUS_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("Version", e))?
                .into_inner();
            Ok(RuntimeVersion {
                runtime_name: v.runtime_name,
                runtime_version: v.runtime_version,
                runtime_api_version: v.runtime_api_version,
            })
        })
    }

    /// Image mounts came with containerd 2.1; older releases would take
    /// the mount for an empty host path.
    fn image_mounts(&self) -> BoxFuture<'_, Result<(), kinglet_runtime::ImageMountsError>> {
        Box::pin(async move {
            let v = self.version().await?;
            if image_mounts_supported(&v.runtime_name, &v.runtime_version) {
                return Ok(());
            }
            Err(kinglet_runtime::ImageMountsError::TooOld {
                name: v.runtime_name,
                version: v.runtime_version,
            })
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>> {
        Box::pin(async move {
            let resp = self
                .rt()
                .status(request(
                    proto::StatusRequest { verbose: false },
                    STATUS_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("Status", e))?
                .into_inner();
            // The default handler's features (containerd 1.7+ reports them).
            let user_namespaces = resp
                .runtime_handlers
                .iter()
                .find(|h| h.name.is_empty())
                .and_then(|h| h.features.as_ref())
                .is_some_and(|f| f.user_namespaces);
            let st = resp.status.unwrap_or_default();
            Ok(RuntimeStatus {
                user_namespaces,
                conditions: st
                    .conditions
                    .into_iter()
                    .filter_map(|c| {
                        let kind = match c.r#type.as_str() {
                            "RuntimeReady" => ConditionKind::RuntimeReady,
                            "NetworkReady" => ConditionKind::NetworkReady,
                            _ => return None,
                        };
                        Some(RuntimeCondition {
                            kind,
                            status: c.status,
                            reason: c.reason,
                            message: c.message,
                        })
                    })
                    .collect(),
            })
        })
    }

    fn run_pod_sandbox<'a>(
        &'a self,
        cfg: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<SandboxStatus, RuntimeError>> {
        Box::pin(async move {
            let dir = self.pod_dir(&cfg.pod_uid);
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| RuntimeError::Other(format!("{}: {e}", dir.display())))?;
            write_atomic(&dir.join("cgroup-parent"), cfg.cgroup_parent.as_bytes())
                .map_err(|e| RuntimeError::Other(format!("{}: {e}", dir.display())))?;
            if !cfg.log_directory.is_empty() {
                let _ = tokio::fs::create_dir_all(&cfg.log_directory).await;
            }
            // The pod cgroup's pids.max before runc makes the cgroup under
            // it (CRI has no field for it; upstream's kubelet does this).
            if let Some(limit) = cfg.pids_limit {
                let (root, parent) = (self.cgroup_root.clone(), cfg.cgroup_parent.clone());
                tokio::task::spawn_blocking(move || {
                    kinglet_runtime::podcgroup::set_pids_limit(&root, &parent, limit)
                })
                .await
                .map_err(|e| RuntimeError::Other(e.to_string()))?
                .map_err(|e| RuntimeError::Other(format!("pod pids limit: {e}")))?;
            }
            let resp = self
                .rt()
                .run_pod_sandbox(request(
                    proto::RunPodSandboxRequest {
                        config: Some(sandbox_config(cfg)),
                        runtime_handler: String::new(),
                    },
                    REQUEST_TIMEOUT,
                ))
                .await;
            match resp {
                Ok(r) => {
                    let id = r.into_inner().pod_sandbox_id;
                    let ip = self.sandbox_ip(&id).await;
                    Ok(SandboxStatus {
                        id,
                        pod_uid: cfg.pod_uid.clone(),
                        ready: true,
                        ip,
                        created_at: jiff::Timestamp::now().as_nanosecond() as i64,
                    })
                }
                Err(e) => {
                    // What a failed attempt left (runc may have made the
                    // cgroups) goes now: no sandbox will carry it away.
                    self.remove_pod_cgroup(&cfg.cgroup_parent);
                    let _ = std::fs::remove_dir_all(&dir);
                    Err(status_err("RunPodSandbox", e))
                }
            }
        })
    }

    fn remove_pod_sandbox<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let status = self
                .rt()
                .pod_sandbox_status(request(
                    proto::PodSandboxStatusRequest {
                        pod_sandbox_id: id.into(),
                        verbose: false,
                    },
                    REQUEST_TIMEOUT,
                ))
                .await;
            let status = match status {
                Ok(r) => r.into_inner().status,
                Err(s) if s.code() == tonic::Code::NotFound => None,
                Err(s) => return Err(status_err("PodSandboxStatus", s)),
            };
            for (call, r) in [
                (
                    "StopPodSandbox",
                    self.rt()
                        .stop_pod_sandbox(request(
                            proto::StopPodSandboxRequest {
                                pod_sandbox_id: id.into(),
                            },
                            REQUEST_TIMEOUT,
                        ))
                        .await
                        .map(|_| ()),
                ),
                (
                    "RemovePodSandbox",
                    self.rt()
                        .remove_pod_sandbox(request(
                            proto::RemovePodSandboxRequest {
                                pod_sandbox_id: id.into(),
                            },
                            REQUEST_TIMEOUT,
                        ))
                        .await
                        .map(|_| ()),
                ),
            ] {
                match r {
                    Ok(()) => {}
                    Err(s) if s.code() == tonic::Code::NotFound => {}
                    Err(s) => return Err(status_err(call, s)),
                }
            }
            if let Ok(mut m) = self.sandbox_ips.lock() {
                m.remove(id);
            }
            if let Some(st) = status {
                let uid = st.metadata.map(|m| m.uid).unwrap_or_default();
                if !uid.is_empty() {
                    let dir = self.pod_dir(&uid);
                    if let Ok(parent) = std::fs::read_to_string(dir.join("cgroup-parent")) {
                        self.remove_pod_cgroup(parent.trim());
                    }
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
            Ok(())
        })
    }

    fn list_pod_sandboxes(&self) -> BoxFuture<'_, Result<Vec<SandboxStatus>, RuntimeError>> {
        Box::pin(async move {
            let items = self
                .rt()
                .list_pod_sandbox(request(
                    proto::ListPodSandboxRequest { filter: None },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("ListPodSandbox", e))?
                .into_inner()
                .items;
            let mut out = Vec::with_capacity(items.len());
            for s in items {
                let Some(uid) = s.metadata.as_ref().map(|m| m.uid.clone()) else {
                    continue;
                };
                let ready = s.state == proto::PodSandboxState::SandboxReady as i32;
                let ip = if ready {
                    self.sandbox_ip(&s.id).await
                } else {
                    None
                };
                out.push(SandboxStatus {
                    id: s.id,
                    pod_uid: uid,
                    ready,
                    ip,
                    created_at: s.created_at,
                });
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
            let config = container_config(cfg, sandbox);
            let resp = self
                .rt()
                .create_container(request(
                    proto::CreateContainerRequest {
                        pod_sandbox_id: sandbox_id.into(),
                        config: Some(config),
                        sandbox_config: Some(sandbox_config(sandbox)),
                    },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("CreateContainer", e))?;
            Ok(resp.into_inner().container_id)
        })
    }

    fn start_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.rt()
                .start_container(request(
                    proto::StartContainerRequest {
                        container_id: id.into(),
                    },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("StartContainer", e))?;
            self.changes.notify_one();
            Ok(())
        })
    }

    fn stop_container<'a>(
        &'a self,
        id: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let r = self
                .rt()
                .stop_container(request(
                    proto::StopContainerRequest {
                        container_id: id.into(),
                        timeout: timeout.as_secs() as i64,
                    },
                    REQUEST_TIMEOUT + timeout,
                ))
                .await;
            match r {
                Ok(_) => Ok(()),
                Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
                Err(s) => Err(status_err("StopContainer", s)),
            }
        })
    }

    fn update_container_resources<'a>(
        &'a self,
        id: &'a str,
        r: &'a kinglet_runtime::ContainerResources,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let req = proto::UpdateContainerResourcesRequest {
                container_id: id.into(),
                linux: Some(convert::linux_resources(r)),
                ..Default::default()
            };
            self.rt()
                .update_container_resources(request(req, REQUEST_TIMEOUT))
                .await
                .map(|_| ())
                .map_err(|s| status_err("UpdateContainerResources", s))
        })
    }

    fn remove_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            match self
                .rt()
                .remove_container(request(
                    proto::RemoveContainerRequest {
                        container_id: id.into(),
                    },
                    REQUEST_TIMEOUT,
                ))
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::NotFound => {}
                Err(s) => return Err(status_err("RemoveContainer", s)),
            }
            if let Ok(mut m) = self.statuses.lock() {
                m.remove(id);
            }
            Ok(())
        })
    }

    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerStatus>, RuntimeError>> {
        Box::pin(async move {
            let list = self
                .rt()
                .list_containers(request(
                    proto::ListContainersRequest { filter: None },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("ListContainers", e))?
                .into_inner()
                .containers;
            let mut out = Vec::with_capacity(list.len());
            let mut seen = Vec::with_capacity(list.len());
            for c in list {
                // Containers kinglet did not make are not its business.
                let Some(uid) = c.labels.get(POD_UID).cloned() else {
                    continue;
                };
                seen.push(c.id.clone());
                let cached = self
                    .statuses
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&c.id).cloned())
                    .filter(|k| k.state == c.state);
                let status = match cached {
                    Some(k) => k.status,
                    None => {
                        let s = match self.fetch_status(&c.id).await {
                            Ok(s) => s,
                            // Removed between the list and the status.
                            Err(_) => continue,
                        };
                        let st = convert_status(s, uid, c.pod_sandbox_id.clone());
                        if let Ok(mut m) = self.statuses.lock() {
                            m.insert(
                                c.id.clone(),
                                Cached {
                                    state: c.state,
                                    status: st.clone(),
                                },
                            );
                        }
                        st
                    }
                };
                out.push(status);
            }
            if let Ok(mut m) = self.statuses.lock() {
                m.retain(|id, _| seen.contains(id));
            }
            Ok(out)
        })
    }

    fn pull_image<'a>(
        &'a self,
        image: &'a str,
        auth: &'a [PullAuth],
    ) -> BoxFuture<'a, Result<ImageInfo, ImageFailure>> {
        Box::pin(async move {
            // Each credential in turn, then none, as upstream tries the
            // pull secrets' credentials.
            let mut tries: Vec<Option<proto::AuthConfig>> = auth
                .iter()
                .map(|a| {
                    Some(proto::AuthConfig {
                        username: a.username.clone(),
                        password: a.password.clone(),
                        ..Default::default()
                    })
                })
                .collect();
            if tries.is_empty() {
                tries.push(None);
            }
            let mut last = None;
            for auth in tries {
                let r = self
                    .images
                    .clone()
                    .pull_image(tonic::Request::new(proto::PullImageRequest {
                        image: Some(proto::ImageSpec {
                            image: image.into(),
                            ..Default::default()
                        }),
                        auth,
                        sandbox_config: None,
                    }))
                    .await;
                match r {
                    Ok(_) => {
                        return match self.image_status(image).await? {
                            Some(i) => Ok(i),
                            None => Err(ImageFailure {
                                reason: WaitingReason::ErrImagePull,
                                message: format!("image {image:?} missing after its pull"),
                            }),
                        };
                    }
                    Err(s) => last = Some(image_failure(image, s)),
                }
            }
            Err(last.unwrap_or_else(|| ImageFailure {
                reason: WaitingReason::ErrImagePull,
                message: "no pull attempted".into(),
            }))
        })
    }

    fn image_status<'a>(
        &'a self,
        image: &'a str,
    ) -> BoxFuture<'a, Result<Option<ImageInfo>, ImageFailure>> {
        Box::pin(async move {
            let r = self
                .images
                .clone()
                .image_status(request(
                    proto::ImageStatusRequest {
                        image: Some(proto::ImageSpec {
                            image: image.into(),
                            ..Default::default()
                        }),
                        verbose: false,
                    },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|s| image_failure(image, s))?;
            Ok(r.into_inner().image.map(image_info))
        })
    }

    fn list_images(&self) -> BoxFuture<'_, Result<Vec<ImageInfo>, RuntimeError>> {
        Box::pin(async move {
            let r = self
                .images
                .clone()
                .list_images(request(
                    proto::ListImagesRequest { filter: None },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("ListImages", e))?;
            let sandbox = self.sandbox_image().await;
            let mut images: Vec<ImageInfo> =
                r.into_inner().images.into_iter().map(image_info).collect();
            // containerd before 1.7 reports no image pinned; its sandbox
            // image is pinned all the same (GC must never take it).
            if let Some(sandbox) = sandbox {
                for i in images.iter_mut().filter(|i| i.repo_tags.contains(&sandbox)) {
                    i.pinned = true;
                }
            }
            Ok(images)
        })
    }

    fn remove_image<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.images
                .clone()
                .remove_image(request(
                    proto::RemoveImageRequest {
                        image: Some(proto::ImageSpec {
                            image: image.into(),
                            ..Default::default()
                        }),
                    },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("RemoveImage", e))?;
            Ok(())
        })
    }

    fn image_fs_info(&self) -> BoxFuture<'_, Result<Vec<FsUsage>, RuntimeError>> {
        Box::pin(async move {
            let r = self
                .images
                .clone()
                .image_fs_info(request(proto::ImageFsInfoRequest {}, REQUEST_TIMEOUT))
                .await
                .map_err(|e| status_err("ImageFsInfo", e))?
                .into_inner();
            Ok(r.image_filesystems
                .into_iter()
                .map(|f| FsUsage {
                    mountpoint: f.fs_id.map(|i| i.mountpoint).unwrap_or_default(),
                    used_bytes: f.used_bytes.map(|v| v.value).unwrap_or(0),
                    inodes_used: f.inodes_used.map(|v| v.value).unwrap_or(0),
                })
                .collect())
        })
    }

    fn exec_sync<'a>(
        &'a self,
        id: &'a str,
        cmd: &'a [String],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<ExecResult, RuntimeError>> {
        Box::pin(async move {
            let r = self
                .rt()
                .exec_sync(request(
                    proto::ExecSyncRequest {
                        container_id: id.into(),
                        cmd: cmd.to_vec(),
                        timeout: timeout.as_secs() as i64,
                    },
                    REQUEST_TIMEOUT + timeout,
                ))
                .await
                .map_err(|e| exec_sync_err(e, timeout))?
                .into_inner();
            Ok(ExecResult {
                exit_code: r.exit_code,
                stdout: r.stdout,
                stderr: r.stderr,
            })
        })
    }

    fn exec<'a>(
        &'a self,
        id: &'a str,
        opts: &'a ExecOptions,
    ) -> BoxFuture<'a, Result<ExecSession, RuntimeError>> {
        Box::pin(async move {
            let req = proto::ExecRequest {
                container_id: id.into(),
                cmd: opts.cmd.clone(),
                tty: opts.tty,
                stdin: opts.stdin,
                stdout: true,
                stderr: !opts.tty,
            };
            let url = self
                .rt()
                .exec(request(req, REQUEST_TIMEOUT))
                .await
                .map_err(|e| status_err("Exec", e))?
                .into_inner()
                .url;
            streaming::exec_session(&url, opts).await
        })
    }

    fn attach<'a>(
        &'a self,
        id: &'a str,
        opts: &'a ExecOptions,
    ) -> BoxFuture<'a, Result<ExecSession, RuntimeError>> {
        Box::pin(async move {
            let req = proto::AttachRequest {
                container_id: id.into(),
                stdin: opts.stdin,
                tty: opts.tty,
                stdout: true,
                stderr: !opts.tty,
            };
            let url = self
                .rt()
                .attach(request(req, REQUEST_TIMEOUT))
                .await
                .map_err(|e| status_err("Attach", e))?
                .into_inner()
                .url;
            tracing::debug!(%url, "attach through the runtime's streaming server");
            streaming::exec_session(&url, opts).await
        })
    }

    fn port_forward<'a>(
        &'a self,
        sandbox_id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<PortStream, RuntimeError>> {
        Box::pin(async move {
            let req = proto::PortForwardRequest {
                pod_sandbox_id: sandbox_id.into(),
                port: vec![i32::from(port)],
            };
            let url = self
                .rt()
                .port_forward(request(req, REQUEST_TIMEOUT))
                .await
                .map_err(|e| status_err("PortForward", e))?
                .into_inner()
                .url;
            streaming::port_stream(&url, port).await
        })
    }

    fn container_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        Box::pin(async move {
            let r = self
                .rt()
                .list_container_stats(request(
                    proto::ListContainerStatsRequest { filter: None },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("ListContainerStats", e))?
                .into_inner();
            Ok(r.stats
                .into_iter()
                .map(|s| {
                    let attrs = s.attributes.unwrap_or_default();
                    Usage {
                        pod_uid: attrs.labels.get(POD_UID).cloned().unwrap_or_default(),
                        id: attrs.id,
                        cpu_usage_core_nanos: s
                            .cpu
                            .and_then(|c| c.usage_core_nano_seconds)
                            .map_or(0, |v| v.value),
                        memory_working_set_bytes: s
                            .memory
                            .and_then(|m| m.working_set_bytes)
                            .map_or(0, |v| v.value),
                        writable_layer_bytes: s
                            .writable_layer
                            .and_then(|w| w.used_bytes)
                            .map_or(0, |v| v.value),
                        ..Usage::default()
                    }
                })
                .collect())
        })
    }

    fn pod_sandbox_stats(&self) -> BoxFuture<'_, Result<Vec<Usage>, RuntimeError>> {
        Box::pin(async move {
            let r = self
                .rt()
                .list_pod_sandbox_stats(request(
                    proto::ListPodSandboxStatsRequest { filter: None },
                    REQUEST_TIMEOUT,
                ))
                .await
                .map_err(|e| status_err("ListPodSandboxStats", e))?
                .into_inner();
            Ok(r.stats
                .into_iter()
                .map(|s| {
                    let attrs = s.attributes.unwrap_or_default();
                    let linux = s.linux.unwrap_or_default();
                    Usage {
                        pod_uid: attrs.metadata.map(|m| m.uid).unwrap_or_default(),
                        id: attrs.id,
                        cpu_usage_core_nanos: linux
                            .cpu
                            .and_then(|c| c.usage_core_nano_seconds)
                            .map_or(0, |v| v.value),
                        memory_working_set_bytes: linux
                            .memory
                            .and_then(|m| m.working_set_bytes)
                            .map_or(0, |v| v.value),
                        network: linux.network.map(interfaces).unwrap_or_default(),
                        ..Usage::default()
                    }
                })
                .collect())
        })
    }

    fn changes(&self) -> Option<Arc<Notify>> {
        Some(self.changes.clone())
    }
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_mounts_need_containerd_2_1() {
        assert!(!super::image_mounts_supported("containerd", "1.6.20~ds1"));
        assert!(!super::image_mounts_supported("containerd", "v2.0.5"));
        assert!(super::image_mounts_supported("containerd", "v2.1.0"));
        assert!(super::image_mounts_supported("containerd", "2.2.1"));
        assert!(!super::image_mounts_supported("other", "9.9"));
    }

    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/run/x.sock").unwrap(),
            PathBuf::from("/run/x.sock")
        );
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
        assert!(socket_path("unix://").is_err());
    }

    #[test]
    fn sandbox_config_like_upstream() {
        let cfg = SandboxConfig {
            pod_uid: "u1".into(),
            pod_name: "web".into(),
            namespace: "default".into(),
            hostname: "web".into(),
            log_directory: "/var/log/pods/default_web_u1".into(),
            host_ipc: true,
            cgroup_parent: "kubepods/besteffort/podu1".into(),
            resolv_conf: "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:5\n".into(),
            port_mappings: vec![kinglet_runtime::PortMapping {
                protocol: "udp".into(),
                container_port: 53,
                host_port: 5353,
                host_ip: String::new(),
            }],
            ..Default::default()
        };
        let c = sandbox_config(&cfg);
        assert_eq!(c.hostname, "web");
        let dns = c.dns_config.unwrap();
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(dns.searches.len(), 2);
        assert_eq!(dns.options, ["ndots:5"]);
        assert_eq!(c.port_mappings[0].protocol, proto::Protocol::Udp as i32);
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu1");
        let ns = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.ipc, proto::NamespaceMode::Node as i32);
        assert_eq!(ns.network, proto::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, proto::NamespaceMode::Container as i32);
        assert_eq!(c.labels[POD_UID], "u1");
    }

    #[test]
    fn an_ephemeral_target_joins_the_targets_pid_namespace_unless_host_pid() {
        let cfg = ContainerConfig {
            pid_target: Some("c1".into()),
            ..Default::default()
        };
        let ns = container_namespace_options(&SandboxConfig::default(), &cfg);
        assert_eq!(ns.pid, proto::NamespaceMode::Target as i32);
        assert_eq!(ns.target_id, "c1");
        let plain = container_namespace_options(&SandboxConfig::default(), &Default::default());
        assert_eq!(
            (plain.pid, plain.target_id.as_str()),
            (proto::NamespaceMode::Container as i32, "")
        );
        let host = SandboxConfig {
            host_pid: true,
            ..Default::default()
        };
        let ns = container_namespace_options(&host, &cfg);
        assert_eq!(
            (ns.pid, ns.target_id.as_str()),
            (proto::NamespaceMode::Node as i32, "")
        );
    }
}
