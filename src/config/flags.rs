//! The command line. Flag names follow the upstream kubelet's; a flag given
//! on the command line overrides the same setting from `--config`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use super::{
    ConfigError, KubeletConfiguration, Taint, field_err, validate_label_value,
    validate_qualified_name,
};

/// The Kubernetes release whose kubelet behaviour and API kinglet implements
/// (the `k8s-openapi` feature and the test control plane are pinned to it).
pub const KUBERNETES_VERSION: &str = "v1.37.2";

/// `kinglet --version`.
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (Kubernetes v1.37.2 node agent)"
);

/// Which runtime runs the pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// In-process through youki's libcontainer; no container daemon.
    Oci,
    /// A CRI runtime (containerd) over its unix socket.
    Cri,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Operator commands; without one, kinglet runs as the node agent.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Manage the image store (safe while the agent runs).
    #[command(subcommand)]
    Images(ImagesCommand),
    /// List the pods this node runs (works while the agent runs or not).
    #[command(subcommand)]
    Pods(PodsCommand),
    /// Run the demo: a static pod from an image kinglet makes of itself,
    /// standalone and offline.
    Demo,
    /// The program inside the demo image.
    #[command(hide = true)]
    DemoApp,
    /// Make a pod's namespaces, each bound to a file (used by kinglet
    /// itself).
    #[command(hide = true)]
    Netns {
        #[arg(long, value_name = "PATH")]
        net: Option<PathBuf>,
        #[arg(long, value_name = "PATH")]
        ipc: Option<PathBuf>,
        #[arg(long, value_name = "PATH", requires = "hostname")]
        uts: Option<PathBuf>,
        #[arg(long)]
        hostname: Option<String>,
    },
    /// Replace this node's kinglet with FILE and restart into it; the
    /// previous binary is put back on its own if the new one does not
    /// stay healthy in time (pods keep running throughout).
    Upgrade(crate::upgrade::UpgradeArgs),
    /// Run by the service before each start, as the previous binary: rolls
    /// back an upgrade whose trial failed.
    #[command(hide = true)]
    UpgradeGuard,
    /// The container monitor (started by kinglet itself).
    #[command(hide = true)]
    Monitor {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum PodsCommand {
    /// Pods with their status, as `kubectl get pods` shows them.
    Ls,
}

#[derive(Debug, clap::Subcommand)]
pub enum ImagesCommand {
    /// Import OCI-layout or docker-save tarballs (plain, gzip or zstd).
    Import {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Pull an image from a registry.
    Pull {
        #[arg(value_name = "REF")]
        image: String,
        /// Registry credentials as USER:PASSWORD.
        #[arg(long, value_name = "USER:PASSWORD")]
        creds: Option<String>,
    },
    /// List images.
    Ls,
    /// Remove images by name, digest or ID.
    Rm {
        #[arg(required = true, value_name = "REF")]
        images: Vec<String>,
    },
}

/// kinglet: a kubelet for small machines.
#[derive(Debug, Parser)]
#[command(name = "kinglet", version = VERSION_LINE, about, max_term_width = 100)]
pub struct Flags {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// A directory of drop-ins (`*.conf`, each a KubeletConfiguration)
    /// merged over `--config` in lexical order, as upstream's.
    #[arg(long, value_name = "DIR")]
    pub config_dir: Option<PathBuf>,

    /// kubeconfig for the API server. Without it kinglet runs standalone.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// A kubeconfig with a bootstrap token: when --kubeconfig is missing
    /// or its client certificate has expired, a client certificate is
    /// requested with it (TLS bootstrap) and --kubeconfig written.
    #[arg(long, value_name = "FILE", requires = "kubeconfig")]
    pub bootstrap_kubeconfig: Option<PathBuf>,

    /// Node name instead of the hostname.
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,

    /// The node's InternalIP; by default the address the hostname resolves
    /// to, else the address of the interface holding the default route.
    #[arg(long, value_name = "IP")]
    pub node_ip: Option<std::net::IpAddr>,

    /// Labels added at registration: key=value,key=value.
    #[arg(long, value_name = "LABELS", value_delimiter = ',')]
    pub node_labels: Vec<String>,

    /// Taints added at registration: key[=value]:Effect,...
    #[arg(long, value_name = "TAINTS", value_delimiter = ',')]
    pub register_with_taints: Vec<String>,

    /// Directory for kinglet's state.
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        default_value = "/var/lib/kinglet"
    )]
    pub root_dir: PathBuf,

    /// Registry configuration (mirrors, plain HTTP, CAs, credentials).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        default_value = "/etc/kinglet/registries.yaml"
    )]
    pub image_registry_config: PathBuf,

    /// A CredentialProviderConfig file (kubelet.config.k8s.io/v1): the
    /// image credential provider plugins to run for matching images.
    #[arg(
        long,
        value_name = "FILE",
        requires = "image_credential_provider_bin_dir"
    )]
    pub image_credential_provider_config: Option<PathBuf>,

    /// The directory of the credential provider plugins' executables.
    #[arg(long, value_name = "DIR")]
    pub image_credential_provider_bin_dir: Option<PathBuf>,

    /// CNI network configuration directory; kinglet installs a default
    /// bridge conflist there if it holds none. Empty: pods use the host network.
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: String,

    /// CNI plugin directories, colon-separated.
    #[arg(long, value_name = "DIRS", default_value = "/opt/cni/bin:/usr/lib/cni")]
    pub cni_bin_dir: String,

    /// Where container logs are written, as `<ns>_<pod>_<uid>/<container>/<n>.log`.
    #[arg(long, value_name = "DIR", default_value = "/var/log/pods")]
    pub pod_log_dir: PathBuf,

    /// The most one image layer may unpack to (a quantity); a larger layer
    /// is refused.
    #[arg(long, global = true, value_name = "SIZE", default_value = "8Gi")]
    pub image_max_layer_size: String,

    /// The most one image layer may unpack to, as a multiple of its
    /// compressed size (past 64 MiB): a decompression bomb is refused.
    #[arg(long, global = true, value_name = "N", default_value_t = 100)]
    pub image_max_layer_ratio: u64,

    /// Directory watched for image archives to import [default: <root-dir>/images/import].
    #[arg(long, value_name = "DIR")]
    pub image_import_dir: Option<PathBuf>,

    /// Connections the kubelet API and the read-only port each hold at
    /// most (kinglet's own; upstream's kubelet has no limit). More wait in
    /// the kernel's backlog until one ends.
    #[arg(long, value_name = "N", default_value_t = crate::server::listener::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// kinglet's built-in device classes (device nodes by path offered as
    /// extended resources); a missing file declares none.
    #[arg(long, value_name = "FILE", default_value = "/etc/kinglet/devices.yaml")]
    pub device_config: PathBuf,

    /// Where device plugins register (`kubelet.sock`) and serve their
    /// sockets: upstream's path, which plugins hard-code.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/device-plugins"
    )]
    pub device_plugin_dir: PathBuf,

    /// Where the pod resources API listens (`kubelet.sock`): upstream's
    /// path, which monitoring agents hard-code.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/pod-resources"
    )]
    pub pod_resources_dir: PathBuf,

    /// Where the in-process runtime finds CDI specs, colon-separated,
    /// lowest priority first (containerd's `cdi_spec_dirs`).
    #[arg(long, value_name = "DIRS", default_value = "/etc/cdi:/var/run/cdi")]
    pub cdi_spec_dirs: String,

    /// Container runtime.
    #[arg(long, value_enum, default_value_t = RuntimeKind::Oci)]
    pub runtime: RuntimeKind,

    /// CRI endpoint for --runtime cri, e.g. unix:///run/containerd/containerd.sock.
    #[arg(long, value_name = "URL")]
    pub container_runtime_endpoint: Option<String>,

    /// Directory of static pod manifests (overrides staticPodPath).
    #[arg(long, value_name = "DIR")]
    pub pod_manifest_path: Option<String>,

    /// Log verbosity as klog counts it: 0-1 info, 2-4 debug, 5+ trace.
    #[arg(long = "v", short = 'v', value_name = "N")]
    pub verbosity: Option<u32>,

    /// Log format (overrides logging.format).
    #[arg(long, value_enum)]
    pub logging_format: Option<LogFormat>,
}

