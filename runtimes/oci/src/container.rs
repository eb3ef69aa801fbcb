//! One container through youki's `libcontainer`: create (the init process
//! waits), start, exec, signal, delete. Called only from the monitor process,
//! which is single-threaded: libcontainer forks, and forking a
//! multi-threaded process is unsafe.

use std::os::fd::OwnedFd;
use std::path::Path;

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::signal::Signal;
use libcontainer::syscall::syscall::SyscallType;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};

/// A libcontainer failure, with the container it concerns.
#[derive(Debug, thiserror::Error)]
#[error("container {id}: {message}")]
pub struct ContainerError {
    pub id: String,
    pub message: String,
}

fn err(id: &str, e: impl std::fmt::Display) -> ContainerError {
    ContainerError {
        id: id.into(),
        message: e.to_string(),
    }
}

/// libcontainer's default executor, after giving every signal its default
/// action back. The monitor is a Rust program, which ignores SIGPIPE, and
/// an ignored signal stays ignored across `execve` (so does one its own
/// parent ignored): without this, every container process would ignore
/// SIGPIPE and `yes | head` would spin forever. Containers start with
/// default dispositions, as runc's do.
#[derive(Clone)]
struct DefaultSignals;

impl Executor for DefaultSignals {
    fn exec(&self, spec: &oci_spec::runtime::Spec) -> Result<(), ExecutorError> {
        for sig in 1..=libc::SIGRTMAX() {
            // SAFETY: the container's own process, single-threaded, just
            // before it execs the workload; resetting a disposition is
            // async-signal-safe. SIGKILL, SIGSTOP and the C library's
            // reserved signals refuse, which changes nothing.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
        libcontainer::workload::default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &oci_spec::runtime::Spec) -> Result<(), ExecutorValidationError> {
        libcontainer::workload::default::get_executor().validate(spec)
    }
}

/// Creates the container from `bundle` (config.json + rootfs); its init
/// process waits for `start`. Returns the init pid.
pub fn create(
    state_root: &Path,
    id: &str,
    bundle: &Path,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> Result<i32, ContainerError> {
    std::fs::create_dir_all(state_root).map_err(|e| err(id, e))?;
    let container = ContainerBuilder::new(id.to_string(), SyscallType::Linux)
        .with_executor(DefaultSignals)
        .with_root_path(state_root)
        .map_err(|e| err(id, e))?
        .validate_id()
        .map_err(|e| err(id, e))?
        .with_stdin(stdin)
        .with_stdout(stdout)
        .with_stderr(stderr)
        .as_init(bundle)
        .with_systemd(false)
        .with_detach(true)
        .build()
        .map_err(|e| err(id, format!("create: {e} ({e:?})")))?;
    container
        .pid()
        .map(|p| p.as_raw())
        .ok_or_else(|| err(id, "created without an init pid"))
}

/// Starts `args` inside the running container `id` (libcontainer's tenant
/// builder: its namespaces, cgroup, rootfs, environment, capabilities and
/// no_new_privs) as the container's own user, in its working directory, as
/// runc exec does. The process is a child of the caller (the monitor),
/// which reaps it. Returns its pid.
pub fn exec(
    state_root: &Path,
    id: &str,
    bundle: &Path,
    args: Vec<String>,
    [stdin, stdout, stderr]: [OwnedFd; 3],
) -> Result<i32, ContainerError> {
    let spec = oci_spec::runtime::Spec::load(bundle.join("config.json"))
        .map_err(|e| err(id, format!("exec: {e}")))?;
    let process = spec.process().clone().unwrap_or_default();
    let user = process.user();
    let gids = user.additional_gids().clone().unwrap_or_default();
    let pid = ContainerBuilder::new(id.to_string(), SyscallType::Linux)
        .with_executor(DefaultSignals)
        .with_root_path(state_root)
        .map_err(|e| err(id, e))?
        .with_stdin(stdin)
        .with_stdout(stdout)
        .with_stderr(stderr)
        .as_tenant()
        .with_detach(true)
        .with_container_args(args)
        .with_cwd(Some(process.cwd().clone()))
        .with_user(Some(user.uid()))
        .with_group(Some(user.gid()))
        .with_additional_gids(gids)
        .build()
        .map_err(|e| err(id, format!("exec: {e}")))?;
    Ok(pid.as_raw())
}

/// As [`exec`], on a new terminal: libcontainer's tenant makes the
/// pseudo-terminal from the container's own devpts, makes it the
/// process's controlling terminal and stdio, and sends the master end over
/// a console socket; that master is returned with the pid.
///
/// No thread accepts the console socket while the tenant starts (the
/// monitor stays single-threaded): the child's connect and send complete
/// against the listen backlog, and the master is collected after `build`.
pub fn exec_tty(
    state_root: &Path,
    id: &str,
    bundle: &Path,
    args: Vec<String>,
) -> Result<(i32, OwnedFd), ContainerError> {
    let spec = oci_spec::runtime::Spec::load(bundle.join("config.json"))
        .map_err(|e| err(id, format!("exec: {e}")))?;
    let mut process = spec.process().clone().unwrap_or_default();
    process.set_args(Some(args));
    process.set_terminal(Some(true));
    process.set_console_size(None);
    let nonce = std::process::id()
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0));
    let dir = state_root.join(id);
    let process_json = dir.join(format!("exec-{nonce:x}.json"));
    let sock_path = dir.join(format!("exec-{nonce:x}.sock"));
    let cleanup = || {
        let _ = std::fs::remove_file(&process_json);
        let _ = std::fs::remove_file(&sock_path);
    };
    let r = (|| {
        let body = serde_json::to_vec(&process).map_err(|e| err(id, e))?;
        std::fs::write(&process_json, body).map_err(|e| err(id, e))?;
        let listener = bind_short(&dir, &format!("exec-{nonce:x}.sock")).map_err(|e| err(id, e))?;
        let pid = ContainerBuilder::new(id.to_string(), SyscallType::Linux)
            .with_executor(DefaultSignals)
            .with_root_path(state_root)
            .map_err(|e| err(id, e))?
            .with_console_socket(Some(&sock_path))
            .as_tenant()
            .with_detach(true)
            .with_process(Some(&process_json))
            .build()
            .map_err(|e| err(id, format!("exec: {e}")))?;
        let master =
            receive_master(&listener).map_err(|e| err(id, format!("exec terminal: {e}")))?;
        Ok((pid.as_raw(), master))
    })();
    cleanup();
    r
}

