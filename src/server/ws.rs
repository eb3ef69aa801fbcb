//! The WebSocket handshake the streaming endpoints share (`/exec`,
//! `/portForward`): checking the upgrade request, the 101 answer, and the
//! upgraded connection as a WebSocket or as a plain byte stream carried
//! in binary messages (the port-forward tunnel).

use std::io;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Message, Role};

use super::Body;

/// The upgraded connection.
pub type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// A streaming request that is not a WebSocket upgrade (a 400).
#[derive(Debug, thiserror::Error)]
#[error("kinglet streams {what} over WebSockets only; upgrade {upgrade:?} is not supported")]
pub struct NotWebSocket {
    pub what: String,
    pub upgrade: String,
}

/// A WebSocket upgrade request's key and offered subprotocols, or the
/// message of the 400 for anything else (SPDY upgrades included).
pub fn upgrade_request<B>(req: &Request<B>, what: &str) -> Result<(String, String), NotWebSocket> {
    let get = |n: header::HeaderName| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let upgrade = get(header::UPGRADE);
    let key = get(header::SEC_WEBSOCKET_KEY);
    if !upgrade.eq_ignore_ascii_case("websocket") || key.is_empty() {
        return Err(NotWebSocket {
            what: what.into(),
            upgrade,
        });
    }
    Ok((key, get(header::SEC_WEBSOCKET_PROTOCOL)))
}

/// The 101 that accepts `key` with `protocol` (none when empty).
pub fn switching(key: &str, protocol: &str) -> Response<Body> {
    use http_body_util::BodyExt;
    let mut r = Response::new(http_body_util::Full::new(Bytes::new()).boxed());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if !protocol.is_empty()
        && let Ok(v) = HeaderValue::from_str(protocol)
    {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    r
}

/// The largest message, and frame, a client may send: stdin and
/// port-forward data come in chunks of at most 32 KiB (client-go's), so
/// this only refuses what would make kinglet buffer a client's flood
/// (tungstenite's defaults are 64 and 16 MiB).
pub const MAX_MESSAGE: usize = 1 << 20;

/// The server side of a WebSocket on an upgraded connection, with
/// [`MAX_MESSAGE`] as its limit: a larger message ends the connection.
pub async fn server<IO>(io: IO) -> WebSocketStream<IO>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await
}

/// A task that sends the messages queued on the returned sender, each
/// one `activity`; it gives the sink back once every sender is gone
/// (`None` when the peer went away first). Streams queue here instead of
/// sharing the sink.
pub fn writer<K>(
    mut sink: K,
    activity: super::idle::Activity,
) -> (
    tokio::sync::mpsc::Sender<Message>,
    tokio::task::JoinHandle<Option<K>>,
)
where
    K: futures::Sink<Message> + Unpin + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(8);
    let task = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            activity.touch();
            if sink.send(m).await.is_err() {
                return None;
            }
        }
        Some(sink)
    });
    (tx, task)
}

/// The server side of the WebSocket on an upgraded connection.
pub async fn accept(io: Upgraded) -> WebSocketStream<Upgraded> {
    server(io).await
}

/// A WebSocket as a byte stream: each binary message's bytes in order,
/// each write one binary message; a close (or any error) is the end.
/// Every binary message either way is `activity`.
pub fn byte_stream(
    ws: WebSocketStream<Upgraded>,
    activity: super::idle::Activity,
) -> impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static {
    let (sink, source) = ws.split();
    let read = activity.clone();
    let source = source
        .take_while(|m| std::future::ready(matches!(m, Ok(m) if !m.is_close())))
        .filter_map(move |m| {
            std::future::ready(match m {
                Ok(Message::Binary(b)) => {
                    read.touch();
                    Some(Ok::<Bytes, io::Error>(b))
                }
                _ => None,
            })
        });
    let sink = sink.sink_map_err(io::Error::other).with(move |b: Bytes| {
        activity.touch();
        std::future::ready(Ok::<_, io::Error>(Message::Binary(b)))
    });
    let reader = tokio_util::io::StreamReader::new(Box::pin(source));
    let writer = tokio_util::io::SinkWriter::new(tokio_util::io::CopyToBytes::new(Box::pin(sink)));
    tokio::io::join(reader, writer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_message_past_the_limit_ends_the_connection() {
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let server = tokio::spawn(async move {
            let mut ws = server(server_io).await;
            let mut got = Vec::new();
            while let Some(m) = ws.next().await {
                match m {
                    Ok(m) => got.push(m.len()),
                    Err(e) => return (got, Some(e.to_string())),
                }
            }
            (got, None)
        });
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        client
            .send(Message::Binary(vec![1u8; 32 << 10].into()))
            .await
            .unwrap();
        // The big one may not even be written whole: the server stops
        // reading at the limit.
        let _ = client
            .send(Message::Binary(vec![2u8; MAX_MESSAGE + 1].into()))
            .await;
        drop(client);
        let (got, err) = server.await.unwrap();
        assert_eq!(got, [32 << 10]);
        let refused = err
            .as_deref()
            .is_some_and(|e| e.contains("too long") || e.contains("size"));
        assert!(refused, "{err:?}");
    }
}
