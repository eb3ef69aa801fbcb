//! The X.509 DER walk: a user, a validity or nothing, never a panic.
#![no_main]

#[path = "../bodies/cert_der.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
