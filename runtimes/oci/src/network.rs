//! Pod networking through CNI (spec 1.0): a network namespace per pod
//! sandbox, the plugins of the first conflist in the config dir run with
//! ADD/DEL (each plugin's result handed to the next as `prevResult`), the
//! result cached on disk so DEL works after a restart, and the loopback
//! interface brought up as containerd does. Plugins are exec'd, never
//! forked from kinglet; the namespace is made by a fresh `kinglet netns`
//! process.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// The conflist kinglet installs when the config dir has none: a bridge
/// with host-local addresses, port mappings, for a single node.
pub fn default_conflist(bridge: &str, subnet: &str, data_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "kinglet",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": data_dir}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
}

#[derive(Debug, thiserror::Error)]
#[error("cni: {0}")]
pub struct CniError(pub String);

/// Where CNI configuration and plugins are.
#[derive(Clone, Debug)]
pub struct Cni {
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
    /// Results of ADD, kept for DEL.
    pub cache_dir: PathBuf,
}

/// One sandbox's attachment: container ID, namespace file, pod.
struct Target<'a> {
    id: &'a str,
    netns: &'a Path,
    pod: &'a PodRef,
}

/// Pod identity for `CNI_ARGS`.
#[derive(Clone, Debug, Default)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Cni {
    /// The first network configuration (`*.conflist`, or a single-plugin
    /// `*.conf`/`*.json`), by file name, as the kubelet picks it.
    pub fn conflist(&self) -> Result<Value, CniError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.conf_dir)
            .map_err(|e| CniError(format!("{}: {e}", self.conf_dir.display())))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "conflist" || x == "conf" || x == "json")
            })
            .collect();
        files.sort();
        let f = files.first().ok_or_else(|| {
            CniError(format!(
                "no network config found in {}",
                self.conf_dir.display()
            ))
        })?;
        let v: Value = serde_json::from_slice(
            &std::fs::read(f).map_err(|e| CniError(format!("{}: {e}", f.display())))?,
        )
        .map_err(|e| CniError(format!("{}: {e}", f.display())))?;
        if v.get("plugins").is_some() {
            Ok(v)
        } else {
            Ok(json!({"cniVersion": v["cniVersion"], "name": v["name"], "plugins": [v]}))
        }
    }

    /// Installs the default conflist if the dir holds no config.
    pub fn install_default(&self, conflist: &Value) -> std::io::Result<bool> {
        if self.conflist().is_ok() {
            return Ok(false);
        }
        std::fs::create_dir_all(&self.conf_dir)?;
        let path = self.conf_dir.join("10-kinglet.conflist");
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(conflist).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, &path)?;
        Ok(true)
    }

    fn plugin(&self, kind: &str) -> Option<PathBuf> {
        self.bin_dirs
            .iter()
            .map(|d| d.join(kind))
            .find(|p| p.is_file())
    }

    /// `NetworkReady`: a config whose plugins are all installed.
    pub fn ready(&self) -> Result<(), CniError> {
        let c = self.conflist()?;
        for p in c["plugins"].as_array().cloned().unwrap_or_default() {
            let kind = p["type"].as_str().unwrap_or_default();
            if self.plugin(kind).is_none() {
                return Err(CniError(format!(
                    "plugin {kind:?} not found in {:?}",
                    self.bin_dirs
                )));
            }
        }
        if self.plugin("loopback").is_none() {
            return Err(CniError("plugin \"loopback\" not found".into()));
        }
        Ok(())
    }

    async fn exec(
        &self,
        kind: &str,
        command: &str,
        t: &Target<'_>,
        ifname: &str,
        conf: &Value,
    ) -> Result<Value, CniError> {
        let bin = self
            .plugin(kind)
            .ok_or_else(|| CniError(format!("plugin {kind:?} not found")))?;
        let path = self
            .bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            t.pod.namespace, t.pod.name, t.id, t.pod.uid
        );
        let mut child = tokio::process::Command::new(&bin)
            .env_clear()
            // Plugins run helpers (portmap runs iptables) from PATH.
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| {
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
                }),
            )
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", t.id)
            .env("CNI_NETNS", t.netns)
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", path)
            .env("CNI_ARGS", args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| CniError(format!("{}: {e}", bin.display())))?;
        let input = serde_json::to_vec(conf).map_err(|e| CniError(e.to_string()))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(&input).await;
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| CniError(e.to_string()))?;
        if !out.status.success() {
            let msg = serde_json::from_slice::<Value>(&out.stdout)
                .ok()
                .and_then(|v| {
                    v["msg"]
                        .as_str()
                        .map(|m| format!("{m} {}", v["details"].as_str().unwrap_or("")))
                })
                .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned());
            return Err(CniError(format!(
                "plugin {kind} {command} failed: {}",
                msg.trim()
            )));
        }
        if out.stdout.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&out.stdout)
            .map_err(|e| CniError(format!("plugin {kind}: bad result: {e}")))
    }

    fn plugin_conf(list: &Value, plugin: &Value, prev: &Value, port_mappings: &Value) -> Value {
        let mut c = plugin.clone();
        c["cniVersion"] = list["cniVersion"].clone();
        c["name"] = list["name"].clone();
        if !prev.is_null() {
            c["prevResult"] = prev.clone();
        }
        if plugin["capabilities"]["portMappings"].as_bool() == Some(true) {
            c["runtimeConfig"] = json!({"portMappings": port_mappings});
        }
        c
    }

    /// ADD: loopback, then the conflist's chain. Returns the pod IP.
    pub async fn add(
        &self,
        id: &str,
        netns: &Path,
        pod: &PodRef,
        port_mappings: &Value,
    ) -> Result<Option<String>, CniError> {
        let lo = json!({"cniVersion": "1.0.0", "name": "cni-loopback", "type": "loopback"});
        let t = Target { id, netns, pod };
        self.exec("loopback", "ADD", &t, "lo", &lo).await?;
        let list = self.conflist()?;
        let mut prev = Value::Null;
        for p in list["plugins"].as_array().cloned().unwrap_or_default() {
            let kind = p["type"].as_str().unwrap_or_default().to_string();
            let conf = Self::plugin_conf(&list, &p, &prev, port_mappings);
            prev = self.exec(&kind, "ADD", &t, "eth0", &conf).await?;
        }
        std::fs::create_dir_all(&self.cache_dir).map_err(|e| CniError(e.to_string()))?;
        let cache = json!({"list": list, "result": prev, "portMappings": port_mappings});
        // Whole or not at all: a torn cache would make DEL guess.
        crate::write_json_atomic(&self.cache_dir.join(format!("{id}.json")), &cache)
            .map_err(|e| CniError(e.to_string()))?;
        Ok(pod_ip(&prev))
    }

    /// DEL, in reverse order, with the cached ADD result; idempotent.
    pub async fn del(&self, id: &str, netns: &Path, pod: &PodRef) -> Result<(), CniError> {
        let cache_file = self.cache_dir.join(format!("{id}.json"));
        let cache: Value = std::fs::read(&cache_file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        let list = if cache["list"].is_null() {
            self.conflist()?
        } else {
            cache["list"].clone()
        };
        let mut plugins = list["plugins"].as_array().cloned().unwrap_or_default();
        plugins.reverse();
        for p in plugins {
            let kind = p["type"].as_str().unwrap_or_default().to_string();
            let conf = Self::plugin_conf(&list, &p, &cache["result"], &cache["portMappings"]);
            self.exec(&kind, "DEL", &Target { id, netns, pod }, "eth0", &conf)
                .await?;
        }
        let _ = std::fs::remove_file(cache_file);
        Ok(())
    }
}

