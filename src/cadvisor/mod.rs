//! What upstream's kubelet serves at `/metrics/cadvisor` through its
//! embedded cAdvisor: the readings of the cgroups the node's pods run in,
//! by cgroup (`id`), labelled with the pod and container they belong to,
//! in cAdvisor's metric names (`container_cpu_usage_seconds_total`,
//! `container_memory_working_set_bytes`, `container_network_*`,
//! `container_fs_*`, ...) so that Prometheus' kubelet scrape jobs and the
//! dashboards built on them see a kinglet node as they see any other.
//!
//! This module owns choosing the cgroups and labelling them ([`collect`]);
//! [`text`] writes the exposition. The readings themselves are
//! `kinglet_runtime::cgstats` (the same reader the in-process runtime's
//! stats use). The series, as the kubelet's cAdvisor has them with the
//! cgroupfs driver:
//! - `/`, the pods' cgroup (`/kubepods`) and its QoS levels: `id` only;
//! - each pod's cgroup (`/kubepods/burstable/pod<uid>`): `pod` and
//!   `namespace`, its network (the pod's interfaces);
//! - each container's (`…/pod<uid>/<container id>`): also `container`,
//!   `image` and `name` (the container ID), its writable layer as
//!   `container_fs_usage_bytes`.
//!
//! Differences from upstream, on purpose: the readings are taken at the
//! scrape (cAdvisor's come from a housekeeping loop every 10–15 s, and are
//! stamped with its time), so samples carry no timestamps; a CRI sandbox's
//! own cgroup (the pause container) is not a series of its own; the
//! `container_cpu_load_average_10s`, per-CPU and TCP/UDP state families
//! (off in the kubelet's cAdvisor too, or needing netlink) are not served.

pub mod text;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kinglet_runtime::cgstats::CgroupStats;
use kinglet_runtime::podcgroup::Hierarchy;

/// One cgroup's series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// The cgroup's path from the hierarchy's root, `/` first.
    pub id: String,
    pub container: String,
    pub image: String,
    /// The container ID (cAdvisor's `name`).
    pub name: String,
    pub namespace: String,
    pub pod: String,
    /// Unix seconds; 0 when not known.
    pub start_time: f64,
    pub stats: CgroupStats,
    /// Processes, open file descriptors and sockets of the cgroup's
    /// subtree; `None` where not counted (the root).
    pub processes: Option<Processes>,
    pub network: Vec<NetDev>,
    /// A container's writable layer, bytes.
    pub fs_usage: Option<u64>,
}

/// Counts over a cgroup's processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Processes {
    pub count: u64,
    pub fds: u64,
    pub sockets: u64,
}

/// One interface of `/proc/<pid>/net/dev`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetDev {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// The interfaces of a `/proc/<pid>/net/dev`, loopback left out (as
/// cAdvisor leaves it out).
pub fn parse_net_dev(text: &str) -> Vec<NetDev> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            let name = name.trim();
            (name != "lo" && f.len() >= 12).then(|| NetDev {
                name: name.to_string(),
                rx_bytes: f[0],
                rx_packets: f[1],
                rx_errors: f[2],
                rx_dropped: f[3],
                tx_bytes: f[8],
                tx_packets: f[9],
                tx_errors: f[10],
                tx_dropped: f[11],
            })
        })
        .collect()
}

/// The machine's part of a scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Machine {
    pub cpu_cores: u64,
    /// The kernel's release (`cadvisor_version_info`'s `kernelVersion`).
    pub kernel: String,
    pub memory_bytes: u64,
    /// The filesystem the writable layers live on: its device and size.
    pub fs_device: String,
    pub fs_limit: u64,
    /// Block device names (`/dev/vda`) by (major, minor).
    pub devices: HashMap<(u32, u32), String>,
}

/// One scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    pub at: jiff::Timestamp,
    pub machine: Machine,
    pub series: Vec<Series>,
    /// A runtime call failed (`container_scrape_error`).
    pub error: bool,
}

/// A pod of this node, as a scrape needs it.
#[derive(Clone, Debug, Default)]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Its cgroup, relative (`kubepods/burstable/pod<uid>`).
    pub cgroup: String,
    pub start_time: f64,
    /// Whether it has a network of its own (not `hostNetwork`).
    pub own_network: bool,
}

/// A container of this node, as a scrape needs it.
#[derive(Clone, Debug, Default)]
pub struct ContainerRef {
    pub id: String,
    pub pod_uid: String,
    pub name: String,
    pub image: String,
    pub started_at: f64,
    pub writable_layer: Option<u64>,
}

/// Where a scrape reads, and what the agent knows of its pods.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub cgroup_root: PathBuf,
    pub proc_dir: PathBuf,
    /// The pods' cgroup, relative (`kubepods`).
    pub pods_cgroup: String,
    pub pods: Vec<PodRef>,
    pub containers: Vec<ContainerRef>,
    /// The node's CPU time and memory (usage, working set), for `/`: on
    /// cgroup v2 the root has no `memory.current`.
    pub node_cpu_nanos: u64,
    pub node_memory: (u64, u64),
}

