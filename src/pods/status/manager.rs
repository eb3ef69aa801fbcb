//! The status manager: the single writer of pod statuses, as upstream's
//! `status_manager`. Workers report what they computed; this keeps the
//! newest status per pod UID, carries each condition's
//! `lastTransitionTime` over while its status stays the same, writes the
//! local record (`<root-dir>/pods/<uid>.json`, what `kinglet pods ls`
//! reads), and, when connected, hands the status to the API writer
//! ([`crate::pods::status::api_writer`]), which coalesces and retries.
//!
//! It also exposes a read-only [`StatusView`] of the pods and their
//! statuses, for the kubelet API, eviction and the CLI.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::fsutil::{Flush, write_private_atomic};
use crate::pods::status::api_writer::{ApiWriter, TRANSIENT_CONDITIONS};

/// How long a write may take to come back through the watch: the
/// manager's reconcile period.
pub const WATCH_LAG: Duration = Duration::from_secs(10);

/// What `kinglet pods ls` reads: `<root-dir>/pods/<uid>.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub source: String,
    pub status: PodStatus,
    /// What each resizable container is allocated (in-place resize), so
    /// a restart mid-resize carries on from it; older records have none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: BTreeMap<String, ResourceRequirements>,
}

/// One pod as the rest of kinglet may read it (the kubelet API and
/// eviction are its readers to come; the lifecycle tests read it today).
#[derive(Clone, Debug)]
#[allow(dead_code)]
pub struct PodEntry {
    pub pod: Arc<Pod>,
    pub status: Arc<PodStatus>,
}

/// A read-only view of the pods the node runs, by UID.
#[derive(Clone, Debug, Default)]
#[allow(dead_code)]
pub struct StatusView(Arc<RwLock<BTreeMap<String, PodEntry>>>);

#[allow(dead_code)]
impl StatusView {
    /// A copy of every entry (cheap: pods and statuses are shared).
    pub fn pods(&self) -> Vec<(String, PodEntry)> {
        let m = self.0.read().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The entry of one pod.
    pub fn get(&self, uid: &str) -> Option<PodEntry> {
        let m = self.0.read().unwrap_or_else(|e| e.into_inner());
        m.get(uid).cloned()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, PodEntry>> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sets each condition's `lastTransitionTime`: the previous status's time
/// where that condition kept its status, `now` where it changed or is new.
pub fn carry_transitions(prev: Option<&PodStatus>, new: &mut PodStatus, now: &Time) {
    for c in new.conditions.iter_mut().flatten() {
        let before = prev
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|p| p.type_ == c.type_));
        c.last_transition_time = match before {
            Some(b) if b.status == c.status && b.last_transition_time.is_some() => {
                b.last_transition_time.clone()
            }
            _ => Some(now.clone()),
        };
    }
}

/// Compares two statuses ignoring condition transition times.
pub fn same(a: &PodStatus, b: &PodStatus) -> bool {
    let strip = |s: &PodStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_transition_time = None;
        }
        s
    };
    strip(a) == strip(b)
}

/// Upstream's `isPodStatusByKubeletEqual`, on what round-trips exactly:
/// the phase, each condition kinglet sets (status, reason, message; not
/// its times, nor conditions others add), and each container's name,
/// readiness, start and restart count.
pub fn same_by_kubelet(ours: &PodStatus, theirs: &PodStatus) -> bool {
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    let conditions_match = ours.conditions.iter().flatten().all(|c| {
        theirs
            .conditions
            .iter()
            .flatten()
            .find(|t| t.type_ == c.type_)
            .is_some_and(|t| {
                t.status == c.status
                    && text(&t.reason) == text(&c.reason)
                    && text(&t.message) == text(&c.message)
            })
    });
    // One of ours the API still has but we dropped.
    let stale = theirs.conditions.iter().flatten().any(|t| {
        TRANSIENT_CONDITIONS.contains(&t.type_.as_str())
            && !ours.conditions.iter().flatten().any(|c| c.type_ == t.type_)
    });
    let containers = |s: &PodStatus| -> Vec<(String, bool, Option<bool>, i32)> {
        [&s.init_container_statuses, &s.container_statuses]
            .into_iter()
            .flatten()
            .flatten()
            .map(|c| (c.name.clone(), c.ready, c.started, c.restart_count))
            .collect()
    };
    text(&ours.phase) == text(&theirs.phase)
        && conditions_match
        && !stale
        && containers(ours) == containers(theirs)
}

