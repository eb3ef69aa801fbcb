//! The node's certificates, as upstream's `pkg/kubelet/certificate`:
//! - [`bootstrap`]: the first client certificate, from a bootstrap token;
//! - [`client`]: the API client whose client certificate is swapped in
//!   place when it is renewed (`rotateCertificates`);
//! - [`serving`]: the kubelet API's certificate: files reloaded when they
//!   change, or requested from the cluster (`serverTLSBootstrap`);
//! - [`Rotator`]: the loop both renewals share — sleep until 70–90 % of
//!   the certificate's lifetime (jittered, as upstream's
//!   `nextRotationDeadline`), ask for a new one with a
//!   CertificateSigningRequest ([`csr`]), store it ([`Store`]: dated file
//!   plus the `-current.pem` symlink, swapped atomically), hand it to its
//!   user; on failure retry with backoff, and say clearly — in the log,
//!   as a Node event and in the metrics — when the certificate is about
//!   to expire or has. Pods never depend on it: an expired certificate
//!   while the API is unreachable stops nothing that runs;
//! - [`watch_expiry`]: the same warnings for a certificate nothing renews
//!   (a kubeconfig's client certificate with `rotateCertificates` off,
//!   serving files an operator provides).

pub mod bootstrap;
pub mod client;
mod csr;
pub mod der;
pub mod kind;
pub mod serving;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use csr::Template;
pub use kind::Kind;

/// Errors of certificates: reading, requesting, writing.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate {path}: {message}")]
    File { path: String, message: String },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate request: {0}")]
    Request(String),
    #[error("certificate signing request {name} was {how}: {message}")]
    Refused {
        name: String,
        how: String,
        message: String,
    },
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> CertError {
    CertError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// A certificate chain with its key, as rustls uses it, and its validity.
#[derive(Clone, Debug)]
pub struct Pair {
    pub key: Arc<CertifiedKey>,
    pub not_before: i64,
    pub not_after: i64,
}

impl Pair {
    /// From PEM: the chain and the key, in one blob or two.
    pub fn from_pem(cert: &[u8], key: &[u8], what: &Path) -> Result<Pair, CertError> {
        use rustls::pki_types::pem::PemObject;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|e| file_err(what, e))?;
        let first = chain
            .first()
            .ok_or_else(|| file_err(what, "no certificate"))?;
        let (not_before, not_after) =
            der::validity(first).ok_or_else(|| file_err(what, "unreadable validity"))?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| file_err(what, e))?;
        let signer =
            rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| file_err(what, e))?;
        let key = CertifiedKey::new(chain, signer);
        // A certificate rewritten before its key (a rotation in progress)
        // is no pair yet.
        key.keys_match().map_err(|e| file_err(what, e))?;
        Ok(Pair {
            key: Arc::new(key),
            not_before,
            not_after,
        })
    }

    /// From files (the same path twice for a combined PEM).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Pair, CertError> {
        let c = std::fs::read(cert).map_err(|e| file_err(cert, e))?;
        let k = std::fs::read(key).map_err(|e| file_err(key, e))?;
        Pair::from_pem(&c, &k, cert)
    }

    /// Valid now and for `margin` seconds more.
    pub fn valid_for(&self, margin: i64) -> bool {
        let now = now();
        self.not_before <= now + 300 && self.not_after > now + margin
    }
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// When to renew a certificate: at 70–90 % of its lifetime, `jitter`
/// (in thousandths) choosing where, so a fleet issued at once does not
/// renew at once.
pub fn rotation_deadline(not_before: i64, not_after: i64, jitter: i64) -> i64 {
    let total = (not_after - not_before).max(0);
    not_before + total * (700 + jitter.clamp(0, 1000) / 5) / 1000
}

/// A number in 0–999 that differs between nodes and runs (no RNG crate
/// for one number: the clock's nanoseconds and the process id are enough).
pub fn jitter() -> i64 {
    let n = jiff::Timestamp::now().subsec_nanosecond() as i64 ^ i64::from(std::process::id());
    n.rem_euclid(1000)
}

/// Where upstream keeps a certificate kind: `<dir>/<prefix>-<time>.pem`
/// (chain and key) and the `<prefix>-current.pem` symlink to the newest.
#[derive(Clone, Debug)]
pub struct Store {
    pub dir: PathBuf,
    pub prefix: &'static str,
}

impl Store {
    pub fn client(pki: &Path) -> Store {
        Store {
            dir: pki.to_path_buf(),
            prefix: "kubelet-client",
        }
    }

    pub fn server(pki: &Path) -> Store {
        Store {
            dir: pki.to_path_buf(),
            prefix: "kubelet-server",
        }
    }

