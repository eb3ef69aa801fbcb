//! The eviction manager, as upstream's `pkg/kubelet/eviction`: it owns the
//! pressure conditions ([`Pressure`], read by the node status and by
//! admission), measures the signals ([`signals`]), decides which
//! thresholds are met ([`thresholds`]), ranks the pods ([`rank`]) and
//! hands the first one a kill request (`Evicted`, upstream's message, the
//! `DisruptionTarget` condition, an `Evicted` event — the worker does
//! those) through the pod killer: it never holds the pod manager. One pod
//! per round, then it measures again.
//!
//! Memory is watched as it changes, not every 10 s ([`notify`]): a memcg
//! usage threshold armed at the level where a memory threshold would be
//! met (cgroup v1), PSI triggers, `memory.events` (cgroup v2); the 10 s
//! sync stays for the disk and PID signals and as the safety net, and a
//! host without any event source is polled every second instead.
//!
//! Disk signals reclaim first: the dead containers of finished pods and
//! their logs (upstream's container GC; a running pod's last dead
//! container is kept for `--previous`), then every unused image
//! (upstream's image GC); if that did not bring the signal back above its
//! threshold, pods are ranked by
//! their local storage ([`storage`]: emptyDirs on disk, logs, writable
//! layers). A pod over an emptyDir's `sizeLimit` or an `ephemeral-storage`
//! limit is evicted at once, whatever the node's state.

pub mod notify;
pub mod rank;
pub mod signals;
pub mod storage;
pub mod thresholds;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kinglet_runtime::Runtime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::pods::{KillRequest, PodKiller, StatusView};
use thresholds::{Observations, State, Threshold};

/// The node conditions eviction reports (`MemoryPressure`, `DiskPressure`,
/// `PIDPressure`), with the transition period applied.
#[derive(Debug, Default)]
pub struct Pressure(RwLock<Vec<&'static str>>);

impl Pressure {
    pub fn has(&self, condition: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&condition)
    }

    pub fn conditions(&self) -> Vec<&'static str> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, c: Vec<&'static str>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = c;
    }
}

/// How the manager is set up.
pub struct Settings {
    pub thresholds: Vec<Threshold>,
    pub transition: Duration,
    /// `evictionMaxPodGracePeriod` (soft evictions).
    pub max_pod_grace: Duration,
    pub sources: signals::Sources,
    /// The periodic sync (upstream's 10 s).
    pub housekeeping: Duration,
    pub storage: storage::Roots,
    /// The pids controller's hierarchy (v1 `<mount>/pids`, v2 the mount)
    /// and the pods' cgroup under it: `pid.available` ranks pods by their
    /// cgroup's `pids.current`, as upstream ranks by process count.
    pub pids_root: PathBuf,
    pub pods_cgroup: String,
    /// Node-level reclaim for disk signals.
    pub image_gc: Option<Arc<tokio::sync::Mutex<crate::pods::images::gc::ImageGc>>>,
}

/// The manager's parts.
pub struct Manager {
    pub settings: Settings,
    pub view: StatusView,
    pub runtime: Arc<dyn Runtime>,
    pub killer: PodKiller,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub pressure: Arc<Pressure>,
}

/// How long an evicted pod may take to terminate before the next one is
/// chosen (upstream's `podCleanupTimeout`).
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the loop keeps between rounds.
#[derive(Default)]
struct Round {
    state: State,
    /// The pod evicted last, and when.
    pending: Option<(String, Instant)>,
}

impl Manager {
    pub async fn run(mut self, stop: CancellationToken) {
        // The image filesystem is the runtime's (containerd's root with
        // CRI, the root dir in-process).
        if let Ok(fs) = self.runtime.image_fs_info().await
            && let Some(f) = fs.first()
        {
            self.settings.sources.imagefs = f.mountpoint.clone().into();
        }
        self.drop_unmeetable().await;
        let mut round = Round::default();
        let mut wakers = Wakers::new(&self.settings.sources);
        let mut woke = ("start", Instant::now());
        let mut was_crossed = false;
        loop {
            let (obs, evicted) = self.synchronize(&mut round, woke).await;
            // A level usage already passed between the measurement and the
            // arming never signals (the kernel signals crossings only):
            // measure again at once, not at the next sync. Once, so a
            // threshold no pod can relieve does not spin.
            let crossed = wakers.arm(self.memcg_levels(&obs));
            wakers.announce_once();
            let wait = if crossed && !was_crossed && !evicted {
                Duration::from_millis(100)
            } else if evicted || crossed || !wakers.any() {
                Duration::from_secs(1)
            } else {
                self.settings.housekeeping
            };
            was_crossed = crossed;
            tokio::select! {
                _ = stop.cancelled() => return,
                by = wakers.wait(wait) => woke = (by, Instant::now()),
            }
        }
    }

