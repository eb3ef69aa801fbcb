//! `kinglet upgrade FILE`: the agent replaces its own binary and rolls
//! itself back, for fleets of boxes nobody can reach by hand. An A/B swap
//! a single static binary makes cheap:
//!
//! 1. the new binary is staged under `<root-dir>/upgrade/` (copied,
//!    fsynced, its SHA-256 checked when given, `--version` run), and the
//!    running one kept beside it as `kinglet.previous`;
//! 2. the record ([`state`]) says `Trial`, with a deadline; the new
//!    binary is renamed over the installed one (atomic: the running
//!    process keeps its file) and the service restarted. Pods are not
//!    touched: the container monitor (or containerd) outlives the agent,
//!    which re-adopts what runs;
//! 3. the new agent commits itself once its health checks (`/healthz`'s:
//!    the sync loop and PLEG, each having beaten since the start) stayed
//!    healthy for `--commit-after`; past the deadline without that, it
//!    stops;
//! 4. before every start, the unit runs the *previous* binary as the guard
//!    (`ExecStartPre=-…/kinglet.previous upgrade-guard`): during a trial
//!    it counts the starts, and after `--max-attempts` of them, or past the
//!    deadline, it puts the previous binary back. So a binary that exits
//!    at start, crash-loops, hangs (systemd's watchdog), or never turns
//!    healthy is rolled back, across reboots and power cuts too.
//!
//! `kinglet upgrade` waits for the outcome and exits 0 when committed, 1
//! when rolled back. With `--installed` the new binary is already in
//! place (the Debian package's `postinst` and the bundle's `install.sh`,
//! which kept the one it replaced): steps 2–4 only.

pub mod state;

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::Digest;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use state::{Phase, State};

/// The largest binary accepted.
const MAX_BINARY: u64 = 64 << 20;

/// `kinglet upgrade`'s command line.
#[derive(Debug, clap::Args)]
pub struct UpgradeArgs {
    /// The new binary; with --installed, the binary it replaced.
    #[arg(value_name = "FILE")]
    pub binary: PathBuf,
    /// The new binary is already at the install path (a package manager
    /// put it there): FILE is the one it replaced, kept as the previous.
    #[arg(long)]
    pub installed: bool,
    /// The file's expected SHA-256, in hex.
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// The binary the service runs [default: this one].
    #[arg(long, value_name = "PATH")]
    pub install_path: Option<PathBuf>,
    /// How long the new binary has to be committed.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub timeout: String,
    /// How long it must stay healthy (/healthz's checks) to be committed.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub commit_after: String,
    /// Starts of the new binary before it is rolled back.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub max_attempts: u32,
    /// The systemd unit to restart; empty: restart the agent yourself.
    #[arg(long, value_name = "UNIT", default_value = "kinglet.service")]
    pub unit: String,
}

impl UpgradeArgs {
    /// The options, the durations parsed and the install path found.
    pub fn options(self) -> Result<Options, UpgradeError> {
        let duration = |flag: &'static str, v: &str| {
            crate::config::units::parse_go_duration(v).map_err(|e| UpgradeError::Flag {
                flag,
                message: e.to_string(),
            })
        };
        let install_path = match self.install_path {
            Some(p) => p,
            None => std::env::current_exe().map_err(|e| UpgradeError::Flag {
                flag: "--install-path",
                message: e.to_string(),
            })?,
        };
        Ok(Options {
            installed: self.installed,
            timeout: duration("--timeout", &self.timeout)?,
            commit_after: duration("--commit-after", &self.commit_after)?,
            binary: self.binary,
            sha256: self.sha256,
            install_path,
            max_attempts: self.max_attempts,
            unit: (!self.unit.is_empty()).then_some(self.unit),
        })
    }
}

/// What `kinglet upgrade` is asked.
#[derive(Clone, Debug)]
pub struct Options {
    pub binary: PathBuf,
    /// `binary` is the replaced one; the new one is at `install_path`.
    pub installed: bool,
    pub sha256: Option<String>,
    /// The binary the service runs; by default the running one's path.
    pub install_path: PathBuf,
    pub timeout: Duration,
    pub commit_after: Duration,
    pub max_attempts: u32,
    /// The systemd unit to restart; `None`: the caller restarts the agent.
    pub unit: Option<String>,
}

