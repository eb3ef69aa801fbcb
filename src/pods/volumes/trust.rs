//! ClusterTrustBundles for `clusterTrustBundle` projections (upstream's
//! `clustertrustbundle.InformerManager`): one [`super::lazywatch`] over
//! all of them (`certificates.k8s.io/v1`, which every node may read),
//! started when the first pod asks for one and stopped when the last pod
//! using them goes (upstream's lazy informer too); each change wakes the
//! workers of the pods using them, whose next round writes the new
//! anchors into the running pod.
//!
//! The anchors a source selects are deduplicated and written in a stable
//! order (sorted by their DER bytes). A deliberate difference: upstream
//! shuffles them each time its cache entry is rebuilt, so consumers do not
//! depend on an order; a stable order means the file is rewritten only
//! when the anchors change (flash wears out).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use base64::Engine;
use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;

use super::lazywatch::WatchError;
use crate::pods::util::{self, SelectorError};

/// Upstream's bound on a label selector's text.
const MAX_SELECTOR_LEN: usize = 100 * 1024;

/// What one ClusterTrustBundle holds that projections read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub signer: String,
    pub labels: BTreeMap<String, String>,
    /// PEM, as the API has it.
    pub pem: String,
}

pub type Bundles = super::lazywatch::Items<Bundle>;

/// The node's ClusterTrustBundles, watched while a pod uses them.
pub type TrustBundles = super::lazywatch::LazyWatch<ClusterTrustBundle, Bundle>;

/// The watch of every ClusterTrustBundle, not started yet.
pub fn watch(client: Client) -> Arc<TrustBundles> {
    let api = kube::Api::<ClusterTrustBundle>::all(client);
    TrustBundles::new(api, Default::default(), bundle)
}

/// Why a projection's anchors cannot be given; the `Display` is
/// upstream's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error("ClusterTrustBundle {0}")]
    Watch(#[from] WatchError),
    #[error(
        "while getting ClusterTrustBundle: clustertrustbundles.certificates.k8s.io {0:?} not found"
    )]
    NotFound(String),
    #[error("combination of signerName and labelSelector matched zero ClusterTrustBundles")]
    NoMatch,
    #[error("while parsing label selector: {0}")]
    Selector(#[from] SelectorError),
    #[error("label selector length ({0}) is larger than {MAX_SELECTOR_LEN}")]
    SelectorTooLong(usize),
    #[error("ClusterTrustBundle projection requires either name or signerName to be set")]
    NoSource,
}

fn bundle(ctb: ClusterTrustBundle) -> (String, Bundle) {
    let name = ctb.metadata.name.unwrap_or_default();
    let b = Bundle {
        signer: ctb.spec.signer_name.unwrap_or_default(),
        labels: ctb.metadata.labels.unwrap_or_default(),
        pem: ctb.spec.trust_bundle,
    };
    (name, b)
}

/// The anchors of the bundle named `name` (none when it is missing and
/// the source is optional).
pub fn by_name(bundles: &Bundles, name: &str, optional: bool) -> Result<Vec<u8>, TrustError> {
    match bundles.get(name) {
        Some(b) => Ok(normalize([b.pem.as_str()])),
        None if optional => Ok(Vec::new()),
        None => Err(TrustError::NotFound(name.into())),
    }
}

/// The anchors of every bundle of `signer` that `selector` selects (an
/// unset selector selects none, an empty one all, as upstream).
pub fn by_signer(
    bundles: &Bundles,
    signer: &str,
    selector: Option<&LabelSelector>,
    optional: bool,
) -> Result<Vec<u8>, TrustError> {
    let len = selector.map_or(0, util::selector_len);
    if len > MAX_SELECTOR_LEN {
        return Err(TrustError::SelectorTooLong(len));
    }
    let mut pems = Vec::new();
    for b in bundles.values().filter(|b| b.signer == signer) {
        if util::selector_matches(selector, &b.labels)? {
            pems.push(b.pem.as_str());
        }
    }
    if pems.is_empty() {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(TrustError::NoMatch)
        };
    }
    Ok(normalize(pems))
}

/// Every PEM block of the bundles once, as `CERTIFICATE` blocks in the
/// order of their bytes.
pub fn normalize<'a>(pems: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    let mut ders = BTreeSet::new();
    for p in pems {
        ders.extend(pem_blocks(p));
    }
    let mut out = Vec::new();
    for d in ders {
        out.extend_from_slice(&pem_encode("CERTIFICATE", &d));
    }
    out
}

