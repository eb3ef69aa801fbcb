//! Resource usage for `/stats/summary` (upstream's summary API, what
//! `kubectl top` reads through metrics-server in older setups and what
//! eviction tools read) and `/metrics/resource` (the Prometheus text
//! metrics-server 0.8 scrapes): the node from `/proc` and `statvfs` (and
//! its pressure stall information from `/proc/pressure`, upstream's
//! `psi` fields), pods and containers from the runtime's cgroup readings,
//! containers' writable layers from the runtime (`rootfs`), pods'
//! emptyDirs on disk (`volume`), and a pod's network (`network`: CRI's
//! sandbox stats, or in-process one of its processes' `/proc/<pid>/net/dev`
//! when it has a network of its own).
//!
//! CPU rates (`usageNanoCores`) need two readings: each scrape keeps its
//! readings, and the next one divides by the time between (upstream's
//! cAdvisor keeps a housekeeping interval instead). `/metrics/resource`
//! carries only cumulative counters, as upstream's: the scraper computes
//! rates.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kinglet_runtime::podcgroup::Hierarchy;
use kinglet_runtime::{ContainerState, Runtime};

use crate::cadvisor::text::escape;
use crate::pods::StatusView;

/// Where a scrape reads from, and the previous readings for rates.
pub struct Sampler {
    pub node_name: String,
    pub runtime: Arc<dyn Runtime>,
    pub view: StatusView,
    /// The node's filesystem (kinglet's root dir) and the image store's.
    pub root_dir: PathBuf,
    pub image_dir: PathBuf,
    pub proc_dir: PathBuf,
    /// Where the unified hierarchy is mounted (pods' and containers' PSI).
    pub cgroup_root: PathBuf,
    /// The pods' cgroup under it (`kubepods`).
    pub pods_cgroup: String,
    pub started: jiff::Timestamp,
    last: Mutex<HashMap<String, (Instant, u64)>>,
}

/// One container's readings.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSample {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub name: String,
    /// Unix seconds.
    pub started_at: f64,
    pub cpu_nanos: u64,
    pub working_set: u64,
    /// The writable layer's bytes.
    pub rootfs: u64,
    /// Its cgroup's pressure stall information (cgroup v2).
    pub psi: Psi,
}

/// Pressure stall information by resource (`cpu`, `memory`, `io`), as
/// upstream's `PSIStats`.
pub type Psi = std::collections::BTreeMap<&'static str, serde_json::Value>;

/// One pod's cgroup readings.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub start_time: Option<String>,
    pub cpu_nanos: u64,
    pub working_set: u64,
    /// Its emptyDirs on disk: (name, bytes used, inodes used).
    pub volumes: Vec<(String, u64, u64)>,
    /// Its network's interfaces, when it has a network of its own.
    pub network: Vec<Interface>,
    /// Its cgroup's pressure stall information (cgroup v2).
    pub psi: Psi,
}

/// One network interface's counters.
pub type Interface = kinglet_runtime::InterfaceUsage;

/// The pod's interfaces as the summary API has them.
fn interfaces(devs: Vec<crate::cadvisor::NetDev>) -> Vec<Interface> {
    devs.into_iter()
        .map(|n| Interface {
            name: n.name,
            rx_bytes: n.rx_bytes,
            rx_errors: n.rx_errors,
            tx_bytes: n.tx_bytes,
            tx_errors: n.tx_errors,
        })
        .collect()
}

/// Containers' PSI by (pod UID, container name).
type ContainerPsi = HashMap<(String, String), Psi>;

/// The PSI files `path` names for each resource, parsed; a resource whose
/// file is missing (cgroup v1, a kernel without PSI) is left out.
fn read_psi(path: impl Fn(&str) -> PathBuf) -> Psi {
    ["cpu", "memory", "io"]
        .into_iter()
        .filter_map(|r| Some((r, parse_psi(&std::fs::read_to_string(path(r)).ok()?)?)))
        .collect()
}

