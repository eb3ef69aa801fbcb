//! A gate in front of the test API server: a TCP relay on loopback that a
//! test opens and closes, so one node loses the control plane (refused and
//! cut connections, as a stopped API server looks to it; or, blackholed,
//! every packet to it dropped, as a dead route looks: connections hang
//! until they time out) while every other test keeps the shared cluster.
#![allow(dead_code)]

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub struct ApiGate {
    pub port: u16,
    blackholed: AtomicBool,
    open: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl ApiGate {
    /// A gate (open) relaying to the API server's port.
    pub fn new() -> Self {
        let target = super::cluster_port();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (o, s, c) = (open.clone(), stop.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                if !o.load(Ordering::SeqCst) {
                    // Closed: the connection is dropped at once.
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let mut held = c.lock().unwrap();
                for sock in [&client, &server] {
                    if let Ok(x) = sock.try_clone() {
                        held.push(x);
                    }
                }
                relay(client, server);
            }
        });
        ApiGate {
            port,
            blackholed: AtomicBool::new(false),
            open,
            stop,
            conns,
        }
    }

    /// Opens or closes the gate; closing cuts every connection through it.
    pub fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
        if !open {
            for c in self.conns.lock().unwrap().drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }

    /// Drops every packet to the gate (an iptables rule on loopback) and
    /// cuts what is open, or lets them through again.
    pub fn set_blackhole(&self, on: bool) {
        if self.blackholed.swap(on, Ordering::SeqCst) == on {
            return;
        }
        let port = self.port.to_string();
        // Tagged, so that tests/setup.sh removes one a killed test left.
        let rule =
            "INPUT -p tcp -d 127.0.0.1 --dport PORT -m comment --comment kinglet-test-gate -j DROP";
        let op = if on { "-I" } else { "-D" };
        let ok = std::process::Command::new("iptables")
            .args(["-w", op])
            .args(rule.replace("PORT", &port).split(' '))
            .status()
            .is_ok_and(|s| s.success());
        if !ok && !std::thread::panicking() {
            panic!("iptables {op} the gate's DROP rule");
        }
        if on {
            for c in self.conns.lock().unwrap().drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }

    /// The node's kubeconfig for `name`, pointed at the gate, written to
    /// `out`.
    pub fn kubeconfig(&self, name: &str, out: &Path) -> PathBuf {
        let kc = std::fs::read_to_string(super::node_kubeconfig(name)).unwrap();
        let from = format!("127.0.0.1:{}", super::cluster_port());
        assert!(kc.contains(&from), "the node kubeconfig names {from}");
        std::fs::write(out, kc.replace(&from, &format!("127.0.0.1:{}", self.port))).unwrap();
        out.to_path_buf()
    }
}

impl Drop for ApiGate {
    fn drop(&mut self) {
        self.set_blackhole(false);
        self.stop.store(true, Ordering::SeqCst);
        self.set_open(false);
        // Wakes the accepting thread so it sees the stop.
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = s.write_all(b"");
        }
    }
}

/// Copies both ways until either side ends.
fn relay(a: TcpStream, b: TcpStream) {
    for (mut from, mut to) in [
        (a.try_clone(), b.try_clone()),
        (b.try_clone(), a.try_clone()),
    ]
    .into_iter()
    .filter_map(|(x, y)| Some((x.ok()?, y.ok()?)))
    {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        });
    }
}
