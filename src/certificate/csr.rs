//! One CertificateSigningRequest, as upstream's `csr.RequestCertificate`
//! and `WaitForCertificate`: the request made from a fresh key, created
//! with `generateName: csr-`, then watched (a field-selected watch on its
//! name; the node's and the bootstrappers' RBAC both allow it) until it
//! carries a certificate or is denied.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, PostParams};
use tracing::info;

use super::CertError;

/// What to ask for.
#[derive(Clone, Debug)]
pub struct Template {
    /// The node: the subject is `system:node:<node>` in `system:nodes`.
    pub node: String,
    pub signer: &'static str,
    pub usages: &'static [&'static str],
    /// Subject alternative names (serving certificates): DNS names and IPs.
    pub sans: Vec<String>,
}

impl Template {
    /// A client certificate (upstream's usages for an ECDSA key).
    pub fn client(node: &str) -> Template {
        Template {
            node: node.into(),
            signer: "kubernetes.io/kube-apiserver-client-kubelet",
            usages: &["digital signature", "client auth"],
            sans: Vec::new(),
        }
    }

    /// A serving certificate for the node's names and addresses.
    pub fn serving(node: &str, sans: Vec<String>) -> Template {
        Template {
            node: node.into(),
            signer: "kubernetes.io/kubelet-serving",
            usages: &["digital signature", "server auth"],
            sans,
        }
    }

    fn request_pem(&self, key: &rcgen::KeyPair) -> Result<String, CertError> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("system:node:{}", self.node),
        );
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        for san in &self.sans {
            let s = match san.parse::<std::net::IpAddr>() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => match san.clone().try_into() {
                    Ok(dns) => rcgen::SanType::DnsName(dns),
                    Err(_) => continue, // not a DNS name (e.g. `_`): left out
                },
            };
            params.subject_alt_names.push(s);
        }
        params
            .serialize_request(key)
            .and_then(|r| r.pem())
            .map_err(|e| CertError::Request(e.to_string()))
    }
}

/// The `Denied` or `Failed` condition of a CSR, if it has one.
fn refusal(
    s: &k8s_openapi::api::certificates::v1::CertificateSigningRequestStatus,
) -> Option<&k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition> {
    s.conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
}

/// Creates the CSR and waits (up to 15 minutes, as upstream's bootstrap)
/// for its certificate (PEM).
pub async fn request(
    client: &kube::Client,
    key: &rcgen::KeyPair,
    t: &Template,
) -> Result<String, CertError> {
    let req_err = CertError::Request;
    let csr_pem = t.request_pem(key)?;
    use base64::Engine;
    let csr: CertificateSigningRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr_pem.as_bytes()),
            "signerName": t.signer,
            "usages": t.usages,
        }
    }))
    .map_err(|e| req_err(e.to_string()))?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|e| req_err(format!("creating a {} request: {e}", t.signer)))?;
    let name = created.metadata.name.unwrap_or_default();
    info!(csr = %name, signer = t.signer, "waiting for the certificate to be approved and signed");
    let done = kube::runtime::wait::await_condition(
        api,
        &name,
        |c: Option<&CertificateSigningRequest>| {
            c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                s.certificate.as_ref().is_some_and(|c| !c.0.is_empty()) || refusal(s).is_some()
            })
        },
    );
    let got = tokio::time::timeout(Duration::from_secs(15 * 60), done)
        .await
        .map_err(|_| req_err(format!("{name} not signed within 15 minutes")))?
        .map_err(|e| req_err(format!("watching {name}: {e}")))?;
    let status = got.and_then(|c| c.status).unwrap_or_default();
    if let Some(cond) = refusal(&status) {
        return Err(CertError::Refused {
            name,
            how: cond.type_.to_lowercase(),
            message: cond.message.clone().unwrap_or_default(),
        });
    }
    let cert = status.certificate.map(|c| c.0).unwrap_or_default();
    String::from_utf8(cert).map_err(|e| req_err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_request_names_the_node_and_its_addresses() {
        let key = rcgen::KeyPair::generate().unwrap();
        let t = Template::serving(
            "edge-1",
            vec!["edge-1".into(), "10.0.0.7".into(), "_".into()],
        );
        let pem = t.request_pem(&key).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map(|d: rustls::pki_types::CertificateSigningRequestDer| d.as_ref().to_vec())
            .unwrap();
        let has = |needle: &[u8]| der.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"system:node:edge-1"));
        assert!(has(b"system:nodes"));
        assert!(has(&[0x87, 4, 10, 0, 0, 7]), "the IP SAN");
        assert!(has(b"\x82\x06edge-1"), "the DNS SAN");
    }
}