/// A process's cgroup on the unified hierarchy, relative to its mount
/// (the `0::` line of `/proc/<pid>/cgroup`).
fn cgroup_of(proc_dir: &std::path::Path, pid: i32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(proc_dir.join(pid.to_string()).join("cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let rel = path.trim().trim_start_matches('/');
    // "/" alone is the root, never a container's.
    (!rel.is_empty() && !rel.split('/').any(|c| c == "..")).then(|| PathBuf::from(rel))
}

/// Pressure stall information of one resource (`/proc/pressure/<r>`), as
/// upstream's `PSIStats`: `some` and `full`, each with its stall total in
/// microseconds and its 10/60/300 s averages.
pub fn parse_psi(text: &str) -> Option<serde_json::Value> {
    let mut out = serde_json::Map::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let kind = it.next()?;
        let mut d = serde_json::Map::new();
        for kv in it {
            let (k, v) = kv.split_once('=')?;
            let v: serde_json::Value = match k {
                "total" => v.parse::<u64>().ok()?.into(),
                _ => v.parse::<f64>().ok()?.into(),
            };
            d.insert(k.to_string(), v);
        }
        out.insert(kind.to_string(), d.into());
    }
    (!out.is_empty()).then(|| out.into())
}

/// The node's readings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSample {
    pub cpu_nanos: u64,
    /// Logical CPUs (`/proc/stat`'s `cpuN` lines).
    pub cpus: u64,
    pub memory_capacity: u64,
    pub memory_usage: u64,
    pub working_set: u64,
    pub fs: Option<crate::node::host::FsStats>,
    pub image_fs: Option<crate::node::host::FsStats>,
    /// `cpu`, `memory`, `io` pressure, where the kernel has PSI.
    pub psi: Psi,
}

/// One scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub at: jiff::Timestamp,
    pub node: NodeSample,
    pub pods: Vec<PodSample>,
    pub containers: Vec<ContainerSample>,
    /// A runtime reading failed (upstream's `resource_scrape_error`).
    pub error: bool,
}

/// Busy CPU time in nanoseconds from `/proc/stat`'s `cpu` line (user,
/// nice, system, irq, softirq, steal; idle and iowait are not use), at
/// USER_HZ = 100 as on every Linux ABI kinglet builds for.
pub fn node_cpu_nanos(proc_stat: &str) -> u64 {
    let Some(line) = proc_stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    busy.saturating_mul(10_000_000)
}

/// The runtime's containers, each with its writable layer's bytes.
fn container_refs(
    listed: Vec<kinglet_runtime::ContainerStatus>,
    usage: Vec<kinglet_runtime::Usage>,
) -> Vec<crate::cadvisor::ContainerRef> {
    let layers: HashMap<String, u64> = usage
        .into_iter()
        .map(|u| (u.id, u.writable_layer_bytes))
        .collect();
    listed
        .into_iter()
        .map(|c| crate::cadvisor::ContainerRef {
            writable_layer: layers.get(&c.id).copied(),
            started_at: c.started_at as f64 / 1e9,
            id: c.id,
            pod_uid: c.pod_uid,
            name: c.name,
            image: c.image,
        })
        .collect()
}

/// The machine's part of a cAdvisor scrape: CPUs and memory from the
/// node's readings, the kernel, the writable layers' filesystem.
fn machine(proc_dir: &Path, image_dir: &Path, node: &NodeSample) -> crate::cadvisor::Machine {
    let read = |p: &str| std::fs::read_to_string(proc_dir.join(p)).unwrap_or_default();
    crate::cadvisor::Machine {
        cpu_cores: node.cpus,
        memory_bytes: node.memory_capacity,
        kernel: read("sys/kernel/osrelease").trim().to_string(),
        fs_device: crate::cadvisor::mount_source(&read("self/mountinfo"), image_dir)
            .unwrap_or_default(),
        fs_limit: node.image_fs.as_ref().map_or(0, |f| f.capacity_bytes),
        devices: crate::cadvisor::block_devices(Path::new("/sys")),
    }
}

/// The node's readings: `/proc` and `statvfs` of its two filesystems.
fn node_sample(proc_dir: &Path, root_dir: &Path, image_dir: &Path) -> NodeSample {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    let mem = crate::node::host::parse_meminfo(
        &std::fs::read_to_string(proc_dir.join("meminfo")).unwrap_or_default(),
    );
    let usage = mem.total.saturating_sub(mem.free);
    NodeSample {
        cpu_nanos: node_cpu_nanos(&stat),
        cpus: stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count() as u64,
        memory_capacity: mem.total,
        memory_usage: usage,
        working_set: usage.saturating_sub(mem.inactive_file),
        fs: crate::node::host::fs_stats(root_dir).ok(),
        image_fs: crate::node::host::fs_stats(image_dir).ok(),
        psi: read_psi(|r| proc_dir.join("pressure").join(r)),
    }
}

