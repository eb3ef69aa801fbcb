//! Pod admission, as upstream's admit handlers decide it before a pod
//! starts: the node's labels must satisfy the pod's nodeSelector and
//! required node affinity, and the pod's requests must fit what is
//! allocatable next to the pods already admitted, their host ports must be
//! free, a pod from the API must tolerate the node's `NoExecute` taints,
//! and the node must not be under a pressure that refuses it. A rejected pod fails
//! with upstream's reason and message and never starts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod, PodStatus, Taint, Toleration};

use crate::pods::util::pod_requests;

/// What the node offers.
#[derive(Clone, Debug, Default)]
pub struct Allocatable {
    pub cpu_milli: u128,
    pub memory: u128,
    pub pods: usize,
    pub labels: NodeLabels,
    /// The node's `NoExecute` taints.
    pub taints: NodeTaints,
    /// The sysctls pods may set.
    pub sysctls: super::sysctls::Allowlist,
    /// The eviction manager's node conditions.
    pub pressure: Option<std::sync::Arc<crate::eviction::Pressure>>,
}

/// A fact of the Node as it is now: upstream admits against the Node its
/// informer holds, so a label an admin adds (`kubectl label node`) or a
/// `NoExecute` taint counts. The node agent keeps them current; a fixed
/// value serves tests and nodes without an API server.
#[derive(Clone, Debug)]
pub struct Current<T>(tokio::sync::watch::Receiver<T>);

impl<T> Current<T> {
    pub fn new(rx: tokio::sync::watch::Receiver<T>) -> Self {
        Current(rx)
    }

    pub fn fixed(value: T) -> Self {
        Current(tokio::sync::watch::channel(value).1)
    }
}

impl<T: Default> Default for Current<T> {
    fn default() -> Self {
        Self::fixed(T::default())
    }
}

/// The Node's labels.
pub type NodeLabels = Current<BTreeMap<String, String>>;
/// The Node's `NoExecute` taints (upstream's admission refuses a pod that
/// does not tolerate one; the taint manager evicts the running ones).
pub type NodeTaints = Current<Vec<Taint>>;

/// Upstream's `Toleration.ToleratesTaint` (without the alpha comparison
/// operators).
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or_default();
    let key = t.key.as_deref().unwrap_or_default();
    if (!effect.is_empty() && effect != taint.effect) || (!key.is_empty() && key != taint.key) {
        return false;
    }
    match t.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// Whether every one of `taints` is tolerated by the pod.
fn tolerates_all(pod: &Pod, taints: &[Taint]) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref());
    let tolerations = tolerations.unwrap_or_default();
    taints
        .iter()
        .all(|taint| tolerations.iter().any(|t| tolerates(t, taint)))
}

/// A rejection: reason and message as upstream words them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

impl Rejection {
    /// Upstream's `PredicateFailureError`: the predicate's name as the
    /// reason, "Predicate <name> failed: <why>" as the message.
    fn predicate(name: &str, why: &str) -> Self {
        Rejection {
            reason: name.into(),
            message: format!("Predicate {name} failed: {why}"),
        }
    }
}

/// Upstream's OS checks, before any other predicate: a `kubernetes.io/os`
/// pod label other than this node's, or a `spec.os.name` other than linux.
fn os_ok(pod: &Pod) -> Result<(), Rejection> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/os"));
    if label.is_some_and(|os| os != "linux") {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                .into(),
        });
    }
    let os = pod.spec.as_ref().and_then(|s| s.os.as_ref());
    if os.is_some_and(|os| os.name != "linux") {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    Ok(())
}

fn matches(req: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let v = labels.get(&req.key);
    let values = req.values.clone().unwrap_or_default();
    match req.operator.as_str() {
        "In" => v.is_some_and(|v| values.contains(v)),
        "NotIn" => v.is_none_or(|v| !values.contains(v)),
        "Exists" => v.is_some(),
        "DoesNotExist" => v.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(w)) = (
                v.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|w| w.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" { v > w } else { v < w }
        }
        _ => false,
    }
}