    /// A threshold at or above its signal's capacity would evict pod
    /// after pod forever: said once, clearly, and ignored.
    async fn drop_unmeetable(&mut self) {
        let obs = self.observe().await;
        let bad = thresholds::always_met(&self.settings.thresholds, &obs);
        for &i in bad.iter().rev() {
            let t = self.settings.thresholds.remove(i);
            let capacity = obs.get(t.signal.as_str()).map_or(0, |o| o.capacity);
            let field = if t.is_hard() {
                "evictionHard"
            } else {
                "evictionSoft"
            };
            warn!(
                "{field}[{}]: the threshold is at or above the signal's capacity ({}): it would always be met; ignored",
                t.signal,
                rank::quantity(capacity)
            );
        }
    }

    /// The v1 usage levels at which the tightest memory thresholds are
    /// met, per cgroup: capacity − threshold + inactive file pages (usage
    /// counts them, the working set does not), as upstream's memory
    /// threshold notifier: the pods' cgroup for
    /// `allocatableMemory.available`, the root for `memory.available`.
    fn memcg_levels(&self, obs: &Observations) -> Vec<(signals::MemCgroup, u64)> {
        let targets = [
            (
                "allocatableMemory.available",
                self.settings.sources.pods.clone(),
            ),
            ("memory.available", Some(self.settings.sources.root.clone())),
        ];
        targets
            .into_iter()
            .filter_map(|(signal, cg)| {
                let (o, cg) = (obs.get(signal)?, cg?);
                let tightest = self
                    .settings
                    .thresholds
                    .iter()
                    .filter(|t| t.signal == signal)
                    .map(|t| t.value.resolve(o.capacity))
                    .max()?;
                let inactive = cg.inactive_file()?;
                let level = o.capacity.saturating_sub(tightest).saturating_add(inactive);
                Some((cg, level))
            })
            .collect()
    }