impl Sampler {
    pub fn new(
        node_name: String,
        runtime: Arc<dyn Runtime>,
        view: StatusView,
        root_dir: PathBuf,
        image_dir: PathBuf,
    ) -> Self {
        Sampler {
            node_name,
            runtime,
            view,
            root_dir,
            image_dir,
            proc_dir: PathBuf::from("/proc"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            pods_cgroup: "kubepods".into(),
            started: jiff::Timestamp::now(),
            last: Mutex::new(HashMap::new()),
        }
    }

    fn node(&self) -> NodeSample {
        node_sample(&self.proc_dir, &self.root_dir, &self.image_dir)
    }

    /// Reads everything once. The runtime calls are awaited; `/proc` and
    /// `statvfs` reads are small and local.
    pub async fn snapshot(&self) -> Snapshot {
        let mut error = false;
        let pods = self.view.pods();
        let pod_of = |uid: &str| {
            pods.iter().find(|(u, _)| u == uid).map(|(_, e)| {
                let m = &e.pod.metadata;
                let ns = m.namespace.clone().unwrap_or_else(|| "default".into());
                (
                    ns,
                    m.name.clone().unwrap_or_default(),
                    e.status.start_time.clone(),
                )
            })
        };
        // The three runtime calls at once: through CRI each is a round
        // trip to containerd (its stats calls take tens of milliseconds).
        let (listed, usage, sandboxes) = tokio::join!(
            self.runtime.list_containers(),
            self.runtime.container_stats(),
            self.runtime.pod_sandbox_stats(),
        );
        error |= listed.is_err() || usage.is_err() || sandboxes.is_err();
        let (listed, usage, sandboxes) = (
            listed.unwrap_or_default(),
            usage.unwrap_or_default(),
            sandboxes.unwrap_or_default(),
        );
        let containers = container_samples(&listed, &usage, &pod_of);
        let samples = pod_samples(&sandboxes, &pod_of);
        let (pods, psi) = self.pods_on_disk_and_net(samples, &pods, &listed).await;
        let mut containers = containers;
        for c in &mut containers {
            if let Some(p) = psi.get(&(c.pod_uid.clone(), c.name.clone())) {
                c.psi = p.clone();
            }
        }
        Snapshot {
            at: jiff::Timestamp::now(),
            node: self.node(),
            pods,
            containers,
            error,
        }
    }

    /// Fills each pod's volumes, network and PSI, and returns the running
    /// containers' PSI by (pod UID, name) ([`cgroup_psi`]): disk walks,
    /// `/proc` and cgroup reads, off the async thread.
    async fn pods_on_disk_and_net(
        &self,
        mut samples: Vec<PodSample>,
        pods: &[(String, crate::pods::PodEntry)],
        listed: &[kinglet_runtime::ContainerStatus],
    ) -> (Vec<PodSample>, ContainerPsi) {
        let (volume_root, proc_dir) = (self.root_dir.join("volumes"), self.proc_dir.clone());
        let (cgroup_root, pods_cgroup) = (self.cgroup_root.clone(), self.pods_cgroup.clone());
        let running: Vec<(String, String, String, i32)> = listed
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| (c.pod_uid.clone(), c.name.clone(), c.id.clone(), c.pid))
            .collect();
        let specs: HashMap<String, Arc<k8s_openapi::api::core::v1::Pod>> = pods
            .iter()
            .map(|(u, e)| (u.clone(), e.pod.clone()))
            .collect();
        let pids: HashMap<String, i32> = listed
            .iter()
            .filter(|c| c.state == ContainerState::Running && c.pid > 0)
            .map(|c| (c.pod_uid.clone(), c.pid))
            .collect();
        tokio::task::spawn_blocking(move || {
            let uids = samples.iter().map(|p| p.uid.clone()).collect();
            let (mut pod_psi, containers) =
                cgroup_psi(&cgroup_root, &pods_cgroup, &proc_dir, &uids, running);
            for p in &mut samples {
                p.psi = pod_psi.remove(&p.uid).unwrap_or_default();
                let Some(spec) = specs.get(&p.uid) else {
                    continue;
                };
                p.volumes = empty_dir_usage(spec, &p.uid, &volume_root);
                let own_net = spec
                    .spec
                    .as_ref()
                    .is_none_or(|s| s.host_network != Some(true));
                if let (true, Some(pid)) = (own_net, pids.get(&p.uid)) {
                    p.network = interfaces(
                        crate::cadvisor::own_network(&proc_dir, *pid).unwrap_or_default(),
                    );
                }
            }
            (samples, containers)
        })
        .await
        .unwrap_or_default()
    }

