//! The handlers probes and lifecycle hooks run (upstream's `pkg/probe`):
//! exec through the runtime, `httpGet`, `tcpSocket` and `grpc` from the
//! node to the pod, with upstream's results and messages.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use kinglet_runtime::{Runtime, RuntimeError};
use tokio::net::TcpStream;

/// The most of a probe's output (exec) or response body (HTTP) kept, as
/// upstream's `maxReadLength` / `maxRespBodyLength`.
pub const MAX_OUTPUT: usize = 10 * 1024;

/// The `User-Agent` of probes and hooks: `kube-probe/1.37`, as upstream's
/// (kinglet speaks the API of that release).
pub const PROBE_USER_AGENT: &str = "kube-probe/1.37";
pub const HOOK_USER_AGENT: &str = "kube-lifecycle/1.37";

/// A probe's verdict, as upstream's `probe.Result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Success,
    /// Success, with something to say (a redirect to another host).
    Warning,
    Failure,
}

/// What one run of a handler found; `Err` is an error that is not the
/// container's answer (upstream's "probe errored").
pub type Outcome = Result<(Verdict, String), ProbeError>;

/// Why a handler got no answer. For `httpGet` and `tcpSocket` the message
/// is the probe's failure message, in Go's wording as upstream's; the
/// others are upstream's "probe errored".
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("port {0:?} not found")]
    PortNotFound(String),
    #[error("invalid port number: {0}")]
    BadPort(i32),
    #[error("bad probe url: {0}")]
    BadUrl(#[from] url::ParseError),
    #[error("bad probe request: {0}")]
    BadRequest(#[from] http::Error),
    #[error("bad host {host:?}: {source}")]
    BadHost {
        host: String,
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("bad grpc address {addr:?}: {source}")]
    BadGrpcAddress {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("dial tcp {addr}: lookup {host}: {source}")]
    Lookup {
        addr: String,
        host: String,
        source: std::io::Error,
    },
    #[error("dial tcp {addr}: lookup {host}: no such host")]
    NoSuchHost { addr: String, host: String },
    #[error("dial tcp {addr}: {}", go_dial_wording(.source))]
    Dial {
        addr: String,
        source: std::io::Error,
    },
    #[error("tls: {0}")]
    Tls(std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("Get {url:?}: {source}")]
    Get {
        url: String,
        source: Box<ProbeError>,
    },
    #[error(
        "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )]
    Timeout { url: String },
    #[error("Get {url:?}: stopped after 10 redirects")]
    TooManyRedirects { url: String },
    #[error("missing probe handler for {pod}:{container}")]
    NoHandler { pod: String, container: String },
}

fn truncate(mut s: Vec<u8>) -> String {
    s.truncate(MAX_OUTPUT);
    String::from_utf8_lossy(&s).into_owned()
}

/// Runs `cmd` in the container: exit 0 is success; the output (stdout then
/// stderr, as CRI's runner joins them) is the message.
pub async fn exec(rt: &dyn Runtime, id: &str, cmd: &[String], timeout: Duration) -> Outcome {
    match rt.exec_sync(id, cmd, timeout).await {
        Ok(r) => {
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            let verdict = if r.exit_code == 0 {
                Verdict::Success
            } else {
                Verdict::Failure
            };
            Ok((verdict, truncate(out)))
        }
        Err(RuntimeError::DeadlineExceeded(_)) => Ok((
            Verdict::Failure,
            format!(
                "command {:?} timed out",
                cmd.join(" ") // upstream quotes the command as %q of its parts
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// One HTTP GET target, resolved from the pod spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpTarget {
    /// `http` or `https` (certificates are not verified, as upstream).
    pub scheme: String,
    pub host: String,
    pub port: u16,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl HttpTarget {
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let path = if self.path.starts_with('/') {
            self.path.clone()
        } else {
            format!("/{}", self.path)
        };
        format!("{}://{host}:{}{path}", self.scheme, self.port)
    }
}

/// What one HTTP exchange answered.
struct Answer {
    status: u16,
    location: Option<String>,
    body: Vec<u8>,
}

/// GETs the target, following redirects to the same host (up to 10), as
/// upstream's HTTP prober: 2xx succeeds, a 3xx it stops at (another host)
/// succeeds with a warning, anything else fails. The whole exchange is
/// bounded by `timeout`, as Go's `Client.Timeout`.
pub async fn http_get(t: &HttpTarget, timeout: Duration, user_agent: &str) -> Outcome {
    Ok(match fetch(t, timeout, user_agent).await {
        Ok(a) => verdict_of(&a),
        Err(e) => (Verdict::Failure, e.to_string()),
    })
}

/// GETs the target as [`http_get`] does and returns the final answer's
/// status; `Err` is a failure to get any answer (what fails a hook).
pub async fn http_status(
    t: &HttpTarget,
    timeout: Duration,
    user_agent: &str,
) -> Result<u16, ProbeError> {
    fetch(t, timeout, user_agent).await.map(|a| a.status)
}

async fn fetch(t: &HttpTarget, timeout: Duration, user_agent: &str) -> Result<Answer, ProbeError> {
    match tokio::time::timeout(timeout, follow(t, user_agent)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout { url: t.url() }),
    }
}

async fn follow(t: &HttpTarget, user_agent: &str) -> Result<Answer, ProbeError> {
    let mut url = url::Url::parse(&t.url())?;
    let first_host = url.host_str().unwrap_or_default().to_string();
    for hop in 0.. {
        let a = get_once(&url, &t.headers, user_agent)
            .await
            .map_err(|e| ProbeError::Get {
                url: url.to_string(),
                source: Box::new(e),
            })?;
        let redirect = matches!(a.status, 301 | 302 | 303 | 307 | 308);
        if let (true, Some(loc)) = (redirect, &a.location)
            && let Ok(next) = url.join(loc)
        {
            // Another host: stop here; the 3xx answer is the result.
            if next.host_str().unwrap_or_default() != first_host {
                return Ok(a);
            }
            if hop >= 9 {
                return Err(ProbeError::TooManyRedirects {
                    url: next.to_string(),
                });
            }
            url = next;
            continue;
        }
        return Ok(a);
    }
    unreachable!("the loop returns")
}

fn verdict_of(a: &Answer) -> (Verdict, String) {
    let body = truncate(a.body.clone());
    match a.status {
        200..=299 => (Verdict::Success, body),
        300..=399 => (
            Verdict::Warning,
            format!("Probe terminated redirects, Response body: {body}"),
        ),
        s => (
            Verdict::Failure,
            format!("HTTP probe failed with statuscode: {s}"),
        ),
    }
}

/// Go's wording of why a dial failed, as upstream's messages carry it.
fn go_dial_wording(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
        std::io::ErrorKind::TimedOut => "i/o timeout".to_string(),
        std::io::ErrorKind::HostUnreachable => "connect: no route to host".to_string(),
        std::io::ErrorKind::NetworkUnreachable => "connect: network is unreachable".to_string(),
        _ => e.to_string().to_lowercase(),
    }
}

/// Connects with `SO_LINGER` set, as upstream's probe dialer, so probes
/// every second leave no sockets in TIME_WAIT. Upstream lingers one second;
/// here it is zero (the close resets at once), because a lingering close
/// would block the async thread that drops the socket.
async fn dial(host: &str, port: u16) -> Result<TcpStream, ProbeError> {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let resolved = tokio::net::lookup_host(&addr)
        .await
        .map_err(|source| ProbeError::Lookup {
            addr: addr.clone(),
            host: host.into(),
            source,
        })?
        .next()
        .ok_or_else(|| ProbeError::NoSuchHost {
            addr: addr.clone(),
            host: host.into(),
        })?;
    let dial = |source| ProbeError::Dial {
        addr: addr.clone(),
        source,
    };
    let sock = if resolved.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(dial)?;
    let _ = rustix::net::sockopt::set_socket_linger(&sock, Some(Duration::ZERO));
    sock.connect(resolved).await.map_err(dial)
}

/// TLS without verification, as upstream's probes and hooks
/// (`InsecureSkipVerify`); made once, not at every HTTPS probe.
fn insecure_tls() -> std::sync::Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> =
        std::sync::OnceLock::new();
    CONFIG.get_or_init(make_insecure_tls).clone()
}

fn make_insecure_tls() -> std::sync::Arc<rustls::ClientConfig> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(NoVerify(provider)))
        .with_no_client_auth();
    std::sync::Arc::new(cfg)
}

