//! End to end: the image store against a real registry (Debian's
//! docker-registry) over HTTP, HTTPS with a test CA and basic auth; archives
//! made by skopeo; hostile archives; the import directory of a running
//! kinglet; kill -9 in the middle of a pull.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cutter::Cutter;
use common::oci::{Compression, Layer, Layout, compress, host_arch, skopeo_copy};
use common::registry::Registry;
use kinglet_runtime_oci::images::auth::{Credentials, RegistriesConfig};
use kinglet_runtime_oci::images::registry::Puller;
use kinglet_runtime_oci::images::{ImageStore, Index};

struct Cli {
    root: tempfile::TempDir,
    registries: PathBuf,
    /// Run as on a system without CA certificates (no `ca-certificates`).
    no_system_cas: bool,
}

impl Cli {
    fn new(registries_yaml: &str) -> Self {
        let root = tempfile::tempdir().unwrap();
        let registries = root.path().join("registries.yaml");
        std::fs::write(&registries, registries_yaml).unwrap();
        Cli {
            root,
            registries,
            no_system_cas: false,
        }
    }
    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kinglet"));
        if self.no_system_cas {
            // Where rustls-native-certs looks: nothing there.
            let empty = self.root.path().join("no-cas");
            std::fs::create_dir_all(&empty).unwrap();
            cmd.env("SSL_CERT_FILE", empty.join("none.pem"))
                .env("SSL_CERT_DIR", &empty);
        }
        cmd.arg("--root-dir")
            .arg(self.root.path().join("state"))
            .arg("--image-registry-config")
            .arg(&self.registries)
            .arg("images")
            .args(args)
            .output()
            .unwrap()
    }
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "kinglet images {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert_eq!(
            o.status.code(),
            Some(1),
            "kinglet images {args:?} should fail: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8_lossy(&o.stderr).into_owned()
    }
    fn store_dir(&self) -> PathBuf {
        self.root.path().join("state/images")
    }
    fn index(&self) -> Index {
        serde_json::from_slice(
            &std::fs::read(self.store_dir().join("index.json")).unwrap_or_else(|_| b"{}".to_vec()),
        )
        .unwrap_or_default()
    }
}

/// A two-layer image: the upper layer whites out a file and makes a
/// directory opaque; plus links and a file naming the architecture.
fn layered_image(
    layout: &Layout,
    arch: &str,
    variant: Option<&str>,
    c: Compression,
) -> common::oci::Built {
    let lower = Layer::default()
        .dir("etc/")
        .file("etc/os-release", b"ID=kinglet-test\n")
        .file("etc/removed", b"gone soon")
        .file("opaque/old", b"hidden by the upper layer")
        .file("bin/tool", b"#!/bin/sh\necho tool\n")
        .symlink("bin/sh", "tool")
        .hardlink("bin/tool-hard", "bin/tool");
    let upper = Layer::default()
        .file("etc/.wh.removed", b"")
        .file("opaque/.wh..wh..opq", b"")
        .file("opaque/new", b"from the upper layer")
        .file(
            "arch",
            format!(
                "{arch}{}",
                variant.map(|v| format!("/{v}")).unwrap_or_default()
            )
            .as_bytes(),
        );
    layout.image(arch, variant, &[(lower, c), (upper, c)])
}

fn check_rootfs(root: &Path, arch_line: &str) {
    assert_eq!(
        std::fs::read_to_string(root.join("arch")).unwrap(),
        arch_line
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/os-release")).unwrap(),
        "ID=kinglet-test\n"
    );
    assert!(!root.join("etc/removed").exists(), "whiteout ignored");
    assert!(!root.join("opaque/old").exists(), "opaque dir ignored");
    assert_eq!(
        std::fs::read_to_string(root.join("opaque/new")).unwrap(),
        "from the upper layer"
    );
    assert_eq!(
        std::fs::read_link(root.join("bin/sh")).unwrap(),
        Path::new("tool")
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(root.join("bin/tool")).unwrap().ino(),
        std::fs::metadata(root.join("bin/tool-hard")).unwrap().ino()
    );
}