    /// `/metrics/cadvisor` ([`crate::cadvisor`]): the node's pods and
    /// containers from the runtime and the status view, their cgroups read
    /// off the async thread.
    pub async fn cadvisor(&self) -> String {
        let (listed, usage) = tokio::join!(
            self.runtime.list_containers(),
            self.runtime.container_stats(),
        );
        let error = listed.is_err() || usage.is_err();
        let containers = container_refs(listed.unwrap_or_default(), usage.unwrap_or_default());
        let inputs = crate::cadvisor::Inputs {
            cgroup_root: self.cgroup_root.clone(),
            proc_dir: self.proc_dir.clone(),
            pods_cgroup: self.pods_cgroup.clone(),
            pods: self.pod_refs(),
            containers,
            ..Default::default()
        };
        let (root_dir, image_dir) = (self.root_dir.clone(), self.image_dir.clone());
        tokio::task::spawn_blocking(move || {
            let node = node_sample(&inputs.proc_dir, &root_dir, &image_dir);
            let inputs = crate::cadvisor::Inputs {
                node_cpu_nanos: node.cpu_nanos,
                node_memory: (node.memory_usage, node.working_set),
                ..inputs
            };
            crate::cadvisor::text::render(&crate::cadvisor::Scrape {
                at: jiff::Timestamp::now(),
                series: crate::cadvisor::collect(&inputs),
                machine: machine(&inputs.proc_dir, &image_dir, &node),
                error,
            })
        })
        .await
        .unwrap_or_default()
    }

    /// The pods of the status view, as a cAdvisor scrape labels them.
    fn pod_refs(&self) -> Vec<crate::cadvisor::PodRef> {
        self.view
            .pods()
            .into_iter()
            .map(|(uid, e)| {
                let (namespace, name) = crate::pods::util::namespace_and_name(&e.pod);
                crate::cadvisor::PodRef {
                    namespace,
                    name,
                    cgroup: crate::cm::qos::cgroup_parent(&e.pod, &self.pods_cgroup),
                    start_time: e
                        .status
                        .start_time
                        .as_ref()
                        .map_or(0.0, |t| t.0.as_second() as f64),
                    own_network: e
                        .pod
                        .spec
                        .as_ref()
                        .is_none_or(|s| s.host_network != Some(true)),
                    uid,
                }
            })
            .collect()
    }

    /// The pods' cgroup, as configured (`kubepods` by default).
    pub fn with_pods_cgroup(mut self, pods_cgroup: String) -> Self {
        self.pods_cgroup = pods_cgroup;
        self
    }

    /// The CPU rate since this key's previous reading, in nanocores.
    fn rate(&self, key: &str, nanos: u64, now: Instant) -> u64 {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let r = match last.get(key) {
            Some((t, n)) if now > *t && nanos >= *n => {
                let dt = now.duration_since(*t).as_secs_f64();
                ((nanos - n) as f64 / dt) as u64
            }
            _ => 0,
        };
        last.insert(key.to_string(), (now, nanos));
        r
    }

    /// The summary API's JSON (`statsapi.Summary`), the fields kinglet
    /// measures.
    pub fn summary(&self, s: &Snapshot) -> serde_json::Value {
        let w = SummaryWriter {
            sampler: self,
            time: s.at.to_string(),
            now: Instant::now(),
            snapshot: s,
        };
        let n = &s.node;
        let avail = n.memory_capacity.saturating_sub(n.working_set);
        let mut node = serde_json::json!({
            "nodeName": self.node_name,
            "startTime": self.started.to_string(),
            "cpu": w.cpu("node", n.cpu_nanos),
            "memory": w.mem(n.working_set, n.memory_usage, Some(avail)),
            "fs": w.fs(n.fs.as_ref()),
            "runtime": {"imageFs": w.fs(n.image_fs.as_ref())},
        });
        add_psi(&mut node, &n.psi, &w.time);
        let pods: Vec<serde_json::Value> = s.pods.iter().map(|p| w.pod(p)).collect();
        serde_json::json!({"node": node, "pods": pods})
    }
}

/// One snapshot's summary as JSON: the time stamp and the CPU rates every
/// entry shares.
struct SummaryWriter<'a> {
    sampler: &'a Sampler,
    snapshot: &'a Snapshot,
    time: String,
    now: Instant,
}

