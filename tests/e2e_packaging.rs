//! End to end: `packaging/install.sh` into a private root (DESTDIR), as a
//! package build runs it: the files CIS 4.1.x names get their modes and
//! owners (config and kubeconfig 600 root:root, kinglet's dirs 700), and
//! a second install keeps the config and backs the binary up. The Debian
//! package (`packaging/deb/build.sh`) installs, upgrades and purges in a
//! minimal Debian root (debootstrap, an overlay per test), its files and
//! modes checked, and its unit passes `systemd-analyze verify`.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

fn mode(p: &Path) -> (u32, u32, u32) {
    let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.permissions().mode() & 0o7777, m.uid(), m.gid())
}

#[test]
fn install_gives_cis_modes_and_a_config_that_loads() {
    let dest = tempfile::tempdir().unwrap();
    let kc = dest.path().join("node.kubeconfig");
    std::fs::write(&kc, "apiVersion: v1\nkind: Config\n").unwrap();
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/install.sh"))
        .arg(env!("CARGO_BIN_EXE_kinglet"))
        .arg(&kc)
        .env("DESTDIR", dest.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = dest.path();
    assert_eq!(mode(&r.join("etc/kinglet/config.yaml")), (0o600, 0, 0));
    assert_eq!(mode(&r.join("etc/kinglet/kubeconfig")), (0o600, 0, 0));
    assert_eq!(mode(&r.join("etc/kinglet")).0, 0o700);
    assert_eq!(mode(&r.join("var/lib/kinglet")).0, 0o700);
    assert_eq!(mode(&r.join("usr/bin/kinglet")).0, 0o755);
    assert_eq!(mode(&r.join("etc/systemd/system/kinglet.service")).0, 0o644);
    // (The config itself is checked item by item by the config module's
    // the_shipped_config_meets_the_cis_kubelet_items.)
    assert_eq!(
        std::fs::read(r.join("etc/kinglet/config.yaml")).unwrap(),
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/config.yaml"
        ))
        .unwrap()
    );
    // A second install keeps the config and backs up the binary.
    let again = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/install.sh"))
        .arg(env!("CARGO_BIN_EXE_kinglet"))
        .env("DESTDIR", dest.path())
        .output()
        .unwrap();
    assert!(again.status.success());
    assert!(r.join("usr/bin/kinglet.bak").exists());
    assert!(r.join("etc/kinglet/config.yaml.bak").exists());
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An overlay over the cached Debian root, with /proc, taken down when
/// dropped.
struct Chroot {
    merged: PathBuf,
    _dir: tempfile::TempDir,
}

impl Chroot {
    fn new() -> Self {
        let base = run(&mut Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/deb/chroot.sh"
        )));
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for s in ["upper", "work", "merged"] {
            std::fs::create_dir(d.join(s)).unwrap();
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            base.trim(),
            d.join("upper").display(),
            d.join("work").display()
        );
        let merged = d.join("merged");
        run(Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged));
        run(Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(merged.join("proc")));
        Chroot { merged, _dir: dir }
    }

    fn run(&self, args: &[&str]) -> String {
        run(Command::new("chroot").arg(&self.merged).args(args))
    }
}

impl Drop for Chroot {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg(self.merged.join("proc"))
            .status();
        let _ = Command::new("umount").arg(&self.merged).status();
    }
}

fn build_deb(version: &str, into: &Path) -> PathBuf {
    let out = run(Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/deb/build.sh"
    ))
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .arg("amd64")
    .env("KINGLET_BIN", common::static_kinglet())
    .env("KINGLET_DEB_VERSION", version));
    let built = PathBuf::from(out.split(':').next().unwrap().trim());
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join(built);
    eprintln!(
        "figure: .deb (amd64) {} bytes",
        std::fs::metadata(&built).unwrap().len()
    );
    let to = into.join(built.file_name().unwrap());
    std::fs::copy(&built, &to).unwrap();
    to
}