fn affinity_ok(pod: &Pod, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = &pod.spec else { return true };
    if let Some(sel) = &spec.node_selector
        && sel.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        // Terms are ORed, the expressions of a term ANDed.
        Some(r) => r.node_selector_terms.iter().any(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .all(|e| matches(e, labels))
        }),
        None => true,
    }
}

/// Whether `pod` tolerates the `memory-pressure:NoSchedule` taint.
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    let taint = Taint {
        key: "node.kubernetes.io/memory-pressure".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    tolerates_all(pod, std::slice::from_ref(&taint))
}

/// Upstream's eviction admit handler: under memory pressure only, pods
/// other than BestEffort (or tolerating the taint) are admitted; under
/// any other pressure, only critical pods.
pub fn admit_under_pressure(pod: &Pod, conditions: &[&str]) -> Result<(), Rejection> {
    if conditions.is_empty() || crate::eviction::rank::is_critical(pod) {
        return Ok(());
    }
    if conditions == ["MemoryPressure"]
        && (crate::cm::qos::qos_class(pod) != "BestEffort" || tolerates_memory_pressure(pod))
    {
        return Ok(());
    }
    Err(Rejection {
        reason: "Evicted".into(),
        message: format!("The node had condition: [{}]. ", conditions.join(" ")),
    })
}

/// Decides whether `pod` may run next to `admitted`.
pub fn admit(pod: &Pod, admitted: &[&Pod], node: &Allocatable) -> Result<(), Rejection> {
    // Upstream's order: eviction, the sysctl allowlist, then the predicates.
    if let Some(p) = &node.pressure {
        admit_under_pressure(pod, &p.conditions())?;
    }
    node.sysctls.admit(pod).map_err(|e| Rejection {
        reason: "SysctlForbidden".into(),
        message: e.to_string(),
    })?;
    os_ok(pod)?;
    // Then upstream's GeneralPredicates, whose first failure is told:
    // resources, node affinity, host ports.
    if admitted.len() + 1 > node.pods {
        return Err(Rejection {
            reason: "OutOfpods".into(),
            message: format!(
                "Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {}",
                admitted.len(),
                node.pods
            ),
        });
    }
    resources_fit(pod, admitted, node).map_err(|s| Rejection {
        reason: format!("OutOf{}", s.resource),
        message: s.to_string(),
    })?;
    if !affinity_ok(pod, &node.labels.0.borrow()) {
        let why = "node(s) didn't match Pod's node affinity/selector";
        return Err(Rejection::predicate("NodeAffinity", why));
    }
    if !ports_fit(pod, admitted) {
        let why = "node(s) didn't have free ports for the requested pod ports";
        return Err(Rejection::predicate("NodePorts", why));
    }
    if !crate::pods::util::is_static(pod) && !tolerates_all(pod, &node.taints.0.borrow()) {
        let why = "node(s) had taints that the pod didn't tolerate";
        return Err(Rejection::predicate("TaintToleration", why));
    }
    Ok(())
}

/// A pod's host ports as upstream's `GetHostPorts`: those of its
/// containers and sidecars (init containers that run all along), as (IP,
/// protocol, port) with upstream's defaults `0.0.0.0` and `TCP`.
fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| crate::pods::util::is_sidecar(c));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|&h| h > 0)?;
            let ip = p.host_ip.clone().filter(|i| !i.is_empty());
            let protocol = p.protocol.clone().filter(|p| !p.is_empty());
            Some((
                ip.unwrap_or_else(|| ANY_IP.into()),
                protocol.unwrap_or_else(|| "TCP".into()),
                port,
            ))
        })
        .collect()
}

const ANY_IP: &str = "0.0.0.0";

