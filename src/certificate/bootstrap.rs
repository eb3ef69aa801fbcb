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
//! Renewal before expiry (`rotateCertificates`) is [`super::client`]'s.

use std::path::Path;

use tracing::info;

use super::{CertError, Store, Template};

/// Whether `kubeconfig` can be used as it is: a client certificate (and
/// its key) valid for another minute, or credentials that are not ours to
/// judge (a token, an exec plugin).
async fn usable(kubeconfig: &Path) -> bool {
    let Ok(kc) = kube::config::Kubeconfig::read_from(kubeconfig) else {
        return false;
    };
    let Ok(cfg) = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await else {
        return false;
    };
    let a = &cfg.auth_info;
    if a.token.is_some() || a.token_file.is_some() || a.exec.is_some() {
        return true;
    }
    super::client::kubeconfig_pair(&cfg, kubeconfig).is_some_and(|p| p.valid_for(60))
}

/// Makes sure `kubeconfig` holds a usable client certificate, requesting
/// one with `bootstrap` when it does not.
pub async fn ensure(
    kubeconfig: &Path,
    bootstrap: &Path,
    pki: &Path,
    node: &str,
) -> Result<(), CertError> {
    if usable(kubeconfig).await {
        return Ok(());
    }
    info!(kubeconfig = %kubeconfig.display(), "no usable client certificate: TLS bootstrap");
    let bad = |message: String| CertError::File {
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
    let key = rcgen::KeyPair::generate().map_err(|e| CertError::Request(e.to_string()))?;
    let cert = super::csr::request(&client, &key, &Template::client(node)).await?;
    let current = Store::client(pki).write(&cert, &key.serialize_pem())?;
    write_kubeconfig(kubeconfig, &cluster, &current)?;
    info!(kubeconfig = %kubeconfig.display(), cert = %current.display(), "client certificate issued; kubeconfig written");
    Ok(())
}

/// The node's kubeconfig: the bootstrap's cluster, the issued certificate.
fn write_kubeconfig(
    path: &Path,
    cluster: &kube::config::Cluster,
    cert: &Path,
) -> Result<(), CertError> {
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
        std::fs::create_dir_all(dir).map_err(|e| CertError::Write {
            path: dir.display().to_string(),
            source: e,
        })?;
    }
    crate::fsutil::write_private_atomic(path, kc.to_string().as_bytes(), crate::fsutil::Flush::All)
        .map_err(|e| CertError::Write {
            path: path.display().to_string(),
            source: e,
        })
}
