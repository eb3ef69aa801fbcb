//! Pod benchmark driver (prints figures; asserts nothing), for any node
//! agent joined to the loopback control plane (kinglet on either runtime, or
//! the upstream kubelet with containerd):
//! - startup latency from creation in the API to Running observed through a
//!   watch, pods created one after another (as upstream's startup-latency
//!   measurement does);
//! - deletion latency, from the delete call to the object's disappearance;
//! - memory (RSS, PSS) of the node's processes at 0 pods and at each level,
//!   split into the agent (kinglet, kubelet) and its runtime side (kinglet's
//!   monitor, containerd, shims);
//! - CPU (ms per minute) of the same, over an idle window at 0 pods and at
//!   the highest level (opened a quarter of its length, up to 30 s, after
//!   the last pod ran); the window's wall-clock bounds are reported so API
//!   requests in it can be counted from the apiserver's audit log;
//! - bytes written, over the same idle windows, per pod start (the first
//!   pods, created one after another) and per pod deletion: by the agent
//!   and by its runtime side (`write_bytes` of /proc/PID/io, what they
//!   sent to storage; a process that exits in the window takes its count
//!   with it), and, with BENCH_FS_DEV (a block device's name, e.g. `loop3`)
//!   set, by the filesystem the node's dirs are on (sectors written to that
//!   device after a `sync -f` of PATTERN at each end: journal and metadata
//!   included, what flash wears from);
//! - the pod start broken down over the same first pods: the mean time of
//!   each runtime call a start makes (image status, sandbox with its
//!   network, container create, start), from the node's
//!   `kubelet_runtime_operations_duration_seconds` (kinglet and the upstream
//!   kubelet both have it), read from the node's port with the cluster
//!   admin's certificate (KINGLET_CLUSTER_DIR/pki).
//!
//! cargo run --release --example bench_pods -- ADMIN_KUBECONFIG NODE PATTERN [PODS [LEVELS [IDLE_SECS [JSON_OUT]]]]
//! PATTERN picks the node's processes by command line (its work dir);
//! LEVELS is the pod counts to measure memory at, `10,30,110` by default.
//! (tests/bench/pods.sh and tests/bench/run.sh set everything up.)
//! With BENCH_PROBES set, every pod has a readiness (HTTP) and a liveness
//! (exec) probe.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

fn pod(name: &str, node: &str, i: usize) -> Pod {
    let mut c = json!({"name": "c", "image": "kinglet.test/busybox:1", "imagePullPolicy": "IfNotPresent",
                       "command": ["sleep", "100000"]});
    // BENCH_PROBES: each pod serves HTTP and is probed as a typical
    // workload is, readiness over HTTP and liveness by exec, each every
    // 1–10 s (spread over the pods).
    if std::env::var_os("BENCH_PROBES").is_some() {
        c["command"] = json!([
            "sh",
            "-c",
            "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"
        ]);
        c["readinessProbe"] =
            json!({"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1 + i % 10});
        c["livenessProbe"] =
            json!({"exec": {"command": ["cat", "/www/index.html"]}, "periodSeconds": 10 - i % 10});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "kinglet"}},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
            "containers": [c]
        }
    }))
    .unwrap()
}

/// One process of the node.
struct Proc {
    pid: u32,
    name: String,
    agent: bool,
    rss: u64,
    pss: u64,
    /// Bytes it caused to be sent to storage (/proc/PID/io).
    write_bytes: u64,
    /// CPU time of each live thread, nanoseconds (schedstat), by TID.
    threads: BTreeMap<u64, u64>,
}

