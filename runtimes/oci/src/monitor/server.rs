//! The monitor process. Single-threaded on purpose: it forks (through
//! libcontainer), which is only safe without other threads. One `poll` loop
//! serves the socket, the containers' output pipes and SIGCHLD (signalfd):
//! no polling by timer.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use kinglet_runtime::podcgroup::Hierarchy;

use super::adopt::{self, Adopted};
use super::logs::{LineSplitter, LogFile};
use super::{ContainerRecord, ErrorKind, Event, Request, Response, socket_path};
use crate::container::{self, ContainerError};
use crate::procid::{self, Identity};

fn now_nanos() -> i64 {
    jiff::Timestamp::now().as_nanosecond() as i64
}

struct Stream {
    fd: OwnedFd,
    id: String,
    name: &'static str,
    split: LineSplitter,
}

struct Client {
    sock: UnixStream,
    buf: Vec<u8>,
    /// File descriptors received with the request (an exec's stdio).
    fds: Vec<OwnedFd>,
}

struct Monitor {
    dir: PathBuf,
    state_root: PathBuf,
    records: BTreeMap<String, ContainerRecord>,
    pids: HashMap<i32, String>,
    streams: Vec<Stream>,
    logs: HashMap<String, LogFile>,
    /// Connections that asked for events.
    watchers: Vec<UnixStream>,
    /// Exec'd processes by pid, with the connection waiting for the exit.
    execs: Vec<(i32, UnixStream)>,
    /// The write ends of containers' stdin pipes (`stdin: true`), with
    /// `stdinOnce`.
    stdins: HashMap<String, (OwnedFd, bool)>,
    /// Attached readers: copies of one container stream.
    taps: Vec<Tap>,
    /// Containers taken over from an earlier monitor (not our children).
    adopted: Vec<Adopted>,
    boot_id: String,
    procs: Box<dyn Processes>,
}

/// One attached reader of a container's stdout or stderr.
struct Tap {
    id: String,
    name: &'static str,
    fd: OwnedFd,
}

/// The monitor's process work: libcontainer's operations on containers
/// and the kernel's wait and kill. [`Kernel`] does them; the tests'
/// recording fake plays the exits instead, so the monitor's bookkeeping
/// (records, statuses, exit codes, what is persisted and announced) is
/// tested without processes. Exec and attach stay on the real path,
/// tested end to end.
pub(crate) trait Processes {
    /// Creates the container; its init waits for `start`. The init pid.
    fn create(
        &mut self,
        state_root: &Path,
        id: &str,
        bundle: &Path,
        stdio: [OwnedFd; 3],
    ) -> Result<i32, ContainerError>;
    fn start(&mut self, state_root: &Path, id: &str) -> Result<(), ContainerError>;
    fn kill(&mut self, state_root: &Path, id: &str, signal: i32) -> Result<(), ContainerError>;
    fn delete(&mut self, state_root: &Path, id: &str) -> Result<(), ContainerError>;
    /// Removes the state of a container known to have exited.
    fn forget(&mut self, state_root: &Path, id: &str, bundle: &Path) -> Result<(), ContainerError>;
    /// One exited child and its wait status, without waiting.
    fn wait_any(&mut self) -> Option<(i32, i32)>;
    /// SIGKILL to a child not yet reaped (an abandoned exec).
    fn kill_child(&mut self, pid: i32);
}

/// The real process work: libcontainer and the kernel.
struct Kernel;

impl Processes for Kernel {
    fn create(
        &mut self,
        state_root: &Path,
        id: &str,
        bundle: &Path,
        [stdin, stdout, stderr]: [OwnedFd; 3],
    ) -> Result<i32, ContainerError> {
        container::create(state_root, id, bundle, stdin, stdout, stderr)
    }

    fn start(&mut self, state_root: &Path, id: &str) -> Result<(), ContainerError> {
        container::start(state_root, id)
    }

    fn kill(&mut self, state_root: &Path, id: &str, signal: i32) -> Result<(), ContainerError> {
        container::kill(state_root, id, signal)
    }

    fn delete(&mut self, state_root: &Path, id: &str) -> Result<(), ContainerError> {
        container::delete(state_root, id)
    }

    fn forget(&mut self, state_root: &Path, id: &str, bundle: &Path) -> Result<(), ContainerError> {
        container::forget(state_root, id, bundle)
    }

    fn wait_any(&mut self) -> Option<(i32, i32)> {
        let mut status = 0;
        // SAFETY: waitpid with a valid status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        (pid > 0).then_some((pid, status))
    }

