//! The kubelet API on `address:port` (10250), as upstream's
//! `pkg/kubelet/server`: HTTPS (rustls with ring: TLS 1.2 and 1.3, ring's
//! default suites, all AEAD with forward secrecy), every request
//! authenticated and authorized ([`auth`]), then routed: `/healthz`,
//! `/pods`, `/configz`, `/containerLogs` ([`logs`]), `/exec`, `/attach`,
//! `/run` ([`exec`], over [`ws`]), `/portForward` ([`portforward`]),
//! `/stats/summary`, `/metrics/resource` and `/metrics/cadvisor` ([`stats`],
//! [`crate::cadvisor`]), `/metrics`,
//! `/metrics/probes`, `/statusz` and `/flagz` ([`zpages`]). The
//! read-only port, when `readOnlyPort` is set, serves the unauthenticated
//! subset upstream serves there, over plain HTTP ([`serve_read_only`]).
//!
//! The serving certificate comes from [`crate::certificate::serving`]
//! (files reloaded on change, `serverTLSBootstrap`, or self-signed).
//! Both ports are bounded against unauthenticated peers ([`listener`]:
//! connection limits, handshake and header timeouts, accept back-off).

pub mod auth;
pub mod exec;
pub mod idle;
pub mod listener;
pub mod logs;
pub mod portforward;
pub mod portforward_ws;
pub mod stats;
pub mod ws;
pub mod zpages;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::pods::StatusView;
use auth::{Auth, User};
pub use listener::Listener;

type Body = BoxBody<Bytes, Infallible>;

/// Everything a request may read.
pub struct State {
    pub auth: Auth,
    pub view: StatusView,
    pub log_root: PathBuf,
    /// `/configz`: the effective configuration, as upstream's
    /// `{"kubeletconfig": {...}}`.
    pub configz: Bytes,
    /// Where `/exec` starts its processes.
    pub runtime: Arc<dyn kinglet_runtime::Runtime>,
    /// `/stats/summary` and `/metrics/resource`.
    pub stats: stats::Sampler,
    /// `/metrics`.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// `streamingConnectionIdleTimeout`: exec, attach and port-forward
    /// connections idle this long are closed.
    pub stream_idle_timeout: std::time::Duration,
}

/// Errors setting the server up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("kubelet API TLS: {0}")]
    Tls(String),
    #[error("kubelet API client CA {path}: {message}")]
    ClientCa { path: String, message: String },
    #[error("kubelet API on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How the server's TLS is set up (the certificate itself is
/// [`crate::certificate::serving`]'s).
pub struct TlsOptions {
    pub client_ca: Option<PathBuf>,
    /// `tlsCipherSuites` (TLS 1.2 ones restrict; empty: all of kinglet's).
    pub cipher_suites: Vec<String>,
    /// `tlsMinVersion`: `VersionTLS13` drops TLS 1.2.
    pub min_version: String,
}

/// The rustls config: the serving certificate, and client certificates
/// checked against the client CA (optional: bearer tokens need none).
pub fn tls_config(
    t: &TlsOptions,
    cert: Arc<crate::certificate::serving::ServingCert>,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut provider = rustls::crypto::ring::default_provider();
    if !t.cipher_suites.is_empty() {
        let wanted: Vec<&str> = crate::config::TLS12_SUITES
            .iter()
            .filter(|(go, _)| t.cipher_suites.iter().any(|s| s == go))
            .map(|(_, rustls_name)| *rustls_name)
            .collect();
        provider.cipher_suites.retain(|cs| {
            let name = format!("{:?}", cs.suite());
            name.starts_with("TLS13_") || wanted.contains(&name.as_str())
        });
    }
    let provider = Arc::new(provider);
    let versions: &[&rustls::SupportedProtocolVersion] = if t.min_version == "VersionTLS13" {
        &[&rustls::version::TLS13]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let builder = match &t.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            let ca_err = |e: &dyn std::fmt::Display| ServerError::ClientCa {
                path: ca.display().to_string(),
                message: e.to_string(),
            };
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| ca_err(&e))? {
                roots
                    .add(c.map_err(|e| ca_err(&e))?)
                    .map_err(|e| ca_err(&e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| ca_err(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(cert);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

pub fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    let err = |source| ServerError::Bind { addr, source };
    let l = std::net::TcpListener::bind(addr).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    TcpListener::from_std(l).map_err(err)
}

/// Serves until `shutdown`.
pub async fn serve(
    listener: Listener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<State>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    while let Some(c) = listener.accept(&shutdown).await {
        let (acceptor, state, stop) = (acceptor.clone(), state.clone(), shutdown.clone());
        tokio::spawn(async move {
            let (peer, _slot) = (c.peer, c.permit);
            let handshake =
                tokio::time::timeout(listener::HANDSHAKE_TIMEOUT, acceptor.accept(c.tcp));
            let tls = match handshake.await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    debug!(%peer, error = %e, "kubelet API TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "kubelet API TLS handshake timed out");
                    return;
                }
            };
            let cert_user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| auth::user_of_cert(c));
            let svc = hyper::service::service_fn(move |req| {
                let (state, user) = (state.clone(), cert_user.clone());
                async move { Ok::<_, Infallible>(handle(&state, user.as_ref(), peer, req).await) }
            });
            let conn = listener::http1()
                .serve_connection(TokioIo::new(tls), svc)
                .with_upgrades();
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = conn => {}
            }
        });
    }
}

/// Serves the read-only port (`readOnlyPort`) until `shutdown`: plain
/// HTTP, no authentication, as upstream's `ListenAndServeKubeletReadOnlyServer`:
/// the default handlers only (`/healthz`, `/pods`, `/stats/summary`,
/// `/metrics*`); the debugging ones answer 405 "Debug endpoints are
/// disabled." and `/configz` is not there.
pub async fn serve_read_only(listener: Listener, state: Arc<State>, shutdown: CancellationToken) {
    while let Some(c) = listener.accept(&shutdown).await {
        let (state, stop) = (state.clone(), shutdown.clone());
        tokio::spawn(async move {
            let (peer, _slot) = (c.peer, c.permit);
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(read_only(&state, req.uri()).await) }
            });
            let conn = listener::http1().serve_connection(TokioIo::new(c.tcp), svc);
            tokio::select! {
                _ = stop.cancelled() => {}
                r = conn => if let Err(e) = r { debug!(%peer, error = %e, "read-only port connection"); },
            }
        });
    }
}

