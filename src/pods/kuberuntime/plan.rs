//! What a pod needs next, as a pure function of the pod, its containers as
//! the runtime reports them, the back-offs and the time (upstream's
//! `computePodActions`). The worker executes the plan and reports; this
//! module touches nothing, so every rule is unit-tested here.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kinglet_runtime::{ContainerState, ContainerStatus};
use tokio::time::Instant;

/// What the probes say of a running container (the prober answers; a pod
/// without probes is started and ready once running).
pub trait Health {
    fn started(&self, c: &Container, id: &str) -> bool;
    fn ready(&self, c: &Container, id: &str) -> bool;
}

/// No probes: running is started and ready.
pub struct Unprobed;

impl Health for Unprobed {
    fn started(&self, _: &Container, _: &str) -> bool {
        true
    }
    fn ready(&self, _: &Container, _: &str) -> bool {
        true
    }
}

/// The attempts of each container, newest first.
pub fn attempts<'a>(containers: &'a [ContainerStatus], name: &str) -> Vec<&'a ContainerStatus> {
    let mut v: Vec<&ContainerStatus> = containers.iter().filter(|c| c.name == name).collect();
    v.sort_by(|a, b| {
        b.attempt
            .cmp(&a.attempt)
            .then(b.created_at.cmp(&a.created_at))
    });
    v
}

/// Upstream's container restart back-off: 10 s doubling to 300 s; reset
/// after 10 minutes of clean running.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);

pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

pub const BACKOFF_RESET: Duration = Duration::from_secs(600);

pub use crate::backoff::Backoff;

/// The next container back-off after `prev` (10 s, doubling, capped at
/// 5 min, as upstream's), counted from `now`.
pub fn next_backoff(prev: Option<&Backoff>, now: Instant) -> Backoff {
    let mut b = prev
        .copied()
        .unwrap_or_else(|| Backoff::steady(BACKOFF_INITIAL, BACKOFF_MAX));
    b.step(now);
    b
}

/// Upstream's pod worker `backOffPeriod`: a sync that failed before its
/// container existed (a config or create error: the runtime down, a
/// missing ConfigMap) is retried after it, never longer. The crash-loop
/// back-off only counts containers that exited (`doBackOff`), so such
/// failures do not grow it: a runtime that was away for a minute must not
/// leave pods waiting five more.
pub const RETRY_CREATE: Duration = Duration::from_secs(10);

/// The wait after a failed create: flat at [`RETRY_CREATE`].
pub fn create_retry(now: Instant) -> Backoff {
    let mut b = Backoff::steady(RETRY_CREATE, RETRY_CREATE);
    b.step(now);
    b
}

/// The restart back-off a container had reached after `restarts`
/// restarts, for a worker that did not see them (kinglet was restarted):
/// derived from the runtime's restart count, so a crash loop does not
/// start again from 10 s at each restart of kinglet. `None` before the
/// first restart, which upstream makes at once.
pub fn seeded_backoff(restarts: u32, since: Instant) -> Option<Backoff> {
    if restarts == 0 {
        return None;
    }
    let mut b = Backoff::steady(BACKOFF_INITIAL, BACKOFF_MAX);
    // Past 5 steps the wait is at its cap.
    for _ in 0..restarts.min(6) {
        b.step(since);
    }
    Some(b)
}

/// Back-offs a worker keeps per container name.
#[derive(Debug, Default, Clone)]
pub struct Backoffs {
    /// Crash-loop back-off, counted from the container's exit.
    pub restart: BTreeMap<String, Backoff>,
    /// After a failed create or start (config, create or run errors).
    pub failure: BTreeMap<String, Backoff>,
}

/// What to do with one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Running, or finished for good: nothing to do.
    Keep,
    /// Created but not started (a crash between the two): start it.
    StartCreated(String),
    /// Its state unknown (the runtime restarted under it): kill it, as
    /// upstream does, so two instances never run, then start `attempt`
    /// after removing it and the older attempts.
    Replace {
        unknown: String,
        attempt: u32,
        remove: Vec<String>,
    },
    /// Create and start this attempt, after removing older attempts (the
    /// previous one stays, for `lastState`).
    Start { attempt: u32, remove: Vec<String> },
    /// Exited and restartable, but in back-off: wait `left`.
    CrashLoop { delay: Duration, left: Duration },
    /// The last create or start failed: retry after `left`.
    RetryLater { left: Duration },
}

