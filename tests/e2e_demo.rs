//! End to end: the README's demo command as a user meets it. The static
//! kinglet `tests/demo.sh` builds (`cross/build.sh TARGET --demo`, which
//! `tests/run.sh` builds beside the other tests and runs this one after
//! them) runs `kinglet demo` offline under a private
//! root: the demo pod logs its first line, `kinglet pods ls` shows it
//! Running, nothing is written outside the root (no CNI conflist in
//! `/etc/cni/net.d`, no pod log in `/var/log/pods`), and Ctrl-C (SIGINT)
//! stops the pod gracefully and leaves no process, mount or pod cgroup.
//! Its own test binary: the demo uses the agent's default ports.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn listing(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Processes whose command line names `root` (the monitor, containers'
/// helpers).
fn processes_under(root: &Path) -> Vec<String> {
    let needle = root.to_str().unwrap().as_bytes();
    listing("/proc")
        .into_iter()
        .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
        .filter_map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            cmd.windows(needle.len())
                .any(|w| w == needle)
                .then(|| format!("{p}: {}", String::from_utf8_lossy(&cmd).replace('\0', " ")))
        })
        .collect()
}

fn demo_log(root: &Path) -> Option<String> {
    let logs = root.join("logs");
    let dir = listing(logs.to_str()?)
        .into_iter()
        .find(|d| d.starts_with("default_demo-"))?;
    std::fs::read_to_string(logs.join(dir).join("hello/0.log")).ok()
}

/// The bridge of the demo's default CNI network (as a user's).
const BRIDGE: &str = "/sys/class/net/kinglet0";

/// Kills the demo and cleans its root if the test fails midway; the
/// bridge the demo made (a user's stays, as CNI bridges do) goes too.
struct Demo {
    child: std::process::Child,
    root: PathBuf,
    bridge_was_there: bool,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        common::pods::cleanup_root(&self.root);
        if !self.bridge_was_there {
            let _ = Command::new("ip")
                .args(["link", "del", "kinglet0"])
                .status();
        }
    }
}

#[test]
fn the_demo_runs_offline_and_ctrl_c_leaves_nothing_behind() {
    let bin = common::demo_kinglet();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("demo-root");
    let cni_before = listing("/etc/cni/net.d");
    let logs_before = listing("/var/log/pods");
    let bridge_was_there = Path::new(BRIDGE).exists();
    let t0 = Instant::now();
    let child = Command::new(&bin)
        .args(["--root-dir", root.to_str().unwrap(), "demo"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(tmp.path().join("kinglet.log")).unwrap())
        .spawn()
        .unwrap();
    let mut demo = Demo {
        child,
        root: root.clone(),
        bridge_was_there,
    };
    let agent_log = || std::fs::read_to_string(tmp.path().join("kinglet.log")).unwrap_or_default();
    while !demo_log(&root).is_some_and(|l| l.contains("hello from the kinglet demo pod")) {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no line from the demo pod in 90 s\n{}",
            agent_log()
        );
        assert!(
            demo.child.try_wait().unwrap().is_none(),
            "kinglet demo exited\n{}",
            agent_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "figure: demo: first log line of the demo pod {} ms after `kinglet demo` started (image packed and imported, pod started)",
        t0.elapsed().as_millis()
    );
    let ls = Command::new(&bin)
        .args(["--root-dir", root.to_str().unwrap(), "pods", "ls"])
        .output()
        .unwrap();
    let ls = String::from_utf8_lossy(&ls.stdout);
    assert!(
        ls.lines()
            .any(|l| l.contains("demo") && l.contains("Running")),
        "pods ls: {ls}"
    );
    assert!(
        !listing(root.join("cni/net.d").to_str().unwrap()).is_empty(),
        "the demo's CNI conflist is under its root"
    );
    let cgroups = common::pods::pod_cgroups(&root);
    assert!(!cgroups.is_empty(), "the demo pod has a cgroup");
    assert!(!processes_under(&root).is_empty(), "the monitor runs");

    // Ctrl-C.
    // SAFETY: kill(2) on the child we started.
    unsafe { libc::kill(demo.child.id() as i32, libc::SIGINT) };
    let t_stop = Instant::now();
    let status = loop {
        if let Some(s) = demo.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t_stop.elapsed() < Duration::from_secs(30),
            "kinglet demo still runs 30 s after SIGINT\n{}",
            agent_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "figure: demo: Ctrl-C to a clean exit {} ms",
        t_stop.elapsed().as_millis()
    );
    assert!(status.success(), "exit {status}\n{}", agent_log());
    assert!(
        demo_log(&root).is_some_and(|l| l.contains("SIGTERM, bye")),
        "the demo pod was stopped gracefully: {:?}",
        demo_log(&root)
    );
    assert_eq!(
        processes_under(&root),
        Vec::<String>::new(),
        "processes left"
    );
    assert_eq!(
        common::pods::mounts_under(&root),
        Vec::<String>::new(),
        "mounts left"
    );
    for cg in &cgroups {
        assert!(!cg.exists(), "pod cgroup left: {}", cg.display());
    }
    assert_eq!(
        listing("/etc/cni/net.d"),
        cni_before,
        "written to /etc/cni/net.d"
    );
    assert_eq!(
        listing("/var/log/pods"),
        logs_before,
        "written to /var/log/pods"
    );
}
