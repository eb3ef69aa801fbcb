//! A fuzz target for the static manifest reader: [`check`] takes any bytes
//! as a manifest, and whatever the file source accepts of them goes through
//! every path builder that creates something on the host (the log dir,
//! emptyDir volumes, sub paths), which must stay under kinglet's dirs. The
//! driver below mutates seed manifests with hostile names and runs it
//! deterministically in the unit tests (`KINGLET_FUZZ_ITERS` runs longer);
//! the offline-autonomy work can feed it from a coverage-guided fuzzer.

use std::path::Path;

/// What one input reached.
#[derive(Debug, Default)]
pub struct Reached {
    /// The file source accepted the manifest.
    pub accepted: bool,
    /// A sub path was refused for leaving its volume.
    pub sub_path_refused: bool,
}

/// One input: never panics, never creates a path outside `base`'s `root`.
pub fn check(bytes: &[u8], base: &Path) -> Reached {
    let mut reached = Reached::default();
    let manifests = base.join("manifests");
    let root = base.join("root");
    let file = manifests.join("fuzz.yaml");
    std::fs::write(&file, bytes).unwrap();
    let Ok(mut pod) = super::config::file::load_manifest(&file, "node") else {
        return reached;
    };
    reached.accepted = true;
    // hostPath volumes are the host by design: not kinglet-built paths.
    if let Some(vols) = pod.spec.as_mut().and_then(|s| s.volumes.as_mut()) {
        vols.retain(|v| v.host_path.is_none());
    }
    let node = crate::pods::util::NodeFacts {
        node_name: "node".into(),
        log_root: root.join("logs").display().to_string(),
        volume_root: root.join("volumes").display().to_string(),
        ..Default::default()
    };
    let under = |p: &str| {
        let p = Path::new(p);
        p.starts_with(&root) && !p.components().any(|c| c == std::path::Component::ParentDir)
    };
    let dir = crate::pods::util::log_directory(&pod, &node.log_root);
    assert!(
        under(&dir),
        "log dir {dir} from {:?}",
        String::from_utf8_lossy(bytes)
    );
    if let Ok(paths) = crate::pods::volumes::host::volume_paths(&pod, &node) {
        for (p, _) in paths.values() {
            assert!(
                under(p),
                "volume {p} from {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let _ = crate::pods::volumes::host::prepare_volumes(&pod, &node);
    }
    let objects = crate::pods::objects::EnvObjects::default();
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        match crate::pods::kuberuntime::container::container_config(&pod, c, 0, &node, &objects) {
            Ok((cfg, sub_paths)) => {
                for s in &sub_paths {
                    let t = s.target.display().to_string();
                    assert!(under(&t), "sub path target {t}");
                }
                let log = Path::new(&dir).join(&cfg.log_path);
                assert!(under(&log.display().to_string()), "log {}", log.display());
                for m in &cfg.mounts {
                    assert!(
                        under(&m.host_path),
                        "mount {} from {:?}",
                        m.host_path,
                        String::from_utf8_lossy(bytes)
                    );
                }
            }
            Err(e) if e.0.contains("subPath") => reached.sub_path_refused = true,
            Err(_) => {}
        }
    }
    reached
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeds with placeholders: `%n` pod name, `%s` namespace, `%c`
    /// container, `%d` the value of `D` (expanded into a subPathExpr), `%v`
    /// volume, `%p` subPath. Each is filled with its default or a token.
    const SEEDS: &[&str] = &[
        "apiVersion: v1\nkind: Pod\nmetadata: {name: %n, namespace: %s}\nspec: {containers: [{name: %c, image: i, env: [{name: D, value: %d}], volumeMounts: [{name: %v, mountPath: /v, subPath: %p}, {name: %v, mountPath: /w, subPathExpr: '$(D)/x'}]}], volumes: [{name: %v, emptyDir: {}}]}\n",
        "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":%n},\"spec\":{\"initContainers\":[{\"name\":%c,\"image\":\"i\"}],\"containers\":[{\"name\":\"main\",\"image\":\"i\",\"env\":[{\"name\":\"D\",\"value\":%d}],\"volumeMounts\":[{\"name\":%v,\"mountPath\":\"/p\",\"subPathExpr\":\"$(D)\"}]}],\"volumes\":[{\"name\":%v,\"projected\":{}}]}}",
    ];
    const DEFAULTS: &[(&str, &str)] = &[
        ("%n", "web"),
        ("%s", "edge"),
        ("%c", "c"),
        ("%d", "d"),
        ("%v", "v"),
        ("%p", "sp"),
    ];

    /// Names a hostile or unlucky user would try.
    const TOKENS: &[&str] = &[
        "..",
        "../..",
        "/tmp/kinglet-fuzz-escape",
        "../../../../../../../../tmp/kinglet-fuzz-escape",
        ".",
        "",
        "a/b",
        "$(D)",
        "$(D)/../..",
        "\u{0}",
        "UPPER",
        "a b",
        "x\n",
        "-a-",
        "ä",
        "/",
        "//",
        "a..b",
        "9",
        "c",
        "ok/../..",
    ];

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A seed with each placeholder filled (a third of them with a token),
    /// and now and then a byte flipped.
    fn mutate(rng: &mut Rng) -> Vec<u8> {
        let mut s = SEEDS[rng.below(SEEDS.len())].to_string();
        for (ph, default) in DEFAULTS {
            let v = if rng.below(3) == 0 {
                TOKENS[rng.below(TOKENS.len())]
            } else {
                default
            };
            // A JSON string is valid YAML too.
            s = s.replace(ph, &serde_json::to_string(v).unwrap());
        }
        let mut b = s.into_bytes();
        if rng.below(8) == 0 && !b.is_empty() {
            let i = rng.below(b.len());
            b[i] = rng.next() as u8;
        }
        b
    }

    #[test]
    fn static_manifests_never_leave_the_root() {
        let iters: usize = std::env::var("KINGLET_FUZZ_ITERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000);
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(base.path().join("manifests")).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..iters {
            let r = check(&mutate(&mut rng), base.path());
            accepted += usize::from(r.accepted);
            refused += usize::from(r.sub_path_refused);
        }
        // Nothing next to root and manifests, nothing at the escape target:
        // no path left the root.
        assert!(!Path::new("/tmp/kinglet-fuzz-escape").exists());
        let mut top: Vec<String> = std::fs::read_dir(base.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        assert!(
            top.iter().all(|t| t == "manifests" || t == "root"),
            "{top:?}"
        );
        // The mutations must reach the builders, or the target tests nothing.
        assert!(
            accepted > iters / 20,
            "only {accepted} of {iters} inputs accepted"
        );
        // ... and hostile expansions reach the sub path check.
        assert!(refused > 0, "no subPathExpr escape was ever tried");
    }
}
