//! Which thresholds are met, as upstream's `helpers.go` decides it (pure
//! functions over observations, unit-tested): a hard threshold is met the
//! moment its signal's available quantity is below it; a soft one once it
//! has been below for its grace period; a met threshold stays met until
//! the signal is above the threshold plus `evictionMinimumReclaim`; node
//! conditions hold for `evictionPressureTransitionPeriod` after their
//! last threshold went away.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{EvictionThresholds, ThresholdValue};

/// One signal's reading: how much is available out of how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

pub type Observations = BTreeMap<&'static str, Observation>;

/// A threshold of the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub signal: String,
    pub value: ThresholdValue,
    /// Zero for a hard threshold.
    pub grace: Duration,
    pub minimum_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace.is_zero()
    }
}

/// Every configured threshold, hard ones first.
pub fn all(t: &EvictionThresholds) -> Vec<Threshold> {
    let mk = |signal: &String, value: &ThresholdValue, grace| Threshold {
        signal: signal.clone(),
        value: *value,
        grace,
        minimum_reclaim: t.minimum_reclaim.get(signal).cloned(),
    };
    t.hard
        .iter()
        .map(|(s, v)| mk(s, v, Duration::ZERO))
        .chain(t.soft.iter().map(|(s, (v, g))| mk(s, v, *g)))
        .collect()
}

/// Thresholds that would always be met (at or above their signal's whole
/// capacity: `memory.available<4Gi` on a 2 GB board): evicting for them
/// would never end. Their indices.
pub fn always_met(thresholds: &[Threshold], obs: &Observations) -> Vec<usize> {
    thresholds
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            obs.get(t.signal.as_str())
                .is_some_and(|o| t.value.resolve(o.capacity) >= o.capacity)
        })
        .map(|(i, _)| i)
        .collect()
}

/// The node condition a signal drives.
pub fn condition_of(signal: &str) -> &'static str {
    match signal {
        "memory.available" | "allocatableMemory.available" => "MemoryPressure",
        "pid.available" => "PIDPressure",
        _ => "DiskPressure",
    }
}

/// The resource a signal measures, as eviction messages name it.
pub fn resource_of(signal: &str) -> &'static str {
    match signal {
        "memory.available" | "allocatableMemory.available" => "memory",
        "pid.available" => "pids",
        s if s.ends_with("inodesFree") => "inodes",
        _ => "ephemeral-storage",
    }
}

/// What the manager remembers between observations.
#[derive(Debug, Default)]
pub struct State {
    /// Since when each threshold (by index) has been crossed.
    first_seen: BTreeMap<usize, Instant>,
    /// Thresholds met at the last observation (kept until reclaimed past
    /// the minimum reclaim).
    met: Vec<usize>,
    /// When each node condition was last observed.
    conditions: BTreeMap<&'static str, Instant>,
}

impl State {
    /// Updates the state with `obs` at `now`; returns the thresholds met
    /// (indices into `thresholds`, hard before soft).
    pub fn observe(
        &mut self,
        thresholds: &[Threshold],
        obs: &Observations,
        now: Instant,
    ) -> Vec<usize> {
        let mut met = Vec::new();
        for (i, t) in thresholds.iter().enumerate() {
            let Some(o) = obs.get(t.signal.as_str()) else {
                // No reading (a vanished cgroup, an unreadable filesystem):
                // neither met nor cleared on a guess.
                if self.met.contains(&i) {
                    met.push(i);
                }
                continue;
            };
            let limit = t.value.resolve(o.capacity);
            let crossed = o.available < limit;
            // Once met, the threshold holds until the minimum reclaim is
            // freed too, so evictions do not stop one byte above the line.
            let extra = t
                .minimum_reclaim
                .as_ref()
                .map_or(0, |m| m.resolve(o.capacity));
            let holding = self.met.contains(&i) && o.available < limit.saturating_add(extra);
            if !(crossed || holding) {
                self.first_seen.remove(&i);
                continue;
            }
            let since = *self.first_seen.entry(i).or_insert(now);
            if now.duration_since(since) >= t.grace {
                met.push(i);
            }
        }
        for &i in &met {
            self.conditions
                .insert(condition_of(&thresholds[i].signal), now);
        }
        // Crossed soft thresholds count for conditions at once, as
        // upstream's thresholdsMet without the grace period.
        for &i in self.first_seen.keys() {
            self.conditions
                .insert(condition_of(&thresholds[i].signal), now);
        }
        self.met = met.clone();
        met
    }