/// Why an upgrade did not happen or did not stay.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("{flag}: {message}")]
    Flag { flag: &'static str, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: larger than {MAX_BINARY} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}: sha256 is {got}, not {want}")]
    Checksum {
        path: PathBuf,
        want: String,
        got: String,
    },
    #[error("{path} is not a kinglet binary: {message}")]
    NotKinglet { path: PathBuf, message: String },
    #[error("an upgrade to {0} is still on trial")]
    InProgress(String),
    #[error("restarting {unit}: {message}")]
    Restart { unit: String, message: String },
    #[error("rolled back: {0}")]
    RolledBack(String),
    #[error("no outcome within {0:?}: see the record in {1}")]
    NoOutcome(Duration, PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> UpgradeError + '_ {
    move |source| UpgradeError::Io {
        path: path.into(),
        source,
    }
}

/// The whole command: stage, install, restart, wait. Blocking.
pub fn run(root_dir: &Path, o: &Options) -> Result<String, UpgradeError> {
    let dir = root_dir.join("upgrade");
    if let Some(s) = State::read(root_dir).filter(|s| s.phase == Phase::Trial) {
        return Err(UpgradeError::InProgress(s.to_version));
    }
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let (staged, replaced) = match o.installed {
        true => (o.install_path.clone(), o.binary.clone()),
        false => (dir.join("kinglet.new"), o.install_path.clone()),
    };
    if !o.installed {
        copy_durably(&o.binary, &staged, o.sha256.as_deref())?;
    }
    let to_version = version_of(&staged)?;
    let previous = dir.join("kinglet.previous");
    copy_durably(&replaced, &previous, None)?;
    let now = jiff::Timestamp::now().as_second();
    let record = State {
        phase: Phase::Trial,
        install_path: o.install_path.clone(),
        previous,
        from_version: env!("CARGO_PKG_VERSION").into(),
        to_version: to_version.clone(),
        started_at: now,
        deadline: now + o.timeout.as_secs() as i64,
        commit_after_secs: o.commit_after.as_secs(),
        attempts: 0,
        max_attempts: o.max_attempts,
        reason: String::new(),
    };
    record.write(root_dir).map_err(io(&dir))?;
    if !o.installed {
        install(&staged, &o.install_path)?;
    }
    eprintln!(
        "kinglet upgrade: {to_version} installed at {}, on trial",
        o.install_path.display()
    );
    let Some(unit) = &o.unit else {
        // The caller restarts the agent: the trial starts then.
        return Ok(format!(
            "{to_version} installed, on trial from the agent's next start"
        ));
    };
    restart(unit)?;
    wait_for_outcome(root_dir, o.timeout + Duration::from_secs(60))?;
    Ok(format!("{to_version} committed"))
}

/// Copies `from` to `to` whole (temp file, fsync, rename), mode 0755,
/// checking its SHA-256 when `want` is given.
fn copy_durably(from: &Path, to: &Path, want: Option<&str>) -> Result<(), UpgradeError> {
    let src = std::fs::File::open(from).map_err(io(from))?;
    let tmp = to.with_extension("tmp");
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&tmp)
        .map_err(io(&tmp))?;
    let mut hash = sha2::Sha256::new();
    let mut limited = src.take(MAX_BINARY + 1);
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = limited.read(&mut buf).map_err(io(from))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hash.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io(&tmp))?;
    }
    if total > MAX_BINARY {
        let _ = std::fs::remove_file(&tmp);
        return Err(UpgradeError::TooLarge { path: from.into() });
    }
    let got = hex::encode(hash.finalize());
    if let Some(want) = want.filter(|w| !w.eq_ignore_ascii_case(&got)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(UpgradeError::Checksum {
            path: from.into(),
            want: want.into(),
            got,
        });
    }
    out.sync_all().map_err(io(&tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(io(&tmp))?;
    std::fs::rename(&tmp, to).map_err(io(to))?;
    sync_dir(to)
}

fn sync_dir(path: &Path) -> Result<(), UpgradeError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// The staged binary's `--version` line: it must run, within 10 s, and
/// say it is kinglet.
fn version_of(binary: &Path) -> Result<String, UpgradeError> {
    let not = |message: String| UpgradeError::NotKinglet {
        path: binary.into(),
        message,
    };
    let mut child = std::process::Command::new(binary)
        .arg("--version")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| not(e.to_string()))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        match child.try_wait().map_err(|e| not(e.to_string()))? {
            Some(s) => break s,
            None if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(not("--version did not answer within 10 s".into()));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.by_ref().take(4096).read_to_string(&mut out);
    }
    let line = out.lines().next().unwrap_or_default().trim().to_string();
    if !status.success() || !line.starts_with("kinglet ") {
        return Err(not(format!("--version: {status}, {line:?}")));
    }
    Ok(line.trim_start_matches("kinglet ").to_string())
}

