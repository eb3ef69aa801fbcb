//! Pod benchmark (prints figures; asserts nothing): startup latency from
//! creation in the API to Running observed through a watch, for N pods
//! created one after another, and the node agent's memory (kinglet plus its
//! monitor) with 0, 10, 30 and 110 sleeping pods.
//!
//! cargo run --release --example bench_pods -- ADMIN_KUBECONFIG NODE ROOT_DIR [PODS]
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

/// RSS and PSS (KiB) summed over processes whose command line matches.
fn memory(pattern: &str) -> (u64, u64) {
    let mut rss = 0;
    let mut pss = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !cmd.contains(pattern) || cmd.contains("bench_pods") {
            continue;
        }
        if let Ok(s) = std::fs::read_to_string(e.path().join("smaps_rollup")) {
            for l in s.lines() {
                let v = |l: &str| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|x| x.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                if l.starts_with("Rss:") {
                    rss += v(l);
                } else if l.starts_with("Pss:") {
                    pss += v(l);
                }
            }
        }
    }
    (rss, pss)
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
    let total = n.max(110);
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
        if [10, 30, 110].contains(&(i + 1)) {
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
    println!("node agent memory (kinglet + monitor), KiB:");
    println!("  {:>5} {:>8} {:>8}", "pods", "RSS", "PSS");
    for (p, (rss, pss)) in &mem {
        println!("  {p:>5} {rss:>8} {pss:>8}");
    }
    if let (Some((_, (_, p0))), Some((k, (_, pk)))) = (mem.first(), mem.last()) {
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
