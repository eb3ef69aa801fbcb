//! The prober (upstream's `pkg/kubelet/prober`): one task per (container,
//! probe kind) — liveness, readiness, startup — owned by the pod's worker.
//!
//! Each task probes on its period after the initial delay (the first probe
//! jittered when the agent has just started, as upstream), counts
//! consecutive results against the thresholds and publishes the result in
//! the pod's [`Results`], which wakes the worker. The worker reads them:
//! readiness and startup make a container's `ready` and `started`; a failed
//! liveness or startup probe makes it kill and restart the container.
//! Startup gates the other two. Network probes go from the node to the pod
//! IP, exec probes through the runtime. Tasks are per container ID, so a
//! restarted container starts over with upstream's initial results.

pub mod handlers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kinglet_runtime::{ContainerStatus, Runtime};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::report::Reporter;
use handlers::{HttpTarget, Outcome, ProbeError, Verdict};

/// The three probe kinds, spelled as upstream's events spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Startup, Kind::Liveness, Kind::Readiness];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        }
    }

    pub fn spec(self, c: &Container) -> Option<&Probe> {
        match self {
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
            Kind::Startup => c.startup_probe.as_ref(),
        }
    }

    /// Upstream's initial result of a new container: not ready until a
    /// readiness probe succeeds, alive until liveness fails, unknown start.
    fn initial(self) -> Health {
        match self {
            Kind::Liveness => Health::Success,
            Kind::Readiness => Health::Failure,
            Kind::Startup => Health::Unknown,
        }
    }
}

/// A probe's published result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Unknown,
    Success,
    Failure,
}

/// The results of a pod's probes by (container ID, kind); setting one that
/// changes wakes the pod's worker.
pub struct Results {
    map: Mutex<HashMap<(String, Kind), Health>>,
    wake: Arc<Notify>,
    /// Told when a startup probe succeeds: readiness probes at once then,
    /// not a period later (upstream's manual trigger of the readiness
    /// worker).
    started: Notify,
}

impl Results {
    pub fn new(wake: Arc<Notify>) -> Self {
        Results {
            map: Mutex::new(HashMap::new()),
            wake,
            started: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Kind), Health>> {
        // A poisoned lock only means a task panicked mid-insert; the map
        // itself is still whole.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set(&self, id: &str, kind: Kind, h: Health) {
        let old = self.lock().insert((id.to_string(), kind), h);
        if old != Some(h) {
            self.wake.notify_one();
            if kind == Kind::Startup && h == Health::Success {
                self.started.notify_waiters();
            }
        }
    }

    pub fn get(&self, id: &str, kind: Kind) -> Option<Health> {
        self.lock().get(&(id.to_string(), kind)).copied()
    }

    /// Whether the container has started: its startup probe succeeded,
    /// or it has none (what gates the other probes and `started`).
    pub fn started(&self, c: &Container, id: &str) -> bool {
        c.startup_probe.is_none() || self.get(id, Kind::Startup) == Some(Health::Success)
    }

    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|(id, _), _| keep(id));
    }
}

/// A probe's settings with upstream's defaults for zero or absent fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn of(p: &Probe, kind: Kind) -> Self {
        let secs =
            |v: Option<i32>, d: i32| Duration::from_secs(v.filter(|v| *v > 0).unwrap_or(d) as u64);
        let count = |v: Option<i32>, d: i32| v.filter(|v| *v > 0).unwrap_or(d) as u32;
        Timing {
            initial_delay: Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64),
            period: secs(p.period_seconds, 10),
            timeout: secs(p.timeout_seconds, 1),
            // Liveness and startup must be 1 (the API server enforces it;
            // static pods are held to it here).
            success_threshold: match kind {
                Kind::Readiness => count(p.success_threshold, 1),
                _ => 1,
            },
            failure_threshold: count(p.failure_threshold, 3),
        }
    }
}

/// Consecutive results against the thresholds (upstream's `resultRun`).
#[derive(Clone, Debug)]
pub struct Thresholds {
    success: u32,
    failure: u32,
    last: Option<bool>,
    run: u32,
}