#[derive(Debug)]
struct NoVerify(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One GET on a fresh connection (no keep-alive, as upstream's prober).
async fn get_once(
    url: &url::Url,
    headers: &[(String, String)],
    user_agent: &str,
) -> Result<Answer, ProbeError> {
    let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']);
    let port = url.port_or_known_default().unwrap_or(80);
    let tcp = dial(host, port).await?;
    let req = build_request(url, headers, user_agent)?;
    if url.scheme() == "https" {
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|source| {
            ProbeError::BadHost {
                host: host.into(),
                source,
            }
        })?;
        let tls = tokio_rustls::TlsConnector::from(insecure_tls())
            .connect(name, tcp)
            .await
            .map_err(ProbeError::Tls)?;
        exchange(TokioIo::new(tls), req).await
    } else {
        exchange(TokioIo::new(tcp), req).await
    }
}

fn build_request(
    url: &url::Url,
    headers: &[(String, String)],
    user_agent: &str,
) -> Result<hyper::Request<Empty<Bytes>>, ProbeError> {
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let authority = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let mut b = hyper::Request::get(path);
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    if !has("host") {
        b = b.header("Host", authority);
    }
    if !has("user-agent") {
        b = b.header("User-Agent", user_agent);
    }
    if !has("accept") {
        b = b.header("Accept", "*/*");
    }
    for (k, v) in headers {
        // An explicitly empty Accept removes the header, as upstream.
        if k.eq_ignore_ascii_case("accept") && v.is_empty() {
            continue;
        }
        b = b.header(k.as_str(), v.as_str());
    }
    Ok(b.body(Empty::new())?)
}

async fn exchange<T>(io: T, req: hyper::Request<Empty<Bytes>>) -> Result<Answer, ProbeError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let res = send.send_request(req).await.map_err(ProbeError::Http);
    let out = match res {
        Ok(res) => {
            let status = res.status().as_u16();
            let location = res
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let mut body = Vec::new();
            let mut b = res.into_body();
            // The body is read up to the cap, then the connection dropped.
            while body.len() < MAX_OUTPUT {
                match b.frame().await {
                    Some(Ok(f)) => {
                        if let Some(d) = f.data_ref() {
                            body.extend_from_slice(d);
                        }
                    }
                    _ => break,
                }
            }
            Ok(Answer {
                status,
                location,
                body,
            })
        }
        Err(e) => Err(e),
    };
    driver.abort();
    out
}

