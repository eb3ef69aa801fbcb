//! One cgroup's readings, on cgroup v1 or v2, taken as upstream's cAdvisor
//! takes them (through runc's cgroup stats): CPU time (total, user,
//! system, CFS periods and throttling), memory (usage, working set, RSS,
//! page cache, mapped files, swap, peak, limit hits, page faults, OOM
//! kills), block I/O by device, tasks, and the limits set on the cgroup.
//! The in-process runtime's container stats and the agent's
//! `/metrics/cadvisor` read cgroups here; the parsers are pure, the
//! readers only read files. A file that is missing or unreadable reads as
//! zero (a cgroup going away mid-read, a controller not enabled).

use std::path::{Path, PathBuf};

use crate::podcgroup::Hierarchy;

/// Everything read of one cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupStats {
    pub cpu: CpuStats,
    pub memory: MemoryStats,
    /// Block I/O by device, sorted by device number.
    pub io: Vec<IoStats>,
    pub tasks: TaskStats,
    pub limits: Limits,
}

/// Cumulative CPU time, in nanoseconds, and CFS bandwidth accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuStats {
    pub usage_ns: u64,
    pub user_ns: u64,
    pub system_ns: u64,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// Memory, in bytes (faults and OOM kills in counts). Fields named as
/// cAdvisor's `MemoryStats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub usage: u64,
    /// Usage minus inactive file pages (cAdvisor's working set).
    pub working_set: u64,
    pub rss: u64,
    pub cache: u64,
    pub mapped_file: u64,
    pub swap: u64,
    /// The peak usage (v1 `max_usage_in_bytes`, v2 `memory.peak`).
    pub max_usage: u64,
    /// Times the limit was hit (v1 `failcnt`, v2 `memory.events` max).
    pub failcnt: u64,
    /// Page faults of the cgroup's own tasks and of its whole subtree
    /// (the same on v2, whose counters are hierarchical).
    pub pgfault: u64,
    pub pgmajfault: u64,
    pub hierarchy_pgfault: u64,
    pub hierarchy_pgmajfault: u64,
    pub oom_kills: u64,
}

/// One block device's I/O.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    pub major: u32,
    pub minor: u32,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// The cgroup's tasks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskStats {
    /// Threads (`pids.current`).
    pub threads: u64,
    /// `pids.max`; 0 when unlimited.
    pub threads_max: u64,
    /// The processes of the cgroup alone (`cgroup.procs`).
    pub procs: Vec<i32>,
}

/// The limits set on the cgroup, as cAdvisor's container spec has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// v1 `cpu.shares`; on v2 `cpu.weight` converted back to shares.
    pub cpu_shares: u64,
    /// Microseconds per period; `None` when unlimited.
    pub cpu_quota: Option<u64>,
    pub cpu_period: u64,
    /// Bytes; `None` when unlimited.
    pub memory: Option<u64>,
    pub memory_reservation: Option<u64>,
    pub swap: Option<u64>,
}

/// The value of `key` in a flat-keyed file (`memory.stat`, `cpu.stat`,
/// `memory.events`: `key value` lines).
pub fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// A single-value file; `max` (v2) and v1's "unlimited" (anything above
/// 2^62, the page-rounded `i64::MAX`) read as `None`.
pub fn limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// v2 `cpu.max`: (`quota`, `period`); quota `None` for `max`.
pub fn cpu_max(text: &str) -> (Option<u64>, u64) {
    let mut it = text.split_whitespace();
    let quota = it.next().and_then(|q| q.parse().ok());
    let period = it.next().and_then(|p| p.parse().ok()).unwrap_or(100_000);
    (quota, period)
}

/// v2 `cpu.weight` (1–10000) back to v1 shares (2–262144), the inverse of
/// the conversion runc makes, as cAdvisor reports it.
pub fn weight_to_shares(weight: u64) -> u64 {
    if weight == 0 {
        return 0;
    }
    2 + (weight.saturating_sub(1) * 262_142) / 9_999
}

