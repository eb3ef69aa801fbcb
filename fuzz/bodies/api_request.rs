//! The kubelet API's request parsing (port 10250): the authorization
//! attributes of a path, and the exec/attach and log queries. Never a
//! panic; every path gets a subresource to check, and only the
//! fine-grained paths upstream names get one other than `proxy`.
//! (The body of fuzz_targets/api_request.rs, shared with tests/fuzz_corpus.rs,
//! which replays the corpus through it.)

use kinglet::server::{auth, exec, logs};

/// One input; a panic is a finding.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (method, rest) = text.split_once(' ').unwrap_or(("GET", text));
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (verb, subresources) = auth::attributes(method, path);
    assert!(!verb.is_empty() && !subresources.is_empty());
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    // As upstream 1.37's auth.go: these have a subresource of their own
    // and no `proxy` after it.
    if !matches!(
        first,
        "stats" | "metrics" | "logs" | "checkpoint" | "statusz" | "flagz"
    ) {
        assert_eq!(subresources.last(), Some(&"proxy"), "{path:?}");
    }
    if let Ok((cmd, streams)) = exec::parse_query(query, true) {
        assert!(!cmd.is_empty());
        assert!(streams.stdin || streams.stdout || streams.stderr);
        assert!(!(streams.tty && streams.stderr));
    }
    let _ = logs::parse_query(query, 1_700_000_000_000_000_000);
}
