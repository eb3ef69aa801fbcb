//! The API side of the status manager: writes pod statuses, creates
//! mirror pods for static pods, publishes pod events and deletes
//! terminated pods, as upstream's `status_manager` and `mirror_client` do.
//!
//! It holds at most one pending status and one pending deletion per pod
//! UID (newer replaces older), so a pod that changes often or an API
//! server that is down never grows a queue; failures are retried every
//! 2 s until they land. Events go through a bounded queue and are dropped,
//! with a debug line, when it is full (upstream's recorder drops too); each
//! is tried 12 times 10 s apart while the API server is unreachable, as
//! upstream's recorder, so a short outage loses none.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::pods::util::{is_static, pod_name};

const MIRROR: &str = "kubernetes.io/config.mirror";
/// Events waiting to be published; past this they are dropped.
const EVENT_QUEUE: usize = 1024;

/// The pod's namespace, name, and an `Api` for that namespace.
fn pod_api(client: &Client, pod: &Pod) -> (Api<Pod>, String, String) {
    let (ns, name) = crate::pods::util::namespace_and_name(pod);
    (Api::namespaced(client.clone(), &ns), ns, name)
}

pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR))
}

struct PodEvent {
    pod: Box<Pod>,
    type_: &'static str,
    reason: String,
    message: String,
}

/// What waits to be written, newest per UID.
#[derive(Default)]
struct Outbox {
    statuses: HashMap<String, (Pod, PodStatus)>,
    deletes: HashMap<String, Pod>,
}

/// The handle the status manager writes through.
pub struct ApiWriter {
    outbox: Arc<Mutex<Outbox>>,
    wake: Arc<Notify>,
    events: mpsc::Sender<PodEvent>,
}

impl ApiWriter {
    /// Starts the writer task.
    pub fn start(
        client: Client,
        node_name: String,
        shutdown: CancellationToken,
    ) -> (ApiWriter, tokio::task::JoinHandle<()>) {
        let outbox = Arc::new(Mutex::new(Outbox::default()));
        let wake = Arc::new(Notify::new());
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let task = Task {
            client,
            node_name,
            outbox: outbox.clone(),
            wake: wake.clone(),
            mirrored: HashSet::new(),
            failing: HashMap::new(),
        };
        let handle = tokio::spawn(task.run(rx, shutdown));
        let w = ApiWriter {
            outbox,
            wake,
            events: tx,
        };
        (w, handle)
    }

    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn status(&self, pod: &Pod, status: &PodStatus) {
        if let Some(uid) = pod.metadata.uid.clone() {
            self.outbox()
                .statuses
                .insert(uid, (pod.clone(), status.clone()));
            self.wake.notify_one();
        }
    }

    pub fn event(&self, pod: &Pod, type_: &'static str, reason: &str, message: &str) {
        let ev = PodEvent {
            pod: Box::new(pod.clone()),
            type_,
            reason: reason.into(),
            message: message.into(),
        };
        if self.events.try_send(ev).is_err() {
            debug!(pod = %pod_name(pod), reason, "event queue full; event dropped");
        }
    }

    /// The pod is done on this node: delete what the API holds of it.
    pub fn finish(&self, pod: &Pod) {
        if let Some(uid) = pod.metadata.uid.clone() {
            let mut o = self.outbox();
            o.statuses.remove(&uid);
            // A copy of the pod that says it is being deleted is never
            // replaced by an older one that does not (a stale copy, e.g.
            // from a relist after the apiserver came back): the delete
            // would be skipped and the pod left in the API.
            let deleting = pod.metadata.deletion_timestamp.is_some();
            o.deletes
                .entry(uid)
                .and_modify(|p| {
                    if deleting || p.metadata.deletion_timestamp.is_none() {
                        *p = pod.clone();
                    }
                })
                .or_insert_with(|| pod.clone());
            self.wake.notify_one();
        }
    }
}

const STATUS: &str = "status";
const DELETE: &str = "delete";
const DELETE_FAILED: &str = "cannot delete the pod object; will retry";