impl SummaryWriter<'_> {
    fn cpu(&self, key: &str, nanos: u64) -> serde_json::Value {
        let rate = self.sampler.rate(key, nanos, self.now);
        serde_json::json!({"time": self.time, "usageNanoCores": rate, "usageCoreNanoSeconds": nanos})
    }

    fn mem(&self, ws: u64, usage: u64, avail: Option<u64>) -> serde_json::Value {
        let mut m =
            serde_json::json!({"time": self.time, "usageBytes": usage, "workingSetBytes": ws});
        if let Some(a) = avail {
            m["availableBytes"] = a.into();
        }
        m
    }

    fn fs(&self, f: Option<&crate::node::host::FsStats>) -> Option<serde_json::Value> {
        f.map(|f| {
            serde_json::json!({
                "time": self.time,
                "availableBytes": f.available_bytes,
                "capacityBytes": f.capacity_bytes,
                "usedBytes": f.capacity_bytes.saturating_sub(f.available_bytes),
                "inodesFree": f.inodes_free,
                "inodes": f.inodes,
                "inodesUsed": f.inodes.saturating_sub(f.inodes_free),
            })
        })
    }

    fn container(&self, p: &PodSample, c: &ContainerSample) -> serde_json::Value {
        let image_fs = self.snapshot.node.image_fs.as_ref();
        let started = jiff::Timestamp::from_second(c.started_at as i64)
            .map(|t| t.to_string())
            .unwrap_or_default();
        let mut v = serde_json::json!({
            "name": c.name,
            "startTime": started,
            "cpu": self.cpu(&format!("{}/{}", p.uid, c.name), c.cpu_nanos),
            "memory": self.mem(c.working_set, c.working_set, None),
            "rootfs": {
                "time": self.time,
                "usedBytes": c.rootfs,
                "capacityBytes": image_fs.map(|f| f.capacity_bytes),
                "availableBytes": image_fs.map(|f| f.available_bytes),
            },
        });
        add_psi(&mut v, &c.psi, &self.time);
        v
    }

    fn pod(&self, p: &PodSample) -> serde_json::Value {
        let containers: Vec<serde_json::Value> = self
            .snapshot
            .containers
            .iter()
            .filter(|c| c.pod_uid == p.uid)
            .map(|c| self.container(p, c))
            .collect();
        let fs = self.snapshot.node.fs.as_ref();
        let volume: Vec<serde_json::Value> = p
            .volumes
            .iter()
            .map(|(name, used, inodes)| {
                serde_json::json!({
                    "time": self.time, "name": name, "usedBytes": used, "inodesUsed": inodes,
                    "capacityBytes": fs.map(|f| f.capacity_bytes),
                    "availableBytes": fs.map(|f| f.available_bytes),
                    "inodes": fs.map(|f| f.inodes),
                    "inodesFree": fs.map(|f| f.inodes_free),
                })
            })
            .collect();
        let mut pod = serde_json::json!({
            "podRef": {"name": p.pod, "namespace": p.namespace, "uid": p.uid},
            "startTime": p.start_time,
            "containers": containers,
            "cpu": self.cpu(&p.uid, p.cpu_nanos),
            "memory": self.mem(p.working_set, p.working_set, None),
            "volume": volume,
        });
        add_psi(&mut pod, &p.psi, &self.time);
        if let Some(net) = self.network(p) {
            pod["network"] = net;
        }
        pod
    }

    /// The pod's network: `eth0` (else its first interface) at the top,
    /// every interface listed.
    fn network(&self, p: &PodSample) -> Option<serde_json::Value> {
        let first = p
            .network
            .iter()
            .find(|i| i.name == "eth0")
            .or(p.network.first())?;
        let iface = |i: &Interface| {
            serde_json::json!({
                "name": i.name, "rxBytes": i.rx_bytes, "rxErrors": i.rx_errors,
                "txBytes": i.tx_bytes, "txErrors": i.tx_errors,
            })
        };
        let mut net = iface(first);
        net["time"] = self.time.clone().into();
        net["interfaces"] = p.network.iter().map(iface).collect();
        Some(net)
    }
}

