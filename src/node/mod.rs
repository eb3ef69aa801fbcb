//! The node agent: registers this machine as a Node, keeps its status current
//! and its Lease renewed, and re-registers if the Node is deleted.
//!
//! One writer per object: the status task alone writes the Node and its
//! status, the lease task alone writes the Lease. A watch on the own Node
//! (no polling) tells the status task when an admin deleted it, and keeps
//! the labels admission reads current and the Node's copy in the local
//! store, from which an offline start takes its labels.

pub mod host;
pub mod lease;
pub mod status;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, ObjectReference, Taint as ApiTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kinglet_runtime::Runtime;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::config::flags::Settings;
use crate::health::Heartbeat;
use crate::store::LocalStore;
use host::HostPaths;
use status::{Readings, StatusBuilder, StatusConfig, change_key};

/// The static part of the Node object kinglet registers.
#[derive(Clone, Debug)]
pub struct NodeTemplate {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub taints: Vec<ApiTaint>,
}

impl NodeTemplate {
    /// Default labels (hostname, os, arch) plus `--node-labels`; taints from
    /// `registerWithTaints`.
    pub fn from_settings(s: &Settings) -> Self {
        let arch = host::go_arch();
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), s.node_name.clone()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), arch.to_string()),
            ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
            ("beta.kubernetes.io/arch".to_string(), arch.to_string()),
        ]);
        labels.extend(s.node_labels.clone());
        let annotations = BTreeMap::from([(
            "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
            "true".to_string(),
        )]);
        let taints = s
            .config
            .register_with_taints
            .iter()
            .map(|t| ApiTaint {
                key: t.key.clone(),
                value: (!t.value.is_empty()).then(|| t.value.clone()),
                effect: t.effect.clone(),
                time_added: None,
            })
            .collect();
        NodeTemplate {
            name: s.node_name.clone(),
            labels,
            annotations,
            taints,
        }
    }

    fn node(&self, status: NodeStatus) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels.clone()),
                annotations: Some(self.annotations.clone()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!self.taints.is_empty()).then(|| self.taints.clone()),
                ..Default::default()
            }),
            status: Some(status),
        }
    }

    /// A merge patch adding the labels and annotations an existing Node lacks
    /// or has different; `None` if it already agrees. Taints are left alone
    /// once registered, as upstream does: admins own them from then on.
    fn reconcile_patch(&self, existing: &Node) -> Option<serde_json::Value> {
        let differs = |want: &BTreeMap<String, String>, have: &Option<BTreeMap<String, String>>| {
            let have = have.clone().unwrap_or_default();
            want.iter()
                .filter(|(k, v)| have.get(*k) != Some(v))
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect::<serde_json::Map<_, _>>()
        };
        let labels = differs(&self.labels, &existing.metadata.labels);
        let annotations = differs(&self.annotations, &existing.metadata.annotations);
        if labels.is_empty() && annotations.is_empty() {
            return None;
        }
        Some(serde_json::json!({"metadata": {"labels": labels, "annotations": annotations}}))
    }
}

/// Everything the agent needs, assembled by `main`.
pub struct NodeAgent {
    pub client: Client,
    pub template: NodeTemplate,
    pub runtime: Arc<dyn Runtime>,
    pub host: HostPaths,
    pub root_dir: PathBuf,
    pub status: StatusConfig,
    pub update_frequency: Duration,
    pub report_frequency: Duration,
    pub lease_duration_seconds: i32,
    pub heartbeat: Heartbeat,
    /// Online or offline since when, as the lease renewals find it.
    pub link: crate::health::ApiLink,
    /// The Node's labels, for admission.
    pub labels: watch::Sender<BTreeMap<String, String>>,
    /// The Node's `NoExecute` taints, for admission.
    pub taints: watch::Sender<Vec<ApiTaint>>,
    /// Where the Node's own object is kept for an offline start.
    pub store: Option<Arc<LocalStore>>,
    /// The device resources, in capacity and allocatable.
    pub devices: Option<Arc<crate::devices::DeviceManager>>,
}

