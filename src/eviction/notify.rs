//! What wakes the eviction manager between its periodic syncs, so memory
//! pressure is seen as it happens instead of at the next 10 s tick:
//! - a **memcg usage threshold** (cgroup v1 `cgroup.event_control` with
//!   an eventfd, as upstream's `kernelMemcgNotification`): the kernel
//!   signals the moment usage crosses the level at which a memory
//!   threshold would be met (re-armed after each sync, as inactive file
//!   pages move the level; a level usage already passed when it is armed
//!   never signals, so the manager then measures again at once);
//! - a **PSI trigger** on `/proc/pressure/memory`: a `some` stall of 50 ms
//!   within a 1 s window (100 ms in 2 s without `CAP_SYS_RESOURCE`),
//!   signalled with `POLLPRI`: the node is reclaiming, measure now;
//! - on cgroup v2, `memory.events` of the pods' cgroup, watched with
//!   inotify: `high`/`max` events as the pods reach their limit;
//! - on cgroup v2, the same PSI trigger on the pods' cgroup's own
//!   `memory.pressure`: the pods stall on their allocatable limit while the
//!   node as a whole may not (proven armed in the VM lab's cgroup v2 guest).
//!
//! A host with none of these falls back to a 1 s poll (said at start).

use std::os::fd::OwnedFd;
use std::path::Path;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::signals::{Hierarchy, MemCgroup};

/// One armed event source.
pub enum Source {
    /// An eventfd: readable when signalled.
    EventFd(AsyncFd<OwnedFd>),
    /// A PSI trigger: `POLLPRI` when it fires.
    Psi(AsyncFd<OwnedFd>),
    Inotify(crate::dirwatch::DirWatch),
}

impl Source {
    /// Waits for the next signal; an error means the source is broken.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match self {
            Source::EventFd(fd) => loop {
                let mut g = fd.readable().await?;
                let mut buf = [0u8; 8];
                match rustix::io::read(g.get_inner(), &mut buf) {
                    Ok(_) => return Ok(()),
                    Err(rustix::io::Errno::AGAIN) => g.clear_ready(),
                    Err(e) => return Err(e.into()),
                }
            },
            Source::Psi(fd) => {
                let mut g = fd.ready(Interest::PRIORITY).await?;
                g.clear_ready();
                Ok(())
            }
            Source::Inotify(w) => w.changed().await.map(|_| ()),
        }
    }
}

/// Arms a v1 memcg threshold on `cg` at `bytes` of usage.
pub fn memcg_threshold(cg: &MemCgroup, bytes: u64) -> std::io::Result<Source> {
    use rustix::event::{EventfdFlags, eventfd};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    if cg.hierarchy != Hierarchy::V1 {
        return Err(std::io::Error::other("memcg thresholds are cgroup v1's"));
    }
    let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
    let usage = std::fs::File::open(cg.usage_file())?;
    let mut control = std::fs::OpenOptions::new()
        .write(true)
        .open(cg.dir.join("cgroup.event_control"))?;
    // "<eventfd> <fd of memory.usage_in_bytes> <threshold>"; the kernel
    // drops the registration when the eventfd is closed.
    // One write: the kernel parses each write(2) whole.
    let line = format!("{} {} {bytes}", efd.as_raw_fd(), usage.as_raw_fd());
    control.write_all(line.as_bytes())?;
    // SAFETY: the eventfd moves into the AsyncFd and stays open with it.
    Ok(Source::EventFd(unsafe { AsyncFd::register(efd) }?))
}

/// Arms a PSI trigger on `file` (`/proc/pressure/memory` or a v2
/// cgroup's `memory.pressure`).
pub fn psi(file: &Path) -> std::io::Result<Source> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(file)
    };
    // 50 ms of stall within a 1 s window; without CAP_SYS_RESOURCE the
    // kernel takes only whole multiples of 2 s as the window: 100 ms in 2 s.
    let mut f = open()?;
    if f.write_all(b"some 50000 1000000\0").is_err() {
        f = open()?;
        f.write_all(b"some 100000 2000000\0")?;
    }
    let fd: OwnedFd = f.into();
    // SAFETY: the trigger fd moves into the AsyncFd and stays open with it.
    Ok(Source::Psi(unsafe {
        AsyncFd::register_with_interest(fd, Interest::PRIORITY)
    }?))
}

/// Arms a PSI trigger on a v2 cgroup's own `memory.pressure`.
pub fn cgroup_psi(cg: &MemCgroup) -> std::io::Result<Source> {
    if cg.hierarchy != Hierarchy::V2 {
        return Err(std::io::Error::other(
            "a cgroup's memory.pressure is cgroup v2's",
        ));
    }
    psi(&cg.dir.join("memory.pressure"))
}

/// Watches a v2 cgroup's `memory.events`.
pub fn memory_events(cg: &MemCgroup) -> std::io::Result<Source> {
    if cg.hierarchy != Hierarchy::V2 {
        return Err(std::io::Error::other("memory.events is cgroup v2's"));
    }
    let w = crate::dirwatch::DirWatch::new(&cg.dir, crate::dirwatch::Flags::MODIFY)?;
    Ok(Source::Inotify(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cgroup v2 source, on a plain directory standing for the
    /// cgroup (this host is v1): a write to `memory.events` wakes it; a v1
    /// cgroup is refused.
    #[tokio::test]
    async fn memory_events_wake_on_a_write() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("memory.events");
        std::fs::write(&file, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let v2 = MemCgroup {
            dir: d.path().to_path_buf(),
            hierarchy: Hierarchy::V2,
        };
        let mut s = memory_events(&v2).unwrap();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            std::fs::write(&file, "low 0\nhigh 3\nmax 1\noom 0\noom_kill 0\n").unwrap();
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), s.wait())
            .await
            .expect("woken by the write")
            .unwrap();
        writer.await.unwrap();
        let v1 = MemCgroup {
            dir: d.path().to_path_buf(),
            hierarchy: Hierarchy::V1,
        };
        assert!(memory_events(&v1).is_err());
    }
}