/// The read-only port's routes.
async fn read_only(state: &State, uri: &hyper::Uri) -> Response<Body> {
    let path = uri.path();
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    match first {
        "run" | "exec" | "attach" | "portForward" | "containerLogs" | "runningpods" | "logs"
        | "debug" => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "Debug endpoints are disabled.\n",
        ),
        "healthz" | "pods" | "stats" | "metrics" => {
            route(state, path, uri.query().unwrap_or("")).await
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// A response with `body` of content type `ctype`.
fn respond(code: StatusCode, ctype: &'static str, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}

fn text(code: StatusCode, body: impl Into<String>) -> Response<Body> {
    let body = Full::new(Bytes::from(body.into())).boxed();
    respond(code, "text/plain; charset=utf-8", body)
}

/// Authenticates, authorizes and routes one request.
async fn handle(
    state: &State,
    cert_user: Option<&User>,
    peer: SocketAddr,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let bearer = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let user = match state.auth.authenticate(cert_user, bearer, peer.ip()).await {
        Ok(u) => u,
        Err(auth::Refused::Unauthorized) => return text(StatusCode::UNAUTHORIZED, "Unauthorized"),
        Err(auth::Refused::TooManyReviews) => {
            let mut r = text(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests, please try again later.\n",
            );
            r.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("1"),
            );
            return r;
        }
    };
    let (method, path) = (
        req.method().as_str().to_string(),
        req.uri().path().to_string(),
    );
    if let Err(e) = state.auth.authorize(&user, &method, &path).await {
        debug!(user = %user.name, %path, "kubelet API request denied");
        return text(StatusCode::FORBIDDEN, e.to_string());
    }
    let query = req.uri().query().unwrap_or("").to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let target = |ns, pod, uid| Target { ns, pod, uid };
    match parts.as_slice() {
        [kind @ ("exec" | "attach"), ns, pod, rest @ ..] => {
            let kind = match *kind {
                "exec" => exec::Kind::Exec,
                _ => exec::Kind::Attach,
            };
            let (uid, c) = match rest {
                [c] => (None, *c),
                [uid, c] => (Some(*uid), *c),
                _ => return text(StatusCode::NOT_FOUND, "404 page not found\n"),
            };
            exec::handle(state, req, kind, target(ns, pod, uid), c, &query).await
        }
        ["run", ns, pod, rest @ ..] => {
            let (uid, c) = match rest {
                [c] => (None, *c),
                [uid, c] => (Some(*uid), *c),
                _ => return text(StatusCode::NOT_FOUND, "404 page not found\n"),
            };
            exec::run(state, target(ns, pod, uid), c, &query).await
        }
        ["portForward", ns, pod] => portforward::handle(state, req, target(ns, pod, None)).await,
        ["portForward", ns, pod, uid] => {
            portforward::handle(state, req, target(ns, pod, Some(uid))).await
        }
        _ => route(state, &path, &query).await,
    }
}

/// What `/statusz` lists.
const PATHS: &[&str] = &[
    "/attach",
    "/configz",
    "/containerLogs",
    "/exec",
    "/flagz",
    "/healthz",
    "/metrics",
    "/metrics/cadvisor",
    "/metrics/probes",
    "/metrics/resource",
    "/pods",
    "/portForward",
    "/run",
    "/stats/summary",
    "/statusz",
];

async fn route(state: &State, path: &str, query: &str) -> Response<Body> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["healthz"] => text(StatusCode::OK, "ok"),
        ["pods"] | ["pods", ""] => pods(state),
        ["configz"] => json(state.configz.clone()),
        ["stats", "summary"] | ["stats", "summary", ""] => {
            let snap = state.stats.snapshot().await;
            json(Bytes::from(state.stats.summary(&snap).to_string()))
        }
        ["statusz"] => text(StatusCode::OK, zpages::statusz(state.stats.started, PATHS)),
        ["flagz"] => {
            let args: Vec<String> = std::env::args().collect();
            text(StatusCode::OK, zpages::flagz(&args))
        }
        ["metrics", "probes"] => {
            // The prober's family alone, as upstream's /metrics/probes.
            let all = state.metrics.encode();
            let probes: String = all
                .lines()
                .filter(|l| l.contains("prober_probe") || *l == "# EOF")
                .flat_map(|l| [l, "\n"])
                .collect();
            let body = Full::new(Bytes::from(probes)).boxed();
            respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body,
            )
        }
        ["metrics"] => {
            metrics_gauges(state).await;
            let body = Full::new(Bytes::from(state.metrics.encode())).boxed();
            respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body,
            )
        }
        ["metrics", "cadvisor"] => {
            let body = Full::new(Bytes::from(state.stats.cadvisor().await)).boxed();
            respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                body,
            )
        }
        ["metrics", "resource"] => {
            let snap = state.stats.snapshot().await;
            let body = Full::new(Bytes::from(stats::resource_metrics(&snap))).boxed();
            respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                body,
            )
        }
        ["containerLogs", ns, pod, container] => {
            container_logs(state, ns, pod, container, query).await
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

fn json(body: Bytes) -> Response<Body> {
    respond(StatusCode::OK, "application/json", Full::new(body).boxed())
}

/// The pod a streaming request names: `{ns}/{pod}[/{uid}]`.
pub struct Target<'a> {
    pub ns: &'a str,
    pub pod: &'a str,
    pub uid: Option<&'a str>,
}

