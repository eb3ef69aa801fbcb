//! kinglet's configuration: the upstream `KubeletConfiguration` file format
//! (`kubelet.config.k8s.io/v1beta1`) with upstream defaults, the command-line
//! flags that override it, and validation that names the offending field.
//!
//! Everything is checked here, before any API call, so that a bad config is
//! an exit with a message rather than a node that half works.

pub mod dropin;
pub mod flags;
pub mod units;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use units::{GoDuration, ThresholdValue, parse_quantity, parse_quantity_milli};

pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

/// A configuration problem, always naming the field it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid YAML or JSON: {message}")]
    Syntax { path: String, message: String },
    #[error("invalid value for field {field}: {message}")]
    Field { field: String, message: String },
    /// A file of `--config-dir`, or the dir itself.
    #[error("drop-in {path}: {source}")]
    DropIn {
        path: String,
        source: Box<ConfigError>,
    },
}

fn field_err(field: impl Into<String>, message: impl std::fmt::Display) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        message: message.to_string(),
    }
}

/// A label key or value, or a taint, that Kubernetes would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("prefix {0:?} must be a DNS subdomain")]
    Prefix(String),
    #[error("name part must not be empty")]
    EmptyName,
    #[error(
        "must be at most 63 characters, alphanumerics and '-', '_', '.' starting and ending with an alphanumeric"
    )]
    LabelValue,
    #[error("taint {0:?} must be key[=value]:Effect")]
    TaintSyntax(String),
    #[error("taint key {key:?}: {source}")]
    TaintKey { key: String, source: Box<NameError> },
    #[error("taint value {value:?}: {source}")]
    TaintValue {
        value: String,
        source: Box<NameError>,
    },
    #[error("taint effect {0:?} must be one of {effects}", effects = TAINT_EFFECTS.join(", "))]
    TaintEffect(String),
}

