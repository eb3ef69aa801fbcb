//! The pod-level cgroup settings upstream's pod container manager makes
//! before the sandbox (`pkg/kubelet/cm/pod_container_manager_linux.go`),
//! which neither CRI nor the OCI spec carry per pod: today the pod's
//! `pids.max` (`podPidsLimit`), so a fork bomb spread over a pod's
//! containers is bounded as a whole. Both runtimes call it before making a
//! sandbox; the pod cgroup goes with the sandbox, as before.
//! [`make_v2`] is also how kinglet makes the pods' own cgroup on v2
//! (`node::cgroups`): each level enabling the controllers below it.
//! [`Hierarchy::detect`] is the one cgroup v1/v2 check of the agent, its
//! eviction manager and both runtimes.

use std::path::{Path, PathBuf};

/// The cgroup hierarchy mounted at a root (normally `/sys/fs/cgroup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    /// Per-controller hierarchies (`<root>/memory`, `<root>/pids`, ...).
    V1,
    /// The unified hierarchy (`cgroup.controllers` at the root).
    V2,
}

impl Hierarchy {
    /// V2 where the root holds `cgroup.controllers`, V1 otherwise.
    pub fn detect(root: &Path) -> Hierarchy {
        if root.join("cgroup.controllers").exists() {
            Hierarchy::V2
        } else {
            Hierarchy::V1
        }
    }
}

/// Creates the pod's cgroup in the pids controller's hierarchy (v1:
/// `<root>/pids/<parent>`; v2: `<root>/<parent>`, with `pids` enabled for
/// the children of every level above) and writes `limit` to its
/// `pids.max`. Returns the directory.
pub fn set_pids_limit(root: &Path, parent: &str, limit: i64) -> std::io::Result<PathBuf> {
    let rel = parent.trim_matches('/');
    if rel.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a pod cgroup needs a parent",
        ));
    }
    let dir = if Hierarchy::detect(root) == Hierarchy::V2 {
        make_v2(root, rel, &["pids"])?
    } else {
        let dir = root.join("pids").join(rel);
        std::fs::create_dir_all(&dir).map_err(|e| context(&dir, e))?;
        dir
    };
    let f = dir.join("pids.max");
    std::fs::write(&f, limit.to_string()).map_err(|e| context(&f, e))?;
    Ok(dir)
}

/// Makes the cgroup v2 path `rel` under `root`, level by level, each
/// level enabling for its children those of `want` it has and has not
/// enabled yet (a controller's files appear in a child only so).
pub fn make_v2(root: &Path, rel: &str, want: &[&str]) -> std::io::Result<PathBuf> {
    let mut dir = root.to_path_buf();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        let have = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        let control = dir.join("cgroup.subtree_control");
        let on = std::fs::read_to_string(&control).unwrap_or_default();
        let add: Vec<String> = want
            .iter()
            .filter(|c| have.split_whitespace().any(|h| h == **c))
            .filter(|c| !on.split_whitespace().any(|o| o == **c))
            .map(|c| format!("+{c}"))
            .collect();
        if !add.is_empty() {
            std::fs::write(&control, add.join(" ")).map_err(|e| context(&control, e))?;
        }
        dir.push(part);
        std::fs::create_dir_all(&dir).map_err(|e| context(&dir, e))?;
    }
    Ok(dir)
}

fn context(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_writes_the_pods_pids_max_in_the_pids_hierarchy() {
        let d = tempfile_dir();
        std::fs::create_dir_all(d.join("pids")).unwrap();
        let dir = set_pids_limit(&d, "/kubepods/besteffort/podu1", 100).unwrap();
        assert_eq!(dir, d.join("pids/kubepods/besteffort/podu1"));
        assert_eq!(
            std::fs::read_to_string(dir.join("pids.max")).unwrap(),
            "100"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn v2_enables_pids_for_every_level_above() {
        let d = tempfile_dir();
        std::fs::write(d.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        std::fs::write(d.join("cgroup.subtree_control"), "").unwrap();
        // A level that has the controller already enabled is left alone.
        std::fs::create_dir_all(d.join("kubepods")).unwrap();
        std::fs::write(d.join("kubepods/cgroup.controllers"), "pids\n").unwrap();
        std::fs::write(d.join("kubepods/cgroup.subtree_control"), "pids\n").unwrap();
        let dir = set_pids_limit(&d, "kubepods/podu1", 7).unwrap();
        assert_eq!(dir, d.join("kubepods/podu1"));
        assert_eq!(std::fs::read_to_string(dir.join("pids.max")).unwrap(), "7");
        assert_eq!(
            std::fs::read_to_string(d.join("cgroup.subtree_control")).unwrap(),
            "+pids"
        );
        assert_eq!(
            std::fs::read_to_string(d.join("kubepods/cgroup.subtree_control")).unwrap(),
            "pids\n"
        );
        assert!(set_pids_limit(&d, "", 7).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    fn tempfile_dir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "kinglet-podcgroup-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
