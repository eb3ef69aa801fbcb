//! The side-by-side benchmark harness (`tests/bench/run.sh --quick`) runs in
//! the suite so it never rots: the upstream kubelet with containerd, kinglet
//! in-process and kinglet with containerd all join the loopback control
//! plane, run pods, and report. Nothing here asserts on a timing or a size:
//! only that every figure the harness promises was measured (or is marked
//! not measured in a quick run, saying where it is) and that the run left
//! nothing behind.

mod common;

use std::process::Command;

#[test]
fn quick_benchmark_measures_all_three_nodes() {
    common::cluster();
    let out = Command::new(common::repo().join("tests/bench/run.sh"))
        .arg("--quick")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "bench failed:\n{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(common::repo().join("target/bench/results.json")).unwrap(),
    )
    .unwrap();
    let results = doc["results"].as_array().unwrap();
    for node in ["kubelet-containerd", "kinglet-oci", "kinglet-cri"] {
        let value = |metric: &str| {
            results
                .iter()
                .find(|r| r["node"] == node && r["metric"] == metric)
                .unwrap_or_else(|| panic!("{node}: no {metric}"))["value"]
                .clone()
        };
        for metric in [
            "agent binary",
            "memory at 0 pods: node total PSS",
            "memory at 10 pods: node total PSS",
            "pod startup p50",
            "pod startup p99",
            "pod deletion p50",
            // Every pod start writes its sandbox and container to disk.
            "writes per pod start: node filesystem",
            // The start broken down, from the node's runtime call metrics.
            "pod start, mean of the runtime call run_podsandbox",
            "pod start, mean of the runtime call create_container",
            "pod start, mean of the runtime call start_container",
        ] {
            assert!(
                value(metric).as_f64().is_some_and(|v| v > 0.0),
                "{node}: {metric} not measured: {}",
                stderr
            );
        }
        // Counts over a short window may be zero; they must be there.
        for metric in [
            "CPU idle at 0 pods: agent",
            "API requests idle at 0 pods",
            "API requests idle at 10 pods",
            "CPU idle at 10 pods: agent",
            "writes idle at 0 pods: agent",
            "writes idle at 10 pods: node filesystem",
            "writes per pod start: agent",
            "writes per pod deletion: runtime side",
        ] {
            assert!(
                value(metric).as_f64().is_some_and(|v| v >= 0.0),
                "{node}: {metric} not measured: {}",
                stderr
            );
        }
        // The quick run does not measure the pressure reaction: its rows
        // say where it is measured, with no value.
        let pressure: Vec<_> = results
            .iter()
            .filter(|r| {
                r["node"] == node
                    && r["metric"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("memory pressure"))
            })
            .collect();
        assert_eq!(pressure.len(), 9, "{node}: the pressure rows");
        assert!(
            pressure.iter().all(|r| r["value"].is_null()
                && r["status"]
                    .as_str()
                    .is_some_and(|s| s.contains("--pressure measure"))),
            "{node}: {pressure:?}"
        );
    }
    for f in ["results.md", "memory.svg", "startup.svg"] {
        let p = common::repo().join("target/bench").join(f);
        assert!(
            std::fs::metadata(&p).is_ok_and(|m| m.len() > 100),
            "{}",
            p.display()
        );
    }
    // Nothing left running: no bench agent, containerd or shim.
    let ps = Command::new("pgrep")
        .args(["-af", "kinglet-bench"])
        .output()
        .unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(String::from)
        .collect();
    assert!(left.is_empty(), "processes left: {left:?}");
}
