//! The pod status as upstream computes it from container states: phase,
//! conditions, container statuses with state and last state, restart
//! counts and reasons.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as KState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus as KStatus, Pod, PodCondition, PodIP, PodSpec,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kinglet_runtime::{ContainerState, ContainerStatus, WaitingReason};

pub mod api_writer;
pub mod manager;

use super::images::Waiting;
#[cfg(test)]
use super::kuberuntime::plan::Unprobed;
use super::kuberuntime::plan::{Health, attempts};

fn time(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Time(jiff::Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or_default()))
}

fn terminated(c: &ContainerStatus, scheme: &str) -> KState {
    KState {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: Some(c.reason.clone()).filter(|r| !r.is_empty()),
            message: Some(c.message.clone()).filter(|m| !m.is_empty()),
            started_at: time(c.started_at),
            finished_at: time(c.finished_at),
            container_id: Some(format!("{scheme}{}", c.id)),
            signal: None,
        }),
        ..Default::default()
    }
}

/// A waiting state: the worker's reason, else the default.
fn waiting_state(reason: WaitingReason, message: Option<&str>) -> KState {
    KState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.as_str().to_string()),
            message: message.filter(|m| !m.is_empty()).map(String::from),
        }),
        ..Default::default()
    }
}

/// Builds the status of one container spec.
fn container_status(
    spec: &Container,
    all: &[ContainerStatus],
    waiting: Option<&Waiting>,
    default: WaitingReason,
    scheme: &str,
    health: &dyn Health,
) -> KStatus {
    let (name, image) = (spec.name.as_str(), spec.image.as_deref().unwrap_or(""));
    let reason = waiting.map_or(default, |w| w.0);
    let tries = attempts(all, name);
    let latest = tries.first();
    let (state, last) = match latest {
        None => (waiting_state(reason, waiting.map(|w| w.1.as_str())), None),
        Some(c) => {
            let prev = tries.get(1).map(|p| terminated(p, scheme));
            match c.state {
                ContainerState::Running => (
                    KState {
                        running: Some(ContainerStateRunning {
                            started_at: time(c.started_at),
                        }),
                        ..Default::default()
                    },
                    prev,
                ),
                ContainerState::Exited if waiting.is_some() => (
                    waiting_state(reason, waiting.map(|w| w.1.as_str())),
                    Some(terminated(c, scheme)),
                ),
                ContainerState::Exited => (terminated(c, scheme), prev),
                _ => (waiting_state(reason, None), prev),
            }
        }
    };
    let running = state.running.is_some();
    let id = latest.map_or("", |c| c.id.as_str());
    let started = running && health.started(spec, id);
    KStatus {
        name: name.into(),
        image: latest.map_or(image.into(), |c| c.image.clone()),
        image_id: latest.map_or(String::new(), |c| c.image_ref.clone()),
        container_id: latest.map(|c| format!("{scheme}{}", c.id)),
        restart_count: latest.map_or(0, |c| c.attempt as i32),
        ready: started && health.ready(spec, id),
        started: Some(started),
        state: Some(state),
        last_state: Some(last.unwrap_or_default()),
        ..Default::default()
    }
}

/// A condition; its `lastTransitionTime` is the status manager's to set.
fn condition(
    type_: &str,
    ok: bool,
    reason: Option<String>,
    message: Option<String>,
) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { None } else { reason },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

/// Where the pod runs: what its status reports besides its containers.
pub struct Placement<'a> {
    pub host_ip: &'a str,
    pub pod_ip: &'a str,
    pub start_time: &'a Time,
    /// `<runtime>://`, the prefix of container IDs.
    pub scheme: &'a str,
}

