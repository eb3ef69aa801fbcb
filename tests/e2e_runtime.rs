//! End to end: the container monitor (`kinglet monitor`) running real
//! containers through libcontainer: output in CRI log format, exit codes,
//! signals, OOM kills in a memory-limited cgroup, survival of the client,
//! and nothing left behind after delete.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kinglet_runtime_oci::monitor::{Client, ContainerRecord, Request};
use kinglet_runtime_oci::spec::ContainerConfig;

fn busybox_bundle(dir: &Path, id: &str, script: &str, memory: Option<i64>) -> PathBuf {
    let bundle = dir.join(id);
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for app in ["sh", "echo", "sleep", "head", "tr", "cat"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(app)).unwrap();
    }
    let cfg = ContainerConfig {
        args: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec!["PATH=/bin".into()],
        rootfs: rootfs.clone(),
        hostname: id.into(),
        cgroups_path: format!("kinglet-e2e/{id}"),
        memory_limit: memory,
        host_network: true,
        ..Default::default()
    };
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec(&cfg.to_spec()).unwrap(),
    )
    .unwrap();
    bundle
}

async fn wait_exited(c: &Client, id: &str) -> ContainerRecord {
    common::wait_for(
        &format!("{id} to exit"),
        Duration::from_secs(20),
        || async {
            let r = c.record(&Request::State { id: id.into() }).await.ok()?;
            (r.status == "exited").then_some(r)
        },
    )
    .await
}

async fn run(
    c: &Client,
    dir: &Path,
    id: &str,
    script: &str,
    memory: Option<i64>,
) -> ContainerRecord {
    let bundle = busybox_bundle(dir, id, script, memory);
    let created = c
        .record(&Request::Create {
            id: id.into(),
            bundle,
            log_path: dir.join("logs").join(id).join("0.log"),
            log_max_size: 10 << 20,
            log_max_files: 5,
            stdin: false,
            stdin_once: false,
        })
        .await
        .unwrap();
    assert_eq!(created.status, "created");
    let started = c.record(&Request::Start { id: id.into() }).await.unwrap();
    assert_eq!(started.status, "running");
    started
}

fn log_lines(dir: &Path, id: &str) -> Vec<(String, String, String)> {
    std::fs::read_to_string(dir.join("logs").join(id).join("0.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, ' ').collect();
            (
                f[1].to_string(),
                f[2].to_string(),
                f.get(3).unwrap_or(&"").to_string(),
            )
        })
        .collect()
}

fn cgroup_exists(id: &str) -> bool {
    [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/cpu",
    ]
    .iter()
    .any(|b| Path::new(b).join("kinglet-e2e").join(id).exists())
}

