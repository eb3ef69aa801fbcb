//! A container's swap, as upstream's `kuberuntime_container_linux.go`
//! configures it (NodeSwap, GA in 1.34). With `memorySwap.swapBehavior:
//! LimitedSwap` on cgroup v2, a container of a Burstable pod that is not
//! critical and requests memory below its limit gets
//! `memory.swap.max = request / node memory × node swap`; every other
//! container gets no swap: `memory.swap.max = 0` on v2, and on v1 (where
//! upstream never gives swap) memory+swap equal to its memory limit.
//! Without a swap controller (v1 without `memsw`, v2 without
//! `memory.swap.max`) nothing is set.

use k8s_openapi::api::core::v1::{Container, Pod};
use kinglet_runtime::podcgroup::Hierarchy;

pub use crate::cm::swap::NodeSwap;

use crate::config::parse_quantity;

/// What the runtime is told: v1's memory+swap limit, or v2's
/// `memory.swap.max`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapLimits {
    pub memory_swap: Option<i64>,
    pub swap_max: Option<i64>,
}

/// The container's swap limits (upstream's `configureContainerSwapResources`).
pub fn container_swap(
    pod: &Pod,
    c: &Container,
    node: &NodeSwap,
    memory_capacity: u64,
    memory_limit: Option<i64>,
) -> SwapLimits {
    match node.controller {
        None => SwapLimits::default(),
        Some(Hierarchy::V1) => SwapLimits {
            memory_swap: memory_limit,
            swap_max: None,
        },
        Some(Hierarchy::V2) => {
            let limited = node
                .limited
                .then(|| limited_swap(pod, c, node.capacity, memory_capacity))
                .flatten();
            SwapLimits {
                memory_swap: None,
                swap_max: Some(limited.unwrap_or(0)),
            }
        }
    }
}

/// LimitedSwap's share for a container that may swap; `None` for one that
/// may not (critical, not Burstable, no memory request, request equal to
/// its limit, or a request the formula cannot take).
fn limited_swap(pod: &Pod, c: &Container, swap: u64, memory_capacity: u64) -> Option<i64> {
    if crate::pods::util::is_critical(pod) || crate::cm::qos::qos_class(pod) != "Burstable" {
        return None;
    }
    let res = c.resources.clone().unwrap_or_default();
    let memory = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        m.and_then(|m| m.get("memory"))
            .and_then(|q| parse_quantity(&q.0).ok())
            .unwrap_or(0)
    };
    let (request, limit) = (memory(res.requests.as_ref()), memory(res.limits.as_ref()));
    if (request == 0 && limit == 0) || request == limit {
        return None;
    }
    // Upstream refuses (and gives no swap) a request above the node's memory.
    if memory_capacity == 0 || request > memory_capacity {
        return None;
    }
    let share = request as f64 / memory_capacity as f64 * swap as f64;
    Some(share as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(resources: &str, extra: &str) -> (Pod, Container) {
        let y = format!(
            "metadata: {{name: p, namespace: d, uid: u}}\nspec: {{{extra}containers: [{{name: c, image: x, resources: {resources}}}]}}"
        );
        let v: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        let p: Pod = serde_json::from_value(v).unwrap();
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        (p, c)
    }

    const GIB: u64 = 1 << 30;
    const LIMITED_V2: NodeSwap = NodeSwap {
        limited: true,
        controller: Some(Hierarchy::V2),
        capacity: 2 * GIB,
    };

    #[test]
    fn limited_swap_is_the_request_share_of_the_nodes_swap() {
        // 1 GiB of a 4 GiB node with 2 GiB swap: 512 MiB.
        let (p, c) = pod("{requests: {memory: 1Gi}, limits: {memory: 2Gi}}", "");
        let s = container_swap(&p, &c, &LIMITED_V2, 4 * GIB, Some(2 << 30));
        assert_eq!(
            s,
            SwapLimits {
                memory_swap: None,
                swap_max: Some(512 << 20)
            }
        );
    }

    #[test]
    fn the_others_get_none_on_v2() {
        let none = SwapLimits {
            memory_swap: None,
            swap_max: Some(0),
        };
        for (res, extra) in [
            // Guaranteed: request equals limit (cpu too).
            (
                "{requests: {memory: 1Gi, cpu: 1}, limits: {memory: 1Gi, cpu: 1}}",
                "",
            ),
            // BestEffort.
            ("{}", ""),
            // Burstable without a memory request.
            ("{requests: {cpu: 100m}}", ""),
            // Burstable but system-critical.
            ("{requests: {memory: 1Gi}}", "priority: 2000001000, "),
            // A request above the node's memory.
            ("{requests: {memory: 8Gi}}", ""),
        ] {
            let (p, c) = pod(res, extra);
            assert_eq!(
                container_swap(&p, &c, &LIMITED_V2, 4 * GIB, None),
                none,
                "{res} {extra}"
            );
        }
        // NoSwap: none for anyone.
        let (p, c) = pod("{requests: {memory: 1Gi}}", "");
        let no_swap = NodeSwap {
            limited: false,
            ..LIMITED_V2
        };
        assert_eq!(container_swap(&p, &c, &no_swap, 4 * GIB, None), none);
    }

    #[test]
    fn v1_caps_memory_and_swap_at_the_memory_limit_and_no_controller_sets_nothing() {
        let (p, c) = pod("{requests: {memory: 1Gi}, limits: {memory: 2Gi}}", "");
        let v1 = NodeSwap {
            controller: Some(Hierarchy::V1),
            ..LIMITED_V2
        };
        let s = container_swap(&p, &c, &v1, 4 * GIB, Some(2 << 30));
        assert_eq!(
            s,
            SwapLimits {
                memory_swap: Some(2 << 30),
                swap_max: None
            }
        );
        let off = NodeSwap {
            controller: None,
            ..LIMITED_V2
        };
        assert_eq!(
            container_swap(&p, &c, &off, 4 * GIB, Some(2 << 30)),
            SwapLimits::default()
        );
    }
}