/// The pod's status. `waiting` holds reasons the worker set for containers
/// it could not start (image pull errors, back-off, config errors).
pub fn pod_status(
    pod: &Pod,
    containers: &[ContainerStatus],
    sandbox_ready: bool,
    waiting: &BTreeMap<String, Waiting>,
    at: &Placement<'_>,
    health: &dyn Health,
) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    // Upstream's default waiting reason, for init and regular containers
    // alike: PodInitializing in a pod with init containers.
    let default = if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
        WaitingReason::PodInitializing
    } else {
        WaitingReason::ContainerCreating
    };
    let status_of = |c: &Container| {
        container_status(
            c,
            containers,
            waiting.get(&c.name),
            default,
            at.scheme,
            health,
        )
    };
    let inits = init_statuses(&spec, status_of);
    let regular: Vec<KStatus> = spec.containers.iter().map(status_of).collect();
    let ephemeral = ephemeral_statuses(&spec, containers, waiting, at.scheme, health);
    let init = InitProgress::of(&spec, &inits, policy);
    let phase = phase(&spec.containers, &regular, policy, &init);
    let (host_ip, pod_ip) = (at.host_ip, at.pod_ip);
    // PodObservedGenerationTracking (GA, locked on in 1.37): the status and
    // each condition say which generation of the spec they describe.
    let generation = pod.metadata.generation;
    // Sidecars (restartable init containers) count for readiness, first,
    // as upstream's GenerateContainersReadyCondition lists them.
    let sidecars: Vec<KStatus> = inits
        .iter()
        .zip(spec.init_containers.iter().flatten())
        .filter(|(_, c)| super::util::is_sidecar(c))
        .map(|(s, _)| s.clone())
        .collect();
    let mut conditions = conditions(phase, &sidecars, &regular, &init, sandbox_ready);
    gate_readiness(pod, &mut conditions);
    for c in &mut conditions {
        c.observed_generation = generation;
    }
    PodStatus {
        phase: Some(phase.into()),
        observed_generation: generation,
        conditions: Some(conditions),
        host_ip: Some(host_ip.to_string()).filter(|s| !s.is_empty()),
        host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP {
            ip: host_ip.into(),
        }])
        .filter(|_| !host_ip.is_empty()),
        pod_ip: Some(pod_ip.to_string()).filter(|s| !s.is_empty()),
        pod_ips: Some(vec![PodIP { ip: pod_ip.into() }]).filter(|_| !pod_ip.is_empty()),
        start_time: Some(at.start_time.clone()),
        init_container_statuses: (!inits.is_empty()).then_some(inits),
        container_statuses: Some(regular),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        qos_class: Some(crate::cm::qos::qos_class(pod).into()),
        ..Default::default()
    }
}

/// The init containers' statuses; a finished (non-restartable) one
/// reads as ready, as upstream's prober manager sets it.
fn init_statuses(spec: &PodSpec, status_of: impl Fn(&Container) -> KStatus) -> Vec<KStatus> {
    let inits = spec.init_containers.iter().flatten();
    inits
        .map(|c| {
            let mut s = status_of(c);
            let done = s
                .state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0);
            if done && c.restart_policy.as_deref() != Some("Always") {
                s.ready = true;
            }
            s
        })
        .collect()
}

/// The ephemeral containers' statuses: never probed (upstream's prober
/// sets `ready` and `started` for init and regular containers only).
fn ephemeral_statuses(
    spec: &PodSpec,
    containers: &[ContainerStatus],
    waiting: &BTreeMap<String, Waiting>,
    scheme: &str,
    health: &dyn Health,
) -> Vec<KStatus> {
    super::util::ephemeral_containers(spec)
        .iter()
        .map(|c| {
            let w = waiting.get(&c.name);
            let reason = WaitingReason::ContainerCreating;
            KStatus {
                ready: false,
                started: None,
                ..container_status(c, containers, w, reason, scheme, health)
            }
        })
        .collect()
}

/// Where the init containers are.
struct InitProgress {
    /// Init containers not yet done (a sidecar is done once running).
    pending: Vec<String>,
    /// One failed under `restartPolicy: Never`: the pod failed.
    failed_never: bool,
}

impl InitProgress {
    fn of(spec: &k8s_openapi::api::core::v1::PodSpec, inits: &[KStatus], policy: &str) -> Self {
        let exit_code = |s: &KStatus| {
            s.state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .map(|t| t.exit_code)
        };
        let sidecar = |name: &str| {
            spec.init_containers
                .iter()
                .flatten()
                .any(|c| c.name == name && super::util::is_sidecar(c))
        };
        let running = |s: &KStatus| s.state.as_ref().is_some_and(|st| st.running.is_some());
        InitProgress {
            pending: inits
                .iter()
                .filter(|s| !(exit_code(s) == Some(0) || sidecar(&s.name) && running(s)))
                .map(|s| s.name.clone())
                .collect(),
            failed_never: policy == "Never"
                && inits.iter().any(|s| exit_code(s).is_some_and(|c| c != 0)),
        }
    }
}

