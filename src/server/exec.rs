//! `/exec/{ns}/{pod}[/{uid}]/{container}`: a process started in a running
//! container and streamed over the WebSocket channel protocols
//! (`v5.channel.k8s.io` down to `channel.k8s.io`, binary and base64), as
//! upstream's `cri-streaming` remotecommand server.
//!
//! Why WebSockets and not SPDY: the 1.37 apiserver proxies a WebSocket
//! exec request to a node as it is when the node declares the
//! `ExtendWebSocketsToKubelet` feature (kinglet does, see
//! `node::status::StatusConfig::declared_features`); only clients still
//! speaking SPDY (kubectl before 1.31) would need SPDY, and they get a
//! clear 400.
//!
//! The wire, per message: one channel byte (0 stdin, 1 stdout, 2 stderr,
//! 3 error, 4 resize), then data; base64 protocols send the channel as an
//! ASCII digit and the data base64-encoded, as text. v5 adds `255, ch`:
//! the client closed its stream `ch` (stdin's end of file). The process's
//! exit is a `metav1.Status` on channel 3 (v4 and v5) or, before v4, the
//! error text alone; then the socket is closed.

use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use kinglet_runtime::RuntimeError;
use kinglet_runtime::exec::{ExecOptions, ExecSession, Reader, TermSize, Writer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::Message;
use tracing::debug;

use super::idle::Activity;
use super::{Body, State, Target, text, ws};
use hyper::{Request, Response, StatusCode};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5: the client closed one of its streams.
const CLOSE_STREAM: u8 = 255;

/// A channel protocol kinglet speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Protocol {
    /// As negotiated (`""` when the client named none).
    pub name: &'static str,
    pub base64: bool,
    /// 1 (before v4), 4 or 5.
    pub version: u8,
}

const PROTOCOLS: &[Protocol] = &[
    Protocol {
        name: "v5.channel.k8s.io",
        base64: false,
        version: 5,
    },
    Protocol {
        name: "v4.channel.k8s.io",
        base64: false,
        version: 4,
    },
    Protocol {
        name: "v4.base64.channel.k8s.io",
        base64: true,
        version: 4,
    },
    Protocol {
        name: "channel.k8s.io",
        base64: false,
        version: 1,
    },
    Protocol {
        name: "base64.channel.k8s.io",
        base64: true,
        version: 1,
    },
];

/// The first protocol of the client's list (`Sec-WebSocket-Protocol`)
/// that kinglet speaks, as Go's websocket handshake picks; no header means
/// the unnamed binary protocol.
pub fn negotiate(header: Option<&str>) -> Option<Protocol> {
    let offered = header.map(str::trim).unwrap_or("");
    if offered.is_empty() {
        return Some(Protocol {
            name: "",
            base64: false,
            version: 1,
        });
    }
    offered
        .split(',')
        .map(str::trim)
        .find_map(|o| PROTOCOLS.iter().find(|p| p.name == o).copied())
}

/// The streams the request asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    /// An attach that ends when the client closes its stdin (the
    /// container's own stdin stays open for the next one), as containerd
    /// ends it: every attach but one to a `stdinOnce` container without a
    /// terminal, whose stdin then closes and whose output is streamed to
    /// its end.
    pub detach_on_stdin_close: bool,
}

/// `command=…` (repeated; exec only) and the stream flags, as upstream's
/// `remotecommand.NewOptions`: a flag is set by `1` (what the apiserver
/// sends) or `true`; a terminal merges stderr into stdout.
/// An exec or attach request refused (a 400), in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("you must specify at least 1 of stdin, stdout, stderr")]
    NoStream,
    #[error("you must specify a command")]
    NoCommand,
}

pub fn parse_query(query: &str, needs_command: bool) -> Result<(Vec<String>, Streams), QueryError> {
    let mut cmd = Vec::new();
    let mut s = Streams::default();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        let on = v == "1" || v.eq_ignore_ascii_case("true");
        match &*k {
            "command" => cmd.push(v.into_owned()),
            "input" | "stdin" => s.stdin = on,
            "output" | "stdout" => s.stdout = on,
            "error" | "stderr" => s.stderr = on,
            "tty" => s.tty = on,
            _ => {}
        }
    }
    if s.tty {
        s.stderr = false;
    }
    if !(s.stdin || s.stdout || s.stderr) {
        return Err(QueryError::NoStream);
    }
    if needs_command && cmd.is_empty() {
        return Err(QueryError::NoCommand);
    }
    Ok((cmd, s))
}

