//! Resource usage for `/stats/summary` (upstream's summary API, what
//! `kubectl top` reads through metrics-server in older setups and what
//! eviction tools read) and `/metrics/resource` (the Prometheus text
//! metrics-server 0.8 scrapes): the node from `/proc` and `statvfs`, pods
//! and containers from the runtime's cgroup readings.
//!
//! CPU rates (`usageNanoCores`) need two readings: each scrape keeps its
//! readings, and the next one divides by the time between (upstream's
//! cAdvisor keeps a housekeeping interval instead). `/metrics/resource`
//! carries only cumulative counters, as upstream's: the scraper computes
//! rates.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kinglet_runtime::{ContainerState, Runtime};

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
}

/// One pod's cgroup readings.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub start_time: Option<String>,
    pub cpu_nanos: u64,
    pub working_set: u64,
}

/// The node's readings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSample {
    pub cpu_nanos: u64,
    pub memory_capacity: u64,
    pub memory_usage: u64,
    pub working_set: u64,
    pub fs: Option<crate::node::host::FsStats>,
    pub image_fs: Option<crate::node::host::FsStats>,
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
            started: jiff::Timestamp::now(),
            last: Mutex::new(HashMap::new()),
        }
    }

    fn node(&self) -> NodeSample {
        let stat = std::fs::read_to_string(self.proc_dir.join("stat")).unwrap_or_default();
        let mem = crate::node::host::parse_meminfo(
            &std::fs::read_to_string(self.proc_dir.join("meminfo")).unwrap_or_default(),
        );
        let usage = mem.total.saturating_sub(mem.free);
        NodeSample {
            cpu_nanos: node_cpu_nanos(&stat),
            memory_capacity: mem.total,
            memory_usage: usage,
            working_set: usage.saturating_sub(mem.inactive_file),
            fs: crate::node::host::fs_stats(&self.root_dir).ok(),
            image_fs: crate::node::host::fs_stats(&self.image_dir).ok(),
        }
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
        let mut containers = Vec::new();
        for u in &usage {
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
            });
        }
        let pods = sandboxes
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
                })
            })
            .collect();
        Snapshot {
            at: jiff::Timestamp::now(),
            node: self.node(),
            pods,
            containers,
            error,
        }
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
        let now = Instant::now();
        let time = s.at.to_string();
        let cpu = |key: &str, nanos: u64| serde_json::json!({"time": time, "usageNanoCores": self.rate(key, nanos, now), "usageCoreNanoSeconds": nanos});
        let mem = |ws: u64, usage: u64, avail: Option<u64>| {
            let mut m =
                serde_json::json!({"time": time, "usageBytes": usage, "workingSetBytes": ws});
            if let Some(a) = avail {
                m["availableBytes"] = a.into();
            }
            m
        };
        let fs = |f: &Option<crate::node::host::FsStats>| {
            f.as_ref().map(|f| {
                serde_json::json!({
                    "time": time,
                    "availableBytes": f.available_bytes,
                    "capacityBytes": f.capacity_bytes,
                    "usedBytes": f.capacity_bytes.saturating_sub(f.available_bytes),
                    "inodesFree": f.inodes_free,
                    "inodes": f.inodes,
                    "inodesUsed": f.inodes.saturating_sub(f.inodes_free),
                })
            })
        };
        let n = &s.node;
        let node = serde_json::json!({
            "nodeName": self.node_name,
            "startTime": self.started.to_string(),
            "cpu": cpu("node", n.cpu_nanos),
            "memory": mem(n.working_set, n.memory_usage, Some(n.memory_capacity.saturating_sub(n.working_set))),
            "fs": fs(&n.fs),
            "runtime": {"imageFs": fs(&n.image_fs)},
        });
        let pods: Vec<serde_json::Value> = s
            .pods
            .iter()
            .map(|p| {
                let containers: Vec<serde_json::Value> = s
                    .containers
                    .iter()
                    .filter(|c| c.pod_uid == p.uid)
                    .map(|c| {
                        let started = jiff::Timestamp::from_second(c.started_at as i64)
                            .map(|t| t.to_string())
                            .unwrap_or_default();
                        serde_json::json!({
                            "name": c.name,
                            "startTime": started,
                            "cpu": cpu(&format!("{}/{}", p.uid, c.name), c.cpu_nanos),
                            "memory": mem(c.working_set, c.working_set, None),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "podRef": {"name": p.pod, "namespace": p.namespace, "uid": p.uid},
                    "startTime": p.start_time,
                    "containers": containers,
                    "cpu": cpu(&p.uid, p.cpu_nanos),
                    "memory": mem(p.working_set, p.working_set, None),
                })
            })
            .collect();
        serde_json::json!({"node": node, "pods": pods})
    }
}

/// Label values escaped as the Prometheus text format wants.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `/metrics/resource` in upstream's names and help (the STABLE resource
/// metrics), each sample stamped with the scrape's time in milliseconds as
/// upstream's collector does. Written by hand: the timestamps are part of
/// the contract and prometheus-client has no per-sample timestamp.
pub fn resource_metrics(s: &Snapshot) -> String {
    let ms = s.at.as_millisecond();
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v} {ms}");
        }
    };
    let c_labels = |c: &ContainerSample| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            label(&c.name),
            label(&c.namespace),
            label(&c.pod)
        )
    };
    let p_labels = |p: &PodSample| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            label(&p.namespace),
            label(&p.pod)
        )
    };
    let secs = |n: u64| n as f64 / 1e9;
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        s.containers
            .iter()
            .map(|c| (c_labels(c), secs(c.cpu_nanos)))
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        s.containers
            .iter()
            .map(|c| (c_labels(c), c.working_set as f64))
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        s.containers
            .iter()
            .map(|c| (c_labels(c), c.started_at))
            .collect(),
    );
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        vec![(String::new(), secs(s.node.cpu_nanos))],
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        vec![(String::new(), s.node.working_set as f64)],
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        s.pods
            .iter()
            .map(|p| (p_labels(p), secs(p.cpu_nanos)))
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        s.pods
            .iter()
            .map(|p| (p_labels(p), p.working_set as f64))
            .collect(),
    );
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
    let _ = writeln!(out, "resource_scrape_error {}", u8::from(s.error));
    out
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
            }],
            containers: vec![ContainerSample {
                namespace: "ns".into(),
                pod: "p".into(),
                pod_uid: "u".into(),
                name: "c\"x".into(),
                started_at: 1_699_999_000.0,
                cpu_nanos: 500_000_000,
                working_set: 42,
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
}