/// Reads every series. Blocking (cgroup and `/proc` files): run it off
/// the async threads.
pub fn collect(inp: &Inputs) -> Vec<Series> {
    let h = Hierarchy::detect(&inp.cgroup_root);
    let mut out = vec![root_series(inp, h)];
    let pods_cgroup = inp.pods_cgroup.trim_matches('/');
    for rel in [
        pods_cgroup.to_string(),
        format!("{pods_cgroup}/burstable"),
        format!("{pods_cgroup}/besteffort"),
    ] {
        if CgroupStats::exists(&inp.cgroup_root, h, &rel) {
            out.push(Series {
                id: format!("/{rel}"),
                stats: CgroupStats::read(&inp.cgroup_root, h, &rel),
                ..Series::default()
            });
        }
    }
    for pod in &inp.pods {
        out.extend(pod_series(inp, h, pod));
    }
    out
}

fn root_series(inp: &Inputs, h: Hierarchy) -> Series {
    let mut stats = CgroupStats::read(&inp.cgroup_root, h, "");
    stats.cpu.usage_ns = inp.node_cpu_nanos;
    (stats.memory.usage, stats.memory.working_set) = inp.node_memory;
    stats.tasks.procs.clear();
    Series {
        id: "/".into(),
        stats,
        ..Series::default()
    }
}

/// The pod's series, then its containers'; none when its cgroup is gone.
fn pod_series(inp: &Inputs, h: Hierarchy, pod: &PodRef) -> Vec<Series> {
    let rel = pod.cgroup.trim_matches('/');
    if !CgroupStats::exists(&inp.cgroup_root, h, rel) {
        return Vec::new();
    }
    let base = Series {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        ..Series::default()
    };
    let mut out = Vec::new();
    for c in inp.containers.iter().filter(|c| c.pod_uid == pod.uid) {
        let crel = format!("{rel}/{}", c.id);
        if !CgroupStats::exists(&inp.cgroup_root, h, &crel) {
            continue;
        }
        let stats = CgroupStats::read(&inp.cgroup_root, h, &crel);
        out.push(Series {
            id: format!("/{crel}"),
            container: c.name.clone(),
            image: c.image.clone(),
            name: c.id.clone(),
            start_time: c.started_at,
            processes: Some(count_processes(&inp.proc_dir, &stats.tasks.procs)),
            fs_usage: c.writable_layer,
            stats,
            ..base.clone()
        });
    }
    let stats = CgroupStats::read(&inp.cgroup_root, h, rel);
    // The pod's processes: its own and those of every child (its
    // containers, and a CRI sandbox's pause process).
    let mut all_pids = stats.tasks.procs.clone();
    all_pids.extend(children_procs(&inp.cgroup_root, h, rel));
    all_pids.sort_unstable();
    all_pids.dedup();
    // The first process whose namespace can be read (one may have ended).
    let network = match pod.own_network {
        true => all_pids
            .iter()
            .find_map(|&pid| own_network(&inp.proc_dir, pid)),
        false => None,
    };
    let pod_series = Series {
        id: format!("/{rel}"),
        start_time: pod.start_time,
        processes: Some(count_processes(&inp.proc_dir, &all_pids)),
        network: network.unwrap_or_default(),
        stats,
        ..base
    };
    out.insert(0, pod_series);
    out
}

/// The processes of the cgroup's children (one level: containers do not
/// nest cgroups).
fn children_procs(root: &Path, h: Hierarchy, rel: &str) -> Vec<i32> {
    let dir = match h {
        Hierarchy::V2 => root.join(rel),
        Hierarchy::V1 => root.join("memory").join(rel),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .flat_map(|e| {
            let text = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
            kinglet_runtime::cgstats::procs(&text)
        })
        .collect()
}

/// The interfaces of `pid`'s network namespace: none when it is the
/// host's (a pod without CNI shares the host's: its counters are not the
/// pod's); `None` when the process is gone.
pub fn own_network(proc_dir: &Path, pid: i32) -> Option<Vec<NetDev>> {
    let proc = proc_dir.join(pid.to_string());
    let ns = |p: &Path| std::fs::read_link(p.join("ns/net")).ok();
    let own = ns(&proc)?;
    if Some(&own) == ns(&proc_dir.join("self")).as_ref() {
        return Some(Vec::new());
    }
    let dev = std::fs::read_to_string(proc.join("net/dev")).ok()?;
    Some(parse_net_dev(&dev))
}

/// Processes, and their open descriptors and sockets (`/proc/<pid>/fd`).
fn count_processes(proc_dir: &Path, pids: &[i32]) -> Processes {
    let mut p = Processes {
        count: pids.len() as u64,
        ..Processes::default()
    };
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(proc_dir.join(pid.to_string()).join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            p.fds += 1;
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            if target.to_string_lossy().starts_with("socket:") {
                p.sockets += 1;
            }
        }
    }
    p
}

/// Block device names by (major, minor), from `/sys/dev/block/*/uevent`.
pub fn block_devices(sys_dir: &Path) -> HashMap<(u32, u32), String> {
    let Ok(entries) = std::fs::read_dir(sys_dir.join("dev/block")) else {
        return HashMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let (maj, min) = name.to_str()?.split_once(':')?;
            let uevent = std::fs::read_to_string(e.path().join("uevent")).ok()?;
            let dev = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
            Some((
                (maj.parse().ok()?, min.parse().ok()?),
                format!("/dev/{dev}"),
            ))
        })
        .collect()
}

/// The source of the mount `path` is on (`/proc/self/mountinfo`: the
/// longest mount point that contains it), as cAdvisor names a
/// filesystem's `device`.
pub fn mount_source(mountinfo: &str, path: &Path) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            let source = right.split_whitespace().nth(1)?;
            path.starts_with(point)
                .then(|| (point.len(), source.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, s)| s)
}

#[cfg(test)]
mod tests;
