//! The node's status as the kubelet reports it: capacity and allocatable,
//! nodeInfo, addresses and the four conditions (`Ready`, `MemoryPressure`,
//! `DiskPressure`, `PIDPressure`) with upstream's reasons and messages.
//!
//! Pure computation: the agent feeds in readings, this module turns them into
//! a `NodeStatus` and remembers when each condition last changed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kinglet_runtime::{ConditionKind, RuntimeError, RuntimeStatus};

use super::host::{FsStats, MachineInfo, MemInfo};
use crate::config::{EvictionThresholds, ThresholdValue, parse_quantity};

/// Everything the status is computed from, read fresh each round.
#[derive(Debug)]
pub struct Readings {
    pub memory: MemInfo,
    /// The filesystem of the root dir; `None` if it could not be read.
    pub nodefs: Option<FsStats>,
    /// (pid_max, pids in use).
    pub pids: (u64, u64),
    pub runtime: Result<RuntimeStatus, RuntimeError>,
    /// `nodeInfo.containerRuntimeVersion`, once the runtime answered.
    pub runtime_version: String,
    /// The device manager's resources: name → (capacity, allocatable).
    pub devices: BTreeMap<String, (i64, i64)>,
}

/// Node settings that shape the status but never change while running.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    pub machine: MachineInfo,
    pub max_pods: i32,
    pub kubelet_version: String,
    pub kubelet_port: i32,
    /// `status.declaredFeatures`: what the apiserver may rely on, e.g.
    /// `ExtendWebSocketsToKubelet` (exec and attach WebSockets proxied to
    /// the kubelet as they are, not translated to SPDY).
    pub declared_features: Vec<String>,
    pub addresses: Vec<(String, String)>,
    pub thresholds: EvictionThresholds,
    pub reserved: BTreeMap<String, u64>,
    pub pressure_transition: Duration,
    /// The eviction manager's conditions, when it runs: then they are the
    /// node's (upstream's status setter asks the eviction manager too),
    /// else the status measures its own readings.
    pub pressure: Option<std::sync::Arc<crate::eviction::Pressure>>,
}

const MEMORY_SIGNALS: &[&str] = &["memory.available", "allocatableMemory.available"];
const DISK_SIGNALS: &[&str] = &[
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
];
const PID_SIGNALS: &[&str] = &["pid.available"];

/// Computes node status rounds, keeping condition transition times and the
/// pressure hold-down between them.
#[derive(Debug)]
pub struct StatusBuilder {
    cfg: StatusConfig,
    /// type → (status, reason, last transition).
    last: BTreeMap<&'static str, (String, Time)>,
    /// When each pressure kind was last observed, for the transition period.
    pressure_seen: BTreeMap<&'static str, Instant>,
    /// The last `<runtime>://<version>` the runtime gave: kept while it is
    /// down, as upstream keeps nodeInfo.
    runtime_version: String,
}

fn ki(bytes: u64) -> Quantity {
    Quantity(format!("{}Ki", bytes / 1024))
}

impl StatusBuilder {
    pub fn new(cfg: StatusConfig) -> Self {
        StatusBuilder {
            cfg,
            last: BTreeMap::new(),
            pressure_seen: BTreeMap::new(),
            runtime_version: String::new(),
        }
    }

    /// Capacity and allocatable. Allocatable memory and storage leave room for
    /// reservations and the hard eviction threshold, as upstream computes it.
    fn resources(
        &self,
        nodefs: Option<FsStats>,
        devices: &BTreeMap<String, (i64, i64)>,
    ) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
        let m = &self.cfg.machine;
        let mut cap = BTreeMap::new();
        let mut alloc = BTreeMap::new();
        cap.insert("cpu".to_string(), Quantity(m.cpus.to_string()));
        let (cpu_alloc, mem_alloc) =
            allocatable_cpu_memory(m, &self.cfg.reserved, &self.cfg.thresholds);
        alloc.insert(
            "cpu".to_string(),
            Quantity(if cpu_alloc % 1000 == 0 {
                (cpu_alloc / 1000).to_string()
            } else {
                format!("{cpu_alloc}m")
            }),
        );

        cap.insert("memory".into(), ki(m.memory_bytes));
        alloc.insert("memory".into(), ki(mem_alloc));

