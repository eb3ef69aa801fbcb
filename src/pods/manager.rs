//! The pod manager: the one task that joins the parts. Source snapshots
//! go through the merge ([`Sources`]) to the pod workers' lifecycle
//! ([`PodWorkers`]) after admission; the PLEG's relist wakes the workers
//! whose containers changed; worker reports go to the status manager,
//! which every 10 s also compares the API's copy of each pod's status
//! with the last it wrote;
//! kill requests (eviction, later liveness) go to the workers. Once every
//! source has reported, what belongs to pods that are gone is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kinglet_runtime::Runtime;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::admit;
use super::allocation::{self, Allocations, Outcome};
use super::config::validate;
use super::config::{SourceUpdate, Sources};
use super::pleg::{self, Pleg};
use super::pod_workers::{AfterRemoval, Phase, PodWorkers};
use super::report::{Report, Reporter};
use super::status::manager::StatusManager;
use super::worker::{KillRequest, Worker};
use crate::pods::util::pod_name;
use crate::pods::worker::NodeContext;

/// How others ask for a pod to be stopped: eviction hands this a pod UID
/// and a [`KillRequest`]; it never holds the pod manager.
#[derive(Clone, Debug)]
pub struct PodKiller(mpsc::Sender<(String, KillRequest)>);

impl PodKiller {
    /// A killer whose requests the test reads from the receiver.
    #[cfg(test)]
    pub fn for_test() -> (PodKiller, mpsc::Receiver<(String, KillRequest)>) {
        let (tx, rx) = mpsc::channel(8);
        (PodKiller(tx), rx)
    }

    pub async fn kill(&self, uid: &str, k: KillRequest) {
        let _ = self.0.send((uid.to_string(), k)).await;
    }
}

pub struct PodManager {
    runtime: Arc<dyn Runtime>,
    node: NodeContext,
    sources: Sources,
    status: StatusManager,
    allocatable: admit::Allocatable,
    pleg: Pleg,
    workers: PodWorkers,
    /// Pods refused at admission: never started, never retried; `true`
    /// once their deletion was handed to the status manager.
    rejected: BTreeMap<String, bool>,
    /// What each running pod's containers are allocated (in-place resize).
    allocations: Allocations,
    cleaned: bool,
    reports: mpsc::Sender<Report>,
    kills: mpsc::Receiver<(String, KillRequest)>,
    /// Beaten after each successful relist (for `/healthz`).
    relist_beat: Option<crate::health::Heartbeat>,
    /// Where the pod cgroups are, and the pods this node ran whose pod
    /// cgroups may be left ([`crate::cm::pod_cgroups`]); none: no sweep.
    cgroup_sweep: Option<(std::path::PathBuf, Arc<std::sync::Mutex<BTreeSet<String>>>)>,
}

/// The channels the manager's loop reads.
pub struct Inputs {
    pub updates: mpsc::Receiver<SourceUpdate>,
    reports: mpsc::Receiver<Report>,
}

impl PodManager {
    /// A manager for the given parts; `sources` names the sources that must
    /// report before anything is removed as gone.
    pub fn new(
        runtime: Arc<dyn Runtime>,
        node: NodeContext,
        sources: Vec<&'static str>,
        status: StatusManager,
        allocatable: admit::Allocatable,
    ) -> (PodManager, PodKiller, mpsc::Sender<SourceUpdate>, Inputs) {
        let (report_tx, reports) = mpsc::channel(256);
        let (kill_tx, kills) = mpsc::channel(64);
        let (update_tx, updates) = mpsc::channel(16);
        let m = PodManager {
            pleg: Pleg::new(runtime.clone()),
            runtime,
            node,
            sources: Sources::new(sources),
            status,
            allocatable,
            workers: PodWorkers::default(),
            rejected: BTreeMap::new(),
            allocations: Allocations::default(),
            cleaned: false,
            reports: report_tx,
            kills,
            relist_beat: None,
            cgroup_sweep: None,
        };
        (
            m,
            PodKiller(kill_tx),
            update_tx,
            Inputs { updates, reports },
        )
    }