/// Mounts the image's layers with overlayfs (as the runtime will), checks
/// the merged view, unmounts.
fn check_overlay(store: &ImageStore, id: &str, arch_line: &str) {
    let index = store.read_index().unwrap();
    let rec = &index.images[id];
    let mut lowers: Vec<String> = store
        .layer_dirs(rec)
        .unwrap()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    lowers.reverse();
    let mnt = tempfile::tempdir().unwrap();
    let st = Command::new("mount")
        .args([
            "-t",
            "overlay",
            "overlay",
            "-o",
            &format!("lowerdir={}", lowers.join(":")),
        ])
        .arg(mnt.path())
        .status()
        .unwrap();
    assert!(st.success(), "overlay mount failed");
    let r = std::panic::catch_unwind(|| check_rootfs(mnt.path(), arch_line));
    Command::new("umount").arg(mnt.path()).status().unwrap();
    r.unwrap();
}

#[test]
fn pulls_multi_arch_indexes_over_http_with_layers_intact() {
    let reg = Registry::start(false, None);
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let amd = layered_image(&layout, "amd64", None, Compression::Gzip);
    let arm64 = layered_image(&layout, "arm64", Some("v8"), Compression::Zstd);
    let armv7 = layered_image(&layout, "arm", Some("v7"), Compression::Gzip);
    layout.tag_index(
        "1.0",
        &[
            (&amd, "amd64", None),
            (&arm64, "arm64", Some("v8")),
            (&armv7, "arm", Some("v7")),
        ],
    );
    let reference = reg.push(src.path(), "1.0", "test/multi");

    let cli = Cli::new("");
    let out = cli.ok(&["pull", &reference]);
    assert!(out.contains("pulled"), "{out}");
    let index = cli.index();
    let want = match host_arch() {
        "amd64" => &amd,
        "arm64" => &arm64,
        _ => &armv7,
    };
    let img = &index.images[&want.config_digest];
    assert_eq!(index.names[&reference], want.config_digest);
    assert_eq!(img.manifest, want.manifest_digest);
    assert_eq!(
        img.layers
            .iter()
            .map(|l| l.diff_id.clone())
            .collect::<Vec<_>>(),
        want.diff_ids
    );
    assert!(
        img.repo_digests
            .contains(&format!("{}/test/multi@{}", reg.host, want.manifest_digest))
    );

    let ls = cli.ok(&["ls"]);
    assert!(
        ls.contains(&format!("{}/test/multi", reg.host)) && ls.contains("1.0"),
        "{ls}"
    );

    // The same content by digest is already there; nothing is fetched again.
    let gets = reg.blob_gets(&img.layers[0].blob);
    cli.ok(&[
        "pull",
        &format!("{}/test/multi@{}", reg.host, want.manifest_digest),
    ]);
    assert_eq!(reg.blob_gets(&img.layers[0].blob), gets);

    let store = ImageStore::open(cli.store_dir()).unwrap();
    let arch_line = match host_arch() {
        "amd64" => "amd64".to_string(),
        "arm64" => "arm64/v8".into(),
        _ => "arm/v7".into(),
    };
    // The copy fallback and overlayfs give the same tree.
    let flat = tempfile::tempdir().unwrap();
    store.flatten(img, flat.path()).unwrap();
    check_rootfs(flat.path(), &arch_line);
    if store.uses_overlay() {
        check_overlay(&store, &want.config_digest, &arch_line);
    }

    // Errors are typed like upstream's reasons.
    let missing = cli.fails(&["pull", &format!("{}/test/multi:nope", reg.host)]);
    assert!(missing.contains("not found"), "{missing}");
    let bad = cli.fails(&["pull", "UPPER/Case::bad"]);
    assert!(bad.contains("couldn't parse image name"), "{bad}");

    // rm drops the name, then the content.
    cli.ok(&["rm", &reference]);
    let left = std::fs::read_dir(cli.store_dir().join("layers/sha256"))
        .unwrap()
        .count();
    assert!(cli.index().images.is_empty());
    assert_eq!(left, 0, "layers left after rm");
}

