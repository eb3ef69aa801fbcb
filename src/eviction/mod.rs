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
//! Evicted for now: memory and PID signals. Disk signals set
//! `DiskPressure` (and admission refuses pods under it) but evict nothing
//! yet: upstream reclaims images and dead containers first, and per-pod
//! disk usage is not measured here yet.

pub mod notify;
pub mod rank;
pub mod signals;
pub mod thresholds;

use std::collections::BTreeMap;
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

/// Signals that evict pods today (see the module docs).
fn evicts(signal: &str) -> bool {
    signal.contains("emory") || signal == "pid.available"
}

impl Manager {
    pub async fn run(self, stop: CancellationToken) {
        let mut state = Round::default();
        let mut psi = notify::psi(&self.settings.sources.host.proc.join("pressure/memory"));
        if let Err(e) = &psi {
            info!(error = %e, "no PSI memory trigger");
        }
        let mut events = self
            .settings
            .sources
            .pods
            .as_ref()
            .map(notify::memory_events);
        let mut armed: Option<notify::Source> = None;
        let mut last_armed = 0u64;
        let mut announced = false;
        let mut woke = ("start", Instant::now());
        loop {
            let (obs, evicted) = self.synchronize(&mut state, woke).await;
            // Re-arm the memcg threshold where the pods' working set would
            // meet the tightest memory threshold.
            if let Some(level) = self.memcg_level(&obs)
                && level != last_armed
            {
                armed = self.settings.sources.pods.as_ref().and_then(|cg| {
                    match notify::memcg_threshold(cg, level) {
                        Ok(s) => Some(s),
                        Err(e) => {
                            warn!(error = %e, cgroup = %cg.dir.display(), "cannot arm a memcg threshold");
                            None
                        }
                    }
                });
                debug!(level, armed = armed.is_some(), "memcg threshold armed");
                last_armed = level;
            }
            let have_events =
                armed.is_some() || psi.is_ok() || events.as_ref().is_some_and(|e| e.is_ok());
            if !announced {
                announced = true;
                info!(
                    memcg_threshold = armed.is_some(),
                    psi = psi.is_ok(),
                    memory_events = events.as_ref().is_some_and(|e| e.is_ok()),
                    "eviction manager: memory pressure is watched by these events{}",
                    if have_events {
                        ""
                    } else {
                        " (none: polling every second)"
                    }
                );
            }
            let wait = if evicted || !have_events {
                Duration::from_secs(1)
            } else {
                self.settings.housekeeping
            };
            let armed_wait = async {
                match armed.as_mut() {
                    Some(s) => s.wait().await,
                    None => std::future::pending().await,
                }
            };
            let psi_wait = async {
                match psi.as_mut() {
                    Ok(s) => s.wait().await,
                    Err(_) => std::future::pending().await,
                }
            };
            let events_wait = async {
                match events.as_mut() {
                    Some(Ok(s)) => s.wait().await,
                    _ => std::future::pending().await,
                }
            };
            // Which source broke, if one did: it is dropped, not retried.
            let (by, broken) = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => ("sync", None),
                r = armed_wait => ("memcg threshold", r.is_err().then_some(0)),
                r = psi_wait => ("PSI", r.is_err().then_some(1)),
                r = events_wait => ("memory.events", r.is_err().then_some(2)),
            };
            woke = (by, Instant::now());
            match broken {
                Some(0) => armed = None,
                Some(1) => psi = Err(std::io::Error::other("the PSI trigger failed")),
                Some(2) => events = None,
                _ => {}
            }
        }
    }

    /// The v1 usage level of the pods' cgroup at which the tightest
    /// `allocatableMemory.available` threshold is met: capacity −
    /// threshold + inactive file pages (usage counts them, the working
    /// set does not), as upstream's memory threshold notifier.
    fn memcg_level(&self, obs: &Observations) -> Option<u64> {
        let o = obs.get("allocatableMemory.available")?;
        let cg = self.settings.sources.pods.as_ref()?;
        let tightest = self
            .settings
            .thresholds
            .iter()
            .filter(|t| t.signal == "allocatableMemory.available")
            .map(|t| t.value.resolve(o.capacity))
            .max()?;
        let inactive = cg.inactive_file().unwrap_or(0);
        Some(o.capacity.saturating_sub(tightest).saturating_add(inactive))
    }

    /// One round: observe, publish the conditions, evict at most one pod
    /// (none while the last one evicted is still terminating, up to 30 s,
    /// as upstream waits for its cleanup). `woke`: what started the round
    /// and when (for the log).
    async fn synchronize(
        &self,
        round: &mut Round,
        woke: (&'static str, Instant),
    ) -> (Observations, bool) {
        let state = &mut round.state;
        let sources = self.settings.sources.clone();
        let obs = tokio::task::spawn_blocking(move || signals::observe(&sources))
            .await
            .unwrap_or_default();
        let now = Instant::now();
        let met = state.observe(&self.settings.thresholds, &obs, now);
        self.pressure
            .set(state.conditions(now, self.settings.transition));
        let Some(t) = met
            .iter()
            .map(|&i| &self.settings.thresholds[i])
            .find(|t| evicts(&t.signal))
        else {
            return (obs, false);
        };
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
        }
        round.pending = self
            .evict_one(t, &obs, woke)
            .await
            .map(|uid| (uid, Instant::now()));
        let evicted = round.pending.is_some();
        (obs, evicted)
    }

    /// Evicts the first pod in rank for `t`'s resource.
    async fn evict_one(
        &self,
        t: &Threshold,
        obs: &Observations,
        woke: (&'static str, Instant),
    ) -> Option<String> {
        let mut candidates = self.candidates().await;
        if candidates.is_empty() {
            warn!(signal = %t.signal, "eviction threshold met but no pod can be evicted");
            return None;
        }
        rank::rank(&mut candidates);
        let c = &candidates[0];
        let o = obs.get(t.signal.as_str()).copied();
        let capacity = o.map_or(0, |o| o.capacity);
        let resource = thresholds::resource_of(&t.signal);
        let threshold = match t.value {
            crate::config::ThresholdValue::Quantity(q) => rank::quantity(q),
            crate::config::ThresholdValue::Percent(_) => rank::quantity(t.value.resolve(capacity)),
        };
        let available = rank::quantity(o.map_or(0, |o| o.available));
        let message = rank::message(resource, &threshold, &available, c);
        let grace = if t.is_hard() {
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
        let name = crate::pods::convert::pod_name(&c.pod);
        let decided_in = woke.1.elapsed();
        warn!(pod = %name, signal = %t.signal, woken_by = woke.0, ?decided_in, %message, "evicting");
        self.metrics
            .evictions
            .get_or_create(&crate::metrics::SignalLabels {
                eviction_signal: t.signal.clone(),
            })
            .inc();
        let k = KillRequest {
            reason: crate::pods::EVICTED.into(),
            message,
            grace: Some(grace),
        };
        self.killer.kill(&c.uid, k).await;
        Some(c.uid.clone())
    }

    /// The pods that may be evicted, with their memory use and requests.
    async fn candidates(&self) -> Vec<rank::Candidate> {
        let usage = self.runtime.container_stats().await.unwrap_or_default();
        let mut by_id: BTreeMap<String, u64> = BTreeMap::new();
        for u in usage {
            by_id.insert(u.id, u.memory_working_set_bytes);
        }
        self.view
            .pods()
            .into_iter()
            .filter(|(_, e)| {
                let phase = e.status.phase.as_deref().unwrap_or("Pending");
                phase != "Succeeded" && phase != "Failed" && !rank::is_critical(&e.pod)
            })
            .map(|(uid, e)| candidate(uid, &e, &by_id))
            .collect()
    }
}

/// A pod's usage from its containers' (by container ID), its requests
/// from its spec.
fn candidate(
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
        request: crate::pods::admit::requests(&e.pod)
            .1
            .min(u128::from(u64::MAX)) as u64,
        containers,
        pod: e.pod.clone(),
        uid,
    }
}
