//! In-place pod resize, the node's side (upstream's allocation manager,
//! `pkg/kubelet/allocation`): the resources each pod's containers are
//! allocated, which is what the pod workers run — not the spec, which a
//! `resize` can change at any time. A spec that differs from its
//! allocation is a resize: admitted against node allocatable next to the
//! other pods' allocations it is allocated (`ResizeStarted`), else it
//! stays pending with upstream's `PodResizePending` condition and
//! `Deferred` reason (retried as pods go and every 10 s) or `Infeasible`
//! (never, until the spec changes again).
//!
//! The allocation lives in the pod's status record (`pods/<uid>.json`,
//! written through a temp file and a rename with each status change), so
//! a restart mid-resize carries on from what was allocated; a pod without
//! one is allocated what its spec says.
//!
//! Resizable are the regular containers and the sidecars, as upstream
//! without `InPlacePodVerticalScalingInitContainers` (alpha).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use super::admit::{self, Allocatable};
use super::util::{is_sidecar, quantity_milli};

/// Each resizable container's allocated resources, by name.
pub type PodAllocation = BTreeMap<String, ResourceRequirements>;

/// The containers a resize may change.
pub fn resizable(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let inits = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten());
    let regular = spec.into_iter().flat_map(|s| s.containers.iter());
    inits.filter(|c| is_sidecar(c)).chain(regular)
}

/// What the pod's spec asks for, as an allocation.
pub fn of(pod: &Pod) -> PodAllocation {
    resizable(pod)
        .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
        .collect()
}

/// Whether two resource requirements are the same amounts (`1` and
/// `1000m` are), as upstream's semantic equality.
pub fn same(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    type List = Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>;
    let eq = |x: &List, y: &List| {
        let (x, y) = (x.clone().unwrap_or_default(), y.clone().unwrap_or_default());
        x.len() == y.len()
            && x.iter().all(|(k, v)| {
                y.get(k)
                    .is_some_and(|w| quantity_milli(&v.0) == quantity_milli(&w.0))
            })
    };
    eq(&a.requests, &b.requests) && eq(&a.limits, &b.limits)
}

/// `pod` with its containers' resources replaced by `alloc`'s (upstream's
/// `UpdatePodFromAllocation`); `None` when they are the same already.
pub fn apply(pod: &Pod, alloc: &PodAllocation) -> Option<Pod> {
    let differs = |c: &Container| {
        alloc
            .get(&c.name)
            .is_some_and(|a| !same(a, &c.resources.clone().unwrap_or_default()))
    };
    if !resizable(pod).any(differs) {
        return None;
    }
    let mut out = pod.clone();
    let spec = out.spec.as_mut()?;
    let all = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for c in all {
        if let Some(a) = alloc.get(&c.name) {
            c.resources = Some(a.clone());
        }
    }
    Some(out)
}

/// `PodResizePending`'s reasons.
pub const DEFERRED: &str = "Deferred";
pub const INFEASIBLE: &str = "Infeasible";

/// A resize not (yet) allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub reason: &'static str,
    pub message: String,
    /// The pod generation it was decided for.
    pub generation: Option<i64>,
}

/// What became of a pod's resize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The spec is what is allocated (any pending resize was reverted).
    Unchanged,
    /// Allocated now: the workers run the new resources.
    Allocated,
    /// Not allocated; `true` when this decision is new.
    Pending(Pending, bool),
}

/// Whether a resize may be allocated at all (upstream's resize admit
/// handler): a container with swap (`LimitedSwap`) cannot have its memory
/// request changed in place unless its memory resize restarts it.
fn infeasible(
    desired: &Pod,
    allocated: &PodAllocation,
    swaps: &dyn Fn(&Container) -> bool,
) -> Option<String> {
    let memory = |r: Option<&ResourceRequirements>| {
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get("memory"))
            .map(|q| quantity_milli(&q.0))
    };
    let restarts_on_memory = |c: &Container| {
        c.resize_policy
            .iter()
            .flatten()
            .any(|p| p.resource_name == "memory" && p.restart_policy == "RestartContainer")
    };
    resizable(desired)
        .filter(|c| allocated.contains_key(&c.name))
        .any(|c| {
            memory(c.resources.as_ref()) != memory(allocated.get(&c.name))
                && !restarts_on_memory(c)
                && swaps(c)
        })
        .then(|| "In-place resize of containers with swap is not supported.".to_string())
}

/// Decides the resize of `desired` (a pod whose spec differs from
/// `allocated`) next to the `others`' allocated pods.
pub fn decide(
    desired: &Pod,
    allocated: &PodAllocation,
    others: &[&Pod],
    node: &Allocatable,
    swaps: &dyn Fn(&Container) -> bool,
) -> Result<(), Pending> {
    let generation = desired.metadata.generation;
    if let Some(message) = infeasible(desired, allocated, swaps) {
        return Err(Pending {
            reason: INFEASIBLE,
            message,
            generation,
        });
    }
    admit::resources_fit(desired, others, node).map_err(|s| Pending {
        reason: DEFERRED,
        message: s.to_string(),
        generation,
    })
}

