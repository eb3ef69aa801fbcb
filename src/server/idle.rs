//! `streamingConnectionIdleTimeout`: a streaming session (exec, attach,
//! port-forward) in which no data moves either way for that long is
//! closed, as upstream's streaming server does (4 h by default; CIS 4.2.5
//! asks that it never be 0). As upstream's WebSocket connection counts
//! it, data messages are activity and WebSocket pings are not: a client
//! that only keeps the connection alive (kubectl pings every 5 s) is idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// When a session last moved data; cloned into each side that moves it.
#[derive(Clone)]
pub struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last data.
    last: Arc<AtomicU64>,
    timeout: Duration,
}

impl Activity {
    pub fn new(timeout: Duration) -> Self {
        Activity {
            start: Instant::now(),
            last: Arc::default(),
            timeout,
        }
    }

    /// Data moved.
    pub fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }

    /// Resolves once no data has moved for the timeout. It sleeps until
    /// the deadline the last data set, so it wakes once per timeout at
    /// most, however busy the session.
    pub async fn expired(&self) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = self.start + last + self.timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Activity;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_session_is_idle_the_timeout_after_its_last_data() {
        let a = Activity::new(Duration::from_secs(10));
        let t = tokio::time::Instant::now();
        let expired = tokio::spawn({
            let a = a.clone();
            async move { a.expired().await }
        });
        tokio::time::sleep(Duration::from_secs(8)).await;
        a.touch();
        tokio::time::sleep(Duration::from_secs(8)).await;
        a.touch();
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert!(!expired.is_finished(), "8 s after the last data");
        expired.await.unwrap();
        assert_eq!(t.elapsed(), Duration::from_secs(26));
    }
}
