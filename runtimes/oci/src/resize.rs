//! In-place resize of a running container (CRI `UpdateContainerResources`):
//! the CPU and memory files of its cgroup written where the container was
//! made (`linux.cgroupsPath` of its bundle), v1 or v2, as runc's and
//! libcgroups' controllers write them. The files are written here rather
//! than through libcgroups' manager: its `apply` also rewrites the device
//! rules of a v1 cgroup (deny all, then allow again) on every call, and
//! its per-controller writers are private.

use std::path::{Path, PathBuf};

use kinglet_runtime::ContainerResources;
use kinglet_runtime::podcgroup::Hierarchy;

/// A resize that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// cgroup v1 refuses a memory limit below what the container uses.
    #[error("cannot set the memory limit to {limit} bytes: the container uses {usage}")]
    BelowUsage { limit: i64, usage: i64 },
}

/// One file write, in the order they are made.
#[derive(Debug, PartialEq, Eq)]
pub struct Write {
    pub file: PathBuf,
    pub value: String,
}

/// cgroup v2's `cpu.weight` for CPU shares, as libcgroups converts them
/// when it makes the container (so a resize lands where a start would).
pub fn shares_to_weight(shares: u64) -> u64 {
    match shares {
        0 => 0,
        s => 1 + (s.max(2) - 2) * 9999 / 262_142,
    }
}

/// The writes that set `r` on the cgroup `cg` (relative to the hierarchy
/// root `root`), given the memory limit it has now (for v1's order of the
/// memory and memory+swap limits: the kernel refuses a memory limit above
/// the memory+swap one).
pub fn writes(
    h: Hierarchy,
    root: &Path,
    cg: &str,
    r: &ContainerResources,
    current_memory: i64,
) -> Vec<Write> {
    let w = |file: PathBuf, value: String| Write { file, value };
    match h {
        Hierarchy::V1 => {
            let cpu = root.join("cpu").join(cg);
            let mem = root.join("memory").join(cg);
            let limit = r.memory_limit.unwrap_or(-1);
            let mut out = vec![
                w(cpu.join("cpu.shares"), r.cpu_shares.to_string()),
                w(cpu.join("cpu.cfs_period_us"), "100000".into()),
                w(
                    cpu.join("cpu.cfs_quota_us"),
                    r.cpu_quota.unwrap_or(-1).to_string(),
                ),
            ];
            let memory = w(mem.join("memory.limit_in_bytes"), limit.to_string());
            let swap = r
                .memory_swap_limit
                .map(|s| w(mem.join("memory.memsw.limit_in_bytes"), s.to_string()));
            // Growing: memory+swap first; shrinking: memory first.
            let growing = limit == -1 || current_memory >= 0 && limit > current_memory;
            match (swap, growing) {
                (Some(s), true) => out.extend([s, memory]),
                (Some(s), false) => out.extend([memory, s]),
                (None, _) => out.push(memory),
            }
            out
        }
        Hierarchy::V2 => {
            let dir = root.join(cg);
            let quota = r.cpu_quota.map_or("max".into(), |q| q.to_string());
            let mut out = vec![
                w(
                    dir.join("cpu.weight"),
                    shares_to_weight(r.cpu_shares).to_string(),
                ),
                w(dir.join("cpu.max"), format!("{quota} 100000")),
                w(
                    dir.join("memory.max"),
                    r.memory_limit.map_or("max".into(), |m| m.to_string()),
                ),
            ];
            for (k, v) in &r.unified {
                if is_plain_file_name(k) {
                    out.push(w(dir.join(k), v.clone()));
                }
            }
            out
        }
    }
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name != "." && name != ".."
}

