//! Container log files as runtimes rotate them: `<n>.log` beside rotated
//! `<n>.log.<timestamp>` files, whose names sort by age.

use std::path::{Path, PathBuf};

/// Keeps the newest `max_files - 1` rotated files beside the live `log`
/// (containerLogMaxFiles counts the live one).
pub fn prune_rotated(log: &Path, max_files: u32) {
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
    #[test]
    fn prunes_the_oldest_rotated_logs() {
        let dir = std::env::temp_dir().join(format!("kinglet-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "0.log",
            "0.log.20260101-000000",
            "0.log.20260101-000010",
            "0.log.20260101-000020",
            "1.log",
        ] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        super::prune_rotated(&dir.join("0.log"), 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(left, ["0.log", "0.log.20260101-000020", "1.log"]);
    }
}
