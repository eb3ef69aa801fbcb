//! The node's swap (NodeSwap, GA in 1.34): whether it may run with swap
//! on (`failSwapOn`, upstream's start-up check of `/proc/swaps`), how
//! much there is (`SwapTotal`, the node's `nodeInfo.swap.capacity`), and
//! which swap controller its cgroups have. The per-container limits are
//! the pod side's (`pods::kuberuntime::swap`).

use std::path::Path;

use kinglet_runtime::podcgroup::Hierarchy;

/// The node's swap, as containers' limits are computed from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeSwap {
    /// `memorySwap.swapBehavior: LimitedSwap` (else NoSwap).
    pub limited: bool,
    /// The hierarchy whose swap controller the node has, if any.
    pub controller: Option<Hierarchy>,
    /// Swap space (`SwapTotal`), bytes.
    pub capacity: u64,
}

/// Swap is on while `failSwapOn` forbids it.
#[derive(Debug, thiserror::Error)]
#[error(
    "running with swap on is not supported, please disable swap! or set --fail-swap-on flag to false. /proc/swaps contained: {0:?}"
)]
pub struct SwapOn(pub Vec<String>);

/// Upstream's check: with `failSwapOn`, any device or file in
/// `/proc/swaps` (past its header) stops the start.
pub fn check(fail_swap_on: bool, proc_swaps: &str) -> Result<(), SwapOn> {
    let devices: Vec<String> = proc_swaps
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    if fail_swap_on && !devices.is_empty() {
        return Err(SwapOn(devices));
    }
    Ok(())
}

/// The swap controller of the cgroup `own` (the agent's, relative) lives
/// in: v1's `memory.memsw.limit_in_bytes`, v2's `memory.swap.max` (absent
/// at the root, so looked for in the agent's own cgroup, as upstream).
pub fn controller(mount: &Path, own: &str) -> Option<Hierarchy> {
    let h = Hierarchy::detect(mount);
    let file = match h {
        Hierarchy::V1 => mount.join("memory/memory.memsw.limit_in_bytes"),
        Hierarchy::V2 => mount
            .join(own.trim_start_matches('/'))
            .join("memory.swap.max"),
    };
    file.exists().then_some(h)
}

/// The node's swap of `capacity` bytes (the machine's `SwapTotal`), its
/// controller found from this process's own cgroup (`/proc/self/cgroup`)
/// in the hierarchy under `mount`.
pub fn detect(mount: &Path, limited: bool, capacity: u64) -> NodeSwap {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/");
    NodeSwap {
        limited,
        controller: controller(mount, own.trim()),
        capacity,
    }
}

/// `SwapTotal` of `/proc/meminfo`, bytes.
pub fn capacity(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_on_stops_the_start_only_when_asked() {
        let header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        let on = format!(
            "{header}/dev/zram0                              partition\t524284\t\t0\t\t100\n"
        );
        assert!(check(true, header).is_ok());
        let e = check(true, &on).unwrap_err().to_string();
        assert!(
            e.starts_with("running with swap on is not supported") && e.contains("/dev/zram0"),
            "{e}"
        );
        assert!(check(false, &on).is_ok());
    }

    #[test]
    fn capacity_and_controller_as_the_kernel_shows_them() {
        assert_eq!(
            capacity("MemTotal: 100 kB\nSwapTotal:     524284 kB\n"),
            524284 * 1024
        );
        assert_eq!(capacity("MemTotal: 100 kB\n"), 0);
        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("cgroup.controllers"), "memory").unwrap();
        std::fs::create_dir_all(v2.path().join("system.slice/kinglet.service")).unwrap();
        assert_eq!(controller(v2.path(), "/system.slice/kinglet.service"), None);
        std::fs::write(
            v2.path()
                .join("system.slice/kinglet.service/memory.swap.max"),
            "max",
        )
        .unwrap();
        assert_eq!(
            controller(v2.path(), "/system.slice/kinglet.service"),
            Some(Hierarchy::V2)
        );
        let v1 = tempfile::tempdir().unwrap();
        assert_eq!(controller(v1.path(), "/"), None);
        std::fs::create_dir_all(v1.path().join("memory")).unwrap();
        std::fs::write(v1.path().join("memory/memory.memsw.limit_in_bytes"), "0").unwrap();
        assert_eq!(controller(v1.path(), "/"), Some(Hierarchy::V1));
    }
}
