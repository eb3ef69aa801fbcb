//! `podCertificate` projections (upstream's `podcertificate.IssuingManager`):
//! for each source the node makes a key, asks the source's signer for a
//! certificate with a PodCertificateRequest (`certificates.k8s.io/v1`,
//! owned by the pod, with a stub PKCS#10 request signed by the key), and
//! writes key and chain into the pod once it is issued; from the
//! request's `beginRefreshAt` a new key and request replace them while the
//! old ones are still served.
//!
//! The node's requests are followed by one [`super::lazywatch`] (the Node
//! authorizer lets a node list and watch them by `spec.nodeName`), which
//! wakes the pod's worker when its request changes. The issued credential
//! is kept in the sealed local store, so a pod's volume is made again
//! after an offline reboot while its certificate has not expired.
//!
//! Differences from upstream: keys are made with ring, which has no RSA
//! key generation and no P-521: `RSA3072`, `RSA4096` and `ECDSAP521`
//! sources fail with a clear `FailedMount` message (`ECDSAP256`,
//! `ECDSAP384` and `ED25519` work). A denied or failed request is told in
//! the `FailedMount` message rather than an Event of its own.

use std::sync::Arc;

use k8s_openapi::api::certificates::v1::{PodCertificateRequest, PodCertificateRequestSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;

use super::lazywatch::LazyWatch;

/// What the node's watch keeps of one request (by `namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The chain and times, once issued.
    pub issued: Option<Issued>,
    /// `Denied` or `Failed`, with reason and message.
    pub refused: Option<(String, String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub chain: String,
    /// Unix seconds.
    pub begin_refresh_at: i64,
    pub not_after: i64,
}

pub type Requests = LazyWatch<PodCertificateRequest, Request>;

/// The watch of the node's requests, not started yet.
pub fn watch(client: Client, node: &str) -> Arc<Requests> {
    let api = kube::Api::<PodCertificateRequest>::all(client);
    let cfg = kube::runtime::watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    Requests::new(api, cfg, request)
}

fn seconds(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> i64 {
    t.map_or(0, |t| t.0.as_second())
}

fn request(pcr: PodCertificateRequest) -> (String, Request) {
    let key = format!(
        "{}/{}",
        pcr.metadata.namespace.unwrap_or_default(),
        pcr.metadata.name.unwrap_or_default()
    );
    let status = pcr.status.unwrap_or_default();
    let mut r = Request {
        issued: None,
        refused: None,
    };
    for c in status.conditions.iter().flatten() {
        match c.type_.as_str() {
            "Denied" | "Failed" => {
                r.refused = Some((c.type_.clone(), c.reason.clone(), c.message.clone()));
            }
            "Issued" => {
                r.issued = Some(Issued {
                    chain: status.certificate_chain.clone().unwrap_or_default(),
                    begin_refresh_at: seconds(status.begin_refresh_at.as_ref()),
                    not_after: seconds(status.not_after.as_ref()),
                })
            }
            _ => {}
        }
    }
    (key, r)
}

/// Why a source has no credential to write; the `Display` is upstream's
/// message where it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("credential bundle is not issued yet")]
    NotIssued,
    #[error("PodCertificateRequest was permanently {what}: reason={reason:?} message={message:?}")]
    Refused {
        what: String,
        reason: String,
        message: String,
    },
    #[error("while generating keypair: key type {0:?} is not supported by this node")]
    KeyType(String),
    #[error("while generating keypair: {0}")]
    Key(String),
    #[error("while creating initial PodCertificateRequest: {0}")]
    Create(String),
}

/// A key and the chain issued for it, as written and kept.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credential {
    /// PKCS#8 `PRIVATE KEY` PEM.
    pub key: String,
    /// `CERTIFICATE` PEM blocks, leaf first.
    pub chain: String,
    pub begin_refresh_at: i64,
    pub not_after: i64,
}

/// A request made and not answered yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub key: String,
    /// `namespace/name`.
    pub request: String,
    /// When a request the watch never showed is taken as deleted.
    pub abandon_at: i64,
}

/// Where one source stands (upstream's `credState`s).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum CertState {
    #[default]
    Initial,
    Wait(Pending),
    Fresh(Credential),
    WaitRefresh(Credential, Pending),
    Refused(CertError),
}

/// Upstream's grace before a request the watch never showed is made again.
pub const ABANDON_AFTER: i64 = 10 * 60;

/// What a source needs next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing: serve what there is.
    Nothing,
    /// A new key and request.
    Request,
}

