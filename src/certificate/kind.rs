//! Which certificate is meant: the client one kinglet talks to the API
//! server with, or the serving one of its kubelet API. A leaf, so that the
//! metrics, which count both, need nothing else of `certificate`.

/// Which certificate a [`Rotator`](super::Rotator) renews, for logs,
/// events and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Client,
    Serving,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Serving => "serving",
        }
    }
}
