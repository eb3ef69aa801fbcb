//! The pod lifecycle: pod sources merged into one desired set, one worker
//! per pod UID, the relist that tells workers when their containers change
//! (upstream's PLEG), the status writer, and cleanup of what belongs to pods
//! that are gone.
//!
//! Sources send whole snapshots; nothing is torn down for a source until it
//! has reported once (upstream's `SourcesReady`), so a restart re-adopts
//! running pods instead of killing them.

pub mod admit;
pub mod api;
pub mod convert;
pub mod file;
pub mod logs;
pub mod status;
pub mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kinglet_runtime::{ContainerStatus, Runtime};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use convert::NodeContext;
use worker::{Report, Worker};

/// A full snapshot of one source's pods.
#[derive(Debug)]
pub struct SourceUpdate {
    pub source: &'static str,
    pub pods: Vec<Pod>,
}

/// What `kinglet pods ls` reads: `<root-dir>/pods/<uid>.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub source: String,
    pub status: PodStatus,
}

/// Receives worker reports; events and statuses go on to `sink`
/// (the API status manager, when connected).
pub trait StatusSink: Send + Sync {
    fn status(&self, pod: &Pod, status: &PodStatus);
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str);
    fn gone(&self, pod: &Pod);
}

pub struct PodManager {
    pub runtime: Arc<dyn Runtime>,
    pub node: NodeContext,
    pub status_dir: PathBuf,
    /// Sources that must report before orphans are removed.
    pub sources: Vec<&'static str>,
    pub sink: Option<Arc<dyn StatusSink>>,
    /// What pods are admitted against.
    pub allocatable: admit::Allocatable,
}

