//! The SPDY/3 frame reader: any bytes give frames, a clean end or a
//! protocol error, never a panic or an allocation past the frame cap.
#![no_main]

#[path = "../bodies/spdy_frame.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
