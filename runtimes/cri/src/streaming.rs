//! CRI streaming: `Exec` and `PortForward` answer with a URL on the
//! runtime's streaming server (containerd's, on loopback). kinglet
//! upgrades a connection to it to SPDY/3.1 and speaks the client side of
//! the kubelet's protocols there (`v4.channel.k8s.io` for exec,
//! `portforward.k8s.io`), where upstream's kubelet proxies the bytes of
//! the user's request instead; the result is the same [`ExecSession`] and
//! [`PortStream`] the in-process runtime gives, so the kubelet API has one
//! path for both runtimes.

use bytes::Bytes;
use http_body_util::Empty;
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use kinglet_runtime::RuntimeError;
use kinglet_runtime::exec::{ExecOptions, ExecSession, PortStream, TermSize};
use kinglet_spdy::{Conn, Headers};

fn err(what: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Other(format!("streaming {what}: {e}"))
}

/// An SPDY/3.1 connection to `url` speaking `protocol`.
async fn upgrade(url: &str, protocol: &str) -> Result<Conn, RuntimeError> {
    let uri: Uri = url.parse().map_err(|e| err("url", e))?;
    if uri.scheme_str() != Some("http") {
        return Err(RuntimeError::Unsupported("a TLS streaming server"));
    }
    let host = uri.host().ok_or_else(|| err("url", "no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| err("connect", e))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| err("handshake", e))?;
    tokio::spawn(conn.with_upgrades());
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = Request::post(path)
        .header(hyper::header::HOST, format!("{host}:{port}"))
        .header(hyper::header::CONNECTION, "Upgrade")
        .header(hyper::header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", protocol)
        .body(Empty::<Bytes>::new())
        .map_err(|e| err("request", e))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| err("request", e))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(err("upgrade", format!("answered {}", resp.status())));
    }
    let io = hyper::upgrade::on(resp)
        .await
        .map_err(|e| err("upgrade", e))?;
    Ok(Conn::start(TokioIo::new(io), true).0)
}

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// The exit code in the error stream's `metav1.Status` (v4): nothing or
/// `Success` is 0, `NonZeroExitCode` carries the code as its cause.
pub fn exit_code(status: &[u8]) -> Result<i32, RuntimeError> {
    if status.iter().all(u8::is_ascii_whitespace) {
        return Ok(0);
    }
    let v: serde_json::Value = serde_json::from_slice(status)
        .map_err(|_| RuntimeError::Other(String::from_utf8_lossy(status).into_owned()))?;
    if v["status"] == "Success" {
        return Ok(0);
    }
    if v["reason"] == "NonZeroExitCode" {
        let causes = v["details"]["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(code) = causes
            .iter()
            .filter(|c| c["reason"] == "ExitCode")
            .find_map(|c| c["message"].as_str()?.parse().ok())
        {
            return Ok(code);
        }
    }
    let msg = v["message"].as_str().unwrap_or("exec failed").to_string();
    Err(RuntimeError::Other(msg))
}

/// An exec session on the streaming server's `url`.
pub async fn exec_session(url: &str, opts: &ExecOptions) -> Result<ExecSession, RuntimeError> {
    let conn = upgrade(url, "v4.channel.k8s.io").await?;
    let open = |kind: &'static str| {
        let conn = conn.clone();
        async move {
            conn.open(headers(&[("streamType", kind)]))
                .await
                .map_err(|e| err("stream", e))
        }
    };
    let mut error = open("error").await?;
    let stdin = match opts.stdin {
        true => Some(open("stdin").await?),
        false => None,
    };
    let stdout = open("stdout").await?;
    let stderr = match opts.tty {
        false => Some(open("stderr").await?),
        true => None,
    };
    let resize = match opts.tty {
        true => Some(open("resize").await?),
        false => None,
    };
    let resize = resize.map(|r| {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<TermSize>(4);
        tokio::spawn(async move {
            while let Some(s) = rx.recv().await {
                let j = format!(r#"{{"Width":{},"Height":{}}}"#, s.width, s.height);
                if r.writer.write(j.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        tx
    });
    let closer = conn.closer();
    let exit = Box::pin(async move {
        let _closer = closer;
        let mut status = Vec::new();
        while let Some(b) = error.reader.read().await {
            status.extend_from_slice(&b);
            if status.len() > 64 * 1024 {
                break;
            }
        }
        exit_code(&status)
    });
    Ok(ExecSession {
        stdin: stdin
            .map(|s| -> kinglet_runtime::exec::Writer { Box::pin(s.writer.into_async_write()) }),
        stdout: Some(Box::pin(stdout.reader.into_async_read())),
        stderr: stderr
            .map(|s| -> kinglet_runtime::exec::Reader { Box::pin(s.reader.into_async_read()) }),
        resize,
        exit,
    })
}

/// A connection to `port` through the streaming server's `url`: one
/// SPDY connection with an error and a data stream, as kubectl's.
pub async fn port_stream(url: &str, port: u16) -> Result<PortStream, RuntimeError> {
    let conn = upgrade(url, "portforward.k8s.io").await?;
    let port = port.to_string();
    let open = |kind: &'static str| {
        conn.open(headers(&[
            ("streamType", kind),
            ("port", &port),
            ("requestID", "0"),
        ]))
    };
    let mut error = open("error").await.map_err(|e| err("stream", e))?;
    let data = open("data").await.map_err(|e| err("stream", e))?;
    let closer = conn.closer();
    // What the server says went wrong, logged; the connection lives as
    // long as the data stream's reader.
    tokio::spawn(async move {
        let mut msg = Vec::new();
        while let Some(b) = error.reader.read().await {
            msg.extend_from_slice(&b);
        }
        if !msg.is_empty() {
            tracing::debug!(error = %String::from_utf8_lossy(&msg), "port-forward through the runtime failed");
        }
    });
    let reader = CloseWith {
        inner: data.reader.into_async_read(),
        _closer: closer,
    };
    Ok(PortStream {
        reader: Box::pin(reader),
        writer: Box::pin(data.writer.into_async_write()),
    })
}

/// A reader that ends its connection when dropped.
struct CloseWith<R> {
    inner: R,
    _closer: kinglet_spdy::Closer,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CloseWith<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_come_from_the_status() {
        assert_eq!(exit_code(b"").unwrap(), 0);
        assert_eq!(exit_code(br#"{"status":"Success"}"#).unwrap(), 0);
        let bad = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"42"}]}}"#;
        assert_eq!(exit_code(bad).unwrap(), 42);
        let internal = br#"{"status":"Failure","reason":"InternalError","message":"no such file"}"#;
        assert!(
            exit_code(internal)
                .unwrap_err()
                .to_string()
                .contains("no such file")
        );
    }
}
