//! SPDY/3.1 as Kubernetes streaming speaks it (moby/spdystream, which
//! client-go, the kubelet and containerd's streaming server all use): many
//! byte streams over one connection, each opened with a header block.
//!
//! kinglet needs both roles: the server for `kubectl port-forward` (the
//! 1.37 apiserver tunnels SPDY inside a WebSocket to a node that declares
//! `ExtendWebSocketsToKubelet`) and the client for containerd's CRI
//! streaming server (exec and port-forward URLs).
//!
//! What is built is what those peers use: SYN_STREAM, SYN_REPLY, DATA
//! (with FIN), RST_STREAM, PING (answered), GOAWAY, and header blocks kept
//! in the one zlib stream per direction that SPDY/3 prescribes, primed
//! with its dictionary. Like spdystream, no flow-control windows (a peer's
//! WINDOW_UPDATE and SETTINGS are read and ignored); a slow stream holds
//! the connection's reader back instead (bounded buffers, no unbounded
//! memory).

mod dictionary;
/// Public for the fuzz target (`fuzz/bodies/spdy_frame.rs`).
pub mod frame;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};

pub use frame::Headers;
use frame::{Frame, HeaderCodec, Out};

/// Errors of a SPDY connection.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("spdy connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("spdy protocol error: {0}")]
    Protocol(String),
    #[error("spdy stream {0} was reset by the peer")]
    Reset(u32),
    #[error("spdy connection closed")]
    Closed,
}

/// Frames a stream's data is cut into (spdystream reads 32 KiB at a time).
const CHUNK: usize = 32 * 1024;
/// Data frames buffered per stream before the connection's reader waits.
const STREAM_BUFFER: usize = 16;

/// What the reader task shares with handles.
#[derive(Default)]
struct Shared {
    /// Where each open stream's incoming data goes; removed at the
    /// peer's FIN or reset, which ends the stream's reads.
    streams: HashMap<u32, mpsc::Sender<Bytes>>,
    /// Streams this side opened, waiting for the peer's SYN_REPLY.
    replies: HashMap<u32, oneshot::Sender<Result<(), SpdyError>>>,
    next_id: u32,
    closed: bool,
}

/// A handle on a connection: opens streams (client role).
#[derive(Clone)]
pub struct Conn {
    out: mpsc::Sender<Out>,
    shared: Arc<Mutex<Shared>>,
}

/// One stream: its headers, what the peer sends, and a writer.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub reader: StreamReader,
    pub writer: StreamWriter,
}

/// The peer's data on one stream, until its FIN or reset.
pub struct StreamReader {
    rx: mpsc::Receiver<Bytes>,
}

/// This side's data on one stream.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Out>,
}

fn lock(s: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl StreamReader {
    /// The next chunk; `None` once the peer closed or reset the stream.
    pub async fn read(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }
}

impl StreamWriter {
    /// Sends `data`, cut into frames.
    pub async fn write(&self, data: &[u8]) -> Result<(), SpdyError> {
        for c in data.chunks(CHUNK) {
            let f = Out::Data {
                id: self.id,
                data: Bytes::copy_from_slice(c),
                fin: false,
            };
            self.out.send(f).await.map_err(|_| SpdyError::Closed)?;
        }
        Ok(())
    }

    /// This side is done writing (FIN); the peer may still send.
    pub async fn close(&self) {
        let f = Out::Data {
            id: self.id,
            data: Bytes::new(),
            fin: true,
        };
        let _ = self.out.send(f).await;
    }

    /// Abandons the stream both ways (RST_STREAM, CANCEL).
    pub async fn reset(&self) {
        let _ = self
            .out
            .send(Out::Rst {
                id: self.id,
                status: 5,
            })
            .await;
    }
}

impl StreamReader {
    /// As an `AsyncRead` (a pipe fed by a task), for callers that want one.
    pub fn into_async_read(mut self) -> impl AsyncRead + Send + Unpin + 'static {
        use tokio::io::AsyncWriteExt;
        let (mut near, far) = tokio::io::duplex(CHUNK);
        tokio::spawn(async move {
            while let Some(b) = self.read().await {
                if near.write_all(&b).await.is_err() {
                    return;
                }
            }
            let _ = near.shutdown().await;
        });
        far
    }
}

impl StreamWriter {
    /// As an `AsyncWrite` (a pipe drained by a task); its shutdown sends
    /// the FIN.
    pub fn into_async_write(self) -> impl AsyncWrite + Send + Unpin + 'static {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(CHUNK);
        tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match far.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if self.write(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
            self.close().await;
        });
        near
    }
}

impl Stream {
    fn new(id: u32, headers: Headers, rx: mpsc::Receiver<Bytes>, out: mpsc::Sender<Out>) -> Self {
        Stream {
            id,
            headers,
            reader: StreamReader { rx },
            writer: StreamWriter { id, out },
        }
    }

    /// A header's value (names are lowercase on the wire).
    pub fn header(&self, name: &str) -> Option<&str> {
        frame::header(&self.headers, name)
    }
}

