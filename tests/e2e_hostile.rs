//! End to end: hostile and mistyped static pod manifests against a running
//! kinglet (in-process runtime, standalone), as a user meets them. Each
//! manifest below was accepted before validation existed and wrote outside
//! kinglet's dirs, or cost the node gigabytes. The sweep checks that:
//! nothing appears outside kinglet's dirs, the good pod next to them still
//! runs, `/healthz` stays ok and kinglet stays small, each refusal is
//! logged with upstream's field error, and no file under the root or log
//! dir is readable by `nobody`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Kinglet;

/// What a kinglet pod record holds that this test reads.
#[derive(serde::Deserialize)]
struct PodRecord {
    name: String,
    status: k8s_openapi::api::core::v1::PodStatus,
}

fn write_manifest(dir: &Path, file: &str, body: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The pod records under kinglet's root (not the markers beside them).
fn pod_records(root: &Path) -> Vec<PathBuf> {
    tree(&root.join("pods"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect()
}

/// Every entry under `dir`, recursively.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(tree(&e.path()));
        }
    }
    out
}

/// The hostile manifests, named for what they try; `t` is the target dir
/// outside kinglet's that none may touch.
fn hostile(t: &str) -> Vec<(&'static str, String)> {
    let pod = |meta: &str, spec: &str| {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {meta}\nspec: {spec}\n")
    };
    let c = "{name: c, image: kinglet.test/busybox:1, command: [sleep, '3600']}";
    let many: Vec<String> = (0..10_000)
        .map(|i| format!("{{name: c{i}, image: kinglet.test/busybox:1}}"))
        .collect();
    vec![
        (
            "abs-container.yaml",
            pod(
                "{name: abs}",
                &format!("{{containers: [{{name: {t}/c, image: kinglet.test/busybox:1}}]}}"),
            ),
        ),
        (
            "climbing-container.yaml",
            pod(
                "{name: climb}",
                &format!(
                    "{{containers: [{{name: ../../../../../../..{t}/c2, image: kinglet.test/busybox:1}}]}}"
                ),
            ),
        ),
        (
            "climbing-namespace.yaml",
            pod(
                &format!("{{name: ns, namespace: ../../../../../../..{t}/ns}}"),
                &format!("{{containers: [{c}]}}"),
            ),
        ),
        (
            "climbing-pod-name.yaml",
            pod(
                &format!("{{name: ../../../../..{t}/p}}"),
                &format!("{{containers: [{c}]}}"),
            ),
        ),
        (
            "climbing-emptydir.yaml",
            pod(
                "{name: vol}",
                &format!(
                    "{{containers: [{{name: c, image: kinglet.test/busybox:1, command: [sleep, '3600'], volumeMounts: [{{name: v, mountPath: /v}}]}}], volumes: [{{name: '../../../../../../..{t}/vol', emptyDir: {{}}}}]}}"
                ),
            ),
        ),
        (
            "climbing-hostpath.yaml",
            pod(
                "{name: hp}",
                &format!(
                    "{{containers: [{{name: c, image: kinglet.test/busybox:1, command: [sleep, '3600'], volumeMounts: [{{name: h, mountPath: /h}}]}}], volumes: [{{name: h, hostPath: {{path: '{t}/../{}/hp', type: DirectoryOrCreate}}}}]}}",
                    Path::new(t).file_name().unwrap().to_string_lossy()
                ),
            ),
        ),
        (
            "climbing-subpath.yaml",
            pod(
                "{name: sub}",
                &format!(
                    "{{containers: [{{name: c, image: kinglet.test/busybox:1, command: [sleep, '3600'], volumeMounts: [{{name: v, mountPath: /v, subPath: '../../../../../../..{t}/sub'}}]}}], volumes: [{{name: v, emptyDir: {{}}}}]}}"
                ),
            ),
        ),
        (
            "upper-case.yaml",
            pod("{name: Web Server}", &format!("{{containers: [{c}]}}")),
        ),
        (
            "duplicate-containers.yaml",
            pod("{name: dup}", &format!("{{containers: [{c}, {c}]}}")),
        ),
        (
            "ten-thousand-containers.yaml",
            pod(
                "{name: huge}",
                &format!("{{containers: [{}]}}", many.join(", ")),
            ),
        ),
        // The same pod name as the good one, in a later file.
        (
            "zz-good-again.yaml",
            pod("{name: good}", &format!("{{containers: [{c}]}}")),
        ),
    ]
}