/// One container's step, and what the plan learned of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStep {
    pub name: String,
    pub step: Step,
    /// The restart back-off is to be forgotten (it ran long enough).
    pub reset_backoff: bool,
}

/// The whole pod's next steps, in order: init containers up to the first
/// that is not done (sidecars count once running and started: their
/// startup probe, if any, succeeded, as `health` says), then the regular
/// containers once every init container is, then the ephemeral ones.
pub fn plan(
    pod: &Pod,
    current: &[ContainerStatus],
    backoffs: &Backoffs,
    now_wall_nanos: i64,
    now: Instant,
    health: &dyn Health,
) -> Vec<ContainerStep> {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let at = At {
        wall_nanos: now_wall_nanos,
        now,
    };
    let mut steps = Vec::new();
    for ic in spec.init_containers.iter().flatten() {
        let sidecar = crate::pods::util::is_sidecar(ic);
        let ic_policy = match (sidecar, policy) {
            (true, _) => "Always",
            (false, "Never") => "Never",
            _ => "OnFailure",
        };
        let (step, succeeded) = container_step(ic, current, ic_policy, backoffs, &at);
        // Upstream waits for a sidecar's startup probe before the next
        // container starts.
        let started = attempts(current, &ic.name)
            .first()
            .is_some_and(|c| c.state == ContainerState::Running && health.started(ic, &c.id));
        steps.push(step);
        if !(succeeded || sidecar && started) {
            return steps;
        }
    }
    for c in &spec.containers {
        steps.push(container_step(c, current, policy, backoffs, &at).0);
    }
    // Ephemeral containers (`kubectl debug`) once the pod has started,
    // each run once and never restarted, as upstream.
    for c in crate::pods::util::ephemeral_containers(&spec) {
        steps.push(container_step(&c, current, "Never", backoffs, &at).0);
    }
    steps
}

struct At {
    wall_nanos: i64,
    now: Instant,
}

fn restartable(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Always" => true,
        "OnFailure" => exit_code != 0,
        _ => false,
    }
}

/// Whether an exited container starts again, as upstream's
/// `ContainerShouldRestart` (ContainerRestartRules, beta in 1.35): a
/// container with its own `restartPolicy` has its `restartPolicyRules`
/// tried first (a matching `Restart` rule restarts it), then its own
/// policy; else the pod's policy decides.
pub fn should_restart(c: &Container, pod_policy: &str, exit_code: i32) -> bool {
    let Some(own) = c.restart_policy.as_deref() else {
        return restartable(pod_policy, exit_code);
    };
    let matches = |r: &&k8s_openapi::api::core::v1::ContainerRestartRule| {
        r.exit_codes.as_ref().is_some_and(|e| {
            let listed = e.values.iter().flatten().any(|v| *v == exit_code);
            match e.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => false,
            }
        })
    };
    match c.restart_policy_rules.iter().flatten().find(matches) {
        Some(r) if r.action == "Restart" => true,
        _ => restartable(own, exit_code),
    }
}

/// How long ago a container exited, by the wall clock (container times
/// are wall-clock times). An exit more than a second "in the future"
/// means the clock went back since: how long ago is unknown, and waiting
/// for the clock to catch up would hold a crash loop for as long as the
/// jump (a day, for an NTP step on a board without a battery), so its
/// back-off counts as passed — as a jump forward makes it pass, upstream
/// too.
fn since_exit(now_nanos: i64, finished_nanos: i64) -> Duration {
    match now_nanos - finished_nanos {
        d if d >= 0 => Duration::from_nanos(d as u64),
        d if d > -1_000_000_000 => Duration::ZERO,
        _ => Duration::MAX,
    }
}