#[test]
#[cfg(target_arch = "x86_64")]
fn the_deb_installs_upgrades_and_purges_cleanly() {
    let c = Chroot::new();
    let tmp = c.merged.join("tmp");
    let v1 = build_deb("0.1.0~test1", &tmp);
    let v2 = build_deb("0.1.0~test2", &tmp);
    let inside = |p: &Path| format!("/tmp/{}", p.file_name().unwrap().to_str().unwrap());
    c.run(&["dpkg", "-i", &inside(&v1)]);
    let r = &c.merged;
    assert_eq!(mode(&r.join("usr/bin/kinglet")), (0o755, 0, 0));
    assert_eq!(mode(&r.join("etc/kinglet")).0, 0o700);
    assert_eq!(mode(&r.join("etc/kinglet/config.yaml")), (0o600, 0, 0));
    assert_eq!(mode(&r.join("etc/kinglet/manifests")).0, 0o700);
    assert_eq!(mode(&r.join("var/lib/kinglet")).0, 0o700);
    assert_eq!(mode(&r.join("var/log/pods")).0, 0o755);
    assert_eq!(
        mode(&r.join("usr/lib/systemd/system/kinglet.service")).0,
        0o644
    );
    assert_eq!(mode(&r.join("etc/cni/net.d/10-kinglet.conflist")).0, 0o644);
    // networkd leaves the pod network alone (the VM lab's guest, whose
    // .network matches every Ethernet link, veths included, needs it).
    let network = r.join("usr/lib/systemd/network/05-kinglet.network");
    assert!(
        std::fs::read_to_string(&network)
            .unwrap()
            .contains("Unmanaged=yes"),
        "{network:?}"
    );
    let conffiles = c.run(&["dpkg-query", "-W", "-f", "${Conffiles}", "kinglet"]);
    assert!(
        conffiles.contains("/etc/kinglet/config.yaml")
            && conffiles.contains("/etc/cni/net.d/10-kinglet.conflist"),
        "conffiles: {conffiles}"
    );
    assert!(c.run(&["kinglet", "--version"]).contains("kinglet"));
    // An admin's edit survives the upgrade.
    let cfg = r.join("etc/kinglet/config.yaml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("# edited by the admin\n");
    std::fs::write(&cfg, &text).unwrap();
    c.run(&["dpkg", "-i", &inside(&v2)]);
    assert_eq!(
        c.run(&["dpkg-query", "-W", "-f", "${Version}", "kinglet"]),
        "0.1.0~test2"
    );
    assert!(
        std::fs::read_to_string(&cfg)
            .unwrap()
            .contains("# edited by the admin")
    );
    assert_eq!(mode(&cfg), (0o600, 0, 0));
    // Without systemd there is no agent to put on trial: the binary the
    // upgrade replaced (kept by preinst for postinst's trial) is not left.
    let kept = r.join("var/lib/kinglet/upgrade/kinglet.replaced");
    assert!(!kept.exists(), "{kept:?} left after the upgrade");

    std::fs::write(r.join("etc/kinglet/kubeconfig"), "apiVersion: v1\n").unwrap();
    std::fs::create_dir_all(r.join("var/lib/kinglet/pods")).unwrap();
    c.run(&["dpkg", "--purge", "kinglet"]);
    for gone in [
        "usr/bin/kinglet",
        "etc/kinglet",
        "var/lib/kinglet",
        "usr/lib/systemd/system/kinglet.service",
        "usr/lib/tmpfiles.d/kinglet.conf",
        "etc/cni/net.d/10-kinglet.conflist",
        "usr/lib/systemd/network/05-kinglet.network",
        "usr/share/doc/kinglet",
    ] {
        assert!(!r.join(gone).exists(), "{gone} left after purge");
    }
    let status = Command::new("chroot")
        .arg(r)
        .args(["dpkg", "-s", "kinglet"])
        .output()
        .unwrap();
    assert!(!status.status.success(), "still known to dpkg after purge");
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    // verify checks that ExecStart's /usr/bin/kinglet exists: in a mount
    // namespace of its own, an overlay on /usr/bin holds it, so nothing is
    // written to the host's /usr/bin.
    let tmp = tempfile::tempdir().unwrap();
    let (u, w) = (tmp.path().join("u"), tmp.path().join("w"));
    std::fs::create_dir(&u).unwrap();
    std::fs::create_dir(&w).unwrap();
    let script = format!(
        "mount -t overlay overlay -o lowerdir=/usr/bin,upperdir={},workdir={} /usr/bin && cp {} /usr/bin/kinglet && systemd-analyze verify --man=no {}",
        u.display(),
        w.display(),
        env!("CARGO_BIN_EXE_kinglet"),
        concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/kinglet.service"),
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    assert!(
        !err.contains("kinglet.service"),
        "systemd-analyze verify warns about the unit: {err}"
    );
}

/// The command line of a unit's `ExecStart=`, without the environment
/// variables it expands (`$KINGLET_ARGS`: empty on a fresh install).
fn exec_start(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart");
    line.split_whitespace()
        .filter(|w| !w.starts_with('$'))
        .map(String::from)
        .collect()
}

/// systemd's side of `sd_notify`: the datagram socket `NOTIFY_SOCKET`
/// names, read as systemd reads it (at once, by a thread of its own), and
/// what the agent sends on it.
struct Notify {
    path: PathBuf,
    got: std::sync::mpsc::Receiver<String>,
}

impl Notify {
    fn bind(path: &Path) -> Self {
        let sock = std::os::unix::net::UnixDatagram::bind(path).unwrap();
        let (tx, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok(n) = sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                if tx.send(msg).is_err() {
                    return;
                }
            }
        });
        Notify {
            path: path.to_path_buf(),
            got,
        }
    }

    /// Waits for a message carrying `state`, skipping others.
    fn expect(&self, state: &str, within: std::time::Duration) {
        let t = std::time::Instant::now();
        let mut seen = Vec::new();
        while let Ok(msg) = self.got.recv_timeout(within.saturating_sub(t.elapsed())) {
            if msg.lines().any(|l| l == state) {
                return;
            }
            seen.push(msg);
        }
        panic!("no {state} on the notify socket within {within:?}; got {seen:?}");
    }
}

