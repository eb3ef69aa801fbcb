//! The node's heartbeat: the Lease `kube-node-lease/<node>`, renewed every
//! quarter of its duration as upstream's lease controller does. This task is
//! the Lease's only writer.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;

pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// Renews the lease until `shutdown`. `node_uid` carries the registered
/// Node's UID (for the owner reference that lets the garbage collector remove
/// the lease with the node); `None` while the node is not registered. A
/// renewal gets `timeout` (upstream's heartbeat client: the lesser of the
/// status update frequency and the lease duration), so a dead route (calls
/// that hang) is found as soon as a refused connection.
pub async fn run(
    client: Client,
    node_name: String,
    duration_seconds: i32,
    timeout: Duration,
    mut node_uid: watch::Receiver<Option<String>>,
    link: crate::health::ApiLink,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let interval = Duration::from_secs(u64::try_from(duration_seconds).unwrap_or(40)) / 4;
    // Upstream retries a failed renewal from 200 ms, doubling, up to 7 s.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
    let mut cached: Option<Lease> = None;
    loop {
        let uid = node_uid.borrow_and_update().clone();
        let renewal = renew(
            &api,
            &node_name,
            duration_seconds,
            uid.as_deref(),
            &mut cached,
        );
        let wait = match within(timeout, renewal).await {
            Ok(()) => {
                if link.reached().await {
                    info!(node = %node_name, "node lease renewed again");
                }
                backoff.reset();
                interval
            }
            Err(e) => {
                warn!(node = %node_name, error = %e, "failed to renew node lease, will retry");
                link.lost().await;
                cached = None;
                backoff.next_delay().min(interval)
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // A (re-)registered node gets its owner reference without waiting.
            r = node_uid.changed() => if r.is_err() { return },
        }
    }
}

/// `call`, or an error once `timeout` has passed without its answer.
pub async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {timeout:?}").into(),
        )),
    }
}

fn owner(node_name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node_name.into(),
        uid: uid.into(),
        ..Default::default()
    }
}

async fn renew(
    api: &Api<Lease>,
    node_name: &str,
    duration_seconds: i32,
    node_uid: Option<&str>,
    cached: &mut Option<Lease>,
) -> Result<(), kube::Error> {
    let now = MicroTime(jiff::Timestamp::now());
    let owners = node_uid.map(|uid| vec![owner(node_name, uid)]);
    let mut lease = match cached.take() {
        Some(l) => l,
        None => match api.get_opt(node_name).await? {
            Some(l) => l,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(node_name.into()),
                        namespace: Some(LEASE_NAMESPACE.into()),
                        owner_references: owners.clone(),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(node_name.into()),
                        lease_duration_seconds: Some(duration_seconds),
                        renew_time: Some(now),
                        ..Default::default()
                    }),
                };
                let created = api.create(&PostParams::default(), &lease).await?;
                debug!(node = %node_name, "created node lease");
                *cached = Some(created);
                return Ok(());
            }
        },
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(node_name.into());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(now);
    if owners.is_some() && lease.metadata.owner_references != owners {
        lease.metadata.owner_references = owners;
    }
    let updated = api
        .replace(node_name, &PostParams::default(), &lease)
        .await?;
    *cached = Some(updated);
    Ok(())
}