/// Puts `from` at `to` atomically: a copy beside `to`, then a rename over
/// it (the running process keeps the old file).
fn install(from: &Path, to: &Path) -> Result<(), UpgradeError> {
    let mut side = to.as_os_str().to_owned();
    side.push(".kinglet-upgrade");
    let side = PathBuf::from(side);
    copy_durably(from, &side, None)?;
    std::fs::rename(&side, to).map_err(io(to))?;
    sync_dir(to)
}

fn restart(unit: &str) -> Result<(), UpgradeError> {
    let fail = |message: String| UpgradeError::Restart {
        unit: unit.into(),
        message,
    };
    let out = std::process::Command::new("systemctl")
        .args(["restart", "--no-block", unit])
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// Polls the record until the trial ends.
fn wait_for_outcome(root_dir: &Path, within: Duration) -> Result<(), UpgradeError> {
    let until = std::time::Instant::now() + within;
    while std::time::Instant::now() < until {
        match State::read(root_dir) {
            Some(s) if s.phase == Phase::Committed => return Ok(()),
            Some(s) if s.phase == Phase::RolledBack => {
                return Err(UpgradeError::RolledBack(s.reason));
            }
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    }
    Err(UpgradeError::NoOutcome(within, state::path(root_dir)))
}

/// `kinglet upgrade-guard`, run by the unit before each start as the
/// previous binary: counts the new binary's starts and puts the previous
/// one back when the trial failed. Never fails the start: a guard error
/// is printed and the start goes on.
pub fn guard(root_dir: &Path) -> Result<Option<String>, UpgradeError> {
    let Some(mut s) = State::read(root_dir) else {
        return Ok(None);
    };
    let now = jiff::Timestamp::now().as_second();
    let Some(reason) = s.judge_start(now) else {
        if s.phase == Phase::Trial {
            s.write(root_dir).map_err(io(root_dir))?;
        }
        return Ok(None);
    };
    install(&s.previous, &s.install_path)?;
    s.phase = Phase::RolledBack;
    s.reason = reason.clone();
    s.write(root_dir).map_err(io(root_dir))?;
    Ok(Some(reason))
}

/// In the agent: while its own upgrade is on trial, commits it once the
/// health checks stayed healthy for the set time, or, past the deadline,
/// cancels `stop` so the agent exits and the guard rolls it back.
pub async fn watch_trial(
    root_dir: PathBuf,
    checks: crate::health::Checks,
    stop: CancellationToken,
) {
    let Some(s) = State::read(&root_dir) else {
        return;
    };
    match s.phase {
        Phase::RolledBack => {
            warn!(to = %s.to_version, reason = %s.reason, "the upgrade was rolled back")
        }
        Phase::Committed => {}
        Phase::Trial => trial(root_dir, s, checks, stop).await,
    }
}

async fn trial(
    root_dir: PathBuf,
    mut s: State,
    checks: crate::health::Checks,
    stop: CancellationToken,
) {
    let need = Duration::from_secs(s.commit_after_secs);
    info!(version = %s.to_version, attempt = s.attempts, ?need, "upgrade on trial");
    let mut healthy_since: Option<tokio::time::Instant> = None;
    loop {
        let healthy = checks.iter().all(|(_, hb)| hb.beaten() && hb.healthy());
        let now = tokio::time::Instant::now();
        healthy_since = if healthy {
            healthy_since.or(Some(now))
        } else {
            None
        };
        if healthy_since.is_some_and(|t| now.duration_since(t) >= need) {
            s.phase = Phase::Committed;
            let dir = root_dir.clone();
            let record = s.clone();
            match tokio::task::spawn_blocking(move || record.write(&dir)).await {
                Ok(Ok(())) => info!(version = %s.to_version, "upgrade committed"),
                _ => error!("cannot write the upgrade's record: the trial goes on"),
            }
            return;
        }
        if jiff::Timestamp::now().as_second() > s.deadline {
            error!(version = %s.to_version, "the upgrade was not healthy in time: stopping for the guard to roll it back");
            stop.cancel();
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests;
