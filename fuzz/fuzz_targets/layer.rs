//! Layer unpacking: any bytes as a tar layer, applied both ways (overlay
//! whiteout markers, and whiteouts applied) into a fresh directory, under a
//! small budget. Never a panic, and nothing written outside the target:
//! the directory around it must hold only the target and its canary, the
//! canary unchanged.
#![no_main]

#[path = "../bodies/layer.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