/// v2 `io.stat`: `maj:min rbytes=… wbytes=… rios=… wios=… …` lines.
pub fn io_stat_v2(text: &str) -> Vec<IoStats> {
    let mut out: Vec<IoStats> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let mut io = device(it.next()?)?;
            for kv in it {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                let v = v.parse().unwrap_or(0);
                match k {
                    "rbytes" => io.read_bytes = v,
                    "wbytes" => io.write_bytes = v,
                    "rios" => io.reads = v,
                    "wios" => io.writes = v,
                    _ => {}
                }
            }
            Some(io)
        })
        .collect();
    out.sort_by_key(|d| (d.major, d.minor));
    out
}

/// v1 `blkio.throttle.io_service_bytes` and `…io_serviced`: `maj:min Op
/// value` lines (and a `Total` line).
pub fn io_stat_v1(bytes: &str, ops: &str) -> Vec<IoStats> {
    let mut out: Vec<IoStats> = Vec::new();
    for (text, is_bytes) in [(bytes, true), (ops, false)] {
        for l in text.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [dev, op, v] = f[..] else { continue };
            let Some(d) = device(dev) else { continue };
            let v: u64 = v.parse().unwrap_or(0);
            let i = match out
                .iter()
                .position(|o| (o.major, o.minor) == (d.major, d.minor))
            {
                Some(i) => i,
                None => {
                    out.push(d);
                    out.len() - 1
                }
            };
            let io = &mut out[i];
            match (op, is_bytes) {
                ("Read", true) => io.read_bytes = v,
                ("Write", true) => io.write_bytes = v,
                ("Read", false) => io.reads = v,
                ("Write", false) => io.writes = v,
                _ => {}
            }
        }
    }
    out.sort_by_key(|d| (d.major, d.minor));
    out
}

fn device(s: &str) -> Option<IoStats> {
    let (maj, min) = s.split_once(':')?;
    Some(IoStats {
        major: maj.parse().ok()?,
        minor: min.parse().ok()?,
        ..IoStats::default()
    })
}

