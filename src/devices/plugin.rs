//! Device plugins (the device plugin API v1beta1, as upstream's
//! `devicemanager/plugin/v1beta1`): the registration server on
//! `kubelet.sock` in the device-plugin dir, and each registered plugin as
//! a device source: its `ListAndWatch` stream feeds the device manager,
//! its `Allocate`, `GetPreferredAllocation` and `PreStartContainer`
//! answer for its devices. A plugin whose stream ends has its devices
//! unhealthy until it registers again (the manager drops the resource
//! after upstream's 5-minute grace).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::allocate::{DeviceSpec, MountSpec, RunOptions};
use super::manager::{DeviceManager, Source};

/// The generated API (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`).
#[allow(clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

use api::device_plugin_client::DevicePluginClient;
use api::registration_server::{Registration, RegistrationServer};

/// The API version kinglet speaks (upstream's `SupportedVersions`).
pub const VERSION: &str = "v1beta1";
/// The registration socket's name in the device-plugin dir.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// A plugin's health value for a usable device.
const HEALTHY: &str = "Healthy";
/// How long dialling a plugin may take (upstream's 10 s).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `PreStartContainer` may take (upstream's
/// `KubeletPreStartContainerRPCTimeoutInSecs`).
const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an `Allocate` or `GetPreferredAllocation` may take: upstream
/// waits forever; kinglet's admission would stall behind a hung plugin.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most one plugin message may weigh.
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The registration server: plugins call `Register` on `kubelet.sock`.
pub struct Registrar {
    dir: PathBuf,
    manager: Arc<DeviceManager>,
    shutdown: CancellationToken,
}

impl Registrar {
    /// Serves registration in `dir` until `shutdown`. As upstream, the
    /// plugin sockets left in `dir` are removed first: a plugin sees its
    /// socket go (or `kubelet.sock` come) and registers again.
    pub async fn run(dir: PathBuf, manager: Arc<DeviceManager>, shutdown: CancellationToken) {
        let cleaned = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || remove_sockets(&dir)).await
        };
        if let Ok(Err(e)) = cleaned {
            warn!(dir = %dir.display(), "cleaning the device-plugin dir: {e}");
        }
        let socket = match super::grpc::Socket::bind(&dir.join(KUBELET_SOCKET)) {
            Ok(s) => s,
            Err(e) => {
                warn!(dir = %dir.display(), "device plugins cannot register: {e}");
                return;
            }
        };
        info!(socket = %dir.join(KUBELET_SOCKET).display(), "device plugin registration serving");
        let registrar = Registrar {
            dir,
            manager,
            shutdown: shutdown.clone(),
        };
        super::grpc::serve(socket, RegistrationServer::new(registrar), shutdown).await;
    }
}

/// Removes the unix sockets in `dir` (not kubelet's checkpoint or other
/// files, not directories). Blocking.
fn remove_sockets(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r?,
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_socket()) {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(
        &self,
        req: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = req.into_inner();
        if r.version != VERSION {
            return Err(Status::unknown(format!(
                "requested API version {:?} is not supported by kubelet. Supported version is [\"{VERSION}\"]",
                r.version
            )));
        }
        if super::validate_resource_name(&r.resource_name).is_err() {
            let why = format!("the ResourceName {:?} is invalid", r.resource_name);
            return Err(Status::unknown(why));
        }
        let Some(socket) = crate::pods::util::contained_child(&self.dir, &r.endpoint) else {
            let why = format!(
                "endpoint {:?} is not a socket name in the device-plugin dir",
                r.endpoint
            );
            return Err(Status::unknown(why));
        };
        // As upstream, connected before the answer: the plugin serves
        // already, and a plugin that cannot be reached is told so.
        let plugin = Plugin::connect(&socket).await.map_err(Status::unknown)?;
        info!(resource = %r.resource_name, endpoint = %r.endpoint, "device plugin registered");
        let plugin = Arc::new(plugin);
        let generation = self.manager.serve(&r.resource_name, plugin.clone());
        let watch = list_and_watch(plugin, r.resource_name, generation, self.manager.clone());
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = watch => {}
            }
        });
        Ok(Response::new(api::Empty {}))
    }
}

