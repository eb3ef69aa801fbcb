//! Files kinglet writes for itself: whole or not at all (a temp file, then
//! an atomic rename, so a kill at any instant leaves the old or the new
//! version), and readable by root only, since pod specs, statuses and
//! checkpoints can carry Secret values. And files others write for it
//! (manifests, config drop-ins), read within a bound.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `data` to `path` atomically with mode 0600. `durable` also
/// flushes it to the disk before the rename and the directory after it (a
/// blocking wait: call it off the async thread), so that a power cut
/// leaves the old or the new data, never an empty file, and a value
/// written before a power cut is still there after it.
pub fn write_private_atomic(path: &Path, data: &[u8], durable: bool) -> std::io::Result<()> {
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
    if durable {
        f.sync_data()?;
    }
    std::fs::rename(&tmp, path)?;
    if durable {
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
        super::write_private_atomic(&p, b"one", false).unwrap();
        super::write_private_atomic(&p, b"two", true).unwrap();
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
