//! A plain-HTTP proxy on loopback that cuts a link: in front of a
//! registry, it relays requests one per connection and, once armed, closes
//! the connection of the next response for a given path after a number of
//! body bytes, as a cellular link that drops. It records every request's
//! path and `Range` header and the body bytes it relayed. It can also
//! drop `Range` headers, as a registry or proxy that ignores them.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One relayed request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub range: Option<String>,
    pub status: String,
    /// Body bytes relayed to the client.
    pub body: u64,
}

#[derive(Default)]
struct State {
    /// (path suffix, body bytes after which to cut) for the next match.
    cut: Option<(String, u64)>,
    /// Requests go upstream without their `Range` header.
    no_ranges: bool,
    seen: Vec<Seen>,
}

pub struct Cutter {
    pub host: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl Cutter {
    /// A proxy to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = l.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, up) = (state.clone(), stop.clone(), upstream.to_string());
        std::thread::spawn(move || {
            for c in l.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = c else { continue };
                let (st, up) = (st.clone(), up.clone());
                std::thread::spawn(move || relay(c, &up, &st));
            }
        });
        Cutter { host, state, stop }
    }

    /// Cuts the next response to a path ending in `suffix` after `bytes`
    /// of its body.
    pub fn arm(&self, suffix: &str, bytes: u64) {
        self.state.lock().unwrap().cut = Some((suffix.to_string(), bytes));
    }

    /// Whether requests lose their `Range` header on the way.
    pub fn drop_ranges(&self, on: bool) {
        self.state.lock().unwrap().no_ranges = on;
    }

    /// What was relayed so far, and forgets it.
    pub fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut self.state.lock().unwrap().seen)
    }
}

impl Drop for Cutter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.host);
    }
}

/// Reads up to the end of an HTTP head (`\r\n\r\n`); the head and any
/// bytes after it.
fn read_head(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Some((String::from_utf8(buf).ok()?, rest));
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The head with `Connection: close` in place of any `Connection` header,
/// and without `Range` if `no_ranges`.
fn closing(head: &str, no_ranges: bool) -> String {
    let mut lines: Vec<&str> = head
        .trim_end()
        .split("\r\n")
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            let dropped = l.starts_with("connection:") || (no_ranges && l.starts_with("range:"));
            !dropped
        })
        .collect();
    lines.push("Connection: close");
    format!("{}\r\n\r\n", lines.join("\r\n"))
}

fn header(head: &str, name: &str) -> Option<String> {
    head.split("\r\n").find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

fn relay(mut client: TcpStream, upstream: &str, state: &Mutex<State>) {
    let Some((head, _)) = read_head(&mut client) else {
        return;
    };
    let path = head.split(' ').nth(1).unwrap_or_default().to_string();
    let range = header(&head, "range");
    let Ok(mut up) = TcpStream::connect(upstream) else {
        return;
    };
    let no_ranges = state.lock().unwrap().no_ranges;
    if up.write_all(closing(&head, no_ranges).as_bytes()).is_err() {
        return;
    }
    let Some((rhead, mut body)) = read_head(&mut up) else {
        return;
    };
    let cut = {
        let mut s = state.lock().unwrap();
        match &s.cut {
            Some((suffix, n)) if path.ends_with(suffix.as_str()) => {
                let n = *n;
                s.cut = None;
                Some(n)
            }
            _ => None,
        }
    };
    let status = rhead.split(' ').nth(1).unwrap_or_default().to_string();
    let _ = client.write_all(closing(&rhead, false).as_bytes());
    let mut sent = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if body.is_empty() {
            match up.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        let mut take = body.len() as u64;
        if let Some(c) = cut {
            take = take.min(c - sent);
        }
        if client.write_all(&body[..take as usize]).is_err() {
            break;
        }
        sent += take;
        body.drain(..take as usize);
        if cut.is_some_and(|c| sent >= c) {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    state.lock().unwrap().seen.push(Seen {
        path,
        range,
        status,
        body: sent,
    });
}
