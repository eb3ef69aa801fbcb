//! Watching one directory with inotify (no polling): the static pod dir
//! and the image import dir share this. [`DirWatch::changed`] waits for the
//! next batch of events and returns the names they concern, deduplicated,
//! in the order seen.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::inotify::{self, WatchFlags};
use tokio::io::unix::AsyncFd;

pub use rustix::fs::inotify::WatchFlags as Flags;

/// An inotify watch of one directory.
pub struct DirWatch {
    fd: AsyncFd<std::os::fd::OwnedFd>,
    buf: Vec<std::mem::MaybeUninit<u8>>,
}

impl DirWatch {
    /// Watches `dir` for `flags` events.
    pub fn new(dir: &Path, flags: WatchFlags) -> std::io::Result<Self> {
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
        inotify::add_watch(&fd, dir, flags)?;
        // SAFETY: the OwnedFd moves into the AsyncFd, so it stays open and
        // names the same inotify instance for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register(fd) }?;
        Ok(DirWatch {
            fd,
            buf: vec![std::mem::MaybeUninit::uninit(); 4096],
        })
    }

    /// The names of the entries that changed since the last call (waits
    /// for at least one event). An error means the watch is broken.
    pub async fn changed(&mut self) -> std::io::Result<Vec<OsString>> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut names: Vec<OsString> = Vec::new();
            let mut reader = inotify::Reader::new(guard.get_inner(), &mut self.buf);
            let result = loop {
                match reader.next() {
                    Ok(ev) => {
                        let Some(n) = ev.file_name() else { continue };
                        let n = std::ffi::OsStr::from_bytes(n.to_bytes()).to_os_string();
                        if !names.contains(&n) {
                            names.push(n);
                        }
                    }
                    Err(rustix::io::Errno::AGAIN) => break Ok(()),
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => break Err(std::io::Error::from(e)),
                }
            };
            guard.clear_ready();
            result?;
            if !names.is_empty() {
                return Ok(names);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_each_changed_name_once() {
        let d = tempfile::tempdir().unwrap();
        let mut w = DirWatch::new(d.path(), Flags::CLOSE_WRITE | Flags::MOVED_TO).unwrap();
        std::fs::write(d.path().join("a"), "1").unwrap();
        std::fs::write(d.path().join("a"), "2").unwrap();
        std::fs::write(d.path().join("b.tmp"), "x").unwrap();
        std::fs::rename(d.path().join("b.tmp"), d.path().join("b")).unwrap();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            for n in w.changed().await.unwrap() {
                if !seen.contains(&n) {
                    seen.push(n);
                }
            }
        }
        assert_eq!(seen, ["a", "b.tmp", "b"]);
    }
}