/// A shell line run in a named network namespace with no route out and a
/// mount namespace of its own, where `/etc`, `/var/log`, `/opt` and
/// `/usr/bin` are overlays whose upper dirs are under `fs` (the host's
/// stay untouched) and `/var/lib/kinglet` is `fs/state`: a fresh machine
/// with no network, as far as kinglet can tell.
fn offline_machine_script(fs: &Path, line: &str) -> String {
    let mut s = String::from("set -e\n");
    for (i, d) in ["/etc", "/var/log", "/opt", "/usr/bin", "/var/lib"]
        .iter()
        .enumerate()
    {
        let (u, w) = (fs.join(format!("o{i}/u")), fs.join(format!("o{i}/w")));
        std::fs::create_dir_all(&u).unwrap();
        std::fs::create_dir_all(&w).unwrap();
        s += &format!(
            "mount -t overlay overlay -o lowerdir={d},upperdir={},workdir={} {d}\n",
            u.display(),
            w.display()
        );
    }
    // Container rootfs overlays cannot have their upper dirs on an
    // overlay: kinglet's state is a plain dir.
    std::fs::create_dir_all(fs.join("state")).unwrap();
    s += &format!(
        "mkdir -p /var/lib/kinglet && mount --bind {} /var/lib/kinglet\n",
        fs.join("state").display()
    );
    s += line;
    s
}

