//! A fuzz target for the static manifest reader: [`check`] takes any bytes
//! as a manifest, and whatever the file source accepts of them goes through
//! every path builder that creates something on the host (the log dir,
//! emptyDir volumes, sub paths), which must stay under kinglet's dirs. The
//! driver below mutates seed manifests with hostile names and runs it
//! deterministically in the unit tests (`KINGLET_FUZZ_ITERS` runs longer);
//! the offline-autonomy work can feed it from a coverage-guided fuzzer.

use std::path::Path;

use super::convert::{self, NodeContext};

/// One input: never panics, never creates a path outside `base`'s `root`.
pub fn check(bytes: &[u8], base: &Path) {
    let manifests = base.join("manifests");
    let root = base.join("root");
    let file = manifests.join("fuzz.yaml");
    std::fs::write(&file, bytes).unwrap();
    let Ok(mut pod) = super::file::load_manifest(&file, "node") else {
        return;
    };
    // hostPath volumes are the host by design: not kinglet-built paths.
    if let Some(vols) = pod.spec.as_mut().and_then(|s| s.volumes.as_mut()) {
        vols.retain(|v| v.host_path.is_none());
    }
    let node = NodeContext {
        node_name: "node".into(),
        log_root: root.join("logs").display().to_string(),
        volume_root: root.join("volumes").display().to_string(),
        ..Default::default()
    };
    let under = |p: &str| {
        let p = Path::new(p);
        p.starts_with(&root) && !p.components().any(|c| c == std::path::Component::ParentDir)
    };
    let dir = convert::log_directory(&pod, &node.log_root);
    assert!(
        under(&dir),
        "log dir {dir} from {:?}",
        String::from_utf8_lossy(bytes)
    );
    if let Ok(paths) = convert::volume_paths(&pod, &node) {
        for (p, _) in paths.values() {
            assert!(
                under(p),
                "volume {p} from {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let _ = convert::prepare_volumes(&pod, &node);
    }
    let objects = convert::EnvObjects::default();
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        if let Ok(cfg) = convert::container_config(&pod, c, 0, &node, &objects) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: &[&str] = &[
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: edge}\nspec: {containers: [{name: c, image: i, env: [{name: D, value: d}], volumeMounts: [{name: v, mountPath: /v, subPath: s}, {name: v, mountPath: /w, subPathExpr: '$(D)/x'}]}], volumes: [{name: v, emptyDir: {}}]}\n",
        "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"j\"},\"spec\":{\"initContainers\":[{\"name\":\"i\",\"image\":\"i\"}],\"containers\":[{\"name\":\"c\",\"image\":\"i\"}],\"volumes\":[{\"name\":\"p\",\"projected\":{}}]}}",
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

    /// A seed with some names, values or bytes replaced.
    fn mutate(rng: &mut Rng) -> Vec<u8> {
        let mut s = SEEDS[rng.below(SEEDS.len())].to_string();
        for _ in 0..1 + rng.below(4) {
            let words: Vec<&str> =
                ["web", "edge", "c", "i", "v", "s", "d", "/v", "j", "p"].to_vec();
            let w = words[rng.below(words.len())];
            let t = TOKENS[rng.below(TOKENS.len())];
            let quoted = format!("{t:?}");
            s = s.replacen(&format!(" {w},"), &format!(" {quoted},"), 1);
            s = s.replacen(&format!("\"{w}\""), &quoted, 1);
        }
        let mut b = s.into_bytes();
        if rng.below(4) == 0 && !b.is_empty() {
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
        let mut accepted = 0;
        for _ in 0..iters {
            let input = mutate(&mut rng);
            check(&input, base.path());
            if super::super::file::load_manifest(&base.path().join("manifests/fuzz.yaml"), "node")
                .is_ok()
            {
                accepted += 1;
            }
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
    }
}