/// One container's step; `true` when it finished successfully for good.
fn container_step(
    c: &Container,
    current: &[ContainerStatus],
    policy: &str,
    backoffs: &Backoffs,
    at: &At,
) -> (ContainerStep, bool) {
    let mk = |step, reset_backoff| ContainerStep {
        name: c.name.clone(),
        step,
        reset_backoff,
    };
    let failed = backoffs.failure.get(&c.name).and_then(|b| b.left(at.now));
    let tries = attempts(current, &c.name);
    let Some(latest) = tries.first() else {
        let step = match failed {
            Some(left) => Step::RetryLater { left },
            None => Step::Start {
                attempt: 0,
                remove: vec![],
            },
        };
        return (mk(step, false), false);
    };
    let older = || tries.iter().skip(1).map(|o| o.id.clone()).collect();
    let step = match (latest.state, failed) {
        (ContainerState::Running, _) => Step::Keep,
        // A start that just failed left it created: ask again after the
        // back-off, not at the next relist.
        (ContainerState::Created | ContainerState::Unknown, Some(left)) => {
            Step::RetryLater { left }
        }
        (ContainerState::Created, None) => Step::StartCreated(latest.id.clone()),
        (ContainerState::Unknown, None) => Step::Replace {
            unknown: latest.id.clone(),
            attempt: latest.attempt + 1,
            remove: older(),
        },
        (ContainerState::Exited, _) if !should_restart(c, policy, latest.exit_code) => {
            return (mk(Step::Keep, false), latest.exit_code == 0);
        }
        (ContainerState::Exited, _) => {
            let (step, reset) = restart_step(c, latest, backoffs, failed, at, older);
            return (mk(step, reset), false);
        }
    };
    (mk(step, false), false)
}

/// The step of a container that exited and is to restart, and whether
/// its back-off is to be forgotten (it ran long enough).
fn restart_step(
    c: &Container,
    latest: &ContainerStatus,
    backoffs: &Backoffs,
    failed: Option<Duration>,
    at: &At,
    older: impl FnOnce() -> Vec<String>,
) -> (Step, bool) {
    let ran = Duration::from_nanos((latest.finished_at - latest.started_at).max(0) as u64);
    let reset = ran >= BACKOFF_RESET;
    // A container lost rather than crashed (its exit unknown: a reboot, a
    // crash of the monitor) is not held back by the restarts before it.
    let seeded = (latest.reason != "Unknown")
        .then(|| seeded_backoff(latest.attempt, at.now))
        .flatten();
    let restart = backoffs
        .restart
        .get(&c.name)
        .or(seeded.as_ref())
        .filter(|_| !reset);
    let finished_ago = since_exit(at.wall_nanos, latest.finished_at);
    if let Some(left) = failed {
        return (Step::RetryLater { left }, reset);
    }
    if let Some(b) = restart
        && finished_ago < b.delay
    {
        let step = Step::CrashLoop {
            delay: b.delay,
            left: b.delay - finished_ago,
        };
        return (step, reset);
    }
    let step = Step::Start {
        attempt: latest.attempt + 1,
        remove: older(),
    };
    (step, reset)
}

#[cfg(test)]
mod tests {

