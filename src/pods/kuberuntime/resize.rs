//! In-place resize, the worker's part (upstream's `computePodResizeAction`
//! and the status' `resources`): which running containers' resources
//! differ from what the pod is allocated now, and whether each is updated
//! in place or restarted, per its `resizePolicy`; what the status reports
//! of each container's resources. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus, ResourceRequirements};
use kinglet_runtime::{ContainerState, ContainerStatus};

use super::plan::attempts;
use crate::pods::allocation::{resizable, same};
use crate::pods::util::quantity_milli;

/// The resources each container was last set to (made with, or resized
/// to): by container name, the ID of its latest attempt and what that
/// one was set to — upstream's "actuated" resources.
#[derive(Clone, Debug, Default)]
pub struct Actuated(BTreeMap<String, (String, ResourceRequirements)>);

impl Actuated {
    /// Attempt `id` of container `name` was set to `r`.
    pub fn set(&mut self, name: &str, id: &str, r: ResourceRequirements) {
        self.0.insert(name.to_string(), (id.to_string(), r));
    }

    /// What the attempt `id` of container `name` was set to, if known.
    pub fn get(&self, name: &str, id: &str) -> Option<&ResourceRequirements> {
        self.0.get(name).filter(|(i, _)| i == id).map(|(_, r)| r)
    }
}

/// What a resize does to one running container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Its cgroup changed in place.
    Update { name: String, id: String },
    /// Stopped and started again with the new resources.
    Restart { name: String, id: String },
}

fn amount(r: &ResourceRequirements, list: bool, name: &str) -> u128 {
    let m = if list { &r.limits } else { &r.requests };
    m.as_ref()
        .and_then(|m| m.get(name))
        .map_or(0, |q| quantity_milli(&q.0))
}

/// Whether `resource` (`cpu`, `memory`) changes from `have` to `want`.
fn changes(have: &ResourceRequirements, want: &ResourceRequirements, resource: &str) -> bool {
    [false, true]
        .iter()
        .any(|l| amount(have, *l, resource) != amount(want, *l, resource))
}

/// Whether a limit grows (a growing container is updated after the
/// shrinking ones, so their room is given back first).
fn grows(have: &ResourceRequirements, want: &ResourceRequirements) -> bool {
    // A limit of 0 is none: lifting one grows, setting one shrinks.
    let limit_grows = |h: u128, w: u128| h != 0 && (w == 0 || w > h);
    ["cpu", "memory"].iter().any(|r| {
        limit_grows(amount(have, true, r), amount(want, true, r))
            || amount(want, false, r) > amount(have, false, r)
    })
}

fn restarts_for(c: &Container, resource: &str) -> bool {
    c.resize_policy
        .iter()
        .flatten()
        .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
}

/// The running containers of `pod` (the allocated pod) whose actuated
/// resources differ from their allocation, shrinking ones first. A
/// container with no record was made with what it is allocated, as
/// upstream assumes of a pod it has no actuated record of.
pub fn actions(pod: &Pod, current: &[ContainerStatus], actuated: &Actuated) -> Vec<Action> {
    let mut shrink = Vec::new();
    let mut grow = Vec::new();
    for c in resizable(pod) {
        let Some(latest) = attempts(current, &c.name).first().copied() else {
            continue;
        };
        if latest.state != ContainerState::Running {
            continue;
        }
        let want = c.resources.clone().unwrap_or_default();
        let Some(have) = actuated.get(&c.name, &latest.id) else {
            continue;
        };
        if same(have, &want) {
            continue;
        }
        let (name, id) = (c.name.clone(), latest.id.clone());
        let restart = ["cpu", "memory"]
            .iter()
            .any(|r| changes(have, &want, r) && restarts_for(c, r));
        match (restart, grows(have, &want)) {
            (true, _) => shrink.push(Action::Restart { name, id }),
            (false, true) => grow.push(Action::Update { name, id }),
            (false, false) => shrink.push(Action::Update { name, id }),
        }
    }
    shrink.extend(grow);
    shrink
}

