//! gRPC services on a unix socket, for the device plugins' registration
//! and the pod resources API: tonic's generated services over hyper's
//! HTTP/2 server (tonic's own transport would bring a second server stack
//! into the binary). The socket is root's alone (mode 0600), a stale one
//! is replaced, and a peer cannot grow what it costs: at most
//! [`MAX_CONNECTIONS`] connections (a semaphore taken before `accept`),
//! [`MAX_STREAMS`] streams each, bounded header lists and messages.

use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::warn;

/// Connections one socket holds at most (its peers are local, root
/// processes: plugins and monitoring agents).
pub const MAX_CONNECTIONS: usize = 64;
/// Concurrent streams per connection.
pub const MAX_STREAMS: u32 = 16;
/// The most a request's header list may weigh.
const MAX_HEADER_BYTES: u32 = 16 << 10;

/// A bound unix socket, removed when dropped.
pub struct Socket {
    listener: UnixListener,
    path: PathBuf,
}

impl Socket {
    /// Binds `path` (its directory made, a stale socket replaced), for
    /// root only.
    pub fn bind(path: &Path) -> std::io::Result<Socket> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Socket {
            listener,
            path: path.to_path_buf(),
        })
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serves `svc` (a tonic server) on `socket` until `shutdown`.
pub async fn serve<S>(socket: Socket, svc: S, shutdown: CancellationToken)
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = socket.listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(socket = %socket.path.display(), "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let svc = svc.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let hyper_svc = hyper::service::service_fn(move |req| svc.clone().oneshot(req));
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS)
                .max_header_list_size(MAX_HEADER_BYTES)
                .serve_connection(TokioIo::new(stream), hyper_svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
                }
            }
        });
    }
}