/// The PSI of the pods `uids` and of the `running` containers (pod UID,
/// name, ID, PID), on the unified hierarchy only (v1 has no pressure
/// files there). A pod's cgroup is where kinglet made it
/// (`<pods cgroup>/<qos>/pod<uid>`); a container's is found from its
/// process (`/proc/<pid>/cgroup`), or, where the runtime tells no PID
/// (CRI), is the pod's child named by the container ID, as containerd and
/// the in-process runtime both make it.
fn cgroup_psi(
    cgroup_root: &std::path::Path,
    pods_cgroup: &str,
    proc_dir: &std::path::Path,
    uids: &std::collections::BTreeSet<String>,
    running: Vec<(String, String, String, i32)>,
) -> (HashMap<String, Psi>, ContainerPsi) {
    if Hierarchy::detect(cgroup_root) == Hierarchy::V1 {
        return Default::default();
    }
    let pod_dirs: HashMap<String, PathBuf> =
        crate::cm::pod_cgroups::of(cgroup_root, pods_cgroup, uids)
            .into_iter()
            .collect();
    let mut containers = ContainerPsi::new();
    for (uid, name, id, pid) in running {
        let dir = match cgroup_of(proc_dir, pid).filter(|_| pid > 0) {
            Some(rel) => cgroup_root.join(rel),
            None => match pod_dirs.get(&uid) {
                Some(pod) if !id.is_empty() && !id.contains('/') => pod.join(&id),
                _ => continue,
            },
        };
        containers.insert((uid, name), read_psi(|r| dir.join(format!("{r}.pressure"))));
    }
    let pods = pod_dirs
        .into_iter()
        .map(|(uid, dir)| (uid, read_psi(|r| dir.join(format!("{r}.pressure")))))
        .collect();
    (pods, containers)
}

/// Upstream's PSI fields (KubeletPSI, GA in 1.36) on a node, pod or
/// container: `cpu.psi`, `memory.psi`, `io.psi`.
fn add_psi(v: &mut serde_json::Value, psi: &Psi, time: &str) {
    for (r, p) in psi {
        if *r == "io" {
            v["io"] = serde_json::json!({"time": time, "psi": p});
        } else {
            v[*r]["psi"] = p.clone();
        }
    }
}

/// The pod's emptyDirs on disk (eviction's own list of them), each walked
/// once: name, bytes and inodes used.
fn empty_dir_usage(
    pod: &k8s_openapi::api::core::v1::Pod,
    uid: &str,
    volumes: &std::path::Path,
) -> Vec<(String, u64, u64)> {
    crate::eviction::storage::empty_dirs(pod, uid, volumes)
        .into_iter()
        .map(|(name, dir, _)| {
            let u = kinglet_runtime::disk::usage(&dir);
            (name, u.bytes, u.inodes)
        })
        .collect()
}

/// A pod's namespace, name and start time, by UID.
type PodOf<'a> = dyn Fn(&str) -> Option<(String, String, Option<Time>)> + 'a;

/// The running containers of known pods with their usage.
fn container_samples(
    listed: &[kinglet_runtime::ContainerStatus],
    usage: &[kinglet_runtime::Usage],
    pod_of: &PodOf<'_>,
) -> Vec<ContainerSample> {
    let mut containers = Vec::new();
    for u in usage {
        let Some(c) = listed.iter().find(|c| c.id == u.id) else {
            continue;
        };
        let Some((ns, pod, _)) = pod_of(&c.pod_uid) else {
            continue;
        };
        if c.state != ContainerState::Running {
            continue;
        }
        containers.push(ContainerSample {
            namespace: ns,
            pod,
            pod_uid: c.pod_uid.clone(),
            name: c.name.clone(),
            started_at: c.started_at as f64 / 1e9,
            cpu_nanos: u.cpu_usage_core_nanos,
            working_set: u.memory_working_set_bytes,
            rootfs: u.writable_layer_bytes,
            psi: Psi::new(),
        });
    }
    containers
}

/// The sandboxes of known pods with their usage; volumes, and the network
/// and PSI in-process, are filled in later.
fn pod_samples(sandboxes: &[kinglet_runtime::Usage], pod_of: &PodOf<'_>) -> Vec<PodSample> {
    sandboxes
        .iter()
        .filter_map(|s| {
            let (ns, pod, start) = pod_of(&s.pod_uid)?;
            Some(PodSample {
                namespace: ns,
                pod,
                uid: s.pod_uid.clone(),
                start_time: start.map(|t| t.0.to_string()),
                cpu_nanos: s.cpu_usage_core_nanos,
                working_set: s.memory_working_set_bytes,
                volumes: Vec::new(),
                // What the runtime tells (CRI); in-process, read below.
                network: s.network.clone(),
                psi: Psi::new(),
            })
        })
        .collect()
}

