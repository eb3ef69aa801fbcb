//! The pod lifecycle event generator (upstream's `pleg/`): relists the
//! runtime's containers, keeps a per-pod cache stamped with the time of
//! the relist it came from, and tells which pods changed, so only their
//! workers wake.
//!
//! A worker that just acted on the runtime asks for a cache from a relist
//! that started after its action ([`PodCache::newer_than`]); that requests
//! a relist at once instead of waiting for the next tick (upstream's
//! `GetNewerThan`, without its one-second wait). Relists are numbered as
//! they start, so "newer" holds even when a relist was under way while the
//! worker acted. Runtimes that stream container events (the in-process
//! runtime) wake the relist at each exit; for them the periodic relist is a
//! safety net run every [`RELIST_PERIOD_WITH_EVENTS`] (upstream's evented
//! PLEG keeps one too), for the others it runs every [`RELIST_PERIOD`]. The manager
//! beats a heartbeat after each successful relist; it is stale after
//! upstream's `relistThreshold` (3 minutes) and fails `/healthz`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kinglet_runtime::{ContainerStatus, Runtime, RuntimeError};
use tokio::sync::{Notify, watch};

/// Upstream's generic PLEG `relistPeriod`.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);

/// The safety-net relist when the runtime streams events. Shorter than
/// upstream's evented PLEG (300 s): an event lost to a monitor restart is
/// noticed within seconds.
pub const RELIST_PERIOD_WITH_EVENTS: Duration = Duration::from_secs(10);

/// Upstream's `relistThreshold`: a relist older than this is unhealthy.
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// The containers of each pod as of the last successful relist.
#[derive(Debug)]
pub struct PodCache {
    pods: Mutex<HashMap<String, Arc<[ContainerStatus]>>>,
    /// How many relists have started.
    started: AtomicU64,
    /// The start number of the last successful relist.
    completed: watch::Sender<u64>,

    /// Asks the relist to run now.
    want: Notify,
}

impl Default for PodCache {
    fn default() -> Self {
        PodCache {
            pods: Mutex::new(HashMap::new()),
            started: AtomicU64::new(0),
            completed: watch::Sender::new(0),

            want: Notify::new(),
        }
    }
}

impl PodCache {
    /// The pod's containers in the cache, however old.
    pub fn get(&self, uid: &str) -> Arc<[ContainerStatus]> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.get(uid).cloned().unwrap_or_else(|| Arc::from([]))
    }

    /// A mark for "now": relists that start later are newer than it.
    pub fn mark(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// The pod's containers from a relist that started after `mark`; asks
    /// for one and waits for it.
    pub async fn newer_than(&self, uid: &str, mark: u64) -> Arc<[ContainerStatus]> {
        let mut rx = self.completed.subscribe();
        if *rx.borrow() <= mark {
            self.want.notify_one();
            let _ = rx.wait_for(|n| *n > mark).await;
        }
        self.get(uid)
    }

    /// Resolves when a worker wants a fresh relist.
    pub async fn wanted(&self) {
        self.want.notified().await
    }
}

/// The relist itself; owned by the pod manager.
pub struct Pleg {
    runtime: Arc<dyn Runtime>,
    cache: Arc<PodCache>,
}

impl Pleg {
    pub fn new(runtime: Arc<dyn Runtime>) -> Self {
        Pleg {
            runtime,
            cache: Arc::new(PodCache::default()),
        }
    }

    pub fn cache(&self) -> Arc<PodCache> {
        self.cache.clone()
    }

    /// Lists the runtime's containers, updates the cache, and returns the
    /// UIDs of pods whose containers changed (appeared, changed state, or
    /// went away).
    pub async fn relist(&self) -> Result<Vec<String>, RuntimeError> {
        let n = self.cache.started.fetch_add(1, Ordering::Relaxed) + 1;
        let all = self.runtime.list_containers().await?;
        let mut grouped: HashMap<String, Vec<ContainerStatus>> = HashMap::new();
        for c in all {
            grouped.entry(c.pod_uid.clone()).or_default().push(c);
        }
        for v in grouped.values_mut() {
            v.sort_by(|a, b| a.id.cmp(&b.id));
        }
        let changed = {
            let mut pods = self.cache.pods.lock().unwrap_or_else(|e| e.into_inner());
            let mut changed: Vec<String> = pods
                .keys()
                .filter(|u| !grouped.contains_key(*u))
                .cloned()
                .collect();
            for (uid, v) in &grouped {
                if pods.get(uid).is_none_or(|old| **old != **v) {
                    changed.push(uid.clone());
                }
            }
            *pods = grouped
                .into_iter()
                .map(|(k, v)| (k, Arc::from(v)))
                .collect();
            changed
        };
        self.cache.completed.send_replace(n);
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinglet_runtime::fake::FakeRuntime;
    use kinglet_runtime::{ContainerConfig, SandboxConfig};

    #[tokio::test(start_paused = true)]
    async fn relist_tells_which_pods_changed() {
        let rt = Arc::new(FakeRuntime::new());
        let pleg = Pleg::new(rt.clone());
        assert!(pleg.relist().await.unwrap().is_empty());
        let sb = SandboxConfig {
            pod_uid: "u1".into(),
            ..Default::default()
        };
        let s = rt.run_pod_sandbox(&sb).await.unwrap();
        let cfg = ContainerConfig {
            name: "c".into(),
            ..Default::default()
        };
        let id = rt.create_container(&s.id, &cfg, &sb).await.unwrap();
        assert_eq!(pleg.relist().await.unwrap(), ["u1"]);
        assert!(pleg.relist().await.unwrap().is_empty());
        rt.start_container(&id).await.unwrap();
        assert_eq!(pleg.relist().await.unwrap(), ["u1"]);
        rt.remove_container(&id).await.unwrap();
        assert_eq!(pleg.relist().await.unwrap(), ["u1"]);
        assert!(pleg.cache().get("u1").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn newer_than_waits_for_a_relist_it_asked_for() {
        let rt = Arc::new(FakeRuntime::new());
        let pleg = Pleg::new(rt);
        let cache = pleg.cache();
        pleg.relist().await.unwrap();
        let mark = cache.mark();
        let waiter = tokio::spawn({
            let c = cache.clone();
            async move { c.newer_than("u", mark).await.len() }
        });
        // The waiter asks; the manager's loop answers with a relist.
        tokio::time::timeout(Duration::from_secs(1), cache.wanted())
            .await
            .unwrap();
        assert!(!waiter.is_finished());
        pleg.relist().await.unwrap();
        assert_eq!(waiter.await.unwrap(), 0);
    }
}
