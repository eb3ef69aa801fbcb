//! What lets a container outlive its monitor (a kill -9, a crash, an
//! upgrade of the monitor itself) and a new monitor take it over:
//!
//! - **Output through FIFOs, not pipes.** A container's stdout and stderr
//!   are named pipes under `<monitor dir>/fifos/`, which the container holds
//!   open read-write. With the monitor gone the container is then still a
//!   reader of its own output, so its writes never meet `EPIPE`/`SIGPIPE`:
//!   they fill the pipe's buffer and block until a new monitor opens the
//!   FIFO by its path and drains it into the log. Nothing is lost beyond
//!   what a crash takes from the monitor's own memory (a partial line).
//! - **Exits through pidfds.** A taken-over container is not the new
//!   monitor's child (its parent died; the kernel gave it to init), so no
//!   SIGCHLD comes: the new monitor watches a pidfd, readable at the exit.
//!   The exit code went to init with the process, so it is unknown unless
//!   the cgroup counted an OOM kill.
//! - **Identity, not a PID from a table**: see [`crate::procid`].

use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The FIFO of one of a container's streams.
pub fn fifo_path(dir: &Path, id: &str, stream: &str) -> PathBuf {
    dir.join("fifos").join(format!("{id}.{stream}"))
}

/// Makes a FIFO at `path` (replacing a stale one) and opens both ends: the
/// monitor's non-blocking reader, and the container's blocking read-write
/// end (held by the container so that it is never without a reader).
/// The reader is opened first, so it sees the end of file once every
/// writer is gone.
pub fn make_fifo(path: &Path) -> std::io::Result<(OwnedFd, OwnedFd)> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: mkfifo with a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let reader = open_reader(path)?;
    let writer: File = OpenOptions::new().read(true).write(true).open(path)?;
    Ok((reader, writer.into()))
}

/// Opens the monitor's end of an existing FIFO without blocking.
pub fn open_reader(path: &Path) -> std::io::Result<OwnedFd> {
    let f: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    Ok(f.into())
}

/// A container taken over from an earlier monitor.
pub struct Adopted {
    pub id: String,
    /// The process as recorded (a pid is only ever compared with it).
    pub who: crate::procid::Identity,
    /// Readable when the process exits; `None` where the kernel has no
    /// pidfds (before 5.3): the exit is then found by a once-a-second check.
    pub pidfd: Option<OwnedFd>,
}

/// A pidfd for `pid`, if the kernel offers them.
pub fn pidfd(pid: i32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_keeps_a_reader_while_the_monitor_is_gone() {
        let d = tempfile::tempdir().unwrap();
        let path = fifo_path(d.path(), "c1", "stdout");
        let (reader, writer) = make_fifo(&path).unwrap();
        rustix::io::write(&writer, b"before\n").unwrap();
        // The monitor dies: its reader goes, and the container writes on
        // (no EPIPE: the container's own end reads too).
        drop(reader);
        rustix::io::write(&writer, b"while gone\n").unwrap();
        // A new monitor opens the FIFO by its path and gets all that sat
        // in it: the pipe lives on while the container holds its end.
        let reader = open_reader(&path).unwrap();
        let mut buf = [0u8; 64];
        let n = rustix::io::read(&reader, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"before\nwhile gone\n");
        // The container exits: the reader sees the end.
        drop(writer);
        assert_eq!(rustix::io::read(&reader, &mut buf).unwrap(), 0);
    }
}
