//! The kubelet API's serving certificate, as upstream chooses it:
//! - `tlsCertFile`/`tlsPrivateKeyFile`: read at start and again whenever
//!   their directory changes (inotify: a rewrite, a rename over, the
//!   symlink swap of a mounted Secret), so a rotated pair is served from
//!   the next handshake without a restart; a half-written pair is skipped
//!   (the old one stays) until it reads whole;
//! - `serverTLSBootstrap`: requested from the cluster (signer
//!   `kubernetes.io/kubelet-serving`, the node's names and addresses as
//!   SANs), kept in `pki/kubelet-server-current.pem` and renewed by a
//!   [`super::Rotator`]. Such requests are not approved automatically by
//!   the controller-manager (upstream leaves them to an operator or an
//!   approver): until one is, TLS handshakes fail, as upstream's;
//! - neither: a self-signed pair made once under `pki/` (`kubelet.crt`,
//!   `kubelet.key`), as upstream.
//!
//! The server reads the current pair through [`ServingCert`], a rustls
//! certificate resolver.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CertError, Pair, file_err};

/// The certificate the kubelet API presents, swapped when renewed.
#[derive(Debug, Default)]
pub struct ServingCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ServingCert {
    pub fn new(pair: Option<&Pair>) -> Arc<ServingCert> {
        Arc::new(ServingCert {
            current: RwLock::new(pair.map(|p| p.key.clone())),
        })
    }

    pub fn set(&self, pair: &Pair) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(pair.key.clone());
    }
}

impl rustls::server::ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Serves `cert`/`key` and reloads them when they change, until `stop`.
pub fn from_files(
    cert: &Path,
    key: &Path,
    stop: CancellationToken,
) -> Result<
    (
        Arc<ServingCert>,
        impl std::future::Future<Output = ()> + Send + use<>,
    ),
    CertError,
> {
    let pair = Pair::from_files(cert, key)?;
    let serving = ServingCert::new(Some(&pair));
    let dirs: Vec<PathBuf> = [cert, key]
        .iter()
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut watches = Vec::new();
    for d in &dirs {
        let flags = crate::dirwatch::Flags::CLOSE_WRITE
            | crate::dirwatch::Flags::MOVED_TO
            | crate::dirwatch::Flags::CREATE;
        watches.push(crate::dirwatch::DirWatch::new(d, flags).map_err(|e| file_err(d, e))?);
    }
    let (s, cert, key) = (serving.clone(), cert.to_path_buf(), key.to_path_buf());
    let reload = async move {
        let mut last = pair.not_after;
        loop {
            let changed =
                futures::future::select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
            tokio::select! {
                _ = stop.cancelled() => return,
                (r, _, _) = changed => if let Err(e) = r {
                    warn!(error = %e, "watching the kubelet API certificate failed; it is no longer reloaded");
                    return;
                }
            }
            match Pair::from_files(&cert, &key) {
                Ok(p) => {
                    if p.not_after != last {
                        info!(cert = %cert.display(), not_after = p.not_after, "kubelet API certificate reloaded");
                    }
                    last = p.not_after;
                    s.set(&p);
                }
                Err(e) => {
                    warn!(error = %e, "kubelet API certificate changed but does not read whole; keeping the one served")
                }
            }
        }
    };
    Ok((serving, reload))
}

/// A self-signed pair for `names`, made once (upstream's `kubelet.crt`
/// and `kubelet.key`, valid a year).
pub fn self_signed(pki: &Path, names: &[String]) -> Result<Arc<ServingCert>, CertError> {
    let (crt, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
    if !(crt.exists() && key.exists()) {
        make_self_signed(&crt, &key, names)?;
    }
    Ok(ServingCert::new(Some(&Pair::from_files(&crt, &key)?)))
}

fn make_self_signed(crt: &Path, key: &Path, names: &[String]) -> Result<(), CertError> {
    if let Some(d) = crt.parent() {
        std::fs::create_dir_all(d).map_err(|e| file_err(d, e))?;
    }
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| file_err(crt, e))?;
    let cn = format!(
        "{}@{}",
        names.first().map_or("kinglet", String::as_str),
        jiff::Timestamp::now().as_second()
    );
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let today = jiff::Zoned::now().date();
    params.not_before =
        rcgen::date_time_ymd(today.year().into(), today.month() as u8, today.day() as u8);
    params.not_after = rcgen::date_time_ymd(
        i32::from(today.year()) + 1,
        today.month() as u8,
        today.day().min(28) as u8,
    );
    let kp = rcgen::KeyPair::generate().map_err(|e| file_err(key, e))?;
    let cert = params.self_signed(&kp).map_err(|e| file_err(crt, e))?;
    crate::fsutil::write_private_atomic(
        key,
        kp.serialize_pem().as_bytes(),
        crate::fsutil::Flush::All,
    )
    .map_err(|e| file_err(key, e))?;
    crate::fsutil::write_private_atomic(crt, cert.pem().as_bytes(), crate::fsutil::Flush::All)
        .map_err(|e| file_err(crt, e))?;
    info!(cert = %crt.display(), "made a self-signed serving certificate for the kubelet API");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair_pem(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[tokio::test]
    async fn files_are_served_again_when_rewritten() {
        let d = tempfile::tempdir().unwrap();
        let (crt, key) = (d.path().join("tls.crt"), d.path().join("tls.key"));
        let (c, k) = pair_pem("one");
        std::fs::write(&crt, &c).unwrap();
        std::fs::write(&key, &k).unwrap();
        let stop = CancellationToken::new();
        let (serving, reload) = from_files(&crt, &key, stop.clone()).unwrap();
        let task = tokio::spawn(reload);
        let first = serving.current.read().unwrap().clone().unwrap();
        // A half-written pair keeps the old one: a truncated certificate,
        // then a new certificate beside the old key.
        let (c2, k2) = pair_pem("two");
        std::fs::write(&crt, "-----BEGIN CERTIFICATE-----\ntrunc").unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let still = serving.current.read().unwrap().clone().unwrap();
        assert_eq!(still.cert, first.cert);
        std::fs::write(&crt, &c2).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let still = serving.current.read().unwrap().clone().unwrap();
        assert_eq!(still.cert, first.cert);
        // Renamed over, as a rotation writes: the new pair is served.
        std::fs::write(d.path().join("k.tmp"), &k2).unwrap();
        std::fs::rename(d.path().join("k.tmp"), &key).unwrap();
        std::fs::write(d.path().join("c.tmp"), &c2).unwrap();
        std::fs::rename(d.path().join("c.tmp"), &crt).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let now = serving.current.read().unwrap().clone().unwrap();
            if now.cert != first.cert {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "not reloaded");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn a_self_signed_pair_is_made_once() {
        let d = tempfile::tempdir().unwrap();
        let names = vec!["edge-1".to_string(), "10.0.0.7".to_string()];
        let a = self_signed(d.path(), &names).unwrap();
        let b = self_signed(d.path(), &names).unwrap();
        let cert = |s: &ServingCert| s.current.read().unwrap().clone().unwrap().cert.clone();
        assert_eq!(cert(&a), cert(&b));
        assert!(ServingCert::new(None).current.read().unwrap().is_none());
    }
}