    pub fn current(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The current pair, if there is one that can be read.
    pub fn load(&self) -> Option<Pair> {
        let p = self.current();
        p.exists().then(|| Pair::from_files(&p, &p).ok()).flatten()
    }

    /// Writes the certificate and key in a dated file and swaps the
    /// `current` symlink to it (a new link renamed over the old), so a kill
    /// at any point leaves the old pair or the new; returns the link.
    pub fn write(&self, cert: &str, key: &str) -> Result<PathBuf, CertError> {
        let err = |path: &Path, source| CertError::Write {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| err(&self.dir, e))?;
        let stamp = jiff::Zoned::now()
            .with_time_zone(jiff::tz::TimeZone::UTC)
            .strftime("%Y-%m-%d-%H-%M-%S")
            .to_string();
        let file = self.dir.join(format!("{}-{stamp}.pem", self.prefix));
        crate::fsutil::write_private_atomic(
            &file,
            format!("{cert}{key}").as_bytes(),
            crate::fsutil::Flush::All,
        )
        .map_err(|e| err(&file, e))?;
        let current = self.current();
        let link = self.dir.join(format!("{}-current.pem.new", self.prefix));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).map_err(|e| err(&link, e))?;
        std::fs::rename(&link, &current).map_err(|e| err(&current, e))?;
        Ok(current)
    }
}

/// What a renewed pair is handed to.
pub type Apply = Arc<dyn Fn(&Pair) + Send + Sync>;

/// Renews one certificate before it expires (upstream's certificate
/// manager): see the module docs.
pub struct Rotator {
    pub kind: Kind,
    pub store: Store,
    pub template: Template,
    /// Authenticated as the node (its current client certificate).
    pub client: kube::Client,
    pub apply: Apply,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Rotator {
    /// Runs until `stop`, starting from `current` (none: request now).
    pub async fn run(self, mut current: Option<Pair>, stop: CancellationToken) {
        let kind = self.kind.name();
        let events = NodeEvents::new(&self.client, &self.template.node);
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_secs(2), Duration::from_secs(300));
        loop {
            let deadline = match &current {
                Some(p) => {
                    self.metrics.certificate_ttl(self.kind, p.not_after - now());
                    let d = rotation_deadline(p.not_before, p.not_after, jitter());
                    info!(kind, expiration = %ts(p.not_after), rotation_deadline = %ts(d), "certificate rotation");
                    d
                }
                None => now(),
            };
            let wait = Duration::from_secs((deadline - now()).max(0) as u64);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            loop {
                let attempt = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = self.renew() => r,
                };
                match attempt {
                    Ok(p) => {
                        info!(kind, expiration = %ts(p.not_after), "certificate rotated");
                        (self.apply)(&p);
                        current = Some(p);
                        backoff.reset();
                        break;
                    }
                    Err(e) => {
                        self.metrics.certificate_renew_error(self.kind);
                        self.warn_expiry(&events, current.as_ref(), &e).await;
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(backoff.next_delay()) => {}
                        }
                    }
                }
            }
        }
    }

    /// One CSR round: a new key, a request, the signed certificate stored.
    async fn renew(&self) -> Result<Pair, CertError> {
        let key = rcgen::KeyPair::generate().map_err(|e| CertError::Request(e.to_string()))?;
        let cert = csr::request(&self.client, &key, &self.template).await?;
        let key_pem = key.serialize_pem();
        let path = self.store.write(&cert, &key_pem)?;
        Pair::from_pem(cert.as_bytes(), key_pem.as_bytes(), &path)
    }

    /// A failed renewal: a warning always; an event once the certificate
    /// is in its last tenth of life or past it (the moment an operator must
    /// act: an expired certificate is a top cause of NotReady nodes).
    async fn warn_expiry(&self, events: &NodeEvents, current: Option<&Pair>, e: &CertError) {
        let kind = self.kind.name();
        warn!(kind, error = %e, "certificate renewal failed; retrying");
        let Some(p) = current else { return };
        let left = p.not_after - now();
        let tenth = (p.not_after - p.not_before) / 10;
        if left <= 0 {
            let msg = format!(
                "the kubelet {kind} certificate expired at {}; renewal failed: {e}",
                ts(p.not_after)
            );
            warn!(kind, "{msg}");
            events.warn("CertificateExpired", msg).await;
        } else if left <= tenth {
            let msg = format!(
                "the kubelet {kind} certificate expires at {} and could not be renewed: {e}",
                ts(p.not_after)
            );
            events.warn("CertificateExpiring", msg).await;
        }
    }
}

/// Where a certificate is in its life, for a certificate nothing renews:
/// fresh until its last tenth (where a rotating kinglet would long have
/// renewed it), then expiring, then expired.
#[derive(Debug, PartialEq, Eq)]
pub enum Life {
    Fresh { until: i64 },
    Expiring,
    Expired,
}