impl NodeAgent {
    /// Runs registration, status, lease and node watch until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let (uid_tx, uid_rx) = watch::channel::<Option<String>>(None);
        let lease = tokio::spawn(lease::run(
            self.client.clone(),
            self.template.name.clone(),
            self.lease_duration_seconds,
            self.heartbeat_timeout(),
            uid_rx,
            self.link.clone(),
            shutdown.clone(),
        ));
        let (node_tx, node_rx) = watch::channel::<Option<Node>>(None);
        let watch = tokio::spawn(watch_own_node(
            self.client.clone(),
            self.template.name.clone(),
            node_tx,
            shutdown.clone(),
        ));
        tokio::spawn(keep_node(
            node_rx.clone(),
            self.labels.clone(),
            self.taints.clone(),
            self.store.clone(),
        ));
        self.status_loop(uid_tx, node_rx, shutdown).await;
        let _ = lease.await;
        let _ = watch.await;
    }

    /// Upstream's heartbeat client timeout: the lesser of the status
    /// update frequency and the lease duration; at least 3 s (a deliberate
    /// difference only below upstream's 10 s default: a 1 s frequency
    /// would give a busy API server 1 s to answer).
    fn heartbeat_timeout(&self) -> Duration {
        let lease = Duration::from_secs(u64::try_from(self.lease_duration_seconds).unwrap_or(40));
        self.update_frequency.min(lease).max(Duration::from_secs(3))
    }

    async fn readings(&self) -> Readings {
        let runtime = self.runtime.status().await;
        let runtime_version = match self.runtime.version().await {
            Ok(v) => v.node_info(),
            Err(_) => String::new(),
        };
        Readings {
            memory: self.host.meminfo(),
            nodefs: host::fs_stats(&self.root_dir).ok(),
            pids: self.host.pids(),
            runtime,
            runtime_version,
            devices: self
                .devices
                .as_ref()
                .map(|d| d.capacity())
                .unwrap_or_default(),
        }
    }

    /// Every `update_frequency`: compute the status, compare it with what the
    /// API server holds (from the watch), and patch only if they differ or the
    /// report interval passed, as upstream's `tryUpdateNodeStatus` does.
    async fn status_loop(
        self,
        uid_tx: watch::Sender<Option<String>>,
        mut observed: watch::Receiver<Option<Node>>,
        shutdown: CancellationToken,
    ) {
        let name = self.template.name.clone();
        let mut devices = self.devices.as_ref().map(|d| d.subscribe());
        let mut st = StatusRounds {
            api: Api::all(self.client.clone()),
            recorder: Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: "kubelet".into(),
                    instance: Some(name.clone()),
                },
            ),
            builder: StatusBuilder::new(self.status.clone()),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(7)),
            name,
            uid_tx,
            registered_uid: None,
            last_sent: None,
            last_conditions: BTreeMap::new(),
            started_event: false,
            seen_ours: false,
        };
        loop {
            // The server's copy of our Node, if the watch has it and it is the
            // object we registered (not a stale one from before a re-create).
            let server = observed
                .borrow_and_update()
                .clone()
                .filter(|n| st.registered_uid.is_some() && n.metadata.uid == st.registered_uid);
            st.seen_ours |= server.is_some();
            if let Some(s) = server.as_ref().and_then(|n| n.status.as_ref()) {
                st.builder.observe(s);
            }
            // Whole seconds: the API stores times at that precision.
            let wall = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
                .unwrap_or_default();
            let readings = self.readings().await;
            let status = st.builder.build(&readings, Instant::now(), Time(wall));
            self.heartbeat.beat();
            let result = self.send(&st, server.as_ref(), &status).await;
            let wait = st.settle(result, &status, self.update_frequency);
            st.publish_events(&status);
            if !st.wait(&mut observed, &mut devices, wait, &shutdown).await {
                return;
            }
        }
    }

    /// Registers the Node, or patches its status when it changed or the
    /// report is due; `Ok(Some(uid))` after a registration.
    async fn send(
        &self,
        st: &StatusRounds,
        server: Option<&Node>,
        status: &NodeStatus,
    ) -> Result<Option<String>, kube::Error> {
        let Some(_) = &st.registered_uid else {
            // Registration uses the plain client, as upstream's.
            return register(&st.api, &self.template, status.clone())
                .await
                .map(Some);
        };
        let held = server
            .and_then(|n| n.status.clone())
            .or_else(|| st.last_sent.as_ref().map(|(s, _)| s.clone()));
        let changed = held.is_none_or(|h| change_key(&h) != change_key(status));
        let report_due = st
            .last_sent
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= self.report_frequency);
        if !(changed || report_due) {
            return Ok(None);
        }
        lease::within(
            self.heartbeat_timeout(),
            patch_status(&st.api, &st.name, status),
        )
        .await
        .map(|_| None)
    }
}

