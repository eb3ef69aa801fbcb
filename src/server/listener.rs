//! Listeners an unauthenticated peer cannot exhaust, for the kubelet API
//! (10250), the read-only port and `/healthz`: each holds at most its own
//! number of connections (a semaphore taken before `accept`, as mini-redis
//! does, so a flood waits in the kernel's backlog, not in kinglet's fds or
//! memory); each connection gets a TLS-handshake timeout and hyper's header
//! read timeout, which also closes a keep-alive connection that sends no
//! next request; and a failing `accept` (EMFILE) backs off 5 ms doubling to
//! 1 s, as Go's `net/http` does, with one log line per back-off. TCP
//! keep-alive is on, as Go's listeners have it, so half-open peers go.
//!
//! `/healthz` has a listener of its own, so it answers while the API port
//! is saturated.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The kubelet API's and the read-only port's connection limit by
/// default (`--max-connections`): about 13 KiB of kinglet's memory each
/// when idle, a few MiB in all on a 512 MB board.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// `/healthz`'s own limit (it is on loopback by default).
pub const HEALTHZ_MAX_CONNECTIONS: usize = 32;
/// A TLS handshake that takes longer is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's header, and a keep-alive connection's next request, must
/// arrive within this (Go's kubelet waits out its 90 s idle timeout; a
/// slowloris peer is shed here after 10 s).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a request's header may take (Go's kubelet: 1 MiB); larger
/// gets 431. Bounds what a slow unauthenticated peer makes kinglet hold.
pub const MAX_HEADER_BYTES: usize = 64 << 10;

const BACKOFF_FIRST: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A TCP listener with a connection limit.
pub struct Listener {
    tcp: TcpListener,
    permits: Arc<Semaphore>,
    name: &'static str,
}

/// An accepted connection; its slot is freed when this is dropped.
pub struct Conn {
    pub tcp: TcpStream,
    pub peer: SocketAddr,
    pub permit: OwnedSemaphorePermit,
}

impl Listener {
    pub fn new(tcp: TcpListener, max_connections: usize, name: &'static str) -> Self {
        Listener {
            tcp,
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            name,
        }
    }

    /// The next connection once a slot is free, with Nagle off as Go's
    /// listeners have it (a response's header and body are separate small
    /// writes; with Nagle the second waits out the peer's delayed ACK);
    /// `None` at shutdown.
    pub async fn accept(&self, shutdown: &CancellationToken) -> Option<Conn> {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return None,
            p = self.permits.clone().acquire_owned() => p.ok()?,
        };
        let mut backoff = Duration::ZERO;
        loop {
            let r = tokio::select! {
                _ = shutdown.cancelled() => return None,
                r = self.tcp.accept() => r,
            };
            match r {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    keepalive(&tcp);
                    return Some(Conn { tcp, peer, permit });
                }
                Err(e) => {
                    backoff = next_backoff(backoff);
                    warn!(listener = self.name, error = %e, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }
    }

    /// Free slots now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

/// TCP keep-alive as Go's listeners set it (15 s idle, 15 s apart, 9
/// probes): a peer that vanished without a FIN (a half-open connection, a
/// board's client unplugged) is found in about 2.5 minutes, whatever the
/// stream's own idle timeout.
fn keepalive(tcp: &TcpStream) {
    use rustix::net::sockopt;
    let every = Duration::from_secs(15);
    let _ = sockopt::set_socket_keepalive(tcp, true);
    let _ = sockopt::set_tcp_keepidle(tcp, every);
    let _ = sockopt::set_tcp_keepintvl(tcp, every);
    let _ = sockopt::set_tcp_keepcnt(tcp, 9);
}

/// Go's accept back-off: 5 ms, doubling, at most 1 s.
fn next_backoff(last: Duration) -> Duration {
    if last.is_zero() {
        BACKOFF_FIRST
    } else {
        (last * 2).min(BACKOFF_MAX)
    }
}

/// An HTTP/1 connection builder with the header timeout and size limit.
pub fn http1() -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn accept_backs_off_as_go_does() {
        let mut b = Duration::ZERO;
        let seen: Vec<u64> = (0..10)
            .map(|_| {
                b = next_backoff(b);
                b.as_millis() as u64
            })
            .collect();
        assert_eq!(seen, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }

    #[tokio::test]
    async fn accepted_connections_have_gos_keepalive() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let l = Listener::new(tcp, 1, "test");
        let _client = TcpStream::connect(addr).await.unwrap();
        let c = l.accept(&CancellationToken::new()).await.unwrap();
        use rustix::net::sockopt;
        assert_eq!(sockopt::socket_keepalive(&c.tcp), Ok(true));
        assert_eq!(sockopt::tcp_keepidle(&c.tcp), Ok(Duration::from_secs(15)));
        assert_eq!(sockopt::tcp_nodelay(&c.tcp), Ok(true));
    }

    #[tokio::test]
    async fn a_full_listener_waits_for_a_slot_and_sheds_a_silent_peer() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let l = Arc::new(Listener::new(tcp, 2, "test"));
        let stop = CancellationToken::new();
        let served = tokio::spawn({
            let (l, stop) = (l.clone(), stop.clone());
            async move {
                while let Some(c) = l.accept(&stop).await {
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(|_req| async {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                            ))
                        });
                        let io = hyper_util::rt::TokioIo::new(c.tcp);
                        let _ = http1().serve_connection(io, svc).await;
                        drop(c.permit);
                    });
                }
            }
        });
        // Two slowloris peers take both slots.
        let mut slow = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            slow.push(s);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(l.available(), 0);
        // A third is not served until the header timeout sheds one.
        let t = tokio::time::Instant::now();
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        let waited = t.elapsed();
        assert!(
            waited >= HEADER_READ_TIMEOUT - Duration::from_secs(1),
            "{waited:?}"
        );
        for mut s in slow {
            let mut buf = Vec::new();
            let n = s.read_to_end(&mut buf).await.unwrap_or(0);
            assert!(
                n == 0 || String::from_utf8_lossy(&buf).contains("408"),
                "{buf:?}"
            );
        }
        stop.cancel();
        served.await.unwrap();
    }
}