/// `/metrics/resource` in upstream's names and help (the STABLE resource
/// metrics), each sample stamped with the scrape's time in milliseconds as
/// upstream's collector does. Written by hand: the timestamps are part of
/// the contract and prometheus-client has no per-sample timestamp.
pub fn resource_metrics(s: &Snapshot) -> String {
    type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> f64);
    let secs = |n: u64| n as f64 / 1e9;
    const CONTAINERS: [Family<ContainerSample>; 3] = [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the container in core-seconds",
            |c| c.cpu_nanos as f64 / 1e9,
        ),
        (
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set of the container in bytes",
            |c| c.working_set as f64,
        ),
        (
            "container_start_time_seconds",
            "gauge",
            "Start time of the container since unix epoch in seconds",
            |c| c.started_at,
        ),
    ];
    const PODS: [Family<PodSample>; 2] = [
        (
            "pod_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the pod in core-seconds",
            |p| p.cpu_nanos as f64 / 1e9,
        ),
        (
            "pod_memory_working_set_bytes",
            "gauge",
            "Current working set of the pod in bytes",
            |p| p.working_set as f64,
        ),
    ];
    let ms = s.at.as_millisecond();
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v} {ms}");
        }
    };
    for (name, kind, help, value) in CONTAINERS {
        let samples = s.containers.iter().map(|c| (container_labels(c), value(c)));
        family(name, kind, help, samples.collect());
    }
    let node = [
        (
            "node_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the node in core-seconds",
            secs(s.node.cpu_nanos),
        ),
        (
            "node_memory_working_set_bytes",
            "gauge",
            "Current working set of the node in bytes",
            s.node.working_set as f64,
        ),
    ];
    for (name, kind, help, value) in node {
        family(name, kind, help, vec![(String::new(), value)]);
    }
    for (name, kind, help, value) in PODS {
        let samples = s.pods.iter().map(|p| (pod_labels(p), value(p)));
        family(name, kind, help, samples.collect());
    }
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
    let _ = writeln!(out, "resource_scrape_error {}", u8::from(s.error));
    out
}

fn container_labels(c: &ContainerSample) -> String {
    labels(&[
        ("container", &c.name),
        ("namespace", &c.namespace),
        ("pod", &c.pod),
    ])
}

fn pod_labels(p: &PodSample) -> String {
    labels(&[("namespace", &p.namespace), ("pod", &p.pod)])
}

