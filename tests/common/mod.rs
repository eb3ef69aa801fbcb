//! Shared harness of the end-to-end tests: the real loopback control plane
//! (started once per test binary through `tests/cluster/up.sh`), node
//! credentials, and kinglet processes with private root dirs and ports that
//! are killed and cleaned up when dropped.
#![allow(dead_code)]

pub mod cutter;
pub mod gate;
pub mod oci;
pub mod pods;
pub mod registry;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn cluster_dir() -> PathBuf {
    std::env::var_os("KINGLET_CLUSTER_DIR")
        .map_or_else(|| "/tmp/kinglet-cluster".into(), PathBuf::from)
}

/// Runs a `tests/cluster` script; returns its last line of output.
pub fn run_script(script: &str, args: &[&str]) -> String {
    let out = Command::new(repo().join("tests/cluster").join(script))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().unwrap_or_default().trim().to_string()
}

/// Starts (or finds running) the control plane; returns admin.kubeconfig.
pub fn cluster() -> &'static Path {
    static ADMIN: OnceLock<PathBuf> = OnceLock::new();
    ADMIN.get_or_init(|| PathBuf::from(run_script("up.sh", &[])))
}

/// The API server's port on loopback.
pub fn cluster_port() -> u16 {
    std::env::var("KINGLET_APISERVER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16443)
}

/// Restarts whatever control-plane component is not running.
pub fn cluster_up_again() {
    run_script("up.sh", &[]);
}

/// The static kinglet for this machine's architecture, as the packages
/// build it (`cross/build.sh`, which `tests/run.sh` runs before the
/// tests).
pub fn static_kinglet() -> PathBuf {
    musl_kinglet("release", "")
}

/// `target/<arch>-unknown-linux-musl/<profile>/kinglet`, which
/// `cross/build.sh <target> <flag>` makes.
fn musl_kinglet(profile: &str, flag: &str) -> PathBuf {
    let target = format!("{}-unknown-linux-musl", std::env::consts::ARCH);
    let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(&target)
        .join(profile)
        .join("kinglet");
    assert!(
        bin.exists(),
        "{} is missing: run cross/build.sh {target}{flag} first (tests/run.sh does)",
        bin.display()
    );
    bin
}

/// The kinglet `tests/demo.sh` builds (`cross/build.sh TARGET --demo`;
/// tests/run.sh builds it beside the tests and runs the demo's test last).
pub fn demo_kinglet() -> PathBuf {
    musl_kinglet("demo", " --demo")
}

/// The pid of a running control-plane component.
pub fn component_pid(name: &str) -> i32 {
    let p = cluster_dir().join("pids").join(format!("{name}.pid"));
    std::fs::read_to_string(&p).unwrap().trim().parse().unwrap()
}

/// A kubeconfig with a node client certificate for `name`.
pub fn node_kubeconfig(name: &str) -> PathBuf {
    cluster();
    PathBuf::from(run_script("node-kubeconfig.sh", &[name]))
}

pub async fn admin() -> Client {
    let kc = kube::config::Kubeconfig::read_from(cluster()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

/// A node name unique to this test process and call.
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match within(timeout, f).await {
        Some(v) => v,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Polls `f` until it answers or `timeout` passes (`None`): for a test
/// that says what it saw before it fails.
pub async fn within<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The runtime a test node runs pods with: the pod suites run once with
/// each (`both_runtimes!`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rt {
    /// In-process (libcontainer through kinglet's monitor).
    Oci,
    /// containerd through CRI: a private instance per node
    /// (`tests/cluster/containerd-up.sh`).
    Cri,
}

/// Generates one `#[tokio::test]` per runtime for each listed
/// `async fn name(rt: Rt)`: `oci::name` and `cri::name`.
#[macro_export]
macro_rules! both_runtimes {
    ($($name:ident),* $(,)?) => {
        mod oci {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::common::Rt::Oci).await
            })*
        }
        mod cri {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::common::Rt::Cri).await
            })*
        }
    };
}

/// A kinglet process run for a test.
pub struct Kinglet {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub healthz_port: u16,
    /// The kubelet API's port (`port:` in the config).
    pub api_port: u16,
    pub config: PathBuf,
    /// Joined to the test cluster (else standalone).
    pub joined: bool,
    /// A kubeconfig to use instead of the node's own.
    pub kubeconfig_override: Option<PathBuf>,
    pub extra_args: Vec<String>,
    /// Environment added to kinglet's (and so its monitor's).
    pub env: Vec<(String, String)>,
    pub rt: Rt,
    /// The private containerd's dir, with `--runtime cri`.
    containerd: Option<PathBuf>,
    child: Option<Child>,
}

/// Config that makes tests quick: status every second, lease renewed every 2 s.
pub const FAST_CONFIG: &str = "nodeStatusUpdateFrequency: 1s\nnodeLeaseDurationSeconds: 8\n";