/// A chain's PEM blocks in their order, each as a `CERTIFICATE` block
/// (upstream's `cleanCertificateChain`).
pub fn normalize_chain(pem: &str) -> Vec<u8> {
    pem_blocks(pem)
        .iter()
        .flat_map(|d| pem_encode("CERTIFICATE", d))
        .collect()
}

/// The DER bytes of each PEM block in `text`, whatever its type (as Go's
/// `pem.Decode`); text around and between blocks is skipped.
fn pem_blocks(text: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut body: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with("-----BEGIN ") && line.ends_with("-----") {
            body = Some(String::new());
        } else if line.starts_with("-----END ") && line.ends_with("-----") {
            if let Some(b) = body.take()
                && let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b)
            {
                out.push(der);
            }
        } else if let Some(b) = body.as_mut() {
            b.push_str(line);
        }
    }
    out
}

/// A PEM block with 64-character lines.
pub fn pem_encode(kind: &str, der: &[u8]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {kind}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {kind}-----\n"));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(der: &[u8]) -> String {
        String::from_utf8(pem_encode("CERTIFICATE", der)).unwrap()
    }

    /// name, signer, labels, PEM.
    type Row<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], String);

    fn set(items: &[Row<'_>]) -> Bundles {
        Arc::new(
            items
                .iter()
                .map(|(n, s, l, p)| {
                    let b = Bundle {
                        signer: s.to_string(),
                        labels: l
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                        pem: p.clone(),
                    };
                    (n.to_string(), b)
                })
                .collect(),
        )
    }

    #[test]
    fn by_name_gives_the_bundle_or_upstreams_errors() {
        let b = set(&[("one", "", &[], pem(b"a"))]);
        assert_eq!(by_name(&b, "one", false).unwrap(), pem(b"a").into_bytes());
        assert_eq!(by_name(&b, "two", true).unwrap(), b"");
        assert_eq!(
            by_name(&b, "two", false).unwrap_err().to_string(),
            "while getting ClusterTrustBundle: clustertrustbundles.certificates.k8s.io \"two\" not found"
        );
    }

    #[test]
    fn by_signer_unites_deduplicates_and_selects_by_labels() {
        let both = format!("{}{}", pem(b"b"), pem(b"a"));
        let b = set(&[
            ("x:1", "x", &[("alive", "true")], both),
            ("x:2", "x", &[("alive", "false")], pem(b"a")),
            ("x:3", "x", &[("alive", "true")], pem(b"c")),
            ("y:1", "y", &[("alive", "true")], pem(b"d")),
        ]);
        let everything = LabelSelector::default();
        let all = by_signer(&b, "x", Some(&everything), false).unwrap();
        assert_eq!(all, [pem(b"a"), pem(b"b"), pem(b"c")].concat().into_bytes());
        let alive: LabelSelector =
            serde_json::from_value(serde_json::json!({"matchLabels": {"alive": "true"}})).unwrap();
        let some = by_signer(&b, "x", Some(&alive), false).unwrap();
        assert_eq!(
            some,
            [pem(b"a"), pem(b"b"), pem(b"c")].concat().into_bytes()
        );
        let dead: LabelSelector = serde_json::from_value(serde_json::json!(
            {"matchExpressions": [{"key": "alive", "operator": "NotIn", "values": ["true"]}]}
        ))
        .unwrap();
        assert_eq!(
            by_signer(&b, "x", Some(&dead), false).unwrap(),
            pem(b"a").into_bytes()
        );
        // No selector selects nothing; optional makes that empty.
        assert_eq!(by_signer(&b, "x", None, false), Err(TrustError::NoMatch));
        assert_eq!(by_signer(&b, "x", None, true).unwrap(), b"");
        assert_eq!(
            by_signer(&b, "z", Some(&everything), false),
            Err(TrustError::NoMatch)
        );
    }

    #[test]
    fn normalize_is_stable_and_reads_any_block() {
        let text = format!(
            "junk\n{}\n-----BEGIN OTHER-----\nZA==\n-----END OTHER-----\n",
            pem(b"e")
        );
        assert_eq!(
            normalize([text.as_str()]),
            [pem(b"d"), pem(b"e")].concat().into_bytes()
        );
        let long = vec![7u8; 100];
        let p = String::from_utf8(pem_encode("CERTIFICATE", &long)).unwrap();
        assert!(p.lines().all(|l| l.len() <= 64));
        assert_eq!(pem_blocks(&p), vec![long]);
    }
}
