//! Local storage of a pod, as upstream's eviction measures it for disk
//! pressure and for `localStorageEviction`: the bytes its emptyDirs on
//! disk and its container logs take (`du`'s blocks, one filesystem, no
//! symlinks followed, off the async thread). Containers' writable layers
//! are not counted yet.
//!
//! A pod whose emptyDir exceeds its `sizeLimit` is evicted whatever the
//! node's state, with upstream's message.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

/// Where pods keep their files.
#[derive(Clone, Debug)]
pub struct Roots {
    /// `<root-dir>/volumes`: `<uid>/<volume>`.
    pub volumes: PathBuf,
    /// The pod log dir: `<ns>_<name>_<uid>/<container>/`.
    pub logs: PathBuf,
}

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

/// One emptyDir on disk: its name, directory, and `sizeLimit` as
/// written and in bytes.
type EmptyDir = (String, PathBuf, Option<(String, u64)>);

/// The pod's emptyDirs on disk.
fn empty_dirs(pod: &Pod, uid: &str, r: &Roots) -> Vec<EmptyDir> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    volumes
        .filter_map(|v| {
            let e = v.empty_dir.as_ref()?;
            if e.medium.as_deref() == Some("Memory") {
                return None;
            }
            let dir = crate::pods::convert::contained_path(&r.volumes, &[uid, &v.name])?;
            let limit = e.size_limit.as_ref().and_then(|q| {
                crate::config::parse_quantity(&q.0)
                    .ok()
                    .map(|b| (q.0.clone(), b))
            });
            Some((v.name.clone(), dir, limit))
        })
        .collect()
}

/// Upstream's message for the first emptyDir over its `sizeLimit`.
pub fn over_limit(pod: &Pod, uid: &str, r: &Roots) -> Option<String> {
    empty_dirs(pod, uid, r)
        .into_iter()
        .find_map(|(name, dir, limit)| {
            let (text, bytes) = limit?;
            (du(&dir) > bytes)
                .then(|| format!("Usage of EmptyDir volume {name:?} exceeds the limit {text:?}. "))
        })
}

/// The pod's local storage in use: its emptyDirs on disk and its logs.
pub fn usage(pod: &Pod, uid: &str, r: &Roots) -> u64 {
    let dirs: u64 = empty_dirs(pod, uid, r).iter().map(|(_, d, _)| du(d)).sum();
    let logs = crate::pods::convert::log_directory(pod, &r.logs.display().to_string());
    dirs + du(Path::new(&logs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_dir_over_its_size_limit_is_named() {
        let d = tempfile::tempdir().unwrap();
        let r = Roots {
            volumes: d.path().join("volumes"),
            logs: d.path().join("logs"),
        };
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "data", "emptyDir": {"sizeLimit": "1Mi"}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Ki"}}]}
        }))
        .unwrap();
        let data = r.volumes.join("u1/data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("small"), vec![1u8; 4096]).unwrap();
        assert_eq!(over_limit(&pod, "u1", &r), None);
        std::fs::write(data.join("big"), vec![1u8; 2 << 20]).unwrap();
        assert_eq!(
            over_limit(&pod, "u1", &r).as_deref(),
            Some("Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". ")
        );
        assert!(usage(&pod, "u1", &r) >= 2 << 20);
        assert_eq!(du(&d.path().join("missing")), 0);
    }
}