    #[test]
    fn container_restart_rules_come_before_the_policies() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
        }))
        .unwrap();
        assert!(should_restart(&c, "Never", 42), "a matching rule restarts");
        assert!(
            !should_restart(&c, "Always", 1),
            "the container's Never wins over the pod's Always"
        );
        let plain: Container = serde_json::from_value(serde_json::json!({"name": "c"})).unwrap();
        assert!(should_restart(&plain, "OnFailure", 1));
        assert!(!should_restart(&plain, "OnFailure", 0));
        let not_in: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}]
        }))
        .unwrap();
        assert!(should_restart(&not_in, "Never", 3));
        assert!(!should_restart(&not_in, "Never", 0));
    }

    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    const S: i64 = 1_000_000_000;

    fn pod(policy: &str, inits: &[(&str, bool)], containers: &[&str]) -> Pod {
        let c = |n: &str, sidecar: bool| Container {
            name: n.into(),
            image: Some("busybox".into()),
            restart_policy: sidecar.then(|| "Always".into()),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: Some(inits.iter().map(|(n, s)| c(n, *s)).collect()),
                containers: containers.iter().map(|n| c(n, false)).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctr(
        name: &str,
        attempt: u32,
        state: ContainerState,
        exit: i32,
        finished: i64,
    ) -> ContainerStatus {
        ContainerStatus {
            id: format!("{name}-{attempt}"),
            sandbox_id: "s".into(),
            pod_uid: "u".into(),
            name: name.into(),
            attempt,
            image: String::new(),
            image_ref: String::new(),
            image_id: String::new(),
            state,
            created_at: attempt as i64,
            started_at: finished - S,
            finished_at: finished,
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            log_path: String::new(),
            pid: 0,
        }
    }

    fn steps(
        p: &Pod,
        cur: &[ContainerStatus],
        b: &Backoffs,
        wall: i64,
        now: Instant,
    ) -> Vec<(String, Step)> {
        plan(p, cur, b, wall, now, &Unprobed)
            .into_iter()
            .map(|s| (s.name, s.step))
            .collect()
    }

    fn start(n: &str, attempt: u32, remove: &[&str]) -> (String, Step) {
        (
            n.into(),
            Step::Start {
                attempt,
                remove: remove.iter().map(|s| s.to_string()).collect(),
            },
        )
    }

    #[test]
    fn new_pod_starts_inits_one_at_a_time_then_containers() {
        let now = Instant::now();
        let p = pod("Always", &[("i1", false), ("i2", false)], &["a", "b"]);
        let b = Backoffs::default();
        assert_eq!(steps(&p, &[], &b, 10 * S, now), [start("i1", 0, &[])]);
        let i1 = ctr("i1", 0, ContainerState::Running, 0, 0);
        assert_eq!(
            steps(&p, &[i1], &b, 10 * S, now),
            [("i1".into(), Step::Keep)]
        );
        let i1 = ctr("i1", 0, ContainerState::Exited, 0, 5 * S);
        assert_eq!(
            steps(&p, std::slice::from_ref(&i1), &b, 10 * S, now),
            [("i1".into(), Step::Keep), start("i2", 0, &[])]
        );
        let i2 = ctr("i2", 0, ContainerState::Exited, 0, 6 * S);
        assert_eq!(
            steps(&p, &[i1, i2], &b, 10 * S, now),
            [
                ("i1".into(), Step::Keep),
                ("i2".into(), Step::Keep),
                start("a", 0, &[]),
                start("b", 0, &[])
            ]
        );
    }

    #[test]
    fn a_crash_loop_survives_the_clock_going_back() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        let mut b = Backoffs::default();
        b.restart.insert("a".into(), next_backoff(None, now));
        // Exited 5 s ago: in its 10 s back-off.
        let a = ctr("a", 1, ContainerState::Exited, 1, 95 * S);
        let step = &steps(&p, std::slice::from_ref(&a), &b, 100 * S, now)[0].1;
        assert!(matches!(step, Step::CrashLoop { .. }), "{step:?}");
        // The clock stepped back a day: not held until it catches up.
        let back = 100 * S - 86_400 * S;
        assert_eq!(steps(&p, &[a], &b, back, now), [start("a", 2, &[])]);
        assert_eq!(since_exit(10 * S, 10 * S + S / 2), Duration::ZERO);
    }

    #[test]
    fn ephemeral_containers_start_after_the_pod_and_never_restart() {
        let now = Instant::now();
        let mut p = pod("Always", &[("i1", false)], &["a"]);
        p.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
                name: "debugger".into(),
                image: Some("x".into()),
                target_container_name: Some("a".into()),
                ..Default::default()
            }]);
        let b = Backoffs::default();
        // Not while the init containers run.
        assert_eq!(steps(&p, &[], &b, 10 * S, now), [start("i1", 0, &[])]);
        let i1 = ctr("i1", 0, ContainerState::Exited, 0, 5 * S);
        let a = ctr("a", 0, ContainerState::Running, 0, 0);
        assert_eq!(
            steps(&p, &[i1.clone(), a.clone()], &b, 10 * S, now),
            [
                ("i1".into(), Step::Keep),
                ("a".into(), Step::Keep),
                start("debugger", 0, &[])
            ]
        );
        // Exited, even with an error and restartPolicy Always: done.
        let d = ctr("debugger", 0, ContainerState::Exited, 1, 6 * S);
        assert_eq!(
            steps(&p, &[i1, a, d], &b, 60 * S, now)[2],
            ("debugger".into(), Step::Keep)
        );
    }

    #[test]
    fn a_sidecar_lets_the_next_start_once_it_runs() {
        let now = Instant::now();
        let p = pod("Always", &[("side", true)], &["a"]);
        let b = Backoffs::default();
        let side = ctr("side", 0, ContainerState::Running, 0, 0);
        assert_eq!(
            steps(&p, &[side], &b, 10 * S, now),
            [("side".into(), Step::Keep), start("a", 0, &[])]
        );
        // Not before its startup probe succeeded.
        struct NotStarted;
        impl Health for NotStarted {
            fn started(&self, _: &Container, _: &str) -> bool {
                false
            }
            fn ready(&self, _: &Container, _: &str) -> bool {
                false
            }
        }
        let side = ctr("side", 0, ContainerState::Running, 0, 0);
        let got = plan(&p, &[side], &b, 10 * S, now, &NotStarted);
        assert_eq!(got.len(), 1, "only the sidecar: {got:?}");
        // A sidecar that exited restarts even with restartPolicy Never.
        let p = pod("Never", &[("side", true)], &["a"]);
        let side = ctr("side", 0, ContainerState::Exited, 0, 5 * S);
        assert_eq!(steps(&p, &[side], &b, 10 * S, now), [start("side", 1, &[])]);
    }

    #[test]
    fn restart_policies_decide_what_exits_mean() {
        let now = Instant::now();
        let b = Backoffs::default();
        let ok = ctr("a", 0, ContainerState::Exited, 0, 5 * S);
        let bad = ctr("a", 0, ContainerState::Exited, 1, 5 * S);
        let on_failure = pod("OnFailure", &[], &["a"]);
        assert_eq!(
            steps(&on_failure, std::slice::from_ref(&ok), &b, 10 * S, now),
            [("a".into(), Step::Keep)]
        );
        assert_eq!(
            steps(&on_failure, std::slice::from_ref(&bad), &b, 10 * S, now),
            [start("a", 1, &[])]
        );
        let never = pod("Never", &[], &["a"]);
        assert_eq!(
            steps(&never, &[bad], &b, 10 * S, now),
            [("a".into(), Step::Keep)]
        );
        let always = pod("Always", &[], &["a"]);
        assert_eq!(steps(&always, &[ok], &b, 10 * S, now), [start("a", 1, &[])]);
        // A failed init container with Never fails the pod: nothing starts.
        let p = pod("Never", &[("i", false)], &["a"]);
        let i = ctr("i", 0, ContainerState::Exited, 1, 5 * S);
        assert_eq!(steps(&p, &[i], &b, 10 * S, now), [("i".into(), Step::Keep)]);
    }

    fn backoff(delay: Duration, since: Instant) -> Backoff {
        let mut b = Backoff::steady(BACKOFF_INITIAL, BACKOFF_MAX);
        b.delay = delay;
        b.since = since;
        b
    }

    #[test]
    fn crash_loop_waits_out_the_backoff_and_keeps_one_previous_attempt() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        let mut b = Backoffs::default();
        b.restart
            .insert("a".into(), backoff(Duration::from_secs(20), now));
        let old = ctr("a", 0, ContainerState::Exited, 1, 2 * S);
        let last = ctr("a", 1, ContainerState::Exited, 1, 10 * S);
        let cur = [old, last];
        assert_eq!(
            steps(&p, &cur, &b, 15 * S, now),
            [(
                "a".into(),
                Step::CrashLoop {
                    delay: Duration::from_secs(20),
                    left: Duration::from_secs(15)
                }
            )]
        );
        assert_eq!(steps(&p, &cur, &b, 30 * S, now), [start("a", 2, &["a-0"])]);
    }

    #[test]
    fn a_restarted_kinglet_keeps_the_crash_loop_backoff() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        // No back-off in memory: the worker is new. Attempt 3 means three
        // restarts, so the wait after its exit is 10·2² = 40 s.
        let b = Backoffs::default();
        let last = ctr("a", 3, ContainerState::Exited, 1, 10 * S);
        assert_eq!(
            steps(&p, std::slice::from_ref(&last), &b, 40 * S, now),
            [(
                "a".into(),
                Step::CrashLoop {
                    delay: Duration::from_secs(40),
                    left: Duration::from_secs(10)
                }
            )]
        );
        assert_eq!(seeded_backoff(20, now).unwrap().delay, BACKOFF_MAX);
        assert!(seeded_backoff(0, now).is_none());
        // Lost, not crashed (a reboot): started again at once.
        let mut lost = last;
        lost.reason = "Unknown".into();
        assert_eq!(steps(&p, &[lost], &b, 11 * S, now), [start("a", 4, &[])]);
    }

    #[test]
    fn a_long_run_resets_the_backoff() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        let mut b = Backoffs::default();
        b.restart.insert("a".into(), backoff(BACKOFF_MAX, now));
        let mut c = ctr("a", 3, ContainerState::Exited, 1, 1000 * S);
        c.started_at = 0;
        let got = plan(&p, &[c], &b, 1001 * S, now, &Unprobed);
        assert!(got[0].reset_backoff);
        assert_eq!(
            got[0].step,
            Step::Start {
                attempt: 4,
                remove: vec![]
            }
        );
    }

    /// Container `a` of `p`, which failed at `now`, waits (6 s left at
    /// 4 s) and is started once `due` has passed.
    fn waits_then_starts(p: &Pod, b: &Backoffs, now: Instant, due: Duration) {
        let left = due - Duration::from_secs(4);
        assert_eq!(
            steps(p, &[], b, 0, now + Duration::from_secs(4)),
            [("a".into(), Step::RetryLater { left })]
        );
        assert_eq!(steps(p, &[], b, 0, now + due), [start("a", 0, &[])]);
    }

    #[test]
    fn creation_failures_back_off() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        let mut b = Backoffs::default();
        b.failure.insert("a".into(), next_backoff(None, now));
        waits_then_starts(&p, &b, now, BACKOFF_INITIAL);
        let next = next_backoff(b.failure.get("a"), now);
        assert_eq!(next.delay, Duration::from_secs(20));
        let mut d = None;
        for _ in 0..10 {
            d = Some(next_backoff(d.as_ref(), now));
        }
        assert_eq!(d.unwrap().delay, BACKOFF_MAX);
    }

    #[test]
    fn create_failures_retry_flat() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        let mut b = Backoffs::default();
        b.failure.insert("a".into(), create_retry(now));
        waits_then_starts(&p, &b, now, RETRY_CREATE);
    }

    #[test]
    fn a_created_container_is_started() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        let c = ctr("a", 0, ContainerState::Created, 0, 0);
        assert_eq!(
            steps(&p, &[c], &Backoffs::default(), 0, now),
            [("a".into(), Step::StartCreated("a-0".into()))]
        );
    }

    #[test]
    fn a_container_in_unknown_state_is_killed_and_replaced() {
        let now = Instant::now();
        let p = pod("Always", &[], &["a"]);
        let old = ctr("a", 0, ContainerState::Exited, 1, 0);
        let lost = ctr("a", 1, ContainerState::Unknown, 0, 0);
        let want = Step::Replace {
            unknown: "a-1".into(),
            attempt: 2,
            remove: vec!["a-0".into()],
        };
        let b = Backoffs::default();
        assert_eq!(
            steps(&p, &[lost.clone(), old.clone()], &b, 0, now),
            [("a".into(), want)]
        );
        let mut b = Backoffs::default();
        b.failure.insert("a".into(), create_retry(now));
        assert!(matches!(
            &steps(&p, &[lost, old], &b, 0, now)[0].1,
            Step::RetryLater { .. }
        ));
    }
}
