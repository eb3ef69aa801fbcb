//! The upgrade's record, `<root-dir>/upgrade/state.json`: written whole
//! (temp file, fsync, rename) at each step, so that a kill or a power cut
//! at any instant leaves a phase the next start knows what to do with.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where an upgrade is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// The new binary is installed and on trial.
    Trial,
    /// The new binary stayed healthy for the set time: it stays.
    Committed,
    /// The previous binary is back.
    RolledBack,
}

/// The record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub phase: Phase,
    /// The binary the service runs (`/usr/bin/kinglet`).
    pub install_path: PathBuf,
    /// A copy of the binary that ran before: the rollback's source, and
    /// the guard the unit runs before each start.
    pub previous: PathBuf,
    pub from_version: String,
    pub to_version: String,
    /// Unix seconds.
    pub started_at: i64,
    /// The new binary must be committed by then (unix seconds).
    pub deadline: i64,
    /// How long it must stay healthy to be committed.
    pub commit_after_secs: u64,
    /// Starts of the new binary so far (counted by the guard).
    pub attempts: u32,
    pub max_attempts: u32,
    /// Why it was rolled back.
    #[serde(default)]
    pub reason: String,
}

/// The record's path under the root dir.
pub fn path(root_dir: &Path) -> PathBuf {
    root_dir.join("upgrade/state.json")
}

impl State {
    /// The record, when there is one that parses.
    pub fn read(root_dir: &Path) -> Option<State> {
        let bytes = crate::fsutil::read_at_most(&path(root_dir), 64 << 10).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes the record durably.
    pub fn write(&self, root_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::fsutil::write_private_atomic(&path(root_dir), &data, crate::fsutil::Flush::All)
    }

    /// What the guard decides at a start of the new binary, `now` in unix
    /// seconds: `Some(reason)` to roll back.
    pub fn judge_start(&mut self, now: i64) -> Option<String> {
        if self.phase != Phase::Trial {
            return None;
        }
        self.attempts += 1;
        if now > self.deadline {
            return Some(format!(
                "kinglet {} was not healthy for {} s within {} s",
                self.to_version,
                self.commit_after_secs,
                self.deadline - self.started_at
            ));
        }
        (self.attempts > self.max_attempts).then(|| {
            format!(
                "kinglet {} was started {} times without staying healthy",
                self.to_version, self.max_attempts
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial() -> State {
        State {
            phase: Phase::Trial,
            install_path: "/usr/bin/kinglet".into(),
            previous: "/var/lib/kinglet/upgrade/kinglet.previous".into(),
            from_version: "0.1.0".into(),
            to_version: "0.2.0".into(),
            started_at: 1000,
            deadline: 1300,
            commit_after_secs: 30,
            attempts: 0,
            max_attempts: 3,
            reason: String::new(),
        }
    }

    #[test]
    fn the_guard_rolls_back_after_too_many_starts_or_past_the_deadline() {
        let mut s = trial();
        for _ in 0..3 {
            assert_eq!(s.judge_start(1010), None);
        }
        let why = s.judge_start(1010).unwrap();
        assert!(why.contains("started 3 times"), "{why}");
        let mut s = trial();
        assert!(s.judge_start(1301).unwrap().contains("within 300 s"));
        let mut s = State {
            phase: Phase::Committed,
            ..trial()
        };
        assert_eq!(s.judge_start(99_999), None);
        assert_eq!(s.attempts, 0);
    }

    #[test]
    fn the_record_round_trips_and_a_torn_one_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("upgrade")).unwrap();
        assert_eq!(State::read(dir.path()), None);
        trial().write(dir.path()).unwrap();
        assert_eq!(State::read(dir.path()), Some(trial()));
        std::fs::write(path(dir.path()), "{\"phase\":").unwrap();
        assert_eq!(State::read(dir.path()), None);
    }
}
