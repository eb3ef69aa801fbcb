//! Exec: a process started inside a running container, as a handle that
//! streams (CRI's `Exec`), and `ExecSync` as a thin layer on it that
//! collects the output, bounded in size and time.
//!
//! A runtime hands back an [`ExecSession`]: the process's stdin, stdout and
//! stderr as async streams and a future of its exit code. Dropping the
//! session before the process ends kills the process, so a timeout or a
//! caller that went away never leaves one behind.

use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use crate::{BoxFuture, ExecResult, RuntimeError};

/// What to run, and which streams the caller wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub cmd: Vec<String>,
    /// Give the process a stdin the caller writes (else `/dev/null`).
    pub stdin: bool,
    /// Run it on a terminal (stdout and stderr are then one stream).
    pub tty: bool,
}

/// A terminal's size, for [`ExecSession::resize`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TermSize {
    pub width: u16,
    pub height: u16,
}

pub type Reader = Pin<Box<dyn AsyncRead + Send>>;
pub type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// A process running inside a container.
pub struct ExecSession {
    pub stdin: Option<Writer>,
    pub stdout: Option<Reader>,
    /// `None` with a terminal.
    pub stderr: Option<Reader>,
    /// Window size changes, with a terminal.
    pub resize: Option<tokio::sync::mpsc::Sender<TermSize>>,
    /// The exit code (128 + signal when a signal ended it).
    pub exit: BoxFuture<'static, Result<i32, RuntimeError>>,
}

/// A connection to a port inside a pod ([`crate::Runtime::port_forward`]).
pub struct PortStream {
    pub reader: Reader,
    pub writer: Writer,
}

/// What [`exec_sync`] keeps of each stream: CRI's message size limit.
pub const MAX_EXEC_SYNC_OUTPUT: usize = 16 << 20;

/// Reads a stream to its end, keeping at most `cap` bytes (the rest is
/// read and dropped, so a chatty process never blocks on a full pipe).
async fn read_capped(r: Option<Reader>, cap: usize) -> std::io::Result<Vec<u8>> {
    let Some(mut r) = r else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(out);
        }
        let keep = n.min(cap.saturating_sub(out.len()));
        out.extend_from_slice(&buf[..keep]);
    }
}

/// Runs a started session to its end: its output (each stream capped at
/// `cap` bytes) and exit code; past `timeout` (zero: none) the session is
/// dropped, which kills the process, and the answer is
/// [`RuntimeError::DeadlineExceeded`].
pub async fn exec_sync(
    mut s: ExecSession,
    timeout: Duration,
    cap: usize,
) -> Result<ExecResult, RuntimeError> {
    drop(s.stdin.take());
    let (out, err) = (s.stdout.take(), s.stderr.take());
    let run = async move {
        let (stdout, stderr, code) =
            tokio::join!(read_capped(out, cap), read_capped(err, cap), s.exit);
        let io = |e: std::io::Error| RuntimeError::Other(format!("reading exec output: {e}"));
        Ok(ExecResult {
            exit_code: code?,
            stdout: stdout.map_err(io)?,
            stderr: stderr.map_err(io)?,
        })
    };
    if timeout.is_zero() {
        return run.await;
    }
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(RuntimeError::DeadlineExceeded(format!(
            "command timed out after {}s",
            timeout.as_secs_f64()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(out: &'static [u8], code: i32, forever: bool) -> ExecSession {
        let exit: BoxFuture<'static, Result<i32, RuntimeError>> = if forever {
            Box::pin(std::future::pending())
        } else {
            Box::pin(async move { Ok(code) })
        };
        ExecSession {
            stdin: None,
            stdout: Some(Box::pin(out)),
            stderr: Some(Box::pin(&b"err"[..])),
            resize: None,
            exit,
        }
    }

    #[tokio::test]
    async fn collects_output_and_code_within_the_cap() {
        let r = exec_sync(session(b"hello world", 3, false), Duration::ZERO, 5)
            .await
            .unwrap();
        assert_eq!(r.stdout, b"hello");
        assert_eq!(r.stderr, b"err");
        assert_eq!(r.exit_code, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_past_its_timeout_is_a_deadline() {
        let r = exec_sync(session(b"", 0, true), Duration::from_secs(1), 5).await;
        assert!(matches!(r, Err(RuntimeError::DeadlineExceeded(_))), "{r:?}");
    }
}
