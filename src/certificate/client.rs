//! The API client of a node whose client certificate rotates
//! (`rotateCertificates`), as upstream's `kubeletcertificate`'s client
//! manager: the client's TLS identity is a resolver over the current pair,
//! so a renewed certificate is used from the next handshake on without a
//! new `kube::Client` (every watcher and writer holds a clone of the one
//! built at start). At the swap the connection pool is replaced too, as
//! upstream closes its connections: new requests connect again with the
//! new certificate (and no resumed session of the old one), requests and
//! watches already open finish on theirs — until the old certificate
//! expires: the apiserver checks a client certificate's validity on every
//! request, so a watch on an expired one fails and is made again.
//!
//! The client stack is kube's own (base URI, auth layer, extra headers,
//! hyper's pooled client behind kube's connect/read/write timeouts) with
//! the pool behind [`Pool`].

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use rustls::sign::CertifiedKey;

use super::{CertError, Pair, Store};

type Connector = hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>;
type Hyper = hyper_util::client::legacy::Client<Connector, kube::client::Body>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client certificate in use, swapped on renewal.
#[derive(Debug)]
pub struct ClientCert {
    current: RwLock<Arc<CertifiedKey>>,
    pool: OnceLock<Pool>,
}

impl ClientCert {
    pub fn new(pair: &Pair) -> Arc<ClientCert> {
        Arc::new(ClientCert {
            current: RwLock::new(pair.key.clone()),
            pool: OnceLock::new(),
        })
    }

    /// Uses `pair` from the next handshake on, with a fresh pool so that
    /// the next requests make those handshakes.
    pub fn set(&self, pair: &Pair) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = pair.key.clone();
        if let Some(pool) = self.pool.get() {
            pool.renew();
        }
    }
}

impl rustls::client::ResolvesClientCert for ClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The kubeconfig's client certificate and key, if it authenticates with
/// one (files or inline data).
pub fn kubeconfig_pair(config: &kube::Config, path: &Path) -> Option<Pair> {
    let a = &config.auth_info;
    let read = |file: &Option<String>, data: &Option<String>| -> Option<Vec<u8>> {
        use base64::Engine;
        match (file, data) {
            (Some(f), _) => std::fs::read(f).ok(),
            (None, Some(d)) => base64::engine::general_purpose::STANDARD.decode(d).ok(),
            _ => None,
        }
    };
    let key_data = a
        .client_key_data
        .as_ref()
        .map(|s| secrecy::ExposeSecret::expose_secret(s).to_string());
    let cert = read(&a.client_certificate, &a.client_certificate_data)?;
    let key = read(&a.client_key, &key_data)?;
    Pair::from_pem(&cert, &key, path).ok()
}

/// The pair to start from: the store's current one when it is valid (it
/// is newer than the kubeconfig's once a renewal happened, as upstream's
/// file store prefers it), else the kubeconfig's.
pub fn initial(store: &Store, from_kubeconfig: Pair) -> Pair {
    match store.load() {
        Some(p) if p.valid_for(0) && p.not_after >= from_kubeconfig.not_after => p,
        _ => from_kubeconfig,
    }
}

/// A kube client with `cert` as its TLS identity.
pub fn build(config: &kube::Config, cert: Arc<ClientCert>) -> Result<kube::Client, CertError> {
    let err = |e: &dyn std::fmt::Display| CertError::Request(format!("api client: {e}"));
    let mut tls = config.rustls_client_config().map_err(|e| err(&e))?;
    tls.client_auth_cert_resolver = cert.clone();
    let server_name = match &config.tls_server_name {
        Some(n) => Some(n.clone().try_into().map_err(|e| err(&e))?),
        None => None,
    };
    let (connect, read, write) = (
        config.connect_timeout,
        config.read_timeout,
        config.write_timeout,
    );
    let make = move || -> Hyper {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        // A session cache of its own: a resumed TLS session carries the
        // identity of its first handshake (the old certificate), and the
        // apiserver checks that certificate's validity on every request.
        let mut tls = tls.clone();
        tls.resumption = rustls::client::Resumption::default();
        let mut https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        if let Some(name) = &server_name {
            https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                rustls::pki_types::ServerName::clone(name),
            ));
        }
        let mut timed =
            hyper_timeout::TimeoutConnector::new(https.enable_http1().wrap_connector(http));
        timed.set_connect_timeout(connect);
        timed.set_read_timeout(read);
        timed.set_write_timeout(write);
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(timed)
    };
    let pool = cert.pool.get_or_init(|| Pool {
        current: Arc::new(RwLock::new(make())),
        make: Box::new(make),
    });
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(|e| err(&e))?)
        .layer(config.extra_headers_layer().map_err(|e| err(&e))?)
        .service(PoolService(pool.current.clone()));
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// The hyper client (and so the connection pool) in use, replaced whole
/// when the certificate changes.
pub struct Pool {
    current: Arc<RwLock<Hyper>>,
    make: Box<dyn Fn() -> Hyper + Send + Sync>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

impl Pool {
    fn renew(&self) {
        let fresh = (self.make)();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    }
}

/// The bottom of the stack: a request goes to the pool of the moment.
#[derive(Clone)]
struct PoolService(Arc<RwLock<Hyper>>);

impl tower::Service<http::Request<kube::client::Body>> for PoolService {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // hyper's legacy client is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.0.read().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(async move { client.request(req).await.map_err(BoxError::from) })
    }
}
