//! The eviction signals, measured as upstream defines them:
//! `memory.available` (capacity − working set, from `/proc/meminfo`),
//! `allocatableMemory.available` (the pods' cgroup limit − its working
//! set, usage minus inactive file pages, cgroup v1 or v2), `nodefs.*` and
//! `imagefs.*` (`statvfs` of the root dir and of the image store),
//! `containerfs.*` (the image store's: the writable layers live there),
//! `pid.available` (`pid_max` − tasks). A reading that fails is left out:
//! the threshold neither fires nor clears on a guess.

use std::path::{Path, PathBuf};

use super::thresholds::{Observation, Observations};
use crate::node::host::{HostPaths, fs_stats};

/// The cgroup hierarchy of the host (detected in one place for the agent
/// and both runtimes).
pub use kinglet_runtime::podcgroup::Hierarchy;

/// A memory cgroup: where its usage and statistics are read.
#[derive(Clone, Debug)]
pub struct MemCgroup {
    pub dir: PathBuf,
    pub hierarchy: Hierarchy,
}

impl MemCgroup {
    /// The memory cgroup of `path` (relative to the cgroup mount).
    pub fn new(mount: &Path, path: &str) -> MemCgroup {
        let hierarchy = Hierarchy::detect(mount);
        let base = match hierarchy {
            Hierarchy::V1 => mount.join("memory"),
            Hierarchy::V2 => mount.to_path_buf(),
        };
        MemCgroup {
            dir: base.join(path.trim_start_matches('/')),
            hierarchy,
        }
    }

    fn file(&self, v1: &str, v2: &str) -> PathBuf {
        self.dir.join(match self.hierarchy {
            Hierarchy::V1 => v1,
            Hierarchy::V2 => v2,
        })
    }

    pub fn usage_file(&self) -> PathBuf {
        self.file("memory.usage_in_bytes", "memory.current")
    }

    pub fn usage(&self) -> Option<u64> {
        read_u64(&self.usage_file())
    }

    pub fn inactive_file(&self) -> Option<u64> {
        let key = match self.hierarchy {
            Hierarchy::V1 => "total_inactive_file",
            Hierarchy::V2 => "inactive_file",
        };
        let stat = std::fs::read_to_string(self.dir.join("memory.stat")).ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Usage minus inactive file pages: what the kernel cannot easily take
    /// back.
    pub fn working_set(&self) -> Option<u64> {
        Some(
            self.usage()?
                .saturating_sub(self.inactive_file().unwrap_or(0)),
        )
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Where the signals are read from.
#[derive(Clone, Debug)]
pub struct Sources {
    pub host: HostPaths,
    /// The root memory cgroup (`memory.available`'s memcg threshold).
    pub root: MemCgroup,
    /// The pods' cgroup (`allocatableMemory.available`), when node
    /// allocatable is enforced on it.
    pub pods: Option<MemCgroup>,
    /// Its capacity: the allocatable memory (capacity − reservations).
    pub pods_capacity: u64,
    pub nodefs: PathBuf,
    pub imagefs: PathBuf,
}

/// Every signal that could be read now.
pub fn observe(s: &Sources) -> Observations {
    let mut o = Observations::new();
    let mem = s.host.meminfo();
    if mem.total > 0 {
        o.insert(
            "memory.available",
            Observation {
                available: mem.available(),
                capacity: mem.total,
            },
        );
    }
    if let Some(ws) = s.pods.as_ref().and_then(MemCgroup::working_set) {
        o.insert(
            "allocatableMemory.available",
            Observation {
                available: s.pods_capacity.saturating_sub(ws),
                capacity: s.pods_capacity,
            },
        );
    }
    // The containers' writable layers live beside the images (no split
    // image filesystem, KEP-4191): `containerfs.*` is the image
    // filesystem, as upstream observes it when the two are not split.
    let filesystems = [
        (&s.nodefs, "nodefs.available", "nodefs.inodesFree"),
        (&s.imagefs, "imagefs.available", "imagefs.inodesFree"),
        (
            &s.imagefs,
            "containerfs.available",
            "containerfs.inodesFree",
        ),
    ];
    for (dir, bytes, inodes) in filesystems {
        let Ok(fs) = fs_stats(dir) else { continue };
        o.insert(
            bytes,
            Observation {
                available: fs.available_bytes,
                capacity: fs.capacity_bytes,
            },
        );
        o.insert(
            inodes,
            Observation {
                available: fs.inodes_free,
                capacity: fs.inodes,
            },
        );
    }
    let (max, used) = s.host.pids();
    o.insert(
        "pid.available",
        Observation {
            available: max.saturating_sub(used),
            capacity: max,
        },
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v1_cgroup_reads_usage_limit_and_working_set() {
        let d = tempfile::tempdir().unwrap();
        let cg = d.path().join("memory/edge/kubepods");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("memory.usage_in_bytes"), "500\n").unwrap();
        std::fs::write(cg.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(
            cg.join("memory.stat"),
            "inactive_file 7\ntotal_inactive_file 100\n",
        )
        .unwrap();
        let m = MemCgroup::new(d.path(), "/edge/kubepods");
        assert_eq!(m.hierarchy, Hierarchy::V1);
        assert_eq!(m.working_set(), Some(400));
    }

    #[test]
    fn containerfs_is_the_image_filesystem() {
        let d = tempfile::tempdir().unwrap();
        let s = Sources {
            host: HostPaths::default(),
            root: MemCgroup::new(d.path(), "/"),
            pods: None,
            pods_capacity: 0,
            nodefs: d.path().to_path_buf(),
            imagefs: d.path().to_path_buf(),
        };
        let o = observe(&s);
        for (c, i) in [
            ("containerfs.available", "imagefs.available"),
            ("containerfs.inodesFree", "imagefs.inodesFree"),
        ] {
            let (c, i) = (o.get(c).unwrap(), o.get(i).unwrap());
            assert_eq!(c.capacity, i.capacity);
            assert!(c.capacity > 0);
        }
    }

    #[test]
    fn a_v2_cgroup_and_a_vanished_one() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cgroup.controllers"), "memory\n").unwrap();
        let cg = d.path().join("kubepods");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("memory.current"), "500").unwrap();
        std::fs::write(cg.join("memory.max"), "max").unwrap();
        std::fs::write(cg.join("memory.stat"), "anon 400\ninactive_file 50\n").unwrap();
        let m = MemCgroup::new(d.path(), "kubepods");
        assert_eq!(m.hierarchy, Hierarchy::V2);
        assert_eq!(m.working_set(), Some(450));
        std::fs::remove_dir_all(&cg).unwrap();
        assert_eq!(m.working_set(), None);
    }
}
