//! Sub paths without a race (upstream's `pkg/volume/util/subpath`): a
//! container's `subPath` (or expanded `subPathExpr`) is opened one component
//! at a time from the volume's root with `O_NOFOLLOW`, made where missing
//! through the same descriptors, and the opened directory or file is
//! bind-mounted by descriptor (`/proc/self/fd/N`) onto a target in the pod's
//! own dir, which is what the runtime mounts. A pod that turns a directory
//! of its volume into a symlink while a container starts can make that start
//! fail, never make it mount what the symlink points to: the runtime gets a
//! mount point no pod can change (CVE-2017-1002101's class).
//!
//! Symlinks that stay inside the volume still work (a configMap key is a
//! link into `..data`): they are resolved first and the result is opened
//! without following any link, so a link swapped in afterwards is refused.
//! Targets live under `<volume root>/<pod uid>/.subpaths/` (no volume name
//! starts with a dot) and go with the pod's volume dir, whose removal
//! unmounts what is under it first ([`super::volumes::remove_pod_dir`]).
//! Blocking: call off the async thread.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The dir under a pod's volume dir that holds its sub path targets.
pub const TARGETS_DIR: &str = ".subpaths";

/// A sub path to bind onto `target` before the container is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubPath {
    /// The volumeMount's (and volume's) name.
    pub name: String,
    /// The volume's host dir.
    pub volume: PathBuf,
    /// The path inside it (relative, checked for `..` already).
    pub sub: String,
    /// Where it is bind-mounted for the runtime.
    pub target: PathBuf,
}

/// Why a sub path was not prepared.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    #[error("subpath {path:?} not within volume path {volume:?}")]
    Outside { path: PathBuf, volume: PathBuf },
    #[error("unexpected symlink found {0:?}")]
    Symlink(PathBuf),
    #[error("{what} {path:?}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(Errno) -> SubPathError {
    let path = path.to_path_buf();
    move |e| SubPathError::Io {
        what,
        path,
        source: e.into(),
    }
}

fn std_io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SubPathError {
    let path = path.to_path_buf();
    move |source| SubPathError::Io { what, path, source }
}

/// Opens, creating what is missing, the sub path and bind-mounts it onto
/// its target (reusing a mount of the same file left by an earlier start).
pub fn prepare(s: &SubPath) -> Result<(), SubPathError> {
    let volume = std::fs::canonicalize(&s.volume).map_err(std_io("volume", &s.volume))?;
    let wanted = volume.join(&s.sub);
    if std::fs::symlink_metadata(&wanted).is_err() {
        make_dirs(&volume, &s.sub)?;
    }
    // Symlinks inside the volume resolved once; what they resolve to is
    // then opened without following any link.
    let real = std::fs::canonicalize(&wanted).map_err(std_io("subpath", &wanted))?;
    let fd = open_beneath(&volume, &real)?;
    bind(&fd, &s.target)
}

/// `path` (canonical, under `base`) opened as `O_PATH`, one component at a
/// time from `base` without following a link.
fn open_beneath(base: &Path, path: &Path) -> Result<OwnedFd, SubPathError> {
    let rel = path
        .strip_prefix(base)
        .map_err(|_| SubPathError::Outside {
            path: path.to_path_buf(),
            volume: base.to_path_buf(),
        })?
        .to_path_buf();
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut fd = rustix::fs::open(base, flags, Mode::empty()).map_err(io("open", base))?;
    let mut at = base.to_path_buf();
    for part in rel.components() {
        let Component::Normal(name) = part else {
            return Err(SubPathError::Outside {
                path: path.to_path_buf(),
                volume: base.to_path_buf(),
            });
        };
        at.push(name);
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let child = rustix::fs::openat(&fd, name, flags, Mode::empty()).map_err(io("open", &at))?;
        let st = rustix::fs::fstat(&child).map_err(io("stat", &at))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(SubPathError::Symlink(at));
        }
        fd = child;
    }
    Ok(fd)
}

