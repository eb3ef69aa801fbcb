//! Reading container logs back from the CRI log files the runtimes write
//! (`<timestamp> <stream> <P|F> <content>`): today the tail used as a
//! termination message under `FallbackToLogsOnError`.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Upstream's `MaxContainerTerminationMessageLogLines`.
const MAX_LINES: usize = 80;
/// Upstream's `MaxContainerTerminationMessageLogLength`.
const MAX_BYTES: usize = 2048;
/// How much of the file end is read: enough for 80 long-ish lines.
const WINDOW: u64 = 64 * 1024;

/// The last 80 lines of the log, at most the last 2048 bytes of them, as
/// the upstream kubelet reports for `FallbackToLogsOnError`. A missing or
/// unreadable log gives an empty message.
pub fn termination_tail(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(WINDOW);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_err() || f.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    // A window that starts mid-record drops that first, partial record.
    let body = if start > 0 {
        match buf.iter().position(|b| *b == b'\n') {
            Some(i) => &buf[i + 1..],
            None => &[][..],
        }
    } else {
        &buf[..]
    };
    // Each line and whether a full (`F`) record ended it: a stream that
    // stopped mid-line ends in a partial record, and that line gets no
    // newline (upstream's log reader adds one only after `F`).
    let mut lines: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut open = false;
    for rec in body.split(|b| *b == b'\n').filter(|r| !r.is_empty()) {
        let mut parts = rec.splitn(4, |b| *b == b' ');
        let (Some(_ts), Some(_stream), Some(tag), content) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let content = content.unwrap_or_default();
        if !open {
            lines.push((Vec::new(), false));
        }
        if let Some(last) = lines.last_mut() {
            last.0.extend_from_slice(content);
            last.1 = tag == b"F";
        }
        open = tag == b"P";
    }
    let first = lines.len().saturating_sub(MAX_LINES);
    let mut out = Vec::new();
    for (l, full) in &lines[first..] {
        out.extend_from_slice(l);
        if *full {
            out.push(b'\n');
        }
    }
    let cut = out.len().saturating_sub(MAX_BYTES);
    String::from_utf8_lossy(&out[cut..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_80_lines_and_2048_bytes_joining_partials() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("0.log");
        let mut s = String::new();
        for i in 0..100 {
            s.push_str(&format!("2026-01-01T00:00:00Z stdout F line{i}\n"));
        }
        s.push_str("2026-01-01T00:00:00Z stderr P par\n");
        s.push_str("2026-01-01T00:00:00Z stderr F tial\n");
        std::fs::write(&p, &s).unwrap();
        let t = termination_tail(&p);
        assert_eq!(t.lines().count(), 80);
        assert!(t.starts_with("line21\n"), "{t}");
        assert!(t.ends_with("line99\npartial\n"), "{t}");

        let long = "x".repeat(3000);
        std::fs::write(&p, format!("2026-01-01T00:00:00Z stdout F {long}\n")).unwrap();
        assert_eq!(termination_tail(&p).len(), MAX_BYTES);
        assert_eq!(termination_tail(&dir.path().join("absent")), "");

        // `echo -n DONE`: the stream ended mid-line, a partial record, and
        // the message is `DONE`, as upstream's conformance test wants it.
        std::fs::write(&p, "2026-01-01T00:00:00Z stdout P DONE\n").unwrap();
        assert_eq!(termination_tail(&p), "DONE");
    }
}
