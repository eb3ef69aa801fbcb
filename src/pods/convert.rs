//! From the Kubernetes pod spec to what the runtime is asked for: QoS class
//! and cgroup parent, the sandbox (hostname, DNS, hosts), and each
//! container's config (command, env with `$(VAR)` expansion and field
//! references, resources, security context), as the upstream kubelet
//! derives them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kinglet_runtime::{ContainerConfig, PortMapping, SandboxConfig};

use super::subpath::{self, SubPath};
use crate::config::parse_quantity;

/// Node facts the conversion needs.
#[derive(Clone, Debug, Default)]
pub struct NodeContext {
    pub node_name: String,
    /// The pods' root cgroup, relative to the cgroup mount:
    /// `<cgroupRoot>/kubepods` (empty: `kubepods`).
    pub pods_cgroup: String,
    pub node_ip: String,
    pub memory_capacity: u64,
    /// The node's CPUs in millicores (an unset `limits.cpu` reads as it).
    pub cpu_capacity_milli: u64,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    pub pod_pids_limit: i64,
    pub log_root: String,
    /// Where emptyDir volumes live: `<volume_root>/<pod uid>/<volume>`.
    pub volume_root: String,
    /// The lowest OOM score adjustment kinglet may give (−1000 with
    /// CAP_SYS_RESOURCE; else its own, as the kernel allows no lower).
    pub min_oom_score_adj: i32,
    /// `<runtime>://`, the prefix of container IDs in pod statuses.
    pub container_id_scheme: String,
    /// ConfigMaps and Secrets, when an API server is configured.
    pub objects: Option<std::sync::Arc<dyn ObjectSource>>,
    /// The wall clock container times are compared with.
    pub clock: super::plan::Clock,
    /// When the agent started (first probes are jittered within a period
    /// of it); `None`: long ago.
    pub started: Option<tokio::time::Instant>,
    /// What configMap, secret and projected volumes read, when an API
    /// server is configured.
    pub volume_sources: Option<std::sync::Arc<super::volumes::Sources>>,
    /// The last copy of what volumes read from the API server, for pods
    /// to start while it is unreachable (see [`crate::store`]).
    pub store: Option<std::sync::Arc<crate::store::LocalStore>>,
    /// The cluster's Services, for service environment variables.
    pub services: Option<std::sync::Arc<super::services::Services>>,
    /// The node's hosts file, which hostNetwork pods get (empty: `/etc/hosts`).
    pub etc_hosts: String,
    /// kinglet's Prometheus metrics (probes, pod starts, relists).
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
}

/// The two kinds of object a container's environment may read.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

impl ObjectKind {
    /// As upstream names it in messages (`configmap "x" not found`).
    pub fn lower(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "configmap",
            ObjectKind::Secret => "secret",
        }
    }
    fn title(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::Secret => "Secret",
        }
    }
}

/// Reads ConfigMaps and Secrets (the API server, for pods that have one).
pub trait ObjectSource: Send + Sync + std::fmt::Debug {
    /// The object's string data (secrets decoded); `Ok(None)`: not found.
    fn get<'a>(
        &'a self,
        kind: ObjectKind,
        namespace: &'a str,
        name: &'a str,
    ) -> kinglet_runtime::BoxFuture<'a, Result<Option<BTreeMap<String, String>>, String>>;
}

/// The objects a container's environment refers to, fetched before its
/// config is built: `None` for an object that does not exist; and the
/// service variables, which come first (the container's own override them).
#[derive(Clone, Debug, Default)]
pub struct EnvObjects(
    pub BTreeMap<(ObjectKind, String), Option<BTreeMap<String, String>>>,
    pub Vec<(String, String)>,
);

