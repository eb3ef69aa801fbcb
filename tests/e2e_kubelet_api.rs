//! End to end: the kubelet API on a node joined to the real control plane,
//! through the real apiserver and the real `kubectl`, on both runtimes:
//! `kubectl logs` (plain, `--tail`, `--timestamps`, `--limit-bytes`,
//! `--since`, `--previous`, `-f` until the container exits), `kubectl
//! exec` (with its exit code, and on a terminal driven by a pty), `kubectl
//! attach`, `kubectl port-forward`, `kubectl top` through the cluster's
//! metrics-server, `/stats/summary`, `/metrics*`, `/statusz`, `/flagz`,
//! `/run`, `/pods`, `/healthz` and `/configz` with a client certificate of
//! the cluster's CA, `kubectl get --raw /api/v1/nodes/N/proxy/…` through
//! the apiserver (the node on a non-loopback address of its own), the
//! read-only port, and the negatives: no credentials → 401, a bad token →
//! 401, a ServiceAccount token and a client certificate without RBAC →
//! 403 for every path class, TLS 1.1 refused (by the server: openssl
//! offers it, the server's alert refuses it).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};

crate::both_runtimes!(
    kubectl_logs_pods_and_healthz,
    unauthenticated_and_unauthorized_callers_are_refused,
    kubectl_exec,
    kubectl_exec_on_a_terminal,
    kubectl_port_forward,
    kubectl_attach,
    kubectl_logs_follow_across_rotation,
    kubectl_logs_follow_throughput,
    stats_summary_and_resource_metrics_measure_the_pods,
    proxied_by_the_apiserver_and_the_read_only_port,
    kubectl_debug_adds_ephemeral_containers
);

const BB: &str = "kinglet.test/busybox:1";