    /// Sweeps the pod cgroups (under the cgroup filesystem at `mount`) of
    /// the pods this node ran once they are gone, every 10 s.
    pub fn with_pod_cgroup_sweep(mut self, mount: std::path::PathBuf) -> Self {
        self.cgroup_sweep = Some((mount, Arc::default()));
        self
    }

    /// Beats `hb` after every successful relist.
    pub fn with_relist_heartbeat(mut self, hb: crate::health::Heartbeat) -> Self {
        self.relist_beat = Some(hb);
        self
    }

    pub async fn run(mut self, mut inputs: Inputs, shutdown: CancellationToken) {
        // Know what already runs before the first snapshot is admitted, so
        // a restart never rejects a running pod.
        self.relist().await;
        let changes = self.runtime.changes();
        let period = match changes {
            Some(_) => pleg::RELIST_PERIOD_WITH_EVENTS,
            None => pleg::RELIST_PERIOD,
        };
        let mut relist = tokio::time::interval(period);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut gc = tokio::time::interval_at(
            tokio::time::Instant::now() + CONTAINER_GC_PERIOD,
            CONTAINER_GC_PERIOD,
        );
        gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut housekeeping = tokio::time::interval(POD_CGROUP_SWEEP_PERIOD);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconcile = tokio::time::interval(STATUS_RECONCILE_PERIOD);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let cache = self.pleg.cache();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                u = inputs.updates.recv() => match u {
                    Some(u) => self.on_source(u, &shutdown).await,
                    None => return,
                },
                r = inputs.reports.recv() => match r {
                    Some(r) => self.on_report(r, &shutdown),
                    None => return,
                },
                Some((uid, k)) = self.kills.recv() => {
                    self.workers.kill(&uid, k);
                }
                _ = relist.tick() => self.relist().await,
                _ = gc.tick() => self.collect_sandboxes(),
                _ = housekeeping.tick() => {
                    self.sweep_pod_cgroups();
                    self.retry_deferred_resizes();
                }
                _ = reconcile.tick() => self.reconcile_statuses(),
                _ = cache.wanted() => self.relist().await,
                _ = async {
                    match &changes {
                        Some(n) => n.notified().await,
                        None => std::future::pending().await,
                    }
                } => self.relist().await,
            }
        }
    }

    async fn relist(&mut self) {
        let t = std::time::Instant::now();
        let r = self.pleg.relist().await;
        let took = t.elapsed();
        self.node.metrics.relisted(took);
        // Everything the manager does waits for a relist: a slow one is
        // worth a line (a conformance run once saw pod intake stall 5 min).
        if took > std::time::Duration::from_secs(5) {
            warn!(took = ?took, "relisting containers was slow; pod updates waited for it");
        }
        match r {
            Ok(changed) => {
                for uid in changed {
                    self.workers.wake(&uid);
                }
                if let Some(hb) = &self.relist_beat {
                    hb.beat();
                }
            }
            Err(e) => warn!(error = %e, "relisting containers failed"),
        }
    }

    /// Upstream's container GC for sandboxes: one whose pod has no worker
    /// and no source any more is removed (a removal that failed in the
    /// pod's cleanup, say a CNI DEL refused, is tried again here). Only
    /// sandboxes made before this look: a pod added meanwhile is not
    /// judged on a stale list.
    fn collect_sandboxes(&self) {
        if !self.cleaned {
            return;
        }
        let keep: BTreeSet<String> = self
            .sources
            .uids()
            .chain(self.workers.uids())
            .cloned()
            .collect();
        let before = jiff::Timestamp::now().as_nanosecond() as i64;
        let runtime = self.runtime.clone();
        tokio::spawn(async move { remove_gone_sandboxes(&*runtime, &keep, before).await });
    }

    /// Upstream's orphaned pod cgroup cleanup, for the pods this node ran:
    /// a pod cgroup normally goes with its sandbox, but a kill at the
    /// wrong moment (a container made after its sandbox was removed) can
    /// leave one. Off the async thread; only empty cgroups go.
    fn sweep_pod_cgroups(&self) {
        let (Some((mount, ran)), true) = (&self.cgroup_sweep, self.cleaned) else {
            return;
        };
        let keep: BTreeSet<&String> = self.sources.uids().chain(self.workers.uids()).collect();
        let gone: BTreeSet<String> = {
            let ran = ran.lock().unwrap_or_else(|p| p.into_inner());
            ran.iter().filter(|u| !keep.contains(u)).cloned().collect()
        };
        if gone.is_empty() {
            return;
        }
        let (mount, ran, root) = (mount.clone(), ran.clone(), self.node.pods_cgroup.clone());
        tokio::task::spawn_blocking(move || {
            let done = crate::cm::pod_cgroups::sweep(&mount, &root, &gone);
            let mut ran = ran.lock().unwrap_or_else(|p| p.into_inner());
            ran.retain(|u| !done.contains(u));
        });
    }

    /// Writes again the statuses the API shows otherwise than kinglet
    /// last wrote them (see [`StatusManager::reconcile`]).
    fn reconcile_statuses(&self) {
        for (pod, in_api) in self.sources.api_statuses() {
            if let Some(uid) = &pod.metadata.uid {
                self.status.reconcile(uid, pod, in_api);
            }
        }
    }

    async fn on_source(&mut self, u: SourceUpdate, shutdown: &CancellationToken) {
        self.sources.update(u);
        let desired = self.sources.desired();
        for (uid, pod) in &desired {
            let deleting = pod.metadata.deletion_timestamp.is_some();
            if self.workers.known(uid) {
                self.resize(uid, pod);
                let run = self.allocations.allocated_pod(uid, pod);
                self.workers.update(uid, &run);
            } else if let Some(deleted) = self.rejected.get_mut(uid) {
                // A rejected pod never ran: its deletion is written once.
                if deleting && !*deleted {
                    *deleted = true;
                    self.status.terminated(uid, pod);
                }
            } else if let Err(e) = validate::pod(pod) {
                // Refused before anything of it touches the disk.
                let r = admit::Rejection {
                    reason: validate::REASON.into(),
                    message: e.to_string(),
                };
                self.reject(uid, pod, r);
                if deleting && let Some(deleted) = self.rejected.get_mut(uid) {
                    *deleted = true;
                    self.status.terminated(uid, pod);
                }
            } else if deleting {
                // Deleted before it ever ran here (or while kinglet was
                // down): a worker stops what runs and finishes the deletion.
                self.start_worker(uid, pod, shutdown);
            } else {
                self.admit_and_start(uid, pod, &desired, shutdown).await;
            }
        }
        self.workers.remove_missing(&desired);
        let gone: Vec<String> = self
            .rejected
            .keys()
            .filter(|u| !desired.contains_key(*u))
            .cloned()
            .collect();
        for u in gone {
            self.rejected.remove(&u);
            self.status.forget(&u);
        }
        if !self.cleaned && self.sources.ready() {
            self.cleaned = true;
            let keep: BTreeSet<String> = desired.keys().cloned().collect();
            let gone = self.status.remove_stale_records(&keep);
            if let Some((_, ran)) = &self.cgroup_sweep {
                let mut ran = ran.lock().unwrap_or_else(|p| p.into_inner());
                ran.extend(gone.iter().cloned());
            }
            let orphans = remove_orphans(self.runtime.clone(), self.node.clone(), keep, gone);
            tokio::spawn(orphans);
        }
    }

    async fn admit_and_start(
        &mut self,
        uid: &str,
        pod: &Pod,
        desired: &BTreeMap<String, Pod>,
        shutdown: &CancellationToken,
    ) {
        // A pod whose containers already run (a restart) is not admitted
        // again (its devices are in the device checkpoint); a new one must
        // fit next to the running ones.
        if self.pleg.cache().get(uid).is_empty() {
            let others = self.allocated_others(uid, desired);
            let others: Vec<&Pod> = others.iter().map(|p| &**p).collect();
            if let Err(r) = admit::admit(pod, &others, &self.allocatable) {
                self.reject(uid, pod, r);
                return;
            }
            if let Err(r) = self.allocate_devices(uid, pod, desired).await {
                self.reject(uid, pod, r);
                return;
            }
        }
        self.start_worker(uid, pod, shutdown);
    }

    /// The device manager's part of admission (upstream's
    /// `GetAllocateResourcesPodAdmitHandler`): the pod's devices, chosen
    /// and allocated by their sources. Once every source has been read,
    /// the pods no longer active (gone, rejected or ended) give theirs back
    /// first; a pod in the sources not yet started is active (after a
    /// restart, its devices are in the checkpoint).
    async fn allocate_devices(
        &self,
        uid: &str,
        pod: &Pod,
        desired: &BTreeMap<String, Pod>,
    ) -> Result<(), admit::Rejection> {
        let Some(devices) = &self.node.devices else {
            return Ok(());
        };
        let active: Option<BTreeSet<String>> = self.sources.ready().then(|| {
            let others = desired.keys().filter(|u| *u != uid);
            let others = others.filter(|u| !self.rejected.contains_key(*u) && !self.ended(u));
            others.cloned().collect()
        });
        devices
            .allocate(pod, active.as_ref())
            .await
            .map_err(|e| admit::Rejection {
                reason: "UnexpectedAdmissionError".into(),
                message: e.admission_message(),
            })
    }

    /// A pod that never runs here: failed with the reason, once.
    fn reject(&mut self, uid: &str, pod: &Pod, r: admit::Rejection) {
        warn!(pod = %pod_name(pod), reason = %r.reason, "{}", r.message);
        self.rejected.insert(uid.to_string(), false);
        self.status.event(pod, "Warning", &r.reason, &r.message);
        self.status.adopt(uid);
        self.status.set(uid, pod, admit::rejected_status(pod, &r));
    }

    fn start_worker(&mut self, uid: &str, pod: &Pod, shutdown: &CancellationToken) {
        info!(pod = %pod_name(pod), uid, "pod added");
        if let Some((_, ran)) = &self.cgroup_sweep {
            let mut ran = ran.lock().unwrap_or_else(|p| p.into_inner());
            ran.insert(uid.to_string());
        }
        // A pod adopted after a restart keeps its start time and what it
        // was allocated.
        let start_time = self.status.adopt(uid);
        let recorded = self.status.allocation(uid).cloned();
        self.allocations.add(uid, pod, recorded);
        let run = self.allocations.allocated_pod(uid, pod);
        let (rx, wake) = self.workers.add(uid, &run);
        let rep = Reporter {
            uid: uid.to_string(),
            tx: self.reports.clone(),
        };
        let mut w = Worker::new(
            uid.into(),
            self.runtime.clone(),
            self.node.clone(),
            self.pleg.cache(),
            rep,
        );
        if let Some(t) = start_time {
            w.set_start_time(t);
        }
        if let Some(st) = self.status.get(uid) {
            w.set_actuated(st);
        }
        tokio::spawn(w.run(rx, wake, shutdown.clone()));
        if let Some(a) = self.allocations.get(uid) {
            let a = a.clone();
            self.status.set_allocation(uid, pod, &a);
        }
        // A resize made while kinglet was down.
        self.resize(uid, pod);
    }

    /// Looks at a pod's spec against what it is allocated (upstream's
    /// `HandlePodUpdates` → `RetryPendingResizes`): a resize that fits is
    /// allocated and its worker runs it; one that does not is pending.
    fn resize(&mut self, uid: &str, pod: &Pod) {
        let differs = self
            .allocations
            .get(uid)
            .is_some_and(|a| allocation::apply(pod, a).is_some());
        if !differs && self.allocations.pending(uid).is_none() {
            return;
        }
        let desired = self.sources.desired();
        let others = self.allocated_others(uid, &desired);
        let others: Vec<&Pod> = others.iter().map(|p| &**p).collect();
        let node = &self.node;
        let swaps = |c: &k8s_openapi::api::core::v1::Container| {
            let limit = None;
            let s = crate::pods::kuberuntime::swap::container_swap(
                pod,
                c,
                &node.swap,
                node.memory_capacity,
                limit,
            );
            s.swap_max.is_some_and(|m| m > 0)
        };
        let had_pending = self.allocations.pending(uid).is_some();
        match self
            .allocations
            .resize(uid, pod, &others, &self.allocatable, &swaps)
        {
            Outcome::Unchanged if !had_pending => return,
            Outcome::Unchanged => {}
            Outcome::Allocated => {
                let msg = allocation::event_message("Pod resize started", pod, None);
                self.status.event(pod, "Normal", "ResizeStarted", &msg);
                if let Some(a) = self.allocations.get(uid).cloned() {
                    self.status.set_allocation(uid, pod, &a);
                }
                // Its worker runs the new allocation (a retried resize
                // comes with no pod update).
                self.workers.update(uid, pod);
            }
            Outcome::Pending(_, false) => return,
            Outcome::Pending(p, true) => {
                let prefix = format!("Pod resize {}", p.reason);
                let msg = allocation::event_message(&prefix, pod, Some(&p.message));
                self.status
                    .event(pod, "Warning", &format!("Resize{}", p.reason), &msg);
            }
        }
        // The condition changed: the status says so now.
        if let Some(mut st) = self.status.get(uid).cloned() {
            self.resize_pending_condition(uid, &mut st);
            let run = self.allocations.allocated_pod(uid, pod);
            self.status.set(uid, &run, st);
        }
    }

    /// Upstream retries deferred resizes as pods go and periodically.
    fn retry_deferred_resizes(&mut self) {
        for uid in self.allocations.deferred() {
            if let Some(pod) = self.sources.get(&uid).cloned() {
                self.resize(&uid, &pod);
            }
        }
    }

    /// Whether pod `uid` has ended (its status is `Succeeded` or `Failed`).
    fn ended(&self, uid: &str) -> bool {
        let phase = self.status.get(uid).and_then(|s| s.phase.as_deref());
        matches!(phase, Some("Succeeded" | "Failed"))
    }

    /// The allocated pods running next to `uid`, as admission counts them.
    fn allocated_others<'a>(
        &self,
        uid: &str,
        desired: &'a BTreeMap<String, Pod>,
    ) -> Vec<std::borrow::Cow<'a, Pod>> {
        self.workers
            .in_phase(Phase::Syncing)
            .filter(|u| *u != uid && !self.ended(u))
            .filter_map(|u| desired.get(u).map(|p| self.allocations.allocated(u, p)))
            .collect()
    }

    /// The status with upstream's `PodResizePending` condition if the
    /// pod's resize is pending (the worker reports the others).
    fn resize_pending_condition(&self, uid: &str, st: &mut k8s_openapi::api::core::v1::PodStatus) {
        let conditions = st.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "PodResizePending");
        if let Some(p) = self.allocations.pending(uid) {
            conditions.push(k8s_openapi::api::core::v1::PodCondition {
                type_: "PodResizePending".into(),
                status: "True".into(),
                reason: Some(p.reason.into()),
                message: Some(p.message.clone()),
                observed_generation: p.generation,
                ..Default::default()
            });
        }
    }

    fn on_report(&mut self, r: Report, shutdown: &CancellationToken) {
        match r {
            Report::Status { uid, pod, status } => {
                let mut status = *status;
                self.resize_pending_condition(&uid, &mut status);
                self.status.set(&uid, &pod, status);
            }
            Report::Event {
                pod,
                type_,
                reason,
                message,
            } => self.status.event(&pod, type_, &reason, &message),
            Report::Terminated { uid } => {
                self.workers.terminated(&uid);
                // What it was allocated is free for a deferred resize.
                self.allocations.remove(&uid);
                self.retry_deferred_resizes();
            }
            Report::Removed { uid, pod } => {
                info!(pod = %pod_name(&pod), uid = %uid, "pod removed");
                self.status.terminated(&uid, &pod);
                if let Some(dir) = crate::pods::util::pod_log_dir(&pod, &self.node) {
                    let marker = self.status.log_marker(&uid);
                    tokio::spawn(remove_log_dir_later(dir, marker, shutdown.clone()));
                }
                let listed = self.sources.get(&uid).cloned();
                if self.workers.removed(&uid, listed.is_some()) == AfterRemoval::Restart
                    && let Some(p) = listed
                {
                    self.start_worker(&uid, &p, shutdown);
                }
            }
        }
    }
}