/// `<dir>/<uid>.json`, if the UID makes one plain file name there.
fn record_path(dir: &Path, uid: &str) -> Option<PathBuf> {
    crate::pods::util::contained_child(dir, &format!("{uid}.json"))
}

/// The previous run's record of a pod, if any (a restart adopts it).
pub fn read_record(dir: &Path, uid: &str) -> Option<PodRecord> {
    let b = std::fs::read(record_path(dir, uid)?).ok()?;
    serde_json::from_slice(&b).ok()
}

/// The single writer of pod statuses. Owned by the pod manager's task.
pub struct StatusManager {
    dir: PathBuf,
    /// Shared with the view: one copy per status.
    latest: HashMap<String, Arc<PodStatus>>,
    /// The pods whose status this run computed (not only adopted from the
    /// record of the last): the only ones reconciled with the API.
    computed: HashSet<String>,
    /// When each pod's status was last queued for the API: the watch may
    /// not have brought a write back yet, so a reconcile waits a period.
    written: HashMap<String, Instant>,
    view: StatusView,
    api: Option<ApiWriter>,
    /// Where a pod's first start to Running is observed
    /// (`kubelet_pod_start_duration_seconds`).
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Each pod's allocation, kept in its record.
    allocated: HashMap<String, BTreeMap<String, ResourceRequirements>>,
}