/// The node's processes: command lines containing `pattern`.
fn processes(pattern: &str) -> Vec<Proc> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !cmd.contains(pattern) || cmd.contains("bench_pods") {
            continue;
        }
        let comm = std::fs::read_to_string(e.path().join("comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        // A kinglet binary under another file name (the bench's
        // KINGLET_BENCH_BIN) is still kinglet: its agent or its monitor.
        let name = if comm.starts_with("kinglet") && cmd.contains(" monitor ") {
            "kinglet-monitor".to_string()
        } else if comm.starts_with("kinglet") {
            "kinglet".to_string()
        } else {
            comm
        };
        let (mut rss, mut pss) = (0, 0);
        if let Ok(s) = std::fs::read_to_string(e.path().join("smaps_rollup")) {
            for l in s.lines() {
                let v = || {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|x| x.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                if l.starts_with("Rss:") {
                    rss += v();
                } else if l.starts_with("Pss:") {
                    pss += v();
                }
            }
        }
        // Nanosecond run time of each thread (clock ticks are too coarse
        // for agents that idle at a few ms per minute).
        let threads = std::fs::read_dir(e.path().join("task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| {
                let tid = t.file_name().to_str()?.parse::<u64>().ok()?;
                let ns = std::fs::read_to_string(t.path().join("schedstat"))
                    .ok()?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()?;
                Some((tid, ns))
            })
            .collect();
        let write_bytes = std::fs::read_to_string(e.path().join("io"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("write_bytes:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0);
        out.push(Proc {
            pid: e
                .file_name()
                .to_str()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0),
            agent: name == "kinglet" || name == "kubelet",
            name,
            rss,
            pss,
            write_bytes,
            threads,
        });
    }
    out
}

fn memory(pattern: &str, pods: usize) -> serde_json::Value {
    let ps = processes(pattern);
    let sum = |agent: bool, f: fn(&Proc) -> u64| -> u64 {
        ps.iter().filter(|p| p.agent == agent).map(f).sum()
    };
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    for p in &ps {
        *by.entry(p.name.clone()).or_default() += p.pss;
    }
    json!({
        "pods": pods,
        "agent_rss_kib": sum(true, |p| p.rss), "agent_pss_kib": sum(true, |p| p.pss),
        "runtime_rss_kib": sum(false, |p| p.rss), "runtime_pss_kib": sum(false, |p| p.pss),
        "pss_by_process_kib": by,
    })
}

/// What has been written so far: each node process's `write_bytes` (by
/// PID, with whether it is the agent) and the node filesystem's sectors.
struct Io {
    procs: BTreeMap<u32, (bool, u64)>,
    fs_sectors: Option<u64>,
}

impl Io {
    /// Flushes the node's filesystem first (when its device is known), so
    /// that what was written so far has reached the device.
    fn now(pattern: &str) -> Io {
        let dev = std::env::var("BENCH_FS_DEV").ok().filter(|d| !d.is_empty());
        let fs_sectors = dev.and_then(|d| {
            let _ = std::process::Command::new("sync")
                .args(["-f", pattern])
                .status();
            // Field 7 of the block layer's stat: sectors (512 bytes) written.
            std::fs::read_to_string(format!("/sys/block/{d}/stat"))
                .ok()?
                .split_whitespace()
                .nth(6)?
                .parse()
                .ok()
        });
        let procs = processes(pattern)
            .into_iter()
            .map(|p| (p.pid, (p.agent, p.write_bytes)))
            .collect();
        Io { procs, fs_sectors }
    }

    /// Bytes written since `before`: (agent, runtime side, filesystem). A
    /// process born since counts all it wrote.
    fn since(&self, before: &Io) -> (u64, u64, Option<u64>) {
        let (mut agent, mut runtime) = (0, 0);
        for (pid, (is_agent, w)) in &self.procs {
            let grown = w.saturating_sub(before.procs.get(pid).map_or(0, |b| b.1));
            if *is_agent {
                agent += grown;
            } else {
                runtime += grown;
            }
        }
        let fs = self
            .fs_sectors
            .zip(before.fs_sectors)
            .map(|(a, b)| a.saturating_sub(b) * 512);
        (agent, runtime, fs)
    }
}

/// Bytes written per event (pod start, pod deletion) over `n` of them.
fn per_event(after: &Io, before: &Io, n: usize) -> serde_json::Value {
    let (agent, runtime, fs) = after.since(before);
    let n = n.max(1) as u64;
    json!({
        "events": n, "agent_bytes": agent / n, "runtime_bytes": runtime / n,
        "fs_bytes": fs.map(|f| f / n),
    })
}

/// CPU milliseconds per minute of the agent and of its runtime side over
/// `secs` of idling, with the window's wall-clock bounds (unix seconds),
/// and the bytes they wrote.
async fn idle_cpu(pattern: &str, secs: u64, pods: usize) -> serde_json::Value {
    // Idle means after what the last pods' starts left to do (status
    // writes, the first stats walk over new layers): a quarter of the
    // window, up to 30 s, goes by first.
    tokio::time::sleep(Duration::from_secs((secs / 4).clamp(1, 30))).await;
    // Per thread: a thread that exits in the window (tokio's blocking pool
    // lets idle threads go after 10 s) must not take its earlier run time
    // out of the sum, so each thread counts its own growth only (a thread
    // born in the window counts all of its run time).
    let threads = |agent: bool| -> BTreeMap<u64, u64> {
        processes(pattern)
            .into_iter()
            .filter(|p| p.agent == agent)
            .flat_map(|p| p.threads)
            .collect()
    };
    let io0 = Io::now(pattern);
    let (a0, r0) = (threads(true), threads(false));
    let start = jiff::Timestamp::now().as_second();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let end = jiff::Timestamp::now().as_second();
    let (a1, r1) = (threads(true), threads(false));
    let (agent_w, runtime_w, fs_w) = Io::now(pattern).since(&io0);
    let grown = |before: &BTreeMap<u64, u64>, after: &BTreeMap<u64, u64>| -> u64 {
        after
            .iter()
            .map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
            .sum()
    };
    let per_min = |d: u64| d as f64 / 1e6 * 60.0 / secs as f64;
    json!({
        "pods": pods, "seconds": secs, "start_unix": start, "end_unix": end,
        "agent_cpu_ms_per_min": per_min(grown(&a0, &a1)),
        "runtime_cpu_ms_per_min": per_min(grown(&r0, &r1)),
        "agent_write_bytes_per_min": agent_w * 60 / secs,
        "runtime_write_bytes_per_min": runtime_w * 60 / secs,
        "fs_write_bytes_per_min": fs_w.map(|f| f * 60 / secs),
    })
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((s.len() as f64 - 1.0) * p).round() as usize]
}

/// The command line (see the module doc).
struct Args {
    kubeconfig: String,
    node: String,
    pattern: String,
    pods: usize,
    levels: Vec<usize>,
    idle_secs: u64,
    json_out: Option<String>,
}

impl Args {
    fn parse() -> Args {
        let args: Vec<String> = std::env::args().collect();
        Args {
            kubeconfig: args[1].clone(),
            node: args[2].clone(),
            pattern: args[3].clone(),
            pods: args.get(4).and_then(|s| s.parse().ok()).unwrap_or(50),
            levels: args
                .get(5)
                .map_or("10,30,110", String::as_str)
                .split(',')
                .filter_map(|s| s.parse().ok())
                .collect(),
            idle_secs: args.get(6).and_then(|s| s.parse().ok()).unwrap_or(0),
            json_out: args.get(7).cloned(),
        }
    }

    /// How many pods are created: the latency sample or the top level.
    fn total(&self) -> usize {
        self.pods
            .max(self.levels.iter().copied().max().unwrap_or(0))
    }
}

type PodEvents = futures::stream::BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>;

/// What one run measured.
#[derive(Default)]
struct Figures {
    startup_ms: Vec<f64>,
    delete_ms: Vec<f64>,
    memory: Vec<serde_json::Value>,
    cpu: Vec<serde_json::Value>,
    /// Bytes written per pod start and per pod deletion.
    writes_start: Option<serde_json::Value>,
    writes_delete: Option<serde_json::Value>,
    /// Mean duration of each runtime call over the first pods' starts.
    breakdown: Option<serde_json::Value>,
}

/// The runtime calls of a pod start, in the order they come.
const START_CALLS: [&str; 4] = [
    "image_status",
    "run_podsandbox",
    "create_container",
    "start_container",
];

/// Sum (seconds) and count of each runtime operation's durations so far,
/// from the node's `/metrics`, straight from its port with the cluster
/// admin's client certificate (the API server's node proxy refuses
/// loopback nodes).
async fn runtime_ops(client: &kube::Client, node: &str) -> BTreeMap<String, (f64, f64)> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let port = nodes
        .get(node)
        .await
        .ok()
        .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint?.port.into());
    let pki = format!(
        "{}/pki",
        std::env::var("KINGLET_CLUSTER_DIR").unwrap_or_else(|_| "/tmp/kinglet-cluster".into())
    );
    let text = port
        .and_then(|port| {
            std::process::Command::new("curl")
                .args(["-sfk", "--max-time", "10", "--cert"])
                .arg(format!("{pki}/admin.crt"))
                .arg("--key")
                .arg(format!("{pki}/admin.key"))
                .arg(format!("https://127.0.0.1:{port}/metrics"))
                .output()
                .ok()
        })
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let name = "kubelet_runtime_operations_duration_seconds_";
    for line in text.lines().filter_map(|l| l.strip_prefix(name)) {
        let (kind, rest) = line.split_once('{').unwrap_or(("", ""));
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let op = labels
            .split(',')
            .find_map(|l| l.strip_prefix("operation_type=\""))
            .map(|o| o.trim_end_matches('"').to_string());
        let (Some(op), Ok(v)) = (op, value.trim().parse::<f64>()) else {
            continue;
        };
        let e = out.entry(op).or_default();
        match kind {
            "sum" => e.0 = v,
            "count" => e.1 = v,
            _ => {}
        }
    }
    out
}

