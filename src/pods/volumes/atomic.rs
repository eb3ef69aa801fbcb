//! Upstream's atomic writer (`pkg/volume/util/atomic_writer.go`): the files
//! of a configMap, secret, downwardAPI or projected volume are written into
//! a fresh timestamped directory, a `..data` symlink is swapped to it by a
//! rename, and each top-level name is a symlink through `..data`. A reader
//! in the container sees the old set or the new one, never a mix; an
//! unchanged payload writes nothing.
//!
//! Blocking filesystem work: call it from the blocking pool.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path};

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// One file of the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// A projected file's path refused, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPath {
    #[error("invalid path: must not be empty: \"\"")]
    Empty,
    #[error("invalid path: must be relative path: {0}")]
    Absolute(String),
    #[error("invalid path: must be less than or equal to 4096 characters")]
    TooLong,
    #[error("invalid path: must not contain '..': {0}")]
    DotDot(String),
    #[error("invalid path: filenames must be less than or equal to 255 characters")]
    NameTooLong,
    #[error("invalid path: must not start with '..': {0}")]
    StartsWithDotDot(String),
}

/// Upstream's path rules: relative, no `..` component, not starting with
/// `..`, components of at most 255 bytes, at most 4096 bytes in all.
pub fn validate_path(p: &str) -> Result<(), InvalidPath> {
    if p.is_empty() {
        return Err(InvalidPath::Empty);
    }
    if p.starts_with('/') {
        return Err(InvalidPath::Absolute(p.into()));
    }
    if p.len() > 4096 {
        return Err(InvalidPath::TooLong);
    }
    let items: Vec<&str> = p.split('/').collect();
    for i in &items {
        if *i == ".." {
            return Err(InvalidPath::DotDot(p.into()));
        }
        if i.len() > 255 {
            return Err(InvalidPath::NameTooLong);
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return Err(InvalidPath::StartsWithDotDot(p.into()));
    }
    Ok(())
}

/// The payload's paths cleaned (`a//b/./c` → `a/b/c`).
fn clean(p: &str) -> String {
    Path::new(p)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn top(p: &str) -> &str {
    p.split('/').next().unwrap_or(p)
}

/// Whether `dir` holds exactly `payload` (same files, bytes and modes).
fn same_as(dir: &Path, payload: &BTreeMap<String, FileProjection>, gid: Option<u32>) -> bool {
    let files_there = walk(dir);
    if files_there.len() != payload.len() {
        return false;
    }
    payload.iter().all(|(p, f)| {
        let path = dir.join(p);
        let mode_ok = std::fs::symlink_metadata(&path).is_ok_and(|m| {
            m.is_file() && m.permissions().mode() & 0o7777 == file_mode(f.mode, gid)
        });
        mode_ok && std::fs::read(&path).is_ok_and(|d| d == f.data)
    })
}

/// Regular files under `dir`, relative.
fn walk(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push((e.path(), r)),
                Ok(t) if t.is_file() => {
                    out.insert(r);
                }
                _ => {}
            }
        }
    }
    out
}

