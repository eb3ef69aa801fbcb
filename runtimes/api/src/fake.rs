//! An in-memory runtime for unit tests: its answers are set by the test, and
//! it records how often it was asked.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{
    BoxFuture, ConditionKind, Runtime, RuntimeCondition, RuntimeError, RuntimeStatus,
    RuntimeVersion,
};

/// A runtime whose version and status are whatever the test last set.
#[derive(Debug)]
pub struct FakeRuntime {
    state: Mutex<FakeState>,
    /// How many `status` calls were made.
    pub status_calls: AtomicUsize,
}

#[derive(Debug)]
struct FakeState {
    up: bool,
    status: RuntimeStatus,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeRuntime {
    /// A runtime that is up and ready.
    pub fn new() -> Self {
        let cond = |kind| RuntimeCondition {
            kind,
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        FakeRuntime {
            state: Mutex::new(FakeState {
                up: true,
                status: RuntimeStatus {
                    conditions: vec![
                        cond(ConditionKind::RuntimeReady),
                        cond(ConditionKind::NetworkReady),
                    ],
                },
            }),
            status_calls: AtomicUsize::new(0),
        }
    }

    /// Makes every call fail as if the runtime's socket were gone.
    pub fn set_up(&self, up: bool) {
        self.lock().up = up;
    }

    /// Replaces the status the runtime reports.
    pub fn set_status(&self, status: RuntimeStatus) {
        self.lock().status = status;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        // A test that panicked while holding the lock already failed; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_up(&self) -> Result<(), RuntimeError> {
        if self.lock().up {
            Ok(())
        } else {
            Err(RuntimeError::Unavailable("fake runtime is down".into()))
        }
    }
}

impl Runtime for FakeRuntime {
    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            Ok(RuntimeVersion {
                runtime_name: "fake".into(),
                runtime_version: "0.0.1".into(),
                runtime_api_version: "v1".into(),
            })
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>> {
        Box::pin(async move {
            self.status_calls.fetch_add(1, Ordering::Relaxed);
            self.check_up()?;
            Ok(self.lock().status.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_what_the_test_sets() {
        let rt = FakeRuntime::new();
        assert!(
            rt.status()
                .await
                .unwrap()
                .is_ready(ConditionKind::NetworkReady)
        );
        assert_eq!(rt.version().await.unwrap().node_info(), "fake://0.0.1");
        rt.set_status(RuntimeStatus::default());
        assert!(
            !rt.status()
                .await
                .unwrap()
                .is_ready(ConditionKind::RuntimeReady)
        );
        rt.set_up(false);
        assert!(matches!(
            rt.status().await,
            Err(RuntimeError::Unavailable(_))
        ));
        assert_eq!(rt.status_calls.load(Ordering::Relaxed), 3);
    }
}
