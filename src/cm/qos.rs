//! QoS classes and what follows from them, as upstream's `qos` package
//! and cgroupfs driver: a pod's class, its cgroup parent under the pods'
//! cgroup, and its containers' OOM score adjustments.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::{parse_quantity, parse_quantity_milli};

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
                parse_quantity_milli(&q.0).ok().filter(|v| *v > 0)
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

/// `kubepods/pod<uid>` (Guaranteed), `kubepods/burstable/pod<uid>`,
/// `kubepods/besteffort/pod<uid>`, as upstream's cgroupfs driver names
/// them, under `pods_cgroup` (`<cgroupRoot>/kubepods`; empty: `kubepods`).
pub fn cgroup_parent(pod: &Pod, pods_cgroup: &str) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    const BASE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: edge, uid: u-1, labels: {app: web}}\n";

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
}