impl Thresholds {
    pub fn new(t: &Timing) -> Self {
        Thresholds {
            success: t.success_threshold,
            failure: t.failure_threshold,
            last: None,
            run: 0,
        }
    }

    /// Counts one result; returns the result to publish once the run of
    /// equal results reaches its threshold.
    pub fn observe(&mut self, ok: bool) -> Option<Health> {
        if self.last == Some(ok) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(ok);
            self.run = 1;
        }
        let needed = if ok { self.success } else { self.failure };
        (self.run >= needed).then_some(if ok { Health::Success } else { Health::Failure })
    }

    /// After a published liveness failure, counting starts over.
    pub fn reset(&mut self) {
        self.run = 0;
    }
}

/// A running container to probe.
#[derive(Clone, Debug)]
pub struct Target {
    pub pod: Arc<Pod>,
    pub container: Container,
    pub id: String,
    /// Unix nanoseconds.
    pub started_at: i64,
    pub pod_ip: String,
}

/// How a task reaches what it probes and whom it tells.
#[derive(Clone)]
struct Ctx {
    rt: Arc<dyn Runtime>,
    rep: Reporter,
    results: Arc<Results>,
    /// When the agent started: the first probe is jittered only within a
    /// period of it, as upstream spreads probes after a restart.
    agent_start: Option<Instant>,
    metrics: Arc<crate::metrics::Metrics>,
}

/// The probe tasks of one pod.
pub struct Prober {
    ctx: Ctx,
    tasks: HashMap<(String, Kind), CancellationToken>,
}

impl Prober {
    pub fn new(
        rt: Arc<dyn Runtime>,
        rep: Reporter,
        wake: Arc<Notify>,
        agent_start: Option<Instant>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        Prober {
            ctx: Ctx {
                rt,
                rep,
                results: Arc::new(Results::new(wake)),
                agent_start,
                metrics,
            },
            tasks: HashMap::new(),
        }
    }

    /// Makes the tasks match the running containers: new ones get theirs,
    /// those gone (exited, restarted) lose theirs and their results.
    pub fn sync(&mut self, pod: &Pod, running: &[(&Container, &ContainerStatus)], pod_ip: &str) {
        self.tasks.retain(|(id, _), cancel| {
            let keep = running.iter().any(|(_, st)| &st.id == id);
            if !keep {
                cancel.cancel();
            }
            keep
        });
        self.ctx
            .results
            .retain(|id| running.iter().any(|(_, st)| st.id == id));
        // The pod is copied once, and only when a task is new.
        let mut shared: Option<Arc<Pod>> = None;
        for (c, st) in running {
            for kind in Kind::ALL {
                let Some(spec) = kind.spec(c) else {
                    continue;
                };
                let key = (st.id.clone(), kind);
                if self.tasks.contains_key(&key) {
                    continue;
                }
                let pod = shared.get_or_insert_with(|| Arc::new(pod.clone())).clone();
                let t = Target {
                    pod,
                    container: (*c).clone(),
                    id: st.id.clone(),
                    started_at: st.started_at,
                    pod_ip: pod_ip.to_string(),
                };
                let cancel = self.spawn(t, kind, spec.clone());
                self.tasks.insert(key, cancel);
            }
        }
    }

    /// Starts one task; cancelling the token ends it.
    fn spawn(&self, t: Target, kind: Kind, spec: Probe) -> CancellationToken {
        let cancel = CancellationToken::new();
        self.ctx.results.set(&t.id, kind, kind.initial());
        let task = Task {
            t,
            kind,
            spec,
            ctx: self.ctx.clone(),
        };
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = c.cancelled() => {}
                _ = task.run() => {}
            }
        });
        cancel
    }

    /// Stops every task (the pod is terminating).
    pub fn stop(&mut self) {
        for (_, c) in self.tasks.drain() {
            c.cancel();
        }
    }

    /// The probe that failed for good (liveness or startup): the container
    /// is to be killed and restarted.
    pub fn failed(&self, id: &str) -> Option<Kind> {
        [Kind::Startup, Kind::Liveness]
            .into_iter()
            .find(|k| self.ctx.results.get(id, *k) == Some(Health::Failure))
    }
}

