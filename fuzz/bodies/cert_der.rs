//! The small X.509 DER walk (`certificate::der`): the subject of a client
//! certificate on the kubelet API (its user and groups) and a
//! certificate's validity for the certificate manager, fed any bytes:
//! a user, a validity or nothing, never a panic; a user always has a name.
//! (The body of fuzz_targets/cert_der.rs, shared with tests/fuzz_corpus.rs,
//! which replays the corpus through it.)

use kinglet::certificate::der::{subject_of_cert, validity};

/// One input as a certificate; a panic is a finding.
pub fn run(data: &[u8]) {
    if let Some(subject) = subject_of_cert(data) {
        assert!(!subject.common_name.is_empty());
    }
    let _ = validity(data);
}