impl StatusManager {
    /// Observes pod start durations into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn new(dir: PathBuf, api: Option<ApiWriter>) -> Self {
        if let Err(e) = std::fs::create_dir_all(&dir) {
            warn!(dir = %dir.display(), error = %e, "cannot create the pod status dir");
        }
        StatusManager {
            dir,
            latest: HashMap::new(),
            computed: HashSet::new(),
            written: HashMap::new(),
            view: StatusView::default(),
            api,
            metrics: None,
            allocated: HashMap::new(),
        }
    }

    #[allow(dead_code)] // for the kubelet API and eviction; tests read it
    pub fn view(&self) -> StatusView {
        self.view.clone()
    }

    /// The newest status of a pod.
    pub fn get(&self, uid: &str) -> Option<&PodStatus> {
        self.latest.get(uid).map(|s| &**s)
    }

    /// A pod whose worker starts: the previous run's record, if any, is
    /// taken as its newest status (so transition times carry on) and its
    /// start time returned.
    pub fn adopt(&mut self, uid: &str) -> Option<Time> {
        let rec = read_record(&self.dir, uid)?;
        let start = rec.status.start_time.clone();
        if !rec.allocated.is_empty() {
            self.allocated.insert(uid.to_string(), rec.allocated);
        }
        self.latest.insert(uid.to_string(), Arc::new(rec.status));
        start
    }

    /// The allocation the pod's record holds (see [`Self::adopt`]).
    pub fn allocation(&self, uid: &str) -> Option<&BTreeMap<String, ResourceRequirements>> {
        self.allocated.get(uid)
    }

    /// Keeps the pod's allocation in its record (written now if it
    /// changed and the pod has a status to write with it).
    pub fn set_allocation(
        &mut self,
        uid: &str,
        pod: &Pod,
        alloc: &BTreeMap<String, ResourceRequirements>,
    ) {
        if self.allocated.get(uid) == Some(alloc) {
            return;
        }
        self.allocated.insert(uid.to_string(), alloc.clone());
        if let Some(st) = self.latest.get(uid).cloned() {
            self.write_record(uid, pod, &st);
        }
    }

    /// Takes a computed status; writes it only if it changed.
    pub fn set(&mut self, uid: &str, pod: &Pod, mut status: PodStatus) {
        let prev = self.latest.get(uid).map(|s| &**s);
        if prev.is_some_and(|p| same(p, &status)) {
            return;
        }
        let running = |s: &PodStatus| s.phase.as_deref() == Some("Running");
        if running(&status)
            && !prev.is_some_and(running)
            && let (Some(m), Some(start)) = (&self.metrics, &status.start_time)
        {
            let since = jiff::Timestamp::now().duration_since(start.0);
            m.pod_started(Duration::try_from(since).unwrap_or_default());
        }
        // The API keeps whole seconds; so do the records a restart reads.
        let now =
            jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap_or_default();
        carry_transitions(prev, &mut status, &Time(now));
        self.write_record(uid, pod, &status);
        let status = Arc::new(status);
        self.view.write().insert(
            uid.to_string(),
            PodEntry {
                pod: Arc::new(pod.clone()),
                status: status.clone(),
            },
        );
        if let Some(api) = &self.api {
            api.status(pod, &status);
        }
        self.written.insert(uid.to_string(), Instant::now());
        self.latest.insert(uid.to_string(), status);
        self.computed.insert(uid.to_string());
    }

    /// Upstream's `needsReconcile`: where the API shows a pod a status
    /// other than the one last written (what kinglet owns of it: phase,
    /// its conditions, its containers' readiness and restarts), the
    /// newest status is written again. The node lifecycle controller
    /// marks a silent node's pods not Ready; without this, a status that
    /// did not change while the node was away would never set it right.
    /// Returns whether a write was queued.
    pub fn reconcile(&self, uid: &str, pod: &Pod, in_api: &PodStatus) -> bool {
        // A status adopted from the last run's record is not written
        // back: the pod's worker computes a current one first.
        let Some(ours) = self.latest.get(uid).filter(|_| self.computed.contains(uid)) else {
            return false;
        };
        // The API's copy comes through the watch, which lags behind a
        // write: one written less than a reconcile period ago is not
        // written twice (a pod being deleted would cost the API an extra
        // request for nothing).
        if self
            .written
            .get(uid)
            .is_some_and(|t| t.elapsed() < WATCH_LAG)
        {
            return false;
        }
        if same_by_kubelet(ours, in_api) {
            return false;
        }
        debug!(
            uid,
            "the API shows another pod status than the last written; writing it again"
        );
        if let Some(api) = &self.api {
            api.status(pod, ours);
        }
        true
    }

    /// An event about a pod (Normal or Warning).
    pub fn event(&self, pod: &Pod, type_: &'static str, reason: &str, message: &str) {
        if let Some(api) = &self.api {
            api.event(pod, type_, reason, message);
        }
    }

    /// The pod's worker finished: its record goes, and the API object is
    /// deleted (an API pod being deleted) or its mirror removed (static).
    pub fn terminated(&mut self, uid: &str, pod: &Pod) {
        self.forget(uid);
        // Its log dir goes a minute later; the marker says so to the next
        // run if kinglet stops before then.
        if let Some(m) = self.log_marker(uid) {
            let _ = std::fs::write(m, b"");
        }
        if let Some(api) = &self.api {
            api.finish(pod);
        }
    }

    /// The marker of a removed pod whose log dir is still to go.
    pub fn log_marker(&self, uid: &str) -> Option<PathBuf> {
        crate::pods::util::contained_child(&self.dir, &format!("{uid}.logs"))
    }

    /// Drops what is known of a pod that never ran (no API call).
    pub fn forget(&mut self, uid: &str) {
        self.latest.remove(uid);
        self.allocated.remove(uid);
        self.computed.remove(uid);
        self.written.remove(uid);
        self.view.write().remove(uid);
        if let Some(p) = record_path(&self.dir, uid) {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Drops the records of pods no source wants (after `SourcesReady`),
    /// the log markers of pods removed before the last stop, and the temp
    /// files a crash (or a full disk) left; returns the UIDs whose log
    /// dirs are to go.
    pub fn remove_stale_records(&mut self, desired: &BTreeSet<String>) -> BTreeSet<String> {
        let mut gone = BTreeSet::new();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return gone;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            } else if let Some(uid) = name.strip_suffix(".logs") {
                let _ = std::fs::remove_file(e.path());
                gone.insert(uid.to_string());
            } else if let Some(uid) = name.strip_suffix(".json")
                && !name.starts_with("api-")
                && !desired.contains(uid)
            {
                self.forget(uid);
                gone.insert(uid.to_string());
            }
        }
        gone
    }

    fn write_record(&self, uid: &str, pod: &Pod, status: &PodStatus) {
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
            allocated: self.allocated.get(uid).cloned().unwrap_or_default(),
        };
        let Some(path) = record_path(&self.dir, uid) else {
            return;
        };
        if let Ok(data) = serde_json::to_vec(&rec)
            // Not flushed to disk: a record is a cache of the status (for
            // `pods ls` and a restart), and a flush would block the task.
            && let Err(e) = write_private_atomic(&path, &data, Flush::No)
        {
            warn!(uid, error = %e, "cannot write the pod record");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodCondition;

    fn status(ready: &str) -> PodStatus {
        PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                },
                PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }
    }

    fn at(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(s).unwrap())
    }

    fn times(s: &PodStatus) -> Vec<Option<Time>> {
        s.conditions
            .iter()
            .flatten()
            .map(|c| c.last_transition_time.clone())
            .collect()
    }

    #[test]
    fn conditions_keep_their_time_until_they_change() {
        let mut first = status("False");
        carry_transitions(None, &mut first, &at(100));
        assert_eq!(times(&first), [Some(at(100)), Some(at(100))]);
        let mut same_again = status("False");
        carry_transitions(Some(&first), &mut same_again, &at(200));
        assert_eq!(times(&same_again), [Some(at(100)), Some(at(100))]);
        let mut ready = status("True");
        carry_transitions(Some(&same_again), &mut ready, &at(300));
        assert_eq!(times(&ready), [Some(at(300)), Some(at(100))]);
    }

    #[test]
    fn records_are_written_once_per_change_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = StatusManager::new(dir.path().to_path_buf(), None);
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.uid = Some("u1".into());
        m.set("u1", &pod, status("False"));
        let t1 = m.get("u1").unwrap().conditions.clone();
        m.set("u1", &pod, status("False"));
        assert_eq!(m.get("u1").unwrap().conditions, t1);
        assert!(read_record(dir.path(), "u1").is_some());
        assert_eq!(m.view().pods().len(), 1);
        m.terminated("u1", &pod);
        assert!(read_record(dir.path(), "u1").is_none());
        assert!(m.view().get("u1").is_none());
        // Stopped before its log dir went, and a temp file a full disk
        // left: the next start names the pod gone and removes both.
        std::fs::write(dir.path().join("u2.json.tmp"), b"").unwrap();
        let mut next = StatusManager::new(dir.path().to_path_buf(), None);
        let gone = next.remove_stale_records(&BTreeSet::new());
        assert_eq!(gone, BTreeSet::from(["u1".to_string()]));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_adopted_pod_keeps_its_recorded_transition_times() {
        let dir = tempfile::tempdir().unwrap();
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let mut m = StatusManager::new(dir.path().to_path_buf(), None);
        m.set("u1", &pod, status("True"));
        let before = times(m.get("u1").unwrap());
        drop(m);
        let mut again = StatusManager::new(dir.path().to_path_buf(), None);
        again.adopt("u1");
        let mut changed = status("True");
        changed.phase = Some("Pending".into());
        again.set("u1", &pod, changed);
        assert_eq!(times(again.get("u1").unwrap()), before);
    }

    /// The node lifecycle controller marked the pod not Ready while the
    /// node was away; kinglet's own status never changed since.
    #[tokio::test(start_paused = true)]
    async fn a_status_the_api_shows_otherwise_is_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = StatusManager::new(dir.path().to_path_buf(), None);
        let pod = crate::pods::test_pod("u1");
        m.set("u1", &pod, status("True"));
        let mut in_api = m.get("u1").unwrap().clone();
        let mut stale = in_api.clone();
        stale.phase = Some("Pending".into());
        assert!(
            !m.reconcile("u1", &pod, &stale),
            "a write the watch has not brought back yet"
        );
        tokio::time::advance(WATCH_LAG).await;
        assert!(!m.reconcile("u1", &pod, &in_api), "same status");
        // What the API adds or drops of its own changes nothing.
        if let Some(cs) = in_api.conditions.as_mut() {
            cs.push(PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                ..Default::default()
            });
            cs[0].reason = Some(String::new());
            cs[0].last_transition_time = None;
        }
        assert!(
            !m.reconcile("u1", &pod, &in_api),
            "only others' fields differ"
        );
        let mut marked = in_api.clone();
        if let Some(cs) = marked.conditions.as_mut() {
            cs[0].status = "False".into();
        }
        assert!(m.reconcile("u1", &pod, &marked), "Ready marked False");
        assert!(!m.reconcile("gone", &pod, &marked), "a pod with no status");
        let mut next = StatusManager::new(dir.path().to_path_buf(), None);
        next.adopt("u1");
        assert!(
            !next.reconcile("u1", &pod, &marked),
            "a status only adopted from the last run's record"
        );
        let mut restarted = in_api;
        restarted.container_statuses = Some(vec![Default::default()]);
        assert!(!same_by_kubelet(m.get("u1").unwrap(), &restarted));
        let mut pending = m.get("u1").unwrap().clone();
        pending
            .conditions
            .get_or_insert_with(Vec::new)
            .push(PodCondition {
                type_: "PodResizePending".into(),
                status: "True".into(),
                ..Default::default()
            });
        assert!(
            !same_by_kubelet(m.get("u1").unwrap(), &pending),
            "a resize condition the API still shows"
        );
    }
}