impl EnvObjects {
    /// What `c`'s env and envFrom refer to.
    pub fn refs(c: &Container) -> Vec<(ObjectKind, String)> {
        let mut out = Vec::new();
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.config_map_ref {
                out.push((ObjectKind::ConfigMap, r.name.clone()));
            }
            if let Some(r) = &e.secret_ref {
                out.push((ObjectKind::Secret, r.name.clone()));
            }
        }
        for e in c.env.iter().flatten() {
            if let Some(vf) = &e.value_from {
                if let Some(r) = &vf.config_map_key_ref {
                    out.push((ObjectKind::ConfigMap, r.name.clone()));
                }
                if let Some(r) = &vf.secret_key_ref {
                    out.push((ObjectKind::Secret, r.name.clone()));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn get(&self, kind: ObjectKind, name: &str) -> Option<&BTreeMap<String, String>> {
        self.0
            .get(&(kind, name.to_string()))
            .and_then(|o| o.as_ref())
    }

    /// One key, as upstream resolves `configMapKeyRef`/`secretKeyRef`.
    fn key(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
        key: &str,
        optional: bool,
    ) -> Result<Option<String>, ConfigError> {
        match self.get(kind, name) {
            None if optional => Ok(None),
            None => Err(ConfigError(format!("{} {name:?} not found", kind.lower()))),
            Some(data) => match data.get(key) {
                Some(v) => Ok(Some(v.clone())),
                None if optional => Ok(None),
                None => Err(ConfigError(format!(
                    "couldn't find key {key} in {} {ns}/{name}",
                    kind.title()
                ))),
            },
        }
    }
}

/// A C identifier-ish name as upstream's `IsEnvVarName` accepts:
/// `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "-._".contains(c))
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

/// What `min_oom_score_adj` is for this process.
pub fn min_oom_score_adj() -> i32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_RESOURCE: u64 = 24;
    if cap_eff & (1 << CAP_SYS_RESOURCE) != 0 {
        -1000
    } else {
        std::fs::read_to_string("/proc/self/oom_score_adj")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// `Guaranteed`, `Burstable` or `BestEffort`, by upstream's rules.
pub fn qos_class(pod: &Pod) -> &'static str {
    let spec = match &pod.spec {
        Some(s) => s,
        None => return "BestEffort",
    };
    let all: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    // Only cpu and memory count, and only above zero (upstream's
    // isSupportedQoSComputeResource): an ephemeral-storage limit alone
    // leaves a pod BestEffort, and the apiserver refuses any other class.
    let mut any = false;
    let mut guaranteed = true;
    for c in &all {
        let r = c.resources.clone().unwrap_or_default();
        let req = r.requests.unwrap_or_default();
        let lim = r.limits.unwrap_or_default();
        for res in ["cpu", "memory"] {
            let positive = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
                Some(quantity_milli(&q.0)).filter(|v| *v > 0)
            };
            let l = lim.get(res).and_then(positive);
            let rq = req.get(res).and_then(positive).or(l);
            any |= l.is_some() || rq.is_some();
            if l.is_none() || rq != l {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// A quantity in thousandths (cpu `250m` → 250, `1` → 1000; bytes × 1000);
/// 0 when unparsable (the apiserver validated it).
pub fn quantity_milli(q: &str) -> u128 {
    crate::config::parse_quantity_milli(q).unwrap_or(0)
}

fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// `kubepods/pod<uid>` (Guaranteed), `kubepods/burstable/pod<uid>`,
/// `kubepods/besteffort/pod<uid>`, as upstream's cgroupfs driver names
/// them, under `pods_cgroup` (`<cgroupRoot>/kubepods`; empty: `kubepods`).
pub fn cgroup_parent(pod: &Pod, pods_cgroup: &str) -> String {
    let uid = pod_uid(pod);
    let root = if pods_cgroup.is_empty() {
        "kubepods"
    } else {
        pods_cgroup
    };
    match qos_class(pod) {
        "Guaranteed" => format!("{root}/pod{uid}"),
        "Burstable" => format!("{root}/burstable/pod{uid}"),
        _ => format!("{root}/besteffort/pod{uid}"),
    }
}

/// The OOM score adjustment of a container, by its pod's QoS class.
pub fn oom_score_adj(pod: &Pod, c: &Container, memory_capacity: u64) -> i32 {
    match qos_class(pod) {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            let req = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("memory"))
                .and_then(|q| parse_quantity(&q.0).ok())
                .unwrap_or(0);
            if memory_capacity == 0 {
                return 999;
            }
            let adj = 1000 - (1000u128 * u128::from(req) / u128::from(memory_capacity)) as i64;
            adj.clamp(2, 999) as i32
        }
    }
}

/// `<namespace>_<name>_<uid>`, the pod's dir under the log root.
fn log_dir_name(pod: &Pod) -> String {
    let (ns, name) = namespace_and_name(pod);
    format!("{ns}_{name}_{}", pod_uid(pod))
}

/// The pod's log dir as the sandbox gets it. Pods are validated before
/// they get here; should a name still not make one plain directory, its
/// unsafe characters become `_`, so the result stays under `root`.
pub fn log_directory(pod: &Pod, root: &str) -> String {
    let name = log_dir_name(pod);
    let name = match contained_child(std::path::Path::new(root), &name) {
        Some(_) => name,
        None => format!(
            "_{}",
            name.replace(
                |c: char| !c.is_ascii_alphanumeric() && !"-_.".contains(c),
                "_"
            )
        ),
    };
    format!("{}/{name}", root.trim_end_matches('/'))
}

/// `base/a/b/...`, each part one plain path component; `None` if any is
/// not. Every host path kinglet builds from pod data goes through this or
/// [`contained_child`].
pub fn contained_path(base: &std::path::Path, parts: &[&str]) -> Option<std::path::PathBuf> {
    parts
        .iter()
        .try_fold(base.to_path_buf(), |p, part| contained_child(&p, part))
}

/// The pod's ephemeral containers (`kubectl debug`) as containers: the
/// same fields but `targetContainerName` ([`ephemeral_target`]).
pub fn ephemeral_containers(spec: &PodSpec) -> Vec<Container> {
    spec.ephemeral_containers
        .iter()
        .flatten()
        .filter_map(|e| {
            let mut v = serde_json::to_value(e).ok()?;
            v.as_object_mut()?.remove("targetContainerName");
            serde_json::from_value(v).ok()
        })
        .collect()
}

/// The `targetContainerName` of ephemeral container `name`, if it has one:
/// the container whose PID namespace it joins (`kubectl debug --target`).
pub fn ephemeral_target<'a>(spec: &'a PodSpec, name: &str) -> Option<&'a str> {
    spec.ephemeral_containers
        .iter()
        .flatten()
        .find(|e| e.name == name)?
        .target_container_name
        .as_deref()
        .filter(|t| !t.is_empty())
}

/// A sidecar: an init container that restarts (`restartPolicy: Always`).
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// `namespace/name`, for logs and messages.
pub fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// `name_namespace(uid)`, as upstream's `format.Pod` writes a pod in
/// messages users read (hook failures).
pub fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

/// `base/name` when `name` is one plain path component (not empty, not
/// `.` or `..`, no `/` or NUL), so the result cannot leave `base`.
pub fn contained_child(base: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    let plain = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']);
    plain.then(|| base.join(name))
}

/// The pod's log dir (`<log root>/<ns>_<name>_<uid>`), if its name makes
/// one plain directory under the log root.
pub fn pod_log_dir(pod: &Pod, node: &NodeContext) -> Option<std::path::PathBuf> {
    contained_child(std::path::Path::new(&node.log_root), &log_dir_name(pod))
}

/// The pod's namespace (`default` if unset) and name.
pub fn namespace_and_name(pod: &Pod) -> (String, String) {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    (ns, pod.metadata.name.clone().unwrap_or_default())
}

/// The sandbox: hostname, DNS and hosts file as the kubelet writes them.
pub fn sandbox_config(pod: &Pod, node: &NodeContext) -> SandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let (ns, name) = namespace_and_name(pod);
    let host_network = spec.host_network.unwrap_or(false);
    let (short, domain) = host_and_domain(&spec, &ns, &name, node);
    let hostname = if host_network {
        node.node_name.clone()
    } else if spec.set_hostname_as_fqdn == Some(true) && !domain.is_empty() {
        format!("{short}.{domain}")
    } else {
        short.clone()
    };
    let hosts_name = if host_network {
        hostname.clone()
    } else {
        short
    };
    SandboxConfig {
        pod_uid: pod_uid(pod),
        resolv_conf: resolv_conf(&spec, &ns, node),
        hosts: if host_network {
            node_hosts_file(&spec, node)
        } else {
            hosts_file(&spec, &hosts_name, &domain, node)
        },
        pod_name: name,
        namespace: ns,
        hostname,
        log_directory: log_directory(pod, &node.log_root),
        host_network,
        host_pid: spec.host_pid.unwrap_or(false),
        host_ipc: spec.host_ipc.unwrap_or(false),
        cgroup_parent: cgroup_parent(pod, &node.pods_cgroup),
        port_mappings: port_mappings(&spec),
        sysctls: spec
            .security_context
            .iter()
            .flat_map(|sc| sc.sysctls.iter().flatten())
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect(),
        pids_limit: (node.pod_pids_limit > 0).then_some(node.pod_pids_limit),
        privileged: has_privileged_container(&spec),
    }
}

/// Upstream's `HasPrivilegedContainer`: any init, regular or ephemeral
/// container with `securityContext.privileged`.
fn has_privileged_container(spec: &k8s_openapi::api::core::v1::PodSpec) -> bool {
    let ephemeral = ephemeral_containers(spec);
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .chain(&ephemeral)
        .any(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
}

/// The pod's `/etc/resolv.conf` by its `dnsPolicy` and `dnsConfig`, as
/// upstream's `dns.Configurer`: the cluster DNS with the namespace's search
/// path and `ndots:5`, or the host's file, or nothing (`None`), then the
/// pod's own nameservers, searches and options.
fn resolv_conf(spec: &PodSpec, ns: &str, node: &NodeContext) -> String {
    let host_network = spec.host_network.unwrap_or(false);
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster = (policy == "ClusterFirst" && !host_network
        || policy == "ClusterFirstWithHostNet")
        && !node.cluster_dns.is_empty();
    let mut resolv = if policy == "None" {
        String::new()
    } else if cluster {
        let mut search = vec![
            format!("{ns}.svc.{}", node.cluster_domain),
            format!("svc.{}", node.cluster_domain),
            node.cluster_domain.clone(),
        ];
        search.retain(|s| !s.starts_with('.') && !s.is_empty() && !s.ends_with('.'));
        let mut r: String = node
            .cluster_dns
            .iter()
            .map(|ip| format!("nameserver {ip}\n"))
            .collect();
        if !search.is_empty() {
            r.push_str(&format!("search {}\n", search.join(" ")));
        }
        r.push_str("options ndots:5\n");
        r
    } else {
        std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default()
    };
    let Some(cfg) = &spec.dns_config else {
        return resolv;
    };
    for ip in cfg.nameservers.iter().flatten() {
        resolv.push_str(&format!("nameserver {ip}\n"));
    }
    if let Some(s) = &cfg.searches
        && !s.is_empty()
    {
        resolv.push_str(&format!("search {}\n", s.join(" ")));
    }
    let opts: Vec<String> = cfg
        .options
        .iter()
        .flatten()
        .map(|o| match &o.value {
            Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
            None => o.name.clone().unwrap_or_default(),
        })
        .collect();
    if !opts.is_empty() {
        resolv.push_str(&format!("options {}\n", opts.join(" ")));
    }
    resolv
}

/// The pod's host name and domain, as upstream's
/// `GeneratePodHostNameAndDomain`: `hostname` (else the pod's name, cut
/// to 63), `<subdomain>.<ns>.svc.<cluster domain>` with a subdomain, and
/// `hostnameOverride` (beta) replacing both, with no domain.
fn host_and_domain(spec: &PodSpec, ns: &str, name: &str, node: &NodeContext) -> (String, String) {
    if let Some(o) = spec.hostname_override.as_ref().filter(|o| !o.is_empty()) {
        return (o.clone(), String::new());
    }
    let short = spec
        .hostname
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| {
            name.chars()
                .take(63)
                .collect::<String>()
                .trim_end_matches(['-', '.'])
                .to_string()
        });
    let domain = match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        Some(sub) => format!("{sub}.{ns}.svc.{}", node.cluster_domain),
        None => String::new(),
    };
    (short, domain)
}

