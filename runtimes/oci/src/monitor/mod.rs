//! The monitor: one small, single-threaded process per node (not per
//! container) that creates containers through libcontainer, holds their
//! stdout/stderr and writes their logs, reaps them as a subreaper, and
//! records exit codes and OOM kills. It outlives kinglet: a kill -9 or an
//! upgrade of the agent leaves containers running, logged and accounted
//! for, and the restarted agent re-adopts them by asking the monitor.
//!
//! kinglet talks to it over a unix socket, one JSON request and one JSON
//! response per line. A `watch` request turns its connection into an event
//! stream: one [`Event`] line each time a container is created, started,
//! exits or is deleted, so the agent's PLEG is woken by exits instead of
//! finding them by relisting. An `exec` request carries the process's
//! stdin, stdout and stderr as file descriptors (`SCM_RIGHTS`), so its
//! output flows straight to kinglet and never through the monitor; the
//! connection then stays open for the exit code, and closing it early kills
//! the process. An `attach` request sends two pipes that get copies of a
//! container's output from then on, and gets back the container's stdin
//! pipe (held by the monitor for containers created with `stdin`).

pub mod adopt;
pub mod logs;
pub mod server;

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A request to the monitor.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    /// Creates a container from a bundle; its logs go to `log_path`.
    Create {
        id: String,
        bundle: PathBuf,
        log_path: PathBuf,
        log_max_size: u64,
        log_max_files: u32,
        /// The pod spec's `stdin`: the container reads a pipe the monitor
        /// holds for attaches (else `/dev/null`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin: bool,
        /// `stdinOnce`: the first attach takes the pipe; when it ends the
        /// container reads end of file.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin_once: bool,
    },
    Start {
        id: String,
    },
    Kill {
        id: String,
        signal: i32,
    },
    /// Removes the container (killing it if needed) and its record.
    Delete {
        id: String,
    },
    State {
        id: String,
    },
    List,
    /// Turns this connection into a stream of [`Event`]s (after an `ok`).
    Watch,
    /// Starts `args` inside running container `id`, on the three file
    /// descriptors sent with the request; answers [`Response::Exec`], then
    /// [`Response::Exited`] when the process ends.
    Exec {
        id: String,
        args: Vec<String>,
        /// On a new terminal instead: no descriptors come with the
        /// request, and the answer carries the terminal's master end.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        tty: bool,
    },
    /// Attaches to running container `id`: the two file descriptors sent
    /// with the request (pipes' write ends) receive copies of its stdout
    /// and stderr from now on, until it exits or a copy cannot be written
    /// at once (a reader that fell behind is dropped, the monitor never
    /// waits); answers [`Response::Attached`] with the container's stdin
    /// pipe attached when it has one.
    Attach {
        id: String,
    },
    /// Stops the monitor; refused while it has containers.
    Exit,
}

/// A change of one container, as a watcher receives it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Event {
    pub id: String,
    /// `created`, `running`, `exited` or `deleted`.
    pub status: String,
}

/// What kind of failure an error answer reports, so callers match a kind,
/// not a message.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    #[default]
    Failed,
    NotFound,
    AlreadyExists,
}

/// What the monitor knows of a container.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContainerRecord {
    pub id: String,
    pub pid: i32,
    pub bundle: PathBuf,
    pub log_path: PathBuf,
    /// `created`, `running` or `exited`.
    pub status: String,
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    pub oom_killed: bool,
    /// Unix nanoseconds.
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// `memory.events` (v2) or `memory.oom_control` (v1) of its cgroup.
    #[serde(default)]
    pub oom_file: Option<PathBuf>,
    #[serde(default)]
    pub oom_kills_before: u64,
    /// The boot the process was started in and its start time in clock
    /// ticks since boot: the pid is the container's only while both match
    /// (see [`crate::procid`]).
    #[serde(default)]
    pub boot_id: String,
    #[serde(default)]
    pub start_ticks: u64,
    /// Log rotation, so a monitor that takes the container over keeps it.
    #[serde(default)]
    pub log_max_size: u64,
    #[serde(default)]
    pub log_max_files: u32,
}

impl ContainerRecord {
    /// The process as this record knows it.
    pub fn identity(&self) -> crate::procid::Identity {
        crate::procid::Identity {
            pid: self.pid,
            boot_id: self.boot_id.clone(),
            start_ticks: self.start_ticks,
        }
    }
}