impl crate::pods::kuberuntime::plan::Health for Prober {
    /// Started: its startup probe succeeded, or it has none.
    fn started(&self, c: &Container, id: &str) -> bool {
        self.ctx.results.started(c, id)
    }

    /// Ready: started, and its readiness probe succeeded, or it has none.
    fn ready(&self, c: &Container, id: &str) -> bool {
        self.started(c, id)
            && (c.readiness_probe.is_none()
                || self.ctx.results.get(id, Kind::Readiness) == Some(Health::Success))
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A cheap random fraction for the first probe's jitter.
fn random_fraction() -> f64 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (n % 1000) as f64 / 1000.0
}

struct Task {
    t: Target,
    kind: Kind,
    spec: Probe,
    ctx: Ctx,
}

impl Task {
    async fn run(self) {
        let timing = Timing::of(&self.spec, self.kind);
        if self
            .ctx
            .agent_start
            .is_some_and(|s| s.elapsed() < timing.period)
        {
            tokio::time::sleep(timing.period.mul_f64(random_fraction())).await;
        }
        let now = jiff::Timestamp::now().as_nanosecond() as i64;
        // A start time the runtime has not reported yet (0) is now: the
        // initial delay must never be skipped for want of it (it was, for
        // a sidecar probed before its start time was read back).
        let started_at = if self.t.started_at > 0 {
            self.t.started_at
        } else {
            now
        };
        let running_for = Duration::from_nanos((now - started_at).max(0) as u64);
        if let Some(left) = timing.initial_delay.checked_sub(running_for) {
            tokio::time::sleep(left).await;
        }
        let mut th = Thresholds::new(&timing);
        let mut tick = tokio::time::interval(timing.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.next_tick(&mut tick).await;
            if !self.gated() && self.probe_once(&timing, &mut th).await {
                return;
            }
        }
    }

    /// The next period; for a readiness probe that startup holds back,
    /// sooner: the moment the startup probe succeeds.
    async fn next_tick(&self, tick: &mut tokio::time::Interval) {
        let started = self.ctx.results.started.notified();
        tokio::pin!(started);
        // Registered before the look, so a success in between still wakes.
        started.as_mut().enable();
        if self.kind == Kind::Readiness && self.gated() {
            tokio::select! {
                _ = tick.tick() => {}
                _ = started => {}
            }
        } else {
            tick.tick().await;
        }
    }

    /// Startup gates the others; a started container's startup probe rests.
    fn gated(&self) -> bool {
        let started = self.ctx.results.started(&self.t.container, &self.t.id);
        match self.kind {
            Kind::Startup => started,
            _ => !started,
        }
    }

    /// One probe, counted; `true` when the task is done (a published
    /// liveness failure, or any published startup result: on hold until the
    /// container is replaced, as upstream).
    async fn probe_once(&self, timing: &Timing, th: &mut Thresholds) -> bool {
        let ok = self.run_with_retries(timing.timeout).await;
        let Some(h) = th.observe(ok) else {
            return false;
        };
        self.ctx.results.set(&self.t.id, self.kind, h);
        let hold =
            self.kind == Kind::Startup || (self.kind == Kind::Liveness && h == Health::Failure);
        if hold {
            th.reset();
        }
        hold
    }