/// Fills each container status' `allocatedResources` (the requests it is
/// allocated) and `resources` (what its cgroup was set to while it runs,
/// else what it is allocated), as upstream's status does.
pub fn status_resources(
    st: &mut PodStatus,
    pod: &Pod,
    current: &[ContainerStatus],
    actuated: &Actuated,
) {
    let spec = pod.spec.as_ref();
    let specs: BTreeMap<&str, &Container> = spec
        .into_iter()
        .flat_map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
        })
        .map(|c| (c.name.as_str(), c))
        .collect();
    let statuses = st
        .init_container_statuses
        .iter_mut()
        .flatten()
        .chain(st.container_statuses.iter_mut().flatten());
    for s in statuses {
        let Some(c) = specs.get(s.name.as_str()) else {
            continue;
        };
        let allocated = c.resources.clone().unwrap_or_default();
        let running = attempts(current, &c.name)
            .first()
            .filter(|l| l.state == ContainerState::Running)
            .and_then(|l| actuated.get(&c.name, &l.id));
        s.allocated_resources = allocated.requests.clone();
        s.resources = Some(running.cloned().unwrap_or(allocated));
    }
}

/// Upstream's `PodResizeInProgress` condition while the running
/// containers are not what they are allocated (with the error, if the
/// last try failed).
pub fn in_progress(pod: &Pod, pending: bool, error: Option<&str>) -> Option<PodCondition> {
    (pending || error.is_some()).then(|| PodCondition {
        type_: "PodResizeInProgress".into(),
        status: "True".into(),
        reason: error.map(|_| "Error".into()),
        message: error.map(String::from),
        observed_generation: pod.metadata.generation,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: &str) -> Pod {
        let yaml =
            format!("metadata: {{name: p, generation: 2}}\nspec:\n  containers:\n{containers}");
        let v: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    fn running(name: &str, id: &str) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            sandbox_id: "s".into(),
            pod_uid: "u".into(),
            name: name.into(),
            attempt: 0,
            image: String::new(),
            image_ref: String::new(),
            image_id: String::new(),
            state: ContainerState::Running,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            log_path: String::new(),
            pid: 1,
        }
    }

    fn res(yaml: &str) -> ResourceRequirements {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn updates_shrink_first_and_a_restart_policy_restarts() {
        let p = pod("  - {name: a, image: x, resources: {limits: {cpu: 20m}}}
  - {name: b, image: x, resources: {limits: {cpu: 5m}}}
  - name: c
    image: x
    resizePolicy: [{resourceName: memory, restartPolicy: RestartContainer}]
    resources: {limits: {memory: 64Mi}}
  - {name: d, image: x, resources: {limits: {cpu: 1}}}
  - {name: e, image: x}");
        let current: Vec<_> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| running(n, &format!("id-{n}")))
            .collect();
        let mut act = Actuated::default();
        act.set("a", "id-a", res("{limits: {cpu: 10m}}"));
        act.set("b", "id-b", res("{limits: {cpu: 10m}}"));
        act.set("c", "id-c", res("{limits: {memory: 32Mi}}"));
        act.set("d", "id-d", res("{limits: {cpu: 1000m}}"));
        // A record of an earlier attempt says nothing of this one.
        act.set("e", "id-old", res("{limits: {cpu: 1}}"));
        let names: Vec<String> = actions(&p, &current, &act)
            .into_iter()
            .map(|a| match a {
                Action::Update { name, .. } => format!("update {name}"),
                Action::Restart { name, .. } => format!("restart {name}"),
            })
            .collect();
        // d is the same amount; e has no record (made as allocated).
        assert_eq!(names, ["update b", "restart c", "update a"]);
    }

    #[test]
    fn the_status_reports_what_runs_and_what_is_allocated() {
        let p = pod(
            "  - {name: a, image: x, resources: {requests: {cpu: 20m}, limits: {cpu: 30m}}}
  - {name: b, image: x}",
        );
        let mut st = PodStatus {
            container_statuses: Some(vec![
                k8s_openapi::api::core::v1::ContainerStatus {
                    name: "a".into(),
                    ..Default::default()
                },
                k8s_openapi::api::core::v1::ContainerStatus {
                    name: "b".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let mut act = Actuated::default();
        act.set("a", "id-a", res("{requests: {cpu: 10m}}"));
        status_resources(&mut st, &p, &[running("a", "id-a")], &act);
        let cs = st.container_statuses.unwrap();
        assert_eq!(cs[0].allocated_resources.as_ref().unwrap()["cpu"].0, "20m");
        assert_eq!(
            cs[0].resources.as_ref().unwrap(),
            &res("{requests: {cpu: 10m}}")
        );
        assert_eq!(cs[1].resources, Some(ResourceRequirements::default()));
        assert_eq!(cs[1].allocated_resources, None);
        let c = in_progress(&p, false, Some("no")).unwrap();
        assert_eq!(
            (c.reason.as_deref(), c.observed_generation),
            (Some("Error"), Some(2))
        );
        assert!(in_progress(&p, false, None).is_none());
    }
}