impl Streams {
    pub fn exec_options(&self, cmd: Vec<String>) -> ExecOptions {
        ExecOptions {
            cmd,
            stdin: self.stdin,
            tty: self.tty,
        }
    }
}

/// One message for the client on channel `ch`.
pub(super) fn frame(p: Protocol, ch: u8, data: &[u8]) -> Message {
    if p.base64 {
        let mut t = String::with_capacity(1 + data.len() * 4 / 3 + 4);
        t.push(char::from(b'0' + ch));
        base64::engine::general_purpose::STANDARD.encode_string(data, &mut t);
        Message::Text(t.into())
    } else {
        let mut b = Vec::with_capacity(1 + data.len());
        b.push(ch);
        b.extend_from_slice(data);
        Message::Binary(b.into())
    }
}

/// What a client message means.
#[derive(Debug, PartialEq, Eq)]
enum Incoming {
    Stdin(Bytes),
    CloseStdin,
    Resize(TermSize),
    Ignore,
    /// The client closed the socket.
    Gone,
}

#[derive(serde::Deserialize)]
struct Size {
    #[serde(rename = "Width", default)]
    width: u16,
    #[serde(rename = "Height", default)]
    height: u16,
}

fn decode(p: Protocol, m: Message) -> Incoming {
    let data: Vec<u8> = match m {
        Message::Binary(b) => b.into(),
        Message::Text(t) => t.as_bytes().to_vec(),
        Message::Close(_) => return Incoming::Gone,
        _ => return Incoming::Ignore,
    };
    let Some((&first, rest)) = data.split_first() else {
        return Incoming::Ignore;
    };
    if p.version >= 5 && first == CLOSE_STREAM {
        return match rest {
            [STDIN] => Incoming::CloseStdin,
            _ => Incoming::Ignore,
        };
    }
    let (ch, payload) = if p.base64 {
        let Ok(d) = base64::engine::general_purpose::STANDARD.decode(rest) else {
            return Incoming::Ignore;
        };
        (first.wrapping_sub(b'0'), d)
    } else {
        (first, rest.to_vec())
    };
    match ch {
        STDIN => Incoming::Stdin(payload.into()),
        RESIZE => match serde_json::from_slice::<Size>(&payload) {
            Ok(s) => Incoming::Resize(TermSize {
                width: s.width,
                height: s.height,
            }),
            Err(_) => Incoming::Ignore,
        },
        _ => Incoming::Ignore,
    }
}

/// The exit as the error channel carries it: a `metav1.Status` (v4, v5),
/// or before v4 only a failure's message.
fn exit_status(p: Protocol, exit: &Result<i32, RuntimeError>, cmd: &[String]) -> Option<Vec<u8>> {
    let status = match exit {
        Ok(0) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Ok(code) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command {cmd:?}, exit code {code}"
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Err(e) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("Internal error occurred: error executing command in container: {e}"),
            "reason": "InternalError",
            "code": 500,
        }),
    };
    if p.version >= 4 {
        return Some(status.to_string().into_bytes());
    }
    status["message"].as_str().map(|m| m.as_bytes().to_vec())
}

/// Copies a process stream to the client on `ch`; with `send` false
/// (the client did not ask for it) the output is read and dropped.
async fn pump(r: Option<Reader>, p: Protocol, ch: u8, send: bool, tx: mpsc::Sender<Message>) {
    let Some(mut r) = r else { return };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) if send => {
                if tx.send(frame(p, ch, &buf[..n])).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
        }
    }
}

/// Why the client's side ended.
enum ClientEnd {
    Gone,
    /// It closed its stdin, which ends this attach.
    Detached,
}

/// Reads the client until it goes away: stdin into the process, window
/// sizes to the terminal.
async fn read_client<S>(
    source: &mut S,
    p: Protocol,
    mut stdin: Option<Writer>,
    resize: Option<mpsc::Sender<TermSize>>,
    activity: &Activity,
    detach_on_close: bool,
) -> ClientEnd
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    while let Some(Ok(m)) = source.next().await {
        let m = decode(p, m);
        if !matches!(m, Incoming::Ignore) {
            activity.touch();
        }
        match m {
            Incoming::Stdin(d) => {
                if let Some(w) = stdin.as_mut()
                    && w.write_all(&d).await.is_err()
                {
                    stdin = None;
                }
            }
            Incoming::CloseStdin => {
                if let Some(mut w) = stdin.take() {
                    let _ = w.shutdown().await;
                }
                if detach_on_close {
                    return ClientEnd::Detached;
                }
            }
            Incoming::Resize(size) => {
                if let Some(r) = &resize {
                    let _ = r.send(size).await;
                }
            }
            Incoming::Ignore => {}
            Incoming::Gone => return ClientEnd::Gone,
        }
    }
    ClientEnd::Gone
}