    fn kill_child(&mut self, pid: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped (reaping removes
        // it from the monitor's lists), so the pid is not reused.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// A new container's pipes: its output FIFOs (read ends here, write ends
/// the container's), which it holds read-write so that it outlives this
/// monitor (see `adopt`), and its stdin: a pipe whose write end stays
/// here, or `/dev/null`.
struct Pipes {
    out: OwnedFd,
    out_w: OwnedFd,
    err: OwnedFd,
    err_w: OwnedFd,
    input: OwnedFd,
    input_w: Option<OwnedFd>,
}

/// What one request was answered, and what its connection becomes.
struct Answered {
    resp: Response,
    /// A descriptor sent with the answer (a terminal, a stdin pipe).
    send_fd: Option<OwnedFd>,
    /// The connection now waits for this exec's exit.
    exec_pid: Option<i32>,
    /// The connection now receives events.
    watch: bool,
}

/// Writes one answer line, blocking (the client reads it at once), with
/// `fd` passed beside it.
fn reply(sock: &mut UnixStream, resp: &Response, fd: Option<OwnedFd>) {
    let mut out = serde_json::to_vec(resp).unwrap_or_default();
    out.push(b'\n');
    let _ = sock.set_nonblocking(false);
    match fd {
        Some(t) => send_with_fd(sock, &out, &t),
        None => {
            let _ = sock.write_all(&out);
        }
    }
    let _ = sock.set_nonblocking(true);
}

/// Why the monitor could not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{}: {source}", path.display())]
    Dir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{call}: {source}")]
    Sys {
        call: &'static str,
        source: std::io::Error,
    },
}

fn sys(call: &'static str) -> impl FnOnce(std::io::Error) -> ServeError {
    move |source| ServeError::Sys { call, source }
}

fn last_os(call: &'static str) -> ServeError {
    sys(call)(std::io::Error::last_os_error())
}

/// Serves `dir` unless a monitor already does. Forks at once: the child
/// becomes the daemon (a session leader and subreaper, logging to
/// `dir/monitor.log`), takes the dir's lock, binds the socket and tells the
/// parent, which returns then (the socket already accepts). Two monitors
/// started at once for one dir (kinglet at start and its event task, or two
/// kinglets) end as one: the second child finds the lock taken and exits.
pub fn daemonize_and_serve(dir: &Path) -> Result<(), ServeError> {
    std::fs::create_dir_all(dir.join("records")).map_err(|source| ServeError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    // No ping first: the lock decides, and a ping can hang on a dead
    // monitor's socket that a forked container init still holds open.
    let (ready_r, ready_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| sys("pipe")(e.into()))?;
    // SAFETY: this process is single-threaded here (the `monitor` command
    // runs before any runtime or thread exists), so fork is safe.
    match unsafe { libc::fork() } {
        -1 => return Err(last_os("fork")),
        0 => {}
        _ => {
            // One byte once the child serves; the end of file if it found
            // another monitor and left.
            drop(ready_w);
            let mut b = [0u8; 1];
            let _ = rustix::io::read(&ready_r, &mut b);
            return Ok(());
        }
    }
    drop(ready_r);
    let Some(_lock) = lock_dir(dir) else {
        std::process::exit(0);
    };
    let sock = socket_path(dir);
    let _ = std::fs::remove_file(&sock);
    let listener = match UnixListener::bind(&sock).and_then(|l| {
        l.set_nonblocking(true)?;
        Ok(l)
    }) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{}: {e}", sock.display());
            std::process::exit(1);
        }
    };
    let _ = rustix::io::write(&ready_w, b"1");
    drop(ready_w);
    become_daemon(dir);
    let mut m = Monitor::new(dir);
    m.load();
    eprintln!(
        "{} monitor {} serving {}",
        jiff::Timestamp::now(),
        std::process::id(),
        sock.display()
    );
    match m.serve(listener) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{} monitor failed: {e}", jiff::Timestamp::now());
            std::process::exit(1);
        }
    }
}

/// The forked child's daemon setup: a session of its own, the subreaper
/// of the containers it starts, SIGPIPE ignored, its output to
/// `dir/monitor.log` and its input from `/dev/null`.
fn become_daemon(dir: &Path) {
    // SAFETY: plain syscalls in the child.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    if let Ok(log) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("monitor.log"))
    {
        // SAFETY: dup2 onto stdout/stderr of this process.
        unsafe {
            libc::dup2(log.as_raw_fd(), 1);
            libc::dup2(log.as_raw_fd(), 2);
        }
    }
    if let Ok(null) = std::fs::File::open("/dev/null") {
        // SAFETY: as above, stdin.
        unsafe { libc::dup2(null.as_raw_fd(), 0) };
    }
}

/// The dir's lock: a POSIX record lock, held by this process alone (a
/// forked container process never inherits it, so a container cannot keep
/// a new monitor out), released by the kernel when the monitor dies.
fn lock_dir(dir: &Path) -> Option<std::fs::File> {
    let f = super::lock_file(dir)?;
    let mut fl = super::write_lock();
    // SAFETY: fcntl on an fd we own with a valid flock.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &mut fl) };
    (r == 0).then_some(f)
}