/// Follows a plugin's `ListAndWatch` until it ends, then stops its
/// resource (unless it registered again meanwhile).
async fn list_and_watch(
    plugin: Arc<Plugin>,
    resource: String,
    generation: u64,
    manager: Arc<DeviceManager>,
) {
    let stream = plugin.client.clone().list_and_watch(api::Empty {}).await;
    match stream {
        Ok(stream) => {
            let mut stream = stream.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        let devices: BTreeMap<String, bool> = resp
                            .devices
                            .into_iter()
                            .map(|d| (d.id, d.health == HEALTHY))
                            .collect();
                        manager.update(&resource, generation, devices);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        warn!(resource = %resource, "ListAndWatch ended unexpectedly for device plugin: {e}");
                        break;
                    }
                }
            }
        }
        Err(e) => warn!(resource = %resource, "ListAndWatch failed for device plugin: {e}"),
    }
    manager.stopped(&resource, generation);
}

/// A registered plugin: its client and the options it asked for.
struct Plugin {
    client: DevicePluginClient<Channel>,
    options: api::DevicePluginOptions,
}

impl Plugin {
    /// Dials the plugin at `socket` and reads its options.
    async fn connect(socket: &Path) -> Result<Plugin, String> {
        let path = socket.to_path_buf();
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(DIAL_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .map_err(|e| format!("failed to dial device plugin: {e}"))?;
        let mut client =
            DevicePluginClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        let options = tokio::time::timeout(
            DIAL_TIMEOUT,
            client.get_device_plugin_options(api::Empty {}),
        )
        .await
        .map_err(|_| "failed to get device plugin options: timed out".to_string())?
        .map_err(|e| format!("failed to get device plugin options: {}", e.message()))?
        .into_inner();
        Ok(Plugin { client, options })
    }
}

impl Source for Plugin {
    fn allocate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<RunOptions, String>> {
        Box::pin(async move {
            let req = api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: ids.to_vec(),
                }],
            };
            let mut client = self.client.clone();
            let call = client.allocate(req);
            let resp = tokio::time::timeout(CALL_TIMEOUT, call)
                .await
                .map_err(|_| "device plugin Allocate timed out".to_string())?
                .map_err(|e| e.message().to_string())?
                .into_inner();
            let Some(c) = resp.container_responses.into_iter().next() else {
                return Err("no containers return in allocation response".into());
            };
            Ok(run_options(c))
        })
    }

    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        must: &'a [String],
        size: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            if !self.options.get_preferred_allocation_available {
                return Ok(Vec::new());
            }
            let req = api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.to_vec(),
                    must_include_device_i_ds: must.to_vec(),
                    allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
                }],
            };
            let mut client = self.client.clone();
            let call = client.get_preferred_allocation(req);
            let failed =
                |e: &str| format!("device plugin GetPreferredAllocation rpc failed with err: {e}");
            let resp = tokio::time::timeout(CALL_TIMEOUT, call)
                .await
                .map_err(|_| failed("timed out"))?
                .map_err(|e| failed(e.message()))?
                .into_inner();
            let first = resp.container_responses.into_iter().next();
            Ok(first.map(|c| c.device_i_ds).unwrap_or_default())
        })
    }

    fn pre_start<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if !self.options.pre_start_required {
                return Ok(());
            }
            let req = api::PreStartContainerRequest {
                devices_ids: ids.to_vec(),
            };
            let failed =
                |e: &str| format!("device plugin PreStartContainer rpc failed with err: {e}");
            let mut client = self.client.clone();
            let call = client.pre_start_container(req);
            tokio::time::timeout(PRE_START_TIMEOUT, call)
                .await
                .map_err(|_| failed("timed out"))?
                .map_err(|e| failed(e.message()))?;
            Ok(())
        })
    }
}

/// A plugin's answer for one container as kinglet keeps it.
fn run_options(c: api::ContainerAllocateResponse) -> RunOptions {
    RunOptions {
        envs: c.envs.into_iter().collect(),
        mounts: c
            .mounts
            .into_iter()
            .map(|m| MountSpec {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: c
            .devices
            .into_iter()
            .map(|d| DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: c.annotations.into_iter().collect(),
        cdi_devices: c.cdi_devices.into_iter().map(|d| d.name).collect(),
    }
}