struct Task {
    client: Client,
    node_name: String,
    outbox: Arc<Mutex<Outbox>>,
    wake: Arc<Notify>,
    /// Static pods whose mirror pod exists, so it is created once.
    mirrored: HashSet<String>,
    /// The last error per pod and kind of write (status, delete), so a
    /// persistent failure is logged once, and a delete failing the way the
    /// status writes failed is still logged.
    failing: HashMap<(String, &'static str), String>,
}

impl Task {
    /// Writes statuses and deletions, and, beside them (an event being
    /// retried never holds a status back), publishes the events.
    async fn run(mut self, events: mpsc::Receiver<PodEvent>, shutdown: CancellationToken) {
        let publisher = Publisher {
            client: self.client.clone(),
            recorder: Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: "kubelet".into(),
                    instance: Some(self.node_name.clone()),
                },
            ),
        };
        let writes = async {
            let mut retry = tokio::time::interval(Duration::from_secs(2));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.wake.notified() => {}
                    _ = retry.tick() => {}
                }
                self.flush().await;
            }
        };
        tokio::join!(publisher.run(events, shutdown.clone()), writes);
    }

    fn take(&self) -> Outbox {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Writes what waits; what fails goes back unless something newer
    /// arrived meanwhile.
    async fn flush(&mut self) {
        let pending = self.take();
        let mut failed = Outbox::default();
        for (uid, (pod, status)) in pending.statuses {
            let r = bounded(write_status(
                &self.client,
                &self.node_name,
                &pod,
                &status,
                &mut self.mirrored,
            ))
            .await;
            if let Err(e) = r {
                self.failed(&uid, &pod, "cannot write the pod status; will retry", e);
                failed.statuses.insert(uid, (pod, status));
            } else {
                self.failing.remove(&(uid, STATUS));
            }
        }
        for (uid, pod) in pending.deletes {
            self.mirrored.remove(&uid);
            if let Err(e) = bounded(finish(&self.client, &pod)).await {
                self.failed(&uid, &pod, DELETE_FAILED, e);
                failed.deletes.insert(uid, pod);
            } else {
                self.failing.remove(&(uid.clone(), DELETE));
                self.failing.remove(&(uid, STATUS));
            }
        }
        let mut o = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
        for (uid, v) in failed.statuses {
            if !o.deletes.contains_key(&uid) {
                o.statuses.entry(uid).or_insert(v);
            }
        }
        for (uid, v) in failed.deletes {
            // Keep the copy that says the pod is being deleted (see finish).
            let deleting = v.metadata.deletion_timestamp.is_some();
            o.deletes
                .entry(uid)
                .and_modify(|p| {
                    if deleting && p.metadata.deletion_timestamp.is_none() {
                        *p = v.clone();
                    }
                })
                .or_insert(v);
        }
    }

    fn failed(&mut self, uid: &str, pod: &Pod, what: &'static str, e: kube::Error) {
        let msg = e.to_string();
        let key = (
            uid.to_string(),
            if what == DELETE_FAILED {
                DELETE
            } else {
                STATUS
            },
        );
        if self.failing.get(&key) != Some(&msg) {
            warn!(pod = %pod_name(pod), error = %msg, "{what}");
            self.failing.insert(key, msg);
        }
    }
}

/// Upstream's recorder tries each event this many times
/// (`maxTriesPerEvent`)...
const EVENT_TRIES: u32 = 12;
/// ...this long apart (`defaultSleepDuration`), then drops it; the events
/// behind it wait in the queue meanwhile, and past its bound are dropped.
const EVENT_RETRY: Duration = Duration::from_secs(10);

/// Publishes pod events in order, each tried as upstream's recorder does:
/// while the API server is unreachable an event is kept and tried again
/// for about two minutes, so a short outage loses none.
struct Publisher {
    client: Client,
    recorder: Recorder,
}

impl Publisher {
    async fn run(&self, mut events: mpsc::Receiver<PodEvent>, shutdown: CancellationToken) {
        loop {
            let e = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = events.recv() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            for attempt in 1..=EVENT_TRIES {
                match self.publish(&e).await {
                    Ok(()) => break,
                    Err(Retry::No) => break,
                    Err(Retry::Yes) if attempt < EVENT_TRIES => {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(EVENT_RETRY) => {}
                        }
                    }
                    Err(Retry::Yes) => {
                        debug!(pod = %pod_name(&e.pod), reason = %e.reason, "event dropped after {EVENT_TRIES} tries");
                    }
                }
            }
        }
    }

    async fn publish(&self, e: &PodEvent) -> Result<(), Retry> {
        let reference =
            match tokio::time::timeout(API_CALL_TIMEOUT, reference(&self.client, &e.pod)).await {
                Ok(r) => r?,
                Err(_) => return Err(Retry::Yes),
            };
        let ev = Event {
            type_: if e.type_ == "Warning" {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.clone(),
            note: Some(e.message.clone()),
            action: e.reason.clone(),
            secondary: None,
        };
        bounded(self.recorder.publish(&ev, &reference))
            .await
            .map_err(|err| {
                debug!(error = %err, "could not record a pod event");
                Retry::of(&err)
            })
    }
}

/// Whether a failed event is worth another try: not when the API server
/// refused it (a 4xx other than 429), as upstream's recorder.
#[derive(Debug, PartialEq, Eq)]
enum Retry {
    Yes,
    No,
}

impl Retry {
    fn of(e: &kube::Error) -> Retry {
        match e {
            kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429 => Retry::No,
            _ => Retry::Yes,
        }
    }
}