/// The pod phase from its regular containers, as upstream's `getPhase`.
fn phase(
    specs: &[k8s_openapi::api::core::v1::Container],
    regular: &[KStatus],
    policy: &str,
    init: &InitProgress,
) -> &'static str {
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    // A stopped container that starts again keeps the pod running (its
    // own restart rules and policy, else the pod's).
    let mut restarting = 0;
    for (s, c) in regular.iter().zip(specs) {
        let st = s.state.clone().unwrap_or_default();
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
            if super::kuberuntime::plan::should_restart(c, policy, t.exit_code) {
                restarting += 1;
            }
        } else if s
            .last_state
            .as_ref()
            .is_some_and(|l| l.terminated.is_some())
        {
            // Waiting out a back-off before its next start.
            stopped += 1;
            restarting += 1;
        } else {
            waiting += 1;
        }
    }
    if init.failed_never {
        "Failed"
    } else if !init.pending.is_empty() || waiting > 0 {
        "Pending"
    } else if running > 0 || restarting > 0 {
        "Running"
    } else if stopped > 0 && stopped == succeeded {
        "Succeeded"
    } else if stopped > 0 {
        "Failed"
    } else {
        "Pending"
    }
}

/// `Initialized` as upstream's `GeneratePodInitializedCondition`: true with
/// `PodCompleted` once the pod succeeded, true once any regular container
/// started, else false while an init container is incomplete.
fn initialized(phase: &str, regular: &[KStatus], init: &InitProgress) -> PodCondition {
    let started = regular.iter().any(|s| {
        s.state
            .as_ref()
            .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
    });
    let mut c = condition(
        "Initialized",
        phase == "Succeeded" || started || init.pending.is_empty(),
        Some("ContainersNotInitialized".into()),
        Some(format!(
            "containers with incomplete status: [{}]",
            init.pending.join(" ")
        )),
    );
    if phase == "Succeeded" {
        c.reason = Some("PodCompleted".into());
    }
    c
}