/// The eviction signals the upstream kubelet accepts.
pub const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// Upstream's hard eviction defaults, used when `evictionHard` is not set.
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// The TLS 1.2 suites kinglet can serve: upstream's (Go's) name, and
/// rustls's name of the same suite (Go's `_SHA256`-less ChaCha names are
/// aliases).
pub const TLS12_SUITES: &[(&str, &str)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// TLS 1.3 suites (always on, as in Go; listing them is allowed).
pub const TLS13_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// A `KubeletConfiguration`, with the fields kinglet implements. Field names,
/// value syntax and defaults are upstream's.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletConfiguration {
    pub api_version: String,
    pub kind: String,
    pub static_pod_path: String,
    pub sync_frequency: GoDuration,
    pub file_check_frequency: GoDuration,
    pub address: String,
    pub port: i32,
    pub read_only_port: i32,
    pub tls_cert_file: String,
    pub tls_private_key_file: String,
    /// TLS 1.2 suites the API serves (upstream's Go names); TLS 1.3's are
    /// always on, as in Go. Empty: every suite kinglet has.
    pub tls_cipher_suites: Vec<String>,
    /// `VersionTLS12` (and empty) or `VersionTLS13`.
    pub tls_min_version: String,
    pub rotate_certificates: bool,
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: bool,
    pub authentication: Authentication,
    pub authorization: Authorization,
    pub healthz_bind_address: String,
    pub healthz_port: i32,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    pub streaming_connection_idle_timeout: GoDuration,
    pub node_status_update_frequency: GoDuration,
    pub node_status_report_frequency: GoDuration,
    pub node_lease_duration_seconds: i32,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: GoDuration,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    pub cgroup_driver: String,
    pub cgroup_root: String,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    /// What node allocatable is enforced on: `pods` (the pods' cgroup gets
    /// capacity − reservations as its memory limit) or `none`.
    pub enforce_node_allocatable: Vec<String>,
    /// kinglet's own OOM score adjustment (upstream's -999: the agent is
    /// the last thing the kernel kills).
    pub oom_score_adj: i32,
    pub max_pods: i32,
    pub pod_pids_limit: i64,
    /// Image pulls one at a time (upstream's default), or in parallel,
    /// at most `maxParallelImagePulls` at once when that is set.
    pub serialize_image_pulls: bool,
    pub max_parallel_image_pulls: Option<i32>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub eviction_soft: BTreeMap<String, String>,
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    pub eviction_pressure_transition_period: GoDuration,
    pub eviction_max_pod_grace_period: i32,
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    pub system_reserved: BTreeMap<String, String>,
    pub kube_reserved: BTreeMap<String, String>,
    pub container_log_max_size: String,
    pub container_log_max_files: i32,
    pub container_runtime_endpoint: String,
    pub register_node: bool,
    pub register_with_taints: Vec<Taint>,
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Refuse to start while swap is on (upstream's default).
    pub fail_swap_on: bool,
    pub memory_swap: MemorySwap,
    pub logging: Logging,
}

/// `memorySwap`: how pods may use the node's swap.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct MemorySwap {
    /// `NoSwap` (also when empty) or `LimitedSwap`.
    pub swap_behavior: String,
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        KubeletConfiguration {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            static_pod_path: String::new(),
            sync_frequency: GoDuration::secs(60),
            file_check_frequency: GoDuration::secs(20),
            address: "0.0.0.0".into(),
            port: 10250,
            read_only_port: 0,
            tls_cert_file: String::new(),
            tls_private_key_file: String::new(),
            tls_cipher_suites: Vec::new(),
            tls_min_version: String::new(),
            rotate_certificates: false,
            server_tls_bootstrap: false,
            authentication: Authentication::default(),
            authorization: Authorization::default(),
            healthz_bind_address: "127.0.0.1".into(),
            healthz_port: 10248,
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            streaming_connection_idle_timeout: GoDuration::secs(4 * 3600),
            node_status_update_frequency: GoDuration::secs(10),
            node_status_report_frequency: GoDuration::secs(300),
            node_lease_duration_seconds: 40,
            image_minimum_gc_age: GoDuration::secs(120),
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            cgroup_driver: "cgroupfs".into(),
            cgroup_root: String::new(),
            cgroups_per_qos: true,
            enforce_node_allocatable: vec!["pods".into()],
            oom_score_adj: -999,
            max_pods: 110,
            pod_pids_limit: -1,
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            eviction_hard: None,
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_pressure_transition_period: GoDuration::secs(300),
            eviction_max_pod_grace_period: 0,
            eviction_minimum_reclaim: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            container_log_max_size: "10Mi".into(),
            container_log_max_files: 5,
            container_runtime_endpoint: String::new(),
            register_node: true,
            register_with_taints: Vec::new(),
            allowed_unsafe_sysctls: Vec::new(),
            fail_swap_on: true,
            memory_swap: MemorySwap::default(),
            logging: Logging::default(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Authentication {
    pub x509: X509Authentication,
    pub webhook: WebhookAuthentication,
    pub anonymous: AnonymousAuthentication,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct X509Authentication {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct WebhookAuthentication {
    pub enabled: bool,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: GoDuration,
}

impl Default for WebhookAuthentication {
    fn default() -> Self {
        WebhookAuthentication {
            enabled: true,
            cache_ttl: GoDuration::secs(120),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AnonymousAuthentication {
    pub enabled: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Authorization {
    pub mode: String,
    pub webhook: WebhookAuthorization,
}

impl Default for Authorization {
    fn default() -> Self {
        Authorization {
            mode: "Webhook".into(),
            webhook: WebhookAuthorization::default(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct WebhookAuthorization {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: GoDuration,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: GoDuration,
}

impl Default for WebhookAuthorization {
    fn default() -> Self {
        WebhookAuthorization {
            cache_authorized_ttl: GoDuration::secs(300),
            cache_unauthorized_ttl: GoDuration::secs(30),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Logging {
    pub format: String,
    pub verbosity: u32,
}

impl Default for Logging {
    fn default() -> Self {
        Logging {
            format: "text".into(),
            verbosity: 0,
        }
    }
}

/// A node taint as `registerWithTaints` and `--register-with-taints` give it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct Taint {
    pub key: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub value: String,
    pub effect: String,
}

/// The smallest `containerLogMaxSize` taken.
const MIN_CONTAINER_LOG_MAX_SIZE: u64 = 1024;

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl Taint {
    /// Parses `key[=value]:Effect`, the `--register-with-taints` syntax.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let (kv, effect) = s
            .rsplit_once(':')
            .ok_or_else(|| NameError::TaintSyntax(s.into()))?;
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        let t = Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        };
        t.validate()?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), NameError> {
        validate_qualified_name(&self.key).map_err(|e| NameError::TaintKey {
            key: self.key.clone(),
            source: Box::new(e),
        })?;
        if !self.value.is_empty() {
            validate_label_value(&self.value).map_err(|e| NameError::TaintValue {
                value: self.value.clone(),
                source: Box::new(e),
            })?;
        }
        if !TAINT_EFFECTS.contains(&self.effect.as_str()) {
            return Err(NameError::TaintEffect(self.effect.clone()));
        }
        Ok(())
    }
}

/// Checks a label or annotation key: `[prefix/]name`, prefix a DNS subdomain,
/// name at most 63 characters of alphanumerics, `-`, `_`, `.`.
pub fn validate_qualified_name(key: &str) -> Result<(), NameError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(NameError::Prefix(p.into()));
        }
    }
    if name.is_empty() {
        return Err(NameError::EmptyName);
    }
    validate_label_value(name)
}

/// Checks a label value: at most 63 characters, alphanumerics with `-`, `_`,
/// `.` inside.
pub fn validate_label_value(v: &str) -> Result<(), NameError> {
    let ok = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(NameError::LabelValue)
    }
}

/// Reads a config file. Unknown fields are passed to `warn` (upstream's
/// lenient decoding logs them too); every other problem is an error.
pub fn load_file(
    path: &Path,
    mut warn: impl FnMut(String),
) -> Result<KubeletConfiguration, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string(), &mut warn)
}

/// Parses config text (YAML or JSON) and validates it.
pub fn parse(
    text: &str,
    path: &str,
    warn: &mut dyn FnMut(String),
) -> Result<KubeletConfiguration, ConfigError> {
    let cfg = from_tree(&tree_of(text, path)?, path, warn)?;
    cfg.validate()?;
    Ok(cfg)
}

/// Config text (YAML or JSON) as a generic tree, so that the typed pass can
/// report the full path of a bad or unknown field, and drop-ins can be
/// merged as upstream merges them (JSON merge patches).
fn tree_of(text: &str, path: &str) -> Result<serde_json::Value, ConfigError> {
    let tree: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.into(),
            message: e.to_string(),
        })?
    };
    if !tree.is_object() {
        return Err(ConfigError::Syntax {
            path: path.into(),
            message: "the document must be a mapping".into(),
        });
    }
    Ok(tree)
}

/// The typed pass: every field checked (unknown ones passed to `warn`),
/// `apiVersion` and `kind` upstream's; not yet validated as a whole.
fn from_tree(
    tree: &serde_json::Value,
    path: &str,
    warn: &mut dyn FnMut(String),
) -> Result<KubeletConfiguration, ConfigError> {
    let mut unknown = Vec::new();
    let mut note_unknown = |p: serde_ignored::Path<'_>| unknown.push(p.to_string());
    let de = serde_ignored::Deserializer::new(tree, &mut note_unknown);
    let cfg: KubeletConfiguration = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let msg = e.into_inner().to_string();
        field_err(field, msg)
    })?;
    for u in unknown {
        warn(format!(
            "config file {path}: unknown or unsupported field {u:?} ignored"
        ));
    }
    if cfg.api_version != API_VERSION {
        return Err(field_err(
            "apiVersion",
            format!("{:?} is not {API_VERSION:?}", cfg.api_version),
        ));
    }
    if cfg.kind != KIND {
        return Err(field_err("kind", format!("{:?} is not {KIND:?}", cfg.kind)));
    }
    Ok(cfg)
}

/// Parsed eviction thresholds, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionThresholds {
    pub hard: BTreeMap<String, ThresholdValue>,
    pub soft: BTreeMap<String, (ThresholdValue, std::time::Duration)>,
    pub minimum_reclaim: BTreeMap<String, ThresholdValue>,
}

impl KubeletConfiguration {
    /// The hard thresholds in force: the configured ones, or upstream's
    /// defaults when `evictionHard` is not set (setting any entry replaces
    /// all defaults, as upstream).
    pub fn eviction_hard_effective(&self) -> BTreeMap<String, String> {
        match &self.eviction_hard {
            Some(m) => m.clone(),
            None => DEFAULT_EVICTION_HARD
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Parses and checks the eviction settings.
    pub fn eviction_thresholds(&self) -> Result<EvictionThresholds, ConfigError> {
        fn values(
            field: &str,
            m: &BTreeMap<String, String>,
        ) -> Result<BTreeMap<String, ThresholdValue>, ConfigError> {
            m.iter()
                .map(|(k, v)| {
                    if !EVICTION_SIGNALS.contains(&k.as_str()) {
                        return Err(field_err(
                            format!("{field}[{k}]"),
                            format!(
                                "unknown eviction signal; known: {}",
                                EVICTION_SIGNALS.join(", ")
                            ),
                        ));
                    }
                    let t = ThresholdValue::parse(v)
                        .map_err(|e| field_err(format!("{field}[{k}]"), e))?;
                    Ok((k.clone(), t))
                })
                .collect()
        }
        let hard = values("evictionHard", &self.eviction_hard_effective())?;
        let soft_values = values("evictionSoft", &self.eviction_soft)?;
        let minimum_reclaim = values("evictionMinimumReclaim", &self.eviction_minimum_reclaim)?;
        for k in self.eviction_soft_grace_period.keys() {
            if !self.eviction_soft.contains_key(k) {
                return Err(field_err(
                    format!("evictionSoftGracePeriod[{k}]"),
                    "grace period for a signal that has no evictionSoft threshold",
                ));
            }
        }
        let mut soft = BTreeMap::new();
        for (k, v) in soft_values {
            let field = format!("evictionSoftGracePeriod[{k}]");
            let grace = self.eviction_soft_grace_period.get(&k).ok_or_else(|| {
                field_err(
                    field.clone(),
                    format!("soft eviction threshold evictionSoft[{k}] needs a grace period"),
                )
            })?;
            let grace = units::parse_go_duration(grace).map_err(|e| field_err(field, e))?;
            soft.insert(k, (v, grace));
        }
        Ok(EvictionThresholds {
            hard,
            soft,
            minimum_reclaim,
        })
    }

    /// Checks every field's value; the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_network()?;
        self.validate_periods()?;
        self.validate_tls()?;
        self.validate_disk()?;
        self.validate_node()?;
        self.validate_resources()?;
        Ok(())
    }

    /// Ports, addresses and cluster DNS.
    fn validate_network(&self) -> Result<(), ConfigError> {
        let port = |field: &str, v: i32, zero_ok: bool| {
            if (zero_ok && v == 0) || (1..=65535).contains(&v) {
                Ok(())
            } else {
                Err(field_err(field, format!("{v} is not a valid port")))
            }
        };
        port("port", self.port, false)?;
        port("readOnlyPort", self.read_only_port, true)?;
        port("healthzPort", self.healthz_port, true)?;
        for (field, addr) in [
            ("address", &self.address),
            ("healthzBindAddress", &self.healthz_bind_address),
        ] {
            addr.parse::<IpAddr>()
                .map_err(|_| field_err(field, format!("{addr:?} is not an IP address")))?;
        }
        for (i, ip) in self.cluster_dns.iter().enumerate() {
            ip.parse::<IpAddr>().map_err(|_| {
                field_err(
                    format!("clusterDNS[{i}]"),
                    format!("{ip:?} is not an IP address"),
                )
            })?;
        }
        if !self.cluster_domain.is_empty()
            && validate_qualified_name(&format!("{}/x", self.cluster_domain)).is_err()
        {
            return Err(field_err(
                "clusterDomain",
                format!("{:?} is not a DNS domain", self.cluster_domain),
            ));
        }
        Ok(())
    }

    /// Counts, limits and periods that must be positive.
    fn validate_periods(&self) -> Result<(), ConfigError> {
        if self.max_pods <= 0 {
            return Err(field_err(
                "maxPods",
                format!("{} must be positive", self.max_pods),
            ));
        }
        if self.pod_pids_limit == 0 || self.pod_pids_limit < -1 {
            return Err(field_err(
                "podPidsLimit",
                format!("{} must be -1 (unlimited) or positive", self.pod_pids_limit),
            ));
        }
        self.validate_image_pulls()?;
        if self.node_lease_duration_seconds <= 0 {
            return Err(field_err(
                "nodeLeaseDurationSeconds",
                format!("{} must be positive", self.node_lease_duration_seconds),
            ));
        }
        for (field, d) in [
            (
                "nodeStatusUpdateFrequency",
                self.node_status_update_frequency,
            ),
            (
                "nodeStatusReportFrequency",
                self.node_status_report_frequency,
            ),
            ("syncFrequency", self.sync_frequency),
            ("fileCheckFrequency", self.file_check_frequency),
        ] {
            if d.0.is_zero() {
                return Err(field_err(field, "must be greater than 0"));
            }
        }
        Ok(())
    }

    /// `maxParallelImagePulls` as upstream validates it.
    fn validate_image_pulls(&self) -> Result<(), ConfigError> {
        match self.max_parallel_image_pulls {
            Some(n) if n < 1 => Err(field_err(
                "maxParallelImagePulls",
                format!("{n} must be a positive number"),
            )),
            Some(n) if n > 1 && self.serialize_image_pulls => Err(field_err(
                "maxParallelImagePulls",
                format!("{n} cannot be larger than 1 unless serializeImagePulls is set to false"),
            )),
            _ => Ok(()),
        }
    }

    /// How many image pulls may run at once; `None`: no limit.
    pub fn image_pull_slots(&self) -> Option<usize> {
        if self.serialize_image_pulls {
            return Some(1);
        }
        self.max_parallel_image_pulls
            .and_then(|n| usize::try_from(n).ok())
    }

    /// The kubelet API's TLS and streaming settings.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        for (i, s) in self.tls_cipher_suites.iter().enumerate() {
            if !TLS12_SUITES.iter().any(|(n, _)| n == s) && !TLS13_SUITES.contains(&s.as_str()) {
                return Err(field_err(
                    format!("tlsCipherSuites[{i}]"),
                    format!(
                        "{s:?} is not supported: kinglet serves only AEAD suites with forward secrecy ({})",
                        TLS12_SUITES
                            .iter()
                            .map(|(n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        if !matches!(
            self.tls_min_version.as_str(),
            "" | "VersionTLS12" | "VersionTLS13"
        ) {
            return Err(field_err(
                "tlsMinVersion",
                format!(
                    "{:?} is not supported: VersionTLS12 or VersionTLS13",
                    self.tls_min_version
                ),
            ));
        }
        if self.streaming_connection_idle_timeout.0.is_zero() {
            return Err(field_err(
                "streamingConnectionIdleTimeout",
                "must be greater than 0 (0 would keep idle streams open forever)",
            ));
        }
        Ok(())
    }

    /// Image GC thresholds and container log rotation.
    fn validate_disk(&self) -> Result<(), ConfigError> {
        let (hi, lo) = (
            self.image_gc_high_threshold_percent,
            self.image_gc_low_threshold_percent,
        );
        if !(0..=100).contains(&hi) {
            return Err(field_err(
                "imageGCHighThresholdPercent",
                format!("{hi} must be between 0 and 100"),
            ));
        }
        if !(0..=100).contains(&lo) {
            return Err(field_err(
                "imageGCLowThresholdPercent",
                format!("{lo} must be between 0 and 100"),
            ));
        }
        if lo > hi {
            return Err(field_err(
                "imageGCLowThresholdPercent",
                format!("{lo} must not exceed imageGCHighThresholdPercent ({hi})"),
            ));
        }
        Ok(())
    }

    /// The cgroup driver, authorization, reservations, taints, sysctls and
    /// logging.
    fn validate_node(&self) -> Result<(), ConfigError> {
        if !["cgroupfs", "systemd"].contains(&self.cgroup_driver.as_str()) {
            return Err(field_err(
                "cgroupDriver",
                format!(
                    "{:?} must be \"cgroupfs\" or \"systemd\"",
                    self.cgroup_driver
                ),
            ));
        }
        if !["Webhook", "AlwaysAllow"].contains(&self.authorization.mode.as_str()) {
            return Err(field_err(
                "authorization.mode",
                format!(
                    "{:?} must be \"Webhook\" or \"AlwaysAllow\"",
                    self.authorization.mode
                ),
            ));
        }
        let max_size = parse_quantity(&self.container_log_max_size)
            .map_err(|e| field_err("containerLogMaxSize", e))?;
        // Below a kibibyte nearly every line would rotate the file (upstream
        // takes any size; "0" or "1" is a typo, not a wish).
        if max_size < MIN_CONTAINER_LOG_MAX_SIZE {
            return Err(field_err(
                "containerLogMaxSize",
                format!("{:?} must be at least 1Ki", self.container_log_max_size),
            ));
        }
        if self.container_log_max_files < 2 {
            return Err(field_err(
                "containerLogMaxFiles",
                format!("{} must be at least 2", self.container_log_max_files),
            ));
        }
        if self.eviction_max_pod_grace_period < 0 {
            return Err(field_err(
                "evictionMaxPodGracePeriod",
                "must not be negative",
            ));
        }
        for (field, m) in [
            ("systemReserved", &self.system_reserved),
            ("kubeReserved", &self.kube_reserved),
        ] {
            for (k, v) in m {
                if !["cpu", "memory", "ephemeral-storage", "pid"].contains(&k.as_str()) {
                    return Err(field_err(format!("{field}[{k}]"), "unknown resource"));
                }
                parse_quantity(v).map_err(|e| field_err(format!("{field}[{k}]"), e))?;
            }
        }
        for (i, t) in self.register_with_taints.iter().enumerate() {
            t.validate()
                .map_err(|e| field_err(format!("registerWithTaints[{i}]"), e))?;
        }
        crate::pods::sysctls::Allowlist::new(&self.allowed_unsafe_sysctls)
            .map_err(|e| field_err("allowedUnsafeSysctls", e))?;
        if !["text", "json"].contains(&self.logging.format.as_str()) {
            return Err(field_err(
                "logging.format",
                format!("{:?} must be \"text\" or \"json\"", self.logging.format),
            ));
        }
        Ok(())
    }

    /// Eviction thresholds, the OOM score, node allocatable enforcement
    /// and the cgroup root.
    fn validate_resources(&self) -> Result<(), ConfigError> {
        self.eviction_thresholds()?;
        if !["", "NoSwap", "LimitedSwap"].contains(&self.memory_swap.swap_behavior.as_str()) {
            return Err(field_err(
                "memorySwap.swapBehavior",
                format!(
                    "{:?} is not NoSwap or LimitedSwap",
                    self.memory_swap.swap_behavior
                ),
            ));
        }
        if !(-1000..=1000).contains(&self.oom_score_adj) {
            return Err(field_err(
                "oomScoreAdj",
                format!("{} must be between -1000 and 1000", self.oom_score_adj),
            ));
        }
        for v in &self.enforce_node_allocatable {
            // system-reserved and kube-reserved need their cgroups named
            // (systemReservedCgroup, kubeReservedCgroup): not built.
            if !["pods", "none"].contains(&v.as_str()) {
                return Err(field_err(
                    "enforceNodeAllocatable",
                    format!("{v:?} is not supported (supported: \"pods\", \"none\")"),
                ));
            }
        }
        if !self.cgroup_root.is_empty() && !self.cgroup_root.starts_with('/')
            || self.cgroup_root.split('/').any(|c| c == "..")
        {
            return Err(field_err(
                "cgroupRoot",
                format!(
                    "{:?} must be an absolute cgroup path without \"..\"",
                    self.cgroup_root
                ),
            ));
        }
        Ok(())
    }

    /// The pods' cgroup relative to the cgroup mount:
    /// `<cgroupRoot>/kubepods`.
    pub fn pods_cgroup(&self) -> String {
        let root = self.cgroup_root.trim_matches('/');
        if root.is_empty() {
            "kubepods".into()
        } else {
            format!("{root}/kubepods")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> (KubeletConfiguration, Vec<String>) {
        let mut warnings = Vec::new();
        let cfg = parse(text, "test.yaml", &mut |w| warnings.push(w)).unwrap();
        (cfg, warnings)
    }

    fn parse_err(text: &str) -> String {
        parse(text, "test.yaml", &mut |_| {})
            .unwrap_err()
            .to_string()
    }

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    #[test]
    fn empty_file_gives_upstream_defaults() {
        let (cfg, w) = parse_ok(HEAD);
        assert!(w.is_empty());
        assert_eq!(cfg, KubeletConfiguration::default());
        assert_eq!(cfg.node_status_update_frequency, GoDuration::secs(10));
        assert_eq!(cfg.node_status_report_frequency, GoDuration::secs(300));
        assert_eq!(cfg.node_lease_duration_seconds, 40);
        assert_eq!(cfg.max_pods, 110);
        assert_eq!(cfg.healthz_port, 10248);
        assert_eq!(cfg.read_only_port, 0);
        assert!(!cfg.authentication.anonymous.enabled);
        assert_eq!(cfg.authorization.mode, "Webhook");
        let ev = cfg.eviction_thresholds().unwrap();
        assert_eq!(
            ev.hard["memory.available"],
            ThresholdValue::Quantity(100 << 20)
        );
        assert_eq!(ev.hard["nodefs.available"], ThresholdValue::Percent(0.10));
        assert_eq!(ev.hard["imagefs.available"], ThresholdValue::Percent(0.15));
        assert_eq!(ev.hard["nodefs.inodesFree"], ThresholdValue::Percent(0.05));
    }

    #[test]
    fn reads_every_implemented_field() {
        let (cfg, w) = parse_ok(&format!(
            "{HEAD}staticPodPath: /etc/kinglet/manifests
nodeStatusUpdateFrequency: 5s
nodeStatusReportFrequency: 1m
nodeLeaseDurationSeconds: 20
maxPods: 30
podPidsLimit: 1024
evictionHard:
  memory.available: 50Mi
evictionSoft:
  memory.available: 200Mi
evictionSoftGracePeriod:
  memory.available: 30s
evictionMinimumReclaim:
  memory.available: 20Mi
evictionPressureTransitionPeriod: 30s
imageGCHighThresholdPercent: 70
imageGCLowThresholdPercent: 60
containerLogMaxSize: 1Mi
containerLogMaxFiles: 3
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
cgroupDriver: systemd
authentication:
  x509: {{clientCAFile: /etc/kinglet/ca.crt}}
  anonymous: {{enabled: false}}
authorization: {{mode: Webhook}}
readOnlyPort: 0
rotateCertificates: true
serverTLSBootstrap: true
healthzBindAddress: 127.0.0.1
healthzPort: 10249
"
        ));
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(cfg.static_pod_path, "/etc/kinglet/manifests");
        assert_eq!(cfg.node_status_update_frequency, GoDuration::secs(5));
        assert_eq!(cfg.node_lease_duration_seconds, 20);
        assert_eq!(cfg.max_pods, 30);
        assert_eq!(cfg.pod_pids_limit, 1024);
        assert_eq!(cfg.cluster_dns, ["10.96.0.10"]);
        assert_eq!(
            cfg.authentication.x509.client_ca_file,
            "/etc/kinglet/ca.crt"
        );
        assert!(cfg.rotate_certificates);
        assert!(cfg.server_tls_bootstrap);
        assert_eq!(cfg.healthz_port, 10249);
        let ev = cfg.eviction_thresholds().unwrap();
        // Setting evictionHard replaces every default.
        assert_eq!(ev.hard.len(), 1);
        assert_eq!(
            ev.soft["memory.available"].1,
            std::time::Duration::from_secs(30)
        );
        assert_eq!(
            ev.minimum_reclaim["memory.available"],
            ThresholdValue::Quantity(20 << 20)
        );
    }

    #[test]
    fn image_pulls_are_serial_unless_asked() {
        let slots = |y: &str| parse_ok(&format!("{HEAD}{y}")).0.image_pull_slots();
        assert_eq!(slots(""), Some(1));
        assert_eq!(slots("serializeImagePulls: false\n"), None);
        assert_eq!(
            slots("serializeImagePulls: false\nmaxParallelImagePulls: 3\n"),
            Some(3)
        );
    }

    #[test]
    fn json_is_accepted_too() {
        let (cfg, _) = parse_ok(
            r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","maxPods":12}"#,
        );
        assert_eq!(cfg.max_pods, 12);
    }

    #[test]
    fn unknown_fields_warn_but_load() {
        let (cfg, w) = parse_ok(&format!(
            "{HEAD}maxPods: 10\ncpuManagerPolicy: static\nauthentication:\n  frobnicate: 1\n"
        ));
        assert_eq!(cfg.max_pods, 10);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("authentication.frobnicate")
                || w[1].contains("authentication.frobnicate")
        );
        assert!(w.iter().any(|m| m.contains("cpuManagerPolicy")));
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: &[(&str, &str)] = &[
            ("maxPods: lots", "maxPods"),
            ("maxPods: 0", "maxPods"),
            ("maxParallelImagePulls: 2", "maxParallelImagePulls"),
            (
                "serializeImagePulls: false\nmaxParallelImagePulls: 0",
                "maxParallelImagePulls",
            ),
            (
                "evictionHard: {memory.available: plenty}",
                "evictionHard[memory.available]",
            ),
            (
                "evictionHard: {memory.free: 1Gi}",
                "evictionHard[memory.free]",
            ),
            (
                "evictionSoft: {memory.available: 1Gi}",
                "evictionSoftGracePeriod[memory.available]",
            ),
            (
                "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: soon}",
                "evictionSoftGracePeriod[memory.available]",
            ),
            (
                "evictionSoftGracePeriod: {memory.available: 1m}",
                "evictionSoftGracePeriod[memory.available]",
            ),
            (
                "evictionMinimumReclaim: {nodefs.available: much}",
                "evictionMinimumReclaim[nodefs.available]",
            ),
            (
                "nodeStatusUpdateFrequency: often",
                "nodeStatusUpdateFrequency",
            ),
            ("nodeStatusReportFrequency: 0s", "nodeStatusReportFrequency"),
            ("nodeLeaseDurationSeconds: -1", "nodeLeaseDurationSeconds"),
            ("podPidsLimit: 0", "podPidsLimit"),
            (
                "imageGCHighThresholdPercent: 101",
                "imageGCHighThresholdPercent",
            ),
            (
                "imageGCLowThresholdPercent: 90",
                "imageGCLowThresholdPercent",
            ),
            ("containerLogMaxSize: huge", "containerLogMaxSize"),
            ("containerLogMaxSize: \"0\"", "containerLogMaxSize"),
            ("containerLogMaxSize: \"1\"", "containerLogMaxSize"),
            ("containerLogMaxFiles: 1", "containerLogMaxFiles"),
            ("clusterDNS: [not-an-ip]", "clusterDNS[0]"),
            ("clusterDomain: 'bad domain'", "clusterDomain"),
            ("cgroupDriver: openrc", "cgroupDriver"),
            ("authorization: {mode: Maybe}", "authorization.mode"),
            (
                "authentication: {anonymous: {enabled: perhaps}}",
                "authentication.anonymous.enabled",
            ),
            ("readOnlyPort: 70000", "readOnlyPort"),
            ("healthzPort: -2", "healthzPort"),
            ("healthzBindAddress: localhost", "healthzBindAddress"),
            (
                "streamingConnectionIdleTimeout: 0s",
                "streamingConnectionIdleTimeout",
            ),
            (
                "registerWithTaints: [{key: a, effect: Sometimes}]",
                "registerWithTaints[0]",
            ),
            ("kubeReserved: {memory: lots}", "kubeReserved[memory]"),
            ("logging: {format: xml}", "logging.format"),
        ];
        for (body, field) in cases {
            let err = parse_err(&format!("{HEAD}{body}\n"));
            assert!(
                err.contains(&format!("field {field}:")),
                "{body:?}: error {err:?} does not name {field}"
            );
        }
    }

    #[test]
    fn wrong_kind_or_version_is_refused() {
        assert!(parse_err("apiVersion: v1\nkind: KubeletConfiguration\n").contains("apiVersion"));
        assert!(
            parse_err("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n").contains("kind")
        );
        assert!(parse_err("- a\n- b\n").contains("mapping"));
        assert!(parse_err("{{{").contains("not valid YAML"));
    }

    #[test]
    fn taint_syntax() {
        let t = Taint::parse("dedicated=edge:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_str(), t.effect.as_str()),
            ("dedicated", "edge", "NoSchedule")
        );
        let t = Taint::parse("example.com/gpu:NoExecute").unwrap();
        assert_eq!(t.value, "");
        for bad in ["novalue", "a=b:Never", "=b:NoSchedule", "a b=c:NoSchedule"] {
            assert!(Taint::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// CIS Kubernetes benchmark, worker node, kubelet (4.2.x), on the
    /// config kinglet ships (`packaging/config.yaml`), read by the real
    /// parser. (4.1.x, the files' modes, is e2e_packaging's.)
    #[test]
    fn the_shipped_config_meets_the_cis_kubelet_items() {
        let text = include_str!("../../packaging/config.yaml");
        let mut w = Vec::new();
        let cfg = parse(text, "packaging/config.yaml", &mut |m| w.push(m)).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert!(
            !cfg.authentication.anonymous.enabled,
            "4.2.1 anonymous auth off"
        );
        assert_ne!(cfg.authorization.mode, "AlwaysAllow", "4.2.2 authorization");
        assert!(
            !cfg.authentication.x509.client_ca_file.is_empty(),
            "4.2.3 clientCAFile"
        );
        assert_eq!(cfg.read_only_port, 0, "4.2.4 readOnlyPort");
        assert!(
            !cfg.streaming_connection_idle_timeout.0.is_zero(),
            "4.2.5 streaming idle timeout"
        );
        assert!(cfg.rotate_certificates, "4.2.11 certificate rotation");
        assert!(
            !cfg.tls_cipher_suites.is_empty(),
            "4.2.12 cipher suites set"
        );
        for s in &cfg.tls_cipher_suites {
            assert!(
                s.contains("_GCM_") || s.contains("CHACHA20"),
                "4.2.12 {s} strong"
            );
            assert!(s.starts_with("TLS_ECDHE_"), "4.2.12 {s} forward secrecy");
        }
        assert!(cfg.pod_pids_limit > 0, "4.2.13 podPidsLimit");
        // And a weak suite is refused outright, naming the field.
        let weak = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntlsCipherSuites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n";
        let e = parse(weak, "weak.yaml", &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("tlsCipherSuites[0]"), "{e}");
    }

    /// The board presets of the README ("Picking the values for a
    /// board"): on the shipped config they parse and validate, leave the
    /// pods the limit the table says, a positive allocatable below it, and
    /// the soft threshold above the hard one.
    #[test]
    fn board_presets_leave_the_os_its_memory() {
        let shipped = include_str!("../../packaging/config.yaml");
        const MI: u64 = 1 << 20;
        for (ram_mb, sys, kube, hard, alloc, soft, limit_mib) in [
            (512u64, "96Mi", "32Mi", "64Mi", "32Mi", "128Mi", 384u64),
            (1024, "128Mi", "48Mi", "100Mi", "64Mi", "200Mi", 848),
            (2048, "192Mi", "64Mi", "150Mi", "100Mi", "300Mi", 1792),
        ] {
            // The preset's fields replace the shipped file's.
            let base: String = shipped
                .split("# Small machines")
                .next()
                .unwrap()
                .to_string();
            let text = format!(
                "{base}systemReserved: {{memory: {sys}}}\nkubeReserved: {{memory: {kube}}}\nevictionHard: {{memory.available: {hard}, allocatableMemory.available: {alloc}}}\nevictionSoft: {{memory.available: {soft}}}\nevictionSoftGracePeriod: {{memory.available: 30s}}\n"
            );
            let (cfg, w) = parse_ok(&text);
            assert!(w.is_empty(), "{ram_mb} MB: {w:?}");
            let t = cfg.eviction_thresholds().unwrap();
            let ram = ram_mb * MI;
            let reserved = parse_quantity(sys).unwrap() + parse_quantity(kube).unwrap();
            let limit = ram - reserved;
            assert_eq!(limit / MI, limit_mib, "{ram_mb} MB");
            let hard = t.hard["memory.available"].resolve(ram);
            let soft = t.soft["memory.available"].0.resolve(ram);
            assert!(soft > hard, "{ram_mb} MB");
            assert!(hard >= 64 * MI && limit > hard, "{ram_mb} MB");
            let alloc_hard = t.hard["allocatableMemory.available"].resolve(limit);
            assert!(alloc_hard < limit / 4, "{ram_mb} MB");
        }
    }

    /// Upstream spells acronyms in capitals (`serverTLSBootstrap`,
    /// `imageMinimumGCAge`, `cgroupsPerQOS`, `clusterDNS`, …), which serde's
    /// camelCase does not: each is accepted under upstream's name.
    #[test]
    fn fields_with_acronyms_take_upstreams_names() {
        let (cfg, w) = parse_ok(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nserverTLSBootstrap: true\nimageMinimumGCAge: 7s\ncgroupsPerQOS: false\nclusterDNS: [10.0.0.10]\nimageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 70\n",
        );
        assert!(w.is_empty(), "{w:?}");
        assert!(cfg.server_tls_bootstrap && !cfg.cgroups_per_qos);
        assert_eq!(cfg.image_minimum_gc_age, GoDuration::secs(7));
        assert_eq!(cfg.cluster_dns, ["10.0.0.10"]);
        assert_eq!(
            (
                cfg.image_gc_high_threshold_percent,
                cfg.image_gc_low_threshold_percent
            ),
            (90, 70)
        );
    }
}