        if let Some(fs) = nodefs {
            cap.insert("ephemeral-storage".into(), ki(fs.capacity_bytes));
            let hard_fs = self
                .cfg
                .thresholds
                .hard
                .get("nodefs.available")
                .map_or(0, |t| t.resolve(fs.capacity_bytes));
            let fs_alloc = fs
                .capacity_bytes
                .saturating_sub(
                    self.cfg
                        .reserved
                        .get("ephemeral-storage")
                        .copied()
                        .unwrap_or(0),
                )
                .saturating_sub(hard_fs);
            alloc.insert("ephemeral-storage".into(), Quantity(fs_alloc.to_string()));
        }
        for (size, bytes) in &m.hugepages {
            let name = if size % (1 << 30) == 0 {
                format!("hugepages-{}Gi", size >> 30)
            } else if size % (1 << 20) == 0 {
                format!("hugepages-{}Mi", size >> 20)
            } else {
                format!("hugepages-{}Ki", size >> 10)
            };
            cap.insert(name.clone(), Quantity(bytes.to_string()));
            alloc.insert(name, Quantity(bytes.to_string()));
        }
        let pods = Quantity(self.cfg.max_pods.to_string());
        cap.insert("pods".into(), pods.clone());
        alloc.insert("pods".into(), pods);
        // Device resources as upstream's MachineInfo setter: every device,
        // the healthy ones; a removed resource at 0, not left out (the
        // patch would keep its last figure).
        for (name, (capacity, allocatable)) in devices {
            cap.insert(name.clone(), Quantity(capacity.to_string()));
            alloc.insert(name.clone(), Quantity(allocatable.to_string()));
        }
        (cap, alloc)
    }

    /// Whether any threshold (hard or soft) on these signals is crossed.
    fn crossed(&self, signals: &[&str], r: &Readings) -> bool {
        let observe = |signal: &str| -> Option<(u64, u64)> {
            match signal {
                "memory.available" | "allocatableMemory.available" => {
                    Some((r.memory.available(), r.memory.total))
                }
                s if s.ends_with(".available") && s != "pid.available" => {
                    r.nodefs.map(|f| (f.available_bytes, f.capacity_bytes))
                }
                s if s.ends_with(".inodesFree") => r.nodefs.map(|f| (f.inodes_free, f.inodes)),
                "pid.available" => Some((r.pids.0.saturating_sub(r.pids.1), r.pids.0)),
                _ => None,
            }
        };
        let soft = self.cfg.thresholds.soft.iter().map(|(k, (v, _))| (k, v));
        self.cfg
            .thresholds
            .hard
            .iter()
            .chain(soft)
            .filter(|(k, _)| signals.contains(&k.as_str()))
            .any(|(k, t): (&String, &ThresholdValue)| {
                observe(k).is_some_and(|(avail, cap)| avail < t.resolve(cap))
            })
    }

    /// A pressure condition that stays true for the transition period after
    /// the threshold was last seen crossed, so it does not flap.
    fn pressure(&mut self, kind: &'static str, crossed: bool, now: Instant) -> bool {
        if crossed {
            self.pressure_seen.insert(kind, now);
        }
        self.pressure_seen
            .get(kind)
            .is_some_and(|t| now.duration_since(*t) < self.cfg.pressure_transition)
    }

    fn condition(
        &mut self,
        type_: &'static str,
        status: bool,
        reason: &str,
        message: String,
        now: &Time,
    ) -> NodeCondition {
        let status = if status { "True" } else { "False" }.to_string();
        let transition = match self.last.get(type_) {
            Some((s, t)) if *s == status => t.clone(),
            _ => now.clone(),
        };
        self.last
            .insert(type_, (status.clone(), transition.clone()));
        NodeCondition {
            type_: type_.into(),
            status,
            reason: Some(reason.into()),
            message: Some(message),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(transition),
        }
    }

    /// Takes the conditions the API server holds as the previous state, so a
    /// condition another writer changed (the node lifecycle controller sets
    /// `Ready=Unknown` when heartbeats stop) gets a fresh transition time
    /// when kinglet sets it back, as upstream's condition setters do.
    pub fn observe(&mut self, server: &NodeStatus) {
        for c in server.conditions.iter().flatten() {
            let Some(key) = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
                .into_iter()
                .find(|k| *k == c.type_)
            else {
                continue;
            };
            if let Some(t) = &c.last_transition_time {
                self.last.insert(key, (c.status.clone(), t.clone()));
            }
        }
    }

    /// One status round. `wall` stamps heartbeat and transition times.
    /// Memory, disk and PID pressure: the eviction manager's conditions
    /// when it runs, else measured here from the readings.
    fn pressures(&mut self, r: &Readings, now: Instant) -> (bool, bool, bool) {
        if let Some(p) = &self.cfg.pressure {
            return (
                p.has("MemoryPressure"),
                p.has("DiskPressure"),
                p.has("PIDPressure"),
            );
        }
        let mem = self.crossed(MEMORY_SIGNALS, r);
        let disk = self.crossed(DISK_SIGNALS, r);
        let pid = self.crossed(PID_SIGNALS, r);
        (
            self.pressure("MemoryPressure", mem, now),
            self.pressure("DiskPressure", disk, now),
            self.pressure("PIDPressure", pid, now),
        )
    }

    pub fn build(&mut self, r: &Readings, now: Instant, wall: Time) -> NodeStatus {
        if !r.runtime_version.is_empty() {
            self.runtime_version = r.runtime_version.clone();
        }
        let (capacity, allocatable) = self.resources(r.nodefs, &r.devices);
        let conditions = self.conditions(r, now, &wall);
        NodeStatus {
            capacity: Some(capacity),
            allocatable: Some(allocatable),
            conditions: Some(conditions),
            addresses: Some(
                self.cfg
                    .addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.clone(),
                        address: a.clone(),
                    })
                    .collect(),
            ),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: self.cfg.kubelet_port,
                }),
            }),
            node_info: Some(self.node_info()),
            declared_features: (!self.cfg.declared_features.is_empty())
                .then(|| self.cfg.declared_features.clone()),
            ..Default::default()
        }
    }

    /// The pressure conditions and Ready, with upstream's reasons and
    /// messages.
    fn conditions(&mut self, r: &Readings, now: Instant, wall: &Time) -> Vec<NodeCondition> {
        let (mem, disk, pid) = self.pressures(r, now);
        // (type, under pressure, reason and message when so, when not)
        let table = [
            (
                "MemoryPressure",
                mem,
                (
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                ),
                (
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
            ),
            (
                "DiskPressure",
                disk,
                ("KubeletHasDiskPressure", "kubelet has disk pressure"),
                ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ),
            (
                "PIDPressure",
                pid,
                (
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                ),
                (
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
            ),
        ];
        let mut conditions: Vec<NodeCondition> = table
            .into_iter()
            .map(|(kind, on, yes, no)| {
                let (reason, message) = if on { yes } else { no };
                self.condition(kind, on, reason, message.into(), wall)
            })
            .collect();
        let problems = runtime_problems(&r.runtime);
        conditions.push(if problems.is_empty() {
            let msg = "kubelet is posting ready status".into();
            self.condition("Ready", true, "KubeletReady", msg, wall)
        } else {
            self.condition("Ready", false, "KubeletNotReady", problems.join(", "), wall)
        });
        conditions
    }

    fn node_info(&self) -> NodeSystemInfo {
        let m = &self.cfg.machine;
        NodeSystemInfo {
            architecture: m.architecture.into(),
            boot_id: m.boot_id.clone(),
            container_runtime_version: self.runtime_version.clone(),
            kernel_version: m.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: self.cfg.kubelet_version.clone(),
            machine_id: m.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: m.os_image.clone(),
            system_uuid: m.system_uuid.clone(),
            // Only with swap: the apiserver refuses a capacity of 0.
            swap: (m.swap_bytes > 0).then(|| k8s_openapi::api::core::v1::NodeSwapStatus {
                capacity: Some(i64::try_from(m.swap_bytes).unwrap_or(i64::MAX)),
            }),
            ..Default::default()
        }
    }
}

/// The reasons the node is not ready, in upstream's wording.
fn runtime_problems(runtime: &Result<RuntimeStatus, RuntimeError>) -> Vec<String> {
    let status = match runtime {
        Err(e) => return vec![format!("container runtime is down: {e}")],
        Ok(s) => s,
    };
    let mut out = Vec::new();
    for (kind, what, name) in [
        (
            ConditionKind::RuntimeReady,
            "container runtime not ready",
            "RuntimeReady",
        ),
        (
            ConditionKind::NetworkReady,
            "container runtime network not ready",
            "NetworkReady",
        ),
    ] {
        match status.condition(kind) {
            Some(c) if c.status => {}
            Some(c) => out.push(format!(
                "{what}: {name}=false reason:{} message:{}",
                c.reason, c.message
            )),
            None => out.push(format!("{what}: {name} condition missing")),
        }
    }
    out
}

/// Resource reservations (`systemReserved` + `kubeReserved`) in base units;
/// Allocatable CPU (millicores) and memory (bytes): capacity less the
/// reservations, the hard memory eviction threshold and hugepages, as
/// upstream computes it. Node status and pod admission both use this.
pub fn allocatable_cpu_memory(
    m: &MachineInfo,
    reserved: &BTreeMap<String, u64>,
    thresholds: &EvictionThresholds,
) -> (u64, u64) {
    let cpu = (u64::from(m.cpus) * 1000).saturating_sub(reserved.get("cpu").copied().unwrap_or(0));
    let hard_mem = thresholds
        .hard
        .get("memory.available")
        .map_or(0, |t| t.resolve(m.memory_bytes));
    let memory = m
        .memory_bytes
        .saturating_sub(reserved.get("memory").copied().unwrap_or(0))
        .saturating_sub(hard_mem)
        .saturating_sub(m.hugepages.values().sum());
    (cpu, memory)
}

/// cpu in millicores.
pub fn reservations(
    system: &BTreeMap<String, String>,
    kube: &BTreeMap<String, String>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (k, v) in system.iter().chain(kube) {
        // Validated at load; cpu is counted in millicores.
        let value = if k == "cpu" {
            cpu_millis(v)
        } else {
            parse_quantity(v).unwrap_or(0)
        };
        *out.entry(k.clone()).or_insert(0) += value;
    }
    out
}

fn cpu_millis(v: &str) -> u64 {
    crate::config::parse_quantity_milli(v).map_or(0, |m| u64::try_from(m).unwrap_or(u64::MAX))
}

/// The part of a status kinglet owns, in a form that compares equal when two
/// statuses say the same thing: heartbeat times blanked and quantities by
/// value (the API server rewrites `2097152Ki` as `2Gi`).
pub fn change_key(s: &NodeStatus) -> NodeStatus {
    let norm = |m: &Option<BTreeMap<String, Quantity>>| {
        m.as_ref().map(|m| {
            m.iter()
                .map(|(k, q)| (k.clone(), Quantity(quantity_milli(&q.0))))
                .collect()
        })
    };
    NodeStatus {
        capacity: norm(&s.capacity),
        allocatable: norm(&s.allocatable),
        conditions: s.conditions.as_ref().map(|cs| {
            cs.iter()
                .map(|c| NodeCondition {
                    last_heartbeat_time: None,
                    ..c.clone()
                })
                .collect()
        }),
        addresses: s.addresses.clone(),
        daemon_endpoints: s.daemon_endpoints.clone(),
        node_info: s.node_info.clone(),
        declared_features: s.declared_features.clone(),
        ..Default::default()
    }
}

/// A quantity's value in thousandths, as a string; unparsable text as is.
fn quantity_milli(q: &str) -> String {
    crate::config::parse_quantity_milli(q).map_or_else(|_| q.to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KubeletConfiguration;
    use kinglet_runtime::RuntimeCondition;

    fn builder(cfg: &KubeletConfiguration) -> StatusBuilder {
        StatusBuilder::new(StatusConfig {
            machine: MachineInfo {
                cpus: 4,
                memory_bytes: 2 << 30,
                hugepages: BTreeMap::from([(2 << 20, 64 << 20)]),
                kernel_version: "6.1.0".into(),
                os_image: "Debian".into(),
                architecture: "arm64",
                machine_id: "m".into(),
                system_uuid: "u".into(),
                boot_id: "b".into(),
                swap_bytes: 512 << 20,
            },
            max_pods: cfg.max_pods,
            kubelet_version: "v1.37.2".into(),
            kubelet_port: 10250,
            declared_features: vec![],
            addresses: vec![("InternalIP".into(), "192.0.2.1".into())],
            thresholds: cfg.eviction_thresholds().unwrap(),
            reserved: reservations(&cfg.system_reserved, &cfg.kube_reserved),
            pressure_transition: cfg.eviction_pressure_transition_period.0,
            pressure: None,
        })
    }

    fn ready() -> RuntimeStatus {
        let c = |kind| RuntimeCondition {
            kind,
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        RuntimeStatus {
            conditions: vec![
                c(ConditionKind::RuntimeReady),
                c(ConditionKind::NetworkReady),
            ],
            user_namespaces: false,
        }
    }

    fn readings(mem_free: u64) -> Readings {
        Readings {
            memory: MemInfo {
                total: 2 << 30,
                free: mem_free,
                inactive_file: 0,
            },
            nodefs: Some(FsStats {
                capacity_bytes: 100 << 30,
                available_bytes: 50 << 30,
                inodes: 1000,
                inodes_free: 900,
            }),
            pids: (32768, 200),
            runtime: Ok(ready()),
            runtime_version: "kinglet-oci://0.1.0".into(),
            devices: [("example.com/resource".to_string(), (2, 1))].into(),
        }
    }

    fn cond<'a>(s: &'a NodeStatus, t: &str) -> &'a NodeCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    fn wall(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    #[test]
    fn capacity_and_allocatable() {
        let mut cfg = KubeletConfiguration::default();
        cfg.system_reserved.insert("cpu".into(), "500m".into());
        cfg.kube_reserved.insert("memory".into(), "100Mi".into());
        let mut b = builder(&cfg);
        let s = b.build(&readings(1 << 30), Instant::now(), wall(0));
        // The node's swap, as upstream's nodeInfo.swap.
        let swap = s.node_info.as_ref().unwrap().swap.as_ref().unwrap();
        assert_eq!(swap.capacity, Some(512 << 20));
        let cap = s.capacity.as_ref().unwrap();
        let alloc = s.allocatable.as_ref().unwrap();
        assert_eq!(cap["cpu"].0, "4");
        assert_eq!(alloc["cpu"].0, "3500m");
        assert_eq!(cap["memory"].0, format!("{}Ki", (2u64 << 30) / 1024));
        // 2Gi - 100Mi reserved - 100Mi hard eviction - 64Mi hugepages.
        assert_eq!(
            alloc["memory"].0,
            format!("{}Ki", ((2u64 << 30) - (264 << 20)) / 1024)
        );
        assert_eq!(cap["hugepages-2Mi"].0, (64u64 << 20).to_string());
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(
            cap["ephemeral-storage"].0,
            format!("{}Ki", (100u64 << 30) / 1024)
        );
        // 10% of the filesystem is kept back for nodefs.available.
        assert_eq!(alloc["ephemeral-storage"].0, (90u64 << 30).to_string());
        // Every device, the healthy ones.
        assert_eq!(cap["example.com/resource"].0, "2");
        assert_eq!(alloc["example.com/resource"].0, "1");
        let info = s.node_info.as_ref().unwrap();
        assert_eq!(info.container_runtime_version, "kinglet-oci://0.1.0");
        assert_eq!(info.architecture, "arm64");
    }

    #[test]
    fn healthy_node_conditions_match_upstream() {
        let mut b = builder(&KubeletConfiguration::default());
        let s = b.build(&readings(1 << 30), Instant::now(), wall(0));
        let types: Vec<_> = s
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        );
        let r = cond(&s, "Ready");
        assert_eq!(
            (r.status.as_str(), r.reason.as_deref()),
            ("True", Some("KubeletReady"))
        );
        assert_eq!(
            r.message.as_deref(),
            Some("kubelet is posting ready status")
        );
        assert_eq!(
            cond(&s, "MemoryPressure").reason.as_deref(),
            Some("KubeletHasSufficientMemory")
        );
        assert_eq!(
            cond(&s, "DiskPressure").reason.as_deref(),
            Some("KubeletHasNoDiskPressure")
        );
        assert_eq!(
            cond(&s, "PIDPressure").reason.as_deref(),
            Some("KubeletHasSufficientPID")
        );
    }

    #[test]
    fn runtime_trouble_makes_the_node_not_ready() {
        let mut b = builder(&KubeletConfiguration::default());
        let mut r = readings(1 << 30);
        r.runtime = Err(RuntimeError::Unavailable("socket gone".into()));
        let s = b.build(&r, Instant::now(), wall(0));
        let c = cond(&s, "Ready");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("KubeletNotReady"))
        );
        assert!(
            c.message
                .as_ref()
                .unwrap()
                .starts_with("container runtime is down")
        );

        let mut st = ready();
        st.conditions[1].status = false;
        st.conditions[1].reason = "NetworkPluginNotReady".into();
        r.runtime = Ok(st);
        let s = b.build(&r, Instant::now(), wall(1));
        let msg = cond(&s, "Ready").message.clone().unwrap();
        assert!(msg.starts_with("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady"), "{msg}");
    }

    #[test]
    fn memory_pressure_holds_for_the_transition_period() {
        let mut b = builder(&KubeletConfiguration::default());
        let t0 = Instant::now();
        let s = b.build(&readings(50 << 20), t0, wall(0));
        let c = cond(&s, "MemoryPressure");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some("KubeletHasInsufficientMemory"))
        );
        // Memory recovers, but the condition is held for 5 minutes.
        let s = b.build(&readings(1 << 30), t0 + Duration::from_secs(60), wall(60));
        assert_eq!(cond(&s, "MemoryPressure").status, "True");
        assert_eq!(
            cond(&s, "MemoryPressure").last_transition_time,
            Some(wall(0))
        );
        let s = b.build(&readings(1 << 30), t0 + Duration::from_secs(301), wall(301));
        assert_eq!(cond(&s, "MemoryPressure").status, "False");
        assert_eq!(
            cond(&s, "MemoryPressure").last_transition_time,
            Some(wall(301))
        );
    }

    #[test]
    fn a_condition_changed_by_another_writer_gets_a_new_transition() {
        let mut b = builder(&KubeletConfiguration::default());
        let t0 = Instant::now();
        let s = b.build(&readings(1 << 30), t0, wall(0));
        assert_eq!(cond(&s, "Ready").last_transition_time, Some(wall(0)));
        // The node lifecycle controller marked the node Unknown at t=60.
        let mut server = s.clone();
        for c in server.conditions.iter_mut().flatten() {
            if c.type_ == "Ready" {
                c.status = "Unknown".into();
                c.last_transition_time = Some(wall(60));
            }
        }
        b.observe(&server);
        let s = b.build(&readings(1 << 30), t0, wall(70));
        let r = cond(&s, "Ready");
        assert_eq!(
            (r.status.as_str(), r.last_transition_time.clone()),
            ("True", Some(wall(70)))
        );
        // Unchanged conditions keep their time.
        assert_eq!(cond(&s, "DiskPressure").last_transition_time, Some(wall(0)));
    }

    #[test]
    fn disk_and_pid_pressure() {
        let mut b = builder(&KubeletConfiguration::default());
        let mut r = readings(1 << 30);
        r.nodefs.as_mut().unwrap().available_bytes = 5 << 30; // under 10%
        r.pids = (1000, 999);
        let cfg = KubeletConfiguration {
            eviction_hard: Some(BTreeMap::from([
                ("nodefs.available".to_string(), "10%".to_string()),
                ("pid.available".to_string(), "10".to_string()),
            ])),
            ..Default::default()
        };
        let mut b2 = builder(&cfg);
        let s = b.build(&r, Instant::now(), wall(0));
        assert_eq!(
            cond(&s, "DiskPressure").reason.as_deref(),
            Some("KubeletHasDiskPressure")
        );
        assert_eq!(
            cond(&s, "PIDPressure").status,
            "False",
            "no pid threshold by default"
        );
        let s = b2.build(&r, Instant::now(), wall(0));
        assert_eq!(
            cond(&s, "PIDPressure").reason.as_deref(),
            Some("KubeletHasInsufficientPID")
        );
    }

    #[test]
    fn change_key_ignores_heartbeats_only() {
        let mut b = builder(&KubeletConfiguration::default());
        let t0 = Instant::now();
        let a = b.build(&readings(1 << 30), t0, wall(0));
        let c = b.build(&readings(1 << 30), t0, wall(10));
        assert_ne!(a, c);
        assert_eq!(change_key(&a), change_key(&c));
        // The API server's canonical quantities compare equal to ours.
        let mut canon = c.clone();
        canon
            .capacity
            .as_mut()
            .unwrap()
            .insert("memory".into(), Quantity("2Gi".into()));
        canon
            .allocatable
            .as_mut()
            .unwrap()
            .insert("cpu".into(), Quantity("2000m".into()));
        let mut ours = c.clone();
        ours.allocatable
            .as_mut()
            .unwrap()
            .insert("cpu".into(), Quantity("2".into()));
        assert_eq!(change_key(&canon), change_key(&ours));
        let d = b.build(&readings(10 << 20), t0, wall(20));
        assert_ne!(change_key(&a), change_key(&d));
    }
}
