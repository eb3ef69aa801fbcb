//! The monitor's bookkeeping over a recording fake of its process work:
//! what a create, start, kill, exit and delete do to the records, what is
//! persisted for the next monitor, and which process calls are made.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::rc::Rc;

use super::{Monitor, Processes};
use crate::container::ContainerError;
use crate::monitor::{ErrorKind, Request, Response};

/// What the fake was asked, and the exits it hands out next.
#[derive(Default)]
struct Played {
    calls: Vec<String>,
    exits: VecDeque<(i32, i32)>,
    /// `delete` fails (libcontainer cannot tell the pid is gone).
    refuse_delete: bool,
}

struct Recording(Rc<RefCell<Played>>);

/// Pids no process has here (above any `pid_max`).
const FIRST_PID: i32 = 5_000_000;

impl Processes for Recording {
    fn create(
        &mut self,
        _: &Path,
        id: &str,
        _: &Path,
        _: [OwnedFd; 3],
    ) -> Result<i32, ContainerError> {
        let mut p = self.0.borrow_mut();
        p.calls.push(format!("create {id}"));
        Ok(FIRST_PID + p.calls.len() as i32)
    }

    fn start(&mut self, _: &Path, id: &str) -> Result<(), ContainerError> {
        self.0.borrow_mut().calls.push(format!("start {id}"));
        Ok(())
    }

    fn kill(&mut self, _: &Path, id: &str, signal: i32) -> Result<(), ContainerError> {
        self.0
            .borrow_mut()
            .calls
            .push(format!("kill {id} {signal}"));
        Ok(())
    }

    fn delete(&mut self, _: &Path, id: &str) -> Result<(), ContainerError> {
        let mut p = self.0.borrow_mut();
        p.calls.push(format!("delete {id}"));
        if p.refuse_delete {
            return Err(ContainerError {
                id: id.into(),
                message: "delete: the pid is another process".into(),
            });
        }
        Ok(())
    }

    fn forget(&mut self, _: &Path, id: &str, _: &Path) -> Result<(), ContainerError> {
        self.0.borrow_mut().calls.push(format!("forget {id}"));
        Ok(())
    }

    fn wait_any(&mut self) -> Option<(i32, i32)> {
        self.0.borrow_mut().exits.pop_front()
    }

    fn kill_child(&mut self, pid: i32) {
        self.0.borrow_mut().calls.push(format!("kill_child {pid}"));
    }
}

fn monitor(dir: &Path) -> (Monitor, Rc<RefCell<Played>>) {
    std::fs::create_dir_all(dir.join("records")).unwrap();
    let played = Rc::new(RefCell::new(Played::default()));
    let m = Monitor::with(dir, Box::new(Recording(played.clone())));
    (m, played)
}

fn create(m: &mut Monitor, dir: &Path, id: &str) -> super::ContainerRecord {
    let req = Request::Create {
        id: id.into(),
        bundle: dir.join("bundle"),
        log_path: dir.join(format!("{id}.log")),
        log_max_size: 0,
        log_max_files: 0,
        stdin: false,
        stdin_once: false,
    };
    match m.handle(req) {
        Response::Record { record } => record,
        other => panic!("create answered {other:?}"),
    }
}

fn state(m: &mut Monitor, id: &str) -> super::ContainerRecord {
    match m.handle(Request::State { id: id.into() }) {
        Response::Record { record } => record,
        other => panic!("state answered {other:?}"),
    }
}

/// A wait status for an exit with `code`, or for death by `signal`.
fn exited(code: i32) -> i32 {
    code << 8
}