    /// Runs the handler (retried up to three times on an error, as
    /// upstream) and records upstream's events; `true` for success.
    async fn run_with_retries(&self, timeout: Duration) -> bool {
        let mut out = run_handler(&*self.ctx.rt, &self.t, &self.spec, timeout).await;
        for _ in 1..3 {
            if out.is_ok() {
                break;
            }
            out = run_handler(&*self.ctx.rt, &self.t, &self.spec, timeout).await;
        }
        let kind = self.kind.as_str();
        let result = match &out {
            Ok((Verdict::Success | Verdict::Warning, _)) => "successful",
            Ok((Verdict::Failure, _)) => "failed",
            Err(_) => "unknown",
        };
        let probe_type = match self.kind {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        };
        self.ctx
            .metrics
            .probe(probe_type, result, &self.t.container.name, &self.t.pod);
        let (type_, msg, ok) = match out {
            Ok((Verdict::Success, _)) => return true,
            Ok((Verdict::Warning, o)) => ("Warning", format!("{kind} probe warning: {o}"), true),
            Ok((Verdict::Failure, o)) => ("Warning", format!("{kind} probe failed: {o}"), false),
            Err(e) => (
                "Warning",
                format!("{kind} probe errored and resulted in unknown state: {e}"),
                false,
            ),
        };
        let reason = if ok { "ProbeWarning" } else { "Unhealthy" };
        self.ctx.rep.event(&self.t.pod, type_, reason, msg).await;
        ok
    }
}

/// A port by number or by the name of one of the container's ports.
pub fn resolve_port(p: &IntOrString, c: &Container) -> Result<u16, ProbeError> {
    let n = match p {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            .map(|cp| cp.container_port)
            .ok_or_else(|| ProbeError::PortNotFound(name.clone()))?,
    };
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or(ProbeError::BadPort(n))
}

/// The HTTP target of an `httpGet` action: the host defaults to the pod IP.
pub fn http_target(
    g: &k8s_openapi::api::core::v1::HTTPGetAction,
    c: &Container,
    pod_ip: &str,
) -> Result<HttpTarget, ProbeError> {
    Ok(HttpTarget {
        scheme: g.scheme.as_deref().unwrap_or("HTTP").to_lowercase(),
        host: g
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| pod_ip.to_string()),
        port: resolve_port(&g.port, c)?,
        path: g.path.clone().unwrap_or_default(),
        headers: g
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
    })
}