/// Upstream's `ContainerGCPeriod`: a removed pod's logs stay readable this
/// long, then its log dir goes, as upstream's container GC removes it.
pub const LOG_DIR_GRACE: Duration = CONTAINER_GC_PERIOD;

/// How often the pod cgroups of gone pods are looked for (upstream does
/// it every 2 s housekeeping; a leftover is rare, and waits little).
const POD_CGROUP_SWEEP_PERIOD: Duration = Duration::from_secs(10);

/// How often the API's copy of each pod's status is compared with the
/// last one written (upstream's status manager `syncPeriod`, 10 s): at
/// most one extra write per pod and period, and only where they differ.
const STATUS_RECONCILE_PERIOD: Duration = super::status::manager::WATCH_LAG;

/// Upstream's `ContainerGCPeriod` (one minute).
const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);

/// Removes a removed pod's log dir after [`LOG_DIR_GRACE`], then its
/// marker; a stop before then leaves the marker for the next start.
async fn remove_log_dir_later(
    dir: std::path::PathBuf,
    marker: Option<std::path::PathBuf>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = tokio::time::sleep(LOG_DIR_GRACE) => {}
    }
    let _ = tokio::task::spawn_blocking(move || {
        let _ = std::fs::remove_dir_all(dir);
        marker.map(std::fs::remove_file)
    })
    .await;
}