/// `spec.readinessGates`: a pod whose containers are ready is Ready only
/// when each gate's condition (set by someone else in the pod's status) is
/// True, with upstream's `ReadinessGatesNotReady` messages.
fn gate_readiness(pod: &Pod, conditions: &mut [PodCondition]) {
    let gates = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten());
    let current = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let unready: Vec<String> = gates
        .filter_map(|g| {
            let t = &g.condition_type;
            match current.and_then(|cs| cs.iter().find(|c| &c.type_ == t)) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {t:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {t:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    let Some(ready) = conditions.iter_mut().find(|c| c.type_ == "Ready") else {
        return;
    };
    if ready.status == "True" && !unready.is_empty() {
        *ready = condition(
            "Ready",
            false,
            Some("ReadinessGatesNotReady".into()),
            Some(unready.join(", ")),
        );
    }
}

/// The five pod conditions with upstream's reasons and messages.
fn conditions(
    phase: &str,
    sidecars: &[KStatus],
    regular: &[KStatus],
    init: &InitProgress,
    sandbox_ready: bool,
) -> Vec<PodCondition> {
    let not_ready: Vec<&str> = sidecars
        .iter()
        .chain(regular)
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let completed = phase == "Succeeded" || phase == "Failed";
    let ready_reason = if completed {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let msg = format!("containers with unready status: [{}]", not_ready.join(" "));
    let ready = not_ready.is_empty() && !completed;
    vec![
        condition("PodReadyToStartContainers", sandbox_ready, None, None),
        initialized(phase, regular, init),
        condition("Ready", ready, Some(ready_reason.into()), Some(msg.clone())),
        condition(
            "ContainersReady",
            ready,
            Some(ready_reason.into()),
            Some(msg),
        ),
        condition("PodScheduled", true, None, None),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status of the pod `yaml` with these containers in the runtime.
    fn status_with(yaml: &str, containers: &[ContainerStatus]) -> PodStatus {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        let pod: Pod = serde_json::from_value(v).unwrap();
        let t = Time(jiff::Timestamp::UNIX_EPOCH);
        let at = Placement {
            host_ip: "",
            pod_ip: "",
            start_time: &t,
            scheme: "x://",
        };
        pod_status(&pod, containers, true, &BTreeMap::new(), &at, &Unprobed)
    }

    /// The status of a pod none of whose containers exist yet.
    fn fresh_status(yaml: &str) -> PodStatus {
        status_with(yaml, &[])
    }

    fn waiting_reasons(yaml: &str) -> Vec<String> {
        let s = fresh_status(yaml);
        s.init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
            .map(|c| {
                let w = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
                w.reason.clone().unwrap()
            })
            .collect()
    }

    #[test]
    fn default_waiting_reasons_are_upstreams() {
        assert_eq!(
            waiting_reasons("metadata: {name: p}\nspec: {containers: [{name: a, image: x}]}"),
            ["ContainerCreating"]
        );
        // With init containers, every container not yet created waits in
        // PodInitializing, init ones included (upstream's
        // convertToAPIContainerStatuses).
        assert_eq!(
            waiting_reasons(
                "metadata: {name: p}\nspec: {initContainers: [{name: i, image: x}], containers: [{name: a, image: x}]}"
            ),
            ["PodInitializing", "PodInitializing"]
        );
    }

    #[test]
    fn init_containers_as_upstream_reports_them() {
        let yaml = "metadata: {name: p}\nspec: {restartPolicy: Never, initContainers: [{name: i, image: x}, {name: j, image: x}], containers: [{name: a, image: x}]}";
        let exited = |name: &str, code: i32| ContainerStatus {
            id: format!("{name}-0"),
            sandbox_id: "s".into(),
            pod_uid: String::new(),
            name: name.into(),
            attempt: 0,
            image: "x".into(),
            image_ref: "x".into(),
            image_id: "x".into(),
            state: ContainerState::Exited,
            created_at: 1,
            started_at: 2,
            finished_at: 3,
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: String::new(),
            log_path: String::new(),
            pid: 0,
        };
        let s = status_with(yaml, &[exited("i", 0), exited("j", 1)]);
        let inits = s.init_container_statuses.unwrap();
        assert!(inits[0].ready, "an init container that exited 0 is ready");
        assert!(!inits[1].ready);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        let init = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Initialized")
            .unwrap();
        assert_eq!(
            (init.status.as_str(), init.reason.as_deref()),
            ("False", Some("ContainersNotInitialized"))
        );
    }

    #[test]
    fn ephemeral_containers_have_their_own_statuses_never_ready() {
        let yaml = "metadata: {name: p}\nspec: {containers: [{name: a, image: x}], ephemeralContainers: [{name: debugger, image: x, targetContainerName: a}]}";
        let s = status_with(
            yaml,
            &[
                crate::pods::running_container("a-0", "a"),
                crate::pods::running_container("d-0", "debugger"),
            ],
        );
        let e = s.ephemeral_container_statuses.unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].name, "debugger");
        assert!(e[0].state.as_ref().unwrap().running.is_some());
        assert!(!e[0].ready);
        assert_eq!(e[0].started, None);
        // It does not count for the pod's readiness, nor its phase.
        assert_eq!(s.container_statuses.unwrap().len(), 1);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(
            fresh_status("metadata: {name: p}\nspec: {containers: [{name: a, image: x}]}")
                .ephemeral_container_statuses,
            None
        );
    }

    #[test]
    fn readiness_gates_hold_ready_until_their_conditions_are_true() {
        let running = crate::pods::running_container("c-0", "c");
        let ready_of = |conds: &str| {
            let y = format!(
                "metadata: {{name: p, uid: u}}\nspec:\n  readinessGates: [{{conditionType: example.com/lb}}]\n  containers: [{{name: c, image: x}}]\nstatus: {{conditions: [{conds}]}}\n"
            );
            let st = status_with(&y, std::slice::from_ref(&running));
            let c = st
                .conditions
                .unwrap()
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .unwrap();
            (c.status, c.reason, c.message)
        };
        let (status, reason, message) = ready_of("");
        assert_eq!(status, "False");
        assert_eq!(reason.as_deref(), Some("ReadinessGatesNotReady"));
        assert_eq!(
            message.as_deref(),
            Some(
                "corresponding condition of pod readiness gate \"example.com/lb\" does not exist."
            )
        );
        let (_, _, message) = ready_of("{type: example.com/lb, status: 'False'}");
        assert_eq!(
            message.as_deref(),
            Some("the status of pod readiness gate \"example.com/lb\" is not \"True\", but False")
        );
        assert_eq!(ready_of("{type: example.com/lb, status: 'True'}").0, "True");
    }

    #[test]
    fn status_and_conditions_carry_the_observed_generation() {
        let s = fresh_status(
            "metadata: {name: p, generation: 3}\nspec: {containers: [{name: a, image: x}]}",
        );
        assert_eq!(s.observed_generation, Some(3));
        let conditions = s.conditions.unwrap();
        assert_eq!(conditions.len(), 5);
        assert!(conditions.iter().all(|c| c.observed_generation == Some(3)));
    }
}