/// The pod's `/etc/hosts` as upstream's `managedHostsFileContent`:
/// localhost and the IPv6 names, its own name (with its FQDN when it has a
/// domain), its `hostAliases`.
fn hosts_file(spec: &PodSpec, hostname: &str, domain: &str, node: &NodeContext) -> String {
    let mut hosts = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    if domain.is_empty() {
        hosts.push_str(&format!("{}\t{hostname}\n", node.node_ip));
    } else {
        hosts.push_str(&format!(
            "{}\t{hostname}.{domain}\t{hostname}\n",
            node.node_ip
        ));
    }
    hosts.push_str(&host_aliases(spec));
    hosts
}

/// A hostNetwork pod's `/etc/hosts`, as upstream's
/// `nodeHostsFileContent`: the node's own file under a header of its own,
/// then the `hostAliases`. (A small local file, read as the sandbox is
/// made.)
fn node_hosts_file(spec: &PodSpec, node: &NodeContext) -> String {
    let path = if node.etc_hosts.is_empty() {
        "/etc/hosts"
    } else {
        node.etc_hosts.as_str()
    };
    let mut hosts = String::from("# Kubernetes-managed hosts file (host network).\n");
    hosts.push_str(&std::fs::read_to_string(path).unwrap_or_default());
    hosts.push_str(&host_aliases(spec));
    hosts
}

fn host_aliases(spec: &PodSpec) -> String {
    let aliases = spec.host_aliases.iter().flatten();
    let lines: Vec<String> = aliases
        .map(|h| {
            format!(
                "{}\t{}\n",
                h.ip,
                h.hostnames.clone().unwrap_or_default().join("\t")
            )
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    format!("\n# Entries added by HostAliases.\n{}", lines.concat())
}

/// The containers' `hostPort`s, as the upstream kubelet hands them to CRI
/// (a port without `hostPort` maps nothing).
fn port_mappings(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<PortMapping> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host_port = p.host_port.filter(|h| *h > 0)?;
            Some(PortMapping {
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
        })
        .collect()
}

/// Why a container config cannot be built: upstream's
/// `CreateContainerConfigError`.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

/// A probe's or hook's command with `$(VAR)` expanded from the container's
/// literal `env` values only (upstream's `ExpandContainerCommandOnlyStatic`).
pub fn expand_static(cmd: &[String], c: &Container) -> Vec<String> {
    let env: BTreeMap<String, String> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    cmd.iter().map(|s| expand(s, &env)).collect()
}

/// Expands `$(VAR)` from `env`; `$$(VAR)` escapes, unknown stays as is.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$(") {
            out.push_str("$(");
            rest = after;
        } else if let Some(inner) = tail.strip_prefix("$(")
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&tail[..end + 3]),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

pub fn field_ref(pod: &Pod, path: &str, node: &NodeContext) -> Option<String> {
    let m = &pod.metadata;
    Some(match path {
        "metadata.name" => m.name.clone()?,
        "metadata.namespace" => m.namespace.clone().unwrap_or_else(|| "default".into()),
        "metadata.uid" => m.uid.clone()?,
        "spec.nodeName" => node.node_name.clone(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()?
            .service_account_name
            .clone()
            .unwrap_or_default(),
        "status.hostIP" | "status.podIP" => node.node_ip.clone(),
        p if p.starts_with("metadata.labels['") => {
            let k = p
                .trim_start_matches("metadata.labels['")
                .trim_end_matches("']");
            m.labels.as_ref()?.get(k)?.clone()
        }
        p if p.starts_with("metadata.annotations['") => {
            let k = p
                .trim_start_matches("metadata.annotations['")
                .trim_end_matches("']");
            m.annotations.as_ref()?.get(k)?.clone()
        }
        _ => return None,
    })
}

/// The host directory of each volume of the pod (emptyDir and hostPath;
/// other kinds need the API server and are refused here).
pub fn volume_paths(
    pod: &Pod,
    node: &NodeContext,
) -> Result<BTreeMap<String, (String, Option<String>)>, ConfigError> {
    let mut out = BTreeMap::new();
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
    {
        // emptyDirs and the volumes kinglet writes (configMap, secret,
        // downwardAPI, projected) live under the pod's volume dir.
        if v.empty_dir.is_some() || object_backed(&v) {
            let base = std::path::Path::new(&node.volume_root);
            let dir = contained_path(base, &[&pod_uid(pod), &v.name]).ok_or_else(|| {
                ConfigError(format!("volume {:?}: not a valid volume name", v.name))
            })?;
            let dir = dir.display().to_string();
            out.insert(v.name.clone(), (dir, Some("DirectoryOrCreate".into())));
        } else if let Some(h) = &v.host_path {
            out.insert(v.name.clone(), (h.path.clone(), h.type_.clone()));
        } else if v.image.is_some() {
            // Mounted by the runtime from its image store: no host dir.
        } else {
            return Err(ConfigError(format!(
                "volume {:?}: only emptyDir, hostPath, configMap, secret, downwardAPI, projected and image volumes are supported",
                v.name
            )));
        }
    }
    Ok(out)
}

/// The image reference of the pod's image volume `name`, if it is one.
pub fn image_volume<'p>(pod: &'p Pod, name: &str) -> Option<&'p str> {
    pod.spec
        .as_ref()?
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)?
        .image
        .as_ref()?
        .reference
        .as_deref()
}