#[test]
fn a_container_runs_exits_and_its_code_and_signal_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, played) = monitor(dir.path());
    let a = create(&mut m, dir.path(), "a");
    let b = create(&mut m, dir.path(), "b");
    assert_eq!(a.status, "created");
    assert!(matches!(
        m.handle(Request::Start { id: "a".into() }),
        Response::Record { .. }
    ));
    assert!(matches!(
        m.handle(Request::Start { id: "b".into() }),
        Response::Record { .. }
    ));
    assert_eq!(state(&mut m, "a").status, "running");
    // `a` exits 3; `b` dies of SIGKILL; an unknown child is ignored.
    played
        .borrow_mut()
        .exits
        .extend([(a.pid, exited(3)), (b.pid, libc::SIGKILL), (7, 0)]);
    m.reap();
    let a = state(&mut m, "a");
    assert_eq!(
        (a.status.as_str(), a.exit_code, a.signal),
        ("exited", Some(3), None)
    );
    assert!(a.finished_at.is_some());
    let b = state(&mut m, "b");
    assert_eq!(
        (b.exit_code, b.signal),
        (Some(128 + libc::SIGKILL), Some(libc::SIGKILL))
    );
    // Killing an exited container asks nothing of the kernel.
    assert!(matches!(
        m.handle(Request::Kill {
            id: "a".into(),
            signal: 15
        }),
        Response::Ok
    ));
    assert_eq!(
        played.borrow().calls,
        ["create a", "create b", "start a", "start b"]
    );
}

#[test]
fn records_persist_for_the_next_monitor_which_marks_the_gone_exited() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, _) = monitor(dir.path());
    create(&mut m, dir.path(), "a");
    m.handle(Request::Start { id: "a".into() });
    drop(m);
    // A new monitor (the old one killed): the record's pid names no
    // process, so the container is lost, its exit unknown.
    let (mut next, _) = monitor(dir.path());
    next.load();
    let a = state(&mut next, "a");
    assert_eq!((a.status.as_str(), a.exit_code), ("exited", None));
    let on_disk = std::fs::read(dir.path().join("records/a.json")).unwrap();
    let on_disk: super::ContainerRecord = serde_json::from_slice(&on_disk).unwrap();
    assert_eq!(on_disk.status, "exited", "the mark is persisted");
}

#[test]
fn a_second_create_of_one_id_is_refused_and_unknown_ids_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, played) = monitor(dir.path());
    create(&mut m, dir.path(), "a");
    let again = Request::Create {
        id: "a".into(),
        bundle: dir.path().join("bundle"),
        log_path: dir.path().join("a.log"),
        log_max_size: 0,
        log_max_files: 0,
        stdin: false,
        stdin_once: false,
    };
    assert!(matches!(
        m.handle(again),
        Response::Error {
            kind: ErrorKind::AlreadyExists,
            ..
        }
    ));
    for req in [
        Request::Start { id: "x".into() },
        Request::Kill {
            id: "x".into(),
            signal: 9,
        },
        Request::State { id: "x".into() },
    ] {
        assert!(matches!(
            m.handle(req),
            Response::Error {
                kind: ErrorKind::NotFound,
                ..
            }
        ));
    }
    assert_eq!(played.borrow().calls, ["create a"]);
}

#[test]
fn an_exited_container_libcontainer_cannot_delete_is_forgotten_a_running_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, played) = monitor(dir.path());
    let a = create(&mut m, dir.path(), "a");
    create(&mut m, dir.path(), "b");
    played.borrow_mut().refuse_delete = true;
    // Running (created, no exit seen): the failure is the answer.
    assert!(matches!(
        m.handle(Request::Delete { id: "b".into() }),
        Response::Error { .. }
    ));
    assert_eq!(state(&mut m, "b").status, "created");
    // Exited: its state is removed instead, and so is its record.
    played.borrow_mut().exits.push_back((a.pid, exited(0)));
    m.reap();
    assert!(matches!(
        m.handle(Request::Delete { id: "a".into() }),
        Response::Ok
    ));
    assert!(!dir.path().join("records/a.json").exists());
    assert!(matches!(
        m.handle(Request::State { id: "a".into() }),
        Response::Error {
            kind: ErrorKind::NotFound,
            ..
        }
    ));
    let calls = played.borrow().calls.clone();
    assert_eq!(calls[2..], ["delete b", "delete a", "forget a"]);
}

#[test]
fn an_exec_whose_caller_went_away_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut m, played) = monitor(dir.path());
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    m.execs.push((4242, ours));
    // The caller still there: nothing to read, nothing killed.
    m.kill_abandoned_execs(&[true]);
    assert!(played.borrow().calls.is_empty());
    drop(theirs);
    m.kill_abandoned_execs(&[true]);
    assert_eq!(played.borrow().calls, ["kill_child 4242"]);
    assert!(m.execs.is_empty());
}