/// Upstream's `SafeMakeDir`: what is missing of `base/sub` is made through
/// descriptors opened without following links, with `base`'s mode set
/// explicitly (no umask), so a 0777 emptyDir's sub path is 0777 too.
fn make_dirs(base: &Path, sub: &str) -> Result<(), SubPathError> {
    let parts: Vec<&str> = sub
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    let mut existing = base.to_path_buf();
    let mut missing = parts.as_slice();
    while let Some((first, rest)) = missing.split_first() {
        if std::fs::symlink_metadata(existing.join(first)).is_err() {
            break;
        }
        existing.push(first);
        missing = rest;
    }
    let real = std::fs::canonicalize(&existing).map_err(std_io("subpath", &existing))?;
    let mut fd = open_beneath(base, &real)?;
    let mode = rustix::fs::stat(base).map_err(io("stat", base))?.st_mode & 0o7777;
    let mut at = real;
    for name in missing {
        at.push(name);
        match rustix::fs::mkdirat(&fd, *name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io("mkdir", &at)(e)),
        }
        // A link put there since is refused (ELOOP), not followed.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let child =
            rustix::fs::openat(&fd, *name, flags, Mode::empty()).map_err(io("open", &at))?;
        rustix::fs::fchmod(&child, Mode::from_raw_mode(mode)).map_err(io("chmod", &at))?;
        fd = child;
    }
    Ok(())
}

/// Bind-mounts what `fd` holds onto `target`, made as a dir or an empty
/// file to match; a target that already has it mounted is left as it is,
/// one that has something else is unmounted first.
fn bind(fd: &OwnedFd, target: &Path) -> Result<(), SubPathError> {
    let st = rustix::fs::fstat(fd).map_err(io("stat", target))?;
    let same = |p: &Path| {
        rustix::fs::stat(p).is_ok_and(|t| (t.st_dev, t.st_ino) == (st.st_dev, st.st_ino))
    };
    if same(target) {
        return Ok(());
    }
    // Whatever an earlier start mounted there (the sub path was replaced
    // since), as many layers as there are.
    while rustix::fs::statat(CWD, target, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
        && rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH).is_ok()
    {}
    let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
    make_target(target, is_dir)?;
    let source = format!(
        "/proc/self/fd/{}",
        rustix::fd::AsRawFd::as_raw_fd(&fd.as_fd())
    );
    rustix::mount::mount_bind(source.as_str(), target).map_err(io("bind mount", target))?;
    if !same(target) {
        let _ = rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH);
        return Err(io("bind mount", target)(Errno::STALE));
    }
    Ok(())
}

