//! `/containerLogs/{namespace}/{pod}/{container}` (upstream's
//! `kuberuntime/logs`): the container's CRI log file read back as the
//! plain stream `kubectl logs` shows, with `tailLines`, `sinceSeconds` /
//! `sinceTime`, `timestamps`, `limitBytes`, `previous` and `follow`
//! (woken by inotify on the log dir, until the container stops; a rotated
//! file is reopened).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncSeekExt, BufReader};
use tokio::sync::mpsc;

use crate::dirwatch::{DirWatch, Flags};
use crate::pods::StatusView;

/// The query of a log request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub tail_lines: Option<usize>,
    /// Unix nanoseconds: records before it are skipped.
    pub since: Option<i64>,
    pub timestamps: bool,
    pub limit_bytes: Option<u64>,
    pub previous: bool,
}

fn boolean(v: &str) -> bool {
    matches!(v, "true" | "1" | "True" | "TRUE")
}

/// A log request's query refused (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogQueryError {
    #[error("invalid {what}: {value:?}")]
    Invalid { what: &'static str, value: String },
    #[error("{0} must be greater than zero")]
    NotPositive(&'static str),
}

/// Parses the query as upstream's `PodLogOptions`; `Err` is a 400.
pub fn parse_query(q: &str, now_nanos: i64) -> Result<LogOptions, LogQueryError> {
    let mut o = LogOptions::default();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
        let v = url::form_urlencoded::parse(v.as_bytes())
            .next()
            .map(|(a, b)| {
                if b.is_empty() {
                    a.into_owned()
                } else {
                    format!("{a}={b}")
                }
            })
            .unwrap_or_default();
        let invalid = |what| LogQueryError::Invalid {
            what,
            value: v.clone(),
        };
        let num = |what| v.parse::<i64>().map_err(|_| invalid(what));
        match k {
            "follow" => o.follow = boolean(&v),
            "timestamps" => o.timestamps = boolean(&v),
            "previous" => o.previous = boolean(&v),
            "tailLines" => o.tail_lines = Some(num("tailLines")?.max(0) as usize),
            "limitBytes" => {
                let n = num("limitBytes")?;
                if n < 1 {
                    return Err(LogQueryError::NotPositive("limitBytes"));
                }
                o.limit_bytes = Some(n as u64);
            }
            "sinceSeconds" => {
                let n = num("sinceSeconds")?;
                if n < 1 {
                    return Err(LogQueryError::NotPositive("sinceSeconds"));
                }
                o.since = Some(now_nanos - n.saturating_mul(1_000_000_000));
            }
            "sinceTime" => {
                let t: jiff::Timestamp = v.parse().map_err(|_| invalid("sinceTime"))?;
                o.since = Some(t.as_nanosecond() as i64);
            }
            _ => {}
        }
    }
    Ok(o)
}

/// Where a container's log is, or why there is none (a 400/404 message).
pub fn locate(
    view: &StatusView,
    log_root: &Path,
    ns: &str,
    pod: &str,
    container: &str,
    previous: bool,
) -> Result<(PathBuf, String), (u16, String)> {
    let found = view.pods().into_iter().find(|(_, e)| {
        e.pod.metadata.namespace.as_deref().unwrap_or("default") == ns
            && e.pod.metadata.name.as_deref() == Some(pod)
    });
    let Some((uid, entry)) = found else {
        return Err((404, format!("pod {pod:?} not found")));
    };
    let statuses = entry
        .status
        .container_statuses
        .iter()
        .flatten()
        .chain(entry.status.init_container_statuses.iter().flatten())
        .chain(entry.status.ephemeral_container_statuses.iter().flatten());
    let Some(cs) = statuses.clone().find(|c| c.name == container) else {
        return Err((
            400,
            format!("container {container:?} in pod {pod:?} is not valid"),
        ));
    };
    let attempt = if previous {
        if cs.restart_count == 0 {
            return Err((
                400,
                format!("previous terminated container {container:?} in pod {pod:?} not found"),
            ));
        }
        cs.restart_count - 1
    } else {
        cs.restart_count
    };
    let id = cs.container_id.clone().unwrap_or_default();
    let dir = log_root.join(format!("{ns}_{pod}_{uid}")).join(container);
    Ok((dir.join(format!("{attempt}.log")), id))
}

/// One CRI log record.
struct Record<'a> {
    ts: &'a [u8],
    nanos: i64,
    full: bool,
    content: &'a [u8],
}

