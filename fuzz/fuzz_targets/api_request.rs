//! The kubelet API's request parsing (port 10250): the authorization
//! attributes of a path, and the exec/attach and log queries. Never a
//! panic; every path gets a subresource to check, and only the
//! fine-grained paths upstream names get one other than `proxy`.
#![no_main]

#[path = "../bodies/api_request.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