/// How long a process is left to finish once its client went away.
const CLIENT_GONE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// How a session ended.
enum End {
    /// The process ended (or the client detached from an attach).
    Exit(Result<i32, RuntimeError>),
    /// The client went away; the process is killed.
    ClientGone,
    /// No data moved for the idle timeout.
    Idle,
}

/// Streams one session over an upgraded connection until the process
/// ends (then its status and a close), the client goes away, or no data
/// moves for `idle` (then the session is dropped, which kills the
/// process; an idle connection is cut, as upstream's deadline cuts it).
pub async fn stream<IO>(
    io: IO,
    p: Protocol,
    want: Streams,
    cmd: Vec<String>,
    mut s: ExecSession,
    idle: std::time::Duration,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut source) = super::ws::server(io).await.split();
    let activity = Activity::new(idle);
    let (tx, writer) = super::ws::writer(sink, activity.clone());
    // As upstream: an empty first message on the first stream the client
    // reads, so it knows the streams are up.
    let first = match (want.stdout, want.stderr) {
        (true, _) => STDOUT,
        (false, true) => STDERR,
        _ => ERROR,
    };
    let _ = tx.send(frame(p, first, b"")).await;
    let (out, err) = (s.stdout.take(), s.stderr.take());
    let (stdin, resize) = (s.stdin.take(), s.resize.take());
    let (tx_out, tx_err) = (tx.clone(), tx.clone());
    let run = async move {
        let (_, _, exit) = tokio::join!(
            pump(out, p, STDOUT, want.stdout, tx_out),
            pump(err, p, STDERR, want.stderr, tx_err),
            s.exit,
        );
        exit
    };
    let client = read_client(
        &mut source,
        p,
        stdin,
        resize,
        &activity,
        want.detach_on_stdin_close,
    );
    // The session's end kills a process still running and drops the
    // pumps' senders, so the writer below sees the end of its queue.
    let e = match session_end(run, client, &activity).await {
        End::Exit(e) => e,
        End::Idle => {
            debug!(
                ?idle,
                "exec session idle (streamingConnectionIdleTimeout); the process is killed"
            );
            writer.abort();
            return;
        }
        End::ClientGone => {
            debug!("exec client went away; the process is killed");
            // Nobody reads the socket any more: it goes now, with the writer.
            writer.abort();
            return;
        }
    };
    if let Some(body) = exit_status(p, &e, &cmd) {
        let _ = tx.send(frame(p, ERROR, &body)).await;
    }
    drop(tx);
    if let Ok(Some(sink)) = writer.await {
        close_normally(sink, source).await;
    }
}

/// Waits for the process (`run`), the client's side or the idle timeout.
async fn session_end(
    run: impl std::future::Future<Output = Result<i32, RuntimeError>>,
    client: impl std::future::Future<Output = ClientEnd>,
    activity: &Activity,
) -> End {
    let mut run = std::pin::pin!(run);
    tokio::select! {
        e = &mut run => End::Exit(e),
        // The client's side ended: a process that is finishing anyway
        // (its output in flight) gets a moment to, then it is killed. An
        // attach the client detached from ends well, the container running.
        end = client => {
            let finishing = tokio::time::timeout(CLIENT_GONE_GRACE, &mut run).await;
            match (end, finishing) {
                (_, Ok(e)) => End::Exit(e),
                // The runtime's own end first (containerd ends the attach
                // once the stdin it was sent is in), else it ends here.
                (ClientEnd::Detached, Err(_)) => End::Exit(Ok(0)),
                (ClientEnd::Gone, Err(_)) => End::ClientGone,
            }
        }
        _ = activity.expired() => End::Idle,
    }
}

/// A WebSocket's normal end: 1000, as Go's websocket closes (clients read
/// it as the end of every stream; a close without a code is an error to
/// them), then the closing handshake: the client's input is read until
/// its Close (or its end) before the socket goes. Closing with unread
/// input makes the kernel reset the connection, and a reset drops what
/// the peer has not read yet: the tail of the output and the status.
async fn close_normally<K, S>(mut sink: K, mut source: S)
where
    K: futures::Sink<Message> + Unpin,
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let normal = tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
        reason: "".into(),
    };
    let _ = sink.send(Message::Close(Some(normal))).await;
    let drain = async { while let Some(Ok(_)) = source.next().await {} };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drain).await;
    let _ = sink.close().await;
}

