//! Which pod goes first, and what its status says (upstream's
//! `rankMemoryPressure` and `evictionMessage`): pods whose usage exceeds
//! their requests first, then lower priority, then the larger usage above
//! requests. Critical pods — priority ≥ 2000000000, static and mirror
//! pods — are never candidates (upstream's `IsCriticalPod`).

use k8s_openapi::api::core::v1::Pod;

pub use crate::pods::util::is_critical;

/// One container's share of the resource being reclaimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerUse {
    pub name: String,
    pub usage: u64,
    pub request: u64,
}

/// A pod that may be evicted.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub uid: String,
    pub pod: std::sync::Arc<Pod>,
    pub priority: i32,
    pub usage: u64,
    pub request: u64,
    pub containers: Vec<ContainerUse>,
}

impl Candidate {
    fn exceeds(&self) -> bool {
        self.usage > self.request
    }

    fn above_request(&self) -> i128 {
        i128::from(self.usage) - i128::from(self.request)
    }
}

/// Orders candidates, first to evict first.
pub fn rank(c: &mut [Candidate]) {
    c.sort_by(|a, b| {
        b.exceeds()
            .cmp(&a.exceeds())
            .then(a.priority.cmp(&b.priority))
            .then(b.above_request().cmp(&a.above_request()))
    });
}

/// A quantity as Kubernetes prints a binary one: the largest unit that
/// divides it, else bytes.
pub fn quantity(bytes: u64) -> String {
    for (shift, unit) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Upstream's eviction message: the resource, the threshold and what was
/// available, and each container using more than it requested.
pub fn message(resource: &str, threshold: &str, available: &str, c: &Candidate) -> String {
    let mut m = format!(
        "The node was low on resource: {resource}. Threshold quantity: {threshold}, available: {available}. "
    );
    for u in c.containers.iter().filter(|u| u.usage > u.request) {
        m.push_str(&format!(
            "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
            u.name,
            quantity(u.usage),
            quantity(u.request)
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(uid: &str, priority: i32, usage: u64, request: u64) -> Candidate {
        Candidate {
            uid: uid.into(),
            pod: Default::default(),
            priority,
            usage,
            request,
            containers: vec![ContainerUse {
                name: "c".into(),
                usage,
                request,
            }],
        }
    }

    #[test]
    fn over_requests_then_priority_then_usage_above_requests() {
        let mut c = vec![
            cand("within", 0, 100, 200),
            cand("over-high-prio", 1000, 300, 100),
            cand("over-small", 0, 150, 100),
            cand("over-big", 0, 900, 100),
        ];
        rank(&mut c);
        let order: Vec<&str> = c.iter().map(|c| c.uid.as_str()).collect();
        assert_eq!(
            order,
            ["over-big", "over-small", "over-high-prio", "within"]
        );
    }

    #[test]
    fn static_mirror_and_system_critical_pods_are_critical() {
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
        let plain = pod(
            serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.source": "api"}}}),
        );
        assert!(!is_critical(&plain));
        assert!(is_critical(&pod(
            serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.source": "file"}}})
        )));
        assert!(is_critical(&pod(
            serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})
        )));
        assert!(is_critical(&pod(
            serde_json::json!({"spec": {"containers": [], "priority": 2000001000}})
        )));
    }

    #[test]
    fn the_message_is_upstreams() {
        let c = cand("u", 0, 300 << 20, 0);
        assert_eq!(
            message("memory", "150Mi", &quantity(100 << 20), &c),
            "The node was low on resource: memory. Threshold quantity: 150Mi, available: 100Mi. Container c was using 300Mi, request is 0, has larger consumption of memory. "
        );
        assert_eq!(quantity(1536), "1536");
        assert_eq!(quantity(3 << 10), "3Ki");
        assert_eq!(quantity(0), "0");
    }
}