/// What the status loop carries from one round to the next.
struct StatusRounds {
    api: Api<Node>,
    recorder: Recorder,
    builder: StatusBuilder,
    backoff: Backoff,
    name: String,
    uid_tx: watch::Sender<Option<String>>,
    /// The UID of the Node this agent registered (none: to register).
    registered_uid: Option<String>,
    /// The status last sent and when.
    last_sent: Option<(NodeStatus, Instant)>,
    /// Each condition's status as last evented.
    last_conditions: BTreeMap<String, String>,
    started_event: bool,
    /// The watch has shown the registered Node (so its absence later is a
    /// deletion, not a watch that started before registration).
    seen_ours: bool,
}

impl StatusRounds {
    /// Takes a round's result in; returns how long to wait for the next.
    fn settle(
        &mut self,
        result: Result<Option<String>, kube::Error>,
        status: &NodeStatus,
        update_frequency: Duration,
    ) -> Duration {
        match result {
            Ok(Some(uid)) => {
                info!(node = %self.name, %uid, "node registered");
                self.registered_uid = Some(uid.clone());
                self.uid_tx.send_replace(Some(uid));
                self.last_sent = Some((status.clone(), Instant::now()));
                self.backoff.reset();
            }
            Ok(None) => {
                if self
                    .last_sent
                    .as_ref()
                    .is_none_or(|(s, _)| change_key(s) != change_key(status))
                {
                    self.last_sent = Some((status.clone(), Instant::now()));
                }
                self.backoff.reset();
            }
            Err(e) if is_not_found(&e) => {
                warn!(node = %self.name, "node object is gone; registering again");
                self.forget_registration();
                return Duration::ZERO;
            }
            Err(e) => {
                warn!(node = %self.name, error = %e, "unable to update node status, will retry");
                return self.backoff.next_delay().min(update_frequency);
            }
        }
        update_frequency
    }

    fn forget_registration(&mut self) {
        self.registered_uid = None;
        self.uid_tx.send_replace(None);
        self.last_sent = None;
        self.last_conditions.clear();
    }

    /// `Starting` once registered, then an event for each condition that
    /// changed (upstream's `NodeReady`, `NodeHasSufficientMemory`, ...).
    fn publish_events(&mut self, status: &NodeStatus) {
        let Some(uid) = &self.registered_uid else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.name.clone()),
            uid: Some(uid.clone()),
            ..Default::default()
        };
        if !self.started_event {
            self.started_event = true;
            let msg = "Starting kinglet.".into();
            publish(
                &self.recorder,
                &reference,
                EventType::Normal,
                "Starting",
                msg,
            );
        }
        for c in status.conditions.iter().flatten() {
            if self.last_conditions.get(&c.type_) != Some(&c.status) {
                self.last_conditions
                    .insert(c.type_.clone(), c.status.clone());
                let (reason, kind) = node_event(&c.type_, &c.status);
                let msg = format!("Node {} status is now: {reason}", self.name);
                publish(&self.recorder, &reference, kind, reason, msg);
            }
        }
    }

    /// Waits `wait`, or less when the Node is deleted (then registration
    /// starts again); `false` on shutdown.
    async fn wait(
        &mut self,
        observed: &mut watch::Receiver<Option<Node>>,
        devices: &mut Option<watch::Receiver<u64>>,
        wait: Duration,
        shutdown: &CancellationToken,
    ) -> bool {
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = &mut deadline => return true,
                // A device resource came, went or changed health: the
                // scheduler should know now, not at the next round.
                Ok(()) = async {
                    match devices.as_mut() {
                        Some(d) => d.changed().await,
                        None => std::future::pending().await,
                    }
                } => return true,
                r = observed.changed() => {
                    if r.is_err() {
                        return false;
                    }
                    // Only a deletion cuts the wait short; other changes
                    // are picked up at the next round.
                    let current = observed.borrow().as_ref().map(|n| n.metadata.uid.clone());
                    if let Some(uid) = current
                        && uid.is_some()
                        && uid == self.registered_uid
                    {
                        self.seen_ours = true;
                    }
                    // A watch that started before registration reports
                    // the node missing; only a node seen to exist and
                    // then gone was deleted.
                    let deleted = observed.borrow().is_none() && self.seen_ours;
                    if deleted && self.registered_uid.is_some() {
                        self.seen_ours = false;
                        warn!(node = %self.name, "node object was deleted; registering again");
                        self.forget_registration();
                        return true;
                    }
                }
            }
        }
    }
}