impl Conn {
    /// Runs a connection over `io`. A client opens streams with
    /// [`Conn::open`]; a server gets the peer's streams from the receiver
    /// (each already answered with a SYN_REPLY). The connection ends when
    /// `io` does or every [`Conn`] and stream writer is dropped.
    pub fn start<IO>(io: IO, client: bool) -> (Conn, mpsc::Receiver<Stream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out, out_rx) = mpsc::channel(STREAM_BUFFER);
        let (incoming_tx, incoming) = mpsc::channel(8);
        let shared = Arc::new(Mutex::new(Shared {
            next_id: if client { 1 } else { 2 },
            ..Default::default()
        }));
        let (writer_done, writer_ended) = oneshot::channel();
        tokio::spawn(write_loop(wr, out_rx, writer_done));
        let reader = Reader {
            shared: shared.clone(),
            out: out.clone(),
            incoming: incoming_tx,
            codec: HeaderCodec::new(),
        };
        tokio::spawn(reader.run(rd, writer_ended));
        (Conn { out, shared }, incoming)
    }

    /// Opens a stream with `headers` and waits for the peer's reply.
    pub async fn open(&self, headers: Headers) -> Result<Stream, SpdyError> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let (reply_tx, reply_rx) = oneshot::channel();
        let id = {
            let mut s = lock(&self.shared);
            if s.closed {
                return Err(SpdyError::Closed);
            }
            let id = s.next_id;
            s.next_id += 2;
            s.streams.insert(id, tx);
            s.replies.insert(id, reply_tx);
            id
        };
        let syn = Out::SynStream {
            id,
            headers: headers.clone(),
        };
        self.out.send(syn).await.map_err(|_| SpdyError::Closed)?;
        reply_rx.await.map_err(|_| SpdyError::Closed)??;
        Ok(Stream::new(id, headers, rx, self.out.clone()))
    }

    /// Ends the connection: GOAWAY, then the writer closes the transport.
    pub async fn close(&self) {
        let _ = self.out.send(Out::GoAway).await;
    }

    /// A guard that ends the connection when dropped (the connection's
    /// own tasks keep it open otherwise, as long as the transport is).
    pub fn closer(&self) -> Closer {
        Closer(self.out.clone())
    }
}

/// Ends a connection when dropped ([`Conn::closer`]).
pub struct Closer(mpsc::Sender<Out>);

impl Drop for Closer {
    fn drop(&mut self) {
        if let Err(mpsc::error::TrySendError::Full(f)) = self.0.try_send(Out::GoAway)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let tx = self.0.clone();
            rt.spawn(async move {
                let _ = tx.send(f).await;
            });
        }
    }
}

/// Serializes frames until every sender is gone, a GOAWAY is sent or the
/// transport fails; then says so to the reader (dropping `done`).
async fn write_loop<W: AsyncWrite>(wr: W, mut rx: mpsc::Receiver<Out>, done: oneshot::Sender<()>) {
    let _done = done;
    use tokio::io::AsyncWriteExt;
    let mut wr = std::pin::pin!(wr);
    let mut codec = HeaderCodec::new();
    while let Some(f) = rx.recv().await {
        let goaway = matches!(f, Out::GoAway);
        let bytes = match f.encode(&mut codec) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, "spdy frame not encodable; connection closed");
                break;
            }
        };
        if wr.write_all(&bytes).await.is_err() || wr.flush().await.is_err() || goaway {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// The connection's one reader: dispatches frames to streams.
struct Reader {
    shared: Arc<Mutex<Shared>>,
    out: mpsc::Sender<Out>,
    incoming: mpsc::Sender<Stream>,
    codec: HeaderCodec,
}

impl Reader {
    /// Reads until the peer ends the transport or the writer ended (a
    /// GOAWAY sent, or the transport failed): a connection this side gave
    /// up is closed whole at once, not held open until the peer closes its
    /// side (containerd's streaming server may keep an abandoned exec's
    /// connection until the process ends).
    async fn run<R: AsyncRead>(mut self, rd: R, writer_ended: oneshot::Receiver<()>) {
        let mut rd = std::pin::pin!(rd);
        let mut writer_ended = std::pin::pin!(writer_ended);
        loop {
            let read = tokio::select! {
                biased;
                _ = &mut writer_ended => break,
                r = frame::read(&mut rd, &mut self.codec) => r,
            };
            let f = match read {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "spdy connection ended");
                    break;
                }
            };
            if !self.dispatch(f).await {
                break;
            }
        }
        // Every stream's reads end; openers still waiting fail.
        let mut s = lock(&self.shared);
        s.closed = true;
        s.streams.clear();
        for (_, r) in s.replies.drain() {
            let _ = r.send(Err(SpdyError::Closed));
        }
    }

    /// Handles one frame; false ends the connection.
    async fn dispatch(&mut self, f: Frame) -> bool {
        match f {
            Frame::SynStream { id, headers, fin } => self.accept(id, headers, fin).await,
            Frame::SynReply { id, fin } => {
                let mut s = lock(&self.shared);
                if let Some(r) = s.replies.remove(&id) {
                    let _ = r.send(Ok(()));
                }
                if fin {
                    s.streams.remove(&id);
                }
            }
            Frame::Data { id, data, fin } => {
                let tx = lock(&self.shared).streams.get(&id).cloned();
                if let Some(tx) = tx
                    && !data.is_empty()
                {
                    let _ = tx.send(data).await;
                }
                if fin {
                    lock(&self.shared).streams.remove(&id);
                }
            }
            Frame::Rst { id } => {
                let mut s = lock(&self.shared);
                s.streams.remove(&id);
                if let Some(r) = s.replies.remove(&id) {
                    let _ = r.send(Err(SpdyError::Reset(id)));
                }
            }
            Frame::Ping(id) => {
                let _ = self.out.send(Out::Ping(id)).await;
            }
            Frame::GoAway => return false,
            Frame::Ignored => {}
        }
        true
    }

    /// A stream the peer opened: answered, then handed to the server.
    async fn accept(&mut self, id: u32, headers: Headers, fin: bool) {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        if !fin {
            lock(&self.shared).streams.insert(id, tx);
        }
        let _ = self.out.send(Out::SynReply { id }).await;
        let stream = Stream::new(id, headers, rx, self.out.clone());
        if self.incoming.send(stream).await.is_err() {
            let _ = self.out.send(Out::Rst { id, status: 3 }).await;
        }
    }
}

#[cfg(test)]
mod tests;