/// The allocations of the pods this node runs, and their pending resizes.
#[derive(Default)]
pub struct Allocations {
    pods: HashMap<String, PodAllocation>,
    pending: HashMap<String, Pending>,
}

impl Allocations {
    /// A pod whose worker starts: allocated what its record says (a
    /// restart), else what its spec says.
    pub fn add(&mut self, uid: &str, pod: &Pod, recorded: Option<PodAllocation>) {
        let alloc = recorded.unwrap_or_else(|| of(pod));
        self.pods.insert(uid.to_string(), alloc);
    }

    pub fn remove(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.pending.remove(uid);
    }

    pub fn get(&self, uid: &str) -> Option<&PodAllocation> {
        self.pods.get(uid)
    }

    pub fn pending(&self, uid: &str) -> Option<&Pending> {
        self.pending.get(uid)
    }

    /// The pods with a resize waiting for room.
    pub fn deferred(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.reason == DEFERRED)
            .map(|(u, _)| u.clone())
            .collect();
        v.sort();
        v
    }

    /// `pod` as its worker runs it: with the allocated resources.
    pub fn allocated_pod(&self, uid: &str, pod: &Pod) -> Pod {
        self.allocated(uid, pod).into_owned()
    }

    /// [`Self::allocated_pod`], borrowed where nothing differs.
    pub fn allocated<'a>(&self, uid: &str, pod: &'a Pod) -> std::borrow::Cow<'a, Pod> {
        match self.pods.get(uid).and_then(|a| apply(pod, a)) {
            Some(p) => std::borrow::Cow::Owned(p),
            None => std::borrow::Cow::Borrowed(pod),
        }
    }

    /// Looks at `pod`'s spec against its allocation: a resize is allocated
    /// if it fits next to `others` (allocated pods), else left pending.
    pub fn resize(
        &mut self,
        uid: &str,
        pod: &Pod,
        others: &[&Pod],
        node: &Allocatable,
        swaps: &dyn Fn(&Container) -> bool,
    ) -> Outcome {
        let Some(alloc) = self.pods.get(uid) else {
            return Outcome::Unchanged;
        };
        if apply(pod, alloc).is_none() {
            self.pending.remove(uid);
            return Outcome::Unchanged;
        }
        match decide(pod, alloc, others, node, swaps) {
            Ok(()) => {
                self.pods.insert(uid.to_string(), of(pod));
                self.pending.remove(uid);
                Outcome::Allocated
            }
            Err(p) => {
                let new = self
                    .pending
                    .get(uid)
                    .is_none_or(|old| old.reason != p.reason || old.generation != p.generation);
                self.pending.insert(uid.to_string(), p.clone());
                Outcome::Pending(p, new)
            }
        }
    }
}