/// The upstream event reason for a node condition's state.
fn node_event(type_: &str, status: &str) -> (&'static str, EventType) {
    let t = status == "True";
    match (type_, t) {
        ("Ready", true) => ("NodeReady", EventType::Normal),
        ("Ready", false) => ("NodeNotReady", EventType::Normal),
        ("MemoryPressure", false) => ("NodeHasSufficientMemory", EventType::Normal),
        ("MemoryPressure", true) => ("NodeHasInsufficientMemory", EventType::Normal),
        ("DiskPressure", false) => ("NodeHasNoDiskPressure", EventType::Normal),
        ("DiskPressure", true) => ("NodeHasDiskPressure", EventType::Normal),
        ("PIDPressure", false) => ("NodeHasSufficientPID", EventType::Normal),
        ("PIDPressure", true) => ("NodeHasInsufficientPID", EventType::Normal),
        _ => ("NodeConditionChanged", EventType::Normal),
    }
}

/// Publishes an event without holding up the caller; a lost event is logged.
fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let recorder = recorder.clone();
    let reference = reference.clone();
    let ev = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&ev, &reference).await {
            debug!(error = %e, reason = %ev.reason, "could not record event");
        }
    });
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Creates the Node, or adopts one left by an earlier run (reconciling its
/// labels) as upstream's `registerWithAPIServer` does. Returns the Node UID.
async fn register(
    api: &Api<Node>,
    template: &NodeTemplate,
    status: NodeStatus,
) -> Result<String, kube::Error> {
    let name = &template.name;
    match api
        .create(&PostParams::default(), &template.node(status.clone()))
        .await
    {
        Ok(n) => return Ok(n.metadata.uid.unwrap_or_default()),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let existing = api.get(name).await?;
    let mut uid = existing.metadata.uid.clone().unwrap_or_default();
    if let Some(patch) = template.reconcile_patch(&existing) {
        info!(node = %name, "reconciling labels of the existing node");
        let n = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        uid = n.metadata.uid.unwrap_or(uid);
    }
    patch_status(api, name, &status).await?;
    Ok(uid)
}

async fn patch_status(api: &Api<Node>, name: &str, status: &NodeStatus) -> Result<(), kube::Error> {
    // A merge patch replaces the lists kinglet owns (conditions, addresses)
    // and leaves fields other writers own (volumesAttached) untouched.
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The local store's name for the node's own object.
const STORED_NODE: &str = "node";

/// The labels of the Node kept in the store (what the API server held
/// last), if any: an offline start admits pods against them.
pub fn stored_labels(store: &LocalStore) -> Option<BTreeMap<String, String>> {
    let data = match store.get_node(STORED_NODE) {
        Ok(d) => d?,
        Err(e) => {
            warn!(error = %e, "the stored Node cannot be read; its labels are the template's");
            return None;
        }
    };
    match serde_json::from_slice::<Node>(&data) {
        Ok(n) => Some(n.metadata.labels.unwrap_or_default()),
        Err(e) => {
            warn!(error = %e, "the stored Node is not a Node; its labels are the template's");
            None
        }
    }
}

/// Keeps `labels`, `taints` (the `NoExecute` ones) and the store's copy of
/// the Node in step with the API server's Node. The copy is its metadata
/// and spec (no status, no managed fields: what a status update changes is
/// not kept), written when they change, off the async thread. (The stored
/// taints are not read back: an offline start admits only static pods,
/// which taints do not refuse.)
async fn keep_node(
    mut node: watch::Receiver<Option<Node>>,
    labels: watch::Sender<BTreeMap<String, String>>,
    taints: watch::Sender<Vec<ApiTaint>>,
    store: Option<Arc<LocalStore>>,
) {
    let mut kept: Option<Node> = None;
    while node.changed().await.is_ok() {
        let Some(mut n) = node.borrow_and_update().clone() else {
            continue;
        };
        n.status = None;
        n.metadata.managed_fields = None;
        n.metadata.resource_version = None;
        let new = n.metadata.labels.clone().unwrap_or_default();
        labels.send_if_modified(|l| {
            let changed = *l != new;
            if changed {
                info!(labels = ?new, "the node's labels changed");
                *l = new;
            }
            changed
        });
        let no_execute: Vec<ApiTaint> = (n.spec.iter().flat_map(|s| s.taints.iter().flatten()))
            .filter(|t| t.effect == "NoExecute")
            .cloned()
            .collect();
        taints.send_if_modified(|t| {
            let changed = *t != no_execute;
            *t = no_execute;
            changed
        });
        let (Some(st), false) = (&store, kept.as_ref() == Some(&n)) else {
            continue;
        };
        let (st, data) = (st.clone(), serde_json::to_vec(&n).unwrap_or_default());
        match tokio::task::spawn_blocking(move || st.put_node(STORED_NODE, &data)).await {
            Ok(Ok(())) => kept = Some(n),
            Ok(Err(e)) => warn!(error = %e, "the Node could not be kept in the local store"),
            Err(_) => warn!("the Node could not be kept in the local store: its task failed"),
        }
    }
}

/// Watches the own Node and publishes the latest copy the API server holds:
/// `None` once it is deleted or missing from a fresh list.
async fn watch_own_node(
    client: Client,
    name: String,
    latest: watch::Sender<Option<Node>>,
    shutdown: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    let mut listed: Option<Node> = None;
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        match ev {
            None => return,
            Some(Err(e)) => debug!(error = %e, "node watch interrupted"),
            Some(Ok(watcher::Event::Init)) => listed = None,
            Some(Ok(watcher::Event::InitApply(n))) => listed = Some(n),
            Some(Ok(watcher::Event::InitDone)) => {
                latest.send_replace(listed.take());
            }
            Some(Ok(watcher::Event::Apply(n))) => {
                latest.send_replace(Some(n));
            }
            Some(Ok(watcher::Event::Delete(_))) => {
                latest.send_replace(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags::Flags;
    use clap::Parser;

    fn template(args: &[&str]) -> NodeTemplate {
        let mut argv = vec!["kinglet"];
        argv.extend_from_slice(args);
        let s = Flags::try_parse_from(argv)
            .unwrap()
            .settings(|| "pi".into(), &mut |_| {})
            .unwrap();
        NodeTemplate::from_settings(&s)
    }

    #[test]
    fn template_has_default_labels_and_taints() {
        let t = template(&[
            "--node-labels",
            "site=lab",
            "--register-with-taints",
            "edge=yes:NoSchedule",
        ]);
        assert_eq!(t.labels["kubernetes.io/hostname"], "pi");
        assert_eq!(t.labels["kubernetes.io/os"], "linux");
        assert_eq!(t.labels["kubernetes.io/arch"], host::go_arch());
        assert_eq!(t.labels["site"], "lab");
        assert_eq!(t.taints[0].key, "edge");
        assert_eq!(t.taints[0].value.as_deref(), Some("yes"));
        let node = t.node(NodeStatus::default());
        assert_eq!(node.spec.unwrap().taints.unwrap().len(), 1);
    }

    #[test]
    fn reconcile_patch_only_when_labels_differ() {
        let t = template(&["--node-labels", "site=lab"]);
        let mut existing = t.node(NodeStatus::default());
        assert!(t.reconcile_patch(&existing).is_none());
        existing
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("site".into(), "old".into());
        existing
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("admin-added".into(), "x".into());
        let p = t.reconcile_patch(&existing).unwrap();
        assert_eq!(p["metadata"]["labels"], serde_json::json!({"site": "lab"}));
    }

    #[test]
    fn node_events_use_upstream_reasons() {
        assert_eq!(node_event("Ready", "True").0, "NodeReady");
        assert_eq!(node_event("Ready", "False").0, "NodeNotReady");
        assert_eq!(
            node_event("MemoryPressure", "False").0,
            "NodeHasSufficientMemory"
        );
        assert_eq!(node_event("DiskPressure", "True").0, "NodeHasDiskPressure");
        assert_eq!(node_event("PIDPressure", "False").0, "NodeHasSufficientPID");
    }
}
