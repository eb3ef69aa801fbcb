//! The API server side of pods: the source (a watch of the pods bound to
//! this node) and the status manager, the single writer of pod statuses,
//! mirror pods for static pods, pod events and the final deletion of
//! terminated pods, as upstream's `status_manager` and `mirror_client` do.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{SourceUpdate, StatusSink};

const MIRROR: &str = "kubernetes.io/config.mirror";
const SOURCE: &str = "kubernetes.io/config.source";

/// The pod's namespace, name, and an `Api` for that namespace.
fn pod_api(client: &Client, pod: &Pod) -> (Api<Pod>, String, String) {
    let (ns, name) = super::convert::namespace_and_name(pod);
    (Api::namespaced(client.clone(), &ns), ns, name)
}

fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(SOURCE).is_some_and(|s| s != "api"))
}

fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR))
}

/// Sends a snapshot of this node's API pods after the first list and after
/// every change. Mirror pods are the node's own reflection and are skipped.
///
/// Each snapshot is also written to `checkpoint`; at start, before the API
/// server has answered, the last checkpoint is the snapshot, so the pods
/// this node ran come back after a reboot while the control plane is
/// unreachable (a deliberate difference from upstream, which waits).
pub async fn watch(
    client: Client,
    node_name: String,
    checkpoint: std::path::PathBuf,
    tx: mpsc::Sender<SourceUpdate>,
    shutdown: CancellationToken,
) {
    if let Some(pods) = std::fs::read(&checkpoint)
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<Pod>>(&b).ok())
    {
        info!(
            pods = pods.len(),
            "starting the API pods of the last checkpoint until the API server answers"
        );
        let _ = tx
            .send(SourceUpdate {
                source: "api",
                pods,
            })
            .await;
    }
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    let mut listing: BTreeMap<String, Pod> = BTreeMap::new();
    let mut ready = false;
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        let changed = match ev {
            None => return,
            Some(Err(e)) => {
                debug!(error = %e, "pod watch interrupted");
                false
            }
            Some(Ok(watcher::Event::Init)) => {
                listing.clear();
                false
            }
            Some(Ok(watcher::Event::InitApply(p))) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    listing.insert(uid, p);
                }
                false
            }
            Some(Ok(watcher::Event::InitDone)) => {
                pods = std::mem::take(&mut listing);
                ready = true;
                true
            }
            Some(Ok(watcher::Event::Apply(p))) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    pods.insert(uid, p);
                }
                true
            }
            Some(Ok(watcher::Event::Delete(p))) => {
                if let Some(uid) = &p.metadata.uid {
                    pods.remove(uid);
                }
                true
            }
        };
        if changed && ready {
            let snapshot: Vec<Pod> = pods.values().filter(|p| !is_mirror(p)).cloned().collect();
            if let Ok(data) = serde_json::to_vec(&snapshot) {
                let tmp = checkpoint.with_extension("tmp");
                if std::fs::write(&tmp, data).is_ok() {
                    let _ = std::fs::rename(&tmp, &checkpoint);
                }
            }
            if tx
                .send(SourceUpdate {
                    source: "api",
                    pods: snapshot,
                })
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

#[derive(Debug)]
enum Msg {
    Status(Box<Pod>, Box<PodStatus>),
    Event(Box<Pod>, &'static str, String, String),
    Gone(Box<Pod>),
}

/// Hands worker reports to the status manager task.
pub struct ApiSink {
    tx: mpsc::UnboundedSender<Msg>,
}

impl StatusSink for ApiSink {
    fn status(&self, pod: &Pod, status: &PodStatus) {
        let _ = self
            .tx
            .send(Msg::Status(Box::new(pod.clone()), Box::new(status.clone())));
    }
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        let t = if type_ == "Warning" {
            "Warning"
        } else {
            "Normal"
        };
        let _ = self.tx.send(Msg::Event(
            Box::new(pod.clone()),
            t,
            reason.into(),
            message.into(),
        ));
    }
    fn gone(&self, pod: &Pod) {
        let _ = self.tx.send(Msg::Gone(Box::new(pod.clone())));
    }
}

/// Starts the status manager; returns the sink the pod manager reports to.
pub fn status_manager(
    client: Client,
    node_name: String,
    shutdown: CancellationToken,
) -> (ApiSink, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(run(client, node_name, rx, shutdown));
    (ApiSink { tx }, task)
}

struct Pending {
    pod: Pod,
    status: PodStatus,
}

async fn run(
    client: Client,
    node_name: String,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    shutdown: CancellationToken,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kubelet".into(),
            instance: Some(node_name.clone()),
        },
    );
    // Latest status not yet written, per pod UID; retried until it lands.
    let mut dirty: HashMap<String, Pending> = HashMap::new();
    // The last error per pod, so a persistent failure is logged once.
    let mut failing: HashMap<String, String> = HashMap::new();
    let mut mirrored = std::collections::HashSet::new();
    let mut retry = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            m = rx.recv() => match m {
                None => return,
                Some(Msg::Status(pod, status)) => {
                    if let Some(uid) = pod.metadata.uid.clone() {
                        dirty.insert(uid, Pending { pod: *pod, status: *status });
                    }
                }
                Some(Msg::Event(pod, t, reason, message)) => {
                    if let Some(reference) = reference(&client, &pod).await {
                        let ev = Event {
                            type_: if t == "Warning" { EventType::Warning } else { EventType::Normal },
                            reason: reason.clone(),
                            note: Some(message),
                            action: reason,
                            secondary: None,
                        };
                        if let Err(e) = recorder.publish(&ev, &reference).await {
                            debug!(error = %e, "could not record a pod event");
                        }
                    }
                }
                Some(Msg::Gone(pod)) => {
                    if let Some(uid) = &pod.metadata.uid {
                        dirty.remove(uid);
                        mirrored.remove(uid);
                    }
                    finish(&client, &pod).await;
                }
            },
            _ = retry.tick() => {}
        }
        let uids: Vec<String> = dirty.keys().cloned().collect();
        for uid in uids {
            let Some(p) = dirty.get(&uid) else { continue };
            match write_status(&client, &node_name, &p.pod, &p.status, &mut mirrored).await {
                Ok(()) => {
                    dirty.remove(&uid);
                    failing.remove(&uid);
                }
                Err(e) => {
                    let msg = e.to_string();
                    if failing.get(&uid) != Some(&msg) {
                        warn!(pod = %super::worker::pod_name(&p.pod), error = %msg, "cannot write the pod status; will retry");
                        failing.insert(uid.clone(), msg);
                    }
                }
            }
        }
    }
}

