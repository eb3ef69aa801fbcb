//! End to end: the kubelet API (10250) under an unauthenticated peer's
//! abuse, on a node joined to the real control plane, as the break-it run
//! tried it: floods of idle TCP connections and stalled TLS handshakes,
//! requests with unique bearer tokens (each a TokenReview if nothing
//! stopped it), and `kubectl exec` sessions whose clients are killed.
//! What is asserted are bounds, not timings: kinglet's fds and RSS under
//! each flood, `/healthz` answering and the Node staying Ready through it,
//! and no CLOSE-WAIT socket or exec'd process left by an abandoned
//! session. The figures (fds, RSS, time to shed a stalled peer) are
//! printed as `figure:` lines. Sizes: `KINGLET_FLOOD_CONNECTIONS` (default
//! 2,000; the check is 20,000) and `KINGLET_FLOOD_TOKENS` (default
//! 2,000; 10,000).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};

crate::both_runtimes!(abandoned_execs_leave_no_socket_and_no_process);

const BB: &str = "kinglet.test/busybox:1";
/// What kinglet may grow by under a flood.
const RSS_BOUND_KIB: u64 = 32 << 10;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// What each of a process's fds points at (for a failure's message); a
/// socket with its kind, state and ends, as `/proc/<pid>/net` tells them.
fn fd_targets(pid: u32) -> Vec<String> {
    let sockets = socket_table(pid);
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| {
            let t = t.display().to_string();
            let inode = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']'));
            match inode.and_then(|i| sockets.get(i)) {
                Some(desc) => format!("{t} {desc}"),
                None => t,
            }
        })
        .collect()
}

/// Socket inode -> "tcp <state> <local> <remote>" or "unix <path>", from
/// the process's network namespace's tables.
fn socket_table(pid: u32) -> std::collections::HashMap<String, String> {
    let mut map = std::collections::HashMap::new();
    for kind in ["tcp", "tcp6"] {
        let t = std::fs::read_to_string(format!("/proc/{pid}/net/{kind}")).unwrap_or_default();
        for l in t.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() > 9 {
                let desc = format!("{kind} st={} {} -> {}", f[3], f[1], f[2]);
                map.insert(f[9].to_string(), desc);
            }
        }
    }
    let t = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
    for l in t.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > 6 {
            let path = f.get(7).copied().unwrap_or("(unnamed)");
            map.insert(f[6].to_string(), format!("unix st={} {path}", f[5]));
        }
    }
    map
}

/// kinglet's TCP sockets in CLOSE-WAIT (the peer closed, kinglet did not).
fn close_wait(pid: u32) -> usize {
    let out = Command::new("ss")
        .args(["-tanpH", "state", "close-wait"])
        .output()
        .unwrap();
    let me = format!("pid={pid},");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&me))
        .count()
}

/// This test process may hold as many sockets as the flood needs.
fn raise_nofile(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: a plain syscall on a local struct.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// Opens `n` connections to `port` (at most 2 s each: past kinglet's limit
/// and the kernel's backlog, a connect waits), half of them sending the
/// first bytes of a TLS record and stalling; returns those that connected.
async fn flood(port: u16, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                let stall = i % 2 == 1;
                tokio::spawn(async move {
                    let addr = format!("127.0.0.1:{port}");
                    let c = tokio::net::TcpStream::connect(addr);
                    let mut s = tokio::time::timeout(Duration::from_secs(2), c)
                        .await
                        .ok()?
                        .ok()?;
                    if stall {
                        let _ = s.write_all(b"\x16\x03\x01\x02").await;
                    }
                    Some(s)
                })
            })
            .collect();
        for t in tasks {
            held.extend(t.await.ok().flatten());
        }
    }
    held
}

fn ready(n: &Node) -> bool {
    is_ready(n)
}

#[tokio::test]
async fn floods_of_connections_and_tokens_stay_bounded() {
    let admin = admin().await;
    let (k, _dir) = join_logged(Rt::Oci, "kl-flood", &[]);
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &k.name, Duration::from_secs(30)).await;
    let pid = k.pid();
    // Settled first: the node's own start-up is not the flood's.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss0, fds0) = (rss_kib(pid), fds(pid));
    raise_nofile(65_536);

    // Connections: idle ones and stalled TLS handshakes.
    let n = env_or("KINGLET_FLOOD_CONNECTIONS", 2_000);
    let t = Instant::now();
    let held = flood(k.api_port, n).await;
    let (rss1, fds1) = (rss_kib(pid), fds(pid));
    assert_eq!(k.healthz().await, Some(200), "/healthz under the flood");
    let node = nodes.get(&k.name).await.unwrap();
    assert!(ready(&node), "the node went NotReady under the flood");
    println!(
        "figure: connection flood: {n} tried, {} held open by the client in {:.1} s; kinglet fds {fds0} -> {fds1}, RSS {rss0} -> {rss1} KiB",
        held.len(),
        t.elapsed().as_secs_f64()
    );
    let limit = kinglet::server::listener::DEFAULT_MAX_CONNECTIONS;
    assert!(fds1 <= fds0 + limit + 16, "fds {fds0} -> {fds1}");
    assert!(rss1 <= rss0 + RSS_BOUND_KIB, "RSS {rss0} -> {rss1} KiB");
    // Every stalled peer is shed (the handshake timeout frees the slots
    // the backlog's peers then take, in waves), and one stalled alone is
    // shed after the handshake timeout: the figure.
    drop(held);
    wait_for(
        "the flood's slots free again",
        Duration::from_secs(120),
        || async { (fds(pid) <= fds0 + 8).then_some(()) },
    )
    .await;
    let shed = shed_time(k.api_port).await;
    println!("figure: a stalled TLS peer is shed after {shed:.1} s");
    assert!(
        !k.log().contains("accept failed"),
        "the flood reached the fd limit"
    );

    // Unique bearer tokens: each one kinglet has not seen costs a
    // TokenReview unless the address's budget is spent (429).
    let n = env_or("KINGLET_FLOOD_TOKENS", 2_000);
    let rss2 = rss_kib(pid);
    let t = Instant::now();
    let codes = token_flood(k.api_port, n);
    let rss3 = rss_kib(pid);
    let count = |c: &str| codes.iter().filter(|x| *x == c).count();
    println!(
        "figure: token flood: {n} unique 4 KiB tokens in {:.1} s: {} x 401, {} x 429; kinglet RSS {rss2} -> {rss3} KiB",
        t.elapsed().as_secs_f64(),
        count("401"),
        count("429")
    );
    assert_eq!(count("401") + count("429"), n, "{codes:?}");
    assert!(count("429") > 0, "no review was refused for the budget");
    assert!(rss3 <= rss2 + RSS_BOUND_KIB, "RSS {rss2} -> {rss3} KiB");
    assert_eq!(k.healthz().await, Some(200));
}

