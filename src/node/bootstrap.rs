//! TLS bootstrap, as upstream's `pkg/kubelet/certificate/bootstrap`: with
//! `--bootstrap-kubeconfig` (a bootstrap token) and no usable
//! `--kubeconfig`, kinglet makes a key, asks the API for a client
//! certificate with a CertificateSigningRequest (signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `system:node:<name>` in `system:nodes`: what the controller-manager's
//! csrapproving controller approves for `system:bootstrappers`), waits for
//! it to be signed, and writes what the kubelet writes: the certificate
//! and key in `<root>/pki/kubelet-client-<time>.pem`, the
//! `kubelet-client-current.pem` symlink swapped to it, and `--kubeconfig`
//! pointing at that symlink. Every file is written whole (temp file and
//! rename, 0600), so a kill at any point leaves the old state or the new.
//!
//! Not yet: rotation before expiry (`rotateCertificates`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

/// Errors of the bootstrap, with the file or request they concern.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("bootstrap kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("client certificate request: {0}")]
    Request(String),
    #[error("certificate signing request {name} was {how}: {message}")]
    Refused {
        name: String,
        how: String,
        message: String,
    },
}

/// The client certificate of `kubeconfig`, if it names one that exists
/// and is valid for another minute.
fn usable(kubeconfig: &Path) -> bool {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let Ok(kc) = kube::config::Kubeconfig::read_from(kubeconfig) else {
        return false;
    };
    let Some(user) = kc.auth_infos.first().and_then(|a| a.auth_info.clone()) else {
        return false;
    };
    if user.token.is_some() || user.exec.is_some() {
        return true; // not ours to judge
    }
    let der = match (&user.client_certificate, &user.client_certificate_data) {
        (Some(path), _) => CertificateDer::from_pem_file(path).ok(),
        (None, Some(data)) => {
            use base64::Engine;
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap_or_default();
            CertificateDer::from_pem_slice(&pem).ok()
        }
        _ => None,
    };
    let now = jiff::Timestamp::now().as_second();
    der.and_then(|d| crate::server::auth::not_after(&d))
        .is_some_and(|end| end > now + 60)
}

/// Makes sure `kubeconfig` holds a usable client certificate, requesting
/// one with `bootstrap` when it does not.
pub async fn ensure(
    kubeconfig: &Path,
    bootstrap: &Path,
    pki: &Path,
    node: &str,
) -> Result<(), BootstrapError> {
    if usable(kubeconfig) {
        return Ok(());
    }
    info!(kubeconfig = %kubeconfig.display(), "no usable client certificate: TLS bootstrap");
    let bad = |message: String| BootstrapError::Kubeconfig {
        path: bootstrap.display().to_string(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(bootstrap).map_err(|e| bad(e.to_string()))?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| bad("no cluster".into()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    let client = kube::Client::try_from(cfg).map_err(|e| bad(e.to_string()))?;
    let key = rcgen::KeyPair::generate().map_err(|e| BootstrapError::Request(e.to_string()))?;
    let cert = request(&client, &key, node).await?;
    let current = write_pem(pki, &cert, &key.serialize_pem())?;
    write_kubeconfig(kubeconfig, &cluster, &current)?;
    info!(kubeconfig = %kubeconfig.display(), cert = %current.display(), "client certificate issued; kubeconfig written");
    Ok(())
}

/// Creates the CSR and waits for its certificate (PEM).
async fn request(
    client: &kube::Client,
    key: &rcgen::KeyPair,
    node: &str,
) -> Result<String, BootstrapError> {
    let req_err = |e: String| BootstrapError::Request(e);
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let csr_pem = params
        .serialize_request(key)
        .and_then(|r| r.pem())
        .map_err(|e| req_err(e.to_string()))?;
    let name = format!(
        "node-csr-{}",
        &hex::encode(sha2_of(csr_pem.as_bytes()))[..16]
    );
    let csr: CertificateSigningRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64_of(csr_pem.as_bytes()),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        }
    }))
    .map_err(|e| req_err(e.to_string()))?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    api.create(&PostParams::default(), &csr)
        .await
        .map_err(|e| req_err(format!("creating {name}: {e}")))?;
    info!(csr = %name, "waiting for the client certificate to be approved and signed");
    // Polled every second: a bootstrap happens once per node, and a watch
    // would need list/watch rights the bootstrap token does not have.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15 * 60);
    loop {
        match api.get(&name).await {
            Ok(c) => {
                let status = c.status.unwrap_or_default();
                for cond in status.conditions.iter().flatten() {
                    if (cond.type_ == "Denied" || cond.type_ == "Failed") && cond.status == "True" {
                        return Err(BootstrapError::Refused {
                            name,
                            how: cond.type_.to_lowercase(),
                            message: cond.message.clone().unwrap_or_default(),
                        });
                    }
                }
                if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                    return String::from_utf8(cert.0).map_err(|e| req_err(e.to_string()));
                }
            }
            Err(e) => warn!(csr = %name, error = %e, "reading the certificate signing request"),
        }
        if tokio::time::Instant::now() > deadline {
            return Err(req_err(format!("{name} not signed within 15 minutes")));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn sha2_of(b: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b);
    h.update(jiff::Timestamp::now().as_nanosecond().to_le_bytes());
    h.finalize().to_vec()
}

fn base64_of(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Writes `path` whole, mode 0600.
fn write_private(path: &Path, body: &[u8]) -> Result<(), BootstrapError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| BootstrapError::Write {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(body).and_then(|_| f.sync_all()).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// The certificate and key in a dated file and the `current` symlink
/// swapped to it (a new link renamed over the old); returns the link.
fn write_pem(pki: &Path, cert: &str, key: &str) -> Result<PathBuf, BootstrapError> {
    let err = |path: &Path, source| BootstrapError::Write {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(pki).map_err(|e| err(pki, e))?;
    let stamp = jiff::Zoned::now()
        .with_time_zone(jiff::tz::TimeZone::UTC)
        .strftime("%Y-%m-%d-%H-%M-%S")
        .to_string();
    let file = pki.join(format!("kubelet-client-{stamp}.pem"));
    write_private(&file, format!("{cert}{key}").as_bytes())?;
    let current = pki.join("kubelet-client-current.pem");
    let link = pki.join("kubelet-client-current.pem.new");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&file, &link).map_err(|e| err(&link, e))?;
    std::fs::rename(&link, &current).map_err(|e| err(&current, e))?;
    Ok(current)
}

/// The node's kubeconfig: the bootstrap's cluster, the issued certificate.
fn write_kubeconfig(
    path: &Path,
    cluster: &kube::config::Cluster,
    cert: &Path,
) -> Result<(), BootstrapError> {
    let mut c = serde_json::json!({"server": cluster.server});
    if let Some(ca) = &cluster.certificate_authority {
        c["certificate-authority"] = ca.clone().into();
    }
    if let Some(ca) = &cluster.certificate_authority_data {
        c["certificate-authority-data"] = ca.clone().into();
    }
    let cert = cert.display().to_string();
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": c}],
        "users": [{"name": "default-auth", "user": {"client-certificate": cert, "client-key": cert}}],
        "contexts": [{"name": "default-context", "context": {"cluster": "default-cluster", "user": "default-auth", "namespace": "default"}}],
        "current-context": "default-context",
    });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| BootstrapError::Write {
            path: dir.display().to_string(),
            source: e,
        })?;
    }
    write_private(path, kc.to_string().as_bytes())
}