/// `target` as an empty dir or file, whatever was there before.
fn make_target(target: &Path, is_dir: bool) -> Result<(), SubPathError> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(std_io("mkdir", parent))?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() == is_dir && !m.file_type().is_symlink() => return Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir(target),
        Ok(_) => std::fs::remove_file(target),
        Err(_) => Ok(()),
    }
    .map_err(std_io("remove", target))?;
    let made = if is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::File::create(target).map(drop)
    };
    made.map_err(std_io("create", target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn unmount_all(dir: &Path) {
        super::super::remove_pod_dir(dir);
    }

    fn sub(vol: &Path, s: &str, target: &Path) -> SubPath {
        SubPath {
            name: "v".into(),
            volume: vol.to_path_buf(),
            sub: s.into(),
            target: target.to_path_buf(),
        }
    }

    #[test]
    fn made_with_the_volumes_mode_and_mounted_by_descriptor() {
        let d = tempfile::tempdir().unwrap();
        let pod = d.path().join("pod");
        let vol = pod.join("v");
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o2777)).unwrap();
        let t = pod.join(TARGETS_DIR).join("v/c/0");
        prepare(&sub(&vol, "ok/deep", &t)).unwrap();
        let made = std::fs::metadata(vol.join("ok/deep"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(made & 0o7777, 0o2777, "whatever the umask");
        std::fs::write(t.join("f"), b"x").unwrap();
        assert_eq!(std::fs::read(vol.join("ok/deep/f")).unwrap(), b"x");
        // A second start reuses the mount; a replaced sub path is mounted anew.
        prepare(&sub(&vol, "ok/deep", &t)).unwrap();
        std::fs::rename(vol.join("ok/deep"), vol.join("old")).unwrap();
        prepare(&sub(&vol, "ok/deep", &t)).unwrap();
        assert!(!t.join("f").exists(), "still the old dir");
        // A file (a configMap key is a link into ..data): an empty file target.
        std::fs::create_dir(vol.join("..data")).unwrap();
        std::fs::write(vol.join("..data/key"), b"value").unwrap();
        std::os::unix::fs::symlink("..data/key", vol.join("key")).unwrap();
        let tf = pod.join(TARGETS_DIR).join("v/c/1");
        prepare(&sub(&vol, "key", &tf)).unwrap();
        assert_eq!(std::fs::read(&tf).unwrap(), b"value");
        unmount_all(&pod);
        assert!(!pod.exists());
    }

    #[test]
    fn links_out_of_the_volume_are_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("host");
        std::fs::create_dir_all(&host).unwrap();
        let pod = d.path().join("pod");
        let vol = pod.join("v");
        std::fs::create_dir_all(&vol).unwrap();
        std::os::unix::fs::symlink(&host, vol.join("escape")).unwrap();
        let t = pod.join(TARGETS_DIR).join("v/c/0");
        for s in ["escape", "escape/inner", "escape/a/b"] {
            let e = prepare(&sub(&vol, s, &t)).unwrap_err();
            assert!(matches!(e, SubPathError::Outside { .. }), "{s}: {e}");
        }
        assert_eq!(
            std::fs::read_dir(&host).unwrap().count(),
            0,
            "made through the link"
        );
        // A link planted where the resolved path was: refused, not followed.
        std::fs::create_dir(vol.join("d")).unwrap();
        let real = std::fs::canonicalize(vol.join("d")).unwrap();
        std::fs::remove_dir(vol.join("d")).unwrap();
        std::os::unix::fs::symlink(&host, vol.join("d")).unwrap();
        let base = std::fs::canonicalize(&vol).unwrap();
        let e = open_beneath(&base, &real).unwrap_err();
        assert!(matches!(e, SubPathError::Symlink(_)), "{e}");
        unmount_all(&pod);
    }

    #[test]
    fn a_pod_flipping_a_dir_into_a_link_never_gets_the_link_mounted() {
        // The race of CVE-2017-1002101, many times over: a thread flips
        // `d` between a dir and a link to the host while sub paths are
        // prepared; every mount that was made must be the volume's `d`.
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("host");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("host-marker"), b"").unwrap();
        let pod = d.path().join("pod");
        let vol = pod.join("v");
        std::fs::create_dir_all(&vol).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let (stop, vol, host) = (stop.clone(), vol.clone(), host.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::create_dir(vol.join("d"));
                    let _ = std::fs::remove_dir(vol.join("d"));
                    let _ = std::os::unix::fs::symlink(&host, vol.join("d"));
                    let _ = std::fs::remove_file(vol.join("d"));
                }
            })
        };
        let (mut mounted, mut refused) = (0, 0);
        for i in 0..2000 {
            let t = pod.join(TARGETS_DIR).join(format!("v/c/{i}"));
            match prepare(&sub(&vol, "d", &t)) {
                Ok(()) => {
                    mounted += 1;
                    assert!(!t.join("host-marker").exists(), "escaped at start {i}");
                    let _ = rustix::mount::unmount(&t, rustix::mount::UnmountFlags::DETACH);
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flipper.join().unwrap();
        assert_eq!(
            std::fs::read_dir(&host).unwrap().count(),
            1,
            "host dir written"
        );
        assert!(
            mounted > 0 && refused > 0,
            "no race run: {mounted} mounted, {refused} refused"
        );
        unmount_all(&pod);
    }
}
