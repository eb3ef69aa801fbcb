//! Layer unpacking: any bytes as a tar layer, applied both ways (overlay
//! whiteout markers, and whiteouts applied) into a fresh directory, under a
//! small budget. Never a panic, and nothing written outside the target:
//! the directory around it must hold only the target and its canary, the
//! canary unchanged.
//! (The body of fuzz_targets/layer.rs, shared with tests/fuzz_corpus.rs,
//! which replays the corpus through it.)

use std::sync::OnceLock;

use kinglet_runtime_oci::images::unpack::{Budget, Whiteouts, apply_layer};

fn base() -> &'static std::path::Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// One input; a panic is a finding.
pub fn run(data: &[u8]) {
    let base = base();
    let canary = base.join("canary");
    std::fs::write(&canary, b"canary").unwrap();
    let budget = Budget {
        bytes: 1 << 20,
        why: "fuzz".into(),
    };
    for whiteouts in [Whiteouts::Overlay, Whiteouts::Apply] {
        let dest = base.join("dest");
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::create_dir(&dest).unwrap();
        let _ = apply_layer(data, &dest, whiteouts, &budget);
        assert_eq!(
            entries(base),
            ["canary", "dest"],
            "written beside the target"
        );
        assert_eq!(std::fs::read(&canary).unwrap(), b"canary");
        let _ = std::fs::remove_dir_all(&dest);
    }
}
