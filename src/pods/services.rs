//! Service environment variables (upstream's `getServiceEnvVarMap` and
//! `envvars.FromServices`): every container gets `KUBERNETES_SERVICE_HOST`
//! and `_PORT` of the `kubernetes` Service (so in-cluster clients find the
//! API server), and, with `enableServiceLinks` (the default), the
//! `{SVC}_SERVICE_HOST`/`_PORT` and Docker-link variables of each Service
//! of the pod's namespace. The Services come from one reflector of the
//! cluster's Services (the Node authorizer lets a node list and watch
//! them).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use crate::pods::util::ObjectError;

/// The namespace and name of the API server's Service, as upstream's
/// `masterServiceNamespace` and master services.
const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICE: &str = "kubernetes";

/// How long a container start waits for the first list of Services.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// The cluster's Services, as last seen.
pub struct Services {
    store: Store<Service>,
    /// The watch's last attempt failed (the API server cannot be reached):
    /// a first list is not waited for then.
    failing: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Services")
    }
}

impl Services {
    /// Starts following the cluster's Services until `shutdown`.
    pub fn start(client: kube::Client, shutdown: CancellationToken) -> Arc<Self> {
        let (store, writer) = reflector::store();
        let api = kube::Api::<Service>::all(client);
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        let (f, failing) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut stream = stream.boxed();
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    next = stream.next() => match next {
                        None => return,
                        Some(r) => { f.send_replace(r.is_err()); }
                    },
                }
            }
        });
        Arc::new(Services { store, failing })
    }

    /// The service variables of a container of `pod`, in upstream's
    /// order; an error while the Services were never listed, as upstream
    /// refuses to build a container's environment then.
    pub async fn env(&self, pod: &Pod) -> Result<Vec<(String, String)>, ObjectError> {
        let mut failing = self.failing.clone();
        let first_list = async {
            tokio::select! {
                biased;
                _ = self.store.wait_until_ready() => true,
                _ = failing.wait_for(|f| *f) => false,
            }
        };
        let listed = matches!(
            tokio::time::timeout(FIRST_LIST_WAIT, first_list).await,
            Ok(true)
        );
        if !listed {
            return Err(ObjectError::ServicesNotListed);
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let mut chosen: Vec<Arc<Service>> = self
            .store
            .state()
            .into_iter()
            .filter(|s| {
                let (sns, name) = (s.metadata.namespace.as_deref(), s.metadata.name.as_deref());
                let master = sns == Some(MASTER_NAMESPACE) && name == Some(MASTER_SERVICE);
                master || (links && sns == Some(ns))
            })
            .collect();
        chosen.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        chosen.dedup_by(|a, b| a.metadata.name == b.metadata.name);
        Ok(chosen.iter().flat_map(|s| variables(s)).collect())
    }
}

/// `my-svc` → `MY_SVC`.
fn env_name(s: &str) -> String {
    s.to_uppercase().replace('-', "_")
}

/// One Service's variables; none for a headless or ExternalName Service.
pub fn variables(s: &Service) -> Vec<(String, String)> {
    let Some(spec) = &s.spec else {
        return Vec::new();
    };
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let ports = spec.ports.clone().unwrap_or_default();
    if ip.is_empty() || ip == "None" || ports.is_empty() {
        return Vec::new();
    }
    let prefix = env_name(s.metadata.name.as_deref().unwrap_or(""));
    let mut out = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.clone()),
        (format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string()),
    ];
    for p in ports
        .iter()
        .filter(|p| p.name.as_deref().is_some_and(|n| !n.is_empty()))
    {
        let name = env_name(p.name.as_deref().unwrap_or(""));
        out.push((format!("{prefix}_SERVICE_PORT_{name}"), p.port.to_string()));
    }
    let host = |port: i32| {
        if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        }
    };
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let (lower, upper) = (proto.to_lowercase(), proto.to_uppercase());
        let url = format!("{lower}://{}", host(p.port));
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let pp = format!("{prefix}_PORT_{}_{upper}", p.port);
        out.push((pp.clone(), url));
        out.push((format!("{pp}_PROTO"), lower));
        out.push((format!("{pp}_PORT"), p.port.to_string()));
        out.push((format!("{pp}_ADDR"), ip.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_as_upstreams_from_services() {
        let s: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "my-db", "namespace": "ns"},
            "spec": {"clusterIP": "10.0.0.7", "ports": [
                {"name": "sql", "port": 5432},
                {"name": "metrics", "port": 9187, "protocol": "UDP"}
            ]}
        }))
        .unwrap();
        let v = variables(&s);
        let get = |k: &str| v.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("MY_DB_SERVICE_HOST"), Some("10.0.0.7"));
        assert_eq!(get("MY_DB_SERVICE_PORT"), Some("5432"));
        assert_eq!(get("MY_DB_SERVICE_PORT_SQL"), Some("5432"));
        assert_eq!(get("MY_DB_SERVICE_PORT_METRICS"), Some("9187"));
        assert_eq!(get("MY_DB_PORT"), Some("tcp://10.0.0.7:5432"));
        assert_eq!(get("MY_DB_PORT_5432_TCP"), Some("tcp://10.0.0.7:5432"));
        assert_eq!(get("MY_DB_PORT_9187_UDP_PROTO"), Some("udp"));
        assert_eq!(get("MY_DB_PORT_9187_UDP_ADDR"), Some("10.0.0.7"));
        assert_eq!(v.len(), 4 + 1 + 8);
        let headless: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
        }))
        .unwrap();
        assert!(variables(&headless).is_empty());
    }
}
