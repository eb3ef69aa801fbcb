//! The image reference parser: never a panic, and normalising is stable
//! (the canonical name of a parsed reference parses to the same reference).
#![no_main]

#[path = "../bodies/image_reference.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
