//! The local health endpoint (`/healthz` on `127.0.0.1:10248` by default),
//! answered from heartbeats: `syncloop`, which the node status loop beats
//! every round, and `PLEG`, which the pod relist beats (stale after
//! upstream's 3 minutes), so a wedged loop shows up as unhealthy rather
//! than a cheerful `ok`. The same checks gate systemd's watchdog: kinglet
//! pings `WATCHDOG=1` only while every one of them is healthy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Liveness of the main loop: the last beat, in ms since `start`.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    start: Instant,
    last_ms: Arc<AtomicU64>,
    max_age: Duration,
}

impl Heartbeat {
    /// A heartbeat that counts as stale after `max_age` without a beat. It
    /// starts fresh, so start-up is not reported as a failure.
    pub fn new(max_age: Duration) -> Self {
        Heartbeat {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
            max_age,
        }
    }

    pub fn beat(&self) {
        // At least 1: 0 means "never beaten".
        let ms = (self.start.elapsed().as_millis() as u64).max(1);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether it has beaten at all (an upgrade is committed only on real
    /// beats, not on the fresh start).
    pub fn beaten(&self) -> bool {
        self.last_ms.load(Ordering::Relaxed) > 0
    }

    pub fn healthy(&self) -> bool {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last) <= self.max_age
    }
}

/// The named checks `/healthz` answers from.
pub type Checks = Arc<Vec<(&'static str, Heartbeat)>>;

/// Whether the API server answers, as the lease renewals find it: online,
/// or offline since when (Unix seconds). Not a health check — an offline
/// node keeps its pods running and stays healthy — but said by
/// `/healthz?verbose` and, through a file beside the pod records that
/// outlives the process, by `kinglet pods ls`.
#[derive(Clone, Debug)]
pub struct ApiLink {
    since: Arc<std::sync::atomic::AtomicI64>,
    file: Arc<std::path::PathBuf>,
    /// A call of this run failed since the API server last answered: the
    /// file alone may be stale (a power cut while offline, then a boot
    /// with the link back).
    seen: Arc<std::sync::atomic::AtomicBool>,
}

impl ApiLink {
    /// The link as the last run left it in `file` (offline across a
    /// restart or a reboot stays offline until the API answers).
    pub fn new(file: std::path::PathBuf) -> ApiLink {
        let since = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.trim().parse::<jiff::Timestamp>().ok())
            .map_or(0, |t| t.as_second());
        ApiLink {
            since: Arc::new(since.into()),
            file: Arc::new(file),
            seen: Arc::default(),
        }
    }

    /// Offline as this run has seen it, not only as the last run left it:
    /// what may skip the API server for kept copies.
    pub fn known_offline(&self) -> bool {
        self.seen.load(Ordering::Relaxed) && self.offline_since().is_some()
    }

    /// Offline since (Unix seconds), or `None` while online.
    pub fn offline_since(&self) -> Option<i64> {
        Some(self.since.load(Ordering::Relaxed)).filter(|s| *s != 0)
    }

    /// The API server answered. True if it was offline until now.
    pub async fn reached(&self) -> bool {
        self.seen.store(false, Ordering::Relaxed);
        if self.since.swap(0, Ordering::Relaxed) == 0 {
            return false;
        }
        let file = self.file.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(&*file)).await;
        true
    }

    /// The API server did not answer: offline from now, unless already.
    pub async fn lost(&self) {
        self.seen.store(true, Ordering::Relaxed);
        let now = jiff::Timestamp::now().as_second().max(1);
        if self
            .since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let file = self.file.clone();
        let text = format!("{}\n", Self::format(now));
        let _ = tokio::task::spawn_blocking(move || {
            crate::fsutil::write_private_atomic(&file, text.as_bytes(), crate::fsutil::Flush::All)
        })
        .await;
    }

    /// RFC 3339, in seconds.
    pub fn format(since: i64) -> String {
        jiff::Timestamp::from_second(since).map_or_else(|_| since.to_string(), |t| t.to_string())
    }
}

/// One check as upstream's healthz prints it (a failure's reason withheld).
fn check_line(name: &str, hb: &Heartbeat) -> String {
    match hb.healthy() {
        true => format!("[+]{name} ok\n"),
        false => format!("[-]{name} failed: reason withheld\n"),
    }
}

/// `/healthz?verbose`: each check, the API link, then the verdict.
fn verbose(checks: &Checks, link: Option<&ApiLink>) -> String {
    let mut out = String::from("[+]ping ok\n");
    for (name, hb) in checks.iter() {
        out.push_str(&check_line(name, hb));
    }
    match link.and_then(ApiLink::offline_since) {
        Some(since) => out.push_str(&format!(
            "[+]apiserver offline since {}: pods run from the local store\n",
            ApiLink::format(since)
        )),
        None if link.is_some() => out.push_str("[+]apiserver ok\n"),
        None => {}
    }
    out
}

