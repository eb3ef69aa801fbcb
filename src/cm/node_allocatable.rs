//! The pods' cgroup, as upstream's container manager sets it up:
//! `<cgroupRoot>/kubepods`, made at start, with node allocatable enforced
//! on it (`enforceNodeAllocatable: [pods]`): its memory limit is capacity
//! − `systemReserved` − `kubeReserved`, so the pods together can never
//! take the memory of the OS and of kinglet. The eviction threshold is
//! not subtracted, as upstream: eviction acts below the limit, the kernel
//! at it. cgroup v1 (the memory controller's hierarchy) and v2 (each level
//! made with the memory controller enabled for its children).

use std::path::{Path, PathBuf};

use kinglet_runtime::podcgroup::Hierarchy;

/// Errors setting the pods' cgroup up, with the file concerned.
#[derive(Debug, thiserror::Error)]
#[error("pods cgroup {path}: {source}")]
pub struct CgroupError {
    path: String,
    #[source]
    source: std::io::Error,
}

fn err(path: &Path) -> impl Fn(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError {
        path: path.display().to_string(),
        source,
    }
}

/// Makes `path` (relative to `mount`) and sets its memory limit.
pub fn ensure_pods_cgroup(
    mount: &Path,
    path: &str,
    memory_limit: Option<u64>,
) -> Result<PathBuf, CgroupError> {
    let rel = path.trim_matches('/');
    match Hierarchy::detect(mount) {
        Hierarchy::V1 => {
            let dir = mount.join("memory").join(rel);
            std::fs::create_dir_all(&dir).map_err(err(&dir))?;
            if let Some(l) = memory_limit {
                let f = dir.join("memory.limit_in_bytes");
                std::fs::write(&f, l.to_string()).map_err(err(&f))?;
            }
            Ok(dir)
        }
        Hierarchy::V2 => {
            let dir = kinglet_runtime::podcgroup::make_v2(mount, rel, &["cpu", "memory", "pids"])
                .map_err(err(mount))?;
            if let Some(l) = memory_limit {
                let f = dir.join("memory.max");
                std::fs::write(&f, l.to_string()).map_err(err(&f))?;
            }
            Ok(dir)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_makes_the_memory_cgroup_and_sets_its_limit() {
        let d = tempfile::tempdir().unwrap();
        let dir = ensure_pods_cgroup(d.path(), "/edge/kubepods", Some(600 << 20)).unwrap();
        assert_eq!(dir, d.path().join("memory/edge/kubepods"));
        let l = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(l, (600u64 << 20).to_string());
    }

    #[test]
    fn v2_enables_the_controllers_on_the_way_down() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
        std::fs::create_dir_all(d.path().join("edge")).unwrap();
        std::fs::write(d.path().join("edge/cgroup.controllers"), "memory pids\n").unwrap();
        let dir = ensure_pods_cgroup(d.path(), "edge/kubepods", Some(1 << 30)).unwrap();
        let top = std::fs::read_to_string(d.path().join("cgroup.subtree_control")).unwrap();
        assert_eq!(top, "+cpu +memory +pids");
        let mid = std::fs::read_to_string(d.path().join("edge/cgroup.subtree_control")).unwrap();
        assert_eq!(mid, "+memory +pids");
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.max")).unwrap(),
            "1073741824"
        );
    }
}