#[tokio::test]
async fn hostile_static_manifests_write_nothing_outside_and_leak_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&manifests).unwrap();
    // Outside kinglet's dirs: nothing may ever appear in it.
    let target = tempfile::Builder::new()
        .prefix("kinglet-hostile-")
        .tempdir_in("/tmp")
        .unwrap();
    let t = target.path().to_str().unwrap().to_string();
    let mut k = Kinglet::start_rt(
        common::Rt::Oci,
        &common::unique_name("kl-hostile"),
        &format!("staticPodPath: {}\n", manifests.display()),
        false,
        &["--pod-log-dir", logs.to_str().unwrap()],
        &[common::pods::busybox_archive()],
    );
    let secret = format!("SECRET-{}", std::process::id());
    // The good pod first, with a value only root may ever read on disk,
    // limits the apiserver accepts but that broke container creation (a
    // 1m CPU limit under the kernel's minimum quota, a 9Ei memory limit past
    // i64), and a subPathExpr from its own name.
    write_manifest(
        &manifests,
        "good.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: good}}\nspec: {{containers: [{{name: c, image: kinglet.test/busybox:1, command: [sleep, '3600'], resources: {{requests: {{cpu: 1m, memory: 1Mi}}, limits: {{cpu: 1m, memory: 9Ei}}}}, env: [{{name: TOKEN, value: {secret}}}, {{name: POD, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}], volumeMounts: [{{name: data, mountPath: /data, subPathExpr: '$(POD)'}}]}}], volumes: [{{name: data, emptyDir: {{}}}}]}}\n"
        ),
    );
    for (file, body) in hostile(&t) {
        write_manifest(&manifests, file, &body);
    }
    let root = k.dir.path().join("root");
    let good = format!("good-{}", k.name);
    let record = common::wait_for("the good pod running", Duration::from_secs(60), || async {
        std::fs::read_dir(root.join("pods"))
            .ok()?
            .flatten()
            .find_map(|e| {
                let r: PodRecord = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                (r.name == good && r.status.phase.as_deref() == Some("Running")).then_some(r)
            })
    })
    .await;
    assert_eq!(record.name, good);
    // The subPathExpr expanded to the pod's name, inside its emptyDir.
    let sub = tree(&root.join("volumes"))
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == good.as_str()));
    assert!(
        sub.as_ref()
            .is_some_and(|p| p.parent().is_some_and(|d| d.ends_with("data"))),
        "no subPathExpr dir: {:?}",
        tree(&root.join("volumes"))
    );

    // Each hostile manifest was refused by name, with upstream's field error.
    let log = k.log();
    for want in [
        "abs-container.yaml: spec.containers[0].name: Invalid value",
        "climbing-container.yaml: spec.containers[0].name: Invalid value",
        "climbing-namespace.yaml: metadata.namespace: Invalid value",
        "climbing-pod-name.yaml: metadata.name: Invalid value",
        "climbing-emptydir.yaml: [spec.volumes[0].name: Invalid value",
        "climbing-hostpath.yaml: spec.volumes[0].hostPath.path: Invalid value",
        "climbing-subpath.yaml: spec.containers[0].volumeMounts[0].subPath: Invalid value",
        "upper-case.yaml: metadata.name: Invalid value",
        "duplicate-containers.yaml: spec.containers[1].name: Duplicate value",
        "ten-thousand-containers.yaml: spec.containers: Too many: 10000",
        "an earlier file (in name order) defines a pod of that name",
    ] {
        assert!(log.contains(want), "kinglet did not log {want:?}:\n{log}");
    }
    // Only the good pod has a record: none of the others ever ran.
    let records = pod_records(&root).len();
    assert_eq!(records, 1, "records: {:?}", tree(&root.join("pods")));
    assert_eq!(k.healthz().await, Some(200));
    let rss = rss_kib(k.pid());
    println!(
        "figure: kinglet RSS after the hostile sweep (10,000-container manifest included): {rss} KiB"
    );
    assert!(rss < 256 * 1024, "kinglet grew to {rss} KiB");

    // Nothing outside kinglet's dirs.
    assert!(
        tree(target.path()).is_empty(),
        "written outside: {:?}",
        tree(target.path())
    );

    // No file under the root or the log dir is readable by nobody, and the
    // secret is found by root only.
    let as_nobody = |args: &[&str]| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args)
            .output()
            .unwrap()
    };
    let found = as_nobody(&[
        "grep",
        "-rl",
        &secret,
        root.to_str().unwrap(),
        logs.to_str().unwrap(),
    ]);
    assert!(
        String::from_utf8_lossy(&found.stdout).trim().is_empty(),
        "nobody read the secret in: {}",
        String::from_utf8_lossy(&found.stdout)
    );
    let as_root = std::process::Command::new("grep")
        .args(["-rl", &secret, root.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&as_root.stdout).trim().is_empty(),
        "the secret should be on disk for root (the container's config): the check above proves nothing otherwise"
    );
    for f in tree(&logs).iter().filter(|p| p.is_file()) {
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(f).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o640, "{}", f.display());
    }
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&root).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "root dir");

    // Removing the manifests: the good pod goes, and still nothing outside.
    for e in std::fs::read_dir(&manifests).unwrap().flatten() {
        std::fs::remove_file(e.path()).unwrap();
    }
    common::wait_for("the good pod gone", Duration::from_secs(60), || async {
        pod_records(&root).is_empty().then_some(())
    })
    .await;
    assert!(tree(target.path()).is_empty());
    k.terminate(Duration::from_secs(10));
    common::pods::cleanup_root(&root);
}
