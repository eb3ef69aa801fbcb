//! Exponential backoff with jitter, for every retry loop that talks to the
//! API server: many nodes restarting together must not retry in lockstep.

use std::time::Duration;

/// Doubles from `initial` up to `max`; each wait gets up to +50% jitter
/// (never past `max`).
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    rng: u64,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32);
        Backoff {
            initial,
            max,
            next: initial,
            rng: seed | 1,
        }
    }

    /// The wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // xorshift64: plenty for spreading retries, no dependency needed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let jitter = base.mul_f64((self.rng % 1000) as f64 / 2000.0);
        (base + jitter).min(self.max)
    }

    /// Back to the initial wait, after a success.
    pub fn reset(&mut self) {
        self.next = self.initial;
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
}