/// The pod's IP in a CNI result (spec 1.0: `ips[].address` in CIDR form):
/// the first address, without its prefix length.
fn pod_ip(result: &Value) -> Option<String> {
    let address = result["ips"].as_array()?.first()?["address"].as_str()?;
    Some(address.split('/').next().unwrap_or(address).to_string())
}

/// The namespaces a pod's containers share, each bound to a file so that
/// they outlive any process (no pause container).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNamespaces {
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    /// With the pod's hostname set in it.
    pub uts: Option<(PathBuf, String)>,
}

impl PodNamespaces {
    /// The files bound, for teardown.
    pub fn files(&self) -> Vec<&Path> {
        [
            self.net.as_deref(),
            self.ipc.as_deref(),
            self.uts.as_ref().map(|(p, _)| p.as_path()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Why a pod's namespaces could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("{}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("unshare: {0}")]
    Unshare(std::io::Error),
    #[error("sethostname {hostname:?}: {source}")]
    Hostname {
        hostname: String,
        source: rustix::io::Errno,
    },
    #[error("bind mount {kind} namespace: {source}")]
    Bind {
        kind: &'static str,
        source: rustix::io::Errno,
    },
}

/// Makes the pod's namespaces and binds them to their files (run in a
/// fresh, single-threaded `kinglet netns` process: unshare affects the
/// calling thread's process only when it has no other threads).
pub fn create_namespaces(ns: &PodNamespaces) -> Result<(), NamespaceError> {
    let mut flags = 0;
    let mut binds: Vec<(&str, &Path)> = Vec::new();
    if let Some(p) = &ns.net {
        flags |= libc::CLONE_NEWNET;
        binds.push(("net", p));
    }
    if let Some(p) = &ns.ipc {
        flags |= libc::CLONE_NEWIPC;
        binds.push(("ipc", p));
    }
    if let Some((p, _)) = &ns.uts {
        flags |= libc::CLONE_NEWUTS;
        binds.push(("uts", p));
    }
    for (_, p) in &binds {
        std::fs::write(p, b"").map_err(|source| NamespaceError::File {
            path: p.to_path_buf(),
            source,
        })?;
    }
    // SAFETY: unshare in this single-threaded process; a plain syscall.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(NamespaceError::Unshare(std::io::Error::last_os_error()));
    }
    if let Some((_, hostname)) = &ns.uts {
        rustix::system::sethostname(hostname.as_bytes()).map_err(|source| {
            NamespaceError::Hostname {
                hostname: hostname.clone(),
                source,
            }
        })?;
    }
    for (kind, p) in binds {
        rustix::mount::mount_bind(format!("/proc/self/ns/{kind}").as_str(), p)
            .map_err(|source| NamespaceError::Bind { kind, source })?;
    }
    Ok(())
}

/// Whether `path` still holds a namespace (a bind mount of an nsfs file):
/// a reboot or an unmount leaves a plain empty file behind.
pub fn is_namespace(path: &Path) -> bool {
    const NSFS_MAGIC: u64 = 0x6e73_6673;
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type as u64 == NSFS_MAGIC)
}

/// Unmounts and removes a namespace file.
pub fn remove_netns(path: &Path) {
    let _ = rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH);
    let _ = std::fs::remove_file(path);
}