    /// The node conditions in force: observed within `transition`.
    pub fn conditions(&self, now: Instant, transition: Duration) -> Vec<&'static str> {
        self.conditions
            .iter()
            .filter(|(_, t)| now.duration_since(**t) < transition)
            .map(|(c, _)| *c)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(
        hard: &[(&str, &str)],
        soft: &[(&str, &str, u64)],
        min: &[(&str, &str)],
    ) -> Vec<Threshold> {
        let map = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| (k.to_string(), ThresholdValue::parse(v).unwrap()))
                .collect()
        };
        all(&EvictionThresholds {
            hard: map(hard),
            soft: soft
                .iter()
                .map(|(k, v, g)| {
                    (
                        k.to_string(),
                        (ThresholdValue::parse(v).unwrap(), Duration::from_secs(*g)),
                    )
                })
                .collect(),
            minimum_reclaim: map(min),
        })
    }

    fn obs(signal: &'static str, available: u64, capacity: u64) -> Observations {
        [(
            signal,
            Observation {
                available,
                capacity,
            },
        )]
        .into()
    }

    const MI: u64 = 1 << 20;

    #[tokio::test(start_paused = true)]
    async fn a_hard_threshold_is_met_at_once_and_holds_until_the_minimum_reclaim() {
        let t = cfg(
            &[("memory.available", "100Mi")],
            &[],
            &[("memory.available", "50Mi")],
        );
        let mut s = State::default();
        let now = Instant::now();
        assert!(
            s.observe(&t, &obs("memory.available", 200 * MI, 1000 * MI), now)
                .is_empty()
        );
        assert_eq!(
            s.observe(&t, &obs("memory.available", 99 * MI, 1000 * MI), now),
            [0]
        );
        // Above the threshold but inside the minimum reclaim: still met.
        assert_eq!(
            s.observe(&t, &obs("memory.available", 120 * MI, 1000 * MI), now),
            [0]
        );
        assert!(
            s.observe(&t, &obs("memory.available", 151 * MI, 1000 * MI), now)
                .is_empty()
        );
        assert_eq!(
            s.conditions(now, Duration::from_secs(300)),
            ["MemoryPressure"]
        );
        let later = now + Duration::from_secs(301);
        assert!(s.conditions(later, Duration::from_secs(300)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_soft_threshold_waits_for_its_grace_period() {
        let t = cfg(&[], &[("memory.available", "10%", 30)], &[]);
        let mut s = State::default();
        let t0 = Instant::now();
        let low = obs("memory.available", 50 * MI, 1000 * MI);
        assert!(s.observe(&t, &low, t0).is_empty());
        // The condition is set while the grace runs.
        assert_eq!(
            s.conditions(t0, Duration::from_secs(300)),
            ["MemoryPressure"]
        );
        assert!(s.observe(&t, &low, t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(s.observe(&t, &low, t0 + Duration::from_secs(30)), [0]);
        // Recovering resets the grace.
        let ok = obs("memory.available", 500 * MI, 1000 * MI);
        assert!(s.observe(&t, &ok, t0 + Duration::from_secs(31)).is_empty());
        assert!(s.observe(&t, &low, t0 + Duration::from_secs(32)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_reading_neither_meets_nor_clears() {
        let t = cfg(&[("allocatableMemory.available", "150Mi")], &[], &[]);
        let mut s = State::default();
        let now = Instant::now();
        assert!(s.observe(&t, &Observations::new(), now).is_empty());
        assert_eq!(
            s.observe(&t, &obs("allocatableMemory.available", MI, 600 * MI), now),
            [0]
        );
        assert_eq!(s.observe(&t, &Observations::new(), now), [0]);
    }

    #[test]
    fn a_threshold_above_the_capacity_is_found() {
        let t = cfg(
            &[("memory.available", "4Gi"), ("nodefs.available", "10%")],
            &[],
            &[],
        );
        let mut o = obs("memory.available", 100 * MI, 2048 * MI);
        o.insert(
            "nodefs.available",
            Observation {
                available: 1,
                capacity: 10,
            },
        );
        assert_eq!(always_met(&t, &o), [0]);
        let t = cfg(&[("memory.available", "100%")], &[], &[]);
        assert_eq!(always_met(&t, &obs("memory.available", 1, 2048 * MI)), [0]);
    }

    #[test]
    fn signals_map_to_conditions_and_resources() {
        assert_eq!(
            condition_of("allocatableMemory.available"),
            "MemoryPressure"
        );
        assert_eq!(condition_of("imagefs.inodesFree"), "DiskPressure");
        assert_eq!(condition_of("pid.available"), "PIDPressure");
        assert_eq!(resource_of("nodefs.available"), "ephemeral-storage");
        assert_eq!(resource_of("nodefs.inodesFree"), "inodes");
    }
}