/// Whether kinglet writes the volume's files (configMap, secret,
/// downwardAPI, projected): they are mounted read-only, as upstream.
pub fn object_backed(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

/// Prepares the volumes of a pod on the host (creating emptyDirs and
/// `DirectoryOrCreate` hostPaths, checking typed hostPaths).
pub fn prepare_volumes(pod: &Pod, node: &NodeContext) -> Result<(), ConfigError> {
    for (name, (path, kind)) in volume_paths(pod, node)? {
        let p = std::path::Path::new(&path);
        match kind.as_deref().unwrap_or("") {
            "DirectoryOrCreate" => std::fs::create_dir_all(p)
                .map_err(|e| ConfigError(format!("volume {name:?}: {path}: {e}")))?,
            "Directory" if !p.is_dir() => {
                return Err(ConfigError(format!(
                    "volume {name:?}: hostPath type check failed: {path} is not a directory"
                )));
            }
            "File" if !p.is_file() => {
                return Err(ConfigError(format!(
                    "volume {name:?}: hostPath type check failed: {path} is not a file"
                )));
            }
            "FileOrCreate" if !p.exists() => {
                std::fs::write(p, b"")
                    .map_err(|e| ConfigError(format!("volume {name:?}: {path}: {e}")))?;
            }
            t @ ("Socket" | "CharDevice" | "BlockDevice") => {
                use std::os::unix::fs::FileTypeExt;
                let ft = std::fs::metadata(p).map(|m| m.file_type());
                let (ok, what) = match t {
                    "Socket" => (ft.as_ref().is_ok_and(|f| f.is_socket()), "a socket file"),
                    "CharDevice" => (
                        ft.as_ref().is_ok_and(|f| f.is_char_device()),
                        "a character device",
                    ),
                    _ => (
                        ft.as_ref().is_ok_and(|f| f.is_block_device()),
                        "a block device",
                    ),
                };
                if !ok {
                    return Err(ConfigError(format!(
                        "volume {name:?}: hostPath type check failed: {path} is not {what}"
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The container's mounts: each volume's host dir, or for a `subPath` (or
/// `subPathExpr` expanded with the container's environment, as upstream)
/// the target in the pod's dir that [`subpath::prepare`] binds it onto
/// before the container is made; the sub paths to prepare come with them.
fn volume_mounts(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
    env: &BTreeMap<String, String>,
) -> Result<(Vec<kinglet_runtime::Mount>, Vec<SubPath>), ConfigError> {
    let paths = volume_paths(pod, node)?;
    let written: BTreeSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| object_backed(v))
        .map(|v| v.name.as_str())
        .collect();
    let (mut out, mut subs) = (Vec::new(), Vec::new());
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if let Some(reference) = image_volume(pod, &m.name) {
            out.push(kinglet_runtime::Mount {
                container_path: m.mount_path.clone(),
                readonly: true,
                image: reference.to_string(),
                image_sub_path: m.sub_path.clone().unwrap_or_default(),
                ..Default::default()
            });
            continue;
        }
        let (path, _) = paths.get(&m.name).ok_or_else(|| {
            ConfigError(format!("volumeMount {:?}: no volume of that name", m.name))
        })?;
        let sub = match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
            (Some(s), _) if !s.is_empty() => s.to_string(),
            (_, Some(e)) if !e.is_empty() => expand(e, env),
            _ => String::new(),
        };
        let host = if sub.is_empty() {
            path.clone()
        } else {
            let s = sub_path(pod, c, i, m, path, &sub, node)?;
            let target = s.target.display().to_string();
            subs.push(s);
            target
        };
        out.push(kinglet_runtime::Mount {
            host_path: host,
            container_path: m.mount_path.clone(),
            readonly: m.read_only.unwrap_or(false) || written.contains(m.name.as_str()),
            propagation: propagation(c, m)?,
            ..Default::default()
        });
    }
    Ok((out, subs))
}

/// A mount's `mountPropagation`, as upstream's `translateMountPropagation`:
/// `Bidirectional` only for privileged containers.
fn propagation(
    c: &Container,
    m: &k8s_openapi::api::core::v1::VolumeMount,
) -> Result<kinglet_runtime::Propagation, ConfigError> {
    use kinglet_runtime::Propagation;
    let privileged = c
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    match m.mount_propagation.as_deref() {
        None | Some("None") => Ok(Propagation::Private),
        Some("HostToContainer") => Ok(Propagation::HostToContainer),
        Some("Bidirectional") if privileged => Ok(Propagation::Bidirectional),
        Some("Bidirectional") => Err(ConfigError(
            "Bidirectional mount propagation is available only to privileged containers".into(),
        )),
        Some(p) => Err(ConfigError(format!("invalid MountPropagation mode: {p:?}"))),
    }
}

/// Mount `index` of container `c` at `volume/sub`: `sub` checked (no
/// `..`, relative), and its target, upstream's
/// `volume-subpaths/<volume>/<container>/<index>`, in the pod's volume dir.
fn sub_path(
    pod: &Pod,
    c: &Container,
    index: usize,
    m: &k8s_openapi::api::core::v1::VolumeMount,
    volume: &str,
    sub: &str,
    node: &NodeContext,
) -> Result<SubPath, ConfigError> {
    super::validate::expanded_sub_path(sub)
        .map_err(|msg| ConfigError(format!("volumeMount {:?}: subPath {sub:?} {msg}", m.name)))?;
    let parts = [
        pod_uid(pod),
        subpath::TARGETS_DIR.to_string(),
        m.name.clone(),
        c.name.clone(),
        index.to_string(),
    ];
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let target = contained_path(std::path::Path::new(&node.volume_root), &parts)
        .ok_or_else(|| ConfigError(format!("volumeMount {:?}: not a valid volume name", m.name)))?;
    Ok(SubPath {
        name: m.name.clone(),
        volume: volume.into(),
        sub: sub.into(),
        target,
    })
}

/// The runtime's container config for `c`, restart number `attempt`.
pub fn container_config(
    pod: &Pod,
    c: &Container,
    attempt: u32,
    node: &NodeContext,
    objects: &EnvObjects,
) -> Result<(ContainerConfig, Vec<SubPath>), ConfigError> {
    let (env, values) = environment(pod, c, node, objects)?;
    let command = c.command.iter().flatten().map(|s| expand(s, &values));
    let args = c.args.iter().flatten().map(|s| expand(s, &values));
    let pod_sc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let uid = sc.run_as_user.or(pod_sc.run_as_user).map(|u| u as u32);
    let gid = sc.run_as_group.or(pod_sc.run_as_group).map(|g| g as u32);
    let mut groups: Vec<u32> = pod_sc
        .supplemental_groups
        .iter()
        .flatten()
        .map(|g| *g as u32)
        .collect();
    groups.extend(pod_sc.fs_group.map(|g| g as u32));
    let (mounts, sub_paths) = volume_mounts(pod, c, node, &values)?;
    let limits = Limits::of(c);
    let caps = sc.capabilities.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let cfg = ContainerConfig {
        name: c.name.clone(),
        attempt,
        image: c.image.clone().unwrap_or_default(),
        command: command.collect(),
        args: args.collect(),
        env,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        uid,
        gid,
        supplemental_groups: groups,
        log_path: format!("{}/{attempt}.log", c.name),
        mounts,
        memory_limit: limits.memory,
        cpu_shares: Some(limits.cpu_shares),
        cpu_quota: limits.cpu_quota,
        pids_limit: (node.pod_pids_limit > 0).then_some(node.pod_pids_limit),
        oom_score_adj: Some(
            oom_score_adj(pod, c, node.memory_capacity).max(node.min_oom_score_adj),
        ),
        privileged,
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        no_new_privileges: sc.allow_privilege_escalation == Some(false) && !privileged,
        seccomp_runtime_default: sc
            .seccomp_profile
            .as_ref()
            .or(pod_sc.seccomp_profile.as_ref())
            .is_some_and(|p| p.type_ == "RuntimeDefault"),
        capabilities_add: caps.add.unwrap_or_default(),
        capabilities_drop: caps.drop.unwrap_or_default(),
        sysctls: pod_sc
            .sysctls
            .iter()
            .flatten()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect(),
        termination_message_path: c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into()),
        // Resolved by the worker from the runtime cache (it needs IDs).
        pid_target: None,
    };
    Ok((cfg, sub_paths))
}

/// Upstream's `verifyRunAsNonRoot`: with `runAsNonRoot`, the container's
/// user (its `runAsUser`, else the image's) must be known not to be root;
/// an image with no user runs as root.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image: &kinglet_runtime::ImageInfo,
) -> Result<(), ConfigError> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(pod_sc.and_then(|s| s.run_as_non_root));
    if non_root != Some(true) {
        return Ok(());
    }
    let (ns, name) = namespace_and_name(pod);
    let who = format!(
        "(pod: \"{name}_{ns}({})\", container: {})",
        pod_uid(pod),
        c.name
    );
    let run_as = sc
        .and_then(|s| s.run_as_user)
        .or(pod_sc.and_then(|s| s.run_as_user));
    let err = |m: String| Err(ConfigError(m));
    match (run_as, image.uid, image.username.as_str()) {
        (Some(0), _, _) => err(format!(
            "container's runAsUser breaks non-root policy {who}"
        )),
        (Some(_), _, _) => Ok(()),
        (None, None, user) if !user.is_empty() => err(format!(
            "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root {who}"
        )),
        (None, Some(0) | None, _) => err(format!(
            "container has runAsNonRoot and image will run as root {who}"
        )),
        (None, Some(u), _) if !(1..=i64::from(i32::MAX)).contains(&u) => err(format!(
            "container has runAsNonRoot and image has an invalid user id ({u}). (Must be 1-({})): must be between 0 and 2147483647, inclusive {who}",
            i32::MAX
        )),
        (None, Some(_), _) => Ok(()),
    }
}

/// The cgroup limits of a container, as upstream's `kuberuntime` computes
/// them (`MilliCPUToShares`, `MilliCPUToQuota`).
#[derive(Debug, PartialEq, Eq)]
struct Limits {
    /// Bytes; a limit past what the kernel takes saturates (no limit).
    memory: Option<i64>,
    cpu_shares: u64,
    /// Microseconds per 100 ms period.
    cpu_quota: Option<i64>,
}

/// Upstream's `MinShares`, `MaxShares`, `MinQuotaPeriod` (µs), and
/// `QuotaPeriod` (µs).
const MIN_SHARES: u128 = 2;
const MAX_SHARES: u128 = 262_144;
const MIN_QUOTA: u128 = 1000;
const QUOTA_PERIOD: u128 = 100_000;

impl Limits {
    fn of(c: &Container) -> Limits {
        let res = c.resources.clone().unwrap_or_default();
        let lim = res.limits.unwrap_or_default();
        let req = res.requests.unwrap_or_default();
        let memory = lim
            .get("memory")
            .and_then(|q| parse_quantity(&q.0).ok())
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        let cpu_limit = lim.get("cpu").map(|q| quantity_milli(&q.0));
        let cpu_request = req.get("cpu").map(|q| quantity_milli(&q.0)).or(cpu_limit);
        let shares = cpu_request.map_or(MIN_SHARES, |m| m.saturating_mul(1024) / 1000);
        Limits {
            memory,
            cpu_shares: shares.clamp(MIN_SHARES, MAX_SHARES) as u64,
            // A limit of 0 is no limit, as upstream's MilliCPUToQuota.
            cpu_quota: cpu_limit.filter(|m| *m > 0).map(|m| {
                let q = (m.saturating_mul(QUOTA_PERIOD) / 1000).max(MIN_QUOTA);
                i64::try_from(q).unwrap_or(i64::MAX)
            }),
        }
    }
}

/// The container's environment in order (envFrom first, so that env
/// overrides it, as upstream), and the values by name for `$(VAR)`
/// expansion.
#[allow(clippy::type_complexity)]
fn environment(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
    objects: &EnvObjects,
) -> Result<(Vec<(String, String)>, BTreeMap<String, String>), ConfigError> {
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    let mut ordered: Vec<(String, String)> = Vec::new();
    let mut set = |k: String, v: String, values: &mut BTreeMap<String, String>| {
        values.insert(k.clone(), v.clone());
        ordered.retain(|(o, _)| *o != k);
        ordered.push((k, v));
    };
    for (k, v) in &objects.1 {
        set(k.clone(), v.clone(), &mut values);
    }
    for ef in c.env_from.iter().flatten() {
        for (k, v) in env_from(ef, objects)? {
            set(k, v, &mut values);
        }
    }
    let (ns, _) = namespace_and_name(pod);
    for e in c.env.iter().flatten() {
        let value = match &e.value_from {
            Some(vf) => match env_value_from(pod, c, &e.name, vf, &ns, node, objects)? {
                Some(v) => v,
                None => continue,
            },
            None => expand(e.value.as_deref().unwrap_or(""), &values),
        };
        set(e.name.clone(), value, &mut values);
    }
    Ok((ordered, values))
}

/// The variables one `envFrom` source brings; invalid names are skipped
/// (upstream also records an event).
fn env_from(
    ef: &k8s_openapi::api::core::v1::EnvFromSource,
    objects: &EnvObjects,
) -> Result<Vec<(String, String)>, ConfigError> {
    let prefix = ef.prefix.clone().unwrap_or_default();
    let (kind, name, optional) = match (&ef.config_map_ref, &ef.secret_ref) {
        (Some(r), _) => (ObjectKind::ConfigMap, &r.name, r.optional == Some(true)),
        (None, Some(r)) => (ObjectKind::Secret, &r.name, r.optional == Some(true)),
        (None, None) => return Ok(Vec::new()),
    };
    let Some(data) = objects.get(kind, name) else {
        if optional {
            return Ok(Vec::new());
        }
        return Err(ConfigError(format!("{} {name:?} not found", kind.lower())));
    };
    Ok(data
        .iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
        .filter(|(k, _)| is_env_var_name(k))
        .collect())
}

/// One `env[].valueFrom`: a field, a resource, or a ConfigMap/Secret key;
/// `None`: an optional key that is absent (the variable is left out).
fn env_value_from(
    pod: &Pod,
    c: &Container,
    var: &str,
    vf: &k8s_openapi::api::core::v1::EnvVarSource,
    ns: &str,
    node: &NodeContext,
    objects: &EnvObjects,
) -> Result<Option<String>, ConfigError> {
    if let Some(f) = &vf.field_ref {
        return field_ref(pod, &f.field_path, node)
            .map(Some)
            .ok_or_else(|| {
                ConfigError(format!(
                    "unsupported fieldRef {:?} in env {var}",
                    f.field_path
                ))
            });
    }
    if let Some(r) = &vf.resource_field_ref {
        return Ok(Some(resource_field(c, r, node)));
    }
    let key_ref = vf
        .config_map_key_ref
        .as_ref()
        .map(|k| (ObjectKind::ConfigMap, &k.name, &k.key, k.optional))
        .or(vf
            .secret_key_ref
            .as_ref()
            .map(|k| (ObjectKind::Secret, &k.name, &k.key, k.optional)));
    match key_ref {
        Some((kind, name, key, optional)) => {
            objects.key(kind, ns, name, key, optional == Some(true))
        }
        None => Ok(Some(String::new())),
    }
}

/// A `resourceFieldRef` value: the request or limit over its divisor,
/// rounded up.
pub fn resource_field(
    c: &Container,
    r: &k8s_openapi::api::core::v1::ResourceFieldSelector,
    node: &NodeContext,
) -> String {
    let res = c.resources.clone().unwrap_or_default();
    let (kind, key) = match r.resource.split_once('.') {
        Some((k, key)) => (k, key),
        None => ("limits", r.resource.as_str()),
    };
    let map = if kind == "requests" {
        res.requests
    } else {
        res.limits
    }
    .unwrap_or_default();
    // No divisor, or a zero one (what the apiserver's defaults leave), is
    // 1, as upstream's ExtractContainerResourceValue reads it.
    let divisor = r
        .divisor
        .as_ref()
        .map(|d| quantity_milli(&d.0))
        .filter(|d| *d > 0)
        .unwrap_or(1000);
    match map.get(key) {
        Some(q) => quantity_milli(&q.0).div_ceil(divisor).to_string(),
        // Unset limits read as the node's allocatable upstream; kinglet
        // gives the node's memory and CPUs.
        None if key == "memory" => (u128::from(node.memory_capacity) * 1000)
            .div_ceil(divisor)
            .to_string(),
        None if key == "cpu" => u128::from(node.cpu_capacity_milli)
            .div_ceil(divisor)
            .to_string(),
        None => "0".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    const BASE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: edge, uid: u-1, labels: {app: web}}\n";

    #[test]
    fn resource_fields_default_to_the_node_and_a_zero_divisor_is_one() {
        use k8s_openapi::api::core::v1::ResourceFieldSelector;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let node = NodeContext {
            cpu_capacity_milli: 2000,
            memory_capacity: 1 << 30,
            ..Default::default()
        };
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "resources": {"limits": {"cpu": "1250m"}}
        }))
        .unwrap();
        let sel = |r: &str, d: Option<&str>| ResourceFieldSelector {
            resource: r.into(),
            divisor: d.map(|d| Quantity(d.into())),
            ..Default::default()
        };
        assert_eq!(
            resource_field(&c, &sel("limits.cpu", Some("0")), &node),
            "2"
        );
        assert_eq!(
            resource_field(&c, &sel("limits.cpu", Some("1m")), &node),
            "1250"
        );
        let unset = Container::default();
        assert_eq!(resource_field(&unset, &sel("limits.cpu", None), &node), "2");
        assert_eq!(
            resource_field(&unset, &sel("limits.memory", Some("1Mi")), &node),
            "1024"
        );
    }

    #[test]
    fn host_path_types_are_checked_as_upstream() {
        let node = NodeContext::default();
        let check = |path: &str, t: &str| {
            let p = pod(&format!(
                "{BASE}spec: {{containers: [{{name: a, image: x}}], volumes: [{{name: v, hostPath: {{path: {path}, type: {t}}}}}]}}"
            ));
            prepare_volumes(&p, &node).map_err(|e| e.0)
        };
        assert_eq!(check("/dev/null", "CharDevice"), Ok(()));
        assert_eq!(
            check("/dev/null", "BlockDevice"),
            Err("volume \"v\": hostPath type check failed: /dev/null is not a block device".into())
        );
        assert_eq!(
            check("/tmp", "Socket"),
            Err("volume \"v\": hostPath type check failed: /tmp is not a socket file".into())
        );
        assert!(check("/dev/null", "Directory").is_err());
        assert_eq!(check("/tmp", "Directory"), Ok(()));
    }

    #[test]
    fn run_as_non_root_is_checked_against_the_image_user() {
        let p = |sc: &str| {
            pod(&format!(
                "{BASE}spec: {{securityContext: {{runAsNonRoot: true}}, containers: [{{name: a, image: x{sc}}}]}}"
            ))
        };
        let check = |p: &Pod, uid: Option<i64>, user: &str| {
            let img = kinglet_runtime::ImageInfo {
                uid,
                username: user.into(),
                ..Default::default()
            };
            verify_run_as_non_root(p, &p.spec.as_ref().unwrap().containers[0], &img)
                .map_err(|e| e.0)
        };
        let plain = p("");
        assert_eq!(
            check(&plain, None, ""),
            Err("container has runAsNonRoot and image will run as root (pod: \"web_edge(u-1)\", container: a)".into())
        );
        assert!(
            check(&plain, Some(0), "")
                .unwrap_err()
                .contains("image will run as root")
        );
        assert!(
            check(&plain, None, "app")
                .unwrap_err()
                .contains("non-numeric user (app)")
        );
        assert_eq!(check(&plain, Some(1234), ""), Ok(()));
        let explicit = p(", securityContext: {runAsUser: 1000}");
        assert_eq!(check(&explicit, None, ""), Ok(()), "runAsUser decides");
        let root = p(", securityContext: {runAsUser: 0}");
        assert!(
            check(&root, Some(1234), "")
                .unwrap_err()
                .contains("runAsUser breaks non-root policy")
        );
    }

    #[test]
    fn limits_are_clamped_as_upstream() {
        let limits = |lim: &str, req: &str| {
            let p = pod(&format!(
                "{BASE}spec: {{containers: [{{name: a, image: x, resources: {{limits: {{{lim}}}, requests: {{{req}}}}}}}]}}"
            ));
            Limits::of(&p.spec.unwrap().containers[0])
        };
        let l = limits("cpu: 500m, memory: 64Mi", "");
        assert_eq!(
            l,
            Limits {
                memory: Some(64 << 20),
                cpu_shares: 512,
                cpu_quota: Some(50_000)
            }
        );
        // The kernel refuses a quota under 1 ms: upstream's MinQuotaPeriod.
        assert_eq!(limits("cpu: 1m", "").cpu_quota, Some(1000));
        assert_eq!(limits("cpu: 1m", "").cpu_shares, 2);
        // A limit past i64 is no limit, not a negative number.
        assert_eq!(limits("memory: 9Ei", "").memory, Some(i64::MAX));
        assert_eq!(limits("cpu: 1000k", "").cpu_shares, 262_144);
        assert_eq!(limits("", "").cpu_shares, 2);
        assert_eq!(limits("", "cpu: 250m").cpu_shares, 256);
        assert_eq!(limits("cpu: \"0\"", "").cpu_quota, None, "0 is no limit");
        // Past any real CPU count: clamped, never an overflow.
        assert_eq!(limits("cpu: 1e35", "cpu: 1e35").cpu_shares, 262_144);
        assert_eq!(limits("cpu: 1e35", "").cpu_quota, Some(i64::MAX));
    }

    #[test]
    fn qos_classes_and_cgroups() {
        let be = pod(&format!(
            "{BASE}spec: {{containers: [{{name: a, image: x}}]}}"
        ));
        assert_eq!(qos_class(&be), "BestEffort");
        assert_eq!(cgroup_parent(&be, ""), "kubepods/besteffort/podu-1");
        assert_eq!(
            cgroup_parent(&be, "edge/kubepods"),
            "edge/kubepods/besteffort/podu-1"
        );
        let g = pod(&format!(
            "{BASE}spec: {{containers: [{{name: a, image: x, resources: {{limits: {{cpu: 500m, memory: 64Mi}}}}}}]}}"
        ));
        assert_eq!(qos_class(&g), "Guaranteed");
        assert_eq!(cgroup_parent(&g, ""), "kubepods/podu-1");
        let b = pod(&format!(
            "{BASE}spec: {{containers: [{{name: a, image: x, resources: {{requests: {{memory: 512Mi}}}}}}]}}"
        ));
        assert_eq!(qos_class(&b), "Burstable");
        // Neither other resources nor zero quantities make a class.
        let eph = pod(&format!(
            "{BASE}spec: {{containers: [{{name: a, image: x, resources: {{limits: {{ephemeral-storage: 10Mi}}, requests: {{cpu: '0'}}}}}}]}}"
        ));
        assert_eq!(qos_class(&eph), "BestEffort");
        assert_eq!(
            oom_score_adj(&g, &g.spec.as_ref().unwrap().containers[0], 2 << 30),
            -997
        );
        assert_eq!(
            oom_score_adj(&be, &be.spec.as_ref().unwrap().containers[0], 2 << 30),
            1000
        );
        // 1000 - 1000 * 512Mi / 2Gi = 750.
        assert_eq!(
            oom_score_adj(&b, &b.spec.as_ref().unwrap().containers[0], 2 << 30),
            750
        );
    }

    /// Every place that builds a host path from pod data, fed names that
    /// climb or are absolute (as if validation had been skipped): each
    /// result stays under its base, or is refused.
    #[test]
    fn no_path_builder_leaves_its_base() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        let logs = root.join("logs");
        let vols = root.join("volumes");
        std::fs::create_dir_all(&vols).unwrap();
        let node = NodeContext {
            log_root: logs.display().to_string(),
            volume_root: vols.display().to_string(),
            ..Default::default()
        };
        let hostile = ["../../../../tmp/x", "/tmp/x", "..", ".", "a/../../b", ""];
        for bad in hostile {
            let p = pod(&format!(
                "metadata: {{name: {bad:?}, namespace: {bad:?}, uid: {bad:?}}}\nspec: {{containers: [{{name: {bad:?}, image: x, env: [{{name: D, value: {bad:?}}}], volumeMounts: [{{name: v, mountPath: /v, subPathExpr: '$(D)'}}, {{name: v, mountPath: /w, subPath: {bad:?}}}]}}], volumes: [{{name: v, emptyDir: {{}}}}, {{name: {bad:?}, emptyDir: {{}}}}]}}"
            ));
            let dir = log_directory(&p, &node.log_root);
            assert!(
                std::path::Path::new(&dir).parent() == Some(logs.as_path()),
                "{bad:?}: log dir {dir}"
            );
            if let Some(d) = pod_log_dir(&p, &node) {
                assert_eq!(d.parent(), Some(logs.as_path()), "{bad:?}");
            }
            match volume_paths(&p, &node) {
                Ok(v) => {
                    for (dir, _) in v.values() {
                        assert!(dir.starts_with(&*vols.to_string_lossy()), "{bad:?}: {dir}");
                        assert!(!dir.contains("/../"), "{bad:?}: {dir}");
                    }
                }
                Err(e) => assert!(e.0.contains("not a valid volume name"), "{bad:?}: {e:?}"),
            }
            assert!(
                contained_path(&vols, &[bad, "v"]).is_none(),
                "{bad:?} joined"
            );
        }
        // Sub paths, literal or expanded: refused when they climb, else
        // bound (by the worker, `subpath::prepare`) onto a target in the
        // pod's own dir.
        let p = pod(
            "metadata: {name: p, uid: u1}\nspec: {containers: [{name: c, image: x, env: [{name: D, value: d}], volumeMounts: [{name: v, mountPath: /v}, {name: v, mountPath: /w, subPathExpr: '$(D)/x'}]}], volumes: [{name: v, emptyDir: {}}]}",
        );
        let c = &p.spec.as_ref().unwrap().containers[0];
        let (cfg, subs) = container_config(&p, c, 0, &node, &EnvObjects::default()).unwrap();
        let target = vols.join("u1/.subpaths/v/c/1");
        assert_eq!(cfg.mounts[1].host_path, target.display().to_string());
        assert_eq!(
            subs,
            vec![SubPath {
                name: "v".into(),
                volume: vols.join("u1/v"),
                sub: "d/x".into(),
                target
            }]
        );
        for bad in ["../x", "/etc", "a/../../x"] {
            let m: k8s_openapi::api::core::v1::VolumeMount =
                serde_json::from_value(serde_json::json!({"name": "v", "mountPath": "/v"}))
                    .unwrap();
            let e = sub_path(&p, c, 0, &m, "/vol", bad, &node).unwrap_err();
            assert!(e.0.contains("subPath"), "{bad:?}: {e:?}");
        }
    }

    #[test]
    fn env_expansion_and_field_refs() {
        let p = pod(&format!(
            "{BASE}spec:\n  containers:\n  - name: a\n    image: x\n    command: [sh, -c, 'echo $(GREETING) $(POD) $$(LITERAL) $(MISSING)']\n    env:\n    - {{name: POD, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}\n    - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}\n    - {{name: APP, valueFrom: {{fieldRef: {{fieldPath: \"metadata.labels['app']\"}}}}}}\n    - {{name: GREETING, value: 'hi $(POD)'}}\n    - {{name: MEM, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}\n    resources: {{limits: {{memory: 64Mi}}}}\n"
        ));
        let node = NodeContext {
            node_name: "pi".into(),
            node_ip: "192.0.2.1".into(),
            ..Default::default()
        };
        let (c, _) = container_config(
            &p,
            &p.spec.as_ref().unwrap().containers[0],
            2,
            &node,
            &EnvObjects::default(),
        )
        .unwrap();
        assert_eq!(c.command[2], "echo hi web web $(LITERAL) $(MISSING)");
        let env: BTreeMap<_, _> = c.env.iter().cloned().collect();
        assert_eq!(env["NODE"], "pi");
        assert_eq!(env["APP"], "web");
        assert_eq!(env["MEM"], "64");
        assert_eq!(c.log_path, "a/2.log");
        assert_eq!(c.memory_limit, Some(64 << 20));
        assert_eq!(c.termination_message_path, "/dev/termination-log");
    }

    #[test]
    fn config_errors_like_upstream() {
        let p = pod(&format!(
            "{BASE}spec:\n  containers:\n  - name: a\n    image: x\n    env:\n    - {{name: K, valueFrom: {{configMapKeyRef: {{name: cm, key: k}}}}}}\n"
        ));
        let e = container_config(
            &p,
            &p.spec.as_ref().unwrap().containers[0],
            0,
            &NodeContext::default(),
            &EnvObjects::default(),
        )
        .unwrap_err();
        assert!(e.0.contains("configmap \"cm\" not found"), "{e:?}");
    }

    #[test]
    fn env_from_configmaps_and_secrets() {
        let p = pod(&format!(
            "{BASE}spec:\n  containers:\n  - name: a\n    image: x\n    envFrom:\n    - {{configMapRef: {{name: cm}}, prefix: CM_}}\n    - {{secretRef: {{name: gone, optional: true}}}}\n    env:\n    - {{name: CM_a, value: overridden}}\n    - {{name: PW, valueFrom: {{secretKeyRef: {{name: s, key: pw}}}}}}\n    - {{name: OPT, valueFrom: {{configMapKeyRef: {{name: cm, key: nokey, optional: true}}}}}}\n    - {{name: REF, value: '$(CM_b)'}}\n"
        ));
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            EnvObjects::refs(c),
            vec![
                (ObjectKind::ConfigMap, "cm".to_string()),
                (ObjectKind::Secret, "gone".to_string()),
                (ObjectKind::Secret, "s".to_string())
            ]
        );
        let data = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        let mut objs = EnvObjects::default();
        objs.0.insert(
            (ObjectKind::ConfigMap, "cm".into()),
            data(&[("a", "1"), ("b", "2"), ("bad key", "x")]),
        );
        objs.0.insert((ObjectKind::Secret, "gone".into()), None);
        objs.0
            .insert((ObjectKind::Secret, "s".into()), data(&[("pw", "hunter2")]));
        let (cfg, _) = container_config(&p, c, 0, &NodeContext::default(), &objs).unwrap();
        let env: BTreeMap<_, _> = cfg.env.iter().cloned().collect();
        assert_eq!(env["CM_a"], "overridden");
        assert_eq!(env["CM_b"], "2");
        assert_eq!(env["PW"], "hunter2");
        assert_eq!(env["REF"], "2");
        assert!(!env.contains_key("OPT") && !env.contains_key("CM_bad key"));
        objs.0
            .insert((ObjectKind::Secret, "s".into()), data(&[("other", "x")]));
        let e = container_config(&p, c, 0, &NodeContext::default(), &objs).unwrap_err();
        assert_eq!(e.0, "couldn't find key pw in Secret edge/s");
    }

    #[test]
    fn a_sandbox_is_privileged_when_any_container_is() {
        let node = NodeContext::default();
        let plain = pod(&format!(
            "{BASE}spec:\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert!(!sandbox_config(&plain, &node).privileged);
        let init = pod(&format!(
            "{BASE}spec:\n  initContainers: [{{name: i, image: x, securityContext: {{privileged: true}}}}]\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert!(sandbox_config(&init, &node).privileged);
    }

    #[test]
    fn dns_and_hosts() {
        let p = pod(&format!(
            "{BASE}spec:\n  hostAliases: [{{ip: 10.1.2.3, hostnames: [db]}}]\n  containers: [{{name: a, image: x}}]\n"
        ));
        let node = NodeContext {
            node_name: "pi".into(),
            node_ip: "192.0.2.1".into(),
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            log_root: "/var/log/pods".into(),
            ..Default::default()
        };
        let s = sandbox_config(&p, &node);
        assert_eq!(s.hostname, "web");
        assert!(s.resolv_conf.starts_with("nameserver 10.96.0.10\nsearch edge.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5"), "{}", s.resolv_conf);
        assert!(s.hosts.contains("10.1.2.3\tdb") && s.hosts.contains("192.0.2.1\tweb"));
        assert_eq!(s.log_directory, "/var/log/pods/edge_web_u-1");
        assert_eq!(s.cgroup_parent, "kubepods/besteffort/podu-1");
        // A subdomain gives the FQDN line; setHostnameAsFQDN the FQDN as
        // the hostname; hostnameOverride replaces name and domain.
        let sub = pod(&format!(
            "{BASE}spec:\n  subdomain: db\n  setHostnameAsFQDN: true\n  containers: [{{name: a, image: x}}]\n"
        ));
        let s = sandbox_config(&sub, &node);
        assert_eq!(s.hostname, "web.db.edge.svc.cluster.local");
        assert!(
            s.hosts
                .contains("192.0.2.1\tweb.db.edge.svc.cluster.local\tweb\n"),
            "{}",
            s.hosts
        );
        let over = pod(&format!(
            "{BASE}spec:\n  hostname: h\n  subdomain: db\n  hostnameOverride: other\n  containers: [{{name: a, image: x}}]\n"
        ));
        let s = sandbox_config(&over, &node);
        assert_eq!(s.hostname, "other");
        // hostNetwork: the node's own file under its header, then aliases.
        let d = tempfile::tempdir().unwrap();
        let etc = d.path().join("hosts");
        std::fs::write(&etc, "10.0.0.5\tthe-node\n").unwrap();
        let host_node = NodeContext {
            etc_hosts: etc.display().to_string(),
            ..node.clone()
        };
        let hn = pod(&format!(
            "{BASE}spec:\n  hostNetwork: true\n  hostAliases: [{{ip: 10.1.2.3, hostnames: [db, db2]}}]\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert_eq!(
            sandbox_config(&hn, &host_node).hosts,
            "# Kubernetes-managed hosts file (host network).\n10.0.0.5\tthe-node\n\n# Entries added by HostAliases.\n10.1.2.3\tdb\tdb2\n"
        );
        assert!(s.hosts.contains("192.0.2.1\tother\n"), "{}", s.hosts);
    }
}