/// Each start call's count and mean between two readings.
fn breakdown(
    after: &BTreeMap<String, (f64, f64)>,
    before: &BTreeMap<String, (f64, f64)>,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for op in START_CALLS {
        let (s1, c1) = after.get(op).copied().unwrap_or_default();
        let (s0, c0) = before.get(op).copied().unwrap_or_default();
        let n = c1 - c0;
        let mean = if n > 0.0 {
            (s1 - s0) / n * 1000.0
        } else {
            f64::NAN
        };
        out.insert(op.into(), json!({"calls": n, "mean_ms": mean}));
    }
    serde_json::Value::Object(out)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut fig = Figures::default();
    tokio::time::sleep(Duration::from_secs(5)).await;
    fig.memory.push(memory(&args.pattern, 0));
    if args.idle_secs > 0 {
        fig.cpu
            .push(idle_cpu(&args.pattern, args.idle_secs, 0).await);
    }
    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().labels("bench=kinglet"),
    )
    .boxed();
    let ops0 = runtime_ops(&client, &args.node).await;
    create_all(&args, &pods, &mut stream, &mut fig, (&client, &ops0)).await;
    if args.idle_secs > 0 {
        fig.cpu
            .push(idle_cpu(&args.pattern, args.idle_secs, args.total()).await);
    }
    delete_some(&args, &pods, &mut stream, &mut fig).await;
    print(&fig);
    if let Some(path) = &args.json_out {
        write_json(path, &fig);
    }
    let _ = pods
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default().labels("bench=kinglet"),
        )
        .await;
}

