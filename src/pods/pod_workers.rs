//! The lifecycle of each pod UID on this node (upstream's `pod_workers`):
//! which UIDs have a worker, in which phase (syncing → terminating →
//! terminated), and the rules that keep a UID from coming back.
//!
//! A worker that has finished while a source still lists its pod (an API
//! pod whose deletion is being written, a finalizer holding it) is
//! remembered as finished and never started again; the UID is forgotten
//! only once no source lists it. A pod that left every source and was
//! added again (a static manifest put back) starts afresh once its old
//! worker has removed everything.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, watch};

use super::worker::{KillRequest, PodUpdate};

/// Where a pod is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Syncing,
    Terminating,
    Terminated,
}

struct Slot {
    phase: Phase,
    tx: watch::Sender<PodUpdate>,
    wake: Arc<Notify>,
    /// The pod is listed again after leaving every source.
    readd: bool,
}

/// Every pod UID the node knows, by phase.
#[derive(Default)]
pub struct PodWorkers {
    slots: HashMap<String, Slot>,
    /// Workers that ended while a source still lists the pod.
    finished: HashSet<String>,
}

/// What the manager does after a worker ended.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterRemoval {
    /// Forget it.
    Forget,
    /// A source still lists it: never start it again.
    Finished,
    /// It was added again meanwhile: start a fresh worker.
    Restart,
}

impl PodWorkers {
    /// Whether `uid` has a worker or has finished: no new worker for it.
    pub fn known(&self, uid: &str) -> bool {
        self.slots.contains_key(uid) || self.finished.contains(uid)
    }

    #[cfg(test)]
    pub fn phase(&self, uid: &str) -> Option<Phase> {
        self.slots.get(uid).map(|s| s.phase)
    }

    /// UIDs with a worker, in any phase.
    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.slots.keys()
    }

    /// UIDs with a worker in the given phase.
    pub fn in_phase(&self, phase: Phase) -> impl Iterator<Item = &String> {
        self.slots
            .iter()
            .filter(move |(_, s)| s.phase == phase)
            .map(|(u, _)| u)
    }

    /// A new worker's channels; the caller spawns the worker.
    pub fn add(&mut self, uid: &str, pod: &Pod) -> (watch::Receiver<PodUpdate>, Arc<Notify>) {
        let (tx, rx) = watch::channel(PodUpdate {
            pod: Arc::new(pod.clone()),
            removed: false,
            kill: None,
        });
        let wake = Arc::new(Notify::new());
        let slot = Slot {
            phase: Phase::Syncing,
            tx,
            wake: wake.clone(),
            readd: false,
        };
        self.slots.insert(uid.to_string(), slot);
        (rx, wake)
    }

    /// Hands a worker its pod's newest spec. A removal already sent
    /// stays: the pod is then re-added once the old worker is done.
    pub fn update(&mut self, uid: &str, pod: &Pod) {
        let Some(s) = self.slots.get_mut(uid) else {
            return;
        };
        let removed = s.tx.borrow().removed;
        if removed {
            s.readd = pod.metadata.deletion_timestamp.is_none();
            return;
        }
        if *s.tx.borrow().pod != *pod {
            s.tx.send_modify(|u| u.pod = Arc::new(pod.clone()));
        }
    }

    /// Tells the workers of pods no source lists any more to remove them,
    /// and forgets finished UIDs that are no longer listed.
    pub fn remove_missing(&mut self, desired: &BTreeMap<String, Pod>) {
        for (uid, s) in &mut self.slots {
            if !desired.contains_key(uid) {
                s.readd = false;
                if !s.tx.borrow().removed {
                    s.tx.send_modify(|u| u.removed = true);
                }
            }
        }
        self.finished.retain(|u| desired.contains_key(u));
    }

    /// Asks a syncing pod to stop (eviction, liveness); `false` if it has
    /// no worker or is already stopping.
    pub fn kill(&mut self, uid: &str, k: KillRequest) -> bool {
        match self.slots.get_mut(uid) {
            Some(s) if s.phase == Phase::Syncing => {
                s.phase = Phase::Terminating;
                s.tx.send_modify(|u| u.kill = Some(k));
                true
            }
            _ => false,
        }
    }

    /// The pod's containers changed: wake its worker.
    pub fn wake(&self, uid: &str) {
        if let Some(s) = self.slots.get(uid) {
            s.wake.notify_one();
        }
    }

    /// The worker reports every container stopped.
    pub fn terminated(&mut self, uid: &str) {
        if let Some(s) = self.slots.get_mut(uid) {
            s.phase = Phase::Terminated;
        }
    }

    /// The worker ended; `listed`: a source still lists the UID.
    pub fn removed(&mut self, uid: &str, listed: bool) -> AfterRemoval {
        let readd = self.slots.remove(uid).is_some_and(|s| s.readd);
        match (listed, readd) {
            (false, _) => AfterRemoval::Forget,
            (true, true) => AfterRemoval::Restart,
            (true, false) => {
                self.finished.insert(uid.to_string());
                AfterRemoval::Finished
            }
        }
    }

    /// How many UIDs are tracked: with workers, and finished.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        (self.slots.len(), self.finished.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, deleting: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        if deleting {
            p.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            );
        }
        p
    }

    fn desired(pods: &[Pod]) -> BTreeMap<String, Pod> {
        pods.iter()
            .map(|p| (p.metadata.uid.clone().unwrap(), p.clone()))
            .collect()
    }

    #[test]
    fn a_finished_pod_still_listed_never_comes_back() {
        let mut w = PodWorkers::default();
        let (rx, _) = w.add("u", &pod("u", false));
        w.update("u", &pod("u", true));
        assert!(rx.borrow().pod.metadata.deletion_timestamp.is_some());
        w.terminated("u");
        assert_eq!(w.phase("u"), Some(Phase::Terminated));
        assert_eq!(w.removed("u", true), AfterRemoval::Finished);
        // The deleting pod stays in the snapshot: still known, no worker.
        w.remove_missing(&desired(&[pod("u", true)]));
        assert!(w.known("u"));
        // Gone from the API at last: forgotten.
        w.remove_missing(&desired(&[]));
        assert!(!w.known("u"));
        assert_eq!(w.len(), (0, 0));
    }

    #[test]
    fn a_pod_added_again_while_removed_restarts_after() {
        let mut w = PodWorkers::default();
        let (rx, _) = w.add("u", &pod("u", false));
        w.remove_missing(&desired(&[]));
        assert!(rx.borrow().removed);
        w.update("u", &pod("u", false));
        assert!(rx.borrow().removed, "a removal is never taken back");
        assert_eq!(w.removed("u", true), AfterRemoval::Restart);
    }

    #[test]
    fn removed_and_gone_is_forgotten() {
        let mut w = PodWorkers::default();
        w.add("u", &pod("u", false));
        w.remove_missing(&desired(&[]));
        assert_eq!(w.removed("u", false), AfterRemoval::Forget);
        assert!(!w.known("u"));
    }

    #[test]
    fn a_kill_reaches_a_syncing_worker_once() {
        let mut w = PodWorkers::default();
        let (rx, _) = w.add("u", &pod("u", false));
        let k = KillRequest {
            reason: "Evicted".into(),
            message: "m".into(),
            grace: None,
        };
        assert!(w.kill("u", k.clone()));
        assert_eq!(rx.borrow().kill, Some(k.clone()));
        assert!(!w.kill("u", k.clone()));
        assert!(!w.kill("other", k));
    }
}
