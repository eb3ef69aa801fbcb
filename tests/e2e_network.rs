//! End to end: pod networking through the real CNI plugins (Debian's
//! containernetworking-plugins: bridge, host-local, loopback) with a
//! private conflist, bridge and address range: pods get their own IP,
//! are reachable from the host and from each other, a `hostPort` reaches
//! its pod through portmap, the containers of a pod share their network,
//! IPC and UTS namespaces, host-network pods skip CNI, and deleting pods
//! gives back addresses, veths, port mappings and namespaces.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Kinglet, Rt};

struct Net {
    k: Kinglet,
    _dir: tempfile::TempDir,
    manifests: PathBuf,
    logs: PathBuf,
    ipam: PathBuf,
    bridge: String,
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(pid) = self.k.alive().then(|| self.k.pid()) {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        common::pods::cleanup_root(&self.k.dir.path().join("root"));
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

fn pod_field(root: &Path, name: &str, field: &str) -> Option<String> {
    std::fs::read_dir(root.join("pods"))
        .ok()?
        .flatten()
        .find_map(|e| {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            (v["name"].as_str()?.starts_with(&format!("{name}-"))
                && v["status"]["phase"] == "Running")
                .then(|| v["status"][field].as_str().map(String::from))?
        })
}

fn http_get(ip: &str, port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().ok()?,
        Duration::from_secs(2),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    Some(out)
}

crate::both_runtimes!(pods_get_their_own_reachable_ips_and_give_them_back);

async fn pods_get_their_own_reachable_ips_and_give_them_back(rt: Rt) {
    let dir = tempfile::tempdir().unwrap();
    // Both runtimes' runs share this process: each has its own bridge,
    // subnet and host port.
    let ri = rt as u32;
    let tag = std::process::id() % 10000;
    let bridge = format!("klt{tag}r{ri}");
    let subnet_octet = 100 + (std::process::id() % 75) * 2 + ri;
    let conf = dir.path().join("net.d");
    let ipam = dir.path().join("ipam");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(
        conf.join("10-test.conflist"),
        serde_json::to_vec(&serde_json::json!({
            "cniVersion": "1.0.0", "name": "kltest",
            "plugins": [{"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": format!("10.201.{subnet_octet}.0/24")}]], "dataDir": ipam}},
                {"type": "portmap", "capabilities": {"portMappings": true}}]
        }))
        .unwrap(),
    )
    .unwrap();
    let manifests = dir.path().join("manifests");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&manifests).unwrap();
    let k = Kinglet::start_rt(
        rt,
        &common::unique_name("kl-net"),
        &format!("staticPodPath: {}\n", manifests.display()),
        false,
        &[
            "--pod-log-dir",
            logs.to_str().unwrap(),
            "--cni-conf-dir",
            conf.to_str().unwrap(),
            "--cni-bin-dir",
            "/usr/lib/cni:/opt/cni/bin",
        ],
        &[common::pods::busybox_archive()],
    );
    let n = Net {
        k,
        _dir: dir,
        manifests,
        logs,
        ipam,
        bridge,
    };
    let root = n.k.dir.path().join("root");
    let bb = "kinglet.test/busybox:1";
    let host_port = 20000 + (std::process::id() % 5000) * 2 + ri;

    std::fs::write(
        n.manifests.join("web.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {bb}, imagePullPolicy: Never, ports: [{{containerPort: 8080, hostPort: {host_port}}}], command: [sh, -c, 'echo ns ipc=$(readlink /proc/self/ns/ipc) uts=$(hostname); echo hosts $(grep -w $(hostname) /etc/hosts | cut -f1); mkdir -p /www; echo hello-from-web > /www/index.html; httpd -f -p 8080 -h /www']}}\n  - {{name: d, image: {bb}, imagePullPolicy: Never, command: [sh, -c, 'echo ns ipc=$(readlink /proc/self/ns/ipc) uts=$(hostname); exec sleep 1000']}}\n"),
    )
    .unwrap();
    let ip = common::wait_for("web's pod IP", Duration::from_secs(30), || async {
        pod_field(&root, "web", "podIP")
    })
    .await;
    assert!(ip.starts_with(&format!("10.201.{subnet_octet}.")), "{ip}");
    let body = common::wait_for(
        "web reachable from the host",
        Duration::from_secs(10),
        || async { http_get(&ip, 8080).filter(|b| b.contains("hello-from-web")) },
    )
    .await;
    assert!(body.contains("200 OK"), "{body}");
    let body = common::wait_for(
        "web reachable through its hostPort",
        Duration::from_secs(10),
        || async {
            http_get("127.0.0.1", host_port as u16).filter(|b| b.contains("hello-from-web"))
        },
    )
    .await;
    assert!(body.contains("200 OK"), "{body}");
    let ns_line = |container: &str| {
        let dirs = std::fs::read_dir(&n.logs).ok()?;
        dirs.flatten()
            .filter(|d| d.file_name().to_string_lossy().starts_with("default_web-"))
            .find_map(|d| std::fs::read_to_string(d.path().join(container).join("0.log")).ok())?
            .lines()
            .find_map(|l| l.split_once(" ns ").map(|(_, v)| v.to_string()))
    };
    let c_ns = common::wait_for("c's namespaces", Duration::from_secs(10), || async {
        ns_line("c")
    })
    .await;
    let d_ns = common::wait_for("d's namespaces", Duration::from_secs(10), || async {
        ns_line("d")
    })
    .await;
    assert_eq!(c_ns, d_ns, "the containers of a pod share IPC and UTS");
    let host_ipc = std::fs::read_link("/proc/self/ns/ipc").unwrap();
    assert!(
        !c_ns.contains(&host_ipc.display().to_string()),
        "the pod has its own IPC namespace: {c_ns}"
    );
    assert!(
        c_ns.contains("uts=web-"),
        "hostname is the pod name: {c_ns}"
    );
    let hosts_ip = common::wait_for("c's hosts entry", Duration::from_secs(10), || async {
        let dirs = std::fs::read_dir(&n.logs).ok()?;
        dirs.flatten()
            .filter(|d| d.file_name().to_string_lossy().starts_with("default_web-"))
            .find_map(|d| std::fs::read_to_string(d.path().join("c/0.log")).ok())?
            .lines()
            .find_map(|l| l.split_once(" hosts ").map(|(_, v)| v.trim().to_string()))
    })
    .await;
    assert_eq!(hosts_ip, ip, "/etc/hosts maps the pod's name to the pod IP");

    std::fs::write(
        n.manifests.join("client.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: client}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {bb}, imagePullPolicy: Never, command: [sh, -c, 'while true; do wget -qO- http://{ip}:8080/; sleep 0.5; done']}}\n"),
    )
    .unwrap();
    std::fs::write(
        n.manifests.join("hostnet.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: hostnet}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {bb}, imagePullPolicy: Never, command: [sleep, '1000']}}\n"),
    )
    .unwrap();
    let client_ip = common::wait_for("client's IP", Duration::from_secs(30), || async {
        pod_field(&root, "client", "podIP")
    })
    .await;
    assert_ne!(client_ip, ip);
    let host_ip = common::wait_for("hostnet's IP", Duration::from_secs(30), || async {
        pod_field(&root, "hostnet", "podIP")
    })
    .await;
    assert_eq!(host_ip, "127.0.0.1", "a hostNetwork pod has the node's IP");
    common::wait_for("client reached web", Duration::from_secs(15), || async {
        let dirs = std::fs::read_dir(&n.logs).ok()?;
        dirs.flatten()
            .filter(|d| {
                d.file_name()
                    .to_string_lossy()
                    .starts_with("default_client-")
            })
            .find_map(|d| std::fs::read_to_string(d.path().join("c/0.log")).ok())
            .filter(|l| l.contains("hello-from-web"))
    })
    .await;
    let veths = |b: &str| {
        String::from_utf8_lossy(
            &Command::new("ip")
                .args(["-br", "link", "show", "master", b])
                .output()
                .unwrap()
                .stdout,
        )
        .lines()
        .count()
    };
    assert_eq!(veths(&n.bridge), 2, "one veth per pod with its own network");

    for f in ["web", "client", "hostnet"] {
        std::fs::remove_file(n.manifests.join(format!("{f}.yaml"))).unwrap();
    }
    // No pod record left (the API checkpoint and a removed pod's log
    // marker may stay).
    common::wait_for("pods gone", Duration::from_secs(40), || async {
        std::fs::read_dir(root.join("pods"))
            .ok()?
            .flatten()
            .all(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("api-") || !name.ends_with(".json")
            })
            .then_some(())
    })
    .await;
    assert_eq!(veths(&n.bridge), 0, "veths left");
    let nat = Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&nat.stdout).contains(&format!("--dport {host_port} ")),
        "portmap rules left for {host_port}"
    );
    let leased: Vec<String> = std::fs::read_dir(n.ipam.join("kltest"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| f.starts_with("10."))
                .collect()
        })
        .unwrap_or_default();
    assert!(leased.is_empty(), "addresses not given back: {leased:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(root.to_str().unwrap()),
        "netns or rootfs mounts left"
    );
}
