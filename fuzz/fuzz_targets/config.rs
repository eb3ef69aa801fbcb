//! The KubeletConfiguration parser (`--config`): any bytes, as YAML or JSON.
//! Never a panic; a config it accepts also yields its eviction thresholds
//! and its derived values without one.
#![no_main]

#[path = "../bodies/config.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
