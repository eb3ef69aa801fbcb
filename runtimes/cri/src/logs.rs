//! Container log rotation for CRI runtimes, which write logs but never
//! rotate them: as upstream's `ContainerLogManager`, every 10 s a log over
//! `containerLogMaxSize` is renamed to `<log>.<timestamp>`, the runtime is
//! told to reopen it (`ReopenContainerLog`), and rotated files beyond
//! `containerLogMaxFiles` (the current one counted) are removed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kinglet_runtime::{ContainerState, Runtime};
use tracing::warn;

use crate::{CriRuntime, REQUEST_TIMEOUT, proto, request, status_err};

/// Why one container log was not rotated.
#[derive(Debug, thiserror::Error)]
enum RotateError {
    #[error("{}: {source}", path.display())]
    Rename {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Reopen(kinglet_runtime::RuntimeError),
}

/// Upstream's `containerLogMonitorInterval`.
const INTERVAL: Duration = Duration::from_secs(10);

impl CriRuntime {
    /// Rotates running containers' logs until `shutdown` resolves.
    pub async fn rotate_logs(
        &self,
        max_size: u64,
        max_files: u32,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(INTERVAL) => {}
            }
            let Ok(containers) = self.list_containers().await else {
                continue;
            };
            for c in containers
                .iter()
                .filter(|c| c.state == ContainerState::Running && !c.log_path.is_empty())
            {
                if let Err(e) = self
                    .rotate_one(&c.id, Path::new(&c.log_path), max_size, max_files)
                    .await
                {
                    warn!(container = %c.id, log = %c.log_path, error = %e, "log rotation failed");
                }
            }
        }
    }

    async fn rotate_one(
        &self,
        id: &str,
        log: &Path,
        max_size: u64,
        max_files: u32,
    ) -> Result<(), RotateError> {
        let size = match std::fs::metadata(log) {
            Ok(m) => m.len(),
            Err(_) => return Ok(()),
        };
        if max_size == 0 || size < max_size {
            return Ok(());
        }
        let rotated = PathBuf::from(format!("{}.{}", log.display(), timestamp()));
        std::fs::rename(log, &rotated).map_err(|source| RotateError::Rename {
            path: log.to_path_buf(),
            source,
        })?;
        if let Err(s) = self
            .rt()
            .reopen_container_log(request(
                proto::ReopenContainerLogRequest {
                    container_id: id.into(),
                },
                REQUEST_TIMEOUT,
            ))
            .await
        {
            // The container may have exited meanwhile: put the log back so
            // nothing is lost.
            let _ = std::fs::rename(&rotated, log);
            return Err(RotateError::Reopen(status_err("ReopenContainerLog", s)));
        }
        kinglet_runtime::logs::prune_rotated(log, max_files);
        Ok(())
    }
}

/// `20060102-150405` in UTC, upstream's rotated-log suffix.
fn timestamp() -> String {
    jiff::Timestamp::now().strftime("%Y%m%d-%H%M%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_look_like_upstream() {
        let t = timestamp();
        assert_eq!(t.len(), 15);
        assert_eq!(&t[8..9], "-");
        assert!(t.starts_with("20"));
    }
}
