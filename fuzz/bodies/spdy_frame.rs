//! The SPDY/3 frame reader of the kubelet API's streaming (exec, attach,
//! port-forward from clients that still speak SPDY), fed bytes an
//! unauthenticated peer could send: every input gives frames, a clean
//! end or a protocol error, never a panic; a frame past the size cap is
//! refused before its body is allocated, and the header blocks' zlib
//! stream (one per connection, primed with SPDY's dictionary) never
//! decompresses past its cap.
//! (The body of fuzz_targets/spdy_frame.rs, shared with tests/fuzz_corpus.rs,
//! which replays the corpus through it.)

use std::future::Future;
use std::task::{Context, Poll, Waker};

use kinglet_spdy::frame::{HeaderCodec, read};

/// One input, read frame by frame as one connection; a panic is a finding.
pub fn run(data: &[u8]) {
    let mut codec = HeaderCodec::new();
    let mut rest = data;
    loop {
        let before = rest.len();
        let step = std::pin::pin!(read(&mut rest, &mut codec))
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        match step {
            Poll::Ready(Ok(Some(_))) => assert!(rest.len() + 8 <= before),
            Poll::Ready(Ok(None) | Err(_)) => return,
            Poll::Pending => panic!("a read from a byte slice never waits"),
        }
    }
}