pub fn life(not_before: i64, not_after: i64, now: i64) -> Life {
    let tenth = (not_after - not_before).max(0) / 10;
    if now >= not_after {
        Life::Expired
    } else if now >= not_after - tenth {
        Life::Expiring
    } else {
        Life::Fresh {
            until: not_after - tenth,
        }
    }
}

/// Watches a certificate nothing renews and says so — a warning in the log
/// and a Node event (`CertificateExpiring`, `CertificateExpired`) — when it
/// enters its last tenth of life and when it expires: an expired
/// certificate is a top cause of NotReady nodes. `load` reads it again at
/// each wake (an operator may have replaced the files); it sleeps until the
/// next change of state, and re-reads an expired one hourly.
pub async fn watch_expiry(
    kind: &'static str,
    load: Arc<dyn Fn() -> Option<Pair> + Send + Sync>,
    client: kube::Client,
    node: String,
    stop: CancellationToken,
) {
    let events = NodeEvents::new(&client, &node);
    loop {
        let read = load.clone();
        let Ok(Some(p)) = tokio::task::spawn_blocking(move || read()).await else {
            // Unreadable for now (files being replaced): look again later.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(60)) => continue,
            }
        };
        let end = ts(p.not_after);
        let (wait, said) = match life(p.not_before, p.not_after, now()) {
            Life::Fresh { until } => ((until - now()).max(1), None),
            Life::Expiring => {
                let msg = format!(
                    "the kubelet {kind} certificate expires at {end} and nothing renews it (rotateCertificates is off, or it comes from files): replace it"
                );
                (
                    (p.not_after - now()).max(1),
                    Some(("CertificateExpiring", msg)),
                )
            }
            Life::Expired => {
                let msg = format!("the kubelet {kind} certificate expired at {end}: replace it");
                (3600, Some(("CertificateExpired", msg)))
            }
        };
        if let Some((reason, msg)) = said {
            warn!(kind, "{msg}");
            events.warn(reason, msg).await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(wait as u64)) => {}
        }
    }
}

fn ts(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| secs.to_string())
}

/// Warning events on the Node, at most one per reason a minute (renewals
/// retry every few seconds while the API is away).
struct NodeEvents {
    recorder: Recorder,
    reference: ObjectReference,
    last: std::sync::Mutex<std::collections::HashMap<&'static str, tokio::time::Instant>>,
}

impl NodeEvents {
    fn new(client: &kube::Client, node: &str) -> NodeEvents {
        NodeEvents {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "kubelet".into(),
                    instance: Some(node.into()),
                },
            ),
            reference: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                uid: Some(node.into()),
                ..Default::default()
            },
            last: Default::default(),
        }
    }

    async fn warn(&self, reason: &'static str, note: String) {
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            let now = tokio::time::Instant::now();
            if last
                .get(reason)
                .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(60))
            {
                return;
            }
            last.insert(reason, now);
        }
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "RotateCertificate".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &self.reference).await {
            tracing::debug!(error = %e, reason, "could not record event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_nothing_renews_is_expiring_in_its_last_tenth() {
        assert_eq!(life(0, 1000, 0), Life::Fresh { until: 900 });
        assert_eq!(life(0, 1000, 899), Life::Fresh { until: 900 });
        assert_eq!(life(0, 1000, 900), Life::Expiring);
        assert_eq!(life(0, 1000, 999), Life::Expiring);
        assert_eq!(life(0, 1000, 1000), Life::Expired);
        // Not valid yet, or a nonsense validity: never a panic.
        assert_eq!(life(500, 100, 0), Life::Fresh { until: 100 });
    }

    #[test]
    fn renewal_falls_between_70_and_90_percent_of_the_lifetime() {
        assert_eq!(rotation_deadline(1000, 2000, 0), 1700);
        assert_eq!(rotation_deadline(1000, 2000, 1000), 1900);
        assert_eq!(rotation_deadline(1000, 2000, 500), 1800);
        assert_eq!(rotation_deadline(1000, 2000, 7000), 1900);
        assert!((0..1000).contains(&jitter()));
    }

    #[test]
    fn the_store_swaps_current_to_the_newest_pair() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::server(d.path());
        assert!(store.load().is_none());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["n".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let link = store.write(&cert.pem(), &key.serialize_pem()).unwrap();
        assert_eq!(link, d.path().join("kubelet-server-current.pem"));
        let target = std::fs::read_link(&link).unwrap();
        assert!(target.to_string_lossy().contains("kubelet-server-2"));
        let p = store.load().unwrap();
        assert!(p.valid_for(60));
        assert_eq!(p.key.cert.len(), 1);
        assert!(!d.path().join("kubelet-server-current.pem.new").exists());
        // A file that is not a pair is no pair, not a panic.
        std::fs::write(&target, "garbage").unwrap();
        assert!(store.load().is_none());
    }
}