#[test]
#[cfg(target_arch = "x86_64")]
fn the_bundle_installs_offline_and_runs_a_bundled_static_pod() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let manifest = tmp.path().join("bundled.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bundled\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: kinglet.test/busybox:1\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'echo bundled pod up; ip route; sleep 3600']\n",
    )
    .unwrap();
    let out = run(Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/bundle/build.sh"
    ))
    .arg("amd64")
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .env("KINGLET_BIN", common::static_kinglet())
    .env("KINGLET_BUNDLE_IMAGES", common::pods::busybox_archive())
    .env("KINGLET_BUNDLE_MANIFESTS", &manifest));
    let bundle = Path::new(env!("CARGO_MANIFEST_DIR")).join(out.split(':').next().unwrap().trim());
    eprintln!(
        "figure: air-gap bundle (amd64, with busybox) {} bytes",
        std::fs::metadata(&bundle).unwrap().len()
    );
    let x = tmp.path().join("x");
    std::fs::create_dir(&x).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(&x)
        .arg("-xzf")
        .arg(&bundle));
    let dir = std::fs::read_dir(&x)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();

    let ns = format!("kl-bundle-{}", std::process::id());
    run(Command::new("ip").args(["netns", "add", &ns]));
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _ns = Ns(ns.clone());
    run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]));
    let fs = tmp.path().join("fs");
    let state = fs.join("state");
    // Started as the shipped unit starts it (its kubeconfig is not there:
    // standalone), with systemd's notify socket and a 2 s watchdog.
    let exec = exec_start(&std::fs::read_to_string(dir.join("kinglet.service")).unwrap());
    let line = format!("{}/install.sh\nexec {}", dir.display(), exec.join(" "));
    let notify = Notify::bind(&tmp.path().join("notify.sock"));
    let script = offline_machine_script(&fs, &line);
    let t0 = Instant::now();
    let log = tmp.path().join("kinglet.log");
    // nsenter, not `ip netns exec`: that remounts /sys, and the cgroup
    // hierarchies mounted under it would be gone.
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{ns}"))
        .args(["unshare", "-m", "--propagation", "private"])
        .args(["sh", "-c", &script])
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "2000000")
        .stdout(std::fs::File::create(tmp.path().join("install.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Agent(std::process::Child, PathBuf);
    impl Drop for Agent {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            common::pods::cleanup_root(&self.1);
        }
    }
    let mut agent = Agent(child, state.clone());
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    // The pod's log, in the /var/log overlay's upper dir.
    let pod_log = || -> Option<String> {
        let pods = fs.join("o1/u/pods");
        let d = std::fs::read_dir(&pods).ok()?.flatten().find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("default_bundled-")
        })?;
        std::fs::read_to_string(d.path().join("c/0.log")).ok()
    };
    while !pod_log().is_some_and(|l| l.contains("bundled pod up")) {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "the bundled static pod logged nothing in 90 s\n{}",
            agent_log()
        );
        assert!(
            agent.0.try_wait().unwrap().is_none(),
            "install or kinglet exited\n{}\n{}",
            std::fs::read_to_string(tmp.path().join("install.out")).unwrap_or_default(),
            agent_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "figure: air-gap bundle: install to the bundled static pod's first log line {} ms, offline",
        t0.elapsed().as_millis()
    );
    assert!(
        agent_log().contains("running standalone"),
        "no kubeconfig: standalone\n{}",
        agent_log()
    );
    // systemd hears it is up, then its watchdog pings (every second: half
    // of WATCHDOG_USEC) while it is healthy.
    notify.expect("READY=1", Duration::from_secs(10));
    notify.expect("WATCHDOG=1", Duration::from_secs(5));
    notify.expect("WATCHDOG=1", Duration::from_secs(5));
    let installed = std::fs::read_to_string(tmp.path().join("install.out")).unwrap();
    assert!(installed.contains("kinglet installed"), "{installed}");
    // Installed where it says, with the modes it says.
    assert_eq!(mode(&fs.join("o0/u/kinglet/config.yaml")), (0o600, 0, 0));
    assert_eq!(
        mode(&fs.join("o0/u/kinglet/manifests/bundled.yaml")).0,
        0o600
    );
    assert_eq!(mode(&fs.join("o3/u/kinglet")).0, 0o755);
    assert_eq!(mode(&fs.join("o2/u/cni/bin/bridge")).0, 0o755);
    assert!(fs.join("o0/u/cni/net.d/10-kinglet.conflist").exists());
    assert!(fs.join("o0/u/systemd/network/05-kinglet.network").exists());
    // Offline indeed: the machine has no route out (the pod's default
    // route leads to its bridge, which leads nowhere).
    let routes = run(Command::new("ip").args(["-n", &ns, "route"]));
    assert!(!routes.contains("default"), "a route out: {routes}");
    let ls = run(Command::new(common::static_kinglet())
        .arg("--root-dir")
        .arg(&state)
        .args(["pods", "ls"]));
    assert!(
        ls.lines()
            .any(|l| l.contains("bundled") && l.contains("Running")),
        "pods ls: {ls}"
    );

    // Upgrade while the pod runs, then roll back: as systemd would, the
    // agent is stopped (SIGTERM) and the installed binary started again,
    // in the same machine (its mount and network namespaces).
    let running = || -> Vec<(String, i64)> {
        let sock = state.join("runtime/oci/monitor/monitor.sock");
        let list = common::monitor_call(&sock, r#"{"op":"list"}"#).unwrap_or_default();
        let mut v: Vec<(String, i64)> = list["records"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|r| r["status"] == "running")
            .map(|r| {
                (
                    r["id"].as_str().unwrap_or("").to_string(),
                    r["pid"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = running();
    assert_eq!(before.len(), 1, "one running container: {before:?}");
    let pid = agent.0.id();
    let mnt = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).unwrap();
    let mnt = format!(
        "--mount=/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&mnt)
    );
    let net = format!("--net=/run/netns/{ns}");
    let on_machine = |cmd: &str| run(Command::new("nsenter").args([&mnt, &net, "sh", "-c", cmd]));
    let restart = |agent: &mut Agent, log: &str| {
        // SAFETY: kill(2) on the agent we started.
        unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
        notify.expect("STOPPING=1", Duration::from_secs(5));
        let _ = agent.0.wait();
        agent.0 = Command::new("nsenter")
            .args([&mnt, &net])
            .args(&exec)
            .env("NOTIFY_SOCKET", &notify.path)
            .stderr(std::fs::File::create(tmp.path().join(log)).unwrap())
            .spawn()
            .unwrap();
        // Up: its pod workers started before it says it is ready.
        notify.expect("READY=1", Duration::from_secs(30));
    };
    let settle = |what: &str| {
        // Its workers' first syncs (which would restart a container they
        // did not adopt) are done well within this.
        std::thread::sleep(Duration::from_secs(5));
        assert_eq!(running(), before, "{what}: the container changed");
        let log = pod_log().unwrap_or_default();
        assert_eq!(
            log.matches("bundled pod up").count(),
            1,
            "{what}: the container started again: {log}"
        );
    };
    let up = on_machine(&format!("{}/install.sh", dir.display()));
    assert!(up.contains("kinglet installed"), "{up}");
    assert!(
        fs.join("o3/u/kinglet.bak").exists(),
        "the previous binary kept"
    );
    restart(&mut agent, "kinglet-upgraded.log");
    settle("upgrade");
    let back = on_machine(&format!("{}/uninstall.sh --rollback", dir.display()));
    assert!(back.contains("rolled back"), "{back}");
    assert!(!fs.join("o3/u/kinglet.bak").exists());
    restart(&mut agent, "kinglet-rolled-back.log");
    settle("rollback");
    let _ = agent.0.kill();
}