    /// One round: observe, publish the conditions, evict at most one pod
    /// (none while the last one evicted is still terminating, up to 30 s,
    /// as upstream waits for its cleanup): one over its local storage
    /// limits first, then for the first threshold met (memory before the
    /// rest), disk thresholds after the node-level reclaim. `woke`: what
    /// started the round and when (for the log).
    async fn synchronize(
        &self,
        round: &mut Round,
        woke: (&'static str, Instant),
    ) -> (Observations, bool) {
        let obs = self.observe().await;
        let now = Instant::now();
        let met = round.state.observe(&self.settings.thresholds, &obs, now);
        self.pressure
            .set(round.state.conditions(now, self.settings.transition));
        if let Some((uid, at)) = &round.pending {
            let gone = self.view.get(uid).is_none_or(|e| {
                matches!(
                    e.status.phase.as_deref(),
                    Some("Failed") | Some("Succeeded")
                )
            });
            if !gone && at.elapsed() < POD_CLEANUP_TIMEOUT {
                return (obs, true);
            }
            round.pending = None;
        }
        // Memory first when it is short: its margin is seconds, and the
        // local-storage check walks the disk.
        let memory = met
            .iter()
            .any(|&i| thresholds::resource_of(&self.settings.thresholds[i].signal) == "memory");
        let first = match memory {
            true => self.threshold_victim(&met, &obs).await,
            false => None,
        };
        let victim = match first {
            Some(v) => Some(v),
            None => match self.local_storage_victim().await {
                Some(v) => Some(v),
                None if !memory => self.threshold_victim(&met, &obs).await,
                None => None,
            },
        };
        let Some(v) = victim else {
            return (obs, false);
        };
        round.pending = Some((v.uid.clone(), Instant::now()));
        self.evict(v, woke).await;
        (obs, true)
    }

    async fn observe(&self) -> Observations {
        let sources = self.settings.sources.clone();
        tokio::task::spawn_blocking(move || signals::observe(&sources))
            .await
            .unwrap_or_default()
    }

    /// The first pod over a local-storage limit (an emptyDir's
    /// `sizeLimit`, `ephemeral-storage` limits: upstream's
    /// `localStorageEviction`, at once, whatever the node's state).
    async fn local_storage_victim(&self) -> Option<Victim> {
        let roots = self.settings.storage.clone();
        let pods = self.active_pods();
        // Writable layers are walked only when some pod has a limit.
        let writable = match pods.iter().any(|(_, e)| storage::has_limit(&e.pod)) {
            true => self.writable_layers().await,
            false => BTreeMap::new(),
        };
        let found = tokio::task::spawn_blocking(move || {
            pods.into_iter().find_map(|(uid, e)| {
                let w = writable.get(&uid).cloned().unwrap_or_default();
                storage::limit_breach(&e.pod, &uid, &roots, &w).map(|b| (uid, e, b))
            })
        })
        .await
        .ok()??;
        let (uid, e, (signal, message)) = found;
        Some(Victim {
            uid,
            pod: e.pod,
            message,
            grace: Duration::ZERO,
            signal: signal.into(),
        })
    }

    /// The running containers' writable layers, by pod UID and container
    /// name (the runtime's stats name containers by ID; the statuses map
    /// IDs to names).
    async fn writable_layers(&self) -> BTreeMap<String, storage::Writable> {
        let stats = self.runtime.container_stats().await.unwrap_or_default();
        let by_id: BTreeMap<String, u64> = stats
            .into_iter()
            .map(|u| (u.id, u.writable_layer_bytes))
            .collect();
        let mut out = BTreeMap::new();
        for (uid, e) in self.active_pods() {
            let mut w = storage::Writable::new();
            for c in e.status.container_statuses.iter().flatten() {
                let id = c.container_id.as_deref().and_then(|i| i.split_once("://"));
                if let Some(bytes) = id.and_then(|(_, id)| by_id.get(id)) {
                    w.insert(c.name.clone(), *bytes);
                }
            }
            out.insert(uid, w);
        }
        out
    }

    /// The pod to evict for the thresholds met, if one is needed: memory
    /// signals first; for disk signals only if image GC did not free
    /// enough.
    async fn threshold_victim(&self, met: &[usize], obs: &Observations) -> Option<Victim> {
        let mut met: Vec<&Threshold> = met.iter().map(|&i| &self.settings.thresholds[i]).collect();
        met.sort_by_key(|t| thresholds::resource_of(&t.signal) != "memory");
        let t = *met.first()?;
        let resource = thresholds::resource_of(&t.signal);
        let disk = resource == "ephemeral-storage" || resource == "inodes";
        // Both reclaims, as upstream's node-level reclaim for nodefs.
        if disk && (self.reclaim_dead_containers().await | self.reclaim_images().await) {
            let again = self.observe().await;
            let o = again.get(t.signal.as_str())?;
            if o.available >= t.value.resolve(o.capacity) {
                info!(signal = %t.signal, "node-level reclaim relieved the disk; no eviction");
                return None;
            }
        }
        let mut candidates = self.candidates(resource).await;
        if candidates.is_empty() {
            warn!(signal = %t.signal, "eviction threshold met but no pod can be evicted");
            return None;
        }
        rank::rank(&mut candidates);
        let c = candidates.swap_remove(0);
        let o = obs.get(t.signal.as_str()).copied();
        let capacity = o.map_or(0, |o| o.capacity);
        // Bytes as binary quantities; a process count as the number it is.
        let fmt = |v: u64| match resource {
            "pids" => v.to_string(),
            _ => rank::quantity(v),
        };
        let threshold = match t.value {
            crate::config::ThresholdValue::Quantity(q) => fmt(q),
            crate::config::ThresholdValue::Percent(_) => fmt(t.value.resolve(capacity)),
        };
        let available = fmt(o.map_or(0, |o| o.available));
        let message = rank::message(resource, &threshold, &available, &c);
        let grace = if t.is_hard() && resource == "memory" {
            // At once (upstream waits 1 s): the alternative is the kernel's
            // SIGKILL a moment later, and a pod whose PID 1 ignores SIGTERM
            // (a shell) keeps allocating through a grace period — at
            // 500 MiB/s a second is the whole margin of a small board.
            Duration::ZERO
        } else if t.is_hard() {
            // Upstream's immediateEvictionGracePeriodSeconds.
            Duration::from_secs(1)
        } else {
            let own = c
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30)
                .max(0) as u64;
            self.settings.max_pod_grace.min(Duration::from_secs(own))
        };
        Some(Victim {
            uid: c.uid,
            pod: c.pod,
            message,
            grace,
            signal: t.signal.clone(),
        })
    }