/// The process IDs of a `cgroup.procs`.
pub fn procs(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn num(p: PathBuf) -> u64 {
    read(p).trim().parse().unwrap_or(0)
}

impl CgroupStats {
    /// Reads the cgroup `rel` (relative to the mount `root`).
    pub fn read(root: &Path, hierarchy: Hierarchy, rel: &str) -> CgroupStats {
        let rel = rel.trim_matches('/');
        match hierarchy {
            Hierarchy::V2 => read_v2(&root.join(rel)),
            Hierarchy::V1 => read_v1(&|controller: &str| root.join(controller).join(rel)),
        }
    }

    /// CPU time (ns) and memory working set (bytes) alone, from three
    /// files instead of the whole set: what `/metrics/resource` and the
    /// CRI stats calls need, read for every container at each scrape.
    pub fn read_usage(root: &Path, hierarchy: Hierarchy, rel: &str) -> (u64, u64) {
        let rel = rel.trim_matches('/');
        let (cpu_ns, usage, mem) = match hierarchy {
            Hierarchy::V2 => {
                let dir = root.join(rel);
                let cpu = read(dir.join("cpu.stat"));
                (
                    keyed(&cpu, "usage_usec") * 1000,
                    num(dir.join("memory.current")),
                    read(dir.join("memory.stat")),
                )
            }
            Hierarchy::V1 => (
                num(root.join("cpuacct").join(rel).join("cpuacct.usage")),
                num(root.join("memory").join(rel).join("memory.usage_in_bytes")),
                read(root.join("memory").join(rel).join("memory.stat")),
            ),
        };
        let inactive = match hierarchy {
            Hierarchy::V2 => keyed(&mem, "inactive_file"),
            Hierarchy::V1 => keyed(&mem, "total_inactive_file"),
        };
        (cpu_ns, usage.saturating_sub(inactive))
    }

    /// Whether the cgroup `rel` exists (its memory controller's directory).
    pub fn exists(root: &Path, hierarchy: Hierarchy, rel: &str) -> bool {
        let rel = rel.trim_matches('/');
        match hierarchy {
            Hierarchy::V2 => root.join(rel).is_dir(),
            Hierarchy::V1 => root.join("memory").join(rel).is_dir(),
        }
    }
}

fn read_v2(dir: &Path) -> CgroupStats {
    let cpu = read(dir.join("cpu.stat"));
    let mem = read(dir.join("memory.stat"));
    let events = read(dir.join("memory.events"));
    let usage = num(dir.join("memory.current"));
    let (pgfault, pgmajfault) = (keyed(&mem, "pgfault"), keyed(&mem, "pgmajfault"));
    let (cpu_quota, cpu_period) = cpu_max(&read(dir.join("cpu.max")));
    CgroupStats {
        cpu: CpuStats {
            usage_ns: keyed(&cpu, "usage_usec") * 1000,
            user_ns: keyed(&cpu, "user_usec") * 1000,
            system_ns: keyed(&cpu, "system_usec") * 1000,
            periods: keyed(&cpu, "nr_periods"),
            throttled_periods: keyed(&cpu, "nr_throttled"),
            throttled_ns: keyed(&cpu, "throttled_usec") * 1000,
        },
        memory: MemoryStats {
            usage,
            working_set: usage.saturating_sub(keyed(&mem, "inactive_file")),
            rss: keyed(&mem, "anon"),
            cache: keyed(&mem, "file"),
            mapped_file: keyed(&mem, "file_mapped"),
            swap: num(dir.join("memory.swap.current")),
            max_usage: num(dir.join("memory.peak")),
            failcnt: keyed(&events, "max"),
            pgfault,
            pgmajfault,
            hierarchy_pgfault: pgfault,
            hierarchy_pgmajfault: pgmajfault,
            oom_kills: keyed(&events, "oom_kill"),
        },
        io: io_stat_v2(&read(dir.join("io.stat"))),
        tasks: TaskStats {
            threads: num(dir.join("pids.current")),
            threads_max: limit(&read(dir.join("pids.max"))).unwrap_or(0),
            procs: procs(&read(dir.join("cgroup.procs"))),
        },
        limits: Limits {
            cpu_shares: weight_to_shares(num(dir.join("cpu.weight"))),
            cpu_quota,
            cpu_period,
            memory: limit(&read(dir.join("memory.max"))),
            memory_reservation: limit(&read(dir.join("memory.min"))).filter(|v| *v > 0),
            swap: limit(&read(dir.join("memory.swap.max"))),
        },
    }
}

/// USER_HZ, the unit of v1's `cpuacct.stat`, on every Linux ABI kinglet
/// builds for.
const TICK_NS: u64 = 10_000_000;

fn read_v1(at: &dyn Fn(&str) -> PathBuf) -> CgroupStats {
    let acct = read(at("cpuacct").join("cpuacct.stat"));
    let cpu = read(at("cpu").join("cpu.stat"));
    let mem = read(at("memory").join("memory.stat"));
    let usage = num(at("memory").join("memory.usage_in_bytes"));
    let oom = read(at("memory").join("memory.oom_control"));
    let quota: i64 = read(at("cpu").join("cpu.cfs_quota_us"))
        .trim()
        .parse()
        .unwrap_or(-1);
    let blkio = at("blkio");
    CgroupStats {
        cpu: CpuStats {
            usage_ns: num(at("cpuacct").join("cpuacct.usage")),
            user_ns: keyed(&acct, "user") * TICK_NS,
            system_ns: keyed(&acct, "system") * TICK_NS,
            periods: keyed(&cpu, "nr_periods"),
            throttled_periods: keyed(&cpu, "nr_throttled"),
            throttled_ns: keyed(&cpu, "throttled_time"),
        },
        memory: MemoryStats {
            usage,
            working_set: usage.saturating_sub(keyed(&mem, "total_inactive_file")),
            rss: keyed(&mem, "total_rss"),
            cache: keyed(&mem, "total_cache"),
            mapped_file: keyed(&mem, "total_mapped_file"),
            swap: keyed(&mem, "total_swap"),
            max_usage: num(at("memory").join("memory.max_usage_in_bytes")),
            failcnt: num(at("memory").join("memory.failcnt")),
            pgfault: keyed(&mem, "pgfault"),
            pgmajfault: keyed(&mem, "pgmajfault"),
            hierarchy_pgfault: keyed(&mem, "total_pgfault"),
            hierarchy_pgmajfault: keyed(&mem, "total_pgmajfault"),
            oom_kills: keyed(&oom, "oom_kill"),
        },
        io: io_stat_v1(
            &read(blkio.join("blkio.throttle.io_service_bytes")),
            &read(blkio.join("blkio.throttle.io_serviced")),
        ),
        tasks: TaskStats {
            threads: num(at("pids").join("pids.current")),
            threads_max: limit(&read(at("pids").join("pids.max"))).unwrap_or(0),
            procs: procs(&read(at("memory").join("cgroup.procs"))),
        },
        limits: Limits {
            cpu_shares: num(at("cpu").join("cpu.shares")),
            cpu_quota: u64::try_from(quota).ok(),
            cpu_period: num(at("cpu").join("cpu.cfs_period_us")),
            memory: limit(&read(at("memory").join("memory.limit_in_bytes"))),
            memory_reservation: limit(&read(at("memory").join("memory.soft_limit_in_bytes"))),
            swap: limit(&read(at("memory").join("memory.memsw.limit_in_bytes"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    #[test]
    fn v2_files_read_as_cadvisor_reads_them() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory").unwrap();
        let cg = root.path().join("kubepods/burstable/podu/c1");
        write(
            &cg,
            &[
                (
                    "cpu.stat",
                    "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 7\nnr_throttled 2\nthrottled_usec 30\n",
                ),
                ("memory.current", "1000\n"),
                (
                    "memory.stat",
                    "anon 600\nfile 300\nfile_mapped 40\ninactive_file 250\npgfault 11\npgmajfault 1\n",
                ),
                ("memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n"),
                ("memory.swap.current", "8\n"),
                ("memory.peak", "2000\n"),
                ("memory.max", "67108864\n"),
                ("memory.min", "0\n"),
                ("memory.swap.max", "max\n"),
                (
                    "io.stat",
                    "8:16 rbytes=5 wbytes=6 rios=1 wios=2 dbytes=0 dios=0\n8:0 rbytes=10 wbytes=20 rios=3 wios=4\n",
                ),
                ("pids.current", "3\n"),
                ("pids.max", "max\n"),
                ("cgroup.procs", "41\n42\n"),
                ("cpu.max", "20000 100000\n"),
                ("cpu.weight", "17\n"),
            ],
        );
        let s = CgroupStats::read(root.path(), Hierarchy::V2, "/kubepods/burstable/podu/c1");
        assert_eq!(
            CgroupStats::read_usage(root.path(), Hierarchy::V2, "/kubepods/burstable/podu/c1"),
            (s.cpu.usage_ns, s.memory.working_set),
            "the scrape's short read agrees with the whole one"
        );
        assert_eq!(
            s.cpu,
            CpuStats {
                usage_ns: 1_500_000,
                user_ns: 1_000_000,
                system_ns: 500_000,
                periods: 7,
                throttled_periods: 2,
                throttled_ns: 30_000
            }
        );
        let m = &s.memory;
        assert_eq!(
            (m.usage, m.working_set, m.rss, m.cache),
            (1000, 750, 600, 300)
        );
        assert_eq!(
            (m.mapped_file, m.swap, m.max_usage, m.failcnt),
            (40, 8, 2000, 4)
        );
        assert_eq!((m.pgfault, m.hierarchy_pgmajfault, m.oom_kills), (11, 1, 1));
        assert_eq!(s.io.len(), 2);
        assert_eq!(
            (s.io[0].minor, s.io[0].read_bytes, s.io[0].writes),
            (0, 10, 4)
        );
        assert_eq!((s.tasks.threads, s.tasks.threads_max), (3, 0));
        assert_eq!(s.tasks.procs, vec![41, 42]);
        // kinglet writes weight 17 for 256 shares (a request of 250m).
        assert_eq!(s.limits.cpu_shares, 2 + 16 * 262_142 / 9_999);
        assert_eq!(
            (s.limits.cpu_quota, s.limits.cpu_period),
            (Some(20_000), 100_000)
        );
        assert_eq!(s.limits.memory, Some(64 << 20));
        assert_eq!((s.limits.memory_reservation, s.limits.swap), (None, None));
    }

    #[test]
    fn v1_files_read_from_each_controller() {
        let root = tempfile::tempdir().unwrap();
        let rel = "kubepods/besteffort/podu/c1";
        let at = |c: &str| root.path().join(c).join(rel);
        write(
            &at("cpuacct"),
            &[
                ("cpuacct.usage", "123456789\n"),
                ("cpuacct.stat", "user 3\nsystem 2\n"),
            ],
        );
        write(
            &at("cpu"),
            &[
                (
                    "cpu.stat",
                    "nr_periods 5\nnr_throttled 1\nthrottled_time 999\n",
                ),
                ("cpu.shares", "2\n"),
                ("cpu.cfs_quota_us", "-1\n"),
                ("cpu.cfs_period_us", "100000\n"),
            ],
        );
        write(
            &at("memory"),
            &[
                ("memory.usage_in_bytes", "4096\n"),
                (
                    "memory.stat",
                    "cache 1\nrss 2\npgfault 3\ntotal_cache 100\ntotal_rss 200\ntotal_mapped_file 7\ntotal_swap 0\ntotal_inactive_file 96\ntotal_pgfault 30\ntotal_pgmajfault 2\n",
                ),
                ("memory.max_usage_in_bytes", "8192\n"),
                ("memory.failcnt", "6\n"),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
                ),
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.soft_limit_in_bytes", "9223372036854771712\n"),
                ("cgroup.procs", "7\n"),
            ],
        );
        write(
            &at("blkio"),
            &[
                (
                    "blkio.throttle.io_service_bytes",
                    "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Total 12288\nTotal 12288\n",
                ),
                (
                    "blkio.throttle.io_serviced",
                    "8:0 Read 1\n8:0 Write 2\nTotal 3\n",
                ),
            ],
        );
        write(
            &at("pids"),
            &[("pids.current", "1\n"), ("pids.max", "300\n")],
        );
        let s = CgroupStats::read(root.path(), Hierarchy::V1, rel);
        assert_eq!(
            CgroupStats::read_usage(root.path(), Hierarchy::V1, rel),
            (s.cpu.usage_ns, s.memory.working_set),
            "the scrape's short read agrees with the whole one"
        );
        assert_eq!(
            (s.cpu.usage_ns, s.cpu.user_ns, s.cpu.system_ns),
            (123_456_789, 30_000_000, 20_000_000)
        );
        assert_eq!((s.cpu.periods, s.cpu.throttled_ns), (5, 999));
        let m = &s.memory;
        assert_eq!(
            (m.usage, m.working_set, m.rss, m.cache, m.mapped_file),
            (4096, 4000, 200, 100, 7)
        );
        assert_eq!((m.max_usage, m.failcnt, m.oom_kills), (8192, 6, 2));
        assert_eq!(
            (m.pgfault, m.hierarchy_pgfault, m.hierarchy_pgmajfault),
            (3, 30, 2)
        );
        assert_eq!(
            s.io,
            vec![IoStats {
                major: 8,
                minor: 0,
                read_bytes: 4096,
                write_bytes: 8192,
                reads: 1,
                writes: 2
            }]
        );
        assert_eq!(
            (s.tasks.threads, s.tasks.threads_max, s.tasks.procs.clone()),
            (1, 300, vec![7])
        );
        assert_eq!(
            (s.limits.cpu_shares, s.limits.cpu_quota, s.limits.memory),
            (2, None, None)
        );
        assert!(CgroupStats::exists(root.path(), Hierarchy::V1, rel));
        assert!(!CgroupStats::exists(
            root.path(),
            Hierarchy::V1,
            "kubepods/gone"
        ));
    }

    #[test]
    fn a_cgroup_gone_mid_read_reads_as_zero() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(
            CgroupStats::read(root.path(), Hierarchy::V2, "nowhere"),
            CgroupStats {
                limits: Limits {
                    cpu_period: 100_000,
                    ..Limits::default()
                },
                ..CgroupStats::default()
            }
        );
    }

    #[test]
    fn weights_convert_back_to_the_shares_runc_converted() {
        // runc: weight = 1 + ((shares - 2) * 9999) / 262142.
        for shares in [2u64, 1024, 262_144] {
            let weight = 1 + ((shares - 2) * 9999) / 262_142;
            let back = weight_to_shares(weight);
            assert!(
                back <= shares && shares - back < 27,
                "{shares} -> {weight} -> {back}"
            );
        }
    }
}