/// Upstream's `NodePorts` predicate: no host port of `pod` is taken by an
/// admitted pod (the same protocol and port on the same IP, or on any IP
/// when either side binds `0.0.0.0`).
fn ports_fit(pod: &Pod, admitted: &[&Pod]) -> bool {
    let wanted = host_ports(pod);
    if wanted.is_empty() {
        return true;
    }
    let used: Vec<(String, String, i32)> = admitted.iter().flat_map(|p| host_ports(p)).collect();
    !wanted.iter().any(|(ip, proto, port)| {
        used.iter().any(|(uip, uproto, uport)| {
            uproto == proto && uport == port && (ip == ANY_IP || uip == ANY_IP || uip == ip)
        })
    })
}

/// A resource the node has too little of for a pod (upstream's
/// `InsufficientResourceError`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub resource: &'static str,
    pub requested: u128,
    pub used: u128,
    pub capacity: u128,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Node didn't have enough resource: {}, requested: {}, used: {}, capacity: {}",
            self.resource, self.requested, self.used, self.capacity
        )
    }
}

/// Whether the pod's CPU and memory requests fit in what is allocatable
/// next to `admitted` (at admission, and for a resize).
pub fn resources_fit(pod: &Pod, admitted: &[&Pod], node: &Allocatable) -> Result<(), Shortfall> {
    let (cpu, mem) = pod_requests(pod);
    let used = |i: usize| {
        admitted.iter().fold(0u128, |a, p| {
            let r = pod_requests(p);
            a.saturating_add(if i == 0 { r.0 } else { r.1 })
        })
    };
    for (resource, requested, used, capacity) in [
        ("cpu", cpu, used(0), node.cpu_milli),
        ("memory", mem, used(1), node.memory),
    ] {
        if requested > 0 && used.saturating_add(requested) > capacity {
            return Err(Shortfall {
                resource,
                requested,
                used,
                capacity,
            });
        }
    }
    Ok(())
}