/// Seconds until kinglet closes a connection that stalls in its TLS
/// handshake.
async fn shed_time(port: u16) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    s.write_all(b"\x16\x03\x01\x02").await.unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await;
    assert!(read.is_ok(), "a stalled peer was held 60 s");
    t.elapsed().as_secs_f64()
}

/// `n` requests with unique tokens over curl's reused connections: the
/// status codes.
fn token_flood(port: u16, n: usize) -> Vec<String> {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("curl.cfg");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&cfg).unwrap());
    let pad = "x".repeat(4096);
    for i in 0..n {
        if i > 0 {
            writeln!(f, "next").unwrap();
        }
        writeln!(f, "url = \"https://127.0.0.1:{port}/pods\"").unwrap();
        writeln!(f, "header = \"Authorization: Bearer t{i}-{pad}\"").unwrap();
        writeln!(
            f,
            "output = \"/dev/null\"\nwrite-out = \"%{{http_code}}\\n\"\ninsecure\nsilent"
        )
        .unwrap();
    }
    f.flush().unwrap();
    drop(f);
    let out = Command::new("curl").arg("-K").arg(&cfg).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// 20 `kubectl exec` sessions whose clients are killed: within seconds
/// kinglet holds none of their sockets and (in-process) none of their
/// processes. containerd lets an exec whose client went run to its end
/// (CRI has no call to kill one), as under upstream's kubelet.
async fn abandoned_execs_leave_no_socket_and_no_process(rt: Rt) {
    let admin = admin().await;
    let (k, _dir) = join_logged(rt, "kl-abandon", &[pods::busybox_archive()]);
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &k.name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let name = format!("{}-sh", k.name);
    let spec = serde_json::json!({"containers": [{"name": "c", "image": BB, "command": ["sleep", "3600"]}]});
    pods::create_running(&pods, &k.name, &name, spec).await;
    let kc = cluster_dir().join("admin.kubeconfig");
    let pid = k.pid();
    let fds0 = fds(pid);
    let mut clients: Vec<std::process::Child> = (0..20)
        .map(|_| {
            Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kc)
                .args(["exec", &name, "--", "sleep", "301"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let in_pod = |pattern: &'static str| {
        let (kc, name) = (kc.clone(), name.clone());
        move || {
            let out = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kc)
                .args(["exec", &name, "--", "ps", "-o", "args"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.trim() == pattern)
                .count()
        }
    };
    let sleeping = in_pod("sleep 301");
    wait_for(
        "20 exec sessions running",
        Duration::from_secs(60),
        || async { (sleeping() == 20).then_some(()) },
    )
    .await;
    for c in &mut clients {
        let _ = c.kill();
        let _ = c.wait();
    }
    let t = Instant::now();
    wait_for(
        "no CLOSE-WAIT socket left",
        Duration::from_secs(10),
        || async { (close_wait(pid) == 0).then_some(()) },
    )
    .await;
    let closed = t.elapsed();
    if rt == Rt::Oci {
        wait_for(
            "the exec'd processes killed",
            Duration::from_secs(10),
            || async { (sleeping() == 0).then_some(()) },
        )
        .await;
    }
    // Every fd of the sessions goes too (through CRI, the streams to
    // containerd's streaming server with them). Within 30 s: the last
    // `kubectl exec ps` above may leave an idle connection from the
    // apiserver, which goes after the 10 s idle timeout.
    let fds0_list = fd_targets(pid);
    let fds1 = within(Duration::from_secs(30), || async {
        let n = fds(pid);
        (n <= fds0 + 4).then_some(n)
    })
    .await;
    let settled = fds1.is_some();
    let fds1 = fds1.unwrap_or_else(|| fds(pid));
    println!(
        "figure: 20 abandoned execs ({rt:?}): sockets closed {:.1} s after the clients died; kinglet fds {fds0} -> {fds1}",
        closed.as_secs_f64()
    );
    assert!(
        settled,
        "fds {fds0} -> {fds1}; right after the sessions: {fds0_list:?}, now: {:?}",
        fd_targets(pid)
    );
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}
