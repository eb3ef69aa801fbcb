//! The static pod manifest reader and every path kinglet builds from what
//! it accepts (log dir, volumes, sub paths, container mounts): never a
//! panic, never a path outside kinglet's dirs (`kinglet::pods::fuzz::check`
//! asserts it).
//! (The body of fuzz_targets/manifest.rs, shared with tests/fuzz_corpus.rs,
//! which replays the corpus through it.)

use std::sync::OnceLock;

fn base() -> &'static std::path::Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("manifests")).unwrap();
        d
    })
    .path()
}

/// One input; a panic is a finding.
pub fn run(data: &[u8]) {
    kinglet::pods::fuzz::check(data, base());
}