fn parse(line: &[u8]) -> Option<Record<'_>> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut parts = line.splitn(4, |b| *b == b' ');
    let ts = parts.next()?;
    let _stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or_default();
    let nanos = std::str::from_utf8(ts)
        .ok()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_nanosecond() as i64);
    Some(Record {
        ts,
        nanos,
        full: tag != b"P",
        content,
    })
}

/// What a record writes to the client.
fn render(r: &Record<'_>, o: &LogOptions) -> Vec<u8> {
    let mut out = Vec::with_capacity(r.content.len() + 40);
    if o.timestamps {
        out.extend_from_slice(r.ts);
        out.push(b' ');
    }
    out.extend_from_slice(r.content);
    if r.full {
        out.push(b'\n');
    }
    out
}

/// Counts output against `limitBytes`; `false` once it is reached.
struct Budget(Option<u64>);

impl Budget {
    fn take(&mut self, mut chunk: Vec<u8>) -> (Vec<u8>, bool) {
        match &mut self.0 {
            None => (chunk, true),
            Some(left) => {
                if chunk.len() as u64 >= *left {
                    chunk.truncate(*left as usize);
                    *left = 0;
                    (chunk, false)
                } else {
                    *left -= chunk.len() as u64;
                    (chunk, true)
                }
            }
        }
    }
}

/// The offset where the last `n` lines of the file start.
async fn tail_offset(path: &Path, n: usize) -> std::io::Result<u64> {
    let f = tokio::fs::File::open(path).await?;
    let mut r = BufReader::new(f);
    // Offsets of the records that start a line (after a full record).
    let mut starts: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
    let (mut pos, mut line_open) = (0u64, false);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let k = r.read_until(b'\n', &mut buf).await?;
        if k == 0 {
            break;
        }
        if !line_open {
            starts.push_back(pos);
            if starts.len() > n {
                starts.pop_front();
            }
        }
        line_open = parse(&buf).is_some_and(|rec| !rec.full);
        pos += k as u64;
    }
    Ok(if n == 0 {
        pos
    } else {
        starts.front().copied().unwrap_or(pos)
    })
}

/// Streams the log into `tx` as `o` asks; returns at the end (or when the
/// client went away). Following reads the file it has open: at a rotation
/// (the path names another file) it first reads the old one to its end —
/// what was written before the rename — then the new one from its start,
/// waiting for it to appear; nothing is lost or read twice.
pub async fn stream(
    path: PathBuf,
    o: LogOptions,
    running: impl Fn() -> bool + Send + 'static,
    tx: mpsc::Sender<Bytes>,
) {
    let mut budget = Budget(o.limit_bytes);
    let offset = match o.tail_lines {
        Some(n) => tail_offset(&path, n).await.unwrap_or(0),
        None => 0,
    };
    let mut watch = if o.follow {
        path.parent().and_then(|d| {
            DirWatch::new(
                d,
                Flags::MODIFY | Flags::CREATE | Flags::MOVED_TO | Flags::CLOSE_WRITE,
            )
            .ok()
        })
    } else {
        None
    };
    let Ok(mut open) = Open::at(&path, offset).await else {
        return;
    };
    loop {
        match open.read(&o, &mut budget, &tx).await {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
        let Some(w) = watch.as_mut() else {
            return;
        };
        if !running() {
            // One last read for what came before the exit.
            let _ = open.read(&o, &mut budget, &tx).await;
            return;
        }
        // Woken by a write or a rotation, or at least every second to see
        // whether the container stopped.
        let _ = tokio::time::timeout(Duration::from_secs(1), w.changed()).await;
        if tx.is_closed() {
            return;
        }
        if file_id(&path).is_some_and(|now| now != open.inode) {
            // Rotated: the rest of the old file, then the new one.
            if !matches!(open.read(&o, &mut budget, &tx).await, Ok(true)) {
                return;
            }
            if let Ok(next) = Open::at(&path, 0).await {
                open = next;
            }
        }
    }
}

fn file_id(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| m.ino())
}

/// The log file being read, and where.
struct Open {
    reader: BufReader<tokio::fs::File>,
    inode: u64,
}

impl Open {
    async fn at(path: &Path, offset: u64) -> std::io::Result<Open> {
        use std::os::unix::fs::MetadataExt;
        let mut f = tokio::fs::File::open(path).await?;
        let inode = f.metadata().await?.ino();
        f.seek(std::io::SeekFrom::Start(offset)).await?;
        Ok(Open {
            reader: BufReader::new(f),
            inode,
        })
    }