/// One step of a source's state from what the watch shows (pure; `now`
/// in Unix seconds).
pub fn step(
    state: CertState,
    requests: &std::collections::BTreeMap<String, Request>,
    now: i64,
) -> (CertState, Next) {
    match state {
        CertState::Initial => (CertState::Initial, Next::Request),
        CertState::Wait(p) => match answer(&p, requests, now) {
            Answer::Issued(c) => (CertState::Fresh(c), Next::Nothing),
            Answer::Refused(e) => (CertState::Refused(e), Next::Nothing),
            Answer::Gone => (CertState::Initial, Next::Request),
            Answer::Waiting => (CertState::Wait(p), Next::Nothing),
        },
        CertState::Fresh(c) if now >= c.begin_refresh_at => (CertState::Fresh(c), Next::Request),
        CertState::WaitRefresh(c, p) => match answer(&p, requests, now) {
            Answer::Issued(n) => (CertState::Fresh(n), Next::Nothing),
            Answer::Refused(e) => (CertState::Refused(e), Next::Nothing),
            Answer::Gone => (CertState::Fresh(c), Next::Nothing),
            Answer::Waiting => (CertState::WaitRefresh(c, p), Next::Nothing),
        },
        s => (s, Next::Nothing),
    }
}

enum Answer {
    Issued(Credential),
    Refused(CertError),
    Gone,
    Waiting,
}

fn answer(p: &Pending, requests: &std::collections::BTreeMap<String, Request>, now: i64) -> Answer {
    let Some(r) = requests.get(&p.request) else {
        return if now >= p.abandon_at {
            Answer::Gone
        } else {
            Answer::Waiting
        };
    };
    if let Some((what, reason, message)) = &r.refused {
        let what = if what == "Denied" { "denied" } else { "failed" };
        return Answer::Refused(CertError::Refused {
            what: what.into(),
            reason: reason.clone(),
            message: message.clone(),
        });
    }
    match &r.issued {
        Some(i) => Answer::Issued(Credential {
            key: p.key.clone(),
            chain: String::from_utf8_lossy(&super::trust::normalize_chain(&i.chain)).into_owned(),
            begin_refresh_at: i.begin_refresh_at + jitter(),
            not_after: i.not_after,
        }),
        None => Answer::Waiting,
    }
}

/// How soon a source needs its next step without a watch event: its
/// refresh time, or the end of a request's grace.
pub fn next_refresh<'a>(
    states: impl Iterator<Item = &'a CertState>,
) -> Option<std::time::Duration> {
    let now = jiff::Timestamp::now().as_second();
    states
        .filter_map(|s| match s {
            CertState::Fresh(c) => Some(c.begin_refresh_at),
            CertState::Wait(p) | CertState::WaitRefresh(_, p) => Some(p.abandon_at),
            _ => None,
        })
        .map(|at| std::time::Duration::from_secs((at - now).max(0) as u64))
        .min()
}

/// Up to 5 minutes added to a refresh time, as upstream, so the pods of
/// a fleet do not all ask at once.
fn jitter() -> i64 {
    crate::certificate::jitter() * 300 / 1000
}

/// A new key of `key_type` (PKCS#8 PEM) and the stub PKCS#10 request
/// (DER) it signs, empty but for the key, as upstream makes it.
pub fn new_key(key_type: &str) -> Result<(String, Vec<u8>), CertError> {
    let alg = match key_type {
        "ECDSAP256" => &rcgen::PKCS_ECDSA_P256_SHA256,
        "ECDSAP384" => &rcgen::PKCS_ECDSA_P384_SHA384,
        "ED25519" => &rcgen::PKCS_ED25519,
        other => return Err(CertError::KeyType(other.into())),
    };
    let key = rcgen::KeyPair::generate_for(alg).map_err(|e| CertError::Key(e.to_string()))?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .map_err(|e| CertError::Key(e.to_string()))?;
    Ok((key.serialize_pem(), csr.der().to_vec()))
}

/// Who asks: the pod, its service account and the node, by name and UID.
pub struct Asker<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub pod_uid: &'a str,
    pub service_account: &'a str,
    pub service_account_uid: String,
    pub node: &'a str,
    pub node_uid: String,
}

