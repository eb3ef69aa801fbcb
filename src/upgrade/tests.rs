//! The upgrade's steps on real files and real executables (scripts standing
//! in for kinglet binaries); the VM lab runs it under systemd
//! (`tests/vm/smoke.sh`).

use std::sync::Arc;

use super::*;

/// An executable script at `path` answering `--version` with `version`
/// (or failing when it is empty).
fn binary(path: &Path, version: &str) {
    let answer = match version {
        "" => "exit 3".to_string(),
        v => format!("echo 'kinglet {v}'; exit 0"),
    };
    std::fs::write(
        path,
        format!("#!/bin/sh\n[ \"$1\" = --version ] && {{ {answer}; }}\nexit 1\n"),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn options(dir: &Path, new: &Path) -> Options {
    Options {
        binary: new.into(),
        installed: false,
        sha256: None,
        install_path: dir.join("usr-bin-kinglet"),
        timeout: Duration::from_secs(1),
        commit_after: Duration::from_secs(1),
        max_attempts: 2,
        unit: None,
    }
}

#[test]
fn a_bad_binary_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let o = options(dir.path(), &dir.path().join("new"));
    binary(&o.install_path, "0.1.0");
    binary(&o.binary, "");
    let e = run(&root, &o).unwrap_err();
    assert!(matches!(e, UpgradeError::NotKinglet { .. }), "{e}");
    std::fs::write(&o.binary, "not even a script").unwrap();
    assert!(matches!(
        run(&root, &o).unwrap_err(),
        UpgradeError::NotKinglet { .. }
    ));
    binary(&o.binary, "0.2.0");
    let o = Options {
        sha256: Some("00".repeat(32)),
        ..o
    };
    let e = run(&root, &o).unwrap_err();
    assert!(matches!(e, UpgradeError::Checksum { .. }), "{e}");
    // The installed binary is untouched, no trial recorded.
    let installed = std::fs::read_to_string(&o.install_path).unwrap();
    assert!(installed.contains("kinglet 0.1.0"));
    assert_eq!(State::read(&root), None);
}

#[test]
fn a_binary_that_keeps_failing_is_rolled_back_by_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let o = Options {
        timeout: Duration::from_secs(600),
        ..options(dir.path(), &dir.path().join("new"))
    };
    binary(&o.install_path, "0.1.0");
    binary(&o.binary, "0.2.0");
    // Without a unit to restart, the trial is recorded and the new binary
    // installed for the caller to restart.
    let outcome = run(&root, &o).unwrap();
    assert!(outcome.contains("0.2.0 installed"), "{outcome}");
    let mut st = State::read(&root).unwrap();
    assert_eq!((st.phase, st.to_version.as_str()), (Phase::Trial, "0.2.0"));
    assert!(
        std::fs::read_to_string(&o.install_path)
            .unwrap()
            .contains("0.2.0")
    );
    // A second upgrade waits for this one.
    assert!(matches!(run(&root, &o), Err(UpgradeError::InProgress(_))));
    // Starts 1 and 2 go on; the third puts 0.1.0 back.
    st.deadline = i64::MAX;
    st.write(&root).unwrap();
    assert_eq!(guard(&root).unwrap(), None);
    assert_eq!(guard(&root).unwrap(), None);
    let why = guard(&root).unwrap().unwrap();
    assert!(why.contains("started 2 times"), "{why}");
    assert!(
        std::fs::read_to_string(&o.install_path)
            .unwrap()
            .contains("0.1.0")
    );
    let st = State::read(&root).unwrap();
    assert_eq!((st.phase, st.attempts), (Phase::RolledBack, 3));
    // Later starts leave it alone.
    assert_eq!(guard(&root).unwrap(), None);
    assert!(
        std::fs::read_to_string(&o.install_path)
            .unwrap()
            .contains("0.1.0")
    );
}

#[test]
fn an_installed_binary_is_put_on_trial_and_the_replaced_one_kept() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    // A package manager put 0.2.0 in place and kept 0.1.0 aside.
    let o = Options {
        installed: true,
        timeout: Duration::from_secs(600),
        ..options(dir.path(), &dir.path().join("replaced"))
    };
    binary(&o.install_path, "0.2.0");
    binary(&o.binary, "0.1.0");
    let outcome = run(&root, &o).unwrap();
    assert!(outcome.contains("0.2.0 installed"), "{outcome}");
    let st = State::read(&root).unwrap();
    assert_eq!((st.phase, st.to_version.as_str()), (Phase::Trial, "0.2.0"));
    let previous = std::fs::read_to_string(&st.previous).unwrap();
    assert!(previous.contains("0.1.0"), "{previous}");
    let installed = std::fs::read_to_string(&o.install_path).unwrap();
    assert!(installed.contains("0.2.0"));
}

fn trial_record(root: &Path, deadline: i64) {
    std::fs::create_dir_all(root.join("upgrade")).unwrap();
    State {
        phase: Phase::Trial,
        install_path: "/nonexistent".into(),
        previous: "/nonexistent".into(),
        from_version: "a".into(),
        to_version: "b".into(),
        started_at: 0,
        deadline,
        commit_after_secs: 2,
        attempts: 1,
        max_attempts: 3,
        reason: String::new(),
    }
    .write(root)
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_agent_commits_itself_after_staying_healthy() {
    let dir = tempfile::tempdir().unwrap();
    trial_record(dir.path(), i64::MAX);
    let hb = crate::health::Heartbeat::new(Duration::from_secs(3600));
    hb.beat();
    let checks: crate::health::Checks = Arc::new(vec![("syncloop", hb)]);
    let stop = CancellationToken::new();
    watch_trial(dir.path().into(), checks, stop.clone()).await;
    assert_eq!(State::read(dir.path()).unwrap().phase, Phase::Committed);
    assert!(!stop.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn past_the_deadline_the_agent_stops_for_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    trial_record(dir.path(), 0);
    // Never healthy: a heartbeat that never beat.
    let hb = crate::health::Heartbeat::new(Duration::from_millis(1));
    let checks: crate::health::Checks = Arc::new(vec![("PLEG", hb)]);
    let stop = CancellationToken::new();
    watch_trial(dir.path().into(), checks, stop.clone()).await;
    assert!(stop.is_cancelled());
    assert_eq!(State::read(dir.path()).unwrap().phase, Phase::Trial);
}
