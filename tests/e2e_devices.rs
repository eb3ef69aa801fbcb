//! End to end: devices on a kinglet node joined to the real API server, on
//! both runtimes.
//!
//! kinglet's built-in device classes: device nodes the test makes
//! (`mknod`, in its own dir) are an extended resource in the Node's
//! capacity; a pod asking for one gets the device node and can write it
//! without being privileged; a pod without it cannot open the same node
//! (its device cgroup refuses); a pod asking for more than is free fails
//! with upstream's `UnexpectedAdmissionError`; a node made later (hot
//! plug) and removed again moves the capacity; a kinglet restart keeps
//! each pod's device and a pod's end frees it.
//!
//! Upstream's sample device plugin (built from its Go module), run as a
//! pod on the node: it registers on `kubelet.sock`, its two devices are
//! allocatable, a pod asking for one gets the plugin's mount, the pod
//! resources API lists it, a kinglet restart keeps the allocation and the
//! plugin registers again, and a plugin that goes leaves its devices
//! unhealthy until it is back.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::pods::running;
use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};

const BB: &str = "kinglet.test/busybox:1";
const KT: &str = "devices.kinglet.io/kt";
const SAMPLE: &str = "example.com/resource";

/// CDI in process (Debian's containerd 1.6 has no CDI: through CRI the
/// names go to containerd as they are).
#[tokio::test]
async fn in_process_a_plugins_cdi_devices_are_injected() {
    a_plugins_cdi_devices_are_injected(Rt::Oci).await
}

crate::both_runtimes!(
    built_in_devices_go_to_pods_that_ask_and_no_other,
    a_device_plugin_serves_pods,
);

fn from_yaml<T: serde::de::DeserializeOwned>(y: &str) -> T {
    let v: serde_json::Value = serde_saphyr::from_str(y).unwrap();
    serde_json::from_value(v).unwrap()
}

/// A loop device on a small file of the test's: a block device no
/// container may open unless it is given (the runtimes' default device
/// rules allow none), and harmless to write.
struct Loop {
    dev: String,
}

impl Loop {
    fn new(file: &Path) -> Loop {
        std::fs::write(file, vec![0u8; 64 << 10]).unwrap();
        let out = output_ok(Command::new("losetup").args(["--find", "--show"]).arg(file));
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Loop { dev }
    }

    /// A node for this device at `path` (as udev would make one).
    fn mknod(&self, path: &Path) {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(&self.dev).unwrap().rdev();
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        let st = Command::new("mknod")
            .arg(path)
            .args(["b", &major.to_string(), &minor.to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "mknod {}", path.display());
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// `resource`'s (capacity, allocatable) on the Node, once both are `want`.
async fn wait_devices(nodes: &Api<Node>, node: &str, resource: &str, want: (&str, &str)) {
    wait_for(
        &format!("{resource} at {want:?} on the node"),
        Duration::from_secs(60),
        || async {
            let st = nodes.get(node).await.ok()?.status?;
            let cap = st.capacity?.get(resource)?.0.clone();
            let alloc = st.allocatable?.get(resource)?.0.clone();
            (cap == want.0 && alloc == want.1).then_some(())
        },
    )
    .await;
}

/// A busybox pod on `node` running `script`, asking for `n` of `resource`
/// (none if 0), with the pod's extra `volumes` YAML.
fn pod(name: &str, node: &str, resource: &str, n: u32, script: &str, extra: &str) -> Pod {
    let limits = if n > 0 {
        format!("resources: {{limits: {{{resource}: {n}}}}}")
    } else {
        String::new()
    };
    from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BB}
    imagePullPolicy: Never
    command: [sh, -c, {script:?}]
    {limits}
{extra}"
    ))
}

/// The first container's ID (the pod runs).
fn container_id(p: &Pod) -> String {
    let st = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    let id = st.and_then(|c| c.first()?.container_id.clone());
    id.expect("a running container's ID")
}

async fn create(pods: &Api<Pod>, p: Pod) {
    pods.create(&PostParams::default(), &p).await.unwrap();
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(
        &format!("{name} Running"),
        Duration::from_secs(60),
        || async { pods.get_opt(name).await.ok().flatten().filter(running) },
    )
    .await
}

/// Waits for `name`'s log to hold `marker`, and returns the log.
async fn wait_log(k: &Kinglet, name: &str, marker: &str) -> String {
    wait_log_any(k, name, &[marker]).await
}

