//! `/portForward/{ns}/{pod}[/{uid}]`: `kubectl port-forward`. The 1.37
//! apiserver proxies it to a node that declares `ExtendWebSocketsToKubelet`
//! as a WebSocket (subprotocol `SPDY/3.1+portforward.k8s.io`) whose binary
//! messages carry a SPDY connection; on it the client opens, per
//! forwarded connection, an `error` and a `data` stream with the same
//! `requestID` and a `port`, as upstream's `cri-streaming` portforward
//! server expects. Each pair becomes one TCP connection to the port on
//! the pod's loopback, made by the runtime ([`Runtime::port_forward`]).
//!
//! [`Runtime::port_forward`]: kinglet_runtime::Runtime::port_forward

use std::collections::HashMap;
use std::sync::Arc;

use hyper::{Request, Response, StatusCode};
use kinglet_runtime::Runtime;
use kinglet_spdy::{Conn, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::debug;

use tokio_util::sync::CancellationToken;

use super::{Body, State, Target, portforward_ws, text, ws};

/// The tunnelled SPDY protocol, as the WebSocket subprotocol names it.
pub const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// Pairs not yet complete, at most, per connection (a client opens two
/// streams per forwarded connection, one after the other).
const MAX_PENDING: usize = 128;

pub async fn handle(
    state: &State,
    mut req: Request<hyper::body::Incoming>,
    target: Target<'_>,
) -> Response<Body> {
    let (key, offered) = match ws::upgrade_request(&req, "port-forward") {
        Ok(k) => k,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let tunnel = offered.split(',').any(|p| p.trim() == TUNNEL_PROTOCOL);
    // Otherwise the channel protocol, whose ports are in the query.
    let channels = match tunnel {
        true => None,
        false => match channel_protocol(&offered) {
            Some(p) => match portforward_ws::ports(req.uri().query().unwrap_or("")) {
                Ok(ports) => Some((p, ports)),
                Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
            },
            None => {
                let msg = format!(
                    "port-forward speaks the WebSocket subprotocols {TUNNEL_PROTOCOL}, v4.channel.k8s.io and v4.base64.channel.k8s.io; offered {offered:?}"
                );
                return text(StatusCode::BAD_REQUEST, msg);
            }
        },
    };
    let uid = match target.find(&state.view) {
        Ok((uid, _)) => uid,
        Err((code, msg)) => return text(code, msg),
    };
    let sandbox = match sandbox_of(state.runtime.as_ref(), &uid).await {
        Some(id) => id,
        None => {
            let msg = format!("pod {:?} has no ready sandbox", target.pod);
            return text(StatusCode::INTERNAL_SERVER_ERROR, msg);
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let (runtime, pod) = (
        state.runtime.clone(),
        format!("{}/{}", target.ns, target.pod),
    );
    let activity = super::idle::Activity::new(state.stream_idle_timeout);
    if let Some((p, ports)) = channels {
        let what = format!("{pod}, uid {uid}");
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(io) => {
                    let ws = ws::accept(hyper_util::rt::TokioIo::new(io)).await;
                    portforward_ws::serve(ws, p, runtime, sandbox, ports, what, activity).await
                }
                Err(e) => debug!(error = %e, "port-forward upgrade failed"),
            }
        });
        return ws::switching(&key, p.name);
    }
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => {
                let ws = ws::accept(hyper_util::rt::TokioIo::new(io)).await;
                let tunnel = ws::byte_stream(ws, activity.clone());
                tokio::select! {
                    _ = serve(tunnel, runtime, sandbox, pod, uid) => {}
                    // Dropping `serve` ends the connection (its closer).
                    _ = activity.expired() => debug!("port-forward idle (streamingConnectionIdleTimeout); closed"),
                }
            }
            Err(e) => debug!(error = %e, "port-forward upgrade failed"),
        }
    });
    ws::switching(&key, TUNNEL_PROTOCOL)
}

/// The channel protocol of the client's offer that port-forward speaks
/// (upstream's: v4 binary or base64, or none named).
fn channel_protocol(offered: &str) -> Option<super::exec::Protocol> {
    super::exec::negotiate(Some(offered)).filter(|p| p.name.is_empty() || p.name.starts_with("v4."))
}

async fn sandbox_of(rt: &dyn Runtime, uid: &str) -> Option<String> {
    let mut boxes = rt.list_pod_sandboxes().await.ok()?;
    boxes.retain(|s| s.pod_uid == uid && s.ready);
    boxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    boxes.into_iter().next().map(|s| s.id)
}

