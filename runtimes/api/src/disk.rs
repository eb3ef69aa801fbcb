//! What a tree of files takes on disk, as eviction and the stats measure
//! it (a pod's emptyDirs and logs, a container's writable layer): `du`'s
//! blocks, on the tree's own filesystem, no symlink followed, with a bound
//! on the entries visited so a pod cannot make the walk endless. Blocking:
//! callers run it off the async thread.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What a tree takes: disk blocks in bytes, and inodes (entries, the tree
/// itself included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Use {
    pub bytes: u64,
    pub inodes: u64,
}

/// Disk blocks under `dir`, in bytes, on `dir`'s filesystem only; at most
/// `LIMIT` entries are visited (a pod cannot make the walk endless).
pub fn du(dir: &Path) -> u64 {
    usage(dir).bytes
}

/// Blocks and inodes under `dir` in one walk, as [`du`] counts them.
pub fn usage(dir: &Path) -> Use {
    const LIMIT: usize = 100_000;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return Use::default();
    };
    let dev = top.dev();
    let mut total = Use {
        bytes: top.blocks() * 512,
        inodes: 1,
    };
    let mut seen = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > LIMIT {
                return total;
            }
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.dev() != dev {
                continue;
            }
            total.bytes += m.blocks() * 512;
            total.inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}