/// Waits for `name`'s log to hold any of `markers`, and returns the log.
async fn wait_log_any(k: &Kinglet, name: &str, markers: &[&str]) -> String {
    let path = format!("/containerLogs/default/{name}/c");
    wait_for(
        &format!("{name} logs {markers:?}"),
        Duration::from_secs(60),
        || async {
            let log = k.try_api_get(&path).ok()?;
            markers.iter().any(|m| log.contains(m)).then_some(log)
        },
    )
    .await
}

/// Waits for `name` to fail admission, and returns its status message.
async fn wait_rejected(pods: &Api<Pod>, name: &str) -> String {
    let st = wait_for(
        &format!("{name} rejected"),
        Duration::from_secs(60),
        || async {
            let st = pods.get_opt(name).await.ok().flatten()?.status?;
            (st.phase.as_deref() == Some("Failed")).then_some(st)
        },
    )
    .await;
    assert_eq!(st.reason.as_deref(), Some("UnexpectedAdmissionError"));
    st.message.unwrap_or_default()
}

async fn delete(pods: &Api<Pod>, name: &str) {
    let _ = pods
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
    wait_for(&format!("{name} gone"), Duration::from_secs(60), || async {
        pods.get_opt(name)
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
}

async fn built_in_devices_go_to_pods_that_ask_and_no_other(rt: Rt) {
    let admin = admin().await;
    let name = unique_name("kl-dev");
    let work = tempfile::tempdir().unwrap();
    let dev = work.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    let loops = [0, 1].map(|i| Loop::new(&work.path().join(format!("loop{i}.img"))));
    loops[0].mknod(&dev.join("kt0"));
    loops[1].mknod(&dev.join("kt1"));
    let config = work.path().join("devices.yaml");
    let classes = format!(
        "devices:\n- resource: {KT}\n  paths: [{}/kt*]\n",
        dev.display()
    );
    std::fs::write(&config, classes).unwrap();
    let config_arg = config.to_str().unwrap();
    let images = [common::pods::busybox_archive()];
    let mut k = Kinglet::start_rt(
        rt,
        &name,
        FAST_CONFIG,
        true,
        &["--device-config", config_arg],
        &images,
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    wait_devices(&nodes, &name, KT, ("2", "2")).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let d = dev.display();

    // A pod asking for one sees that one only, and writes it unprivileged.
    // Outside /dev on the host, so at /dev/<name> in the container.
    let script = "ls /dev; test -b /dev/kt0 && echo x > /dev/kt0 && echo wrote-kt0; sleep 1000";
    let a = format!("{name}-a");
    create(&pods, pod(&a, &name, KT, 1, script, "")).await;
    let first = wait_running(&pods, &a).await;
    let log = wait_log(&k, &a, "wrote-kt0").await;
    assert!(log.contains("kt0") && !log.contains("kt1"), "{log}");

    // Without the resource, the same kind of node through a hostPath
    // cannot be opened: the container's device cgroup refuses it.
    let volume = format!(
        "    volumeMounts: [{{name: dev, mountPath: /hostdev}}]\n  volumes: [{{name: dev, hostPath: {{path: {d}}}}}]\n"
    );
    let script = "if echo x > /hostdev/kt1; then echo opened; else echo refused; fi; sleep 1000";
    let n = format!("{name}-n");
    create(&pods, pod(&n, &name, KT, 0, script, &volume)).await;
    let log = wait_log_any(&k, &n, &["refused", "opened"]).await;
    assert!(
        log.contains("refused") && log.contains("Operation not permitted"),
        "{log}"
    );

    // More than is free: upstream's reason and message.
    let b = format!("{name}-b");
    create(&pods, pod(&b, &name, KT, 2, "sleep 1000", "")).await;
    assert_eq!(
        wait_rejected(&pods, &b).await,
        format!(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for {KT}. Requested: 2, Available: 1, which is unexpected"
        )
    );

    // The built-in source's devices in the pod resources API too.
    let pr_socket = k.dir.path().join("pod-resources/kubelet.sock");
    let kt0 = dev.join("kt0").display().to_string();
    let listed = pod_resources(&pr_socket).await;
    assert!(
        listed.contains(&(a.clone(), "c".into(), KT.into(), vec![kt0])),
        "{listed:?}"
    );

    // Hot plug and unplug, timed (printed, not asserted): to kinglet's own
    // view (the pod resources API, polled every 5 ms) and to the Node's
    // allocatable in the API server (polled every 20 ms).
    let plugged = std::time::Instant::now();
    loops[0].mknod(&dev.join("kt2"));
    wait_allocatable_every(&pr_socket, KT, 3, Duration::from_millis(5)).await;
    let seen = plugged.elapsed();
    wait_node_every(&nodes, &name, KT, "3", Duration::from_millis(20)).await;
    println!(
        "figure: device node made → kinglet's allocatable {} ms, → the Node's allocatable {} ms ({rt:?})",
        seen.as_millis(),
        plugged.elapsed().as_millis()
    );
    wait_devices(&nodes, &name, KT, ("3", "3")).await;
    std::fs::remove_file(dev.join("kt2")).unwrap();
    wait_devices(&nodes, &name, KT, ("2", "2")).await;

    // A restart keeps a's device (its container runs on): the next pod gets
    // the other one.
    let _ = k.terminate(Duration::from_secs(10));
    k.spawn();
    wait_devices(&nodes, &name, KT, ("2", "2")).await;
    let c = format!("{name}-c");
    let script = "ls /dev; test -b /dev/kt1 && echo x > /dev/kt1 && echo wrote-kt1; sleep 1000";
    create(&pods, pod(&c, &name, KT, 1, script, "")).await;
    let log = wait_log(&k, &c, "wrote-kt1").await;
    assert!(!log.contains("kt0"), "{log}");
    let again = wait_running(&pods, &a).await;
    assert_eq!(
        container_id(&again),
        container_id(&first),
        "a ran on through the restart"
    );

    // a's end frees kt0 for the next pod.
    delete(&pods, &a).await;
    let e = format!("{name}-e");
    let script = "ls /dev; test -b /dev/kt0 && echo x > /dev/kt0 && echo wrote-kt0; sleep 1000";
    create(&pods, pod(&e, &name, KT, 1, script, "")).await;
    let log = wait_log(&k, &e, "wrote-kt0").await;
    assert!(!log.contains("kt1"), "{log}");
    for p in [&n, &b, &c, &e] {
        delete(&pods, p).await;
    }
}

/// The sample plugin as a pod on `node`, its device-plugin dir `dir`
/// mounted where the plugin expects upstream's; with `cdi`, it writes its
/// CDI spec there (mounted at `/var/run/cdi`) and answers with CDI names.
fn plugin_pod(name: &str, node: &str, dir: &Path, cdi: Option<&Path>) -> Pod {
    let (cdi_env, cdi_mount, cdi_volume) = match cdi {
        Some(c) => (
            ", {name: CDI_ENABLED, value: '1'}".to_string(),
            ", {name: cdi, mountPath: /var/run/cdi}".to_string(),
            format!(", {{name: cdi, hostPath: {{path: {}}}}}", c.display()),
        ),
        None => Default::default(),
    };
    from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: plugin
    image: kinglet.test/sample-device-plugin:1.8.0
    imagePullPolicy: Never
    env: [{{name: PLUGIN_SOCK_DIR, value: /var/lib/kubelet/device-plugins}}{cdi_env}]
    volumeMounts: [{{name: dp, mountPath: /var/lib/kubelet/device-plugins}}{cdi_mount}]
  volumes: [{{name: dp, hostPath: {{path: {}}}}}{cdi_volume}]
",
        dir.display()
    ))
}

/// A client of the pod resources API on `socket`, once it is there.
async fn pod_resources_client(
    socket: &Path,
) -> Option<
    kinglet::devices::podresources::api::pod_resources_lister_client::PodResourcesListerClient<
        tonic::transport::Channel,
    >,
> {
    use kinglet::devices::podresources::api;
    let path = socket.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .ok()?;
    Some(api::pod_resources_lister_client::PodResourcesListerClient::new(channel))
}

/// Waits for the node's own view (the pod resources API's
/// `GetAllocatableResources`) to have `n` healthy devices of `resource`:
/// after a restart the Node object still shows the old figures.
async fn wait_allocatable(socket: &Path, resource: &str, n: usize) {
    wait_allocatable_every(socket, resource, n, Duration::from_millis(100)).await
}

/// As [`wait_allocatable`], asking every `every`.
async fn wait_allocatable_every(socket: &Path, resource: &str, n: usize, every: Duration) {
    use kinglet::devices::podresources::api;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut client = None;
    while std::time::Instant::now() < deadline {
        if client.is_none() {
            client = pod_resources_client(socket).await;
        }
        if let Some(c) = client.as_mut() {
            let req = api::AllocatableResourcesRequest {};
            if let Ok(got) = c.get_allocatable_resources(req).await {
                let got = got.into_inner();
                let count = got
                    .devices
                    .iter()
                    .filter(|d| d.resource_name == resource)
                    .count();
                if count == n {
                    return;
                }
            }
        }
        tokio::time::sleep(every).await;
    }
    panic!("timed out waiting for {n} of {resource} in GetAllocatableResources");
}

/// Waits for the Node's allocatable `resource` to be `want`, asking the
/// API server every `every`.
async fn wait_node_every(
    nodes: &Api<Node>,
    node: &str,
    resource: &str,
    want: &str,
    every: Duration,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let alloc = nodes
            .get(node)
            .await
            .ok()
            .and_then(|n| n.status?.allocatable);
        if alloc
            .and_then(|a| a.get(resource).map(|q| q.0.clone()))
            .as_deref()
            == Some(want)
        {
            return;
        }
        tokio::time::sleep(every).await;
    }
    panic!("timed out waiting for {resource} {want} on the Node");
}

