//! The static pod manifest reader and every path kinglet builds from what
//! it accepts (log dir, volumes, sub paths, container mounts): never a
//! panic, never a path outside kinglet's dirs (`kinglet::pods::fuzz::check`
//! asserts it).
#![no_main]

#[path = "../bodies/manifest.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