/// The object events and statuses are about: the API pod, or the mirror
/// pod of a static pod.
async fn reference(client: &Client, pod: &Pod) -> Option<ObjectReference> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone()?;
    let uid = if is_static(pod) {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.get_opt(&name)
            .await
            .ok()
            .flatten()
            .and_then(|p| p.metadata.uid)
    } else {
        pod.metadata.uid.clone()
    };
    Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name),
        namespace: Some(ns),
        uid,
        ..Default::default()
    })
}

/// Creates the mirror pod of a static pod, owned by the Node as
/// NodeRestriction requires.
async fn ensure_mirror(client: &Client, node_name: &str, pod: &Pod) -> Result<(), kube::Error> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = pod.metadata.name.clone().unwrap_or_default();
    // No GET first: the Node authorizer lets a node read only pods bound to
    // it, and a mirror pod that does not exist yet is not.
    let node: Node = Api::all(client.clone()).get(node_name).await?;
    let mut ann = pod.metadata.annotations.clone().unwrap_or_default();
    let hash = ann
        .get("kubernetes.io/config.hash")
        .cloned()
        .unwrap_or_default();
    ann.insert(MIRROR.into(), hash);
    let mirror = Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns),
            labels: pod.metadata.labels.clone(),
            annotations: Some(ann),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.into(),
                uid: node.metadata.uid.unwrap_or_default(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: pod.spec.clone(),
        status: None,
    };
    match api.create(&PostParams::default(), &mirror).await {
        Ok(_) => {
            info!(pod = %name, "created mirror pod");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes a pod's status. `mirrored` remembers the static pods whose
/// mirror pod exists, so it is created once, not on every status change.
async fn write_status(
    client: &Client,
    node_name: &str,
    pod: &Pod,
    status: &PodStatus,
    mirrored: &mut std::collections::HashSet<String>,
) -> Result<(), kube::Error> {
    let (api, _, name) = pod_api(client, pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if is_static(pod) && !mirrored.contains(&uid) {
        ensure_mirror(client, node_name, pod).await?;
        mirrored.insert(uid.clone());
    }
    let mut patch = serde_json::json!({ "status": status });
    if !is_static(pod)
        && let Some(uid) = &pod.metadata.uid
    {
        // Never write onto a re-created pod of the same name.
        patch["metadata"] = serde_json::json!({ "uid": uid });
    }
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone meanwhile: nothing to report to now; a static pod's mirror
        // that an admin deleted is created again on the next change.
        Err(kube::Error::Api(s)) if s.code == 404 => {
            mirrored.remove(&uid);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// A terminated pod: an API pod being deleted is removed for good (grace
/// 0, only this UID), a static pod's mirror goes with it.
async fn finish(client: &Client, pod: &Pod) {
    let (api, ns, name) = pod_api(client, pod);
    let dp = if is_static(pod) {
        DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        }
    } else if pod.metadata.deletion_timestamp.is_some() {
        DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        }
    } else {
        return;
    };
    match api.delete(&name, &dp).await {
        Ok(_) => info!(pod = %format!("{ns}/{name}"), "pod deleted from the API"),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => {
            warn!(pod = %format!("{ns}/{name}"), error = %e, "could not delete the pod object")
        }
    }
}

/// ConfigMaps and Secrets read from the API server, as the Node authorizer
/// allows for objects the node's pods refer to. Read at each container
/// start (no cache: a changed object reaches the next restart).
#[derive(Clone)]
pub struct ApiObjects(pub Client);

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiObjects")
    }
}

impl super::convert::ObjectSource for ApiObjects {
    fn get<'a>(
        &'a self,
        kind: super::convert::ObjectKind,
        namespace: &'a str,
        name: &'a str,
    ) -> kinglet_runtime::BoxFuture<'a, Result<Option<BTreeMap<String, String>>, String>> {
        use k8s_openapi::api::core::v1::{ConfigMap, Secret};
        Box::pin(async move {
            // Upstream's message for an object it could not read.
            let failed = |e: kube::Error| format!("couldn't get {kind:?} {namespace}/{name}: {e}");
            match kind {
                super::convert::ObjectKind::ConfigMap => {
                    Api::<ConfigMap>::namespaced(self.0.clone(), namespace)
                        .get_opt(name)
                        .await
                        .map(|o| o.map(|cm| cm.data.unwrap_or_default()))
                        .map_err(failed)
                }
                super::convert::ObjectKind::Secret => {
                    Api::<Secret>::namespaced(self.0.clone(), namespace)
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
                        .map_err(failed)
                }
            }
        })
    }
}