fn kubectl(args: &[&str]) -> (bool, String, String) {
    let kc = cluster_dir().join("admin.kubeconfig");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl` with `input` on its stdin: (exit code, stdout, stderr).
fn kubectl_stdin(args: &[&str], input: &[u8]) -> (i32, Vec<u8>, String) {
    use std::io::Write;
    let kc = cluster_dir().join("admin.kubeconfig");
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An `Authorization` header with a token of ServiceAccount `sa`.
async fn bearer_of(
    sas: &Api<ServiceAccount>,
    sa: &str,
    tr: &k8s_openapi::api::authentication::v1::TokenRequest,
) -> String {
    let status = sas
        .create_token_request(sa, &PostParams::default(), tr)
        .await
        .unwrap()
        .status;
    format!("Authorization: Bearer {}", status.unwrap().token.unwrap())
}

/// A node joined and Ready: (kinglet, its log dir, the admin client, the
/// default namespace's pods, the Node).
type ReadyNode = (
    Kinglet,
    tempfile::TempDir,
    kube::Client,
    Api<Pod>,
    k8s_openapi::api::core::v1::Node,
);

/// A node of `rt` joined and Ready.
async fn ready_node(rt: Rt, prefix: &str) -> ReadyNode {
    ready_node_with(rt, prefix, FAST_CONFIG).await
}

/// [`ready_node`] with its own configuration.
async fn ready_node_with(rt: Rt, prefix: &str, config: &str) -> ReadyNode {
    let admin = admin().await;
    let (k, dir) = join_logged_with(rt, prefix, config, &[pods::busybox_archive()]);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let n = wait_ready(&nodes, &k.name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    (k, dir, admin, pods, n)
}

async fn kubectl_logs_pods_and_healthz(rt: Rt) {
    let (k, _dir, _admin, pods, _n) = ready_node(rt, "kl-logs").await;
    let node = k.name.clone();
    let name = format!("{node}-talk");
    // Three lines, then it fails once (for --previous), then talks again
    // slowly and exits 0 (for -f to end).
    let script = "echo one; echo two; echo three; if [ ! -e /tmp/again ]; then touch /tmp/again; exit 1; fi; for i in 1 2 3; do echo tick $i; sleep 1; done";
    let p: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 1,
                 "volumes": [{"name": "tmp", "emptyDir": {}}],
                 "containers": [{"name": "c", "image": BB, "command": ["sh", "-c", script],
                                 "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    wait_for(
        "the first run failed and the second started",
        Duration::from_secs(60),
        || async {
            let p = pods.get(&name).await.ok()?;
            let c = p.status?.container_statuses?.into_iter().next()?;
            (c.restart_count >= 1).then_some(())
        },
    )
    .await;
    // -f from the start of the second run: the ticks, then the end.
    let (ok, out, err) = kubectl(&["logs", "-f", &name]);
    assert!(ok, "{err}");
    assert_eq!(out, "one\ntwo\nthree\ntick 1\ntick 2\ntick 3\n");
    let (ok, prev, err) = kubectl(&["logs", "--previous", &name]);
    assert!(ok, "{err}");
    assert_eq!(prev, "one\ntwo\nthree\n");
    let (_, tail, _) = kubectl(&["logs", "--tail=2", &name]);
    assert_eq!(tail, "tick 2\ntick 3\n");
    let (_, ts, _) = kubectl(&["logs", "--timestamps", "--tail=1", &name]);
    let (stamp, line) = ts.trim_end().split_once(' ').unwrap();
    assert!(stamp.parse::<jiff::Timestamp>().is_ok(), "{ts}");
    assert_eq!(line, "tick 3");
    let (_, limited, _) = kubectl(&["logs", "--limit-bytes=6", &name]);
    assert_eq!(limited, "one\ntw");
    let (_, since, _) = kubectl(&["logs", "--since=1h", &name]);
    assert_eq!(since, out);
    let (ok, _, err) = kubectl(&["logs", &name, "-c", "nope"]);
    assert!(!ok && err.contains("nope"), "{err}");
    // /pods and /healthz with a client certificate of the cluster's CA
    // (the apiserver refuses to proxy to a loopback node address, so this
    // goes straight to the node, as the apiserver itself would).
    let port = k.api_port.to_string();
    let get = |path: &str| k.api_get(path);
    let list: serde_json::Value = serde_json::from_str(&get("/pods")).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == name.as_str()),
        "{list}"
    );
    assert_eq!(get("/healthz"), "ok");
    let configz: serde_json::Value = serde_json::from_str(&get("/configz")).unwrap();
    let kc = &configz["kubeletconfig"];
    assert_eq!(kc["kind"], "KubeletConfiguration", "{configz}");
    assert_eq!(kc["port"].to_string(), port, "{configz}");
    assert_eq!(kc["authentication"]["anonymous"]["enabled"], false);
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

async fn unauthenticated_and_unauthorized_callers_are_refused(rt: Rt) {
    let (k, _dir, admin, _pods, _n) = ready_node(rt, "kl-authz").await;
    let node = k.name.clone();
    let port = std::fs::read_to_string(&k.config)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("port: ").map(|p| p.trim().to_string()))
        .unwrap();
    let url = |path: &str| format!("https://127.0.0.1:{port}{path}");
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl(&[&url("/pods")]), "401", "no credentials");
    assert_eq!(
        curl(&["--tls-max", "1.1", &url("/pods")]),
        "000",
        "TLS 1.1 refused"
    );
    tls_versions_offered_by_openssl(&port);
    x509_user_without_rbac_is_forbidden(&node, &url);
    // A ServiceAccount with no role at all: known, but not allowed.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let sa_name = format!("{node}-nobody");
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": sa_name}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let tr: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"expirationSeconds": 600}})).unwrap();
    let bearer = bearer_of(&sas, &sa_name, &tr).await;
    for path in [
        "/pods",
        "/healthz",
        "/containerLogs/default/x/c",
        "/stats/summary",
        "/metrics",
        "/statusz",
        "/flagz",
        "/exec/default/x/c?command=true&stdout=1",
        "/portForward/default/x",
    ] {
        assert_eq!(curl(&["-H", &bearer, &url(path)]), "403", "{path}");
    }
    assert_eq!(
        curl(&["-H", "Authorization: Bearer not-a-token", &url("/pods")]),
        "401"
    );
    // Granted `nodes/stats` only (what a monitoring agent gets): stats
    // answer, exec and the rest stay refused. SubjectAccessReview answers
    // are cached (denials 30 s), so this is a second account.
    let stats_sa = format!("{node}-stats");
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": stats_sa}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let rules =
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes/stats"], "verbs": ["get"]}]);
    let subject =
        serde_json::json!({"kind": "ServiceAccount", "name": stats_sa, "namespace": "default"});
    grant_cluster_role(&admin, &stats_sa, rules, subject).await;
    let bearer = bearer_of(&sas, &stats_sa, &tr).await;
    // RBAC reaches the authorizer's cache within a moment.
    wait_for("nodes/stats allowed", Duration::from_secs(60), || async {
        (curl(&["-H", &bearer, &url("/stats/summary")]) == "200").then_some(())
    })
    .await;
    for path in [
        "/exec/default/x/c?command=true&stdout=1",
        "/pods",
        "/metrics",
    ] {
        assert_eq!(curl(&["-H", &bearer, &url(path)]), "403", "{path}");
    }
    revoke_cluster_role(&admin, &stats_sa).await;
    let _ = sas.delete(&stats_sa, &DeleteParams::default()).await;
    let _ = sas.delete(&sa_name, &DeleteParams::default()).await;
}

/// `openssl s_client` offering exactly one version at the lowest
/// security level (so the client itself would allow TLS 1.1): 1.1 is
/// refused by the server's `protocol version` alert, 1.2 is accepted.
fn tls_versions_offered_by_openssl(port: &str) {
    let offer = |v: &str| {
        let out = Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), v])
            .args(["-cipher", "DEFAULT:@SECLEVEL=0"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), all)
    };
    // The refusal is the server's: an alert it sent (rustls answers a
    // 1.1-only hello with handshake_failure, Go with protocol_version), not
    // openssl declining to offer 1.1 ("no protocols available").
    let (ok, out) = offer("-tls1_1");
    assert!(!ok, "TLS 1.1 accepted: {out}");
    assert!(
        out.contains("alert handshake failure") || out.contains("alert protocol version"),
        "TLS 1.1 not refused by the server's alert: {out}"
    );
    let (ok, out) = offer("-tls1_2");
    assert!(ok && out.contains("Protocol  : TLSv1.2"), "TLS 1.2: {out}");
}

/// A client certificate of the cluster's CA for a user no RBAC rule
/// names: authenticated (not 401), refused (403) on every path class of
/// upstream's mapping (`nodes/pods`, `nodes/healthz`, `nodes/configz`,
/// `nodes/stats`, `nodes/metrics`, `nodes/log`, `nodes/proxy`).
fn x509_user_without_rbac_is_forbidden(node: &str, url: &dyn Fn(&str) -> String) {
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("u.crt"), dir.path().join("u.key"));
    let csr = dir.path().join("u.csr");
    let pki = cluster_dir().join("pki");
    output_ok(
        Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
            ])
            .args(["-subj", &format!("/O=kinglet-test/CN={node}-x509-nobody")])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr),
    );
    // An X.509 v3 client certificate (webpki takes no v1 ones).
    let ext = dir.path().join("ext.cnf");
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n",
    )
    .unwrap();
    output_ok(
        Command::new("openssl")
            .args(["x509", "-req", "-days", "1", "-extfile"])
            .arg(&ext)
            .arg("-in")
            .arg(&csr)
            .arg("-CA")
            .arg(pki.join("ca.crt"))
            .arg("-CAkey")
            .arg(pki.join("ca.key"))
            .args(["-CAcreateserial", "-CAserial"])
            .arg(dir.path().join("ca.srl"))
            .arg("-out")
            .arg(&crt),
    );
    for (method, path) in [
        ("GET", "/pods"),
        ("GET", "/healthz"),
        ("GET", "/configz"),
        ("GET", "/stats/summary"),
        ("GET", "/metrics"),
        ("GET", "/metrics/resource"),
        ("GET", "/statusz"),
        ("GET", "/flagz"),
        ("GET", "/containerLogs/default/x/c"),
        ("POST", "/exec/default/x/c?command=true&stdout=1"),
        ("POST", "/attach/default/x/c?stdout=1"),
        ("POST", "/run/default/x/c?cmd=true"),
        ("POST", "/portForward/default/x"),
    ] {
        let out = Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                method,
                "--cert",
            ])
            .arg(&crt)
            .arg("--key")
            .arg(&key)
            .arg(url(path))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "403",
            "{method} {path}"
        );
    }
}

/// `kubectl exec` through the apiserver, which proxies the WebSocket
/// (v5.channel.k8s.io) straight to the node because the node declares
/// `ExtendWebSocketsToKubelet`.
async fn kubectl_exec(rt: Rt) {
    // An idle session is closed after streamingConnectionIdleTimeout.
    let config = format!("{FAST_CONFIG}streamingConnectionIdleTimeout: 5s\n");
    let (k, _dir, _admin, pods, n) = ready_node_with(rt, "kl-exec", &config).await;
    let node = k.name.clone();
    let declared = n
        .status
        .and_then(|s| s.declared_features)
        .unwrap_or_default();
    assert!(
        declared.iter().any(|f| f == "ExtendWebSocketsToKubelet"),
        "{declared:?}"
    );
    let name = format!("{node}-sh");
    pods::create_running(&pods, &node, &name, serde_json::json!({"containers": [{"name": "c", "image": BB, "command": ["sleep", "3600"],
                                     "env": [{"name": "GREETING", "value": "hello from the pod"}]}]})).await;
    // Both output streams, apart, and the exit code.
    let script = "echo out; echo err >&2; echo $GREETING; exit 3";
    let (code, out, err) = kubectl_stdin(&["exec", &name, "--", "sh", "-c", script], b"");
    assert_eq!(code, 3, "{err}");
    assert_eq!(String::from_utf8_lossy(&out), "out\nhello from the pod\n");
    assert!(err.starts_with("err\n"), "{err}");
    // stdin to the process, and its end of file (v5's stream close).
    let input = b"one\ntwo\nthree\n";
    let (code, out, err) = kubectl_stdin(&["exec", "-i", &name, "--", "cat"], input);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, input);
    // Four megabytes streamed out, every byte (and the status after them).
    let big = "head -c 4194304 /dev/zero | tr '\\0' x";
    let (code, out, err) = kubectl_stdin(&["exec", &name, "--", "sh", "-c", big], b"");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.len(), 4 << 20);
    assert!(out.iter().all(|b| *b == b'x'));
    // A command that cannot start is an error, not a hang.
    let (code, _, err) = kubectl_stdin(&["exec", &name, "--", "/no/such/binary"], b"");
    assert_ne!(code, 0, "{err}");
    // Nothing moves for 5 s: the node closes the session (CIS 4.2.5's
    // setting at work). In-process its process goes with it; containerd
    // lets an exec whose stream closed run to its end (CRI has no call
    // to kill it), as it does under upstream's kubelet.
    let t = std::time::Instant::now();
    let (code, _, err) = kubectl_stdin(&["exec", &name, "--", "sleep", "120"], b"");
    let idle = t.elapsed();
    assert!(
        code != 0 && idle < Duration::from_secs(60),
        "an idle exec ran on: code {code} after {idle:?}: {err}"
    );
    eprintln!("idle exec closed after {idle:?}: {}", err.trim());
    if rt == Rt::Oci {
        wait_for(
            "the idle session's process gone",
            Duration::from_secs(20),
            || async {
                let (code, out, _) = kubectl_stdin(&["exec", &name, "--", "ps"], b"");
                (code == 0 && !String::from_utf8_lossy(&out).contains("sleep 120")).then_some(())
            },
        )
        .await;
    }
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// Kills the child when dropped (a `kubectl port-forward` left running).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kubectl port-forward` through the apiserver: SPDY tunnelled in a
/// WebSocket to the node, one TCP connection per client connection into
/// the pod's network namespace (an echo server on the pod's loopback);
/// left idle, the tunnel is closed after streamingConnectionIdleTimeout.
async fn kubectl_port_forward(rt: Rt) {
    use std::io::{BufRead, Read, Write};
    let config = format!("{FAST_CONFIG}streamingConnectionIdleTimeout: 5s\n");
    let (k, _dir, _admin, pods, _n) = ready_node_with(rt, "kl-pf", &config).await;
    let node = k.name.clone();
    let name = format!("{node}-echo");
    // An echo server in the pod, reached through its network namespace.
    pods::create_running(
        &pods,
        &node,
        &name,
        serde_json::json!({"containers": [{"name": "c", "image": BB,
                                     "command": ["nc", "-ll", "-p", "9000", "-e", "cat"]}]}),
    )
    .await;
    let kc = cluster_dir().join("admin.kubeconfig");
    let mut child = KillOnDrop(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["port-forward", &format!("pod/{name}"), ":9000"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(k.dir.path().join("port-forward.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    // "Forwarding from 127.0.0.1:PORT -> 9000"
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.0.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    // kubectl says "Handling connection for 9000" for each connection:
    // its stdout is read to the end (a closed pipe would kill it).
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no local port in {line:?}"));
    // Two connections at once, each its own bytes, both ways.
    let talk = move |seed: u8| {
        std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let sent: Vec<u8> = (0..200_000u32)
                .map(|i| (i as u8).wrapping_mul(seed))
                .collect();
            let mut w = c.try_clone().unwrap();
            let s2 = sent.clone();
            let writer = std::thread::spawn(move || {
                w.write_all(&s2).unwrap();
                w.shutdown(std::net::Shutdown::Write).unwrap();
            });
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            writer.join().unwrap();
            (sent, got)
        })
    };
    let (a, b) = (talk(3), talk(7));
    let pf_err = k.dir.path().join("port-forward.err");
    for t in [a, b] {
        let (sent, got) = t.join().unwrap_or_else(|_| {
            std::thread::sleep(Duration::from_secs(2));
            let err = std::fs::read_to_string(&pf_err).unwrap_or_default();
            panic!("a connection failed; kubectl said:\n{err}\n{}", k.log())
        });
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "the echo differs from what was sent");
    }
    // Nothing moves for 5 s: the node closes the tunnel (kubectl's pings
    // are not data), and kubectl says it lost the pod and exits.
    let t = std::time::Instant::now();
    let mut exited = None;
    while exited.is_none() && t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        exited = child.0.try_wait().unwrap();
    }
    let err = std::fs::read_to_string(&pf_err).unwrap_or_default();
    assert!(
        exited.is_some_and(|s| !s.success()),
        "an idle port-forward ran on: {exited:?} after {:?}: {err}",
        t.elapsed()
    );
    eprintln!(
        "idle port-forward closed after {:?}: {}",
        t.elapsed(),
        err.trim()
    );
    drop(child);
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// A pseudo-terminal for kubectl: (master, slave).
fn openpty(cols: u16, rows: u16) -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let (mut m, mut s) = (0, 0);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty(3) with valid out-pointers and a valid winsize.
    let r = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two new descriptors this code now owns.
    unsafe { (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s)) }
}

