//! Container events from the monitor: one task follows the monitor's watch
//! stream and turns each event into two signals, the PLEG's wake-up
//! ([`Events::changes`], coalescing) and a counter that `stop` waits on for
//! the exit it asked for ([`Events::subscribe`]). While no stream can be had
//! (no monitor yet, or one older than the watch call) the task wakes the
//! PLEG once a second, as the periodic relist did before events existed.
//! The same task keeps a monitor running: when the stream ends because the
//! monitor died (a kill -9, a crash), it starts a new one at once, which
//! takes the running containers over.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::monitor::Client;

/// The signals one runtime's event task feeds.
pub(crate) struct Events {
    changes: Arc<Notify>,
    seen: watch::Sender<u64>,
    task: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Events {
    pub fn new() -> Self {
        Events {
            changes: Arc::new(Notify::new()),
            seen: watch::channel(0).0,
            task: std::sync::Mutex::new(None),
        }
    }

    /// Starts following `monitor` (once; later calls do nothing), which
    /// serves `dir`; one found gone is started again from `exe` (kinglet).
    pub fn follow(&self, monitor: Client, exe: PathBuf, dir: PathBuf) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_some() {
            return;
        }
        let changes = self.changes.clone();
        let seen = self.seen.clone();
        let task_fut = follow(monitor, exe, dir, changes, seen);
        *task = Some(tokio::spawn(task_fut).abort_handle());
    }

    /// Stops following (and so restarting) the monitor.
    pub fn stop(&self) {
        if let Some(t) = self.task.lock().ok().and_then(|mut t| t.take()) {
            t.abort();
        }
    }

    /// Notified (with a stored permit) whenever a container changed.
    pub fn changes(&self) -> Arc<Notify> {
        self.changes.clone()
    }

    /// A receiver whose `changed()` fires at each event after this call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.seen.subscribe()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Resolves when the monitor serving `dir` exits: its pidfd (found
/// through the holder of its lock) turns readable. Its event stream may
/// not end then: a container init it forked and that has not exec'd yet
/// holds a copy of every socket of the monitor. Never resolves where the
/// monitor cannot be watched so.
async fn monitor_exit(dir: &std::path::Path) {
    let fd = crate::monitor::monitor_pid(dir).and_then(crate::monitor::adopt::pidfd);
    let watched = fd.and_then(|fd| {
        // SAFETY: the AsyncFd owns the pidfd, open for its whole life.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .ok()
    });
    match watched {
        Some(afd) => {
            let _ = afd.readable().await;
        }
        None => std::future::pending().await,
    }
}

async fn follow(
    monitor: Client,
    exe: PathBuf,
    dir: PathBuf,
    changes: Arc<Notify>,
    seen: watch::Sender<u64>,
) {
    loop {
        let mut died = false;
        match monitor.watch().await {
            Ok(mut w) => {
                // What changed while nobody watched is found by one relist.
                changes.notify_one();
                let exit = monitor_exit(&dir);
                tokio::pin!(exit);
                loop {
                    let next = tokio::select! {
                        n = w.next() => n,
                        () = &mut exit => {
                            died = true;
                            break;
                        }
                    };
                    match next {
                        Ok(Some(ev)) => {
                            debug!(container = %ev.id, status = %ev.status, "container event");
                            seen.send_modify(|n| *n += 1);
                            changes.notify_one();
                        }
                        Ok(None) => break,
                        Err(e) => {
                            debug!(error = %e, "container events");
                            break;
                        }
                    }
                }
            }
            Err(e) => debug!(error = %e, "watching container events"),
        }
        seen.send_modify(|n| *n += 1);
        changes.notify_one();
        if died || !monitor.ping().await {
            warn!(dir = %dir.display(), "the container monitor is gone; starting a new one");
            match monitor.restart(&exe, &dir).await {
                Ok(()) => {
                    info!("a new container monitor took the containers over");
                    continue;
                }
                Err(e) => warn!(error = %e, "the container monitor did not start"),
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