#[test]
fn pulls_over_https_with_a_test_ca_and_basic_auth() {
    let reg = Registry::start(true, Some(("edge", "s3cret")));
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let b = layered_image(&layout, host_arch(), None, Compression::Gzip);
    layout.tag_image("v1", &b);
    let reference = reg.push(src.path(), "v1", "private/app");

    let good = format!(
        "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n    auth:\n      username: edge\n      password: s3cret\n",
        reg.host,
        reg.ca().display()
    );
    let cli = Cli::new(&good);
    cli.ok(&["pull", &reference]);
    assert!(cli.index().images.contains_key(&b.config_digest));

    // Credentials given on the command line (as pull secrets are) work too.
    let ca_only = format!(
        "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
        reg.host,
        reg.ca().display()
    );
    let cli2 = Cli::new(&ca_only);
    let err = cli2.fails(&["pull", &reference]);
    assert!(err.contains("unauthorized"), "{err}");
    let err = cli2.fails(&["pull", "--creds", "edge:wrong", &reference]);
    eprintln!("wrong password: {err}");
    assert!(err.contains("unauthorized"), "{err}");
    cli2.ok(&["pull", "--creds", "edge:s3cret", &reference]);

    // Without the CA, TLS fails.
    let cli3 = Cli::new("");
    let err = cli3.fails(&["pull", "--creds", "edge:s3cret", &reference]);
    eprintln!("no CA: {err}");
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(cli3.index().images.is_empty());
}

/// A minimal system (Debian's minbase, many Yocto images) has no CA
/// certificates: found in the VM lab, where every pull panicked the agent
/// (reqwest's platform verifier refuses to build, oci-client's
/// `Client::new` panics). Plain HTTP and a registry with a configured CA
/// must work there; another HTTPS registry fails verification, not the
/// process.
#[test]
fn a_system_without_ca_certificates_pulls_without_panicking() {
    let plain = Registry::start(false, None);
    let tls = Registry::start(true, None);
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let b = layered_image(&layout, host_arch(), None, Compression::Gzip);
    layout.tag_image("v1", &b);
    let over_http = plain.push(src.path(), "v1", "minimal/app");
    let over_tls = tls.push(src.path(), "v1", "minimal/app");

    let mut cli = Cli::new("");
    cli.no_system_cas = true;
    cli.ok(&["pull", &over_http]);
    assert!(cli.index().images.contains_key(&b.config_digest));
    let err = cli.fails(&["pull", &over_tls]);
    eprintln!("no system CAs, none configured: {err}");
    assert!(err.contains("invalid peer certificate"), "{err}");

    let with_ca = format!(
        "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
        tls.host,
        tls.ca().display()
    );
    let mut cli2 = Cli::new(&with_ca);
    cli2.no_system_cas = true;
    cli2.ok(&["pull", &over_tls]);
    assert!(cli2.index().images.contains_key(&b.config_digest));
}

#[test]
fn a_corrupted_blob_is_rejected_by_digest() {
    let reg = Registry::start(false, None);
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let b = layered_image(&layout, host_arch(), None, Compression::Gzip);
    layout.tag_image("v1", &b);
    let reference = reg.push(src.path(), "v1", "test/corrupt");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            src.path()
                .join("blobs/sha256")
                .join(&b.manifest_digest[7..]),
        )
        .unwrap(),
    )
    .unwrap();
    let layer = manifest["layers"][1]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let file = reg.blob_file(&layer);
    let mut data = std::fs::read(&file).unwrap();
    let n = data.len();
    data[n / 2] ^= 0xff;
    std::fs::write(&file, data).unwrap();

    let cli = Cli::new("");
    let err = cli.fails(&["pull", &reference]);
    assert!(err.to_lowercase().contains("digest"), "{err}");
    assert!(cli.index().images.is_empty());
    assert!(
        !cli.store_dir()
            .join("blobs/sha256")
            .join(&layer[7..])
            .exists(),
        "corrupt blob kept"
    );
}