fn signalfd_chld() -> Result<OwnedFd, ServeError> {
    // SAFETY: standard sigset/sigprocmask/signalfd use; the fd is owned below.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(last_os("sigprocmask"));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(last_os("signalfd"));
        }
        Ok(std::os::fd::FromRawFd::from_raw_fd(fd))
    }
}

/// OOM kills so far, from `memory.events` (v2) or `memory.oom_control` (v1).
fn oom_kills(file: &Path) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// Where the OOM counter of the container's cgroup lives.
fn oom_file_for(bundle: &Path) -> Option<PathBuf> {
    let cg = container::cgroups_path(bundle)?;
    let root = Path::new("/sys/fs/cgroup");
    Some(if Hierarchy::detect(root) == Hierarchy::V2 {
        Path::new("/sys/fs/cgroup").join(cg).join("memory.events")
    } else {
        Path::new("/sys/fs/cgroup/memory")
            .join(cg)
            .join("memory.oom_control")
    })
}

/// Marks a container whose exit no monitor reaped as exited now: its code
/// unknown (the kernel gave it to init), unless its cgroup counted an OOM
/// kill, which reads as the kernel's SIGKILL.
fn mark_lost(r: &mut ContainerRecord) {
    r.status = "exited".into();
    r.finished_at = Some(now_nanos());
    if let Some(f) = &r.oom_file
        && oom_kills(f) > r.oom_kills_before
    {
        r.oom_killed = true;
        r.signal = Some(libc::SIGKILL);
        r.exit_code = Some(128 + libc::SIGKILL);
    }
}