/// After a restart: containers and sandboxes of pods no source wants
/// any more are stopped and removed, and their volumes; log dirs go for
/// the pods this node recorded (`gone`): the log root may be shared.
async fn remove_orphans(
    runtime: Arc<dyn Runtime>,
    node: NodeContext,
    desired: BTreeSet<String>,
    gone: BTreeSet<String>,
) {
    let containers = runtime.list_containers().await.unwrap_or_default();
    for c in containers.iter().filter(|c| !desired.contains(&c.pod_uid)) {
        info!(container = %c.name, pod_uid = %c.pod_uid, "removing container of a pod that is gone");
        let _ = runtime.stop_container(&c.id, Duration::from_secs(2)).await;
        let _ = runtime.remove_container(&c.id).await;
    }
    remove_gone_sandboxes(&*runtime, &desired, i64::MAX).await;
    let _ = tokio::task::spawn_blocking(move || remove_orphan_dirs(&node, &desired, &gone)).await;
}

/// Removes the sandboxes made before `before` (Unix nanoseconds) whose
/// pod is not in `keep`.
async fn remove_gone_sandboxes(runtime: &dyn Runtime, keep: &BTreeSet<String>, before: i64) {
    for s in runtime.list_pod_sandboxes().await.unwrap_or_default() {
        if keep.contains(&s.pod_uid) || s.created_at >= before {
            continue;
        }
        match runtime.remove_pod_sandbox(&s.id).await {
            Ok(()) => {
                info!(sandbox = %s.id, pod_uid = %s.pod_uid, "removed the sandbox of a pod that is gone")
            }
            Err(e) => {
                warn!(sandbox = %s.id, pod_uid = %s.pod_uid, error = %e, "cannot remove the sandbox of a pod that is gone")
            }
        }
    }
}

/// Volume dirs (`<volume root>/<uid>`) and kubelet-file dirs (`<pods
/// dir>/<uid>`) of UIDs no source lists, and log
/// dirs (`<log root>/<ns>_<name>_<uid>`) of the recorded pods now gone.
fn remove_orphan_dirs(node: &NodeContext, desired: &BTreeSet<String>, gone: &BTreeSet<String>) {
    let dirs = |root: &str| -> Vec<(String, std::path::PathBuf)> {
        std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect()
    };
    for (name, path) in dirs(&node.volume_root) {
        if !desired.contains(&name) {
            super::volumes::remove_pod_dir(&path);
        }
    }
    // The kubelet's files of each pod (`<pods dir>/<uid>/`; the status
    // records beside them are files, not dirs).
    for (name, path) in dirs(&node.pods_dir) {
        if !desired.contains(&name) {
            let _ = std::fs::remove_dir_all(path);
        }
    }
    if let Some(st) = &node.store {
        for uid in st.pods() {
            if !desired.contains(&uid) {
                st.remove_pod(&uid);
            }
        }
    }
    for (name, path) in dirs(&node.log_root) {
        if name.rsplit('_').next().is_some_and(|u| gone.contains(u)) {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}
