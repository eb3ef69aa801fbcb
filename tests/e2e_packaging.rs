//! End to end: `packaging/install.sh` into a private root (DESTDIR), as a
//! package build runs it: the files CIS 4.1.x names get their modes and
//! owners (config and kubeconfig 600 root:root, kinglet's dirs 700), and
//! a second install keeps the config and backs the binary up.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
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
