//! Helpers every part of the pod lifecycle shares, importing nothing of
//! `pods`: pod names and UIDs as messages and paths write them, paths
//! built from pod data that cannot leave their base, the containers of a
//! spec, the node facts the pure parts read, and the wall clock.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
#[cfg(test)]
use tokio::time::Instant;

/// Plain facts of the node that turning a pod spec into runtime configs
/// reads (names, addresses, capacities, dirs); no handles.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
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
    /// Where the kubelet's files of each pod live:
    /// `<pods_dir>/<uid>/` ([`crate::pods::podfiles`]); empty: none.
    pub pods_dir: String,
    /// The lowest OOM score adjustment kinglet may give (−1000 with
    /// CAP_SYS_RESOURCE; else its own, as the kernel allows no lower).
    pub min_oom_score_adj: i32,
    /// `<runtime>://`, the prefix of container IDs in pod statuses.
    pub container_id_scheme: String,
    /// The node's hosts file, which hostNetwork pods get (empty: `/etc/hosts`).
    pub etc_hosts: String,
    /// The node's swap, for containers' swap limits.
    pub swap: crate::cm::swap::NodeSwap,
}

/// The wall clock container times are compared with. `System` in
/// production; `Tokio` follows tokio's (pausable) clock from the moment it
/// was made, so back-off and deadline tests run in paused time.
#[derive(Clone, Copy, Debug, Default)]
pub enum Clock {
    #[default]
    System,
    #[cfg(test)]
    Tokio { base_nanos: i64, base: Instant },
}

impl Clock {
    #[cfg(test)]
    pub fn following_tokio() -> Clock {
        Clock::Tokio {
            base_nanos: jiff::Timestamp::now().as_nanosecond() as i64,
            base: Instant::now(),
        }
    }

    /// Unix nanoseconds.
    pub fn now_nanos(&self) -> i64 {
        match self {
            Clock::System => jiff::Timestamp::now().as_nanosecond() as i64,
            #[cfg(test)]
            Clock::Tokio { base_nanos, base } => base_nanos + base.elapsed().as_nanos() as i64,
        }
    }

    pub fn now(&self) -> jiff::Timestamp {
        jiff::Timestamp::from_nanosecond(i128::from(self.now_nanos())).unwrap_or_default()
    }
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
    pub fn title(self) -> &'static str {
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
    ) -> kinglet_runtime::BoxFuture<'a, Result<Option<BTreeMap<String, String>>, ObjectError>>;
}

/// Why the objects a pod reads (ConfigMaps, Secrets, the Services of its
/// environment) could not be read; the messages are upstream's. The causes
/// are kept as text: the cache hands one error to every pod waiting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("couldn't get {kind:?} {namespace}/{name}: {cause}")]
    Get {
        kind: ObjectKind,
        namespace: String,
        name: String,
        cause: String,
    },
    /// The watch's first list failed (kube's watcher error).
    #[error("{0}")]
    Watch(String),
    #[error("failed to sync {} cache: timed out waiting for the condition ({namespace}/{name})", kind.lower())]
    SyncTimeout {
        kind: ObjectKind,
        namespace: String,
        name: String,
    },
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotListed,
    #[error("the API server did not answer in time")]
    NoAnswer,
}

/// Why a container config cannot be built: upstream's
/// `CreateContainerConfigError`.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

/// A quantity in thousandths (cpu `250m` → 250, `1` → 1000; bytes × 1000);
/// 0 when unparsable (the apiserver validated it).
pub fn quantity_milli(q: &str) -> u128 {
    crate::config::parse_quantity_milli(q).unwrap_or(0)
}