/// Binds `dir/name` through a relative path: a container's state dir is
/// often longer than a socket address may be (libcontainer connects
/// through a symlink for the same reason). The monitor is single-threaded,
/// so changing its working directory for a moment is safe.
fn bind_short(dir: &Path, name: &str) -> std::io::Result<std::os::unix::net::UnixListener> {
    let prev = std::env::current_dir()?;
    std::env::set_current_dir(dir)?;
    let r = std::os::unix::net::UnixListener::bind(name);
    std::env::set_current_dir(prev)?;
    r
}

/// The pty master the tenant sent, waiting at most 10 s for it.
fn receive_master(listener: &std::os::unix::net::UnixListener) -> std::io::Result<OwnedFd> {
    use rustix::event::{PollFd, PollFlags, poll};
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let timeout = rustix::event::Timespec {
        tv_sec: 10,
        tv_nsec: 0,
    };
    let mut fds = [PollFd::new(listener, PollFlags::IN)];
    if poll(&mut fds, Some(&timeout))? == 0 {
        return Err(std::io::Error::other(
            "no terminal from the exec within 10s",
        ));
    }
    let (conn, _) = listener.accept()?;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut buf = [0u8; 256];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut fds = [PollFd::new(&conn, PollFlags::IN)];
    if poll(&mut fds, Some(&timeout))? == 0 {
        return Err(std::io::Error::other(
            "no terminal from the exec within 10s",
        ));
    }
    rustix::net::recvmsg(&conn, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
    cmsg.drain()
        .find_map(|m| match m {
            RecvAncillaryMessage::ScmRights(mut it) => it.next(),
            _ => None,
        })
        .ok_or_else(|| std::io::Error::other("the console socket carried no terminal"))
}

fn load(state_root: &Path, id: &str) -> Result<Container, ContainerError> {
    Container::load(state_root.join(id)).map_err(|e| err(id, format!("load: {e}")))
}

pub fn start(state_root: &Path, id: &str) -> Result<(), ContainerError> {
    load(state_root, id)?
        .start()
        .map_err(|e| err(id, format!("start: {e}")))
}

pub fn kill(state_root: &Path, id: &str, signal: i32) -> Result<(), ContainerError> {
    let sig = Signal::try_from(signal).map_err(|e| err(id, e))?;
    let mut c = load(state_root, id)?;
    c.kill(sig, true).map_err(|e| err(id, format!("kill: {e}")))
}

/// Removes the container (killing what is left) and its cgroup.
pub fn delete(state_root: &Path, id: &str) -> Result<(), ContainerError> {
    match load(state_root, id) {
        Ok(mut c) => c.delete(true).map_err(|e| err(id, format!("delete: {e}"))),
        // Nothing recorded: already gone.
        Err(_) if !state_root.join(id).exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Forgets a container that is known to have exited but that
/// libcontainer cannot delete (its state names a pid of another boot, or a
/// cgroup that is gone): its state dir, and its cgroup if one is left
/// empty under any hierarchy.
pub fn forget(state_root: &Path, id: &str, bundle: &Path) -> Result<(), ContainerError> {
    if let Some(cg) = cgroups_path(bundle) {
        let root = Path::new("/sys/fs/cgroup");
        let mut dirs = vec![root.join(&cg)];
        if let Ok(rd) = std::fs::read_dir(root) {
            dirs.extend(rd.flatten().map(|e| e.path().join(&cg)));
        }
        for d in dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
    match std::fs::remove_dir_all(state_root.join(id)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(err(id, format!("removing its state: {e}"))),
    }
}

/// The container's cgroup, relative to a hierarchy's root.
pub fn cgroups_path(bundle: &Path) -> Option<String> {
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()?;
    let cg = spec["linux"]["cgroupsPath"]
        .as_str()?
        .trim_start_matches('/');
    (!cg.is_empty() && !cg.split('/').any(|c| c == "..")).then(|| cg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ContainerConfig;
    use std::io::Read;

    /// libcontainer binds and connects a container's notify socket through
    /// a `chdir` into its state dir (the monitor that runs it in
    /// production is single-threaded); two tests creating containers at
    /// once in this one process would connect to each other's sockets and
    /// leave a container waiting for its start forever.
    static CWD: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn cwd_lock() -> std::sync::MutexGuard<'static, ()> {
        CWD.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A rootfs with busybox-static, as the tests' images have.
    pub fn busybox_rootfs(dir: &Path) {
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::copy("/bin/busybox", dir.join("bin/busybox")).unwrap();
        for app in ["sh", "echo", "cat", "sleep", "ls", "id"] {
            std::os::unix::fs::symlink("busybox", dir.join("bin").join(app)).unwrap();
        }
    }

    /// A privileged container (every capability, rw /sys, all devices)
    /// runs as an unprivileged one does.
    #[test]
    fn runs_a_privileged_container() {
        let _cwd = cwd_lock();
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle");
        let rootfs = bundle.join("rootfs");
        busybox_rootfs(&rootfs);
        let id = format!("priv-{}", std::process::id());
        let cfg = ContainerConfig {
            args: vec!["/bin/sh".into(), "-c".into(), "echo ok; exit 0".into()],
            env: vec!["PATH=/bin".into()],
            rootfs: rootfs.clone(),
            hostname: "priv".into(),
            cgroups_path: format!("kinglet-test/{id}"),
            host_network: true,
            privileged: true,
            ..Default::default()
        };
        let spec = cfg.to_spec();
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec(&spec).unwrap(),
        )
        .unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        let devnull = std::fs::File::open("/dev/null").unwrap();
        let w2 = w.try_clone().unwrap();
        let state = dir.path().join("state");
        let pid = create(&state, &id, &bundle, devnull.into(), w, w2);
        let pid = match pid {
            Ok(p) => p,
            Err(e) => {
                let _ = delete(&state, &id);
                panic!("{e}");
            }
        };
        start(&state, &id).unwrap();
        let _ = rustix::process::waitpid(
            Some(rustix::process::Pid::from_raw(pid).unwrap()),
            rustix::process::WaitOptions::empty(),
        );
        let mut out = String::new();
        std::fs::File::from(r).read_to_string(&mut out).unwrap();
        assert_eq!(out, "ok\n");
        delete(&state, &id).unwrap();
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/kinglet-test"));
    }

    #[test]
    fn runs_a_container_and_collects_its_output() {
        let _cwd = cwd_lock();
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle");
        let rootfs = bundle.join("rootfs");
        busybox_rootfs(&rootfs);
        let id = format!("probe-{}", std::process::id());
        let cfg = ContainerConfig {
            args: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo hello from $(id -u); exit 3".into(),
            ],
            env: vec!["PATH=/bin".into()],
            rootfs: rootfs.clone(),
            hostname: "probe".into(),
            cgroups_path: format!("kinglet-test/{id}"),
            host_network: true,
            ..Default::default()
        };
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec(&cfg.to_spec()).unwrap(),
        )
        .unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        let devnull = std::fs::File::open("/dev/null").unwrap();
        let w2 = w.try_clone().unwrap();
        let state = dir.path().join("state");
        let pid = create(&state, &id, &bundle, devnull.into(), w, w2).unwrap();
        start(&state, &id).unwrap();
        let st = rustix::process::waitpid(
            Some(rustix::process::Pid::from_raw(pid).unwrap()),
            rustix::process::WaitOptions::empty(),
        )
        .unwrap()
        .unwrap();
        let mut out = String::new();
        std::fs::File::from(r).read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello from 0\n");
        assert_eq!(st.1.exit_status(), Some(3));
        delete(&state, &id).unwrap();
        for base in [
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/pids",
        ] {
            let p = Path::new(base).join("kinglet-test").join(&id);
            assert!(!p.exists(), "cgroup {} leaked", p.display());
            let _ = std::fs::remove_dir(Path::new(base).join("kinglet-test"));
        }
    }
}