// One answer at a time, decoded and dropped: a record's size in the enum
// costs nothing worth a box at every match.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Ok,
    Record {
        record: ContainerRecord,
    },
    Records {
        records: Vec<ContainerRecord>,
    },
    Exec {
        pid: i32,
    },
    Exited {
        exit_code: i32,
    },
    Attached {
        /// The write end of the container's stdin comes with the answer.
        stdin: bool,
    },
    Error {
        message: String,
        /// Absent from monitors older than the field: `failed`.
        #[serde(default)]
        kind: ErrorKind,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("container monitor at {sock}: {source}")]
    Io {
        sock: String,
        #[source]
        source: std::io::Error,
    },
    #[error("container monitor: {0}")]
    Failed(String),
    #[error("container monitor: {0}")]
    NotFound(String),
    #[error("container monitor: {0}")]
    AlreadyExists(String),
}

/// The socket of the monitor serving `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("monitor.sock")
}

/// A subscription to the monitor's container events.
pub struct Watch {
    conn: BufReader<tokio::net::UnixStream>,
    line: String,
}

impl Watch {
    /// The next event; `None` when the monitor closed the stream (it exited,
    /// or dropped a watcher too slow to read).
    pub async fn next(&mut self) -> Result<Option<Event>, MonitorError> {
        self.line.clear();
        let n = self
            .conn
            .read_line(&mut self.line)
            .await
            .map_err(|e| MonitorError::Failed(format!("reading events: {e}")))?;
        if n == 0 {
            return Ok(None);
        }
        serde_json::from_str(&self.line)
            .map(Some)
            .map_err(|e| MonitorError::Failed(format!("bad event: {e}")))
    }
}

/// A process started by [`Client::exec`]; dropping it before [`wait`]
/// returns kills the process.
///
/// [`wait`]: ExecHandle::wait
pub struct ExecHandle {
    pub pid: i32,
    conn: BufReader<tokio::net::UnixStream>,
}

impl ExecHandle {
    /// The process's exit code (128 + signal when a signal ended it).
    pub async fn wait(mut self) -> Result<i32, MonitorError> {
        let mut line = String::new();
        self.conn
            .read_line(&mut line)
            .await
            .map_err(|e| MonitorError::Failed(format!("waiting for exec: {e}")))?;
        match serde_json::from_str(&line) {
            Ok(Response::Exited { exit_code }) => Ok(exit_code),
            _ if line.is_empty() => Err(MonitorError::Failed(
                "the monitor closed the exec connection before the process ended".into(),
            )),
            other => Err(MonitorError::Failed(format!("unexpected answer {other:?}"))),
        }
    }
}

/// Reads one answer line and the descriptors that came with it (the
/// answer is read byte-exact up to its newline, so nothing after it is
/// lost to a buffer).
async fn recv_line_with_fds(
    s: &tokio::net::UnixStream,
) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let (mut line, mut fds) = (Vec::new(), Vec::new());
    loop {
        s.readable().await?;
        let mut byte = [0u8; 1];
        let r = s.try_io(tokio::io::Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut cmsg = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [std::io::IoSliceMut::new(&mut byte)];
            let r = rustix::net::recvmsg(s, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
            for m in cmsg.drain() {
                if let RecvAncillaryMessage::ScmRights(it) = m {
                    fds.extend(it);
                }
            }
            Ok(r.bytes)
        });
        match r {
            Ok(0) => return Ok((line, fds)),
            Ok(_) if byte[0] == b'\n' => return Ok((line, fds)),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if line.len() > 64 * 1024 {
            return Err(std::io::Error::other("answer too long"));
        }
    }
}

