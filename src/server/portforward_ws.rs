//! `/portForward` over the WebSocket channel protocol
//! (`v4.channel.k8s.io`, `v4.base64.channel.k8s.io`, or no subprotocol),
//! as upstream's `handleWebSocketStreams`: what the e2e suite and clients
//! that speak to the port-forward subresource directly use, beside the
//! tunnelled SPDY of `kubectl port-forward` ([`super::portforward`]).
//!
//! The ports come from `?port=` (repeated or comma-separated; the
//! apiserver turns the client's `ports` into it); port `i`
//! gets the data channel `2i` and the error channel `2i+1`, and the first
//! message on each is the port, two bytes little-endian. One connection
//! to each port is made for the socket's life; when every one has ended
//! the socket closes.

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use kinglet_runtime::Runtime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::exec::{Protocol, frame};
use super::idle::Activity;

/// Why a request's ports are refused (a 400), in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortsError {
    #[error("query parameter \"port\" is required")]
    Missing,
    #[error("query parameter \"port\" cannot be empty")]
    Empty,
    #[error("unable to parse {0:?} as a port")]
    Parse(String),
    #[error("port {0:?} must be > 0")]
    Zero(String),
    #[error("at most {MAX_PORTS} ports can be forwarded at once")]
    TooMany,
}

/// Ports per socket, at most (each is a connection into the pod).
const MAX_PORTS: usize = 32;

/// The ports of `?port=…`, as upstream's `NewV4Options`.
pub fn ports(query: &str) -> Result<Vec<u16>, PortsError> {
    let mut out = Vec::new();
    let mut seen = false;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if k != "port" {
            continue;
        }
        seen = true;
        if v.is_empty() {
            return Err(PortsError::Empty);
        }
        for p in v.split(',') {
            let n: u16 = p.parse().map_err(|_| PortsError::Parse(v.to_string()))?;
            if n == 0 {
                return Err(PortsError::Zero(v.to_string()));
            }
            out.push(n);
        }
    }
    if !seen {
        return Err(PortsError::Missing);
    }
    if out.len() > MAX_PORTS {
        return Err(PortsError::TooMany);
    }
    Ok(out)
}

/// A client message: its channel and payload.
fn incoming(p: Protocol, m: Message) -> Option<(u8, Vec<u8>)> {
    let data: Vec<u8> = match m {
        Message::Binary(b) => b.into(),
        Message::Text(t) => t.as_bytes().to_vec(),
        _ => return None,
    };
    let (&first, rest) = data.split_first()?;
    if p.base64 {
        use base64::Engine;
        let d = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()?;
        Some((first.wrapping_sub(b'0'), d))
    } else {
        Some((first, rest.to_vec()))
    }
}

/// Serves the socket until every forwarded connection has ended or the
/// client goes away.
pub async fn serve<IO>(
    ws: tokio_tungstenite::WebSocketStream<IO>,
    p: Protocol,
    rt: Arc<dyn Runtime>,
    sandbox: String,
    ports: Vec<u16>,
    what: String,
    activity: Activity,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut source) = ws.split();
    let (tx, writer) = super::ws::writer(sink, activity.clone());
    let mut to_pod = Vec::new();
    let mut downs = Vec::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (data, error) = ((2 * i) as u8, (2 * i + 1) as u8);
        let _ = tx.send(frame(p, data, &port.to_le_bytes())).await;
        let _ = tx.send(frame(p, error, &port.to_le_bytes())).await;
        match rt.port_forward(&sandbox, port).await {
            Ok(s) => {
                to_pod.push(Some(s.writer));
                downs.push(tokio::spawn(down(s.reader, p, data, tx.clone())));
            }
            Err(e) => {
                let msg = format!("error forwarding port {port} to pod {what}: {e}");
                debug!("{msg}");
                let _ = tx.send(frame(p, error, msg.as_bytes())).await;
                to_pod.push(None);
            }
        }
    }
    drop(tx);
    let all_down = futures::future::join_all(downs);
    tokio::select! {
        _ = all_down => {}
        _ = up(&mut source, p, &mut to_pod, &activity) => {}
        _ = activity.expired() => debug!("port-forward idle (streamingConnectionIdleTimeout); closed"),
    }
    drop(to_pod);
    if let Ok(Some(mut sink)) = writer.await {
        let _ = sink.send(Message::Close(None)).await;
    }
}

/// The pod's bytes to the client on channel `ch`.
async fn down(
    mut from_pod: kinglet_runtime::exec::Reader,
    p: Protocol,
    ch: u8,
    tx: mpsc::Sender<Message>,
) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match from_pod.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(frame(p, ch, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The client's bytes to the pod, each data channel to its port's
/// connection, until the client goes away.
async fn up<S>(
    source: &mut S,
    p: Protocol,
    to_pod: &mut [Option<kinglet_runtime::exec::Writer>],
    activity: &Activity,
) where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    while let Some(Ok(m)) = source.next().await {
        if matches!(m, Message::Close(_)) {
            return;
        }
        let Some((ch, data)) = incoming(p, m) else {
            continue;
        };
        activity.touch();
        let Some(slot) = to_pod.get_mut(usize::from(ch / 2)).filter(|_| ch % 2 == 0) else {
            continue;
        };
        if let Some(w) = slot.as_mut()
            && w.write_all(&data).await.is_err()
        {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_as_upstream() {
        assert_eq!(ports("port=80"), Ok(vec![80]));
        assert_eq!(ports("port=80,8080&port=9"), Ok(vec![80, 8080, 9]));
        assert_eq!(ports("ports=1"), Err(PortsError::Missing));
        assert_eq!(ports("port="), Err(PortsError::Empty));
        assert_eq!(ports("port=http"), Err(PortsError::Parse("http".into())));
        assert_eq!(ports("port=0"), Err(PortsError::Zero("0".into())));
        assert_eq!(ports("port=70000"), Err(PortsError::Parse("70000".into())));
        let many = vec!["1"; 33].join(",");
        assert_eq!(ports(&format!("port={many}")), Err(PortsError::TooMany));
    }

    #[test]
    fn client_messages_carry_their_channel_in_both_codecs() {
        let bin = Protocol {
            name: "v4.channel.k8s.io",
            base64: false,
            version: 4,
        };
        let b64 = Protocol {
            name: "v4.base64.channel.k8s.io",
            base64: true,
            version: 4,
        };
        let m = Message::Binary(vec![2, b'h', b'i'].into());
        assert_eq!(incoming(bin, m), Some((2, b"hi".to_vec())));
        let m = Message::Text("0aGk=".into());
        assert_eq!(incoming(b64, m), Some((0, b"hi".to_vec())));
        assert_eq!(incoming(bin, Message::Binary(Vec::new().into())), None);
    }
}