/// Runs the probe's handler once.
async fn run_handler(rt: &dyn Runtime, t: &Target, p: &Probe, timeout: Duration) -> Outcome {
    if let Some(e) = &p.exec {
        let cmd = crate::pods::kuberuntime::env::expand_static(
            e.command.as_deref().unwrap_or_default(),
            &t.container,
        );
        return handlers::exec(rt, &t.id, &cmd, timeout).await;
    }
    if let Some(g) = &p.http_get {
        let target = http_target(g, &t.container, &t.pod_ip)?;
        return handlers::http_get(&target, timeout, handlers::PROBE_USER_AGENT).await;
    }
    if let Some(s) = &p.tcp_socket {
        let port = resolve_port(&s.port, &t.container)?;
        let host = s
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| t.pod_ip.clone());
        return handlers::tcp(&host, port, timeout).await;
    }
    if let Some(g) = &p.grpc {
        let port = u16::try_from(g.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or(ProbeError::BadPort(g.port))?;
        let service = g.service.clone().unwrap_or_default();
        return handlers::grpc(&t.pod_ip, port, &service, timeout).await;
    }
    Err(ProbeError::NoHandler {
        pod: crate::pods::util::pod_name(&t.pod),
        container: t.container.name.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::kuberuntime::plan::Health as _;

    fn timing(succ: u32, fail: u32) -> Timing {
        Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: succ,
            failure_threshold: fail,
        }
    }

    #[test]
    fn results_are_published_once_a_run_reaches_its_threshold() {
        let mut th = Thresholds::new(&timing(2, 3));
        assert_eq!(th.observe(false), None);
        assert_eq!(th.observe(false), None);
        assert_eq!(
            th.observe(true),
            None,
            "a success breaks the run of failures"
        );
        assert_eq!(th.observe(true), Some(Health::Success));
        assert_eq!(th.observe(true), Some(Health::Success));
        assert_eq!(th.observe(false), None);
        assert_eq!(th.observe(false), None);
        assert_eq!(th.observe(false), Some(Health::Failure));
        th.reset();
        assert_eq!(
            th.observe(false),
            None,
            "counting starts over after a reset"
        );
    }

    #[test]
    fn zero_fields_take_upstreams_defaults() {
        let p = Probe {
            success_threshold: Some(5),
            timeout_seconds: Some(0),
            ..Default::default()
        };
        let t = Timing::of(&p, Kind::Liveness);
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!(t.failure_threshold, 3);
        assert_eq!(t.success_threshold, 1, "liveness needs one success");
        assert_eq!(Timing::of(&p, Kind::Readiness).success_threshold, 5);
    }

    #[test]
    fn ports_by_number_or_by_name() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}]
        }))
        .unwrap();
        let port = |p| resolve_port(&p, &c).map_err(|e| e.to_string());
        assert_eq!(port(IntOrString::Int(81)), Ok(81));
        assert_eq!(port(IntOrString::String("http".into())), Ok(8080));
        assert_eq!(
            port(IntOrString::String("nope".into())),
            Err("port \"nope\" not found".into())
        );
        assert_eq!(
            port(IntOrString::Int(70000)),
            Err("invalid port number: 70000".into())
        );
    }

    fn container(probe: Probe, kind: Kind, name: &str) -> Container {
        let mut c = Container {
            name: name.into(),
            ..Default::default()
        };
        match kind {
            Kind::Liveness => c.liveness_probe = Some(probe),
            Kind::Readiness => c.readiness_probe = Some(probe),
            Kind::Startup => c.startup_probe = Some(probe),
        }
        c
    }

    fn running(id: &str) -> ContainerStatus {
        crate::pods::running_container(id, "")
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_probes_the_moment_startup_succeeds_not_a_period_later() {
        let fake = Arc::new(kinglet_runtime::fake::FakeRuntime::default());
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let rep = Reporter {
            uid: "u1".into(),
            tx,
        };
        let exec = |period| Probe {
            exec: Some(k8s_openapi::api::core::v1::ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(period),
            failure_threshold: Some(120),
            ..Default::default()
        };
        let start = Instant::now() - Duration::from_secs(60);
        let wake = Arc::new(Notify::new());
        let mut p = Prober::new(fake.clone(), rep, wake, Some(start), Default::default());
        let mut c = container(exec(30), Kind::Readiness, "sidecar");
        c.startup_probe = Some(exec(5));
        fake.set_exec_exit("c1", 1);
        let s1 = running("c1");
        p.sync(&crate::pods::test_pod("u1"), &[(&c, &s1)], "127.0.0.1");
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(!p.ready(&c, "c1"), "not started yet");
        fake.set_exec_exit("c1", 0);
        // Startup succeeds at its probe of 10 s; readiness's own period
        // would next come at 30 s.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(p.ready(&c, "c1"), "ready at once after startup");
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_a_probe_and_liveness_fails_after_its_threshold() {
        let fake = Arc::new(kinglet_runtime::fake::FakeRuntime::default());
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let rep = Reporter {
            uid: "u1".into(),
            tx,
        };
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let wake = Arc::new(Notify::new());
        let probe = Probe {
            exec: Some(k8s_openapi::api::core::v1::ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(2),
            ..Default::default()
        };
        let start = Instant::now() - Duration::from_secs(60);
        let mut p = Prober::new(
            fake.clone(),
            rep,
            wake.clone(),
            Some(start),
            Default::default(),
        );
        let ready = container(probe.clone(), Kind::Readiness, "r");
        let live = container(probe, Kind::Liveness, "l");
        fake.set_exec_exit("c1", 0);
        fake.set_exec_exit("c2", 1);
        let (s1, s2) = (running("c1"), running("c2"));
        let pod = crate::pods::test_pod("u1");
        p.sync(&pod, &[(&ready, &s1), (&live, &s2)], "127.0.0.1");
        assert!(!p.ready(&ready, "c1"), "not ready before a probe");
        assert_eq!(p.failed("c2"), None, "alive before a probe");
        // The first probe runs at once, then one per period.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(p.ready(&ready, "c1"));
        assert_eq!(p.failed("c2"), None, "one failure is below the threshold");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(p.failed("c2"), Some(Kind::Liveness));
        fake.set_exec_exit("c1", 1);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!p.ready(&ready, "c1"), "readiness lost again");
        p.sync(&pod, &[], "");
        assert_eq!(p.failed("c2"), None, "results go with their containers");
    }
}