/// Upstream's resize event message: `<prefix>: {"containers":[{"name":
/// …,"resources":{…}}],"generation":N}` with the error if any.
pub fn event_message(prefix: &str, pod: &Pod, error: Option<&str>) -> String {
    #[derive(serde::Serialize)]
    struct Entry<'a> {
        name: &'a str,
        resources: ResourceRequirements,
    }
    #[derive(serde::Serialize)]
    struct Summary<'a> {
        #[serde(rename = "initContainers", skip_serializing_if = "Vec::is_empty")]
        init_containers: Vec<Entry<'a>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        containers: Vec<Entry<'a>>,
        generation: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
    }
    fn entry(c: &Container) -> Entry<'_> {
        Entry {
            name: &c.name,
            resources: c.resources.clone().unwrap_or_default(),
        }
    }
    let spec = pod.spec.as_ref();
    let summary = Summary {
        init_containers: spec
            .into_iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .map(entry)
            .collect(),
        containers: spec
            .into_iter()
            .flat_map(|s| s.containers.iter())
            .map(entry)
            .collect(),
        generation: pod.metadata.generation.unwrap_or(0),
        error,
    };
    match serde_json::to_string(&summary) {
        Ok(json) => format!("{prefix}: {json}"),
        Err(_) => prefix.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    fn sized(cpu: &str, mem: &str, generation: i64) -> Pod {
        pod(&format!(
            "metadata: {{name: p, uid: u1, generation: {generation}}}
spec:
  initContainers:
  - {{name: init, image: x, resources: {{requests: {{cpu: 5m}}}}}}
  - {{name: side, image: x, restartPolicy: Always, resources: {{requests: {{cpu: 5m}}}}}}
  containers:
  - name: c
    image: x
    resizePolicy: [{{resourceName: memory, restartPolicy: RestartContainer}}]
    resources: {{requests: {{cpu: {cpu}, memory: {mem}}}}}"
        ))
    }

    fn node(cpu_milli: u128, memory: u128) -> Allocatable {
        Allocatable {
            cpu_milli,
            memory,
            pods: 110,
            ..Default::default()
        }
    }

    const NO_SWAP: &dyn Fn(&Container) -> bool = &|_| false;

    #[test]
    fn the_allocation_holds_the_sidecars_and_containers_and_compares_amounts() {
        let p = sized("1", "64Mi", 1);
        let a = of(&p);
        assert_eq!(a.keys().collect::<Vec<_>>(), ["c", "side"]);
        assert!(
            apply(&sized("1000m", "65536Ki", 2), &a).is_none(),
            "same amounts"
        );
        let grown = sized("2", "64Mi", 2);
        let back = apply(&grown, &a).unwrap();
        let c = &back.spec.unwrap().containers[0];
        assert_eq!(
            c.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0,
            "1"
        );
    }

    #[test]
    fn a_resize_that_fits_is_allocated_and_one_that_does_not_is_deferred() {
        let mut a = Allocations::default();
        let first = sized("500m", "64Mi", 1);
        a.add("u1", &first, None);
        let other = sized("1", "64Mi", 1);
        let node = node(2100, 1 << 30);
        assert_eq!(
            a.resize("u1", &first, &[&other], &node, NO_SWAP),
            Outcome::Unchanged
        );
        let grown = sized("1", "64Mi", 2);
        assert_eq!(
            a.resize("u1", &grown, &[&other], &node, NO_SWAP),
            Outcome::Allocated
        );
        assert!(apply(&grown, a.get("u1").unwrap()).is_none());
        // 1 + 1.5 CPUs of 2.1 (each sidecar's 5m counts too): deferred, with
        // upstream's message, once per generation.
        let too_big = sized("1500m", "64Mi", 3);
        let Outcome::Pending(p, true) = a.resize("u1", &too_big, &[&other], &node, NO_SWAP) else {
            panic!("not deferred");
        };
        assert_eq!(p.reason, DEFERRED);
        assert_eq!(
            p.message,
            "Node didn't have enough resource: cpu, requested: 1505, used: 1005, capacity: 2100"
        );
        assert!(matches!(
            a.resize("u1", &too_big, &[&other], &node, NO_SWAP),
            Outcome::Pending(_, false)
        ));
        assert_eq!(a.deferred(), ["u1"]);
        // Still running what was allocated; a revert clears the pending.
        let run = a.allocated_pod("u1", &too_big);
        assert_eq!(
            run.spec.unwrap().containers[0]
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap()["cpu"]
                .0,
            "1"
        );
        assert_eq!(
            a.resize("u1", &grown, &[&other], &node, NO_SWAP),
            Outcome::Unchanged
        );
        assert!(a.pending("u1").is_none());
        // Once the other pod is gone, it fits.
        assert_eq!(
            a.resize("u1", &too_big, &[], &node, NO_SWAP),
            Outcome::Allocated
        );
    }

    #[test]
    fn a_memory_request_change_of_a_swapping_container_is_infeasible() {
        let mut p = sized("1", "64Mi", 1);
        p.spec.as_mut().unwrap().containers[0].resize_policy = None;
        let alloc = of(&p);
        let mut q = p.clone();
        q.spec.as_mut().unwrap().containers[0] =
            sized("1", "128Mi", 2).spec.unwrap().containers[0].clone();
        q.spec.as_mut().unwrap().containers[0].resize_policy = None;
        let e = decide(&q, &alloc, &[], &node(4000, 1 << 30), &|_| true).unwrap_err();
        assert_eq!(e.reason, INFEASIBLE);
        assert_eq!(
            e.message,
            "In-place resize of containers with swap is not supported."
        );
        // A restart on memory resize makes it feasible.
        let r = sized("1", "128Mi", 2);
        assert!(
            decide(
                &r,
                &of(&sized("1", "64Mi", 1)),
                &[],
                &node(4000, 1 << 30),
                &|_| true
            )
            .is_ok()
        );
    }

    #[test]
    fn event_messages_are_upstreams() {
        let p = pod(
            "metadata: {name: p, generation: 2}\nspec: {containers: [{name: c, image: x, resources: {limits: {cpu: 5m}}}]}",
        );
        assert_eq!(
            event_message("Pod resize started", &p, None),
            r#"Pod resize started: {"containers":[{"name":"c","resources":{"limits":{"cpu":"5m"}}}],"generation":2}"#
        );
        assert!(
            event_message("Pod resize Deferred", &p, Some("no room"))
                .ends_with(r#""generation":2,"error":"no room"}"#)
        );
    }
}