#[test]
fn imports_docker_save_and_oci_archives_plain_gzip_and_zstd() {
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let b = layered_image(&layout, host_arch(), None, Compression::Gzip);
    layout.tag_image("v1", &b);
    let work = tempfile::tempdir().unwrap();
    let oci_tar = work.path().join("app-oci.tar");
    let docker_tar = work.path().join("app-docker.tar");
    skopeo_copy(
        &format!("oci:{}:v1", src.path().display()),
        &format!("oci-archive:{}:example.com/edge/app:v1", oci_tar.display()),
        &[],
    );
    skopeo_copy(
        &format!("oci:{}:v1", src.path().display()),
        &format!(
            "docker-archive:{}:example.com/edge/legacy:v2",
            docker_tar.display()
        ),
        &[],
    );

    let cli = Cli::new("");
    let raw = std::fs::read(&docker_tar).unwrap();
    let gz = work.path().join("legacy.tar.gz");
    std::fs::write(&gz, compress(&raw, Compression::Gzip)).unwrap();
    let zst = work.path().join("app.tar.zst");
    std::fs::write(
        &zst,
        compress(&std::fs::read(&oci_tar).unwrap(), Compression::Zstd),
    )
    .unwrap();

    for f in [&oci_tar, &docker_tar, &gz, &zst] {
        let out = cli.ok(&["import", f.to_str().unwrap()]);
        assert!(out.contains("imported"), "{out}");
    }
    let index = cli.index();
    assert_eq!(index.names["example.com/edge/app:v1"], b.config_digest);
    // docker save stores layers uncompressed: same image ID, new layer blobs.
    assert_eq!(index.names["example.com/edge/legacy:v2"], b.config_digest);
    let img = &index.images[&b.config_digest];
    assert_eq!(
        img.layers
            .iter()
            .map(|l| l.diff_id.clone())
            .collect::<Vec<_>>(),
        b.diff_ids
    );
    let store = ImageStore::open(cli.store_dir()).unwrap();
    let flat = tempfile::tempdir().unwrap();
    store.flatten(img, flat.path()).unwrap();
    check_rootfs(flat.path(), host_arch());
}

/// Writes a tar by hand (raw names) for hostile-archive tests.
fn raw_tar(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut l = Layer::default();
    for (n, d) in entries {
        l = l.file(n, d);
    }
    l.tar()
}