/// Startup latency: created → Running seen through a watch, one pod after
/// another; memory (and idle CPU below the top) at each level.
async fn create_all(
    args: &Args,
    pods: &Api<Pod>,
    stream: &mut PodEvents,
    fig: &mut Figures,
    (client, ops0): (&kube::Client, &BTreeMap<String, (f64, f64)>),
) {
    let mut created: HashMap<String, Instant> = HashMap::new();
    let total = args.total();
    // Writes per pod start: over the first pods, up to the first level,
    // until 3 s after the last of them runs (what a start writes late).
    let sample = args
        .pods
        .min(args.levels.first().copied().unwrap_or(total))
        .min(total);
    let io0 = Io::now(&args.pattern);
    for i in 0..total {
        let name = format!("bench-{i}");
        let t = Instant::now();
        pods.create(&PostParams::default(), &pod(&name, &args.node, i))
            .await
            .unwrap();
        created.insert(name.clone(), t);
        wait_running(&name, args.pods, stream, &mut created, &mut fig.startup_ms).await;
        if i + 1 == sample {
            tokio::time::sleep(Duration::from_secs(3)).await;
            fig.writes_start = Some(per_event(&Io::now(&args.pattern), &io0, sample));
            fig.breakdown = Some(breakdown(&runtime_ops(client, &args.node).await, ops0));
        }
        if args.levels.contains(&(i + 1)) {
            tokio::time::sleep(Duration::from_secs(5)).await;
            fig.memory.push(memory(&args.pattern, i + 1));
            // Idle CPU at each level below the top (the top is measured
            // once every pod was created).
            if args.idle_secs > 0 && i + 1 < total {
                fig.cpu
                    .push(idle_cpu(&args.pattern, args.idle_secs, i + 1).await);
            }
        }
    }
}

