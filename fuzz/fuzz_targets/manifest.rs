//! The static pod manifest reader and every path kinglet builds from what
//! it accepts (log dir, volumes, sub paths, container mounts): never a
//! panic, never a path outside kinglet's dirs (`kinglet::pods::fuzz::check`
//! asserts it).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn base() -> &'static std::path::Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("manifests")).unwrap();
        d
    })
    .path()
}

fuzz_target!(|data: &[u8]| {
    kinglet::pods::fuzz::check(data, base());
});