struct WorkerHandle {
    spec: watch::Sender<Option<Pod>>,
    containers: watch::Sender<Vec<ContainerStatus>>,
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

impl PodManager {
    pub async fn run(self, mut updates: mpsc::Receiver<SourceUpdate>, shutdown: CancellationToken) {
        let _ = std::fs::create_dir_all(&self.status_dir);
        let (report_tx, mut reports) = mpsc::channel::<Report>(256);
        let mut snapshots: BTreeMap<&'static str, Vec<Pod>> = BTreeMap::new();
        let mut workers: HashMap<String, WorkerHandle> = HashMap::new();
        let mut last_status: HashMap<String, PodStatus> = HashMap::new();
        let mut cleaned = false;
        // Pods refused at admission: never started, never retried.
        let mut rejected: BTreeSet<String> = BTreeSet::new();
        // The relist: once a second, as upstream's generic PLEG.
        let mut relist = tokio::time::interval(Duration::from_secs(1));
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Runtimes that stream container events wake the relist at once.
        let changes = self.runtime.changes();
        let mut by_pod: HashMap<String, Vec<ContainerStatus>> = HashMap::new();
        // Know what already runs before the first snapshot is admitted, so
        // a restart never rejects a running pod.
        for c in self.runtime.list_containers().await.unwrap_or_default() {
            by_pod.entry(c.pod_uid.clone()).or_default().push(c);
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                u = updates.recv() => {
                    let Some(u) = u else { return };
                    snapshots.insert(u.source, u.pods);
                    let desired: BTreeMap<String, Pod> = snapshots
                        .values()
                        .flatten()
                        .filter_map(|p| p.metadata.uid.clone().map(|u| (u, p.clone())))
                        .collect();
                    for (uid, pod) in &desired {
                        match workers.get(uid) {
                            Some(h) => {
                                if h.spec.borrow().as_ref() != Some(pod) {
                                    h.spec.send_replace(Some(pod.clone()));
                                }
                            }
                            None if rejected.contains(uid) => {}
                            None => {
                                // A pod whose containers already run (a restart) is
                                // not admitted again; a new one must fit.
                                if !by_pod.contains_key(uid) {
                                    let others: Vec<&Pod> = workers
                                        .keys()
                                        .filter_map(|u| desired.get(u))
                                        .filter(|p| {
                                            !last_status.get(p.metadata.uid.as_deref().unwrap_or("")).is_some_and(|s| {
                                                matches!(s.phase.as_deref(), Some("Succeeded" | "Failed"))
                                            })
                                        })
                                        .collect();
                                    if let Err(r) = admit::admit(pod, &others, &self.allocatable) {
                                        warn!(pod = %worker::pod_name(pod), reason = %r.reason, "{}", r.message);
                                        rejected.insert(uid.clone());
                                        let st = admit::rejected_status(&r);
                                        self.record_status(uid, pod, &st);
                                        if let Some(sink) = &self.sink {
                                            sink.event(pod, "Warning", &r.reason, &r.message);
                                            sink.status(pod, &st);
                                        }
                                        continue;
                                    }
                                }
                                info!(pod = %worker::pod_name(pod), uid = %uid, "pod added");
                                let (stx, srx) = watch::channel(Some(pod.clone()));
                                let (ctx, crx) = watch::channel(by_pod.get(uid).cloned().unwrap_or_default());
                                let mut w = Worker::new(uid.clone(), self.runtime.clone(), self.node.clone(), report_tx.clone());
                                // A pod adopted after a restart keeps its start time.
                                let prev: Option<PodRecord> = std::fs::read(self.status_dir.join(format!("{uid}.json")))
                                    .ok()
                                    .and_then(|b| serde_json::from_slice(&b).ok());
                                if let Some(t) = prev.and_then(|r| r.status.start_time) {
                                    w.set_start_time(t);
                                }
                                tokio::spawn(w.run(srx, crx, shutdown.clone()));
                                workers.insert(uid.clone(), WorkerHandle { spec: stx, containers: ctx });
                            }
                        }
                    }
                    rejected.retain(|u| {
                        let keep = desired.contains_key(u);
                        if !keep {
                            let _ = std::fs::remove_file(self.status_dir.join(format!("{u}.json")));
                        }
                        keep
                    });
                    for (uid, h) in &workers {
                        if !desired.contains_key(uid) && h.spec.borrow().is_some() {
                            h.spec.send_replace(None);
                        }
                    }
                    if !cleaned && self.sources.iter().all(|s| snapshots.contains_key(s)) {
                        cleaned = true;
                        self.remove_orphans(&desired.keys().cloned().collect()).await;
                    }
                }
                _ = async {
                    tokio::select! {
                        _ = relist.tick() => {}
                        _ = async {
                            match &changes {
                                Some(n) => n.notified().await,
                                None => std::future::pending().await,
                            }
                        } => {}
                    }
                } => {
                    match self.runtime.list_containers().await {
                        Ok(all) => {
                            let mut grouped: HashMap<String, Vec<ContainerStatus>> = HashMap::new();
                            for c in all {
                                grouped.entry(c.pod_uid.clone()).or_default().push(c);
                            }
                            for (uid, h) in &workers {
                                let mine = grouped.get(uid).cloned().unwrap_or_default();
                                if *h.containers.borrow() != mine {
                                    h.containers.send_replace(mine);
                                }
                            }
                            by_pod = grouped;
                        }
                        Err(e) => warn!(error = %e, "relisting containers failed"),
                    }
                }
                r = reports.recv() => {
                    let Some(r) = r else { return };
                    match r {
                        Report::Status { uid, pod, status } => {
                            if last_status.get(&uid).is_some_and(|s| status::same(s, &status)) {
                                continue;
                            }
                            self.record_status(&uid, &pod, &status);
                            if let Some(s) = &self.sink {
                                s.status(&pod, &status);
                            }
                            last_status.insert(uid, *status);
                        }
                        Report::Event { pod, type_, reason, message, .. } => {
                            if let Some(s) = &self.sink {
                                s.event(&pod, type_, &reason, &message);
                            }
                        }
                        Report::Terminated { uid, pod } => {
                            info!(pod = %worker::pod_name(&pod), uid = %uid, "pod removed");
                            workers.remove(&uid);
                            last_status.remove(&uid);
                            let _ = std::fs::remove_file(self.status_dir.join(format!("{uid}.json")));
                            if let Some(s) = &self.sink {
                                s.gone(&pod);
                            }
                            // A pod re-added while it was terminating starts afresh.
                            let again: Option<Pod> = snapshots.values().flatten().find(|p| p.metadata.uid.as_deref() == Some(uid.as_str())).cloned();
                            if let Some(pod) = again {
                                let (stx, srx) = watch::channel(Some(pod));
                                let (ctx, crx) = watch::channel(Vec::new());
                                let w = Worker::new(uid.clone(), self.runtime.clone(), self.node.clone(), report_tx.clone());
                                tokio::spawn(w.run(srx, crx, shutdown.clone()));
                                workers.insert(uid, WorkerHandle { spec: stx, containers: ctx });
                            }
                        }
                    }
                }
            }
        }
    }