impl Target<'_> {
    /// The pod's UID and entry, or upstream's 404.
    fn find(
        &self,
        view: &StatusView,
    ) -> Result<(String, crate::pods::status::manager::PodEntry), (StatusCode, String)> {
        view.pods()
            .into_iter()
            .find(|(id, e)| {
                e.pod.metadata.namespace.as_deref().unwrap_or("default") == self.ns
                    && e.pod.metadata.name.as_deref() == Some(self.pod)
                    && self.uid.is_none_or(|u| u == id)
            })
            .ok_or_else(|| (StatusCode::NOT_FOUND, "pod does not exist".to_string()))
    }
}

/// The gauges `/metrics` reads at scrape time from the runtime.
async fn metrics_gauges(state: &State) {
    use kinglet_runtime::ContainerState;
    let m = &state.metrics;
    if let Ok(boxes) = state.runtime.list_pod_sandboxes().await {
        m.running_pods
            .set(boxes.iter().filter(|b| b.ready).count() as i64);
    }
    if let Ok(cs) = state.runtime.list_containers().await {
        for (label, st) in [
            ("created", ContainerState::Created),
            ("running", ContainerState::Running),
            ("exited", ContainerState::Exited),
            ("unknown", ContainerState::Unknown),
        ] {
            let n = cs.iter().filter(|c| c.state == st).count() as i64;
            m.running_containers
                .get_or_create(&crate::metrics::StateLabels {
                    container_state: label.into(),
                })
                .set(n);
        }
    }
}

/// The node's pods as a `PodList`, statuses as last reported.
fn pods(state: &State) -> Response<Body> {
    let items: Vec<serde_json::Value> = state
        .view
        .pods()
        .into_iter()
        .map(|(_, e)| {
            let mut p = (*e.pod).clone();
            p.status = Some((*e.status).clone());
            serde_json::to_value(p).unwrap_or_default()
        })
        .collect();
    let list =
        serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items});
    json(Bytes::from(list.to_string()))
}

async fn container_logs(
    state: &State,
    ns: &str,
    pod: &str,
    container: &str,
    query: &str,
) -> Response<Body> {
    let now = jiff::Timestamp::now().as_nanosecond() as i64;
    let opts = match logs::parse_query(query, now) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (path, id) = match logs::locate(
        &state.view,
        &state.log_root,
        ns,
        pod,
        container,
        opts.previous,
    ) {
        Ok(p) => p,
        Err((code, msg)) => {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
            return text(code, msg);
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let view = state.view.clone();
    let (ns, pod_name, cname) = (ns.to_string(), pod.to_string(), container.to_string());
    // Follow ends when the container (this one, by ID) no longer runs.
    let running = move || {
        view.pods().into_iter().any(|(_, e)| {
            e.pod.metadata.namespace.as_deref().unwrap_or("default") == ns
                && e.pod.metadata.name.as_deref() == Some(pod_name.as_str())
                && e.status.container_statuses.iter().flatten().any(|c| {
                    c.name == cname
                        && c.container_id.as_deref() == Some(id.as_str())
                        && c.state.as_ref().is_some_and(|s| s.running.is_some())
                })
        })
    };
    if !path.exists() {
        warn!(path = %path.display(), "no log file for a log request");
    }
    tokio::spawn(logs::stream(path, opts, running, tx));
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(hyper::body::Frame::data(b)), rx))
    }));
    respond(StatusCode::OK, "text/plain", BodyExt::boxed(body))
}
