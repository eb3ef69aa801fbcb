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
