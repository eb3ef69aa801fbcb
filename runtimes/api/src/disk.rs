//! What a tree of files takes on disk, as eviction and the stats measure
//! it (a pod's emptyDirs and logs, a container's writable layer): `du`'s
//! blocks, on the tree's own filesystem, no symlink followed, with a bound
//! on the entries visited so a pod cannot make the walk endless. Blocking:
//! callers run it off the async thread.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Disk blocks under `dir`, in bytes, on `dir`'s filesystem only; at most
/// `limit` entries are visited (a pod cannot make the walk endless).
pub fn du(dir: &Path) -> u64 {
    const LIMIT: usize = 100_000;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let dev = top.dev();
    let (mut total, mut seen) = (top.blocks() * 512, 0usize);
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
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}