    /// Node-level reclaim for disk signals: every unused image (dead
    /// containers are kept: they hold the last run's logs). True if any
    /// went.
    async fn reclaim_images(&self) -> bool {
        let Some(gc) = &self.settings.image_gc else {
            return false;
        };
        match gc.lock().await.reclaim().await {
            Ok(removed) => {
                info!(
                    images = removed.len(),
                    "disk pressure: unused images removed"
                );
                !removed.is_empty()
            }
            Err(e) => {
                warn!(error = %e, "disk pressure: image garbage collection failed");
                false
            }
        }
    }

    /// Node-level reclaim for disk signals, before images (upstream's
    /// `DeleteAllUnusedContainers`, terminated pods' containers
    /// evictable): the exited containers of pods that finished
    /// (`Succeeded`/`Failed`), with their log files. Pods the node does not
    /// know are left to the pod manager's orphan cleanup. True if any went.
    async fn reclaim_dead_containers(&self) -> bool {
        use kinglet_runtime::ContainerState;
        let Ok(list) = self.runtime.list_containers().await else {
            return false;
        };
        let logs = self.settings.storage.logs.display().to_string();
        let mut removed = 0;
        for c in list
            .into_iter()
            .filter(|c| c.state == ContainerState::Exited)
        {
            let Some(e) = self.view.get(&c.pod_uid) else {
                continue;
            };
            let finished = matches!(
                e.status.phase.as_deref(),
                Some("Succeeded") | Some("Failed")
            );
            if !finished || self.runtime.remove_container(&c.id).await.is_err() {
                continue;
            }
            removed += 1;
            // Its log files, where kinglet names them (`<pod log
            // dir>/<container>/<attempt>.log` and rotated ones), not where
            // the runtime says (CRI's list has no path).
            let dir = crate::pods::util::log_directory(&e.pod, &logs);
            let dir = crate::pods::util::contained_path(std::path::Path::new(&dir), &[&c.name]);
            info!(pod = %crate::pods::util::pod_name(&e.pod), container = %c.name, logs = ?dir, "disk pressure: a finished pod's dead container removed");
            if let Some(dir) = dir {
                let prefix = format!("{}.log", c.attempt);
                let _ = tokio::task::spawn_blocking(move || remove_logs(&dir, &prefix)).await;
            }
        }
        if removed > 0 {
            info!(
                containers = removed,
                "disk pressure: dead containers of finished pods removed"
            );
        }
        removed > 0
    }