/// Everything kinglet runs with: the merged configuration plus settings that
/// exist only as flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub config: KubeletConfiguration,
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub node_name: String,
    pub node_ip: Option<std::net::IpAddr>,
    pub node_labels: BTreeMap<String, String>,
    pub root_dir: PathBuf,
    pub runtime: RuntimeKind,
    pub registry_config: PathBuf,
    /// `--image-credential-provider-config` and its bin dir.
    pub credential_providers: Option<(PathBuf, PathBuf)>,
    pub import_dir: PathBuf,
    pub pod_log_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub cni_bin_dirs: Vec<PathBuf>,
    pub image_limits: ImageLimits,
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--device-config`, read and checked.
    pub device_classes: crate::devices::builtin::DeviceConfig,
    pub device_plugin_dir: PathBuf,
    pub pod_resources_dir: PathBuf,
    /// `--cdi-spec-dirs`.
    pub cdi_spec_dirs: Vec<PathBuf>,
}

impl Flags {
    /// Merges the flags over the config file (if any) and validates the
    /// result. `hostname` supplies the default node name.
    pub fn settings(
        &self,
        hostname: impl FnOnce() -> String,
        warn: &mut dyn FnMut(String),
    ) -> Result<Settings, ConfigError> {
        let config = self.config_with_flags(warn)?;
        let node_labels = self.node_labels()?;
        let node_name = match &self.hostname_override {
            Some(n) => n.trim().to_lowercase(),
            None => hostname().trim().to_lowercase(),
        };
        validate_node_name(&node_name)?;

        if self.runtime == RuntimeKind::Cri && config.container_runtime_endpoint.is_empty() {
            return Err(field_err(
                "--container-runtime-endpoint",
                "--runtime cri needs the CRI socket, e.g. unix:///run/containerd/containerd.sock",
            ));
        }
        if !self.root_dir.is_absolute() {
            return Err(field_err("--root-dir", "must be an absolute path"));
        }
        for (flag, dir) in [
            ("--device-plugin-dir", &self.device_plugin_dir),
            ("--pod-resources-dir", &self.pod_resources_dir),
        ] {
            if !dir.is_absolute() {
                return Err(field_err(flag, "must be an absolute path"));
            }
        }
        let device_classes = crate::devices::builtin::DeviceConfig::load(&self.device_config)
            .map_err(|e| field_err("--device-config", e))?;
        let reserve = match config.eviction_thresholds()?.hard.get("imagefs.available") {
            Some(super::ThresholdValue::Percent(p)) => (p * 100.0).round() as u64,
            Some(super::ThresholdValue::Quantity(_)) | None => 0,
        };
        Ok(Settings {
            config,
            kubeconfig: self.kubeconfig.clone(),
            bootstrap_kubeconfig: self.bootstrap_kubeconfig.clone(),
            node_name,
            node_ip: self.node_ip,
            node_labels,
            root_dir: self.root_dir.clone(),
            runtime: self.runtime,
            registry_config: self.image_registry_config.clone(),
            credential_providers: self
                .image_credential_provider_config
                .clone()
                .zip(self.image_credential_provider_bin_dir.clone()),
            pod_log_dir: self.pod_log_dir.clone(),
            max_connections: self.max_connections,
            device_classes,
            device_plugin_dir: self.device_plugin_dir.clone(),
            pod_resources_dir: self.pod_resources_dir.clone(),
            cdi_spec_dirs: self
                .cdi_spec_dirs
                .split(':')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .collect(),
            cni_conf_dir: PathBuf::from(&self.cni_conf_dir),
            cni_bin_dirs: self
                .cni_bin_dir
                .split(':')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .collect(),
            import_dir: self
                .image_import_dir
                .clone()
                .unwrap_or_else(|| self.root_dir.join("images/import")),
            image_limits: self.image_limits(reserve)?,
        })
    }

    /// The config file (if any) with the flags that override its fields,
    /// validated.
    fn config_with_flags(
        &self,
        warn: &mut dyn FnMut(String),
    ) -> Result<KubeletConfiguration, ConfigError> {
        let mut config = match &self.config {
            Some(path) => super::load_file(path, &mut *warn)?,
            None => KubeletConfiguration::default(),
        };
        if let Some(dir) = &self.config_dir {
            config = super::dropin::merge(config, dir, &mut *warn)?;
        }
        if let Some(p) = &self.pod_manifest_path {
            config.static_pod_path = p.clone();
        }
        if let Some(e) = &self.container_runtime_endpoint {
            config.container_runtime_endpoint = e.clone();
        }
        if let Some(v) = self.verbosity {
            config.logging.verbosity = v;
        }
        if let Some(f) = self.logging_format {
            config.logging.format = match f {
                LogFormat::Text => "text".into(),
                LogFormat::Json => "json".into(),
            };
        }
        if !self.register_with_taints.is_empty() {
            config.register_with_taints = self
                .register_with_taints
                .iter()
                .map(|t| Taint::parse(t).map_err(|e| field_err("--register-with-taints", e)))
                .collect::<Result<_, _>>()?;
        }
        config.validate()?;
        Ok(config)
    }

    /// `--node-labels`, each a valid `key=value`.
    fn node_labels(&self) -> Result<BTreeMap<String, String>, ConfigError> {
        let mut node_labels = BTreeMap::new();
        for l in &self.node_labels {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| field_err("--node-labels", format!("{l:?} must be key=value")))?;
            validate_qualified_name(k)
                .and_then(|_| validate_label_value(v))
                .map_err(|e| field_err("--node-labels", format!("{l:?}: {e}")))?;
            node_labels.insert(k.to_string(), v.to_string());
        }
        Ok(node_labels)
    }

    /// The layer limits the flags set, keeping `reserve_percent` of the
    /// image filesystem free.
    pub fn image_limits(&self, reserve_percent: u64) -> Result<ImageLimits, ConfigError> {
        let size = super::parse_quantity(&self.image_max_layer_size)
            .map_err(|e| field_err("--image-max-layer-size", e))?;
        if self.image_max_layer_ratio == 0 {
            return Err(field_err("--image-max-layer-ratio", "must be at least 1"));
        }
        Ok(ImageLimits {
            max_layer_bytes: size,
            max_ratio: self.image_max_layer_ratio,
            reserve_percent,
        })
    }
}

/// What one image layer may unpack to (see `--image-max-layer-size`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageLimits {
    pub max_layer_bytes: u64,
    pub max_ratio: u64,
    /// Percent of the image filesystem kept free: the `imagefs.available`
    /// hard eviction threshold when it is a percentage.
    pub reserve_percent: u64,
}

/// A node name must be a DNS subdomain (RFC 1123), as the API server demands.
fn validate_node_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(field_err(
            "--hostname-override",
            format!("node name {name:?} is not a valid DNS subdomain"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Result<Settings, ConfigError> {
        let mut argv = vec!["kinglet"];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv)
            .unwrap()
            .settings(|| "Edge-Box".into(), &mut |_| {})
    }

    #[test]
    fn defaults_without_a_file() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.node_name, "edge-box");
        assert_eq!(s.root_dir, PathBuf::from("/var/lib/kinglet"));
        assert_eq!(s.runtime, RuntimeKind::Oci);
        assert_eq!(s.config, KubeletConfiguration::default());
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: /a\nmaxPods: 7\n",
        )
        .unwrap();
        let s = settings(&[
            "--config",
            path.to_str().unwrap(),
            "--pod-manifest-path",
            "/b",
            "--hostname-override",
            "pi-1",
            "--node-labels",
            "site=lab,example.com/tier=edge",
            "--register-with-taints",
            "edge=true:NoSchedule",
            "--runtime",
            "cri",
            "--container-runtime-endpoint",
            "unix:///run/containerd/containerd.sock",
            "--logging-format",
            "json",
        ])
        .unwrap();
        assert_eq!(s.config.static_pod_path, "/b");
        assert_eq!(s.config.max_pods, 7);
        assert_eq!(s.node_name, "pi-1");
        assert_eq!(s.node_labels["example.com/tier"], "edge");
        assert_eq!(s.config.register_with_taints[0].key, "edge");
        assert_eq!(s.config.logging.format, "json");
        assert_eq!(s.runtime, RuntimeKind::Cri);
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--node-labels", "novalue"], "--node-labels"),
            (&["--node-labels", "a=b c"], "--node-labels"),
            (&["--register-with-taints", "a=b"], "--register-with-taints"),
            (&["--hostname-override", "bad_name!"], "--hostname-override"),
            (&["--runtime", "cri"], "--container-runtime-endpoint"),
            (&["--root-dir", "relative"], "--root-dir"),
        ];
        for (args, field) in cases {
            let err = settings(args).unwrap_err().to_string();
            assert!(err.contains(field), "{args:?}: {err}");
        }
        assert!(Flags::try_parse_from(["kinglet", "--runtime", "docker"]).is_err());
    }

    #[test]
    fn missing_config_file_is_an_error() {
        let err = settings(&["--config", "/nonexistent/kinglet.yaml"]).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kinglet.yaml"));
    }

    #[test]
    fn version_matches_the_test_control_plane() {
        // The control plane the e2e tests build must be the release kinglet
        // claims to implement.
        let gomod = include_str!("../../tests/cluster/go.mod");
        assert!(gomod.contains(&format!("require k8s.io/kubernetes {KUBERNETES_VERSION}")));
        assert!(VERSION_LINE.contains(KUBERNETES_VERSION));
    }
}