/// A forwarded connection's two streams, as they arrive.
#[derive(Default)]
struct Pair {
    data: Option<Stream>,
    error: Option<Stream>,
}

/// The pair a stream belongs to: its `requestID`, or as old clients
/// number them (the error stream's ID; the data stream's minus 2).
fn request_id(s: &Stream, kind: &str) -> String {
    match s.header("requestid") {
        Some(r) if !r.is_empty() => r.to_string(),
        _ if kind == "data" => s.id.saturating_sub(2).to_string(),
        _ => s.id.to_string(),
    }
}

/// The stream's port and kind, or why it is refused.
fn check(s: &Stream) -> Result<(u16, &'static str), StreamRefused> {
    let port = s.header("port").ok_or(StreamRefused::NoPort)?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| StreamRefused::BadPort(port.into()))?;
    match s.header("streamtype") {
        Some("data") => Ok((port, "data")),
        Some("error") => Ok((port, "error")),
        Some(t) => Err(StreamRefused::BadType(t.into())),
        None => Err(StreamRefused::NoType),
    }
}

/// Why a forwarded stream was refused, in upstream's words.
#[derive(Debug, thiserror::Error)]
enum StreamRefused {
    #[error("\"port\" header is required")]
    NoPort,
    #[error("unable to parse {0:?} as a port")]
    BadPort(String),
    #[error("invalid stream type {0:?}")]
    BadType(String),
    #[error("\"streamType\" header is required")]
    NoType,
}

/// Serves one tunnel until the client closes it, or until this future is
/// dropped (the idle timeout): its closer then ends the connection, and
/// with it every forwarded stream.
async fn serve<IO>(io: IO, rt: Arc<dyn Runtime>, sandbox: String, pod: String, uid: String)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (conn, mut incoming) = Conn::start(io, false);
    let _closer = conn.closer();
    // The tunnel's end (the client went, or the idle timeout dropped this)
    // ends every connection forwarded through it.
    let tunnel = CancellationToken::new();
    let _ends_forwards = tunnel.clone().drop_guard();
    let mut pending: HashMap<String, Pair> = HashMap::new();
    while let Some(s) = incoming.recv().await {
        let (port, kind) = match check(&s) {
            Ok(k) => k,
            Err(e) => {
                debug!(%pod, error = %e, "port-forward stream refused");
                s.writer.reset().await;
                continue;
            }
        };
        let id = request_id(&s, kind);
        if !pending.contains_key(&id) && pending.len() >= MAX_PENDING {
            s.writer.reset().await;
            continue;
        }
        let pair = pending.entry(id.clone()).or_default();
        match kind {
            "data" => pair.data = Some(s),
            _ => pair.error = Some(s),
        }
        if pair.data.is_some()
            && pair.error.is_some()
            && let Some(Pair {
                data: Some(d),
                error: Some(e),
            }) = pending.remove(&id)
        {
            let what = format!("port {port} to pod {pod}, uid {uid}");
            let f = forward(rt.clone(), sandbox.clone(), port, d, e, what);
            let tunnel = tunnel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = f => {}
                    _ = tunnel.cancelled() => {}
                }
            });
        }
    }
    conn.close().await;
}

/// One forwarded connection: bytes both ways until both sides are done;
/// a failure to connect is reported on the error stream, as upstream.
async fn forward(
    rt: Arc<dyn Runtime>,
    sandbox: String,
    port: u16,
    data: Stream,
    error: Stream,
    what: String,
) {
    let pod = match rt.port_forward(&sandbox, port).await {
        Ok(p) => p,
        Err(e) => {
            let msg = format!("error forwarding {what}: {e}");
            debug!("{msg}");
            let _ = error.writer.write(msg.as_bytes()).await;
            data.writer.reset().await;
            error.writer.reset().await;
            return;
        }
    };
    let (mut from_client, to_client) = (data.reader, data.writer);
    let (mut from_pod, mut to_pod) = (pod.reader, pod.writer);
    let up = async {
        while let Some(b) = from_client.read().await {
            if to_pod.write_all(&b).await.is_err() {
                return;
            }
        }
        let _ = to_pod.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match from_pod.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_client.write(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
        to_client.close().await;
    };
    tokio::join!(up, down);
    error.writer.close().await;
}