/// Sets `r` on the container's cgroup `cg` under the cgroup root `root`.
/// Blocking (cgroup file writes): call it off the async threads.
pub fn apply(root: &Path, cg: &str, r: &ContainerResources) -> Result<(), ResizeError> {
    let h = Hierarchy::detect(root);
    let current = match h {
        Hierarchy::V1 => read_i64(&root.join("memory").join(cg).join("memory.limit_in_bytes")),
        Hierarchy::V2 => None,
    };
    for wr in writes(h, root, cg, r, current.unwrap_or(-1)) {
        if let Err(e) = std::fs::write(&wr.file, &wr.value) {
            let is_limit = wr.file.ends_with("memory.limit_in_bytes");
            // v1 answers EBUSY to a limit below the usage.
            if is_limit && e.raw_os_error() == Some(libc::EBUSY) {
                let usage = read_i64(&wr.file.with_file_name("memory.usage_in_bytes"));
                return Err(ResizeError::BelowUsage {
                    limit: r.memory_limit.unwrap_or(-1),
                    usage: usage.unwrap_or(-1),
                });
            }
            return Err(ResizeError::Write {
                path: wr.file,
                source: e,
            });
        }
    }
    Ok(())
}

fn read_i64(p: &Path) -> Option<i64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(shares: u64, quota: Option<i64>, mem: Option<i64>) -> ContainerResources {
        ContainerResources {
            cpu_shares: shares,
            cpu_quota: quota,
            memory_limit: mem,
            ..Default::default()
        }
    }

    fn files(ws: &[Write]) -> Vec<(String, &str)> {
        ws.iter()
            .map(|w| (w.file.display().to_string(), w.value.as_str()))
            .collect()
    }

    #[test]
    fn v1_writes_cpu_then_memory_with_swap_in_the_kernels_order() {
        let root = Path::new("/cg");
        let mut r = res(25, Some(3500), Some(50 << 20));
        r.memory_swap_limit = Some(50 << 20);
        let grow = writes(Hierarchy::V1, root, "k/p/c", &r, 40 << 20);
        assert_eq!(
            files(&grow),
            [
                ("/cg/cpu/k/p/c/cpu.shares".into(), "25"),
                ("/cg/cpu/k/p/c/cpu.cfs_period_us".into(), "100000"),
                ("/cg/cpu/k/p/c/cpu.cfs_quota_us".into(), "3500"),
                (
                    "/cg/memory/k/p/c/memory.memsw.limit_in_bytes".into(),
                    "52428800"
                ),
                ("/cg/memory/k/p/c/memory.limit_in_bytes".into(), "52428800"),
            ]
        );
        let shrink = writes(Hierarchy::V1, root, "k/p/c", &r, 60 << 20);
        assert!(shrink[3].file.ends_with("memory.limit_in_bytes"));
        assert!(shrink[4].file.ends_with("memory.memsw.limit_in_bytes"));
        // No limit: -1, v1's "unlimited".
        let none = writes(Hierarchy::V1, root, "c", &res(2, None, None), -1);
        assert_eq!(none[2].value, "-1");
        assert_eq!(none[3].value, "-1");
    }

    #[test]
    fn v2_writes_weight_max_and_the_unified_files() {
        let mut r = res(1024, None, Some(1 << 30));
        r.unified.insert("memory.swap.max".into(), "0".into());
        r.unified.insert("../escape".into(), "1".into());
        let ws = writes(Hierarchy::V2, Path::new("/cg"), "k/c", &r, -1);
        assert_eq!(
            files(&ws),
            [
                ("/cg/k/c/cpu.weight".into(), "39"),
                ("/cg/k/c/cpu.max".into(), "max 100000"),
                ("/cg/k/c/memory.max".into(), "1073741824"),
                ("/cg/k/c/memory.swap.max".into(), "0"),
            ]
        );
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }

    #[test]
    fn apply_writes_a_v1_tree_and_names_the_file_it_could_not_write() {
        let d = std::env::temp_dir().join(format!("kinglet-resize-{}", std::process::id()));
        for c in ["cpu/c", "memory/c"] {
            std::fs::create_dir_all(d.join(c)).unwrap();
        }
        std::fs::write(d.join("memory/c/memory.limit_in_bytes"), "100").unwrap();
        apply(&d, "c", &res(30, Some(2000), Some(200))).unwrap();
        let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap();
        assert_eq!(read("cpu/c/cpu.cfs_quota_us"), "2000");
        assert_eq!(read("memory/c/memory.limit_in_bytes"), "200");
        let e = apply(&d, "gone", &res(30, None, None)).unwrap_err();
        assert!(e.to_string().contains("cpu/gone/cpu.shares"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