/// The runtime's ID of the named container, if it runs, and its pod; or
/// upstream's 404/500 status and message.
fn running_container(
    state: &State,
    target: &Target<'_>,
    container: &str,
) -> Result<(String, std::sync::Arc<k8s_openapi::api::core::v1::Pod>), (StatusCode, String)> {
    let (_, entry) = target.find(&state.view)?;
    let s = &entry.status;
    let statuses = s.container_statuses.iter().flatten();
    let statuses = statuses
        .chain(s.init_container_statuses.iter().flatten())
        .chain(s.ephemeral_container_statuses.iter().flatten());
    let id = statuses
        .filter(|c| c.name == container)
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .find_map(|c| c.container_id.as_deref())
        .map(|id| id.split_once("://").map_or(id, |(_, id)| id).to_string())
        .ok_or_else(|| {
            let msg = format!("container not found ({container:?})");
            (StatusCode::INTERNAL_SERVER_ERROR, msg)
        })?;
    Ok((id, entry.pod))
}

/// Whether the container's stdin closes with its first attach's
/// (`stdinOnce` without a terminal): that attach then streams the output
/// to the container's end.
fn closes_stdin_once(pod: &k8s_openapi::api::core::v1::Pod, container: &str) -> bool {
    let spec = pod.spec.as_ref();
    let containers = spec.into_iter().flat_map(|s| s.containers.iter());
    let inits = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten());
    containers
        .chain(inits)
        .find(|c| c.name == container)
        .is_some_and(|c| c.stdin_once == Some(true) && c.tty != Some(true))
}

/// Which endpoint a streaming request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Exec,
    Attach,
}