#[test]
fn hostile_archives_write_nothing_outside_the_store() {
    let cli = Cli::new("");
    let sentinel = cli.root.path().join("outside");
    std::fs::create_dir_all(&sentinel).unwrap();
    let work = tempfile::tempdir().unwrap();

    // `..` in the archive itself.
    let a = work.path().join("dotdot.tar");
    std::fs::write(
        &a,
        raw_tar(&[("../../outside/evil", b"x"), ("index.json", b"{}")]),
    )
    .unwrap();
    let err = cli.fails(&["import", a.to_str().unwrap()]);
    assert!(err.contains("'..'"), "{err}");

    // A valid image whose layer escapes by `..`, by an absolute path and by
    // symlinks: `..` refuses the layer; the others stay inside the layer dir.
    // A hard link to a host file is refused and says why; a layer past the
    // size budget (set low here by the flag) too, without filling the disk.
    std::fs::write(sentinel.join("victim"), b"safe").unwrap();
    let out = sentinel.display().to_string();
    let big = vec![0u8; 2 << 20];
    for (tag, layer, refused, says) in [
        (
            "dotdot",
            Layer::default().file("../../../../outside/evil1", b"x"),
            true,
            "escapes",
        ),
        (
            "hardlink",
            Layer::default().hardlink("hl", &format!("{out}/victim")),
            true,
            "hard link to a file not in the image",
        ),
        (
            "bomb",
            Layer::default().file("zeros", &big),
            true,
            "layer is larger than 1048576 bytes uncompressed (the layer size limit of 1048576 bytes)",
        ),
        (
            "abs",
            Layer::default().file(&format!("{out}/evil2"), b"x"),
            false,
            "",
        ),
        (
            "symlink",
            Layer::default()
                .symlink("esc", "../../../../../../../../")
                .file(&format!("esc{out}/evil3"), b"x")
                .symlink("abs", &out)
                .file("abs/evil4", b"x"),
            false,
            "",
        ),
    ] {
        let src = tempfile::tempdir().unwrap();
        let mut layout = Layout::new(src.path());
        let b = layout.image(host_arch(), None, &[(layer, Compression::Gzip)]);
        layout.tag_image(tag, &b);
        let tarf = work.path().join(format!("{tag}.tar"));
        skopeo_copy(
            &format!("oci:{}:{tag}", src.path().display()),
            &format!("oci-archive:{}:hostile/{tag}:1", tarf.display()),
            &[],
        );
        let o = cli.run(&[
            "--image-max-layer-size",
            "1Mi",
            "import",
            tarf.to_str().unwrap(),
        ]);
        assert_eq!(
            !o.status.success(),
            refused,
            "{tag}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        if refused {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(says), "{tag}: {err}");
        }
    }
    assert_eq!(
        std::fs::read_dir(&sentinel).unwrap().count(),
        1,
        "something was written outside"
    );
    assert_eq!(std::fs::read(sentinel.join("victim")).unwrap(), b"safe");
    // Nothing half-imported: only the two accepted images, no tmp left,
    // and no blob of a refused import.
    let index = cli.index();
    assert_eq!(index.names.len(), 2, "{:?}", index.names);
    let referenced: std::collections::BTreeSet<String> = index
        .images
        .values()
        .flat_map(|i| {
            let layers = i.layers.iter().map(|l| l.blob.clone());
            [i.id.clone(), i.manifest.clone()].into_iter().chain(layers)
        })
        .map(|d| d.trim_start_matches("sha256:").to_string())
        .collect();
    let blobs: std::collections::BTreeSet<String> =
        std::fs::read_dir(cli.store_dir().join("blobs/sha256"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
    assert_eq!(blobs, referenced, "blobs a refused import left");
    assert_eq!(
        std::fs::read_dir(cli.store_dir().join("tmp"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn the_import_dir_of_a_running_kinglet_picks_up_archives() {
    let k = common::Kinglet::standalone(&common::unique_name("kl-import"), "", &[]);
    let root = k.dir.path().join("root");
    let import = root.join("images/import");
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let b = layered_image(&layout, host_arch(), None, Compression::Zstd);
    layout.tag_image("v1", &b);
    let work = tempfile::tempdir().unwrap();
    let tarf = work.path().join("dropped.tar");
    skopeo_copy(
        &format!("oci:{}:v1", src.path().display()),
        &format!("oci-archive:{}:example.com/dropped:v1", tarf.display()),
        &[],
    );

    common::wait_for("import dir", Duration::from_secs(10), || async {
        import.is_dir().then_some(())
    })
    .await;
    // Copy under a temporary name, then rename: the way to drop a file in.
    std::fs::copy(&tarf, import.join("dropped.tar.part")).unwrap();
    std::fs::rename(import.join("dropped.tar.part"), import.join("dropped.tar")).unwrap();
    std::fs::write(import.join("garbage.tar"), b"this is not an archive").unwrap();

    let store_dir = root.join("images");
    common::wait_for("imported image", Duration::from_secs(20), || async {
        let idx: Index =
            serde_json::from_slice(&std::fs::read(store_dir.join("index.json")).ok()?).ok()?;
        idx.names
            .contains_key("example.com/dropped:v1")
            .then_some(())
    })
    .await;
    assert!(
        !import.join("dropped.tar").exists(),
        "imported archive left in place"
    );
    common::wait_for(
        "rejected archive moved aside",
        Duration::from_secs(10),
        || async {
            import
                .join("failed/garbage.tar.error")
                .exists()
                .then_some(())
        },
    )
    .await;
    assert!(!import.join("garbage.tar").exists());
    // The CLI sees the running agent's store.
    let out = Command::new(env!("CARGO_BIN_EXE_kinglet"))
        .args(["images", "ls", "--root-dir"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("example.com/dropped"));
}

#[test]
fn kill_9_during_a_pull_leaves_a_consistent_store() {
    let reg = Registry::start(false, None);
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    // 48 MiB that does not compress: the pull takes long enough to interrupt.
    let big = noise(48 << 20);
    let b = layout.image(
        host_arch(),
        None,
        &[(Layer::default().file("big", &big), Compression::Gzip)],
    );
    layout.tag_image("big", &b);
    let reference = reg.push(src.path(), "big", "test/big");

    let cli = Cli::new("");
    let mut killed_mid_way = false;
    let mut kept = 0;
    for attempt in 0..5 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kinglet"))
            .arg("--root-dir")
            .arg(cli.root.path().join("state"))
            .args(["images", "pull", &reference])
            .spawn()
            .unwrap();
        // Wait until the layer is partly on disk (downloaded or unpacked),
        // then SIGKILL.
        let tmp = cli.store_dir().join("tmp");
        let start = Instant::now();
        loop {
            let partial = partial_bytes(&cli) > 0
                || std::fs::read_dir(&tmp)
                    .ok()
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|d| d.path().join("fs").exists());
            if partial
                || start.elapsed() > Duration::from_secs(20)
                || child.try_wait().unwrap().is_some()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = child.kill();
        let st = child.wait().unwrap();
        if !st.success() {
            killed_mid_way = true;
            kept = partial_bytes(&cli);
            eprintln!(
                "figure: pull killed after {:?} (attempt {attempt})",
                start.elapsed()
            );
            break;
        }
    }
    assert!(
        killed_mid_way,
        "the pull always finished before it could be killed"
    );

    // The next user of the store finds it consistent and cleans up.
    let ls = cli.ok(&["ls"]);
    assert!(!ls.contains("test/big"), "half-pulled image listed:\n{ls}");
    assert_eq!(
        std::fs::read_dir(cli.store_dir().join("tmp"))
            .unwrap()
            .count(),
        0,
        "tmp not cleaned"
    );
    for d in ["blobs/sha256", "layers/sha256"] {
        for e in std::fs::read_dir(cli.store_dir().join(d))
            .unwrap()
            .flatten()
        {
            // Whatever made it into place is complete and verified.
            if d == "blobs/sha256" {
                let data = std::fs::read(e.path()).unwrap();
                assert_eq!(
                    common::oci::sha256(&data)[7..],
                    e.file_name().to_string_lossy(),
                    "torn blob"
                );
            }
        }
    }
    // A download the kill interrupted goes on from what it left.
    let out = cli.ok(&["pull", &reference]);
    assert!(
        out.contains(&format!(" {kept} resumed from disk")),
        "{kept} bytes were on disk: {out}"
    );
    eprintln!("figure: a pull after kill -9 resumed from {kept} bytes on disk");
    assert!(cli.index().names.contains_key(&reference));
    assert_eq!(partial_bytes(&cli), 0, "a partial download left");
}

/// Bytes of the store's partial downloads.
fn partial_bytes(cli: &Cli) -> u64 {
    std::fs::read_dir(cli.store_dir().join("partial"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// `n` bytes that do not compress (xorshift).
fn noise(n: usize) -> Vec<u8> {
    let mut big = vec![0u8; n];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for chunk in big.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    big
}

/// A layer download cut midway (a proxy on loopback closes the
/// connection) resumes within the same pull with an HTTP `Range` request
/// for the rest, and the blob is whole and verified. Figure: bytes
/// fetched for a 100 MiB image cut at 50 % and at 90 %, against a pull
/// that was not cut.
#[test]
fn a_cut_download_resumes_with_a_range_request() {
    let reg = Registry::start(false, None);
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let b = layout.image(
        host_arch(),
        None,
        &[(
            Layer::default().file("big", &noise(100 << 20)),
            Compression::None,
        )],
    );
    layout.tag_image("big", &b);
    let pushed = reg.push(src.path(), "big", "test/resume");
    // As the registry has it (skopeo compresses a plain tar layer).
    let raw = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{pushed}"))
        .output()
        .unwrap();
    assert!(raw.status.success(), "skopeo inspect: {raw:?}");
    let manifest: serde_json::Value = serde_json::from_slice(&raw.stdout).unwrap();
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let size = manifest["layers"][0]["size"].as_u64().unwrap();
    let cut = Cutter::start(&reg.host);
    let reference = format!("{}/test/resume:big", cut.host);
    let config = format!("configs:\n  \"{}\":\n    plain_http: true\n", cut.host);
    let mut fetched = Vec::new();
    // The last: cut at 50 % behind a proxy that drops `Range` headers.
    for (pct, ranges) in [
        (None, true),
        (Some(50), true),
        (Some(90), true),
        (Some(50), false),
    ] {
        let cli = Cli::new(&config);
        let at = pct.map(|p| size * p / 100);
        if let Some(at) = at {
            cut.arm(&layer, at);
        }
        cut.drop_ranges(!ranges);
        let out = cli.ok(&["pull", &reference]);
        let gets = blob_requests(&cut, &layer, if at.is_some() { 2 } else { 1 });
        let total: u64 = gets.iter().map(|g| g.body).sum();
        match at {
            None => assert_eq!(gets[0].body, size, "{gets:?}"),
            Some(at) if !ranges => {
                // Answered in full (200): from the start again, and the
                // bytes on disk are not counted as reused.
                assert_eq!(gets[0].body, at, "the cut: {gets:?}");
                assert_eq!(gets[1].status, "200", "{gets:?}");
                assert_eq!(total, at + size, "{gets:?}");
                assert!(out.contains(" 0 resumed from disk"), "{out}");
            }
            Some(at) => {
                assert_eq!(gets[0].body, at, "the cut: {gets:?}");
                assert_eq!(
                    gets[1].range.as_deref(),
                    Some(format!("bytes={at}-").as_str()),
                    "{gets:?}"
                );
                assert_eq!(gets[1].status, "206", "{gets:?}");
                assert_eq!(total, size, "every byte fetched once: {gets:?}");
            }
        }
        assert!(out.contains(&format!("{total} bytes fetched")), "{out}");
        assert!(cli.index().names.contains_key(&reference));
        assert!(
            cli.store_dir()
                .join("blobs/sha256")
                .join(&layer[7..])
                .is_file()
        );
        assert_eq!(partial_bytes(&cli), 0, "a partial download left");
        fetched.push(total);
    }
    eprintln!(
        "figure: resumed pull of a {size}-byte layer: {} bytes fetched uncut, {} cut at 50 %, {} cut at 90 %; {} cut at 50 % where ranges are ignored (from zero again)",
        fetched[0], fetched[1], fetched[2], fetched[3],
    );
}

/// The proxy's GETs of blob `digest`, once `n` of them have ended.
fn blob_requests(cut: &Cutter, digest: &str, n: usize) -> Vec<common::cutter::Seen> {
    let mut gets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut others = Vec::new();
    while gets.len() < n && Instant::now() < deadline {
        let (blob, other): (Vec<_>, Vec<_>) = cut
            .take()
            .into_iter()
            .partition(|s| s.path.ends_with(digest));
        gets.extend(blob);
        others.extend(other);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        gets.len(),
        n,
        "requests of the layer: {gets:?}, others: {others:?}"
    );
    // In the order of the offsets they asked for.
    gets.sort_by_key(|g| {
        g.range
            .as_deref()
            .and_then(|r| {
                r.strip_prefix("bytes=")?
                    .split('-')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    });
    gets
}

#[tokio::test]
async fn concurrent_pulls_share_one_download_and_gc_spares_images_in_use() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let reg = Registry::start(false, None);
    let src = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(src.path());
    let shared = Layer::default().file("shared", &vec![7u8; 1 << 20]);
    let a = layout.image(
        host_arch(),
        None,
        &[
            (shared.clone(), Compression::Gzip),
            (Layer::default().file("a", b"a"), Compression::Gzip),
        ],
    );
    let b = layout.image(
        host_arch(),
        None,
        &[
            (shared, Compression::Gzip),
            (Layer::default().file("b", b"b"), Compression::Gzip),
        ],
    );
    layout.tag_image("a", &a);
    layout.tag_image("b", &b);
    let ra = reg.push(src.path(), "a", "test/a");
    let rb = reg.push(src.path(), "b", "test/b");

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ImageStore::open(dir.path().join("images")).unwrap());
    let puller = Puller::new(store.clone(), RegistriesConfig::default());
    let none: &[Credentials] = &[];
    let (x, y) = tokio::join!(puller.pull(&ra, none), puller.pull(&ra, none));
    assert_eq!(x.unwrap().id, y.unwrap().id);
    let idx = store.read_index().unwrap();
    let layer0 = &idx.images[&a.config_digest].layers[0].blob;
    assert_eq!(
        reg.blob_gets(layer0),
        1,
        "the shared layer was downloaded twice"
    );
    puller.pull(&rb, none).await.unwrap();
    assert_eq!(
        reg.blob_gets(layer0),
        1,
        "a layer already present was downloaded again"
    );

    // Thresholds of 0% force collection; the image in use survives, and the
    // layer it shares with the removed one stays.
    let in_use = HashSet::from([b.config_digest.clone()]);
    let removed = store.gc(0, 0, &in_use, Duration::ZERO).unwrap();
    assert_eq!(removed, vec![a.config_digest.clone()]);
    let idx = store.read_index().unwrap();
    assert!(
        idx.images.contains_key(&b.config_digest) && !idx.images.contains_key(&a.config_digest)
    );
    assert!(store.has_blob(layer0), "shared layer removed");
    let a_top = &a.diff_ids[1];
    assert!(
        !store.layer_path(a_top).unwrap().exists(),
        "unreferenced layer kept"
    );
}
