//! The pod resources API v1 (upstream's `apis/podresources`), which
//! monitoring agents (DCGM exporter, Akri, topology exporters) read on
//! `kubelet.sock` in the pod-resources dir: each active pod's containers
//! with their devices (`List`, `Get`), and the node's healthy devices
//! (`GetAllocatableResources`). kinglet has no CPU or memory manager, so
//! `cpu_ids` and `memory` stay empty, as upstream's with the `none`
//! policies. As upstream, one token bucket (100 a second, 10 at once)
//! rate-limits every call.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::allocate::PodGrants;
use super::manager::DeviceManager;
use crate::pods::StatusView;

/// The generated API (`k8s.io/kubelet/pkg/apis/podresources/v1`).
#[allow(clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("v1");
}

use api::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

/// The socket's name in the pod-resources dir.
pub const SOCKET: &str = "kubelet.sock";
/// Upstream's `DefaultQPS` and `DefaultBurstTokens`.
const QPS: f64 = 100.0;
const BURST: f64 = 10.0;

/// A token bucket.
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * QPS;
        self.tokens = (self.tokens + refill).min(BURST);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The API's server.
pub struct Lister {
    devices: Arc<DeviceManager>,
    pods: StatusView,
    bucket: Mutex<Bucket>,
}

impl Lister {
    /// Serves the API in `dir` until `shutdown`.
    pub async fn run(
        dir: std::path::PathBuf,
        devices: Arc<DeviceManager>,
        pods: StatusView,
        shutdown: CancellationToken,
    ) {
        let path = dir.join(SOCKET);
        let socket = match super::grpc::Socket::bind(&path) {
            Ok(s) => s,
            Err(e) => {
                warn!(socket = %path.display(), "no pod resources API: {e}");
                return;
            }
        };
        info!(socket = %path.display(), "pod resources API serving");
        let lister = Lister::new(devices, pods);
        super::grpc::serve(socket, PodResourcesListerServer::new(lister), shutdown).await;
    }

    fn new(devices: Arc<DeviceManager>, pods: StatusView) -> Self {
        let bucket = Bucket {
            tokens: BURST,
            last: Instant::now(),
        };
        Lister {
            devices,
            pods,
            bucket: Mutex::new(bucket),
        }
    }

    fn admit(&self) -> Result<(), Status> {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        if b.take(Instant::now()) {
            Ok(())
        } else {
            Err(Status::resource_exhausted("rejected by rate limit"))
        }
    }

    /// The pods that run or will: not ended.
    fn active(&self) -> Vec<Arc<Pod>> {
        let pods = self.pods.pods().into_iter();
        let ended = |p: &str| matches!(p, "Succeeded" | "Failed");
        pods.filter(|(_, e)| !e.status.phase.as_deref().is_some_and(ended))
            .map(|(_, e)| e.pod)
            .collect()
    }

    /// `pod`'s containers with their devices, from `grants` (every pod's,
    /// read once per call).
    fn resources(&self, pod: &Pod, grants: &BTreeMap<String, PodGrants>) -> api::PodResources {
        let uid = crate::pods::util::pod_uid(pod);
        let grants = grants.get(&uid);
        // As upstream: sidecars, then the app containers.
        let spec = pod.spec.as_ref();
        let inits = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default();
        let sidecars = inits.iter().filter(|c| crate::pods::util::is_sidecar(c));
        let apps = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        let containers = sidecars
            .chain(apps)
            .map(|c| api::ContainerResources {
                name: c.name.clone(),
                devices: grants
                    .and_then(|g| g.get(&c.name))
                    .into_iter()
                    .flatten()
                    .flat_map(|(resource, g)| devices(resource, &g.ids))
                    .collect(),
                ..Default::default()
            })
            .collect();
        let (namespace, name) = crate::pods::util::namespace_and_name(pod);
        api::PodResources {
            name,
            namespace,
            containers,
            ..Default::default()
        }
    }
}

/// One entry per device, as upstream's (one per device and NUMA node;
/// kinglet's devices have no topology).
fn devices(resource: &str, ids: &[String]) -> Vec<api::ContainerDevices> {
    ids.iter()
        .map(|id| api::ContainerDevices {
            resource_name: resource.to_string(),
            device_ids: vec![id.clone()],
            topology: None,
        })
        .collect()
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<api::ListPodResourcesRequest>,
    ) -> Result<Response<api::ListPodResourcesResponse>, Status> {
        self.admit()?;
        let grants = self.devices.grants();
        let pod_resources = self
            .active()
            .iter()
            .map(|p| self.resources(p, &grants))
            .collect();
        Ok(Response::new(api::ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<api::AllocatableResourcesRequest>,
    ) -> Result<Response<api::AllocatableResourcesResponse>, Status> {
        self.admit()?;
        let healthy = self.devices.healthy();
        let devices = healthy
            .iter()
            .flat_map(|(resource, ids)| devices(resource, &ids.iter().cloned().collect::<Vec<_>>()))
            .collect();
        Ok(Response::new(api::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        req: Request<api::GetPodResourcesRequest>,
    ) -> Result<Response<api::GetPodResourcesResponse>, Status> {
        self.admit()?;
        let r = req.into_inner();
        let found = self.active().into_iter().find(|p| {
            let (ns, name) = crate::pods::util::namespace_and_name(p);
            ns == r.pod_namespace && name == r.pod_name
        });
        let Some(pod) = found else {
            let why = format!(
                "pod {} in namespace {} not found",
                r.pod_name, r.pod_namespace
            );
            return Err(Status::unknown(why));
        };
        Ok(Response::new(api::GetPodResourcesResponse {
            pod_resources: Some(self.resources(&pod, &self.devices.grants())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_of_ten_then_a_hundred_a_second() {
        let t0 = Instant::now();
        let mut b = Bucket {
            tokens: BURST,
            last: t0,
        };
        assert!((0..10).all(|_| b.take(t0)));
        assert!(!b.take(t0));
        assert!(b.take(t0 + std::time::Duration::from_millis(10)));
        assert!(!b.take(t0 + std::time::Duration::from_millis(10)));
    }
}