impl Kinglet {
    /// Starts kinglet as node `name` joined to the test cluster, with the
    /// given extra config lines.
    pub fn start(name: &str, extra_config: &str) -> Self {
        Self::start_with(name, extra_config, true, &[])
    }

    /// A joined node not started yet: set `kubeconfig_override` and
    /// `extra_args`, then `spawn`.
    pub fn unstarted(name: &str, extra_config: &str) -> Self {
        Self::new_inner(name, extra_config, true, &[])
    }

    /// Starts kinglet without an API server.
    pub fn standalone(name: &str, extra_config: &str, extra_args: &[&str]) -> Self {
        Self::start_with(name, extra_config, false, extra_args)
    }

    /// Joins the cluster after `prep` ran on the (empty) root dir.
    pub fn start_with_root_prep(
        name: &str,
        extra_config: &str,
        extra_args: &[&str],
        prep: fn(&Path),
    ) -> Self {
        Self::start_inner(name, extra_config, true, extra_args, Some(prep))
    }

    fn start_with(name: &str, extra_config: &str, joined: bool, extra_args: &[&str]) -> Self {
        Self::start_inner(name, extra_config, joined, extra_args, None)
    }

    /// Starts kinglet with `rt` after loading `images` into that runtime;
    /// joined to the test cluster or standalone.
    pub fn start_rt(
        rt: Rt,
        name: &str,
        extra_config: &str,
        joined: bool,
        extra_args: &[&str],
        images: &[&Path],
    ) -> Self {
        Self::start_rt_prepared(rt, name, extra_config, joined, extra_args, images, &|_| {})
    }

    /// As [`Kinglet::start_rt`], with `prep` run on the (empty) root dir
    /// first (e.g. a filesystem mounted there).
    pub fn start_rt_prepared(
        rt: Rt,
        name: &str,
        extra_config: &str,
        joined: bool,
        extra_args: &[&str],
        images: &[&Path],
        prep: &dyn Fn(&Path),
    ) -> Self {
        let mut k = Self::new_inner(name, extra_config, joined, extra_args);
        let root = k.dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        prep(&root);
        k.set_runtime(rt);
        for i in images {
            k.import(i);
        }
        k.spawn();
        k
    }