/// When kinglet logged its last line holding `marker` (its log's
/// timestamps are UTC, RFC 3339).
fn logged_at(k: &Kinglet, marker: &str) -> Option<jiff::Timestamp> {
    let log = std::fs::read_to_string(k.dir.path().join("kinglet.log")).ok()?;
    let line = log.lines().rev().find(|l| l.contains(marker))?;
    line.split_whitespace().next()?.parse().ok()
}

/// kinglet's own resident memory (`VmRSS`), KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or_default();
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The pod resources API's `List` on `socket`: (pod, container,
/// resource, device IDs).
async fn pod_resources(socket: &Path) -> Vec<(String, String, String, Vec<String>)> {
    use kinglet::devices::podresources::api;
    let mut client = pod_resources_client(socket)
        .await
        .expect("pod resources socket");
    let list = client
        .list(api::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    for p in list.pod_resources {
        for c in p.containers {
            for d in c.devices {
                out.push((
                    p.name.clone(),
                    c.name.clone(),
                    d.resource_name,
                    d.device_ids,
                ));
            }
        }
    }
    out
}

/// A node joined on `rt` with the sample plugin running as a pod (writing
/// its CDI spec with `cdi`), once its two devices are allocatable.
struct PluginNode {
    k: Kinglet,
    name: String,
    nodes: Api<Node>,
    pods: Api<Pod>,
    plugin: String,
}

impl PluginNode {
    async fn start(rt: Rt, prefix: &str, cdi: bool) -> PluginNode {
        let admin = admin().await;
        let name = unique_name(prefix);
        let images = [
            common::pods::busybox_archive(),
            common::pods::sample_device_plugin_archive(),
        ];
        let k = Kinglet::start_rt(rt, &name, FAST_CONFIG, true, &[], &images);
        let cdi_dir = k.dir.path().join("cdi");
        std::fs::create_dir_all(&cdi_dir).unwrap();
        let nodes: Api<Node> = Api::all(admin.clone());
        wait_ready(&nodes, &name, Duration::from_secs(20)).await;
        let pods: Api<Pod> = Api::namespaced(admin, "default");
        let plugin = format!("{name}-plugin");
        let node = PluginNode {
            k,
            name,
            nodes,
            pods,
            plugin,
        };
        node.start_plugin(cdi.then_some(cdi_dir.as_path())).await;
        node
    }

    async fn start_plugin(&self, cdi: Option<&Path>) {
        let dp_dir = self.k.dir.path().join("device-plugins");
        create(
            &self.pods,
            plugin_pod(&self.plugin, &self.name, &dp_dir, cdi),
        )
        .await;
        wait_devices(&self.nodes, &self.name, SAMPLE, ("2", "2")).await;
    }
}

async fn a_device_plugin_serves_pods(rt: Rt) {
    let PluginNode {
        mut k,
        name,
        nodes,
        pods,
        plugin,
    } = PluginNode::start(rt, "kl-dp", false).await;
    let pr_socket = k.dir.path().join("pod-resources/kubelet.sock");

    // The plugin's Allocate mounts /tmp/<device> into the pod.
    let script = "ls -d /tmp/Dev-* && echo mounted; sleep 1000";
    let a = format!("{name}-a");
    create(&pods, pod(&a, &name, SAMPLE, 1, script, "")).await;
    let first = wait_running(&pods, &a).await;
    let log = wait_log(&k, &a, "mounted").await;
    let dev_a = if log.contains("/tmp/Dev-1") {
        "Dev-1"
    } else {
        "Dev-2"
    };
    assert!(log.contains(&format!("/tmp/{dev_a}")), "{log}");
    let listed = pod_resources(&pr_socket).await;
    assert!(
        listed.contains(&(
            a.clone(),
            "c".into(),
            SAMPLE.into(),
            vec![dev_a.to_string()]
        )),
        "{listed:?}"
    );
    let b = format!("{name}-b");
    create(&pods, pod(&b, &name, SAMPLE, 2, "sleep 1000", "")).await;
    assert!(
        wait_rejected(&pods, &b)
            .await
            .contains("Requested: 2, Available: 1")
    );

    // A restart: the plugin registers again, a keeps its device, the next
    // pod gets the other.
    let _ = k.terminate(Duration::from_secs(10));
    k.spawn();
    wait_allocatable(&pr_socket, SAMPLE, 2).await;
    println!(
        "figure: kinglet's RSS (this test's debug build) with a device plugin and a pod holding a device: {} KiB ({rt:?})",
        rss_kib(k.pid())
    );
    let again = wait_running(&pods, &a).await;
    assert_eq!(
        container_id(&again),
        container_id(&first),
        "a ran on through the restart"
    );
    let c = format!("{name}-c");
    create(&pods, pod(&c, &name, SAMPLE, 1, script, "")).await;
    let log = wait_log(&k, &c, "mounted").await;
    assert!(!log.contains(&format!("/tmp/{dev_a}")), "{log}");

    // The plugin goes: its devices stay but are unhealthy; back, healthy.
    delete(&pods, &plugin).await;
    wait_devices(&nodes, &name, SAMPLE, ("2", "0")).await;
    // Back: registration (kinglet's log line) → the Node's allocatable
    // from 0 to 2, polled every 20 ms: printed, not asserted.
    let dp_dir = k.dir.path().join("device-plugins");
    create(&pods, plugin_pod(&plugin, &name, &dp_dir, None)).await;
    wait_node_every(&nodes, &name, SAMPLE, "2", Duration::from_millis(20)).await;
    let now = jiff::Timestamp::now();
    if let Some(registered) = logged_at(&k, "device plugin registered") {
        let ms = now.duration_since(registered).as_millis();
        println!("figure: device plugin registered → the Node's allocatable {ms} ms ({rt:?})");
    }
    wait_devices(&nodes, &name, SAMPLE, ("2", "2")).await;
    for p in [&a, &b, &c, &plugin] {
        delete(&pods, p).await;
    }
    // What the plugin's mounts made on the host (as containerd makes a
    // missing mount source); empty, and the other runtime's test may
    // still use them, so only empty ones go.
    for d in ["/tmp/Dev-1", "/tmp/Dev-2"] {
        let _ = std::fs::remove_dir(d);
    }
}

async fn a_plugins_cdi_devices_are_injected(rt: Rt) {
    let PluginNode {
        k,
        name,
        pods,
        plugin,
        ..
    } = PluginNode::start(rt, "kl-cdi", true).await;
    // The plugin answers with `example.com/resource=CDI-Dev-N`; its spec
    // gives the env and a block device node at /tmp/CDI-Dev-N.
    let script = "echo dev=$CDI_DEVICE; if test -b /tmp/$CDI_DEVICE; then echo node-ok; else echo node-missing; fi; sleep 1000";
    let a = format!("{name}-a");
    create(&pods, pod(&a, &name, SAMPLE, 1, script, "")).await;
    let log = wait_log_any(&k, &a, &["node-ok", "node-missing"]).await;
    assert!(
        log.contains("node-ok") && log.contains("dev=CDI-Dev-"),
        "{log}"
    );
    for p in [&a, &plugin] {
        delete(&pods, p).await;
    }
    for d in ["/tmp/Dev-1", "/tmp/Dev-2"] {
        let _ = std::fs::remove_dir(d);
    }
}