/// Waits for `name` to run, recording the latency of every pod seen
/// Running meanwhile (up to `sample` of them).
async fn wait_running(
    name: &str,
    sample: usize,
    stream: &mut PodEvents,
    created: &mut HashMap<String, Instant>,
    lat: &mut Vec<f64>,
) {
    loop {
        let Some(Ok(ev)) = stream.next().await else {
            continue;
        };
        let p = match ev {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => p,
            _ => continue,
        };
        let pn = p.metadata.name.clone().unwrap_or_default();
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if running && let Some(t0) = created.remove(&pn) {
            if lat.len() < sample {
                lat.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
            if pn == name {
                return;
            }
        }
    }
}

/// Deletion latency: delete → the object is gone (the node confirmed the
/// containers stopped), one pod after another.
async fn delete_some(args: &Args, pods: &Api<Pod>, stream: &mut PodEvents, fig: &mut Figures) {
    let deletes: usize = std::env::var("BENCH_DELETES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(args.pods);
    let io0 = Io::now(&args.pattern);
    let mut deleted = 0;
    for i in 0..args.pods.min(args.total()).min(deletes) {
        let name = format!("bench-{i}");
        let t = Instant::now();
        if pods.delete(&name, &DeleteParams::default()).await.is_err() {
            continue;
        }
        loop {
            match stream.next().await {
                Some(Ok(watcher::Event::Delete(p)))
                    if p.metadata.name.as_deref() == Some(&name) =>
                {
                    fig.delete_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                    deleted += 1;
                    break;
                }
                Some(_) => {}
                None => break,
            }
        }
    }
    // What a deletion writes late (records removed, logs closed).
    tokio::time::sleep(Duration::from_secs(3)).await;
    fig.writes_delete = Some(per_event(&Io::now(&args.pattern), &io0, deleted));
}

fn print(fig: &Figures) {
    let (lat, del) = (&fig.startup_ms, &fig.delete_ms);
    println!(
        "pod startup latency (created → Running via watch), {} pods, image present:",
        lat.len()
    );
    println!(
        "  p50 {:.0} ms   p90 {:.0} ms   p99 {:.0} ms   max {:.0} ms",
        pct(lat, 0.5),
        pct(lat, 0.9),
        pct(lat, 0.99),
        pct(lat, 1.0)
    );
    println!(
        "pod deletion latency (delete → gone), {} pods: p50 {:.0} ms   p90 {:.0} ms",
        del.len(),
        pct(del, 0.5),
        pct(del, 0.9)
    );
    println!("node memory (agent + runtime side), KiB:");
    println!("  {:>5} {:>8} {:>8}   PSS by process", "pods", "RSS", "PSS");
    for m in &fig.memory {
        let rss =
            m["agent_rss_kib"].as_u64().unwrap_or(0) + m["runtime_rss_kib"].as_u64().unwrap_or(0);
        let pss =
            m["agent_pss_kib"].as_u64().unwrap_or(0) + m["runtime_pss_kib"].as_u64().unwrap_or(0);
        let parts: Vec<String> = m["pss_by_process_kib"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!(
            "  {:>5} {rss:>8} {pss:>8}   {}",
            m["pods"],
            parts.join(", ")
        );
    }
    for c in &fig.cpu {
        println!(
            "idle CPU at {} pods: agent {:.0} ms/min, runtime side {:.0} ms/min",
            c["pods"],
            c["agent_cpu_ms_per_min"].as_f64().unwrap_or(0.0),
            c["runtime_cpu_ms_per_min"].as_f64().unwrap_or(0.0)
        );
        println!(
            "idle writes at {} pods: agent {} B/min, runtime side {} B/min, node filesystem {} B/min",
            c["pods"],
            c["agent_write_bytes_per_min"],
            c["runtime_write_bytes_per_min"],
            c["fs_write_bytes_per_min"]
        );
    }
    if let Some(b) = &fig.breakdown {
        let parts: Vec<String> = START_CALLS
            .iter()
            .map(|op| {
                let m = b[*op]["mean_ms"].as_f64().unwrap_or(f64::NAN);
                format!("{op} {m:.1} ms ({} calls)", b[*op]["calls"])
            })
            .collect();
        println!(
            "pod start broken down (mean per runtime call): {}",
            parts.join(", ")
        );
    }
    for (what, w) in [
        ("start", &fig.writes_start),
        ("deletion", &fig.writes_delete),
    ] {
        if let Some(w) = w {
            println!(
                "writes per pod {what} ({} pods): agent {} B, runtime side {} B, node filesystem {} B",
                w["events"], w["agent_bytes"], w["runtime_bytes"], w["fs_bytes"]
            );
        }
    }
}

fn write_json(path: &str, fig: &Figures) {
    let (lat, del) = (&fig.startup_ms, &fig.delete_ms);
    let doc = json!({
        "startup_ms": lat, "startup_p50_ms": pct(lat, 0.5), "startup_p90_ms": pct(lat, 0.9),
        "startup_p99_ms": pct(lat, 0.99),
        "delete_ms": del, "delete_p50_ms": pct(del, 0.5), "delete_p90_ms": pct(del, 0.9),
        "memory": fig.memory, "cpu": fig.cpu,
        "writes_per_start": fig.writes_start, "writes_per_delete": fig.writes_delete,
        "start_breakdown": fig.breakdown,
    });
    std::fs::write(path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}