    /// GET `path` on the node's kubelet API with the cluster admin's
    /// client certificate (the apiserver refuses to proxy to a loopback
    /// node address, so this goes straight to the node, as metrics-server
    /// does).
    pub fn api_get(&self, path: &str) -> String {
        match self.try_api_get(path) {
            Ok(body) => body,
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    /// As [`Kinglet::api_get`], an error status (a container not created
    /// yet) as `Err` with curl's words.
    pub fn try_api_get(&self, path: &str) -> Result<String, String> {
        let pki = cluster_dir().join("pki");
        let out = Command::new("curl")
            .args(["-sSfk", "--cert"])
            .arg(pki.join("admin.crt"))
            .arg("--key")
            .arg(pki.join("admin.key"))
            .arg(format!("https://127.0.0.1:{}{path}", self.api_port))
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs pods with `rt`: with CRI, a private containerd is started (the
    /// test's own `--cni-conf-dir`, set before, becomes containerd's).
    pub fn set_runtime(&mut self, rt: Rt) {
        self.rt = rt;
        if rt != Rt::Cri {
            return;
        }
        let dir = self.dir.path().join("containerd");
        let mut args = vec![dir.display().to_string()];
        if let Some(i) = self.extra_args.iter().position(|a| a == "--cni-conf-dir") {
            args.extend(self.extra_args.get(i + 1).cloned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let endpoint = run_script("containerd-up.sh", &args);
        self.containerd = Some(dir);
        self.extra_args.extend([
            "--runtime".into(),
            "cri".into(),
            "--container-runtime-endpoint".into(),
            endpoint,
        ]);
    }

    /// What a reboot takes from the node (kinglet must be stopped): every
    /// process, mount and pod cgroup of its runtime, every file kept; with
    /// CRI, containerd's state dir too, and containerd is started again.
    pub fn simulate_reboot(&self) {
        pods::simulate_reboot(&self.dir.path().join("root"));
        if let Some(dir) = &self.containerd {
            run_script("containerd-reboot.sh", &[dir.to_str().unwrap()]);
            self.containerd_up_again();
        }
    }

    /// Starts the node's private containerd again (after a kill or a
    /// simulated reboot), on the same dirs and CNI network.
    pub fn containerd_up_again(&self) {
        let dir = self.containerd.as_ref().expect("a CRI node");
        let cni = std::fs::read_to_string(dir.join("cni-conf-dir")).unwrap();
        run_script("containerd-up.sh", &[dir.to_str().unwrap(), cni.trim()]);
    }

    /// Loads an image archive into the node's runtime: kinglet's store, or
    /// containerd's `k8s.io` namespace.
    pub fn import(&self, archive: &Path) {
        match &self.containerd {
            None => pods::import_archive(&self.dir.path().join("root"), archive),
            Some(dir) => ctr_import(&dir.join("containerd.sock"), archive),
        }
    }

    /// What a reboot leaves: no container runs any more (kinglet must be
    /// stopped). With CRI, containerd comes back empty but for `images`.
    pub fn reboot_runtime(&self, images: &[&Path]) {
        pods::cleanup_root(&self.dir.path().join("root"));
        if let Some(dir) = &self.containerd {
            run_script("containerd-down.sh", &[dir.to_str().unwrap()]);
            run_script("containerd-up.sh", &[dir.to_str().unwrap()]);
            for i in images {
                self.import(i);
            }
        }
    }

    /// `<runtime>://`, how container IDs start in pod statuses.
    pub fn id_scheme(&self) -> &'static str {
        match self.rt {
            Rt::Oci => "kinglet-oci://",
            Rt::Cri => "containerd://",
        }
    }

    /// The private containerd's socket, with `--runtime cri`.
    pub fn containerd_socket(&self) -> Option<PathBuf> {
        self.containerd.as_ref().map(|d| d.join("containerd.sock"))
    }

    /// The pid of the node's private containerd, with `--runtime cri`.
    pub fn containerd_pid(&self) -> Option<i32> {
        let d = self.containerd.as_ref()?;
        std::fs::read_to_string(d.join("containerd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn start_inner(
        name: &str,
        extra_config: &str,
        joined: bool,
        extra_args: &[&str],
        prep: Option<fn(&Path)>,
    ) -> Self {
        let mut k = Self::new_inner(name, extra_config, joined, extra_args);
        if let Some(prep) = prep {
            prep(&k.dir.path().join("root"));
        }
        k.spawn();
        k
    }

    fn new_inner(name: &str, extra_config: &str, joined: bool, extra_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let healthz_port = free_port();
        let api_port = free_port();
        let config = dir.path().join("config.yaml");
        // The kubelet API on a port of its own, trusting the test
        // cluster's CA for client certificates (the apiserver's).
        let ca = cluster_dir().join("pki/ca.crt");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: {healthz_port}\nport: {api_port}\nauthentication: {{x509: {{clientCAFile: {}}}}}\n{extra_config}",
                ca.display()
            ),
        )
        .unwrap();
        Kinglet {
            name: name.into(),
            dir,
            healthz_port,
            api_port,
            config,
            joined,
            kubeconfig_override: None,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            rt: Rt::Oci,
            containerd: None,
            child: None,
        }
    }

    /// Starts the process (again) on the same root dir and config.
    /// Loads the busybox test image into the node's runtime and starts
    /// it (a node made with `unstarted`).
    pub fn spawn_with_busybox(&mut self) {
        std::fs::create_dir_all(self.dir.path().join("root")).unwrap();
        self.import(pods::busybox_archive());
        self.spawn();
    }

    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("kinglet.log"))
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kinglet"));
        if self.joined {
            match &self.kubeconfig_override {
                Some(k) => cmd.arg("--kubeconfig").arg(k),
                None => cmd.arg("--kubeconfig").arg(node_kubeconfig(&self.name)),
            };
        }
        // Never the host's CNI configuration: tests that want pod networks
        // pass a private --cni-conf-dir; the others use the host network.
        if !self.extra_args.iter().any(|a| a == "--cni-conf-dir") {
            cmd.args(["--cni-conf-dir", ""]);
        }
        // Nor the host's /var/log/pods: pod logs under the test's own dir
        // unless the test names one.
        if !self.extra_args.iter().any(|a| a == "--pod-log-dir") {
            cmd.arg("--pod-log-dir").arg(self.dir.path().join("logs"));
        }
        if !self.extra_args.iter().any(|a| a == "--node-ip") {
            cmd.args(["--node-ip", "127.0.0.1"]);
        }
        // Nor the host's device-plugin and pod-resources sockets, nor its
        // device classes.
        for (flag, sub) in [
            ("--device-plugin-dir", "device-plugins"),
            ("--pod-resources-dir", "pod-resources"),
            ("--device-config", "devices.yaml"),
            ("--cdi-spec-dirs", "cdi"),
        ] {
            if !self.extra_args.iter().any(|a| a == flag) {
                cmd.arg(flag).arg(self.dir.path().join(sub));
            }
        }
        let child = cmd
            .arg("--config")
            .arg(&self.config)
            .args(&self.extra_args)
            .args(["--hostname-override", &self.name])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("--root-dir")
            .arg(self.dir.path().join("root"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kinglet");
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.path().join("kinglet.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Sends SIGTERM and waits up to `limit` for the exit.
    pub fn terminate(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("running");
        let start = Instant::now();
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return (st, start.elapsed());
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "kinglet did not exit within {limit:?} of SIGTERM\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub async fn healthz(&self) -> Option<u16> {
        let addr = format!("127.0.0.1:{}", self.healthz_port);
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        out.split_whitespace().nth(1)?.parse().ok()
    }
}

impl Drop for Kinglet {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- kinglet log of {} ---\n{}", self.name, self.log());
        }
        // The monitor (or containerd) outlives kinglet by design; tests stop
        // it and what it ran.
        pods::cleanup_root(&self.dir.path().join("root"));
        if let Some(dir) = &self.containerd {
            run_script("containerd-down.sh", &[dir.to_str().unwrap()]);
        }
        if !self.joined {
            return;
        }
        // The Node outlives kinglet in the API, as upstream's does; tests
        // remove their own so the shared cluster stays clean.
        let _ = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(cluster())
            .args([
                "delete",
                "node",
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Loads an image archive into the `k8s.io` namespace of the containerd
/// listening on `sock`.
pub fn ctr_import(sock: &Path, archive: &Path) {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(sock)
        .args(["-n", "k8s.io", "images", "import"])
        .arg(archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The condition of that type on a Node, as (status, reason).
pub fn condition(node: &Node, type_: &str) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

pub fn is_ready(node: &Node) -> bool {
    condition(node, "Ready").is_some_and(|(s, _)| s == "True")
}

/// Waits for the node to exist and be Ready; returns it.
pub async fn wait_ready(nodes: &Api<Node>, name: &str, timeout: Duration) -> Node {
    wait_for(&format!("node {name} Ready"), timeout, || async {
        nodes.get_opt(name).await.ok().flatten().filter(is_ready)
    })
    .await
}

/// One request to a container monitor, synchronously (for cleanup in Drop).
pub fn monitor_call(sock: &Path, req: &str) -> Option<serde_json::Value> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("{req}\n").as_bytes()).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).ok()?;
    serde_json::from_str(&line).ok()
}

/// Deletes every container a monitor knows, then stops it.
pub fn monitor_cleanup(sock: &Path) {
    if let Some(list) = monitor_call(sock, r#"{"op":"list"}"#) {
        for r in list["records"].as_array().cloned().unwrap_or_default() {
            let id = r["id"].as_str().unwrap_or_default();
            monitor_call(sock, &format!(r#"{{"op":"delete","id":"{id}"}}"#));
        }
        monitor_call(sock, r#"{"op":"exit"}"#);
    }
}

/// A process's resident set, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A node joined to the test cluster with `images` loaded and its pod logs
/// under the returned temp dir (`<dir>/logs`).
pub fn join_logged(rt: Rt, prefix: &str, images: &[&Path]) -> (Kinglet, tempfile::TempDir) {
    join_logged_with(rt, prefix, FAST_CONFIG, images)
}

/// [`join_logged`] with its own configuration.
pub fn join_logged_with(
    rt: Rt,
    prefix: &str,
    config: &str,
    images: &[&Path],
) -> (Kinglet, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let k = Kinglet::start_rt(
        rt,
        &unique_name(prefix),
        config,
        true,
        &["--pod-log-dir", dir.path().join("logs").to_str().unwrap()],
        images,
    );
    (k, dir)
}

/// Deletes the pods (grace 0) and waits until the API has none of them.
pub async fn delete_pods(pods: &Api<k8s_openapi::api::core::v1::Pod>, names: &[String]) {
    let dp = kube::api::DeleteParams::default().grace_period(0);
    for n in names {
        let _ = pods.delete(n, &dp).await;
    }
    for n in names {
        wait_for(&format!("{n} gone"), Duration::from_secs(60), || async {
            matches!(pods.get(n).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
        })
        .await;
    }
}

/// A CertificateSigningRequest with the `Approved` condition.
pub fn csr_approved(c: &k8s_openapi::api::certificates::v1::CertificateSigningRequest) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|x| x.type_ == "Approved" && x.status == "True")
        })
}

/// Runs `cmd` to its end; panics with its stderr unless it succeeded.
pub fn output_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A ClusterRole `name` with `rules`, bound to `subject` (RBAC's JSON:
/// `{"kind": "User", "name": …}` or a ServiceAccount with its namespace).
pub async fn grant_cluster_role(
    admin: &Client,
    name: &str,
    rules: serde_json::Value,
    subject: serde_json::Value,
) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::PostParams;
    let role: ClusterRole =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "rules": rules}))
            .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [subject]
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Removes what [`grant_cluster_role`] made.
pub async fn revoke_cluster_role(admin: &Client, name: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let dp = kube::api::DeleteParams::default();
    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(name, &dp)
        .await;
    let _ = Api::<ClusterRole>::all(admin.clone())
        .delete(name, &dp)
        .await;
}