/// Connects to `port` on the loopback of the network namespace at
/// `netns` (the host's when `None`, a hostNetwork pod). A socket keeps
/// the namespace it was made in, so a short-lived thread of kinglet's
/// own enters the namespace, connects and ends: no fork, no helper
/// process, and no pooled thread left in a pod's namespace.
pub async fn connect_in(
    netns: Option<PathBuf>,
    port: u16,
) -> std::io::Result<tokio::net::TcpStream> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Some(netns) = netns else {
        return tokio::net::TcpStream::connect(addr).await;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kinglet-portfwd".into())
        .spawn(move || {
            let r = (|| {
                let f = std::fs::File::open(&netns)?;
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&f),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
                let s = std::net::TcpStream::connect_timeout(
                    &addr,
                    std::time::Duration::from_secs(10),
                )?;
                s.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(s)
            })();
            let _ = tx.send(r);
        })?;
    let s = rx
        .await
        .map_err(|_| std::io::Error::other("port-forward thread ended"))??;
    tokio::net::TcpStream::from_std(s)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A plugin that records its command and input in `dir/log` and
    /// `dir/<type>.<command>.json`, then answers `result` (or fails with a
    /// CNI error when `result` is `FAIL`).
    ///
    /// Tests that write or run plugins hold [`PLUGINS`]: a plugin written
    /// while another test forks could be inherited open for writing by the
    /// child until its exec, and running it then fails with ETXTBSY.
    fn fake_plugin(bin: &Path, kind: &str, result: &str) {
        let answer = if result == "FAIL" {
            "echo '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"no addresses left\",\"details\":\"in range\"}'; exit 1".to_string()
        } else {
            format!("echo '{result}'")
        };
        let script = format!(
            "#!/bin/sh\nd=$(dirname \"$0\")\necho \"$CNI_COMMAND {kind} $CNI_IFNAME $CNI_CONTAINERID\" >>\"$d/log\"\ncat >\"$d/{kind}.$CNI_COMMAND.json\"\n{answer}\n"
        );
        let p = bin.join(kind);
        std::fs::write(&p, script).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    static PLUGINS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    const BRIDGE_RESULT: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.88.0.7/16","gateway":"10.88.0.1"}]}"#;

    fn lab(bridge: &str) -> (tempfile::TempDir, Cni) {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        fake_plugin(&bin, "loopback", r#"{"cniVersion":"1.0.0"}"#);
        fake_plugin(&bin, "bridge", bridge);
        fake_plugin(&bin, "portmap", BRIDGE_RESULT);
        let cni = Cni {
            conf_dir: d.path().join("net.d"),
            bin_dirs: vec![d.path().join("missing"), bin],
            cache_dir: d.path().join("cache"),
        };
        let list = default_conflist("kl0", "10.88.0.0/16", &d.path().join("ipam"));
        assert!(cni.install_default(&list).unwrap());
        (d, cni)
    }

    fn read_json(p: &Path) -> Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    }

    #[test]
    fn the_first_config_by_name_is_used_and_a_single_plugin_is_listed() {
        let d = tempfile::tempdir().unwrap();
        let cni = Cni {
            conf_dir: d.path().to_path_buf(),
            bin_dirs: vec![],
            cache_dir: d.path().join("cache"),
        };
        assert!(cni.conflist().unwrap_err().0.contains("no network config"));
        std::fs::write(d.path().join("README"), "not a config").unwrap();
        std::fs::write(
            d.path().join("20-other.conflist"),
            r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        std::fs::write(
            d.path().join("10-single.conf"),
            r#"{"cniVersion":"0.4.0","name":"single","type":"ptp"}"#,
        )
        .unwrap();
        let list = cni.conflist().unwrap();
        assert_eq!(list["name"], "single");
        assert_eq!(list["cniVersion"], "0.4.0");
        assert_eq!(list["plugins"][0]["type"], "ptp");
        // A config is there: the default is not installed over it.
        assert!(!cni.install_default(&json!({})).unwrap());
        std::fs::write(d.path().join("05-broken.conflist"), "{").unwrap();
        assert!(cni.conflist().unwrap_err().0.contains("05-broken.conflist"));
    }

    #[tokio::test]
    async fn ready_needs_every_plugin_and_loopback() {
        let _plugins = PLUGINS.lock().await;
        let (d, cni) = lab(BRIDGE_RESULT);
        cni.ready().unwrap();
        std::fs::remove_file(d.path().join("bin/portmap")).unwrap();
        assert!(cni.ready().unwrap_err().0.contains("\"portmap\" not found"));
        fake_plugin(&d.path().join("bin"), "portmap", "{}");
        std::fs::remove_file(d.path().join("bin/loopback")).unwrap();
        assert!(cni.ready().unwrap_err().0.contains("loopback"));
    }

    #[test]
    fn a_result_gives_the_first_address_without_its_prefix() {
        assert_eq!(
            pod_ip(&serde_json::from_str(BRIDGE_RESULT).unwrap()).as_deref(),
            Some("10.88.0.7")
        );
        let v6 = json!({"ips": [{"address": "fd00::5/64"}, {"address": "10.0.0.2/24"}]});
        assert_eq!(pod_ip(&v6).as_deref(), Some("fd00::5"));
        assert_eq!(pod_ip(&json!({"ips": []})), None);
        assert_eq!(pod_ip(&json!({"ips": [{"address": 7}]})), None);
        assert_eq!(pod_ip(&Value::Null), None);
    }

    #[tokio::test]
    async fn add_chains_results_and_del_replays_the_cache_in_reverse() {
        let _plugins = PLUGINS.lock().await;
        let (d, cni) = lab(BRIDGE_RESULT);
        let pod = PodRef {
            namespace: "ns".into(),
            name: "web".into(),
            uid: "u1".into(),
        };
        let ports = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
        let netns = d.path().join("netns");
        let ip = cni.add("c1", &netns, &pod, &ports).await.unwrap();
        assert_eq!(ip.as_deref(), Some("10.88.0.7"));
        let bin = d.path().join("bin");
        // Each plugin got the list's name and version; portmap the
        // bridge's result and the port mappings it asks for.
        let bridge_in = read_json(&bin.join("bridge.ADD.json"));
        assert_eq!(bridge_in["name"], "kinglet");
        assert_eq!(bridge_in["cniVersion"], "1.0.0");
        assert!(bridge_in.get("prevResult").is_none());
        assert!(bridge_in.get("runtimeConfig").is_none());
        let portmap_in = read_json(&bin.join("portmap.ADD.json"));
        assert_eq!(
            portmap_in["prevResult"]["ips"][0]["address"],
            "10.88.0.7/16"
        );
        assert_eq!(portmap_in["runtimeConfig"]["portMappings"], ports);
        // DEL from a fresh Cni (a restart) after the config changed: the
        // cached list and result are what DEL gets, in reverse order.
        std::fs::remove_file(cni.conf_dir.join("10-kinglet.conflist")).unwrap();
        let again = cni.clone();
        again.del("c1", &netns, &pod).await.unwrap();
        let portmap_del = read_json(&bin.join("portmap.DEL.json"));
        assert_eq!(
            portmap_del["prevResult"]["ips"][0]["address"],
            "10.88.0.7/16"
        );
        assert_eq!(portmap_del["runtimeConfig"]["portMappings"], ports);
        let log = std::fs::read_to_string(bin.join("log")).unwrap();
        assert_eq!(
            log,
            "ADD loopback lo c1\nADD bridge eth0 c1\nADD portmap eth0 c1\nDEL portmap eth0 c1\nDEL bridge eth0 c1\n"
        );
        assert!(
            !cni.cache_dir.join("c1.json").exists(),
            "the cache outlived DEL"
        );
    }

    #[tokio::test]
    async fn a_failing_plugin_is_reported_with_its_cni_error() {
        let _plugins = PLUGINS.lock().await;
        let (d, cni) = lab("FAIL");
        let e = cni
            .add(
                "c2",
                &d.path().join("netns"),
                &PodRef::default(),
                &json!([]),
            )
            .await
            .unwrap_err();
        assert_eq!(e.0, "plugin bridge ADD failed: no addresses left in range");
        assert!(!cni.cache_dir.join("c2.json").exists());
    }
}