/// A wait status as an exit code: 128 + signal when a signal ended it.
fn exit_code_of(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// Writes an answer with one descriptor attached (best effort, as every
/// answer: a client that went away is cleaned up by the caller).
fn send_with_fd(sock: &UnixStream, line: &[u8], fd: &OwnedFd) {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::os::fd::AsFd;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    let fds = [fd.as_fd()];
    cmsg.push(SendAncillaryMessage::ScmRights(&fds));
    let iov = [std::io::IoSlice::new(line)];
    match rustix::net::sendmsg(sock, &iov, &mut cmsg, SendFlags::empty()) {
        Ok(n) if n < line.len() => {
            let _ = (&*sock).write_all(&line[n..]);
        }
        _ => {}
    }
}

/// Reads what a client sent, keeping the file descriptors that came with it.
fn recv(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> std::io::Result<usize> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let r = rustix::net::recvmsg(sock, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    Ok(r.bytes)
}

/// Writes a chunk of a container's output to its attached readers; one
/// that cannot take the whole chunk now (it fell behind, or went away) is
/// dropped: the monitor never blocks on a reader.
fn copy_to_taps(taps: &mut Vec<Tap>, id: &str, name: &str, chunk: &[u8]) {
    taps.retain(|t| {
        t.id != id
            || t.name != name
            || matches!(rustix::io::write(&t.fd, chunk), Ok(n) if n == chunk.len())
    });
}

fn pollfd(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn failed(message: String) -> Response {
    Response::Error {
        message,
        kind: ErrorKind::Failed,
    }
}

fn not_found(id: &str) -> Response {
    Response::Error {
        message: format!("container {id} not found"),
        kind: ErrorKind::NotFound,
    }
}

impl Monitor {
    /// A monitor of `dir` with nothing loaded yet.
    fn new(dir: &Path) -> Self {
        Self::with(dir, Box::new(Kernel))
    }

    /// The same, with `procs` doing its process work.
    fn with(dir: &Path, procs: Box<dyn Processes>) -> Self {
        Monitor {
            dir: dir.to_path_buf(),
            state_root: dir.join("state"),
            records: BTreeMap::new(),
            pids: HashMap::new(),
            streams: Vec::new(),
            logs: HashMap::new(),
            watchers: Vec::new(),
            execs: Vec::new(),
            stdins: HashMap::new(),
            taps: Vec::new(),
            adopted: Vec::new(),
            boot_id: procid::boot_id(),
            procs,
        }
    }

    /// Tells every watcher that `id` is now `status`. A watcher whose socket
    /// would block (it stopped reading) or is gone is dropped: it reconnects
    /// and relists, so nothing is lost, and the monitor never waits on it.
    fn announce(&mut self, id: &str, status: &str) {
        if self.watchers.is_empty() {
            return;
        }
        let ev = Event {
            id: id.into(),
            status: status.into(),
        };
        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
        line.push(b'\n');
        self.watchers
            .retain_mut(|w| matches!(w.write(&line), Ok(n) if n == line.len()));
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join("records").join(format!("{id}.json"))
    }

    fn persist(&self, id: &str) {
        let Some(r) = self.records.get(id) else {
            return;
        };
        let path = self.record_path(id);
        let tmp = path.with_extension("json.tmp");
        if let Ok(data) = serde_json::to_vec(r)
            && std::fs::write(&tmp, data).is_ok()
        {
            let _ = std::fs::rename(&tmp, &path);
        }
    }

    /// Records of an earlier monitor. A container whose process is still
    /// the one recorded (same boot, same start time) is taken over: its
    /// exit watched through a pidfd, its output read again from its FIFOs
    /// into its log. Any other is marked exited, its code unknown: after a
    /// reboot or a crash of the container while no monitor ran, the pid in
    /// the record names nothing of ours.
    fn load(&mut self) {
        let Ok(rd) = std::fs::read_dir(self.dir.join("records")) else {
            return;
        };
        for e in rd.flatten() {
            let Ok(data) = std::fs::read(e.path()) else {
                continue;
            };
            let Ok(mut r) = serde_json::from_slice::<ContainerRecord>(&data) else {
                continue;
            };
            let lost = r.status != "exited" && !self.take_over(&r);
            if lost {
                mark_lost(&mut r);
                eprintln!(
                    "{} container {} (pid {}) is gone: marked exited",
                    jiff::Timestamp::now(),
                    r.id,
                    r.pid
                );
            }
            let id = r.id.clone();
            self.records.insert(id.clone(), r);
            if lost {
                self.persist(&id);
            }
        }
        self.sweep_unrecorded();
    }

    /// What a monitor killed in the middle of a create leaves: the FIFOs
    /// and the libcontainer state (a cgroup, maybe an init process) of a
    /// container it never recorded. Run before serving, so no create of
    /// this monitor is under way.
    fn sweep_unrecorded(&mut self) {
        let fifos = self.dir.join("fifos");
        for e in std::fs::read_dir(&fifos).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.rsplit_once('.').map_or(name.as_str(), |(id, _)| id);
            if !self.records.contains_key(id) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        for e in std::fs::read_dir(&self.state_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let id = e.file_name().to_string_lossy().into_owned();
            if self.records.contains_key(&id) {
                continue;
            }
            let gone = self.procs.delete(&self.state_root, &id).or_else(|_| {
                let state: serde_json::Value = std::fs::read(e.path().join("state.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .unwrap_or_default();
                let bundle = PathBuf::from(state["bundle"].as_str().unwrap_or_default());
                self.procs.forget(&self.state_root, &id, &bundle)
            });
            eprintln!(
                "{} container {id} was never recorded (a monitor died creating it): removed{}",
                jiff::Timestamp::now(),
                gone.err()
                    .map(|e| format!(" but for: {e}"))
                    .unwrap_or_default()
            );
        }
    }

    /// Watches a container of an earlier monitor if its process is still
    /// the one recorded: a pidfd for its exit (opened before the identity
    /// check, so a pid reused in between is never taken), its log and its
    /// FIFOs. `false`: the process is gone.
    fn take_over(&mut self, r: &ContainerRecord) -> bool {
        let pidfd = adopt::pidfd(r.pid);
        let who = r.identity();
        if !who.is_alive(&self.boot_id) {
            return false;
        }
        if let Ok(log) = LogFile::open(&r.log_path, r.log_max_size, r.log_max_files.max(1)) {
            self.logs.insert(r.id.clone(), log);
        }
        for name in ["stdout", "stderr"] {
            match adopt::open_reader(&adopt::fifo_path(&self.dir, &r.id, name)) {
                Ok(fd) => self.streams.push(Stream {
                    fd,
                    id: r.id.clone(),
                    name,
                    split: LineSplitter::default(),
                }),
                // A container of a monitor from before FIFOs: its output
                // pipe died with that monitor.
                Err(e) => eprintln!(
                    "{} container {}: no {name} to read: {e}",
                    jiff::Timestamp::now(),
                    r.id
                ),
            }
        }
        eprintln!(
            "{} container {} (pid {}) taken over{}",
            jiff::Timestamp::now(),
            r.id,
            r.pid,
            if pidfd.is_some() {
                ""
            } else {
                " (no pidfd: checked every second)"
            }
        );
        self.adopted.push(Adopted {
            id: r.id.clone(),
            who,
            pidfd,
        });
        true
    }

    /// The taken-over containers that exited: `ready` marks pidfds that
    /// became readable; those without a pidfd are checked by identity.
    fn adopted_exits(&mut self, ready: &[bool]) {
        let boot = self.boot_id.clone();
        let mut gone = Vec::new();
        let mut i = 0;
        self.adopted.retain(|a| {
            let exited = match &a.pidfd {
                Some(_) => {
                    let r = ready.get(i).copied().unwrap_or(false);
                    i += 1;
                    r
                }
                None => !a.who.is_alive(&boot),
            };
            if exited {
                gone.push(a.id.clone());
            }
            !exited
        });
        for id in gone {
            self.drain_streams_of(&id);
            let Some(r) = self.records.get_mut(&id) else {
                continue;
            };
            mark_lost(r);
            self.persist(&id);
            self.stdins.remove(&id);
            self.announce(&id, "exited");
        }
    }

    /// Reads what is left in a container's streams and ends them (an exit
    /// seen through a pidfd may come before the end of file).
    fn drain_streams_of(&mut self, id: &str) {
        let ready: Vec<bool> = self.streams.iter().map(|s| s.id == id).collect();
        self.read_streams(&ready);
        while let Some(i) = self.streams.iter().position(|s| s.id == id) {
            self.end_stream(i);
        }
    }

    fn serve(&mut self, listener: UnixListener) -> Result<(), ServeError> {
        let sigfd = signalfd_chld()?;
        let mut clients: Vec<Client> = Vec::new();
        loop {
            // One poll set: SIGCHLD, the listener, clients, output pipes,
            // watchers (only to learn that they went away).
            let mut fds = vec![pollfd(sigfd.as_raw_fd()), pollfd(listener.as_raw_fd())];
            fds.extend(clients.iter().map(|c| pollfd(c.sock.as_raw_fd())));
            fds.extend(self.streams.iter().map(|s| pollfd(s.fd.as_raw_fd())));
            fds.extend(self.watchers.iter().map(|w| pollfd(w.as_raw_fd())));
            fds.extend(self.execs.iter().map(|(_, c)| pollfd(c.as_raw_fd())));
            fds.extend(
                self.adopted
                    .iter()
                    .filter_map(|a| a.pidfd.as_ref().map(|p| pollfd(p.as_raw_fd()))),
            );
            // Only a taken-over container without a pidfd needs a timer.
            let timeout = if self.adopted.iter().any(|a| a.pidfd.is_none()) {
                1000
            } else {
                -1
            };
            // SAFETY: fds is a valid array of pollfd for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(sys("poll")(e));
            }
            let ready = |i: usize| fds.get(i).is_some_and(|f| f.revents != 0);
            let (nc, ns, nw) = (clients.len(), self.streams.len(), self.watchers.len());
            // Output first, so logs are complete before an exit is recorded.
            let streams: Vec<bool> = (0..ns).map(|i| ready(2 + nc + i)).collect();
            self.read_streams(&streams);
            let watchers: Vec<bool> = (0..nw).map(|i| ready(2 + nc + ns + i)).collect();
            self.drop_gone_watchers(&watchers);
            let ne = self.execs.len();
            let execs: Vec<bool> = (0..ne).map(|i| ready(2 + nc + ns + nw + i)).collect();
            let na = self.adopted.iter().filter(|a| a.pidfd.is_some()).count();
            let adopted: Vec<bool> = (0..na).map(|i| ready(2 + nc + ns + nw + ne + i)).collect();
            self.kill_abandoned_execs(&execs);
            self.adopted_exits(&adopted);
            if ready(0) {
                let mut buf = [0u8; 128 * 8];
                while matches!(rustix::io::read(&sigfd, &mut buf), Ok(n) if n > 0) {}
                self.reap();
            }
            if ready(1) {
                while let Ok((sock, _)) = listener.accept() {
                    let _ = sock.set_nonblocking(true);
                    clients.push(Client {
                        sock,
                        buf: Vec::new(),
                        fds: Vec::new(),
                    });
                }
            }
            let readable: Vec<bool> = (0..nc).map(|i| ready(2 + i)).collect();
            self.serve_clients(&mut clients, &readable);
        }
    }

    /// Reads the output pipes that are ready into their logs; a closed pipe
    /// ends its stream (and, with both closed, the container's log).
    fn read_streams(&mut self, ready: &[bool]) {
        let mut closed = Vec::new();
        for (i, s) in self.streams.iter_mut().enumerate() {
            if !ready.get(i).copied().unwrap_or(false) {
                continue;
            }
            let mut buf = [0u8; 32 * 1024];
            loop {
                match rustix::io::read(&s.fd, &mut buf) {
                    Ok(0) => {
                        closed.push(i);
                        break;
                    }
                    Ok(n) => {
                        if let Some(log) = self.logs.get_mut(&s.id) {
                            let name = s.name;
                            s.split.feed(&buf[..n], |p, l| log.record(name, p, l));
                        }
                        copy_to_taps(&mut self.taps, &s.id, s.name, &buf[..n]);
                    }
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => {
                        closed.push(i);
                        break;
                    }
                }
            }
        }
        for i in closed.into_iter().rev() {
            self.end_stream(i);
        }
    }

    /// Ends stream `i`: its partial line is logged, its readers see the
    /// end too, and the log closes with the container's last stream.
    fn end_stream(&mut self, i: usize) {
        let mut s = self.streams.remove(i);
        self.taps.retain(|t| !(t.id == s.id && t.name == s.name));
        if let Some(log) = self.logs.get_mut(&s.id) {
            let name = s.name;
            s.split.finish(|p, l| log.record(name, p, l));
        }
        if !self.streams.iter().any(|x| x.id == s.id) {
            self.logs.remove(&s.id);
        }
    }

    /// A watcher never sends after `watch`: readable means closed (or
    /// misbehaving), and it goes, so a restarting agent leaks no fds here.
    fn drop_gone_watchers(&mut self, ready: &[bool]) {
        let mut i = 0;
        self.watchers.retain_mut(|w| {
            let keep = !ready.get(i).copied().unwrap_or(false) || {
                let mut buf = [0u8; 64];
                matches!(w.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            };
            i += 1;
            keep
        });
    }

    /// An exec's connection never sends after its request: readable means
    /// the caller went away (a timeout, a closed stream), and the process
    /// is killed, as CRI kills an exec whose caller is gone. Its exit is
    /// still reaped by [`Monitor::reap`].
    fn kill_abandoned_execs(&mut self, ready: &[bool]) {
        let mut i = 0;
        self.execs.retain_mut(|(pid, c)| {
            let gone = ready.get(i).copied().unwrap_or(false) && {
                let mut buf = [0u8; 64];
                !matches!(c.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            };
            i += 1;
            if gone {
                self.procs.kill_child(*pid);
            }
            !gone
        });
    }

    /// Starts an exec from a client's request and its three fds; its
    /// connection then waits for the exit.
    fn exec(
        &mut self,
        id: &str,
        args: Vec<String>,
        fds: Vec<OwnedFd>,
    ) -> Result<i32, Box<Response>> {
        let bundle = self.running_bundle(id)?;
        let Ok(stdio) = <[OwnedFd; 3]>::try_from(fds) else {
            return Err(Box::new(failed(
                "exec needs three file descriptors (stdin, stdout, stderr)".into(),
            )));
        };
        container::exec(&self.state_root, id, &bundle, args, stdio)
            .map_err(|e| Box::new(failed(e.to_string())))
    }

    /// The bundle of running container `id`, or the answer saying why not.
    fn running_bundle(&self, id: &str) -> Result<PathBuf, Box<Response>> {
        let Some(r) = self.records.get(id) else {
            return Err(Box::new(not_found(id)));
        };
        if r.status != "running" {
            return Err(Box::new(failed(format!(
                "container {id} is not running ({})",
                r.status
            ))));
        }
        Ok(r.bundle.clone())
    }

    /// As [`Self::exec`], on a new terminal (no descriptors needed).
    fn exec_tty(&mut self, id: &str, args: Vec<String>) -> Result<(i32, OwnedFd), Box<Response>> {
        let bundle = self.running_bundle(id)?;
        container::exec_tty(&self.state_root, id, &bundle, args)
            .map_err(|e| Box::new(failed(e.to_string())))
    }

    /// Adds the two taps sent with an attach; returns the stdin to send
    /// back (the pipe itself with `stdinOnce`, else a copy).
    fn attach(&mut self, id: &str, fds: Vec<OwnedFd>) -> Result<Option<OwnedFd>, Box<Response>> {
        self.running_bundle(id)?;
        let Ok([out, err]) = <[OwnedFd; 2]>::try_from(fds) else {
            return Err(Box::new(failed(
                "attach needs two file descriptors (stdout, stderr)".into(),
            )));
        };
        for fd in [&out, &err] {
            rustix::io::ioctl_fionbio(fd, true)
                .map_err(|e| Box::new(failed(format!("attach: {e}"))))?;
        }
        for (fd, name) in [(out, "stdout"), (err, "stderr")] {
            self.taps.push(Tap {
                id: id.into(),
                name,
                fd,
            });
        }
        let stdin = match self.stdins.get(id) {
            Some((_, true)) => self.stdins.remove(id).map(|(w, _)| w),
            Some((w, false)) => w.try_clone().ok(),
            None => None,
        };
        Ok(stdin)
    }

    /// Answers the requests of the clients that are ready. A `watch` turns
    /// its connection into a watcher at once (anything it sent after the
    /// request is ignored: the connection is a stream from then on).
    fn serve_clients(&mut self, clients: &mut Vec<Client>, ready: &[bool]) {
        let mut gone = vec![false; clients.len()];
        for (i, c) in clients.iter_mut().enumerate() {
            if !ready.get(i).copied().unwrap_or(false) {
                continue;
            }
            let mut buf = [0u8; 8192];
            match recv(&c.sock, &mut buf, &mut c.fds) {
                Ok(0) => gone[i] = true,
                Ok(n) => c.buf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => gone[i] = true,
            }
            while let Some(nl) = c.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = c.buf.drain(..=nl).collect();
                let a = self.answer(&line, &mut c.fds);
                // Descriptors not taken by an exec are not kept around.
                c.fds.clear();
                reply(&mut c.sock, &a.resp, a.send_fd);
                if a.watch {
                    if let Ok(w) = c.sock.try_clone() {
                        self.watchers.push(w);
                    }
                    gone[i] = true;
                    break;
                }
                if let Some(pid) = a.exec_pid {
                    match c.sock.try_clone() {
                        Ok(w) => self.execs.push((pid, w)),
                        Err(_) => self.procs.kill_child(pid),
                    }
                    gone[i] = true;
                    break;
                }
            }
        }
        let mut i = 0;
        clients.retain(|_| {
            i += 1;
            !gone[i - 1]
        });
    }

    /// Answers one request line; `fds` are the descriptors it came with.
    fn answer(&mut self, line: &[u8], fds: &mut Vec<OwnedFd>) -> Answered {
        let req = serde_json::from_slice::<Request>(line);
        let mut a = Answered {
            resp: Response::Ok,
            send_fd: None,
            exec_pid: None,
            watch: matches!(req, Ok(Request::Watch)),
        };
        a.resp = match req {
            Ok(Request::Exec {
                id,
                args,
                tty: true,
            }) => match self.exec_tty(&id, args) {
                Ok((pid, master)) => {
                    a.exec_pid = Some(pid);
                    a.send_fd = Some(master);
                    Response::Exec { pid }
                }
                Err(r) => *r,
            },
            Ok(Request::Attach { id }) => match self.attach(&id, std::mem::take(fds)) {
                Ok(stdin) => {
                    a.send_fd = stdin;
                    Response::Attached {
                        stdin: a.send_fd.is_some(),
                    }
                }
                Err(r) => *r,
            },
            Ok(Request::Exec { id, args, .. }) => match self.exec(&id, args, std::mem::take(fds)) {
                Ok(pid) => {
                    a.exec_pid = Some(pid);
                    Response::Exec { pid }
                }
                Err(r) => *r,
            },
            Ok(req) => self.handle(req),
            Err(e) => failed(format!("bad request: {e}")),
        };
        a
    }

    /// Collects exited children; records exit code, signal and OOM kill.
    fn reap(&mut self) {
        let mut exited = Vec::new();
        while let Some((pid, status)) = self.procs.wait_any() {
            if let Some(at) = self.execs.iter().position(|(p, _)| *p == pid) {
                let (_, mut conn) = self.execs.swap_remove(at);
                let exit_code = exit_code_of(status);
                let mut out =
                    serde_json::to_vec(&Response::Exited { exit_code }).unwrap_or_default();
                out.push(b'\n');
                let _ = conn.set_nonblocking(false);
                let _ = conn.write_all(&out);
                continue;
            }
            let Some(id) = self.pids.remove(&pid) else {
                continue;
            };
            let Some(r) = self.records.get_mut(&id) else {
                continue;
            };
            r.status = "exited".into();
            r.finished_at = Some(now_nanos());
            exited.push(id.clone());
            if libc::WIFEXITED(status) {
                r.exit_code = Some(libc::WEXITSTATUS(status));
            } else if libc::WIFSIGNALED(status) {
                let sig = libc::WTERMSIG(status);
                r.signal = Some(sig);
                r.exit_code = Some(128 + sig);
            }
            if let Some(f) = &r.oom_file {
                r.oom_killed = oom_kills(f) > r.oom_kills_before;
            }
            self.persist(&id);
        }
        for id in exited {
            // Nothing reads its stdin any more.
            self.stdins.remove(&id);
            self.announce(&id, "exited");
        }
    }

    fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Ping | Request::Watch => Response::Ok,
            // Served by serve_clients, which has the request's fds.
            Request::Exec { .. } => failed("exec without its file descriptors".into()),
            Request::Attach { .. } => failed("attach without its file descriptors".into()),
            Request::Exit => self.exit(),
            Request::List => Response::Records {
                records: self.records.values().cloned().collect(),
            },
            Request::State { id } => match self.records.get(&id) {
                Some(r) => Response::Record { record: r.clone() },
                None => not_found(&id),
            },
            Request::Create {
                id,
                bundle,
                log_path,
                log_max_size,
                log_max_files,
                stdin,
                stdin_once,
            } => {
                let stdin = stdin.then_some(stdin_once);
                self.create(id, bundle, log_path, (log_max_size, log_max_files), stdin)
            }
            Request::Start { id } => self.start(&id),
            Request::Kill { id, signal } => match self.records.get(&id) {
                None => not_found(&id),
                Some(r) if r.status == "exited" => Response::Ok,
                Some(_) => match self.procs.kill(&self.state_root, &id, signal) {
                    Ok(()) => Response::Ok,
                    Err(e) => failed(e.to_string()),
                },
            },
            Request::Delete { id } => self.delete(&id),
        }
    }

    fn exit(&mut self) -> Response {
        if self.records.is_empty() {
            let _ = std::fs::remove_file(socket_path(&self.dir));
            eprintln!("{} monitor exiting on request", jiff::Timestamp::now());
            std::process::exit(0);
        }
        failed(format!(
            "{} containers are still known; delete them first",
            self.records.len()
        ))
    }

    /// Creates the container with its output on two pipes the poll loop
    /// reads into its log.
    /// `stdin`: whether the container reads a pipe the monitor holds, and
    /// if so whether only once (`stdinOnce`).
    fn create(
        &mut self,
        id: String,
        bundle: PathBuf,
        log_path: PathBuf,
        (log_max_size, log_max_files): (u64, u32),
        stdin: Option<bool>,
    ) -> Response {
        if self.records.contains_key(&id) {
            return Response::Error {
                message: format!("container {id} already exists"),
                kind: ErrorKind::AlreadyExists,
            };
        }
        let p = match self.pipes(&id, stdin.is_some()) {
            Ok(p) => p,
            Err(e) => return failed(format!("output fifos: {e}")),
        };
        let log = match LogFile::open(&log_path, log_max_size, log_max_files) {
            Ok(l) => l,
            Err(e) => return failed(format!("log {}: {e}", log_path.display())),
        };
        let oom_file = oom_file_for(&bundle);
        let pid =
            match self
                .procs
                .create(&self.state_root, &id, &bundle, [p.input, p.out_w, p.err_w])
            {
                Ok(p) => p,
                Err(e) => {
                    self.remove_fifos(&id);
                    return failed(e.to_string());
                }
            };
        let before = oom_file.as_deref().map_or(0, oom_kills);
        let who = Identity::of(pid);
        let r = ContainerRecord {
            id: id.clone(),
            pid,
            bundle,
            log_path,
            status: "created".into(),
            created_at: now_nanos(),
            oom_file,
            oom_kills_before: before,
            boot_id: who.boot_id,
            start_ticks: who.start_ticks,
            log_max_size,
            log_max_files,
            ..Default::default()
        };
        self.pids.insert(pid, id.clone());
        self.logs.insert(id.clone(), log);
        if let (Some(w), Some(once)) = (p.input_w, stdin) {
            self.stdins.insert(id.clone(), (w, once));
        }
        for (fd, name) in [(p.out, "stdout"), (p.err, "stderr")] {
            self.streams.push(Stream {
                fd,
                id: id.clone(),
                name,
                split: LineSplitter::default(),
            });
        }
        self.records.insert(id.clone(), r.clone());
        self.persist(&id);
        self.announce(&id, "created");
        Response::Record { record: r }
    }

    /// A new container's pipes (see [`Pipes`]).
    fn pipes(&self, id: &str, stdin: bool) -> std::io::Result<Pipes> {
        let (out, out_w) = adopt::make_fifo(&adopt::fifo_path(&self.dir, id, "stdout"))?;
        let (err, err_w) = adopt::make_fifo(&adopt::fifo_path(&self.dir, id, "stderr"))?;
        let (input, input_w) = if stdin {
            let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
            (r, Some(w))
        } else {
            (std::fs::File::open("/dev/null")?.into(), None)
        };
        Ok(Pipes {
            out,
            out_w,
            err,
            err_w,
            input,
            input_w,
        })
    }

    fn start(&mut self, id: &str) -> Response {
        if !self.records.contains_key(id) {
            return not_found(id);
        }
        if let Err(e) = self.procs.start(&self.state_root, id) {
            return failed(e.to_string());
        }
        let Some(r) = self.records.get_mut(id) else {
            return not_found(id);
        };
        if r.status == "created" {
            r.status = "running".into();
        }
        r.started_at = Some(now_nanos());
        let r = r.clone();
        self.persist(id);
        self.announce(id, "running");
        Response::Record { record: r }
    }

    fn remove_fifos(&self, id: &str) {
        for name in ["stdout", "stderr"] {
            let _ = std::fs::remove_file(adopt::fifo_path(&self.dir, id, name));
        }
    }

    fn delete(&mut self, id: &str) -> Response {
        if let Err(e) = self.procs.delete(&self.state_root, id) {
            // libcontainer judges by the pid in its state: after a reboot
            // that pid may name another process, or the cgroup it kills
            // through is gone. A container we know has exited is only
            // state on disk, removed here instead.
            let bundle = match self.records.get(id) {
                Some(r) if r.status != "exited" => return failed(e.to_string()),
                r => r.map(|r| r.bundle.clone()).unwrap_or_default(),
            };
            eprintln!("{} {e}: removing its state", jiff::Timestamp::now());
            if let Err(e) = self.procs.forget(&self.state_root, id, &bundle) {
                return failed(e.to_string());
            }
        }
        self.reap();
        if let Some(r) = self.records.remove(id) {
            self.pids.remove(&r.pid);
        }
        self.adopted.retain(|a| a.id != id);
        self.remove_fifos(id);
        self.streams.retain(|s| s.id != id);
        self.taps.retain(|t| t.id != id);
        self.stdins.remove(id);
        self.logs.remove(id);
        let _ = std::fs::remove_file(self.record_path(id));
        self.announce(id, "deleted");
        Response::Ok
    }
}

#[cfg(test)]
mod tests;