fn respond(
    checks: &Checks,
    link: Option<&ApiLink>,
    req: &Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let failed: String = checks
        .iter()
        .filter(|(_, hb)| !hb.healthy())
        .map(|(name, hb)| check_line(name, hb))
        .collect();
    let verbose_asked = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "verbose" || kv.starts_with("verbose="))
    });
    let (code, body) = match req.uri().path() {
        "/healthz" if verbose_asked => {
            let verdict = match failed.is_empty() {
                true => (StatusCode::OK, "healthz check passed\n"),
                false => (StatusCode::INTERNAL_SERVER_ERROR, "healthz check failed\n"),
            };
            (verdict.0, format!("{}{}", verbose(checks, link), verdict.1))
        }
        "/healthz" if failed.is_empty() => (StatusCode::OK, "ok".to_string()),
        "/healthz" => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{failed}healthz check failed\n"),
        ),
        _ => (StatusCode::NOT_FOUND, "404 page not found\n".to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Binds the endpoint; fails at start if the address is taken.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `/healthz` until `shutdown`, on a bounded listener of its own
/// ([`crate::server::listener`]): it answers while the API port is full.
pub async fn serve(
    listener: TcpListener,
    checks: Checks,
    link: Option<ApiLink>,
    shutdown: CancellationToken,
) {
    use crate::server::listener;
    let listener = listener::Listener::new(listener, listener::HEALTHZ_MAX_CONNECTIONS, "healthz");
    while let Some(c) = listener.accept(&shutdown).await {
        let (checks, link) = (checks.clone(), link.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let resp = respond(&checks, link.as_ref(), &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = listener::http1()
                .serve_connection(TokioIo::new(c.tcp), svc)
                .await;
            drop(c.permit);
        });
    }
}

/// The interval systemd expects watchdog pings at (`WatchdogSec=` gives
/// `WATCHDOG_USEC`, and `WATCHDOG_PID` when it is meant for one process).
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Pings systemd's watchdog at half its interval while every check is
/// healthy; a wedged loop stops the pings and systemd restarts kinglet
/// (`KillMode=process`: the pods keep running and are re-adopted).
pub async fn watchdog(
    checks: Checks,
    interval: Duration,
    notify: impl Fn(&str) + Send + 'static,
    stop: CancellationToken,
) {
    let mut was_healthy = true;
    loop {
        let failed: Vec<&str> = checks
            .iter()
            .filter(|(_, hb)| !hb.healthy())
            .map(|(n, _)| *n)
            .collect();
        if failed.is_empty() {
            notify("WATCHDOG=1");
        } else if was_healthy {
            warn!(?failed, "unhealthy: systemd watchdog pings stopped");
        }
        was_healthy = failed.is_empty();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval / 2) => {}
        }
    }
}

/// Tells systemd (Type=notify) about our state; a no-op outside systemd.
pub fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    // Non-blocking: a notify socket nobody reads (its queue full) must
    // never stall the runtime's thread; a message that does not fit is
    // dropped and said.
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) if s.set_nonblocking(true).is_ok() => s,
        _ => return,
    };
    let bytes = path.as_encoded_bytes();
    let result = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = result {
        warn!(error = %e, "cannot notify systemd");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn healthz_follows_the_heartbeat() {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let hb = Heartbeat::new(Duration::from_millis(200));
        let stop = CancellationToken::new();
        let pleg = Heartbeat::new(Duration::from_secs(60));
        let checks = Arc::new(vec![("syncloop", hb.clone()), ("PLEG", pleg)]);
        let d = tempfile::tempdir().unwrap();
        let link = ApiLink::new(d.path().join("offline-since"));
        let task = tokio::spawn(serve(l, checks, Some(link.clone()), stop.clone()));
        let r = get(addr, "/healthz").await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("ok"), "{r}");
        let r = get(addr, "/healthz?verbose").await;
        assert!(
            r.contains("[+]syncloop ok\n[+]PLEG ok\n[+]apiserver ok\nhealthz check passed"),
            "{r}"
        );
        // Offline: still healthy, and said, with since when; kept in the file.
        link.lost().await;
        let since = link.offline_since().unwrap();
        let r = get(addr, "/healthz?verbose").await;
        let want = format!("[+]apiserver offline since {}", ApiLink::format(since));
        assert!(r.starts_with("HTTP/1.1 200") && r.contains(&want), "{r}");
        assert!(get(addr, "/healthz").await.ends_with("ok"));
        assert!(link.known_offline());
        // A new run reads it (`pods ls`, healthz), but has not seen it yet.
        let next = ApiLink::new(d.path().join("offline-since"));
        assert_eq!(next.offline_since(), Some(since));
        assert!(!next.known_offline());
        next.lost().await;
        assert!(next.known_offline() && next.offline_since() == Some(since));
        link.reached().await;
        assert!(!link.known_offline());
        assert!(!d.path().join("offline-since").exists());
        assert!(
            get(addr, "/healthz?verbose")
                .await
                .contains("[+]apiserver ok")
        );
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = get(addr, "/healthz").await;
        assert!(r.starts_with("HTTP/1.1 500"), "{r}");
        assert!(
            r.contains("[-]syncloop failed") && !r.contains("PLEG"),
            "{r}"
        );
        hb.beat();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn the_watchdog_pings_only_while_every_check_is_healthy() {
        // Heartbeats age in real time, so this runs in real time, short.
        let fresh = Heartbeat::new(Duration::from_secs(30));
        let stale = Heartbeat::new(Duration::from_millis(300));
        let checks: Checks = Arc::new(vec![("syncloop", fresh), ("PLEG", stale.clone())]);
        let pings = Arc::new(std::sync::Mutex::new(Vec::new()));
        let p = pings.clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(watchdog(
            checks,
            Duration::from_millis(100),
            move |s: &str| p.lock().unwrap().push(s.to_string()),
            stop.clone(),
        ));
        let count = || pings.lock().unwrap().len();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(count() >= 2, "pings while healthy: {}", count());
        assert!(pings.lock().unwrap().iter().all(|s| s == "WATCHDOG=1"));
        // PLEG goes stale (no beat for 300 ms): the pings stop.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let n = count();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(count(), n, "pinged while unhealthy");
        // It beats again: the pings resume.
        stale.beat();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(count() > n, "no ping after recovery");
        stop.cancel();
        task.await.unwrap();
    }
}