    /// Hands the victim's kill to its worker.
    async fn evict(&self, v: Victim, woke: (&'static str, Instant)) {
        let name = crate::pods::util::pod_name(&v.pod);
        let decided_in = woke.1.elapsed();
        warn!(pod = %name, signal = %v.signal, woken_by = woke.0, ?decided_in, message = %v.message, "evicting");
        self.metrics
            .evictions
            .get_or_create(&crate::metrics::SignalLabels {
                eviction_signal: v.signal.clone(),
            })
            .inc();
        let k = KillRequest {
            reason: crate::pods::EVICTED.into(),
            message: v.message,
            grace: Some(v.grace),
        };
        self.killer.kill(&v.uid, k).await;
    }

    /// The pods that may be evicted: not finished, not critical.
    fn active_pods(&self) -> Vec<(String, crate::pods::PodEntry)> {
        self.view
            .pods()
            .into_iter()
            .filter(|(_, e)| {
                let phase = e.status.phase.as_deref().unwrap_or("Pending");
                phase != "Succeeded" && phase != "Failed" && !rank::is_critical(&e.pod)
            })
            .collect()
    }

    /// The candidates with their use of `resource`: memory from the
    /// runtime's container stats, local storage from the pods' dirs, none
    /// for PIDs (ranked by priority alone).
    async fn candidates(&self, resource: &str) -> Vec<rank::Candidate> {
        let pods = self.active_pods();
        match resource {
            "memory" => {
                let usage = self.runtime.container_stats().await.unwrap_or_default();
                let by_id: BTreeMap<String, u64> = usage
                    .into_iter()
                    .map(|u| (u.id, u.memory_working_set_bytes))
                    .collect();
                pods.into_iter()
                    .map(|(uid, e)| memory_candidate(uid, &e, &by_id))
                    .collect()
            }
            "ephemeral-storage" | "inodes" => {
                let roots = self.settings.storage.clone();
                let writable = self.writable_layers().await;
                tokio::task::spawn_blocking(move || {
                    pods.into_iter()
                        .map(|(uid, e)| {
                            let w = writable.get(&uid).cloned().unwrap_or_default();
                            let usage = storage::usage(&e.pod, &uid, &roots, &w);
                            plain_candidate(uid, &e, usage)
                        })
                        .collect()
                })
                .await
                .unwrap_or_default()
            }
            "pids" => {
                let (root, pods_cgroup) = (
                    self.settings.pids_root.clone(),
                    self.settings.pods_cgroup.clone(),
                );
                tokio::task::spawn_blocking(move || {
                    pods.into_iter()
                        .map(|(uid, e)| {
                            let parent = crate::cm::qos::cgroup_parent(&e.pod, &pods_cgroup);
                            let usage = pids_current(&root.join(parent));
                            plain_candidate(uid, &e, usage)
                        })
                        .collect()
                })
                .await
                .unwrap_or_default()
            }
            _ => pods
                .into_iter()
                .map(|(uid, e)| plain_candidate(uid, &e, 0))
                .collect(),
        }
    }
}

/// Removes the files in `dir` named `prefix` or `prefix.*` (a log and
/// its rotations).
fn remove_logs(dir: &std::path::Path, prefix: &str) {
    for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name == prefix || name.starts_with(&format!("{prefix}.")) {
            let _ = std::fs::remove_file(f.path());
        }
    }
}

/// A cgroup's task count (`pids.current`); 0 when it cannot be read (the
/// pod's cgroup gone meanwhile: it ranks last, nothing fails).
fn pids_current(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join("pids.current"))
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A pod chosen for eviction and how.
struct Victim {
    uid: String,
    pod: Arc<k8s_openapi::api::core::v1::Pod>,
    message: String,
    grace: Duration,
    signal: String,
}

/// A candidate whose use is only known for the whole pod.
fn plain_candidate(uid: String, e: &crate::pods::PodEntry, usage: u64) -> rank::Candidate {
    rank::Candidate {
        priority: e.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        usage,
        request: 0,
        containers: Vec::new(),
        pod: e.pod.clone(),
        uid,
    }
}

/// The event sources that end the wait between rounds (see the module
/// docs); a source that breaks is dropped, not retried.
struct Wakers {
    psi: Option<notify::Source>,
    /// The pods' cgroup's own PSI trigger (cgroup v2).
    pods_psi: Option<notify::Source>,
    events: Option<notify::Source>,
    /// memcg thresholds armed, with their cgroup and level.
    armed: Vec<(PathBuf, u64, notify::Source)>,
    announced: bool,
}

impl Wakers {
    fn new(s: &signals::Sources) -> Wakers {
        let psi = notify::psi(&s.host.proc.join("pressure/memory"))
            .map_err(|e| info!(error = %e, "no PSI memory trigger"))
            .ok();
        let events = s
            .pods
            .as_ref()
            .and_then(|cg| notify::memory_events(cg).ok());
        let pods_psi = s.pods.as_ref().and_then(|cg| {
            notify::cgroup_psi(cg)
                .map_err(|e| debug!(error = %e, "no PSI trigger on the pods' cgroup"))
                .ok()
        });
        Wakers {
            psi,
            pods_psi,
            events,
            armed: Vec::new(),
            announced: false,
        }
    }

