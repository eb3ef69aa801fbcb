//! Orphaned pod cgroups, as upstream's `cleanupOrphanedPodCgroups`: the
//! pod-level cgroups (`pod<uid>` under the pods' cgroup and its
//! `burstable`/`besteffort` children, in every hierarchy) of pods this
//! node ran that no source and no worker knows any more are removed. A pod's cgroup
//! normally goes with its sandbox; this catches the one a kill left
//! behind (a container made in a pod's cgroup after its sandbox was
//! removed). Only empty ones go: `rmdir` refuses a cgroup with tasks, so a
//! pod still tearing down is tried again at the next sweep.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kinglet_runtime::podcgroup::Hierarchy;

/// The pod cgroups under `mount` (the cgroup filesystem: v2's root, or
/// v1's hierarchies below it) of the UIDs in `gone`. (Only pods this node
/// ran are judged: several agents may share the pods' cgroup, as the
/// end-to-end tests' nodes do.)
pub fn of(mount: &Path, pods_cgroup: &str, gone: &BTreeSet<String>) -> Vec<(String, PathBuf)> {
    let root = match pods_cgroup.trim_matches('/') {
        "" => "kubepods",
        r => r,
    };
    let mut bases = vec![mount.to_path_buf()];
    if Hierarchy::detect(mount) == Hierarchy::V1 {
        bases = dirs(mount);
    }
    let mut found = Vec::new();
    for base in bases {
        let pods = base.join(root);
        for qos in [
            pods.clone(),
            pods.join("burstable"),
            pods.join("besteffort"),
        ] {
            for d in dirs(&qos) {
                let name = d.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if let Some(uid) = name.strip_prefix("pod")
                    && gone.contains(uid)
                {
                    found.push((uid.to_string(), d));
                }
            }
        }
    }
    found
}

/// Removes the pod cgroups of `gone` under `mount`; the UIDs none is left
/// of.
pub fn sweep(mount: &Path, pods_cgroup: &str, gone: &BTreeSet<String>) -> BTreeSet<String> {
    let mut left = BTreeSet::new();
    for (uid, dir) in of(mount, pods_cgroup, gone) {
        if remove(&dir) {
            tracing::info!(pod_uid = %uid, cgroup = %dir.display(), "removed the cgroup of a pod that is gone");
        } else {
            left.insert(uid);
        }
    }
    gone.difference(&left).cloned().collect()
}

/// Removes `dir` and the cgroups below it, deepest first; a cgroup with
/// tasks stays (and so do its parents).
pub fn remove(dir: &Path) -> bool {
    for d in dirs(dir) {
        remove(&d);
    }
    std::fs::remove_dir(dir).is_ok()
}

fn dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroups_of_unknown_pods_are_orphans_in_every_hierarchy() {
        let d = tempfile::tempdir().unwrap();
        for p in [
            "memory/edge/kubepods/besteffort/podgone/ctr",
            "cpu/edge/kubepods/podkept",
            "cpu/edge/kubepods/burstable/podgone2",
            "memory/edge/kubepods/burstable",
        ] {
            std::fs::create_dir_all(d.path().join(p)).unwrap();
        }
        let gone = BTreeSet::from(["gone".to_string(), "gone2".to_string(), "x".into()]);
        let mut o: Vec<PathBuf> = of(d.path(), "/edge/kubepods", &gone)
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        o.sort();
        assert_eq!(
            o,
            vec![
                d.path().join("cpu/edge/kubepods/burstable/podgone2"),
                d.path().join("memory/edge/kubepods/besteffort/podgone"),
            ]
        );
        // Every UID is done (none left of it); QoS dirs and the pod not
        // named stay.
        assert_eq!(sweep(d.path(), "/edge/kubepods", &gone), gone);
        assert!(d.path().join("cpu/edge/kubepods/podkept").exists());
        assert!(d.path().join("memory/edge/kubepods/burstable").exists());
        assert!(of(d.path(), "/edge/kubepods", &gone).is_empty());
    }
}