/// Connects to `host:port`: success when the connection is made.
pub async fn tcp(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = format!("{host}:{port}");
    match tokio::time::timeout(timeout, dial(host, port)).await {
        Ok(Ok(_)) => Ok((Verdict::Success, String::new())),
        Ok(Err(e)) => Ok((Verdict::Failure, e.to_string())),
        Err(_) => Ok((Verdict::Failure, format!("dial tcp {addr}: i/o timeout"))),
    }
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

fn serving_status(s: i32) -> &'static str {
    match s {
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    }
}

/// `grpc.health.v1.Health/Check` on `host:port` (plain text, as upstream
/// without the TLS gate): `SERVING` succeeds.
pub async fn grpc(host: &str, port: u16, service: &str, timeout: Duration) -> Outcome {
    let addr = format!("{host}:{port}");
    let secs = format!("{}s", timeout.as_secs_f64());
    let bad = |source| ProbeError::BadGrpcAddress {
        addr: addr.clone(),
        source,
    };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(bad)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .user_agent(PROBE_USER_AGENT)
        .map_err(bad)?;
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let msg = format!("error: failed to connect service at {addr:?}: {e}");
            return Ok((Verdict::Failure, msg));
        }
        Err(_) => {
            let msg = format!(
                "timeout: failed to connect service {addr:?} within {secs}: context deadline exceeded"
            );
            return Ok((Verdict::Failure, msg));
        }
    };
    let mut client = tonic::client::Grpc::new(channel);
    let call = async {
        client
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
        let req = tonic::Request::new(HealthCheckRequest {
            service: service.into(),
        });
        client
            .unary::<_, HealthCheckResponse, _>(req, path, tonic_prost::ProstCodec::default())
            .await
    };
    let resp = match tokio::time::timeout(timeout, call).await {
        Err(_) => {
            let msg = format!("timeout: health rpc did not complete within {secs}");
            return Ok((Verdict::Failure, msg));
        }
        Ok(r) => r,
    };
    Ok(match resp {
        Ok(r) if r.get_ref().status == 1 => (Verdict::Success, "service healthy".into()),
        Ok(r) => (
            Verdict::Failure,
            format!(
                "service unhealthy (responded with {:?})",
                serving_status(r.get_ref().status)
            ),
        ),
        Err(s) if s.code() == tonic::Code::Unimplemented => (
            Verdict::Failure,
            format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                s.message()
            ),
        ),
        Err(s) if s.code() == tonic::Code::DeadlineExceeded => (
            Verdict::Failure,
            format!("timeout: health rpc did not complete within {secs}"),
        ),
        Err(s) => (
            Verdict::Failure,
            format!("error: health rpc probe failed: {s}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server answering each connection from `answers`.
    async fn server(answers: Vec<String>) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let h = tokio::spawn(async move {
            let mut seen = Vec::new();
            for a in answers {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                s.write_all(a.as_bytes()).await.unwrap();
            }
            seen
        });
        (port, h)
    }

    fn target(port: u16, path: &str) -> HttpTarget {
        HttpTarget {
            scheme: "http".into(),
            host: "127.0.0.1".into(),
            port,
            path: path.into(),
            headers: vec![("X-Probe".into(), "yes".into())],
        }
    }

    fn reply(status: &str, extra: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn http_success_failure_and_the_request_upstream_sends() {
        let (port, h) = server(vec![reply("200 OK", "", "fine"), reply("500 Oops", "", "")]).await;
        let t = target(port, "/healthz");
        let ok = http_get(&t, Duration::from_secs(5), PROBE_USER_AGENT).await;
        assert_eq!(ok.unwrap(), (Verdict::Success, "fine".into()));
        let bad = http_get(&t, Duration::from_secs(5), PROBE_USER_AGENT).await;
        assert_eq!(
            bad.unwrap(),
            (
                Verdict::Failure,
                "HTTP probe failed with statuscode: 500".into()
            )
        );
        let seen = h.await.unwrap();
        let req = seen[0].to_lowercase();
        assert!(req.starts_with("get /healthz http/1.1\r\n"), "{req}");
        assert!(req.contains("user-agent: kube-probe/1.37\r\n"), "{req}");
        assert!(req.contains("accept: */*\r\n"), "{req}");
        assert!(req.contains("x-probe: yes\r\n"), "{req}");
        assert!(
            req.contains(&format!("host: 127.0.0.1:{port}\r\n")),
            "{req}"
        );
    }

    #[tokio::test]
    async fn redirects_to_the_same_host_are_followed_another_host_warns() {
        let (port, _h) = server(vec![
            reply("302 Found", "location: /next\r\n", ""),
            reply("200 OK", "", "there"),
            reply(
                "302 Found",
                "location: http://elsewhere.invalid/x\r\n",
                "moved",
            ),
        ])
        .await;
        let t = target(port, "/start");
        let r = http_get(&t, Duration::from_secs(5), PROBE_USER_AGENT).await;
        assert_eq!(r.unwrap(), (Verdict::Success, "there".into()));
        let r = http_get(&t, Duration::from_secs(5), PROBE_USER_AGENT).await;
        assert_eq!(
            r.unwrap(),
            (
                Verdict::Warning,
                "Probe terminated redirects, Response body: moved".into()
            )
        );
    }

    #[tokio::test]
    async fn a_refused_connection_and_a_silent_server_fail_with_go_wording() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let (v, msg) = tcp("127.0.0.1", port, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(v, Verdict::Failure);
        assert_eq!(
            msg,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let t = target(port, "/");
        let (v, msg) = http_get(&t, Duration::from_millis(300), PROBE_USER_AGENT)
            .await
            .unwrap();
        assert_eq!(v, Verdict::Failure);
        assert!(msg.contains("context deadline exceeded"), "{msg}");
        let ok = tcp("127.0.0.1", port, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(ok.0, Verdict::Success);
    }

    #[tokio::test]
    async fn grpc_against_a_plain_http_server_fails_without_hanging() {
        let (port, _h) = server(vec![reply("200 OK", "", "")]).await;
        let (v, _) = grpc("127.0.0.1", port, "", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(v, Verdict::Failure);
    }
}