pub fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// `<namespace>_<name>_<uid>`, the pod's dir under the log root.
pub fn log_dir_name(pod: &Pod) -> String {
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
pub fn pod_log_dir(pod: &Pod, node: &NodeFacts) -> Option<std::path::PathBuf> {
    contained_child(std::path::Path::new(&node.log_root), &log_dir_name(pod))
}

/// `scheduling.SystemCriticalPriority`.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A static pod (from a file or URL source; the kubelet's own, exempt from
/// what the API server's pods meet: taints, the Node authorizer's scope).
pub fn is_static(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    annotations
        .and_then(|a| a.get("kubernetes.io/config.source"))
        .is_some_and(|s| s != "api")
}

/// Static pods, mirror pods and pods at system-critical priority
/// (upstream's `IsCriticalPod`: never evicted, never given swap).
pub fn is_critical(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let mirror = annotations.is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    is_static(pod) || mirror || priority >= SYSTEM_CRITICAL_PRIORITY
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

/// A pod's effective requests (upstream's `PodRequests`; cpu in
/// millicores, memory in bytes): its containers and sidecars together, or
/// its largest init container next to the sidecars before it if larger.
pub fn pod_requests(pod: &Pod) -> (u128, u128) {
    let Some(spec) = &pod.spec else { return (0, 0) };
    let req = |c: &k8s_openapi::api::core::v1::Container, r: &str| -> u128 {
        let res = c.resources.clone().unwrap_or_default();
        res.requests
            .as_ref()
            .and_then(|m| m.get(r))
            .or_else(|| res.limits.as_ref().and_then(|m| m.get(r)))
            .map_or(0, |q| quantity_milli(&q.0))
    };
    // Upstream's `PodRequests`: the containers and the sidecars add up;
    // an init container runs next to the sidecars started before it, and
    // the pod needs the larger of the two.
    let total = |r: &str| {
        let mut sum = spec
            .containers
            .iter()
            .fold(0u128, |acc, c| acc.saturating_add(req(c, r)));
        let (mut sidecars, mut init_max) = (0u128, 0u128);
        for c in spec.init_containers.iter().flatten() {
            let here = if is_sidecar(c) {
                sum = sum.saturating_add(req(c, r));
                sidecars = sidecars.saturating_add(req(c, r));
                sidecars
            } else {
                req(c, r).saturating_add(sidecars)
            };
            init_max = init_max.max(here);
        }
        sum.max(init_max)
    };
    (total("cpu"), total("memory") / 1000)
}

/// The sooner of two optional delays (none: no wake-up wanted).
pub fn soonest(
    a: Option<std::time::Duration>,
    b: Option<std::time::Duration>,
) -> Option<std::time::Duration> {
    a.into_iter().chain(b).min()
}

/// The pod's service account: `serviceAccountName`, else `default` (what
/// the apiserver's admission would have set).
pub fn service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// A label selector that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("{0:?} is not a valid label selector operator")]
    Operator(String),
    #[error("for 'In', 'NotIn' operators, values set can't be empty")]
    NoValues,
    #[error("values set must be empty for 'Exists', 'DoesNotExist'")]
    Values,
}

/// Whether `labels` match `selector` as upstream's
/// `LabelSelectorAsSelector` reads it: an unset selector matches
/// nothing, an empty one everything.
pub fn selector_matches(
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let Some(s) = selector else {
        return Ok(false);
    };
    let mut ok = s
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    for e in s.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default();
        let has = labels.get(&e.key);
        let m = match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => return Err(SelectorError::NoValues),
            "Exists" | "DoesNotExist" if !values.is_empty() => return Err(SelectorError::Values),
            "In" => has.is_some_and(|v| values.contains(v)),
            "NotIn" => !has.is_some_and(|v| values.contains(v)),
            "Exists" => has.is_some(),
            "DoesNotExist" => has.is_none(),
            op => return Err(SelectorError::Operator(op.into())),
        };
        ok &= m;
    }
    Ok(ok)
}

/// About the length of a selector's text form (upstream bounds it).
pub fn selector_len(s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> usize {
    let labels: usize = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len() + 2)
        .sum();
    let exprs: usize = s
        .match_expressions
        .iter()
        .flatten()
        .map(|e| {
            let values: usize = e.values.iter().flatten().map(|v| v.len() + 1).sum();
            e.key.len() + e.operator.len() + values + 4
        })
        .sum();
    labels + exprs
}
