//! The one back-off of kinglet: a wait that doubles from `initial` up to
//! `max`, remembered with when it started. Here, in the runtime interface
//! crate, so that the agent and the runtimes share it. Two uses, one type:
//! - retry loops that talk to the API server or to containerd
//!   ([`Backoff::new`]) add up to +50% jitter, so many nodes restarting together do not retry in
//!   lockstep;
//! - the pod lifecycle's per-container back-offs ([`Backoff::steady`],
//!   upstream's `flowcontrol.Backoff`: crash loops, image pulls, creation
//!   failures) are exact, since their delays are reported to users, and ask
//!   [`Backoff::left`] at a given instant (tokio time, so tests pause it).

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    jitter: bool,
    rng: u64,
    /// The current wait; zero before the first step.
    pub delay: Duration,
    /// When the current wait started.
    pub since: Instant,
}

impl Backoff {
    /// A jittered back-off, for retry loops.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32);
        Backoff {
            jitter: true,
            rng: seed | 1,
            ..Backoff::steady(initial, max)
        }
    }

    /// An exact back-off, for delays users see.
    pub fn steady(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            jitter: false,
            rng: 1,
            delay: Duration::ZERO,
            since: Instant::now(),
        }
    }

    /// Starts the next wait at `now` (`initial`, then doubling up to `max`)
    /// and returns its length, jitter included.
    pub fn step(&mut self, now: Instant) -> Duration {
        self.delay = if self.delay.is_zero() {
            self.initial
        } else {
            (self.delay * 2).min(self.max)
        };
        self.since = now;
        if !self.jitter {
            return self.delay;
        }
        // xorshift64: plenty for spreading retries, no dependency needed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let jitter = self.delay.mul_f64((self.rng % 1000) as f64 / 2000.0);
        (self.delay + jitter).min(self.max)
    }

    /// The wait before the next attempt of a retry loop.
    pub fn next_delay(&mut self) -> Duration {
        self.step(Instant::now())
    }

    /// Time left of the current wait at `now`, if any.
    pub fn left(&self, now: Instant) -> Option<Duration> {
        let passed = now.saturating_duration_since(self.since);
        (passed < self.delay).then(|| self.delay - passed)
    }

    /// Back to the initial wait, after a success.
    pub fn reset(&mut self) {
        self.delay = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let d: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(100) && d[0] <= Duration::from_millis(150));
        assert!(d[1] >= Duration::from_millis(200) && d[1] <= Duration::from_millis(300));
        assert!(d.iter().all(|x| *x <= Duration::from_secs(2)));
        assert_eq!(d[7], Duration::from_secs(2));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(150));
    }

    #[test]
    fn steady_backoffs_are_exact_and_count_from_their_start() {
        let now = Instant::now();
        let mut b = Backoff::steady(Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(b.left(now), None, "no wait before the first step");
        assert_eq!(b.step(now), Duration::from_secs(10));
        assert_eq!(
            b.left(now + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(b.left(now + Duration::from_secs(10)), None);
        let waits: Vec<u64> = (0..6).map(|_| b.step(now).as_secs()).collect();
        assert_eq!(waits, [20, 40, 80, 160, 300, 300]);
    }
}
