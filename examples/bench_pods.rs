//! Pod benchmark (prints figures; asserts nothing): startup latency from
//! creation in the API to Running observed through a watch, for N pods
//! created one after another, and the node's memory (kinglet and its runtime
//! side: the monitor, or containerd and its shims) with 0, 10, 30 and 110
//! sleeping pods.
//!
//! cargo run --release --example bench_pods -- ADMIN_KUBECONFIG NODE PATTERN [PODS [LEVELS]]
//! PATTERN picks the node's processes by command line (its work dir);
//! LEVELS is the pod counts to measure memory at, `10,30,110` by default.
//! (tests/bench/pods.sh sets everything up.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "kinglet"}},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "kinglet.test/busybox:1", "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "100000"]}]
        }
    }))
    .unwrap()
}

/// RSS and PSS (KiB) summed over processes whose command line matches, in
/// all and by process name.
fn memory(pattern: &str) -> (u64, u64, std::collections::BTreeMap<String, (u64, u64)>) {
    let mut rss = 0;
    let mut pss = 0;
    let mut by_name = std::collections::BTreeMap::new();
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
        if let Ok(s) = std::fs::read_to_string(e.path().join("smaps_rollup")) {
            let entry: &mut (u64, u64) = by_name.entry(comm).or_default();
            for l in s.lines() {
                let v = |l: &str| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|x| x.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                if l.starts_with("Rss:") {
                    rss += v(l);
                    entry.0 += v(l);
                } else if l.starts_with("Pss:") {
                    pss += v(l);
                    entry.1 += v(l);
                }
            }
        }
    }
    (rss, pss, by_name)
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((s.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let (kc, node, root) = (&args[1], &args[2], &args[3]);
    let n: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(50);
    let levels: Vec<usize> = args
        .get(5)
        .map_or("10,30,110", String::as_str)
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let kubeconfig = kube::config::Kubeconfig::read_from(kc).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pattern = root.as_str();
    let mut mem = Vec::new();
    tokio::time::sleep(Duration::from_secs(5)).await;
    mem.push((0, memory(pattern)));

    // Startup latency: created → Running seen through a watch.
    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().labels("bench=kinglet"),
    )
    .applied_objects()
    .boxed();
    let mut created: HashMap<String, Instant> = HashMap::new();
    let mut lat = Vec::new();
    let total = n.max(levels.iter().copied().max().unwrap_or(0));
    for i in 0..total {
        let name = format!("bench-{i}");
        let t = Instant::now();
        pods.create(&PostParams::default(), &pod(&name, node))
            .await
            .unwrap();
        created.insert(name.clone(), t);
        // Wait for this pod to run before creating the next (serial, as
        // upstream's startup-latency measurement does).
        loop {
            let Some(Ok(p)) = stream.next().await else {
                continue;
            };
            let pn = p.metadata.name.clone().unwrap_or_default();
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && let Some(t0) = created.remove(&pn) {
                if lat.len() < n {
                    lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
                if pn == name {
                    break;
                }
            }
        }
        if levels.contains(&(i + 1)) {
            tokio::time::sleep(Duration::from_secs(5)).await;
            mem.push((i + 1, memory(pattern)));
        }
    }
    println!(
        "pod startup latency (created → Running via watch), {} pods, image present:",
        lat.len()
    );
    println!(
        "  p50 {:.0} ms   p90 {:.0} ms   p99 {:.0} ms   max {:.0} ms",
        pct(&lat, 0.5),
        pct(&lat, 0.9),
        pct(&lat, 0.99),
        pct(&lat, 1.0)
    );
    println!("node memory (kinglet and its runtime side), KiB:");
    println!("  {:>5} {:>8} {:>8}   PSS by process", "pods", "RSS", "PSS");
    for (p, (rss, pss, by)) in &mem {
        let parts: Vec<String> = by
            .iter()
            .map(|(name, (_, pss))| format!("{name} {pss}"))
            .collect();
        println!("  {p:>5} {rss:>8} {pss:>8}   {}", parts.join(", "));
    }
    if let (Some((_, (_, p0, _))), Some((k, (_, pk, _)))) = (mem.first(), mem.last()) {
        println!(
            "  per pod: {:.1} KiB PSS",
            (*pk as f64 - *p0 as f64) / *k as f64
        );
    }
    let _ = pods
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default().labels("bench=kinglet"),
        )
        .await;
}