/// The request for `source`, owned by the pod.
pub fn request_for(
    who: &Asker<'_>,
    source: &k8s_openapi::api::core::v1::PodCertificateProjection,
    csr: Vec<u8>,
) -> PodCertificateRequest {
    PodCertificateRequest {
        metadata: ObjectMeta {
            namespace: Some(who.namespace.into()),
            generate_name: Some("req-".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: who.pod.into(),
                uid: who.pod_uid.into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: PodCertificateRequestSpec {
            signer_name: source.signer_name.clone(),
            pod_name: who.pod.into(),
            pod_uid: who.pod_uid.into(),
            service_account_name: who.service_account.into(),
            service_account_uid: who.service_account_uid.clone(),
            node_name: who.node.into(),
            node_uid: who.node_uid.clone(),
            max_expiration_seconds: source.max_expiration_seconds,
            stub_pkc_s10_request: k8s_openapi::ByteString(csr),
            unverified_user_annotations: source.user_annotations.clone(),
        },
        status: None,
    }
}

/// The files a source writes: the credential bundle (key, then chain),
/// the key, the chain, at the paths it names.
pub fn files(
    source: &k8s_openapi::api::core::v1::PodCertificateProjection,
    c: &Credential,
) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    if let Some(p) = source
        .credential_bundle_path
        .as_ref()
        .filter(|p| !p.is_empty())
    {
        out.push((p.clone(), [c.key.as_bytes(), c.chain.as_bytes()].concat()));
    }
    if let Some(p) = source.key_path.as_ref().filter(|p| !p.is_empty()) {
        out.push((p.clone(), c.key.clone().into_bytes()));
    }
    if let Some(p) = source
        .certificate_chain_path
        .as_ref()
        .filter(|p| !p.is_empty())
    {
        out.push((p.clone(), c.chain.clone().into_bytes()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pending(name: &str) -> Pending {
        Pending {
            key: "KEY".into(),
            request: format!("ns/{name}"),
            abandon_at: 1000,
        }
    }

    fn issued(refresh: i64) -> Request {
        Request {
            issued: Some(Issued {
                chain: String::from_utf8(super::super::trust::pem_encode("CERTIFICATE", b"leaf"))
                    .unwrap(),
                begin_refresh_at: refresh,
                not_after: refresh + 3600,
            }),
            refused: None,
        }
    }

    #[test]
    fn a_source_is_asked_for_waits_is_issued_and_refreshed() {
        let none = BTreeMap::new();
        let (s, n) = step(CertState::Initial, &none, 0);
        assert_eq!((s, n), (CertState::Initial, Next::Request));
        // Not in the watch yet: wait, until the grace is over.
        let (s, n) = step(CertState::Wait(pending("a")), &none, 10);
        assert_eq!(
            (s.clone(), n),
            (CertState::Wait(pending("a")), Next::Nothing)
        );
        assert_eq!(step(s, &none, 1000), (CertState::Initial, Next::Request));
        let reqs = BTreeMap::from([("ns/a".to_string(), issued(500))]);
        let (s, n) = step(CertState::Wait(pending("a")), &reqs, 10);
        assert_eq!(n, Next::Nothing);
        let CertState::Fresh(c) = s.clone() else {
            panic!("not fresh: {s:?}")
        };
        assert_eq!(c.key, "KEY");
        assert!(c.chain.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!((500..=800).contains(&c.begin_refresh_at));
        // Fresh until the refresh time; then a new request, the old
        // credential still served until the new one is issued.
        assert_eq!(step(s.clone(), &reqs, 100).1, Next::Nothing);
        assert_eq!(step(s, &reqs, 900).1, Next::Request);
        let waiting = CertState::WaitRefresh(c.clone(), pending("b"));
        assert_eq!(step(waiting.clone(), &reqs, 900).0, waiting);
        let reqs = BTreeMap::from([("ns/b".to_string(), issued(2000))]);
        assert!(matches!(step(waiting, &reqs, 900).0, CertState::Fresh(n) if n.not_after == 5600));
    }

    #[test]
    fn a_refused_request_is_final_with_upstreams_message() {
        let reqs = BTreeMap::from([(
            "ns/a".to_string(),
            Request {
                issued: None,
                refused: Some(("Denied".into(), "NotAllowed".into(), "no".into())),
            },
        )]);
        let (s, _) = step(CertState::Wait(pending("a")), &reqs, 0);
        let CertState::Refused(e) = s else { panic!() };
        assert_eq!(
            e.to_string(),
            "PodCertificateRequest was permanently denied: reason=\"NotAllowed\" message=\"no\""
        );
    }

    #[test]
    fn keys_and_stub_requests_for_the_types_ring_makes() {
        for t in ["ECDSAP256", "ECDSAP384", "ED25519"] {
            let (key, csr) = new_key(t).unwrap();
            assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{t}");
            assert_eq!(csr[0], 0x30, "{t}: a DER sequence");
        }
        assert_eq!(
            new_key("RSA3072").unwrap_err().to_string(),
            "while generating keypair: key type \"RSA3072\" is not supported by this node"
        );
    }

    #[test]
    fn files_are_written_where_the_source_says() {
        let src: k8s_openapi::api::core::v1::PodCertificateProjection =
            serde_json::from_value(serde_json::json!({
                "signerName": "x/y", "keyType": "ED25519",
                "credentialBundlePath": "bundle.pem", "keyPath": "key.pem"
            }))
            .unwrap();
        let c = Credential {
            key: "K\n".into(),
            chain: "C\n".into(),
            begin_refresh_at: 0,
            not_after: 0,
        };
        let f = files(&src, &c);
        assert_eq!(
            f,
            vec![
                ("bundle.pem".to_string(), b"K\nC\n".to_vec()),
                ("key.pem".to_string(), b"K\n".to_vec())
            ]
        );
    }
}
