//! Exec, attach and terminal sessions in-process: the process's streams
//! as pipes (or a terminal) whose far ends the monitor hands to the
//! process it starts through libcontainer; the output flows straight from
//! the process to the caller.

use super::*;

impl OciRuntime {
    /// CRI `Exec` in-process: pipes for the process's streams, their far
    /// ends handed to the monitor (which starts the process through
    /// libcontainer and reaps it); the output flows straight from the
    /// process to the caller. No terminal yet: that comes with `kubectl
    /// exec -t`.
    pub(crate) async fn exec_session(
        &self,
        id: &str,
        opts: &ExecOptions,
    ) -> Result<ExecSession, RuntimeError> {
        use tokio::net::unix::pipe;
        if opts.cmd.is_empty() {
            return Err(RuntimeError::Other("exec: no command given".into()));
        }
        if opts.tty {
            return self.exec_tty(id, opts).await;
        }
        let io = |e: std::io::Error| RuntimeError::Other(format!("exec pipes: {e}"));
        let mk =
            || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e.into()));
        let (out_r, out_w) = mk()?;
        let (err_r, err_w) = mk()?;
        let (stdin, their_stdin) = if opts.stdin {
            let (r, w) = mk()?;
            (Some(w), r)
        } else {
            let null = std::fs::File::open("/dev/null").map_err(io)?;
            (None, std::os::fd::OwnedFd::from(null))
        };
        let handle = self
            .monitor
            .exec(id, &opts.cmd, [their_stdin, out_w, err_w])
            .await
            .map_err(from_monitor)?;
        let stdout = pipe::Receiver::from_owned_fd(out_r).map_err(io)?;
        let stderr = pipe::Receiver::from_owned_fd(err_r).map_err(io)?;
        let stdin = match stdin {
            Some(w) => Some(Box::pin(pipe::Sender::from_owned_fd(w).map_err(io)?)
                as kinglet_runtime::exec::Writer),
            None => None,
        };
        Ok(ExecSession {
            stdin,
            stdout: Some(Box::pin(stdout)),
            stderr: Some(Box::pin(stderr)),
            resize: None,
            exit: Box::pin(async move {
                handle
                    .wait()
                    .await
                    .map_err(|e| RuntimeError::Other(e.to_string()))
            }),
        })
    }

    /// An attach: two pipes the monitor copies the container's output
    /// into, and its stdin pipe when it has one (and the caller asks). The
    /// session ends when the container's output does (its exit); leaving
    /// early closes the pipes, and the monitor drops them.
    pub(crate) async fn attach_session(
        &self,
        id: &str,
        opts: &ExecOptions,
    ) -> Result<ExecSession, RuntimeError> {
        use tokio::net::unix::pipe;
        let io = |e: std::io::Error| RuntimeError::Other(format!("attach pipes: {e}"));
        let mk =
            || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e.into()));
        let (out_r, out_w) = mk()?;
        let (err_r, err_w) = mk()?;
        // Room for bursts: the monitor drops a reader it cannot write to.
        for w in [&out_w, &err_w] {
            let _ = rustix::pipe::fcntl_setpipe_size(w, 1 << 20);
        }
        let stdin = self
            .monitor
            .attach(id, [out_w, err_w])
            .await
            .map_err(from_monitor)?;
        let stdin = match stdin.filter(|_| opts.stdin) {
            Some(w) => Some(Box::pin(pipe::Sender::from_owned_fd(w).map_err(io)?)
                as kinglet_runtime::exec::Writer),
            None => None,
        };
        Ok(ExecSession {
            stdin,
            stdout: Some(Box::pin(pipe::Receiver::from_owned_fd(out_r).map_err(io)?)),
            stderr: Some(Box::pin(pipe::Receiver::from_owned_fd(err_r).map_err(io)?)),
            resize: None,
            // No exit code of its own: the streams' end is the session's.
            exit: Box::pin(async { Ok(0) }),
        })
    }

    /// An exec on a terminal: its output on stdout, its input on stdin (if
    /// asked for), window sizes applied to it.
    pub(crate) async fn exec_tty(
        &self,
        id: &str,
        opts: &ExecOptions,
    ) -> Result<ExecSession, RuntimeError> {
        let (handle, master) = self
            .monitor
            .exec_tty(id, &opts.cmd)
            .await
            .map_err(from_monitor)?;
        let master = pty::Master::new(master)
            .map_err(|e| RuntimeError::Other(format!("exec terminal: {e}")))?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<kinglet_runtime::exec::TermSize>(4);
        let sizer = master.clone();
        tokio::spawn(async move {
            while let Some(s) = rx.recv().await {
                let _ = sizer.resize(s.width, s.height);
            }
        });
        let stdin = opts
            .stdin
            .then(|| Box::pin(master.clone()) as kinglet_runtime::exec::Writer);
        Ok(ExecSession {
            stdin,
            stdout: Some(Box::pin(master)),
            stderr: None,
            resize: Some(tx),
            exit: Box::pin(async move {
                handle
                    .wait()
                    .await
                    .map_err(|e| RuntimeError::Other(e.to_string()))
            }),
        })
    }
}