/// `{k="v",…}`, the values escaped.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_cpu_counts_busy_time_only() {
        let stat = "cpu  100 5 50 9000 30 1 2 3 0 0\ncpu0 1 2 3 4\n";
        // user+nice+system+irq+softirq+steal = 161 ticks of 10 ms.
        assert_eq!(node_cpu_nanos(stat), 161 * 10_000_000);
        assert_eq!(node_cpu_nanos("garbage"), 0);
    }

    #[test]
    fn psi_and_net_dev_as_the_kernel_writes_them() {
        let psi = "some avg10=1.50 avg60=0.20 avg300=0.00 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=42\n";
        let v = parse_psi(psi).unwrap();
        assert_eq!(v["some"]["total"], 123456);
        assert_eq!(v["some"]["avg10"], 1.5);
        assert_eq!(v["full"]["total"], 42);
        assert_eq!(parse_psi(""), None);
        assert_eq!(parse_psi("some avg10=x"), None);
        let dev = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 2000 20 3 0 0 0 0 0 4000 40 5 0 0 0 0 0\n";
        let i = interfaces(crate::cadvisor::parse_net_dev(dev));
        assert_eq!(
            i,
            [Interface {
                name: "eth0".into(),
                rx_bytes: 2000,
                rx_errors: 3,
                tx_bytes: 4000,
                tx_errors: 5
            }]
        );
    }

    #[test]
    fn resource_metrics_use_upstreams_names_labels_and_timestamps() {
        let s = Snapshot {
            at: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
            node: NodeSample {
                cpu_nanos: 2_500_000_000,
                working_set: 1024,
                ..Default::default()
            },
            pods: vec![PodSample {
                namespace: "ns".into(),
                pod: "p".into(),
                uid: "u".into(),
                start_time: None,
                cpu_nanos: 1_000_000_000,
                working_set: 77,
                volumes: Vec::new(),
                network: Vec::new(),
                psi: Psi::new(),
            }],
            containers: vec![ContainerSample {
                namespace: "ns".into(),
                pod: "p".into(),
                pod_uid: "u".into(),
                name: "c\"x".into(),
                started_at: 1_699_999_000.0,
                cpu_nanos: 500_000_000,
                working_set: 42,
                rootfs: 0,
                psi: Psi::new(),
            }],
            error: false,
        };
        let text = resource_metrics(&s);
        for want in [
            "# TYPE container_cpu_usage_seconds_total counter",
            "container_cpu_usage_seconds_total{container=\"c\\\"x\",namespace=\"ns\",pod=\"p\"} 0.5 1700000000000",
            "container_memory_working_set_bytes{container=\"c\\\"x\",namespace=\"ns\",pod=\"p\"} 42 1700000000000",
            "node_cpu_usage_seconds_total 2.5 1700000000000",
            "node_memory_working_set_bytes 1024 1700000000000",
            "pod_memory_working_set_bytes{namespace=\"ns\",pod=\"p\"} 77 1700000000000",
            "resource_scrape_error 0",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }

    #[test]
    fn container_and_pod_psi_come_from_the_process_cgroup() {
        let d = tempfile::tempdir().unwrap();
        let (proc, cg) = (d.path().join("proc"), d.path().join("cgroup"));
        std::fs::create_dir_all(proc.join("7")).unwrap();
        std::fs::write(proc.join("7/cgroup"), "0::/kubepods/burstable/podu/c1\n").unwrap();
        std::fs::create_dir_all(proc.join("8")).unwrap();
        std::fs::write(proc.join("8/cgroup"), "0::/\n").unwrap();
        std::fs::create_dir_all(proc.join("9")).unwrap();
        std::fs::write(proc.join("9/cgroup"), "0::/../../etc\n").unwrap();
        let dir = cg.join("kubepods/burstable/podu/c1");
        std::fs::create_dir_all(&dir).unwrap();
        let text = "some avg10=0.50 avg60=0.00 avg300=0.00 total=9\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=3\n";
        std::fs::write(dir.join("memory.pressure"), text).unwrap();
        std::fs::write(dir.join("io.pressure"), text).unwrap();
        std::fs::write(dir.parent().unwrap().join("cpu.pressure"), text).unwrap();

        let rel = cgroup_of(&proc, 7).unwrap();
        assert_eq!(rel, PathBuf::from("kubepods/burstable/podu/c1"));
        assert_eq!(cgroup_of(&proc, 8), None, "the root is no container's");
        assert_eq!(cgroup_of(&proc, 9), None, "a path out of the mount");
        assert_eq!(cgroup_of(&proc, 10), None);
        let c = read_psi(|r| cg.join(&rel).join(format!("{r}.pressure")));
        assert_eq!(c.keys().copied().collect::<Vec<_>>(), ["io", "memory"]);
        let p = read_psi(|r| {
            cg.join(&rel)
                .parent()
                .unwrap()
                .join(format!("{r}.pressure"))
        });
        assert_eq!(p.keys().copied().collect::<Vec<_>>(), ["cpu"]);

        let mut v = serde_json::json!({"memory": {"usageBytes": 1}});
        add_psi(&mut v, &c, "t");
        assert_eq!(v["memory"]["psi"]["some"]["total"], 9);
        assert_eq!(v["memory"]["usageBytes"], 1);
        assert_eq!(v["io"]["psi"]["full"]["total"], 3);
        assert_eq!(v["io"]["time"], "t");
    }

    #[test]
    fn psi_of_pods_and_containers_with_and_without_a_pid() {
        let d = tempfile::tempdir().unwrap();
        let (proc, cg) = (d.path().join("proc"), d.path().join("cgroup"));
        let text = "some avg10=0.00 avg60=0.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1\n";
        let pod = cg.join("kubepods/besteffort/podu");
        for dir in [pod.join("cid"), pod.join("other")] {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("memory.pressure"), text).unwrap();
        }
        std::fs::write(pod.join("cpu.pressure"), text).unwrap();
        std::fs::create_dir_all(proc.join("7")).unwrap();
        std::fs::write(
            proc.join("7/cgroup"),
            "0::/kubepods/besteffort/podu/other\n",
        )
        .unwrap();
        let uids = ["u".to_string()].into();
        let running = vec![
            // CRI: no PID, the container ID names its cgroup.
            ("u".into(), "a".into(), "cid".into(), 0),
            // In-process: found from the process.
            ("u".into(), "b".into(), "ignored".into(), 7),
        ];
        // Not the unified hierarchy: nothing.
        let (pods, ctrs) = cgroup_psi(&cg, "kubepods", &proc, &uids, running.clone());
        assert!(pods.is_empty() && ctrs.is_empty());
        std::fs::write(cg.join("cgroup.controllers"), "memory cpu io\n").unwrap();
        let (pods, ctrs) = cgroup_psi(&cg, "kubepods", &proc, &uids, running);
        assert_eq!(pods["u"].keys().copied().collect::<Vec<_>>(), ["cpu"]);
        let key = |n: &str| ("u".to_string(), n.to_string());
        assert_eq!(ctrs[&key("a")]["memory"]["some"]["total"], 5);
        assert_eq!(ctrs[&key("b")]["memory"]["full"]["total"], 1);
    }
}
