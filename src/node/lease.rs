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

#[cfg(test)]
mod tests {
    //! The lease loop against an in-process fake API server, in paused
    //! time: the renewal period, the owner reference once the node is
    //! registered, the back-off while the API fails and the way back.

    use std::sync::{Arc, Mutex};

    use kube::client::Body;
    use serde_json::{Value, json};
    use tokio::time::Instant;

    use super::*;

    /// What the fake API server saw: method, path, when, and the body.
    type Seen = Vec<(String, String, Instant, Value)>;

    #[derive(Default)]
    struct FakeApi {
        seen: Seen,
        /// Every call answers 500 while set.
        failing: bool,
        lease: Option<Value>,
    }

    fn status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason})
    }

    fn client(api: Arc<Mutex<FakeApi>>) -> Client {
        let svc = tower::service_fn(move |req: http::Request<Body>| {
            let api = api.clone();
            async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                let body = req.into_body().collect_bytes().await?;
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let mut api = api.lock().unwrap();
                api.seen
                    .push((method.clone(), path, Instant::now(), body.clone()));
                let (code, answer) = match method.as_str() {
                    _ if api.failing => (500, status(500, "InternalError")),
                    "GET" => match &api.lease {
                        Some(l) => (200, l.clone()),
                        None => (404, status(404, "NotFound")),
                    },
                    _ => {
                        api.lease = Some(body.clone());
                        (if method == "POST" { 201 } else { 200 }, body)
                    }
                };
                let response = http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap();
                Ok::<_, kube::Error>(response)
            }
        });
        Client::new(svc, "default")
    }

    /// Lets paused time run in small steps until `done` holds of what the
    /// API saw (a blocking write of the offline file may take real time,
    /// during which tokio moves the paused clock on).
    async fn until(api: &Arc<Mutex<FakeApi>>, what: &str, done: impl Fn(&Seen) -> bool) {
        let start = Instant::now();
        while !done(&api.lock().unwrap().seen) {
            assert!(start.elapsed() < Duration::from_secs(120), "never: {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Makes every call fail (or not) from now; returns how many came before.
    fn set_failing(api: &Arc<Mutex<FakeApi>>, failing: bool) -> usize {
        let mut a = api.lock().unwrap();
        a.failing = failing;
        a.seen.len()
    }

    fn methods(seen: &[(String, String, Instant, Value)]) -> Vec<&str> {
        seen.iter().map(|(m, ..)| m.as_str()).collect()
    }

    /// A failed renewal, then reads of the lease from 200 ms apart,
    /// doubling (up to +50% jitter) to at most 7 s.
    fn retries_back_off(tries: &[(String, String, Instant, Value)]) {
        assert_eq!(methods(&tries[..1]), ["PUT"]);
        assert!(tries[1..].iter().all(|(m, ..)| m == "GET"));
        // The first wait may include the offline file's blocking write;
        // the rest are the back-off's alone.
        for (i, pair) in tries.windows(2).enumerate().skip(1) {
            let gap = pair[1].2 - pair[0].2;
            let base = Duration::from_millis(200 * (1 << i)).min(Duration::from_secs(7));
            let most = base.mul_f64(1.5).min(Duration::from_secs(7));
            assert!(
                gap >= base && gap <= most,
                "wait {i}: {gap:?}, not in {base:?}..{most:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_quarter_backs_off_while_failing_and_comes_back() {
        let api = Arc::new(Mutex::new(FakeApi::default()));
        let (uid_tx, uid_rx) = watch::channel(None);
        let dir = tempfile::tempdir().unwrap();
        let link = crate::health::ApiLink::new(dir.path().join("offline-since"));
        let shutdown = CancellationToken::new();
        let start = Instant::now();
        let task = tokio::spawn(run(
            client(api.clone()),
            "n1".into(),
            40,
            Duration::from_secs(10),
            uid_rx,
            link.clone(),
            shutdown.clone(),
        ));

        // Created at once (no lease yet), then replaced every 10 s.
        until(&api, "three renewals", |s| s.len() >= 5).await;
        {
            let a = api.lock().unwrap();
            assert_eq!(methods(&a.seen), ["GET", "POST", "PUT", "PUT", "PUT"]);
            assert_eq!(
                a.seen[0].1,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
            );
            for (i, at) in [0u64, 0, 10, 20, 30].iter().enumerate() {
                assert_eq!(a.seen[i].2 - start, Duration::from_secs(*at), "call {i}");
            }
            let spec = &a.seen[4].3["spec"];
            assert_eq!(spec["holderIdentity"], "n1");
            assert_eq!(spec["leaseDurationSeconds"], 40);
            assert!(a.seen[4].3["metadata"].get("ownerReferences").is_none());
        }

        // The node registers: renewed at once with its owner reference.
        uid_tx.send(Some("uid-1".into())).unwrap();
        until(&api, "the owner reference", |s| s.len() >= 6).await;
        {
            let a = api.lock().unwrap();
            let (m, _, at, body) = &a.seen[5];
            assert_eq!(m, "PUT");
            assert!(*at - start < Duration::from_secs(40), "{:?}", *at - start);
            assert_eq!(
                body["metadata"]["ownerReferences"],
                json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}])
            );
        }

        // The API fails: retries from 200 ms, doubling (up to +50%
        // jitter), capped at 7 s; each retry reads the lease anew.
        let failed_from = set_failing(&api, true);
        until(&api, "eight failed attempts", |s| {
            s.len() >= failed_from + 8
        })
        .await;
        assert!(link.offline_since().is_some(), "not offline while failing");
        retries_back_off(&api.lock().unwrap().seen[failed_from..failed_from + 8]);

        // Back: the next try reads the lease, replaces it, and the link is
        // online again; then the period is 10 s again.
        let back_from = set_failing(&api, false);
        until(&api, "a renewal after the outage", |s| {
            s.len() >= back_from + 3
        })
        .await;
        assert_eq!(link.offline_since(), None, "still offline once renewed");
        {
            let a = api.lock().unwrap();
            assert_eq!(
                methods(&a.seen[back_from..back_from + 3]),
                ["GET", "PUT", "PUT"]
            );
            let gap = a.seen[back_from + 2].2 - a.seen[back_from + 1].2;
            assert!(gap >= Duration::from_secs(10), "{gap:?}");
        }

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("the loop ends at shutdown")
            .unwrap();
    }
}