    /// Arms a threshold at each level (re-arming those that moved). True
    /// if a cgroup's usage is already at or above its level, which the
    /// kernel will not signal.
    fn arm(&mut self, levels: Vec<(signals::MemCgroup, u64)>) -> bool {
        let mut crossed = false;
        for (cg, level) in levels {
            let same = self
                .armed
                .iter()
                .any(|(d, l, _)| *d == cg.dir && *l == level);
            if !same {
                self.armed.retain(|(d, _, _)| *d != cg.dir);
                match notify::memcg_threshold(&cg, level) {
                    Ok(src) => self.armed.push((cg.dir.clone(), level, src)),
                    Err(e) => {
                        debug!(error = %e, cgroup = %cg.dir.display(), "no memcg threshold");
                        continue;
                    }
                }
            }
            crossed |= cg.usage().is_some_and(|u| u >= level);
        }
        crossed
    }

    fn any(&self) -> bool {
        !self.armed.is_empty()
            || self.psi.is_some()
            || self.pods_psi.is_some()
            || self.events.is_some()
    }

    fn announce_once(&mut self) {
        if std::mem::replace(&mut self.announced, true) {
            return;
        }
        info!(
            memcg_thresholds = self.armed.len(),
            psi = self.psi.is_some(),
            pods_psi = self.pods_psi.is_some(),
            memory_events = self.events.is_some(),
            "eviction manager: memory pressure is watched by these events{}",
            if self.any() {
                ""
            } else {
                " (none: polling every second)"
            }
        );
    }

    /// Waits for a source or `timeout`; says which woke it.
    async fn wait(&mut self, timeout: Duration) -> &'static str {
        async fn next(s: &mut Option<notify::Source>) -> std::io::Result<()> {
            match s.as_mut() {
                Some(s) => s.wait().await,
                None => std::future::pending().await,
            }
        }
        let thresholds = async {
            if self.armed.is_empty() {
                return std::future::pending().await;
            }
            let waits = self.armed.iter_mut().map(|(_, _, s)| Box::pin(s.wait()));
            let (r, i, _) = futures::future::select_all(waits).await;
            (r, i)
        };
        let (by, broken) = tokio::select! {
            _ = tokio::time::sleep(timeout) => ("sync", None),
            (r, i) = thresholds => ("memcg threshold", r.is_err().then_some(Some(i))),
            r = next(&mut self.psi) => ("PSI", r.is_err().then_some(None)),
            r = next(&mut self.pods_psi) => ("pods' PSI", r.is_err().then_some(None)),
            r = next(&mut self.events) => ("memory.events", r.is_err().then_some(None)),
        };
        match (by, broken) {
            ("memcg threshold", Some(Some(i))) => {
                self.armed.remove(i);
            }
            ("PSI", Some(_)) => self.psi = None,
            ("pods' PSI", Some(_)) => self.pods_psi = None,
            ("memory.events", Some(_)) => self.events = None,
            _ => {}
        }
        by
    }
}

/// A pod's memory use from its containers' (by container ID), its
/// requests from its spec.
fn memory_candidate(
    uid: String,
    e: &crate::pods::PodEntry,
    usage_by_id: &BTreeMap<String, u64>,
) -> rank::Candidate {
    let request_of = |name: &str| -> u64 {
        let spec = e.pod.spec.as_ref();
        let c = spec.and_then(|s| s.containers.iter().find(|c| c.name == name));
        c.and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
            .and_then(|q| crate::config::parse_quantity(&q.0).ok())
            .unwrap_or(0)
    };
    let containers: Vec<rank::ContainerUse> = e
        .status
        .container_statuses
        .iter()
        .flatten()
        .map(|s| {
            let id = s.container_id.as_deref().unwrap_or("");
            let id = id.split_once("://").map_or(id, |(_, i)| i);
            rank::ContainerUse {
                name: s.name.clone(),
                usage: usage_by_id.get(id).copied().unwrap_or(0),
                request: request_of(&s.name),
            }
        })
        .collect();
    rank::Candidate {
        priority: e.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        usage: containers.iter().map(|c| c.usage).sum(),
        request: crate::pods::util::pod_requests(&e.pod)
            .1
            .min(u128::from(u64::MAX)) as u64,
        containers,
        pod: e.pod.clone(),
        uid,
    }
}
