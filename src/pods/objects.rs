//! ConfigMaps and Secrets a pod's containers read (env `valueFrom`,
//! `envFrom`, image pull secrets), fetched from the API server as the
//! Node authorizer allows for objects the node's pods refer to. Read at
//! each container start (no cache: a changed object reaches the next
//! restart).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Client;
use kube::api::Api;

use super::convert::{self, EnvObjects, ObjectKind, ObjectSource};

/// Fetches the ConfigMaps and Secrets `c`'s environment reads. Without an
/// API server nothing can be found: optional references are skipped by
/// the caller, the others fail as not found.
pub async fn env_objects(
    source: Option<&dyn ObjectSource>,
    pod: &Pod,
    c: &Container,
) -> Result<EnvObjects, String> {
    let mut out = EnvObjects::default();
    let refs = EnvObjects::refs(c);
    if refs.is_empty() {
        return Ok(out);
    }
    let (ns, _) = convert::namespace_and_name(pod);
    for (kind, name) in refs {
        let got = match source {
            Some(src) => src.get(kind, &ns, &name).await?,
            None => None,
        };
        out.0.insert((kind, name), got);
    }
    Ok(out)
}

/// The object source of a node connected to an API server.
#[derive(Clone)]
pub struct ApiObjects(pub Client);

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiObjects")
    }
}

impl ObjectSource for ApiObjects {
    fn get<'a>(
        &'a self,
        kind: ObjectKind,
        namespace: &'a str,
        name: &'a str,
    ) -> kinglet_runtime::BoxFuture<'a, Result<Option<BTreeMap<String, String>>, String>> {
        use k8s_openapi::api::core::v1::{ConfigMap, Secret};
        Box::pin(async move {
            // Upstream's message for an object it could not read.
            let failed = |e: kube::Error| format!("couldn't get {kind:?} {namespace}/{name}: {e}");
            match kind {
                ObjectKind::ConfigMap => Api::<ConfigMap>::namespaced(self.0.clone(), namespace)
                    .get_opt(name)
                    .await
                    .map(|o| o.map(|cm| cm.data.unwrap_or_default()))
                    .map_err(failed),
                ObjectKind::Secret => Api::<Secret>::namespaced(self.0.clone(), namespace)
                    .get_opt(name)
                    .await
                    .map(|o| {
                        o.map(|s| {
                            let mut data: BTreeMap<String, String> = s
                                .data
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                                .collect();
                            data.extend(s.string_data.unwrap_or_default());
                            data
                        })
                    })
                    .map_err(failed),
            }
        })
    }
}