fn timestamp_dir(target: &Path) -> io::Result<std::path::PathBuf> {
    let now = jiff::Timestamp::now();
    let stamp = now.strftime("..%Y_%m_%d_%H_%M_%S.").to_string();
    for n in 0..1000u32 {
        let p = target.join(format!("{stamp}{:09}{n}", now.subsec_nanosecond()));
        match std::fs::create_dir(&p) {
            Ok(()) => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
                return Ok(p);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("no free timestamp directory name"))
}

/// Writes `payload` into `target` (which must exist); files get `gid` as
/// their group when set (`fsGroup`). Returns whether anything changed.
pub fn write(
    target: &Path,
    payload: &BTreeMap<String, FileProjection>,
    gid: Option<u32>,
) -> io::Result<bool> {
    let mut clean_payload = BTreeMap::new();
    for (p, f) in payload {
        validate_path(p).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        clean_payload.insert(clean(p), f.clone());
    }
    let payload = clean_payload;
    let data_link = target.join(DATA);
    let old = std::fs::read_link(&data_link).ok();
    let wanted: BTreeSet<&str> = payload.keys().map(|p| top(p)).collect();
    let old_tops: BTreeSet<String> = old
        .as_ref()
        .map(|o| {
            walk(&target.join(o))
                .iter()
                .map(|p| top(p).to_string())
                .collect()
        })
        .unwrap_or_default();
    let stale: Vec<&String> = old_tops
        .iter()
        .filter(|t| !wanted.contains(t.as_str()))
        .collect();
    let unchanged = old
        .as_ref()
        .is_some_and(|o| same_as(&target.join(o), &payload, gid));
    if !unchanged {
        let ts = timestamp_dir(target)?;
        if let Err(e) = fill(&ts, &payload, gid) {
            let _ = std::fs::remove_dir_all(&ts);
            return Err(e);
        }
        let tmp = target.join(DATA_TMP);
        let _ = std::fs::remove_file(&tmp);
        let name = ts.file_name().map(|n| n.to_owned()).unwrap_or_default();
        symlink(&name, &tmp)?;
        std::fs::rename(&tmp, &data_link)?;
    }
    for t in &wanted {
        let link = target.join(t);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA).join(t), &link)?;
        }
    }
    for t in stale {
        let link = target.join(t);
        if std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            std::fs::remove_file(&link)?;
        }
    }
    if !unchanged && let Some(o) = old {
        let old_dir = target.join(&o);
        // Only a timestamp dir of ours, never something else `..data` named.
        if o.to_string_lossy().starts_with("..") && old_dir.parent() == Some(target) {
            std::fs::remove_dir_all(old_dir)?;
        }
    }
    Ok(!unchanged)
}

/// A file's mode on disk: with an fsGroup the group may read.
fn file_mode(mode: u32, gid: Option<u32>) -> u32 {
    if gid.is_some() { mode | 0o440 } else { mode }
}

/// Writes the payload into a fresh directory.
fn fill(
    dir: &Path,
    payload: &BTreeMap<String, FileProjection>,
    gid: Option<u32>,
) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for (p, f) in payload {
        let path = dir.join(p);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        file.write_all(&f.data)?;
        if let Some(g) = gid {
            std::os::unix::fs::fchown(&file, None, Some(g))?;
        }
        // After the chown, which clears set-id bits. With an fsGroup the
        // group may read, as upstream's SetVolumeOwnership for a read-only
        // volume (`mode | 0440`).
        file.set_permissions(std::fs::Permissions::from_mode(file_mode(f.mode, gid)))?;
    }
    if let Some(g) = gid {
        for d in walk_dirs(dir) {
            std::os::unix::fs::chown(&d, None, Some(g))?;
        }
    }
    Ok(())
}

fn walk_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let d = out[i].clone();
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> BTreeMap<String, FileProjection> {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn writes_swaps_and_cleans_up_as_upstream() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path();
        assert!(
            write(
                t,
                &payload(&[("a", "1", 0o644), ("dir/b", "2", 0o400)]),
                None
            )
            .unwrap()
        );
        assert_eq!(std::fs::read_to_string(t.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(t.join("dir/b")).unwrap(), "2");
        assert_eq!(
            std::fs::read_link(t.join("a")).unwrap(),
            Path::new("..data/a")
        );
        let first = std::fs::read_link(t.join(DATA)).unwrap();
        let m = std::fs::metadata(t.join("dir/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(m, 0o400);
        // Unchanged: nothing written.
        assert!(
            !write(
                t,
                &payload(&[("a", "1", 0o644), ("dir/b", "2", 0o400)]),
                None
            )
            .unwrap()
        );
        assert_eq!(std::fs::read_link(t.join(DATA)).unwrap(), first);
        // Changed: a new dir, the old one and the dropped name gone.
        assert!(write(t, &payload(&[("a", "3", 0o644)]), None).unwrap());
        assert_eq!(std::fs::read_to_string(t.join("a")).unwrap(), "3");
        assert!(std::fs::symlink_metadata(t.join("dir")).is_err());
        assert!(!t.join(&first).exists());
        let entries: Vec<String> = std::fs::read_dir(t)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries.len(), 3, "{entries:?}");
    }

    #[test]
    fn hostile_paths_are_refused_before_anything_is_written() {
        let d = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x", "..data/x", "", "..x"] {
            let r = write(d.path(), &payload(&[(bad, "x", 0o644)]), None);
            assert!(r.is_err(), "{bad:?} accepted");
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