    /// Sends the whole records from where it stands; whether to go on (the
    /// budget left and the client still there). A record still being
    /// written is left for the next read.
    async fn read(
        &mut self,
        o: &LogOptions,
        budget: &mut Budget,
        tx: &mpsc::Sender<Bytes>,
    ) -> std::io::Result<bool> {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let k = self.reader.read_until(b'\n', &mut buf).await?;
            if k == 0 {
                return Ok(true);
            }
            if buf.last() != Some(&b'\n') {
                // Partial: step back so the next read starts the record.
                self.reader
                    .seek(std::io::SeekFrom::Current(-(k as i64)))
                    .await?;
                return Ok(true);
            }
            let Some(rec) = parse(&buf) else { continue };
            if o.since.is_some_and(|s| rec.nanos < s) {
                continue;
            }
            let (chunk, more) = budget.take(render(&rec, o));
            if tx.send(Bytes::from(chunk)).await.is_err() || !more {
                return Ok(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-12-01T10:00:00.000000001Z stdout F one\n2026-12-01T10:00:01.000000001Z stderr P tw\n2026-12-01T10:00:01.000000002Z stderr F o\n2026-12-01T10:00:02.000000001Z stdout F three\n";

    async fn read(o: LogOptions) -> String {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        std::fs::write(&p, LOG).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        stream(p, o, || false, tx).await;
        let mut out = Vec::new();
        while let Ok(b) = rx.try_recv() {
            out.extend_from_slice(&b);
        }
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn plain_tail_since_timestamps_and_limit_as_kubectl_logs_shows() {
        assert_eq!(read(LogOptions::default()).await, "one\ntwo\nthree\n");
        let tail = LogOptions {
            tail_lines: Some(2),
            ..Default::default()
        };
        assert_eq!(read(tail).await, "two\nthree\n");
        let since = LogOptions {
            since: Some(
                "2026-12-01T10:00:01Z"
                    .parse::<jiff::Timestamp>()
                    .unwrap()
                    .as_nanosecond() as i64,
            ),
            ..Default::default()
        };
        assert_eq!(read(since).await, "two\nthree\n");
        let ts = LogOptions {
            timestamps: true,
            tail_lines: Some(1),
            ..Default::default()
        };
        assert_eq!(read(ts).await, "2026-12-01T10:00:02.000000001Z three\n");
        let limit = LogOptions {
            limit_bytes: Some(6),
            ..Default::default()
        };
        assert_eq!(read(limit).await, "one\ntw");
    }

    #[tokio::test]
    async fn a_follow_reads_the_old_file_to_its_end_then_the_new_one() {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        let rec = |n: u32| format!("2026-12-01T10:00:00.000000001Z stdout F l{n}\n");
        std::fs::write(&p, rec(0)).unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let live = std::sync::Arc::new(AtomicBool::new(true));
        let l = live.clone();
        let o = LogOptions {
            follow: true,
            ..Default::default()
        };
        let task = tokio::spawn(stream(p.clone(), o, move || l.load(Ordering::SeqCst), tx));
        let append = |n: u32| {
            let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(rec(n).as_bytes()).unwrap();
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        append(1);
        // Rotated as the monitor does: a last line, the rename, a new file
        // that appears a moment later.
        append(2);
        std::fs::rename(&p, d.path().join("0.log.20261201-100000")).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::fs::write(&p, rec(3)).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        append(4);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        live.store(false, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        let mut out = String::new();
        while let Ok(b) = rx.try_recv() {
            out.push_str(std::str::from_utf8(&b).unwrap());
        }
        assert_eq!(out, "l0\nl1\nl2\nl3\nl4\n");
    }

    #[test]
    fn queries_parse_as_upstreams_pod_log_options() {
        let o = parse_query("follow=true&tailLines=10&timestamps=1&limitBytes=5", 0).unwrap();
        assert!(o.follow && o.timestamps);
        assert_eq!(o.tail_lines, Some(10));
        assert_eq!(o.limit_bytes, Some(5));
        assert_eq!(
            parse_query("sinceSeconds=2", 10_000_000_000).unwrap().since,
            Some(8_000_000_000)
        );
        assert!(parse_query("limitBytes=0", 0).is_err());
        assert!(parse_query("tailLines=x", 0).is_err());
    }
}
