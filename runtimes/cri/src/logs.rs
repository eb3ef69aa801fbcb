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
    ) -> Result<(), String> {
        let size = match std::fs::metadata(log) {
            Ok(m) => m.len(),
            Err(_) => return Ok(()),
        };
        if max_size == 0 || size < max_size {
            return Ok(());
        }
        let rotated = PathBuf::from(format!("{}.{}", log.display(), timestamp()));
        std::fs::rename(log, &rotated).map_err(|e| e.to_string())?;
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
            return Err(status_err("ReopenContainerLog", s).to_string());
        }
        prune(log, max_files);
        Ok(())
    }
}

/// `20060102-150405` in UTC, upstream's rotated-log suffix.
fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Keeps the newest `max_files - 1` rotated files beside the live log.
fn prune(log: &Path, max_files: u32) {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect();
    rotated.sort();
    let keep = max_files.saturating_sub(1) as usize;
    while rotated.len() > keep {
        let _ = std::fs::remove_file(rotated.remove(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prunes_the_oldest_rotated_logs() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for f in [
            "0.log",
            "0.log.20260101-000000",
            "0.log.20260101-000010",
            "0.log.20260101-000020",
            "1.log",
        ] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        prune(&log, 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["0.log", "0.log.20260101-000020", "1.log"]);
    }

    #[test]
    fn timestamps_look_like_upstream() {
        let t = timestamp();
        assert_eq!(t.len(), 15);
        assert_eq!(&t[8..9], "-");
        assert!(t.starts_with("20"));
    }
}