/// The status of a rejected pod, as upstream's `rejectPod` writes it: the
/// event tells the message, the status prefixes it; the QoS class stays.
pub fn rejected_status(pod: &Pod, r: &Rejection) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(r.reason.clone()),
        message: Some(format!("Pod was rejected: {}", r.message)),
        qos_class: Some(crate::cm::qos::qos_class(pod).into()),
        start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        )),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    fn node() -> Allocatable {
        Allocatable {
            cpu_milli: 2000,
            memory: 1 << 30,
            pods: 3,
            labels: NodeLabels::fixed(BTreeMap::from([
                ("kubernetes.io/arch".into(), "arm64".into()),
                ("zone".into(), "a".into()),
            ])),
            taints: Default::default(),
            sysctls: Default::default(),
            pressure: None,
        }
    }

    #[test]
    fn pods_for_another_os_are_refused_as_upstream() {
        let win = pod(
            "metadata: {name: w}\nspec: {os: {name: windows}, containers: [{name: c, image: i}]}",
        );
        assert_eq!(
            admit(&win, &[], &node()).unwrap_err().reason,
            "PodOSNotSupported"
        );
        let label = pod(
            "metadata: {name: l, labels: {kubernetes.io/os: windows}}\nspec: {containers: [{name: c, image: i}]}",
        );
        assert_eq!(
            admit(&label, &[], &node()).unwrap_err().reason,
            "PodOSSelectorNodeLabelDoesNotMatch"
        );
        let linux = pod(
            "metadata: {name: x}\nspec: {os: {name: linux}, containers: [{name: c, image: i}]}",
        );
        assert!(admit(&linux, &[], &node()).is_ok());
    }

    #[test]
    fn resources_fit_or_are_refused_with_upstream_reasons() {
        let big = pod(
            "metadata: {name: b}\nspec: {containers: [{name: c, image: i, resources: {requests: {cpu: 1500m, memory: 256Mi}}}]}",
        );
        let small = pod(
            "metadata: {name: s}\nspec: {containers: [{name: c, image: i, resources: {requests: {cpu: 600m}}}]}",
        );
        assert_eq!(pod_requests(&big), (1500, 256 << 20));
        assert!(admit(&big, &[], &node()).is_ok());
        let e = admit(&small, &[&big], &node()).unwrap_err();
        assert_eq!(e.reason, "OutOfcpu");
        assert_eq!(
            e.message,
            "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
        );
        let st = rejected_status(&small, &e);
        assert_eq!(
            st.message.as_deref(),
            Some(
                "Pod was rejected: Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
            )
        );
        assert_eq!(st.qos_class.as_deref(), Some("Burstable"));
        let unlabelled = pod(
            "metadata: {name: u}\nspec: {nodeSelector: {disk: ssd}, containers: [{name: c, image: i, resources: {requests: {cpu: 600m}}}]}",
        );
        assert_eq!(
            admit(&unlabelled, &[&big], &node()).unwrap_err().reason,
            "OutOfcpu",
            "resources are told before node affinity, as upstream"
        );
        let hog = pod(
            "metadata: {name: h}\nspec: {containers: [{name: c, image: i, resources: {limits: {memory: 900Mi}}}]}",
        );
        assert_eq!(
            admit(&hog, &[&big], &node()).unwrap_err().reason,
            "OutOfmemory"
        );
        let none = pod("metadata: {name: plain}\nspec: {containers: [{name: c, image: i}]}");
        assert_eq!(
            admit(&none, &[&none, &none, &none], &node())
                .unwrap_err()
                .reason,
            "OutOfpods"
        );
        // The largest init container counts if larger than the sum.
        let init = pod(
            "metadata: {name: i}\nspec: {initContainers: [{name: x, image: i, resources: {requests: {cpu: '3'}}}], containers: [{name: c, image: i}]}",
        );
        assert_eq!(pod_requests(&init).0, 3000);
    }

    #[test]
    fn a_host_port_taken_by_an_admitted_pod_is_refused_as_upstream() {
        let with_port = |ip: &str, proto: &str| {
            pod(&format!(
                "spec: {{containers: [{{name: c, ports: [{{containerPort: 80, hostPort: 8080, hostIP: '{ip}', protocol: '{proto}'}}]}}]}}"
            ))
        };
        let n = node();
        let any = with_port("", "");
        let err = admit(&with_port("10.0.0.1", "TCP"), &[&any], &n).unwrap_err();
        assert_eq!(err.reason, "NodePorts");
        assert_eq!(
            err.message,
            "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
        );
        assert!(
            admit(&with_port("", "UDP"), &[&any], &n).is_ok(),
            "another protocol"
        );
        let one = with_port("10.0.0.1", "TCP");
        assert!(
            admit(&with_port("10.0.0.2", "TCP"), &[&one], &n).is_ok(),
            "another IP"
        );
        assert!(admit(&any, &[&one], &n).is_err(), "0.0.0.0 takes every IP");
        let sidecar = pod(
            "spec: {containers: [{name: c}], initContainers: [{name: s, restartPolicy: Always, ports: [{containerPort: 1, hostPort: 8080}]}]}",
        );
        assert!(admit(&any, &[&sidecar], &n).is_err(), "a sidecar's port");
        let init = pod(
            "spec: {containers: [{name: c}], initContainers: [{name: i, ports: [{containerPort: 1, hostPort: 8080}]}]}",
        );
        assert!(
            admit(&any, &[&init], &n).is_ok(),
            "an init container's is not held"
        );
    }

    #[test]
    fn a_no_execute_taint_refuses_an_api_pod_that_does_not_tolerate_it() {
        let taint = Taint {
            key: "dedicated".into(),
            value: Some("edge".into()),
            effect: "NoExecute".into(),
            ..Default::default()
        };
        let n = Allocatable {
            taints: NodeTaints::fixed(vec![taint]),
            ..node()
        };
        let plain = pod("spec: {containers: [{name: c}]}");
        let err = admit(&plain, &[], &n).unwrap_err();
        assert_eq!(err.reason, "TaintToleration");
        assert_eq!(
            err.message,
            "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
        );
        for tolerations in [
            "[{key: dedicated, value: edge}]",
            "[{key: dedicated, operator: Exists, effect: NoExecute}]",
            "[{operator: Exists}]",
        ] {
            let p = pod(&format!(
                "spec: {{tolerations: {tolerations}, containers: [{{name: c}}]}}"
            ));
            assert!(admit(&p, &[], &n).is_ok(), "{tolerations}");
        }
        for tolerations in [
            "[{key: dedicated, value: cloud}]",
            "[{key: dedicated, operator: Exists, effect: NoSchedule}]",
        ] {
            let p = pod(&format!(
                "spec: {{tolerations: {tolerations}, containers: [{{name: c}}]}}"
            ));
            assert!(admit(&p, &[], &n).is_err(), "{tolerations}");
        }
        let static_pod = pod(
            "metadata: {annotations: {kubernetes.io/config.source: file}}\nspec: {containers: [{name: c}]}",
        );
        assert!(admit(&static_pod, &[], &n).is_ok(), "a static pod");
    }

    #[test]
    fn a_label_the_node_gains_admits_what_it_refused() {
        let (tx, rx) = tokio::sync::watch::channel(BTreeMap::new());
        let n = Allocatable {
            labels: NodeLabels::new(rx),
            pods: 3,
            ..node()
        };
        let p = pod(
            "metadata: {name: a}\nspec: {nodeSelector: {disk: ssd}, containers: [{name: c, image: i}]}",
        );
        assert_eq!(admit(&p, &[], &n).unwrap_err().reason, "NodeAffinity");
        tx.send_replace(BTreeMap::from([("disk".into(), "ssd".into())]));
        assert_eq!(admit(&p, &[], &n), Ok(()));
    }

    #[test]
    fn node_selector_and_affinity() {
        let ok = pod(
            "metadata: {name: a}\nspec: {nodeSelector: {zone: a}, containers: [{name: c, image: i}]}",
        );
        let bad = pod(
            "metadata: {name: b}\nspec: {nodeSelector: {zone: b}, containers: [{name: c, image: i}]}",
        );
        assert!(admit(&ok, &[], &node()).is_ok());
        assert_eq!(
            admit(&bad, &[], &node()).unwrap_err().reason,
            "NodeAffinity"
        );
        let aff = |op: &str, vals: &str| {
            pod(&format!(
                "metadata: {{name: x}}\nspec:\n  affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: {{nodeSelectorTerms: [{{matchExpressions: [{{key: kubernetes.io/arch, operator: {op}, values: {vals}}}]}}]}}}}}}\n  containers: [{{name: c, image: i}}]\n"
            ))
        };
        assert!(admit(&aff("In", "[arm64, arm]"), &[], &node()).is_ok());
        assert!(admit(&aff("NotIn", "[arm64]"), &[], &node()).is_err());
        assert!(admit(&aff("Exists", "[]"), &[], &node()).is_ok());
        assert!(admit(&aff("DoesNotExist", "[]"), &[], &node()).is_err());
    }

    #[test]
    fn pressure_refuses_best_effort_pods_and_any_pod_under_disk_pressure() {
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
        let be = pod(serde_json::json!({"spec": {"containers": [{"name": "c"}]}}));
        let burstable = pod(serde_json::json!({"spec": {"containers": [{"name": "c",
            "resources": {"requests": {"memory": "10Mi"}}}]}}));
        let tolerant = pod(serde_json::json!({"spec": {"containers": [{"name": "c"}],
            "tolerations": [{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]}}));
        assert!(admit_under_pressure(&be, &[]).is_ok());
        let r = admit_under_pressure(&be, &["MemoryPressure"]).unwrap_err();
        assert_eq!(r.reason, "Evicted");
        assert_eq!(r.message, "The node had condition: [MemoryPressure]. ");
        assert!(admit_under_pressure(&burstable, &["MemoryPressure"]).is_ok());
        assert!(admit_under_pressure(&tolerant, &["MemoryPressure"]).is_ok());
        let r = admit_under_pressure(&burstable, &["DiskPressure", "MemoryPressure"]).unwrap_err();
        assert_eq!(
            r.message,
            "The node had condition: [DiskPressure MemoryPressure]. "
        );
    }
}
