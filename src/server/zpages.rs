//! `/statusz` and `/flagz` (ComponentStatusz and ComponentFlagz, beta and
//! on in 1.37) in upstream's text shape: a header saying the output is
//! for people, then `key<delimiter>value` lines, the delimiter picked
//! from upstream's four so nobody parses it. And `/run`: a command run to
//! its end in a container, its output returned whole, as upstream's
//! `getRun`.

use std::fmt::Write as _;

/// Upstream's delimiters; one is picked per answer.
const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];

fn delimiter() -> &'static str {
    let n = jiff::Timestamp::now().subsec_nanosecond() as usize;
    DELIMITERS[n % DELIMITERS.len()]
}

fn header(what: &str) -> String {
    format!(
        "\nkubelet {what}\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n"
    )
}

/// `3 hr 04 min 05 sec`, as upstream's uptime.
fn uptime(secs: i64) -> String {
    format!(
        "{} hr {:02} min {:02} sec",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    )
}

/// The `/statusz` text: start time, uptime, versions, the paths served.
pub fn statusz(started: jiff::Timestamp, paths: &[&str]) -> String {
    let d = delimiter();
    let mut out = header("statusz");
    let now = jiff::Timestamp::now();
    let start = started.strftime("%a %b %e %H:%M:%S UTC %Y").to_string();
    let up = uptime(now.as_second() - started.as_second());
    let _ = writeln!(out, "\nStarted{d} {start}");
    let _ = writeln!(out, "Up{d} {up}");
    let _ = writeln!(
        out,
        "Binary version{d} {}+kinglet-{}",
        crate::config::flags::KUBERNETES_VERSION.trim_start_matches('v'),
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(out, "Paths{d} {}", paths.join(" "));
    out
}

/// The `/flagz` text: each command-line flag kinglet was given, sorted.
pub fn flagz(args: &[String]) -> String {
    let d = delimiter();
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut it = args.iter().skip(1).peekable();
    while let Some(a) = it.next() {
        let Some(name) = a.strip_prefix("--") else {
            continue;
        };
        let (k, v) = match name.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => match it.peek() {
                Some(v) if !v.starts_with("--") => {
                    (name.to_string(), it.next().cloned().unwrap_or_default())
                }
                _ => (name.to_string(), "true".to_string()),
            },
        };
        flags.push((k, v));
    }
    flags.sort();
    let mut out = header("flagz");
    out.push('\n');
    for (k, v) in flags {
        let _ = writeln!(out, "{k}{d}{v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statusz_and_flagz_in_upstreams_shape() {
        let s = statusz(jiff::Timestamp::now(), &["/healthz", "/pods"]);
        assert!(s.starts_with(
            "\nkubelet statusz\nWarning: This endpoint is not meant to be machine parseable"
        ));
        assert!(s.contains("Up") && s.contains("0 hr 00 min 0"), "{s}");
        assert!(s.contains("/healthz /pods"), "{s}");
        let args: Vec<String> = [
            "kinglet",
            "--config",
            "/etc/k.yaml",
            "--v=2",
            "--runtime",
            "cri",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let f = flagz(&args);
        let lines: Vec<&str> = f.lines().skip(4).collect();
        assert_eq!(lines.len(), 3, "{f}");
        assert!(
            lines[0].starts_with("config") && lines[0].ends_with("/etc/k.yaml"),
            "{f}"
        );
        assert!(lines[2].starts_with('v') && lines[2].ends_with('2'), "{f}");
    }
}