    /// Writes the status record `kinglet pods ls` reads.
    fn record_status(&self, uid: &str, pod: &Pod, status: &PodStatus) {
        let rec = PodRecord {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_string(),
            source: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/config.source").cloned())
                .unwrap_or_else(|| "api".into()),
            status: status.clone(),
        };
        if let Ok(data) = serde_json::to_vec(&rec) {
            let _ = write_atomic(&self.status_dir.join(format!("{uid}.json")), &data);
        }
    }

    /// After a restart: containers and sandboxes of pods no source wants
    /// any more are stopped and removed; their status files go too.
    async fn remove_orphans(&self, desired: &BTreeSet<String>) {
        let containers = self.runtime.list_containers().await.unwrap_or_default();
        for c in containers.iter().filter(|c| !desired.contains(&c.pod_uid)) {
            info!(container = %c.name, pod_uid = %c.pod_uid, "removing container of a pod that is gone");
            let _ = self
                .runtime
                .stop_container(&c.id, Duration::from_secs(2))
                .await;
            let _ = self.runtime.remove_container(&c.id).await;
        }
        for s in self.runtime.list_pod_sandboxes().await.unwrap_or_default() {
            if !desired.contains(&s.pod_uid) {
                let _ = self.runtime.remove_pod_sandbox(&s.id).await;
            }
        }
        if let Ok(rd) = std::fs::read_dir(&self.node.volume_root) {
            for e in rd.flatten() {
                if !desired.contains(&*e.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        if let Ok(rd) = std::fs::read_dir(&self.status_dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(uid) = name.strip_suffix(".json")
                    && !name.starts_with("api-")
                    && !desired.contains(uid)
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// `kubectl get pods`-style listing of the pod records under `dir`.
pub fn table(dir: &Path) -> String {
    let mut recs: Vec<PodRecord> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.path().extension().is_some_and(|x| x == "json")
                && !e.file_name().to_string_lossy().starts_with("api-")
        })
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    recs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut rows = vec![[
        "NAMESPACE".to_string(),
        "NAME".into(),
        "READY".into(),
        "STATUS".into(),
        "RESTARTS".into(),
        "AGE".into(),
    ]];
    for r in recs {
        let cs = r.status.container_statuses.clone().unwrap_or_default();
        let ready = cs.iter().filter(|c| c.ready).count();
        let restarts: i32 = cs.iter().map(|c| c.restart_count).sum();
        // kubectl shows a waiting or terminated reason instead of the phase.
        let reason = cs
            .iter()
            .find_map(|c| {
                let st = c.state.as_ref()?;
                st.waiting
                    .as_ref()
                    .and_then(|w| w.reason.clone())
                    .or_else(|| {
                        st.terminated
                            .as_ref()
                            .and_then(|t| t.reason.clone())
                            .filter(|_| r.status.phase.as_deref() != Some("Succeeded"))
                    })
            })
            .unwrap_or_else(|| r.status.phase.clone().unwrap_or_default());
        let status = if r.status.phase.as_deref() == Some("Succeeded") {
            "Completed".to_string()
        } else {
            reason
        };
        let age = r
            .status
            .start_time
            .as_ref()
            .map(|t| {
                let s = jiff::Timestamp::now().duration_since(t.0).as_secs().max(0);
                if s < 120 {
                    format!("{s}s")
                } else if s < 7200 {
                    format!("{}m", s / 60)
                } else {
                    format!("{}h", s / 3600)
                }
            })
            .unwrap_or_default();
        rows.push([
            r.namespace,
            r.name,
            format!("{ready}/{}", cs.len()),
            status,
            restarts.to_string(),
            age,
        ]);
    }
    crate::table::render(&rows)
}
