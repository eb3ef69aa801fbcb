//! The files the kubelet writes for a pod's containers (upstream's
//! `makeMounts` and termination-message files), under the pod's dir
//! `<root-dir>/pods/<uid>/`: `etc-hosts`, the pod's `/etc/hosts`, and
//! `containers/<name>/<attempt>`, each container attempt's termination
//! message. Both reach the runtime as plain mounts, so a runtime writes no
//! kubelet file; the messages are read back here when a container has
//! exited. Blocking file work: callers run it off the async thread.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use kinglet_runtime::Mount;

use super::util::contained_path;

/// Upstream's cap on a termination message (`maxTerminationMessageLength`
/// per container, 4 KiB).
pub const MAX_MESSAGE: u64 = 4096;

/// Why a kubelet file could not be made, with the path.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FileError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// One pod's dir of kubelet files.
#[derive(Clone, Debug)]
pub struct PodFiles {
    dir: PathBuf,
}

impl PodFiles {
    /// `<pods_dir>/<uid>`; `None` if the UID is no plain path component
    /// or there is no pods dir (unit tests).
    pub fn new(pods_dir: &str, uid: &str) -> Option<PodFiles> {
        if pods_dir.is_empty() {
            return None;
        }
        let dir = contained_path(Path::new(pods_dir), &[uid])?;
        Some(PodFiles { dir })
    }

    /// Writes the pod's hosts file (unless it already holds `content`;
    /// 0644, as upstream's, for containers running as any user) and
    /// gives its mount at `/etc/hosts`.
    pub fn hosts(&self, content: &str) -> Result<Mount, FileError> {
        let path = self.dir.join("etc-hosts");
        let err = |source| FileError {
            path: path.clone(),
            source,
        };
        if std::fs::read(&path).ok().as_deref() != Some(content.as_bytes()) {
            std::fs::create_dir_all(&self.dir).map_err(err)?;
            let tmp = self.dir.join(".etc-hosts.tmp");
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(&tmp)
                .map_err(err)?;
            f.write_all(content.as_bytes()).map_err(err)?;
            std::fs::rename(&tmp, &path).map_err(err)?;
        }
        Ok(Mount {
            host_path: path.display().to_string(),
            container_path: "/etc/hosts".into(),
            ..Default::default()
        })
    }

    fn message_dir(&self, container: &str) -> Option<PathBuf> {
        contained_path(&self.dir, &["containers", container])
    }

    /// A new, empty termination-message file for `attempt` of `container`
    /// (0666, as upstream's: the container may run as any user) and its
    /// mount at `container_path`. The files of attempts before the previous
    /// one go: the pod's status shows the last two at most.
    pub fn termination(
        &self,
        container: &str,
        attempt: u32,
        container_path: &str,
    ) -> Result<Mount, FileError> {
        let dir = self.message_dir(container).ok_or_else(|| FileError {
            path: self.dir.join("containers"),
            source: std::io::Error::other(format!("not a valid container name: {container:?}")),
        })?;
        let path = dir.join(attempt.to_string());
        let err = |source| FileError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(err)?;
        for e in std::fs::read_dir(&dir).map_err(err)?.flatten() {
            let old = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
            if old.is_some_and(|n| n.saturating_add(1) < attempt) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        std::fs::write(&path, b"").map_err(err)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
        Ok(Mount {
            host_path: path.display().to_string(),
            container_path: container_path.into(),
            ..Default::default()
        })
    }

    /// What `attempt` of `container` wrote to its termination-message
    /// file: its first [`MAX_MESSAGE`] bytes; empty when there is none.
    pub fn message(&self, container: &str, attempt: u32) -> String {
        use std::io::Read;
        let Some(dir) = self.message_dir(container) else {
            return String::new();
        };
        let Ok(f) = std::fs::File::open(dir.join(attempt.to_string())) else {
            return String::new();
        };
        let mut b = Vec::new();
        let _ = f.take(MAX_MESSAGE).read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    }

    /// Removes the pod's dir of kubelet files.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_termination_files_as_upstream_makes_them() {
        let d = tempfile::tempdir().unwrap();
        let pods = d.path().display().to_string();
        assert!(PodFiles::new(&pods, "../x").is_none());
        assert!(PodFiles::new("", "u1").is_none());
        let f = PodFiles::new(&pods, "u1").unwrap();
        let m = f.hosts("127.0.0.1\tlocalhost\n").unwrap();
        assert_eq!(m.container_path, "/etc/hosts");
        let meta = std::fs::metadata(&m.host_path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert_eq!(
            std::fs::read_to_string(&m.host_path).unwrap(),
            "127.0.0.1\tlocalhost\n"
        );
        // The same content is not written again (same inode).
        use std::os::unix::fs::MetadataExt;
        let ino = meta.ino();
        f.hosts("127.0.0.1\tlocalhost\n").unwrap();
        assert_eq!(std::fs::metadata(&m.host_path).unwrap().ino(), ino);

        let t0 = f.termination("c", 0, "/dev/termination-log").unwrap();
        assert_eq!(t0.container_path, "/dev/termination-log");
        let mode = std::fs::metadata(&t0.host_path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o666);
        std::fs::write(&t0.host_path, "x".repeat(5000)).unwrap();
        assert_eq!(f.message("c", 0).len(), MAX_MESSAGE as usize);
        assert_eq!(f.message("c", 1), "");
        assert_eq!(f.message("../c", 0), "");
        f.termination("c", 1, "/dev/termination-log").unwrap();
        f.termination("c", 2, "/dev/termination-log").unwrap();
        // Attempt 0 went when attempt 2 was made; 1 stays.
        assert!(!Path::new(&t0.host_path).exists());
        assert!(d.path().join("u1/containers/c/1").exists());
        assert!(f.termination("../c", 0, "/x").is_err());
        f.remove();
        assert!(!d.path().join("u1").exists());
    }
}