/// `kubectl exec -it` driven through a pty, as a user at a terminal: the
/// shell in the container has a terminal of its own (from the
/// container's devpts), the window size kubectl sends, and what is typed.
async fn kubectl_exec_on_a_terminal(rt: Rt) {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let (k, _dir, _admin, pods, _n) = ready_node(rt, "kl-tty").await;
    let node = k.name.clone();
    let name = format!("{node}-tty");
    pods::create_running(&pods, &node, &name, serde_json::json!({"containers": [{"name": "c", "image": BB, "command": ["sleep", "3600"]}]})).await;
    let (mut master, slave) = openpty(91, 27);
    let kc = cluster_dir().join("admin.kubeconfig");
    let mut child = KillOnDrop(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["exec", "-it", &name, "--", "sh"])
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave)
            .spawn()
            .unwrap(),
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut reader = master.try_clone().unwrap();
    let sink = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let text = || String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    let wait_text = |what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !text().contains(what) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {what:?} on the terminal; it shows:\n{}",
                text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_text("# ");
    master
        .write_all(b"stty size; tty; echo answer=$((6*7)); exit 3\r")
        .unwrap();
    wait_text("answer=42");
    let status = {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = child.0.try_wait().unwrap() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "kubectl did not end");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let shown = text();
    assert!(
        shown.contains("27 91"),
        "the window size reached the shell:\n{shown}"
    );
    assert!(
        shown.contains("/dev/pts/"),
        "the shell has a terminal:\n{shown}"
    );
    assert_eq!(status.code(), Some(3), "{shown}");
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// `kubectl attach -i`: lines typed reach the container's main process,
/// its answers come back, and the attach ends with the container.
async fn kubectl_attach(rt: Rt) {
    let (k, _dir, _admin, pods, _n) = ready_node(rt, "kl-attach").await;
    let node = k.name.clone();
    let name = format!("{node}-att");
    let script = r#"while read l; do echo "got:$l"; [ "$l" = bye ] && exit 0; done"#;
    pods::create_running(
        &pods,
        &node,
        &name,
        serde_json::json!({"restartPolicy": "Never",
                     "containers": [{"name": "c", "image": BB, "stdin": true,
                                     "command": ["sh", "-c", script]}]}),
    )
    .await;
    // stdin stays open while the container answers (at the end of its
    // stdin a client detaches, as with containerd's attach).
    use std::io::{BufRead, Write};
    let kc = cluster_dir().join("admin.kubeconfig");
    let mut child = KillOnDrop(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["attach", "-i", &name])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(l);
        }
    });
    for word in ["hello", "bye"] {
        // Written again until answered: the first lines may come before
        // the attach is up.
        let want = format!("got:{word}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut answered = false;
        while !answered && std::time::Instant::now() < deadline {
            writeln!(stdin, "{word}").unwrap();
            while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
                if l == want {
                    answered = true;
                    break;
                }
            }
        }
        assert!(answered, "no {want:?} from the container");
    }
    let status = child.0.wait().unwrap();
    assert!(status.success(), "kubectl attach: {status}");
    wait_for("the container ended", Duration::from_secs(30), || async {
        let p = pods.get(&name).await.ok()?;
        (p.status?.phase? == "Succeeded").then_some(())
    })
    .await;
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// `/stats/summary` and `/metrics/resource` (what metrics-server scrapes)
/// with a pod that burns CPU and holds memory.
async fn stats_summary_and_resource_metrics_measure_the_pods(rt: Rt) {
    // On a CNI network of its own, for the pod's network stats.
    let dir = tempfile::tempdir().unwrap();
    let ri = rt as u32;
    let tag = std::process::id() % 10000;
    let net = pods::BridgeNet::new(
        dir.path(),
        "klstats",
        format!("kls{tag}r{ri}"),
        &format!("10.205.{}.0/24", 100 + (std::process::id() % 70) * 2 + ri),
    );
    let args = net.args(&dir.path().join("logs"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let k = Kinglet::start_rt(
        rt,
        &unique_name("kl-stats"),
        FAST_CONFIG,
        true,
        &args,
        &[pods::busybox_archive()],
    );
    let admin = admin().await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    wait_ready(&nodes, &k.name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let node = k.name.clone();
    let name = format!("{node}-busy");
    // A CPU loop, 20 MiB held in a file in /dev/shm (shared memory counts
    // in the container's memory cgroup), 1 MiB in its own root filesystem
    // and 1 MiB in an emptyDir.
    let script = "head -c 20971520 /dev/zero > /dev/shm/fill; head -c 1048576 /dev/zero > /big; head -c 1048576 /dev/zero > /data/f; while :; do :; done";
    let probe = serde_json::json!({"exec": {"command": ["true"]}, "periodSeconds": 1});
    let c = serde_json::json!({"name": "c", "image": BB, "command": ["sh", "-c", script], "readinessProbe": probe,
                               "volumeMounts": [{"name": "data", "mountPath": "/data"}]});
    pods::create_running(
        &pods,
        &node,
        &name,
        serde_json::json!({"containers": [c], "volumes": [{"name": "data", "emptyDir": {}}]}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = k.api_get("/stats/summary");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let summary: serde_json::Value = serde_json::from_str(&k.api_get("/stats/summary")).unwrap();
    let n = &summary["node"];
    assert_eq!(n["nodeName"], node.as_str());
    assert!(
        n["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0,
        "{n}"
    );
    assert!(n["memory"]["workingSetBytes"].as_u64().unwrap() > 0, "{n}");
    assert!(n["fs"]["capacityBytes"].as_u64().unwrap() > 0, "{n}");
    let pod = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not in {summary}"))
        .clone();
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "c");
    // About one core busy: at least a tenth of one, measured over 2 s.
    let rate = c["cpu"]["usageNanoCores"].as_u64().unwrap();
    assert!(rate > 100_000_000, "usageNanoCores {rate}: {c}");
    let ws = c["memory"]["workingSetBytes"].as_u64().unwrap();
    assert!(ws >= 20 << 20, "working set {ws}: {c}");
    summary_disk_net_and_psi(&k, rt, &name).await;
    cadvisor_metrics_scraped_by_prometheus(&k, &admin, &name).await;
    assert!(
        pod["memory"]["workingSetBytes"].as_u64().unwrap() >= ws,
        "{pod}"
    );

    let metrics = k.api_get("/metrics/resource");
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "container_cpu_usage_seconds_total{{container=\"c\",namespace=\"default\",pod=\"{name}\"}}"
            ))
        })
        .unwrap_or_else(|| panic!("no cpu sample for {name}:\n{metrics}"));
    let secs: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(secs > 0.5, "{line}");
    assert!(
        metrics.contains("node_memory_working_set_bytes "),
        "{metrics}"
    );
    assert!(metrics.contains("resource_scrape_error 0"), "{metrics}");

    // kinglet's own metrics, upstream's names.
    let own = k.api_get("/metrics");
    let value = |prefix: &str| -> f64 {
        own.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{own}"))
    };
    assert_eq!(value(&format!("kubelet_node_name{{node=\"{node}\"}}")), 1.0);
    assert!(value("kubelet_running_pods ") >= 1.0);
    assert!(value("kubelet_running_containers{container_state=\"running\"}") >= 1.0);
    assert!(value("kubelet_pod_start_duration_seconds_count") >= 1.0);
    assert!(value("kubelet_pleg_relist_duration_seconds_count") >= 1.0);
    let probes = format!(
        "prober_probe_total{{probe_type=\"Readiness\",result=\"successful\",container=\"c\",pod=\"{name}\""
    );
    assert!(value(&probes) >= 1.0);
    let probe_page = k.api_get("/metrics/probes");
    assert!(
        probe_page.contains(&probes) && !probe_page.contains("kubelet_running_pods"),
        "{probe_page}"
    );

    // The debugging pages, in upstream's text shape.
    let statusz = k.api_get("/statusz");
    assert!(
        statusz.starts_with("\nkubelet statusz\nWarning:"),
        "{statusz}"
    );
    assert!(statusz.contains("/stats/summary"), "{statusz}");
    let flagz = k.api_get("/flagz");
    assert!(
        flagz.contains("hostname-override") && flagz.contains(&node),
        "{flagz}"
    );
    // /run: a command to its end, its output whole.
    let pki = cluster_dir().join("pki");
    let run = Command::new("curl")
        .args(["-sfk", "-X", "POST", "--cert"])
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .arg(format!(
            "https://127.0.0.1:{}/run/default/{name}/c?cmd=echo%20ran%20here",
            k.api_port
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&run.stdout), "ran here\n");
    kubectl_top(&node, &name).await;
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// The summary's other sections: the container's writable layer
/// (`rootfs`; containerd measures it every 10 s), the pod's emptyDir
/// (`volume`), its network (in-process: read from the pod's own network
/// namespace; through CRI: containerd's sandbox stats), the node's PSI where
/// the kernel has it.
async fn summary_disk_net_and_psi(k: &Kinglet, rt: Rt, name: &str) {
    let pod = wait_for(
        "rootfs and volume usage",
        Duration::from_secs(40),
        || async {
            let summary: serde_json::Value =
                serde_json::from_str(&k.api_get("/stats/summary")).ok()?;
            let pod = summary["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["name"] == name)?
                .clone();
            let rootfs = pod["containers"][0]["rootfs"]["usedBytes"].as_u64()?;
            let volume = pod["volume"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == "data")?["usedBytes"]
                .as_u64()?;
            (rootfs >= 1 << 20 && volume >= 1 << 20).then_some(pod)
        },
    )
    .await;
    assert!(
        pod["volume"][0]["capacityBytes"].as_u64().unwrap() > 0,
        "{pod}"
    );
    let net = &pod["network"];
    assert_eq!(net["name"], "eth0", "{rt:?}: {pod}");
    assert!(net["rxBytes"].is_u64() && net["txBytes"].is_u64(), "{net}");
    if std::path::Path::new("/proc/pressure/cpu").exists() {
        let summary: serde_json::Value =
            serde_json::from_str(&k.api_get("/stats/summary")).unwrap();
        let psi = &summary["node"]["cpu"]["psi"];
        assert!(psi["some"]["total"].is_u64(), "{summary}");
        assert!(
            summary["node"]["memory"]["psi"]["some"]["avg10"].is_f64(),
            "{summary}"
        );
        assert!(
            summary["node"]["io"]["psi"]["full"]["total"].is_u64(),
            "{summary}"
        );
    }
}

/// `/metrics/cadvisor` with the busy pod, in cAdvisor's names and
/// labels; then a real Prometheus (Debian's) configured as kube-prometheus
/// configures its kubelet job (nodes discovered through the API, HTTPS
/// with a ServiceAccount token granted `nodes/metrics`, the
/// `metrics_path` label) scrapes it, and the PromQL of the dashboards'
/// pod panels returns the pod's CPU and memory.
async fn cadvisor_metrics_scraped_by_prometheus(k: &Kinglet, admin: &kube::Client, name: &str) {
    let page = k.api_get("/metrics/cadvisor");
    let pod_label = format!("pod=\"{name}\"");
    let sample = |prefix: &str| -> f64 {
        page.lines()
            .find(|l| l.starts_with(prefix) && l.contains(&pod_label))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} of {name} in\n{page}"))
    };
    let c = "{container=\"c\",";
    assert!(
        sample(&format!(
            "container_cpu_usage_seconds_total{c}cpu=\"total\","
        )) > 0.5
    );
    assert!(sample(&format!("container_memory_working_set_bytes{c}")) >= f64::from(20 << 20));
    assert!(sample(&format!("container_fs_usage_bytes{c}device=")) >= f64::from(1 << 20));
    assert!(sample(&format!("container_processes{c}")) >= 1.0);
    assert!(sample("container_network_receive_packets_total{container=\"\",") > 0.0);
    assert!(page.contains("# TYPE container_memory_working_set_bytes gauge"));

    let prom = Prometheus::start(admin, &k.name).await;
    let sel = format!(
        "job=\"kubelet\",metrics_path=\"/metrics/cadvisor\",image!=\"\",container!=\"\",pod=\"{name}\""
    );
    // A rate over 8 s of samples, past Prometheus' own start.
    let cpu = format!("sum by (pod) (rate(container_cpu_usage_seconds_total{{{sel}}}[8s]))");
    let scrapes = format!("count_over_time(container_cpu_usage_seconds_total{{{sel}}}[8s])");
    let mem = format!("sum by (pod) (container_memory_working_set_bytes{{{sel}}})");
    let answers = within(Duration::from_secs(60), || async {
        let enough = prom.query(&scrapes)? >= 7.0;
        enough.then_some(())?;
        Some((prom.query(&cpu)?, prom.query(&mem)?))
    })
    .await;
    let (cores, bytes) =
        answers.unwrap_or_else(|| panic!("no answer from Prometheus: {}", prom.diagnose()));
    println!(
        "figure: Prometheus over /metrics/cadvisor: pod {name} at {cores:.2} cores, {} MiB working set",
        bytes as u64 >> 20
    );
    assert!(cores > 0.1, "{cores} cores");
    assert!(bytes >= f64::from(20 << 20), "{bytes} bytes");
    let sa_name = format!("{}-prometheus", k.name);
    revoke_cluster_role(admin, &sa_name).await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let _ = sas.delete(&sa_name, &DeleteParams::default()).await;
}

/// A Prometheus server of the test's own (`prometheus` from Debian),
/// killed when dropped.
struct Prometheus {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `/metrics/cadvisor` of `node` as kube-prometheus' kubelet
    /// ServiceMonitor does, every second.
    async fn start(admin: &kube::Client, node: &str) -> Prometheus {
        let sa_name = format!("{node}-prometheus");
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
        let sa: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": sa_name}})).unwrap();
        sas.create(&PostParams::default(), &sa).await.unwrap();
        // prometheus-k8s's rules in kube-prometheus, for nodes.
        let rules = serde_json::json!([{"apiGroups": [""], "resources": ["nodes", "nodes/metrics"], "verbs": ["get", "list", "watch"]}]);
        let subject =
            serde_json::json!({"kind": "ServiceAccount", "name": sa_name, "namespace": "default"});
        grant_cluster_role(admin, &sa_name, rules, subject).await;
        let tr: k8s_openapi::api::authentication::v1::TokenRequest =
            serde_json::from_value(serde_json::json!({"spec": {"expirationSeconds": 600}}))
                .unwrap();
        let bearer = bearer_of(&sas, &sa_name, &tr).await;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, bearer.trim_start_matches("Authorization: Bearer ")).unwrap();
        let config = dir.path().join("prometheus.yml");
        let n = Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
            .get(node)
            .await
            .unwrap();
        let status = n.status.unwrap_or_default();
        let ip = status
            .addresses
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .expect("an InternalIP");
        let port = status
            .daemon_endpoints
            .unwrap_or_default()
            .kubelet_endpoint
            .unwrap_or_default()
            .port;
        let target = format!("{ip}:{port}");
        std::fs::write(&config, prometheus_config(&target, node, &token)).unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("prometheus (tests/setup.sh installs Debian's package)");
        Prometheus { child, port, dir }
    }

    /// Its targets' health and its log, for a failure's message.
    fn diagnose(&self) -> String {
        let targets = Command::new("curl")
            .arg("-s")
            .arg(format!("http://127.0.0.1:{}/api/v1/targets", self.port))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        format!("targets: {targets}\nlog:\n{log}")
    }

    /// The one value of an instant query, when it has one.
    fn query(&self, promql: &str) -> Option<f64> {
        let out = Command::new("curl")
            .args(["-sf", "--data-urlencode"])
            .arg(format!("query={promql}"))
            .arg(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let result = v["data"]["result"].as_array()?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kube-prometheus' kubelet job for cAdvisor, as the operator renders it.
/// Debian's Prometheus is built without Kubernetes discovery, so the
/// target is what the operator's kubelet controller makes of a Node for
/// the `kubelet` Endpoints: its InternalIP and `daemonEndpoints` port.
fn prometheus_config(target: &str, node: &str, token: &std::path::Path) -> String {
    format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
- job_name: kubelet
  honor_labels: true
  honor_timestamps: false
  metrics_path: /metrics/cadvisor
  scheme: https
  authorization:
    credentials_file: {token}
  tls_config:
    insecure_skip_verify: true
  static_configs:
  - targets: ["{target}"]
    labels:
      node: {node}
  relabel_configs:
  - source_labels: [__metrics_path__]
    target_label: metrics_path
"#,
        token = token.display(),
    )
}

/// Millicores and bytes from `kubectl top`'s `123m` and `45Mi` columns.
fn top_figures(cpu: &str, mem: &str) -> (u64, u64) {
    let cpu = cpu
        .strip_suffix('m')
        .map(|m| m.parse::<u64>().unwrap())
        .unwrap_or_else(|| cpu.parse::<u64>().unwrap() * 1000);
    let (n, unit) = mem.split_at(mem.find(|c: char| !c.is_ascii_digit()).unwrap_or(mem.len()));
    let shift = match unit {
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => 0,
    };
    (cpu, n.parse::<u64>().unwrap() << shift)
}

/// `kubectl top node` and `kubectl top pod --containers` through the
/// cluster's metrics-server (built from its Go module by
/// tests/cluster/up.sh), which scrapes the node's `/metrics/resource`
/// every 10 s and needs two scrapes for a CPU rate.
async fn kubectl_top(node: &str, pod: &str) {
    let row = wait_for("kubectl top node", Duration::from_secs(90), || async {
        let (ok, out, _) = kubectl(&["top", "node", node, "--no-headers"]);
        ok.then_some(out)
    })
    .await;
    let f: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(f.first(), Some(&node), "{row}");
    let (cpu, mem) = top_figures(f[1], f[3]);
    assert!(cpu > 0 && mem > 1 << 20, "{row}");
    let row = wait_for("kubectl top pod", Duration::from_secs(90), || async {
        let (ok, out, _) = kubectl(&["top", "pod", pod, "--containers", "--no-headers"]);
        ok.then_some(out)
    })
    .await;
    let f: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&f[..2], &[pod, "c"], "{row}");
    // The container spins a whole core and holds 20 MiB.
    let (cpu, mem) = top_figures(f[2], f[3]);
    assert!(cpu >= 100, "{row}");
    assert!(mem >= 20 << 20, "{row}");
    eprintln!("figure: kubectl top pod {pod}: {cpu}m, {} MiB", mem >> 20);
}

/// `kubectl logs -f` while the log rotates under it (4 KiB files: the
/// in-process runtime rotates as it writes, kinglet rotates containerd's
/// every 10 s): every line from the first one followed to the last, in
/// order, none lost or repeated at a rotation, and the follow ends with
/// the container.
async fn kubectl_logs_follow_across_rotation(rt: Rt) {
    let admin = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let k = Kinglet::start_rt(
        rt,
        &unique_name("kl-follow"),
        &format!("{FAST_CONFIG}containerLogMaxSize: 4Ki\ncontainerLogMaxFiles: 3\n"),
        true,
        &["--pod-log-dir", logs.to_str().unwrap()],
        &[pods::busybox_archive()],
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    wait_ready(&nodes, &k.name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let name = format!("{}-lines", k.name);
    // ~25 s of numbered lines (two of containerd's rotation rounds).
    let script =
        "i=0; while [ $i -lt 1000 ]; do echo line-$i; i=$((i+1)); sleep 0.025; done; echo done";
    let spec = serde_json::json!({"restartPolicy": "Never",
        "containers": [{"name": "c", "image": BB, "command": ["sh", "-c", script]}]});
    pods::create_running(&pods, &k.name, &name, spec).await;
    let (ok, out, err) = kubectl(&["logs", "-f", &name]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.last(), Some(&"done"), "the follow ended early: {out}");
    let numbers: Vec<u64> = lines[..lines.len() - 1]
        .iter()
        .map(|l| l.strip_prefix("line-").unwrap().parse().unwrap())
        .collect();
    assert!(numbers.len() > 100, "{out}");
    for w in numbers.windows(2) {
        assert_eq!(w[1], w[0] + 1, "a line lost or repeated across a rotation");
    }
    let rotated = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .flat_map(|d| {
            std::fs::read_dir(d.path().join("c"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|f| f.file_name().to_string_lossy().contains(".log."))
        .count();
    assert!(rotated >= 1, "the log never rotated");
    eprintln!(
        "figure: kubectl logs -f {rt:?}: {} lines across rotations",
        numbers.len()
    );
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// `kubectl logs -f` of a container that wrote 80,000 lines of 100 bytes
/// (8 MB; the log limit raised so nothing rotates): every line arrives
/// whole, and the time to read them all is the figure.
async fn kubectl_logs_follow_throughput(rt: Rt) {
    let admin = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kinglet::start_rt(
        rt,
        &unique_name("kl-tput"),
        &format!("{FAST_CONFIG}containerLogMaxSize: 64Mi\n"),
        true,
        &["--pod-log-dir", dir.path().join("logs").to_str().unwrap()],
        &[pods::busybox_archive()],
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    wait_ready(&nodes, &k.name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let name = format!("{}-flood", k.name);
    const LINES: usize = 80_000;
    let line = "0123456789".repeat(10);
    let line = &line[..99];
    let script = format!("yes {line} | head -n {LINES}; echo END; sleep 3600");
    let spec = serde_json::json!({"terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": BB, "command": ["sh", "-c", script]}]});
    pods::create_running(&pods, &k.name, &name, spec).await;
    wait_for("all lines written", Duration::from_secs(120), || async {
        let (ok, out, _) = kubectl(&["logs", "--tail=1", &name]);
        (ok && out == "END\n").then_some(())
    })
    .await;
    let kc = cluster_dir().join("admin.kubeconfig");
    let start = std::time::Instant::now();
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["logs", "-f", &name])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (mut n, mut bytes) = (0usize, 0usize);
    use std::io::BufRead;
    for l in std::io::BufReader::new(out).lines() {
        let l = l.unwrap();
        bytes += l.len() + 1;
        if l == "END" {
            break;
        }
        assert_eq!(l, line, "line {n} damaged");
        n += 1;
    }
    let took = start.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(n, LINES, "lines lost");
    eprintln!(
        "figure: kubectl logs -f {rt:?}: {:.1} MB in {:.2} s, {:.1} MB/s",
        bytes as f64 / 1e6,
        took.as_secs_f64(),
        bytes as f64 / 1e6 / took.as_secs_f64()
    );
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// A local address on a veth pair of its own, so the node has an address
/// the apiserver agrees to proxy to (it refuses loopback ones); the pair
/// (and the address with it) goes when dropped.
struct NodeAddress {
    link: String,
    ip: String,
}

impl NodeAddress {
    fn new(rt: Rt) -> NodeAddress {
        let (link, ip) = match rt {
            Rt::Oci => ("klpx-oci", "10.254.250.1"),
            Rt::Cri => ("klpx-cri", "10.254.250.2"),
        };
        let ip_cmd = |args: &[&str]| output_ok(Command::new("ip").args(args));
        let _ = Command::new("ip").args(["link", "del", link]).output();
        let peer = format!("{link}p");
        ip_cmd(&["link", "add", link, "type", "veth", "peer", "name", &peer]);
        ip_cmd(&["addr", "add", &format!("{ip}/32"), "dev", link]);
        ip_cmd(&["link", "set", link, "up"]);
        ip_cmd(&["link", "set", &peer, "up"]);
        NodeAddress {
            link: link.into(),
            ip: ip.into(),
        }
    }
}

impl Drop for NodeAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
    }
}

/// `kubectl get --raw /api/v1/nodes/N/proxy/…`: the apiserver proxies to
/// the node's InternalIP and kubelet port with its kubelet client
/// certificate (the `nodes/proxy` path). And the read-only port, on
/// plain HTTP without credentials: the default pages answer, the
/// debugging ones are refused as upstream refuses them there.
async fn proxied_by_the_apiserver_and_the_read_only_port(rt: Rt) {
    let admin = admin().await;
    let addr = NodeAddress::new(rt);
    let ro = free_port();
    let k = Kinglet::start_rt(
        rt,
        &unique_name("kl-proxy"),
        &format!("{FAST_CONFIG}readOnlyPort: {ro}\n"),
        true,
        &["--node-ip", &addr.ip],
        &[pods::busybox_archive()],
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let n = wait_ready(&nodes, &k.name, Duration::from_secs(30)).await;
    let internal = n.status.unwrap().addresses.unwrap_or_default();
    assert!(
        internal
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == addr.ip),
        "{internal:?}"
    );
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let name = format!("{}-p", k.name);
    let spec = serde_json::json!({"terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": BB, "command": ["sleep", "3600"]}]});
    pods::create_running(&pods, &k.name, &name, spec).await;
    let raw = |path: &str| {
        let (ok, out, err) = kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy{path}", k.name),
        ]);
        assert!(ok, "{path}: {err}");
        out
    };
    let configz: serde_json::Value = serde_json::from_str(&raw("/configz")).unwrap();
    assert_eq!(configz["kubeletconfig"]["kind"], "KubeletConfiguration");
    assert_eq!(configz["kubeletconfig"]["port"], k.api_port, "{configz}");
    let summary: serde_json::Value = serde_json::from_str(&raw("/stats/summary")).unwrap();
    assert_eq!(summary["node"]["nodeName"], k.name.as_str());
    assert!(
        summary["pods"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["podRef"]["name"] == name.as_str()),
        "{summary}"
    );
    let metrics = raw("/metrics");
    assert!(
        metrics.contains(&format!("kubelet_node_name{{node=\"{}\"}} 1", k.name)),
        "{metrics}"
    );
    let list: serde_json::Value = serde_json::from_str(&raw("/pods")).unwrap();
    assert_eq!(list["kind"], "PodList");

    // The read-only port.
    let get = |path: &str| {
        let out = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:{ro}{path}"))
            .output()
            .unwrap();
        let all = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = all.rsplit_once('\n').unwrap();
        (code.to_string(), body.to_string())
    };
    assert_eq!(get("/healthz"), ("200".into(), "ok".into()));
    let (code, body) = get("/pods");
    assert_eq!(code, "200");
    assert!(body.contains(&name), "{body}");
    let (code, body) = get("/stats/summary");
    assert_eq!(code, "200", "{body}");
    for path in [
        "/exec/default/x/c",
        "/run/default/x/c",
        "/containerLogs/default/x/c",
    ] {
        assert_eq!(
            get(path),
            ("405".into(), "Debug endpoints are disabled.\n".into()),
            "{path}"
        );
    }
    assert_eq!(get("/configz").0, "404");
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// An ephemeral container's status by name, once it has one.
async fn ephemeral_status(
    pods: &Api<Pod>,
    pod: &str,
    name: &str,
) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
    let p = pods.get(pod).await.ok()?;
    p.status?
        .ephemeral_container_statuses?
        .into_iter()
        .find(|s| s.name == name)
}

/// `kubectl debug`: ephemeral containers added to a running pod start in
/// it (their logs and exec work), report their own statuses, one with
/// `--target` sees the target's processes (the others their own), and one
/// that exits is never restarted; the pod's own container is left alone.
async fn kubectl_debug_adds_ephemeral_containers(rt: Rt) {
    let (k, _dir, _admin, pods, _n) = ready_node(rt, "kl-debug").await;
    let node = k.name.clone();
    let name = format!("{node}-app");
    pods::create_running(
        &pods,
        &node,
        &name,
        serde_json::json!({"containers": [
        {"name": "c", "image": BB, "command": ["sleep", "3600"]}]}),
    )
    .await;
    let before = pods
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap()
        .container_statuses
        .unwrap()[0]
        .clone();
    let debug_with = |container: &str, target: &[&str], script: &str| {
        let mut args = vec!["debug", &name, "--image", BB, "--container", container];
        args.extend(target);
        args.extend(["--", "sh", "-c", script]);
        let (ok, out, err) = kubectl(&args);
        assert!(ok, "kubectl debug: {out}{err}");
    };
    let debug = |container: &str, script: &str| debug_with(container, &[], script);
    let running = |container: &'static str| {
        let pods = pods.clone();
        let name = name.clone();
        async move {
            wait_for(
                "the ephemeral container runs",
                Duration::from_secs(60),
                || async {
                    ephemeral_status(&pods, &name, container)
                        .await
                        .filter(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()))
                },
            )
            .await
        }
    };
    // Its own PID namespace: PID 1 is its own shell.
    let pid1 = "tr '\\0' ' ' </proc/1/cmdline; echo";
    debug(
        "debugger",
        &format!("echo debugging; {pid1}; exec sleep 3600"),
    );
    let s = running("debugger").await;
    assert!(!s.ready, "{s:?}");
    let (ok, out, err) = kubectl(&["logs", &name, "-c", "debugger"]);
    assert!(ok && out.starts_with("debugging\nsh -c "), "{out}{err}");
    // `--target c`: the target's PID namespace, where PID 1 is its sleep.
    debug_with(
        "targeter",
        &["--target", "c"],
        &format!("{pid1}; exec sleep 3600"),
    );
    running("targeter").await;
    let (ok, out, err) = kubectl(&["logs", &name, "-c", "targeter"]);
    assert!(ok && out == "sleep 3600 \n", "{out}{err}");
    let (code, out, err) = kubectl_stdin(
        &["exec", &name, "-c", "debugger", "--", "echo", "inside"],
        b"",
    );
    assert_eq!(
        (code, String::from_utf8_lossy(&out).as_ref()),
        (0, "inside\n"),
        "{err}"
    );
    // One that exits with an error: terminated, never restarted, and the
    // pod keeps running.
    debug("quitter", "exit 3");
    let t = wait_for("the second one exits", Duration::from_secs(60), || async {
        ephemeral_status(&pods, &name, "quitter")
            .await
            .and_then(|s| s.state?.terminated)
    })
    .await;
    assert_eq!(t.exit_code, 3, "{t:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let q = ephemeral_status(&pods, &name, "quitter").await.unwrap();
    assert_eq!(q.restart_count, 0, "{q:?}");
    assert!(q.state.unwrap().terminated.is_some());
    let p = pods.get(&name).await.unwrap().status.unwrap();
    assert_eq!(p.phase.as_deref(), Some("Running"));
    let after = p.container_statuses.unwrap()[0].clone();
    assert_eq!(
        (after.container_id, after.restart_count),
        (before.container_id, 0)
    );
    assert!(after.ready);
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_for("the pod is gone", Duration::from_secs(60), || async {
        pods.get(&name).await.is_err().then_some(())
    })
    .await;
}