#[tokio::test]
async fn monitor_runs_logs_reaps_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let mon = dir.path().join("monitor");
    // Whatever happens, the monitor and its containers go at the end.
    struct Guard(PathBuf);
    impl Drop for Guard {
        fn drop(&mut self) {
            common::monitor_cleanup(&self.0.join("monitor.sock"));
        }
    }
    let _guard = Guard(mon.clone());
    let c = Client::new(&mon);
    c.ensure_running(Path::new(env!("CARGO_BIN_EXE_kinglet")), &mon)
        .await
        .unwrap();
    // A second start finds the running one.
    c.ensure_running(Path::new(env!("CARGO_BIN_EXE_kinglet")), &mon)
        .await
        .unwrap();
    let tag = std::process::id();
    // Subscribed before anything runs: every change arrives as an event.
    let mut events = c.watch().await.unwrap();

    // Output and exit code.
    let id = format!("out-{tag}");
    run(
        &c,
        dir.path(),
        &id,
        "echo to-stdout; echo to-stderr >&2; exit 7",
        None,
    )
    .await;
    let r = wait_exited(&c, &id).await;
    assert_eq!(
        (r.exit_code, r.signal, r.oom_killed),
        (Some(7), None, false)
    );
    assert!(r.finished_at >= r.started_at);
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("exited") {
        let ev = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("an event within 20 s")
            .unwrap()
            .expect("the event stream stays open");
        assert_eq!(ev.id, id, "only this container changed so far");
        seen.push(ev.status);
    }
    assert_eq!(seen, ["created", "running", "exited"]);
    common::wait_for("logs", Duration::from_secs(5), || async {
        (log_lines(dir.path(), &id).len() == 2).then_some(())
    })
    .await;
    let mut lines = log_lines(dir.path(), &id);
    lines.sort();
    assert_eq!(
        lines,
        [
            ("stderr".into(), "F".into(), "to-stderr".into()),
            ("stdout".into(), "F".into(), "to-stdout".into())
        ]
    );

    // No signal ignored in a container (the monitor, a Rust program,
    // ignores SIGPIPE; that must not reach the workload).
    let sig = format!("sig-{tag}");
    // (`; true`: busybox sh execs a lone command with SIGQUIT ignored.)
    run(
        &c,
        dir.path(),
        &sig,
        "grep SigIgn /proc/self/status; true",
        None,
    )
    .await;
    wait_exited(&c, &sig).await;
    common::wait_for("the SigIgn line", Duration::from_secs(5), || async {
        (log_lines(dir.path(), &sig).len() == 1).then_some(())
    })
    .await;
    // (Signals 32 and 33 are the C library's own: no program sets them.)
    let line = log_lines(dir.path(), &sig)[0].2.clone();
    let mask = u64::from_str_radix(line.trim_start_matches("SigIgn:\t"), 16).unwrap();
    assert_eq!(mask & !0x1_8000_0000, 0, "{line}");

    // SIGTERM ends a sleeper: exit 143, signal recorded.
    let sl = format!("sleep-{tag}");
    let rec = run(
        &c,
        dir.path(),
        &sl,
        "trap 'exit 143' TERM; echo ready; sleep 1000 & wait",
        None,
    )
    .await;
    assert!(Path::new(&format!("/proc/{}", rec.pid)).exists());
    // SIGTERM only after the shell installed its trap: as PID 1 it
    // ignores signals it has no handler for.
    common::wait_for("the trap", Duration::from_secs(10), || async {
        log_lines(dir.path(), &sl)
            .iter()
            .any(|l| l.2 == "ready")
            .then_some(())
    })
    .await;
    c.call(&Request::Kill {
        id: sl.clone(),
        signal: 15,
    })
    .await
    .unwrap();
    let r = wait_exited(&c, &sl).await;
    assert_eq!(r.exit_code, Some(143), "{r:?}");

    // A memory hog over its limit is OOM killed: 137, oom_killed.
    let oom = format!("oom-{tag}");
    run(
        &c,
        dir.path(),
        &oom,
        "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived",
        Some(16 << 20),
    )
    .await;
    let r = wait_exited(&c, &oom).await;
    eprintln!("oom record: {r:?}");
    assert!(r.oom_killed, "{r:?}");

    // The records survive a restart of whoever asked (here: a new client).
    let all = Client::new(&mon).list().await.unwrap();
    assert_eq!(all.len(), 4);

    for id in [&id, &sig, &sl, &oom] {
        c.call(&Request::Delete { id: id.clone() }).await.unwrap();
        assert!(!cgroup_exists(id), "cgroup of {id} leaked");
    }
    // A container that is gone is told apart from a failure.
    assert!(matches!(
        c.record(&Request::State { id: id.clone() }).await,
        Err(kinglet_runtime_oci::monitor::MonitorError::NotFound(_))
    ));
    // The stream saw the rest: the signal check's, the sleeper's and the
    // hog's lives, and the four deletions, in order.
    let mut rest = Vec::new();
    while rest.len() < 13 {
        let ev = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("an event within 20 s")
            .unwrap()
            .expect("the event stream stays open");
        rest.push((ev.id, ev.status));
    }
    let deleted: Vec<&String> = rest
        .iter()
        .filter(|(_, s)| s == "deleted")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(deleted, [&id, &sig, &sl, &oom], "{rest:?}");
    assert!(c.list().await.unwrap().is_empty());
    for b in [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/cpu",
    ] {
        let _ = std::fs::remove_dir(Path::new(b).join("kinglet-e2e"));
    }
    c.call(&Request::Exit).await.ok();
    common::wait_for("monitor exit", Duration::from_secs(5), || async {
        (!c.ping().await).then_some(())
    })
    .await;
}