/// `/exec` and `/attach`: the process is started (or the attach made)
/// first, so a refusal is a plain HTTP error; then the connection is
/// upgraded to a WebSocket and streamed.
pub async fn handle(
    state: &State,
    mut req: Request<hyper::body::Incoming>,
    kind: Kind,
    target: Target<'_>,
    container: &str,
    query: &str,
) -> Response<Body> {
    let (cmd, want) = match parse_query(query, kind == Kind::Exec) {
        Ok(q) => q,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (key, offered) = match ws::upgrade_request(&req, "exec") {
        Ok(k) => k,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let Some(protocol) = negotiate(Some(&offered)) else {
        let msg = "requested protocol(s) are not supported";
        return text(StatusCode::BAD_REQUEST, msg);
    };
    let (id, pod) = match running_container(state, &target, container) {
        Ok(found) => found,
        Err((code, msg)) => return text(code, msg),
    };
    let mut want = want;
    if kind == Kind::Attach && want.stdin {
        want.detach_on_stdin_close = !closes_stdin_once(&pod, container);
    }
    let opts = want.exec_options(cmd.clone());
    let started = match kind {
        Kind::Exec => state.runtime.exec(&id, &opts).await,
        Kind::Attach => state.runtime.attach(&id, &opts).await,
    };
    let session = match started {
        Ok(s) => s,
        Err(e) => {
            let msg = match kind {
                Kind::Exec => format!("error executing command in container: {e}"),
                Kind::Attach => format!("error attaching to container: {e}"),
            };
            return text(StatusCode::INTERNAL_SERVER_ERROR, msg);
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let idle = state.stream_idle_timeout;
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => {
                stream(
                    hyper_util::rt::TokioIo::new(io),
                    protocol,
                    want,
                    cmd,
                    session,
                    idle,
                )
                .await
            }
            Err(e) => debug!(error = %e, "exec upgrade failed; the process is killed"),
        }
    });
    ws::switching(&key, protocol.name)
}

/// `/run`: `cmd` (split at spaces, as upstream) run to its end; stdout
/// then stderr as the body (with upstream's JSON content type, though the
/// body is the raw output).
pub async fn run(
    state: &State,
    target: Target<'_>,
    container: &str,
    query: &str,
) -> Response<Body> {
    let cmd: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "cmd")
        .map(|(_, v)| v.split(' ').map(str::to_string).collect())
        .unwrap_or_default();
    if cmd.iter().all(|c| c.is_empty()) {
        return text(StatusCode::BAD_REQUEST, "you must specify a command");
    }
    let id = match running_container(state, &target, container) {
        Ok((id, _)) => id,
        Err((code, msg)) => return text(code, msg),
    };
    // Bounded, unlike upstream's: a command that never ends must not hold
    // a connection and a process forever.
    let timeout = std::time::Duration::from_secs(300);
    match state.runtime.exec_sync(&id, &cmd, timeout).await {
        Ok(r) => {
            use http_body_util::BodyExt;
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            let body = http_body_util::Full::new(Bytes::from(out)).boxed();
            super::respond(StatusCode::OK, "application/json", body)
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_takes_the_clients_first_known_protocol() {
        let p = negotiate(Some("v5.channel.k8s.io, v4.channel.k8s.io")).unwrap();
        assert_eq!(p.version, 5);
        let p = negotiate(Some("SPDY/3.1+portforward.k8s.io,v4.base64.channel.k8s.io")).unwrap();
        assert_eq!((p.version, p.base64), (4, true));
        assert_eq!(negotiate(None).unwrap().name, "");
        assert!(negotiate(Some("v9.channel.k8s.io")).is_none());
    }

    #[test]
    fn query_gives_the_command_and_streams_as_upstream() {
        let (cmd, s) = parse_query(
            "command=sh&command=-c&command=echo%20hi&stdout=1&stderr=1&tty=0",
            true,
        )
        .unwrap();
        assert_eq!(cmd, ["sh", "-c", "echo hi"]);
        assert_eq!(
            s,
            Streams {
                stdout: true,
                stderr: true,
                ..Default::default()
            }
        );
        // A terminal has no separate stderr.
        let (_, s) = parse_query("command=sh&stdin=true&stdout=1&stderr=1&tty=1", true).unwrap();
        assert!(s.tty && s.stdin && !s.stderr);
        let refused = parse_query("command=sh", true).unwrap_err().to_string();
        assert!(refused.contains("at least 1"), "{refused}");
        assert_eq!(
            parse_query("stdout=1", true).unwrap_err(),
            QueryError::NoCommand
        );
        // Attach names no command.
        assert!(parse_query("stdout=1", false).unwrap().0.is_empty());
    }

    #[test]
    fn frames_carry_the_channel_in_both_codecs() {
        let bin = negotiate(Some("v4.channel.k8s.io")).unwrap();
        assert_eq!(
            frame(bin, 1, b"hi"),
            Message::Binary(vec![1, b'h', b'i'].into())
        );
        let b64 = negotiate(Some("base64.channel.k8s.io")).unwrap();
        assert_eq!(frame(b64, 2, b"hi"), Message::Text("2aGk=".into()));
        assert_eq!(
            decode(b64, Message::Text("0aGk=".into())),
            Incoming::Stdin(Bytes::from_static(b"hi"))
        );
    }

    #[test]
    fn v5_closes_stdin_and_resizes_are_json() {
        let v5 = negotiate(Some("v5.channel.k8s.io")).unwrap();
        assert_eq!(
            decode(v5, Message::Binary(vec![255, 0].into())),
            Incoming::CloseStdin
        );
        let v4 = negotiate(Some("v4.channel.k8s.io")).unwrap();
        assert_eq!(
            decode(v4, Message::Binary(vec![255, 0].into())),
            Incoming::Ignore
        );
        let mut m = vec![4];
        m.extend_from_slice(br#"{"Width":80,"Height":24}"#);
        assert_eq!(
            decode(v5, Message::Binary(m.into())),
            Incoming::Resize(TermSize {
                width: 80,
                height: 24
            })
        );
        assert_eq!(decode(v5, Message::Close(None)), Incoming::Gone);
    }

    #[test]
    fn the_exit_is_a_status_with_the_code_as_its_cause() {
        let v4 = negotiate(Some("v4.channel.k8s.io")).unwrap();
        let ok: serde_json::Value =
            serde_json::from_slice(&exit_status(v4, &Ok(0), &[]).unwrap()).unwrap();
        assert_eq!(ok["status"], "Success");
        let cmd = vec!["false".to_string()];
        let bad: serde_json::Value =
            serde_json::from_slice(&exit_status(v4, &Ok(3), &cmd).unwrap()).unwrap();
        assert_eq!(bad["reason"], "NonZeroExitCode");
        assert_eq!(bad["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(bad["details"]["causes"][0]["message"], "3");
        // Before v4: nothing on success, the message on failure.
        let v1 = negotiate(Some("channel.k8s.io")).unwrap();
        assert!(exit_status(v1, &Ok(0), &[]).is_none());
        let m = exit_status(v1, &Ok(3), &cmd).unwrap();
        assert!(String::from_utf8(m).unwrap().contains("exit code 3"));
    }
}
