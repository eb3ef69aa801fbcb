//! Files kinglet writes for itself: whole or not at all (a temp file, then
//! an atomic rename, so a kill at any instant leaves the old or the new
//! version), and readable by root only, since pod specs, statuses and
//! checkpoints can carry Secret values. And files others write for it
//! (manifests, config drop-ins), read within a bound.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// How far a write waits for the disk (each wait is a journal commit of
/// the whole filesystem: on flash, the cost of a write is its commits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// Not at all: the filesystem's next commit takes it. For what is
    /// rewritten often and made anew after a power cut.
    No,
    /// The data, before the rename: after a power cut the old or the new
    /// value, never an empty or torn file. The rename reaches the disk
    /// with the filesystem's next commit (within 5 s on ext4), so a value
    /// written in the last seconds before the cut may read as the old one.
    /// What upstream's checkpoints do (`filestore`: sync, then rename);
    /// one commit instead of two.
    Data,
    /// The data and the directory: on the disk when the call returns. For
    /// what is written once and costly to lose (keys, certificates).
    All,
}

/// Writes `data` to `path` atomically with mode 0600, waiting for the disk
/// as `flush` says (a blocking wait: call it off the async thread).
pub fn write_private_atomic(path: &Path, data: &[u8], flush: Flush) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    if flush != Flush::No {
        f.sync_data()?;
    }
    std::fs::rename(&tmp, path)?;
    if flush == Flush::All {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
    }
    Ok(())
}

/// `path` whole if it is at most `max` bytes, `None` if larger: never
/// more than one byte past the bound is read, so a huge file costs nothing.
pub fn read_at_most(path: &Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut data = Vec::new();
    let f = std::fs::File::open(path)?;
    std::io::Read::read_to_end(&mut std::io::Read::take(f, max + 1), &mut data)?;
    Ok((data.len() as u64 <= max).then_some(data))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_whole_private_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        super::write_private_atomic(&p, b"one", super::Flush::No).unwrap();
        super::write_private_atomic(&p, b"two", super::Flush::All).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}