/// The object an event is about; a static pod's is its mirror pod, whose
/// UID only the API server knows.
async fn reference(client: &Client, pod: &Pod) -> Result<ObjectReference, Retry> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().ok_or(Retry::No)?;
    let uid = if is_static(pod) {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.get_opt(&name)
            .await
            .map_err(|e| Retry::of(&e))?
            .and_then(|p| p.metadata.uid)
    } else {
        pod.metadata.uid.clone()
    };
    Ok(ObjectReference {
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

/// Conditions only the kubelet sets that are there only while something
/// is under way (upstream's status manager drops the kubelet's conditions
/// its new status lacks).
pub const TRANSIENT_CONDITIONS: [&str; 2] = ["PodResizePending", "PodResizeInProgress"];

/// The strategic merge patch that writes `status` onto `pod`.
fn status_patch(pod: &Pod, status: &PodStatus) -> serde_json::Value {
    let mut patch = serde_json::json!({ "status": status });
    // The address lists are merged by `ip` in a strategic merge patch: the
    // new list replaces the old one, or an address the pod no longer has
    // would stay (and two IPv4 addresses are invalid).
    // (The container status lists have no merge key: a patch replaces
    // them whole already.)
    for list in ["podIPs", "hostIPs"] {
        if let Some(serde_json::Value::Array(a)) = patch["status"].get_mut(list) {
            a.insert(0, serde_json::json!({"$patch": "replace"}));
        }
    }
    // Conditions are merged by type (others', such as readiness gates,
    // stay), so a reason and message a condition no longer has are
    // cleared explicitly: `Ready: True` must not keep the reason it had
    // while False.
    if let Some(serde_json::Value::Array(cs)) = patch["status"].get_mut("conditions") {
        for c in cs.iter_mut().filter_map(|c| c.as_object_mut()) {
            for field in ["reason", "message"] {
                c.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        // The resize conditions are the kubelet's and come and go: one the
        // status no longer has is deleted (merging would keep it).
        for type_ in TRANSIENT_CONDITIONS {
            if !cs.iter().any(|c| c["type"] == *type_) {
                cs.push(serde_json::json!({"type": type_, "$patch": "delete"}));
            }
        }
    }
    if !is_static(pod)
        && let Some(uid) = &pod.metadata.uid
    {
        // Never write onto a re-created pod of the same name.
        patch["metadata"] = serde_json::json!({ "uid": uid });
    }
    patch
}

/// Writes a pod's status. `mirrored` remembers the static pods whose
/// mirror pod exists, so it is created once, not on every status change.
async fn write_status(
    client: &Client,
    node_name: &str,
    pod: &Pod,
    status: &PodStatus,
    mirrored: &mut HashSet<String>,
) -> Result<(), kube::Error> {
    let (api, _, name) = pod_api(client, pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if is_static(pod) && !mirrored.contains(&uid) {
        ensure_mirror(client, node_name, pod).await?;
        mirrored.insert(uid.clone());
    }
    let patch = status_patch(pod, status);
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
/// 0, only this UID), a static pod's mirror goes with it. Already gone or
/// replaced (404, 409) counts as done.
/// How long one API call of the writer may take. An apiserver that
/// accepts connections but does not answer (restarting, caches not yet
/// synced) must not hold every other pod's status and deletion back:
/// the call fails and is retried with the rest.
const API_CALL_TIMEOUT: Duration = Duration::from_secs(10);

async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(API_CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {}s", API_CALL_TIMEOUT.as_secs()).into(),
        )),
    }
}

async fn finish(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
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
        info!(pod = %format!("{ns}/{name}"), "pod not being deleted: its API object stays");
        return Ok(());
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {
            info!(pod = %format!("{ns}/{name}"), "pod deleted from the API");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
            info!(pod = %format!("{ns}/{name}"), code = s.code, "pod already gone or replaced in the API");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "message": "m", "reason": "r", "code": code
            }))
            .unwrap(),
        )
    }

    #[test]
    fn an_event_is_retried_unless_the_api_server_refused_it() {
        assert_eq!(Retry::of(&api_error(404)), Retry::No);
        assert_eq!(Retry::of(&api_error(422)), Retry::No);
        assert_eq!(Retry::of(&api_error(429)), Retry::Yes);
        assert_eq!(Retry::of(&api_error(503)), Retry::Yes);
        let unreachable = kube::Error::Service("connection refused".into());
        assert_eq!(Retry::of(&unreachable), Retry::Yes);
    }

    #[test]
    fn the_patch_replaces_addresses_clears_reasons_and_drops_resize_conditions() {
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let status: PodStatus = serde_json::from_value(serde_json::json!({
            "podIPs": [{"ip": "10.0.0.2"}],
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodResizeInProgress", "status": "True"},
            ],
        }))
        .unwrap();
        let p = status_patch(&pod, &status);
        assert_eq!(p["metadata"]["uid"], "u1");
        assert_eq!(p["status"]["podIPs"][0]["$patch"], "replace");
        let cs = p["status"]["conditions"].as_array().unwrap();
        assert_eq!(cs[0]["reason"], serde_json::Value::Null);
        assert!(cs[0].as_object().unwrap().contains_key("reason"));
        let deleted: Vec<&serde_json::Value> =
            cs.iter().filter(|c| c["$patch"] == "delete").collect();
        assert_eq!(deleted.len(), 1);
        assert_eq!(deleted[0]["type"], "PodResizePending");
    }
}