/// Sends one request line with file descriptors attached.
async fn send_with_fds(
    s: &tokio::net::UnixStream,
    line: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    loop {
        s.writable().await?;
        let sent = s.try_io(tokio::io::Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
            let mut cmsg = SendAncillaryBuffer::new(&mut space);
            cmsg.push(SendAncillaryMessage::ScmRights(fds));
            let iov = [std::io::IoSlice::new(line)];
            Ok(rustix::net::sendmsg(
                s,
                &iov,
                &mut cmsg,
                SendFlags::empty(),
            )?)
        });
        match sent {
            Ok(n) if n == line.len() => return Ok(()),
            // The fds went with the first part; a unix socket rarely splits
            // a line this short, but finish it if it did.
            Ok(n) => {
                let mut rest = &line[n..];
                while !rest.is_empty() {
                    s.writable().await?;
                    match s.try_write(rest) {
                        Ok(m) => rest = &rest[m..],
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// One answer line: the monitor's error as an error, no answer (a closed
/// connection) or an unreadable one as a failure.
fn answer(out: &[u8]) -> Result<Response, MonitorError> {
    if out.is_empty() {
        return Err(MonitorError::Failed(
            "connection closed without an answer".into(),
        ));
    }
    match serde_json::from_slice(out) {
        Ok(Response::Error { message, kind }) => Err(match kind {
            ErrorKind::NotFound => MonitorError::NotFound(message),
            _ => MonitorError::Failed(message),
        }),
        Ok(r) => Ok(r),
        Err(e) => Err(MonitorError::Failed(format!("bad answer: {e}"))),
    }
}

fn unexpected(r: Response) -> MonitorError {
    MonitorError::Failed(format!("unexpected answer {r:?}"))
}

/// The monitor dir's lock file (see `server::lock_dir`).
fn lock_file(dir: &Path) -> Option<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join("monitor.lock"))
        .ok()
}

/// A whole-file write lock, as `fcntl` takes it.
fn write_lock() -> libc::flock {
    // SAFETY: a zeroed flock is valid; its fields are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl
}

/// The pid of the monitor serving `dir`: the holder of its lock.
pub fn monitor_pid(dir: &Path) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let f = lock_file(dir)?;
    let mut fl = write_lock();
    // SAFETY: fcntl F_GETLK on an fd we own with a valid flock.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) };
    (r == 0 && fl.l_type != libc::F_UNLCK as libc::c_short && fl.l_pid > 0).then_some(fl.l_pid)
}

/// How long a ping may take before the monitor counts as gone.
const PING_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long any other request may take (the single-threaded monitor
/// answers in turn; creating a container takes ~100 ms).
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Talks to the monitor.
#[derive(Clone, Debug)]
pub struct Client {
    sock: PathBuf,
    /// One start at a time from this process (the monitor's own lock makes
    /// it one across processes).
    starting: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl Client {
    pub fn new(dir: &Path) -> Self {
        Client {
            sock: socket_path(dir),
            starting: Default::default(),
        }
    }

    fn io_error(&self, source: std::io::Error) -> MonitorError {
        MonitorError::Io {
            sock: self.sock.display().to_string(),
            source,
        }
    }

    /// Sends `req` on a new connection and reads the first answer, which
    /// must come within `ANSWER_WAIT` (`PING_WAIT` for a ping); the
    /// connection is returned for a watch to go on reading. Bounded because
    /// a monitor killed while it created a container leaves its listening
    /// socket open in the container's init (forked, not yet exec'd), where
    /// a connection is taken and never answered.
    async fn exchange(
        &self,
        req: &Request,
    ) -> Result<(Response, BufReader<tokio::net::UnixStream>), MonitorError> {
        let wait = match req {
            Request::Ping => PING_WAIT,
            _ => ANSWER_WAIT,
        };
        match tokio::time::timeout(wait, self.exchange_unbounded(req)).await {
            Ok(r) => r,
            Err(_) => Err(MonitorError::Failed(format!(
                "the monitor did not answer within {wait:?}"
            ))),
        }
    }

    async fn exchange_unbounded(
        &self,
        req: &Request,
    ) -> Result<(Response, BufReader<tokio::net::UnixStream>), MonitorError> {
        let mut s = tokio::net::UnixStream::connect(&self.sock)
            .await
            .map_err(|e| self.io_error(e))?;
        let mut line = serde_json::to_vec(req).map_err(|e| MonitorError::Failed(e.to_string()))?;
        line.push(b'\n');
        s.write_all(&line).await.map_err(|e| self.io_error(e))?;
        let mut conn = BufReader::new(s);
        let mut out = String::new();
        conn.read_line(&mut out)
            .await
            .map_err(|e| self.io_error(e))?;
        if out.is_empty() {
            return Err(MonitorError::Failed(
                "connection closed without an answer".into(),
            ));
        }
        let resp = serde_json::from_str(&out)
            .map_err(|e| MonitorError::Failed(format!("bad answer: {e}")))?;
        match resp {
            Response::Error { message, kind } => Err(match kind {
                ErrorKind::Failed => MonitorError::Failed(message),
                ErrorKind::NotFound => MonitorError::NotFound(message),
                ErrorKind::AlreadyExists => MonitorError::AlreadyExists(message),
            }),
            r => Ok((r, conn)),
        }
    }

    pub async fn call(&self, req: &Request) -> Result<Response, MonitorError> {
        self.exchange(req).await.map(|(r, _)| r)
    }

    /// Subscribes to container events.
    pub async fn watch(&self) -> Result<Watch, MonitorError> {
        let (_, conn) = self.exchange(&Request::Watch).await?;
        Ok(Watch {
            conn,
            line: String::new(),
        })
    }

    /// Starts `args` in running container `id` with `stdio` (stdin, stdout,
    /// stderr) as its standard streams; the caller keeps the other ends.
    pub async fn exec(
        &self,
        id: &str,
        args: &[String],
        stdio: [OwnedFd; 3],
    ) -> Result<ExecHandle, MonitorError> {
        let req = Request::Exec {
            id: id.into(),
            args: args.to_vec(),
            tty: false,
        };
        let mut line = serde_json::to_vec(&req).map_err(|e| MonitorError::Failed(e.to_string()))?;
        line.push(b'\n');
        let s = tokio::net::UnixStream::connect(&self.sock)
            .await
            .map_err(|e| self.io_error(e))?;
        let fds: Vec<BorrowedFd<'_>> = stdio.iter().map(|f| f.as_fd()).collect();
        send_with_fds(&s, &line, &fds)
            .await
            .map_err(|e| self.io_error(e))?;
        // The monitor holds its own copies now.
        drop(stdio);
        let mut conn = BufReader::new(s);
        let mut out = String::new();
        conn.read_line(&mut out)
            .await
            .map_err(|e| self.io_error(e))?;
        match answer(out.as_bytes())? {
            Response::Exec { pid } => Ok(ExecHandle { pid, conn }),
            other => Err(unexpected(other)),
        }
    }

    /// Starts `args` in running container `id` on a new terminal; returns
    /// the process and the terminal's master end.
    pub async fn exec_tty(
        &self,
        id: &str,
        args: &[String],
    ) -> Result<(ExecHandle, OwnedFd), MonitorError> {
        let req = Request::Exec {
            id: id.into(),
            args: args.to_vec(),
            tty: true,
        };
        let mut line = serde_json::to_vec(&req).map_err(|e| MonitorError::Failed(e.to_string()))?;
        line.push(b'\n');
        let mut s = tokio::net::UnixStream::connect(&self.sock)
            .await
            .map_err(|e| self.io_error(e))?;
        s.write_all(&line).await.map_err(|e| self.io_error(e))?;
        let (out, mut fds) = recv_line_with_fds(&s).await.map_err(|e| self.io_error(e))?;
        match answer(&out)? {
            Response::Exec { pid } => {
                let master = fds
                    .pop()
                    .ok_or_else(|| MonitorError::Failed("the monitor sent no terminal".into()))?;
                let conn = BufReader::new(s);
                Ok((ExecHandle { pid, conn }, master))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Attaches `taps` (stdout's and stderr's receiving ends' writers) to
    /// container `id`; returns the container's stdin when it has one.
    pub async fn attach(
        &self,
        id: &str,
        taps: [OwnedFd; 2],
    ) -> Result<Option<OwnedFd>, MonitorError> {
        let req = Request::Attach { id: id.into() };
        let mut line = serde_json::to_vec(&req).map_err(|e| MonitorError::Failed(e.to_string()))?;
        line.push(b'\n');
        let s = tokio::net::UnixStream::connect(&self.sock)
            .await
            .map_err(|e| self.io_error(e))?;
        let fds: Vec<BorrowedFd<'_>> = taps.iter().map(|f| f.as_fd()).collect();
        send_with_fds(&s, &line, &fds)
            .await
            .map_err(|e| self.io_error(e))?;
        drop(taps);
        let (out, mut fds) = recv_line_with_fds(&s).await.map_err(|e| self.io_error(e))?;
        match answer(&out)? {
            Response::Attached { stdin } => Ok(stdin.then(|| fds.pop()).flatten()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn record(&self, req: &Request) -> Result<ContainerRecord, MonitorError> {
        match self.call(req).await? {
            Response::Record { record } => Ok(record),
            other => Err(MonitorError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    pub async fn list(&self) -> Result<Vec<ContainerRecord>, MonitorError> {
        match self.call(&Request::List).await? {
            Response::Records { records } => Ok(records),
            other => Err(MonitorError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    pub async fn ping(&self) -> bool {
        matches!(self.call(&Request::Ping).await, Ok(Response::Ok))
    }

    /// Makes sure a monitor serves `dir`, starting `exe monitor --dir dir`
    /// if none answers. The started process daemonizes itself (it forks
    /// while still single-threaded), so it is never kinglet's child.
    pub async fn ensure_running(&self, exe: &Path, dir: &Path) -> Result<(), MonitorError> {
        let _one = self.starting.lock().await;
        if self.ping().await {
            return Ok(());
        }
        self.start_locked(exe, dir).await
    }

    /// Starts a monitor for `dir` without asking the one that is known to
    /// have died (its socket may still take connections it never answers).
    pub async fn restart(&self, exe: &Path, dir: &Path) -> Result<(), MonitorError> {
        let _one = self.starting.lock().await;
        self.start_locked(exe, dir).await
    }

    async fn start_locked(&self, exe: &Path, dir: &Path) -> Result<(), MonitorError> {
        let st = tokio::process::Command::new(exe)
            .arg("monitor")
            .arg("--dir")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .status()
            .await
            .map_err(|source| MonitorError::Io {
                sock: exe.display().to_string(),
                source,
            })?;
        if !st.success() {
            return Err(MonitorError::Failed(format!(
                "starting the monitor failed: {st}"
            )));
        }
        if self.ping().await {
            Ok(())
        } else {
            Err(MonitorError::Failed(
                "the monitor started but does not answer".into(),
            ))
        }
    }
}
