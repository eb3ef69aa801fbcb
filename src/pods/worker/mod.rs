//! One task per pod UID (upstream's pod worker). It holds only the newest
//! [`PodUpdate`] and moves its pod one way through three phases:
//!
//! - **syncing**: each round takes the pod's containers from the PLEG cache
//!   (newer than the worker's own last action), asks
//!   [`plan`](crate::pods::kuberuntime::plan) what to do, executes that against the runtime, and reports one status;
//!   it wakes on a new update, a change of its containers, or a back-off
//!   timer;
//! - **terminating**: on a kill request (deletion, eviction, the active
//!   deadline, the pod leaving every source) every container is stopped
//!   within the grace period and a final status is reported;
//! - **terminated**: nothing of the pod runs again. When the pod is deleted
//!   or leaves every source, its containers, sandbox, volumes and log dir
//!   are removed and the worker ends.

mod resize;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kinglet_runtime::{
    ContainerState, ContainerStatus, Runtime, SandboxConfig, SandboxStatus, WaitingReason,
};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::images::{ImageManager, Waiting};
use super::pleg::PodCache;
use super::podfiles::{FileError, PodFiles};
use super::prober::{Kind, Prober};
use super::report::{Report, Reporter};
use super::status;
use super::util::{NodeFacts, ObjectError, soonest};
use super::volumes::{self, Volumes};
use crate::pods::kuberuntime::plan::{self, Backoffs, Health, Step, Unprobed};
use crate::pods::util::pod_name;

/// What a pod's worker is given of the node: its plain facts (which the
/// pure parts read; `NodeContext` derefs to them) and the handles the
/// worker and its volumes hold.
#[derive(Clone, Debug, Default)]
pub struct NodeContext {
    pub facts: NodeFacts,
    /// ConfigMaps and Secrets, when an API server is configured.
    pub objects: Option<std::sync::Arc<dyn crate::pods::util::ObjectSource>>,
    /// The wall clock container times are compared with.
    pub clock: crate::pods::util::Clock,
    /// When the agent started (first probes are jittered within a period
    /// of it); `None`: long ago.
    pub started: Option<tokio::time::Instant>,
    /// What configMap, secret and projected volumes read, when an API
    /// server is configured.
    pub volume_sources: Option<std::sync::Arc<crate::pods::volumes::Sources>>,
    /// The last copy of what volumes read from the API server, for pods
    /// to start while it is unreachable (see [`crate::store`]).
    pub store: Option<std::sync::Arc<crate::store::LocalStore>>,
    /// The cluster's Services, for service environment variables.
    pub services: Option<std::sync::Arc<crate::pods::services::Services>>,
    /// kinglet's Prometheus metrics (probes, pod starts, relists).
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Image credential provider plugins, when configured.
    pub credential_providers:
        Option<std::sync::Arc<crate::pods::images::providers::CredentialProviders>>,
    /// The device manager: devices given at admission, applied to each
    /// container created.
    pub devices: Option<std::sync::Arc<crate::devices::DeviceManager>>,
    /// How many image pulls run at once (`serializeImagePulls`,
    /// `maxParallelImagePulls`).
    pub image_pulls: std::sync::Arc<crate::pods::images::PullSlots>,
}

impl std::ops::Deref for NodeContext {
    type Target = NodeFacts;
    fn deref(&self) -> &NodeFacts {
        &self.facts
    }
}

/// The reason of a pod the eviction manager ended.
pub const EVICTED: &str = "Evicted";

/// Why and how a pod is to be stopped (upstream's `KillPodOptions`): the
/// one hook deletion, eviction, the active deadline and liveness use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillRequest {
    /// The pod's final `status.reason` (`Evicted`, `DeadlineExceeded`);
    /// empty for a plain deletion.
    pub reason: String,
    pub message: String,
    /// Overrides the pod's grace period.
    pub grace: Option<Duration>,
}

/// What the pod manager sends a worker; only the newest is kept.
#[derive(Clone, Debug)]
pub struct PodUpdate {
    pub pod: Arc<Pod>,
    /// The pod left every source: terminate and remove everything.
    pub removed: bool,
    pub kill: Option<KillRequest>,
}

impl PodUpdate {
    fn wants_termination(&self) -> bool {
        self.removed || self.kill.is_some() || self.pod.metadata.deletion_timestamp.is_some()
    }

    fn wants_removal(&self) -> bool {
        self.removed || self.pod.metadata.deletion_timestamp.is_some()
    }
}

/// Upstream's `minimumGracePeriodInSeconds`: what a container has at least
/// after its `preStop` hook took the grace period.
const MIN_GRACE_AFTER_HOOK: Duration = Duration::from_secs(2);

/// What a sync round waits for next.
type Wake = Option<Duration>;

/// An attempt to start a container: its number, the older attempts to
/// remove first, and whether the restart back-off is to be forgotten.
struct Attempt {
    n: u32,
    remove: Vec<String>,
    reset_backoff: bool,
}

impl Attempt {
    fn new(n: u32, remove: Vec<String>, reset_backoff: bool) -> Self {
        Attempt {
            n,
            remove,
            reset_backoff,
        }
    }
}

/// Why a container's config could not be made: the message of its
/// `CreateContainerConfigError`, upstream's where upstream has one. A
/// subPath's cause is logged, not told (it may name host paths).
#[derive(Debug, thiserror::Error)]
enum ContainerConfigError {
    #[error(transparent)]
    Objects(#[from] ObjectError),
    #[error("{0}")]
    Spec(String),
    #[error("unable to find target container {0}")]
    NoTarget(String),
    #[error("failed to prepare subPath for volumeMount {mount:?} of container {container:?}")]
    SubPath { mount: String, container: String },
    #[error("{0}")]
    Files(#[from] FileError),
    #[error("{0}")]
    Blocking(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Devices(String),
}

/// Why a pod's sandbox is refused before the runtime is asked.
#[derive(Debug, thiserror::Error)]
enum SandboxRefused {
    #[error("RuntimeClass handler \"\" does not support user namespaces")]
    NoUserNamespaces,
    #[error("{0}")]
    Runtime(#[from] kinglet_runtime::RuntimeError),
}

pub struct Worker {
    uid: String,
    runtime: Arc<dyn Runtime>,
    node: NodeContext,
    cache: Arc<PodCache>,
    rep: Reporter,
    images: ImageManager,
    sandbox: Option<SandboxStatus>,
    backoffs: Backoffs,
    /// Waiting reasons and messages of containers that could not start.
    waiting: BTreeMap<String, Waiting>,
    start_time: Time,
    /// Set by the worker itself (the active deadline).
    own_kill: Option<KillRequest>,
    /// The kill that ended the pod, for its final status.
    killed: Option<KillRequest>,
    /// The last status reported a terminal phase (`Succeeded`, `Failed`):
    /// the pod is done, as upstream's pod worker sees it, and is never
    /// started again, even if its dead containers are collected.
    terminal: bool,
    /// Exited containers' termination messages (their file's, or their
    /// log's tail) by container ID, read once.
    messages: BTreeMap<String, String>,
    /// The PLEG's mark at the worker's last change to the runtime, and how
    /// many changes it has made.
    last_action: u64,
    actions: u64,
    /// The pod's probe tasks, made when the worker runs (they wake it).
    prober: Option<Prober>,
    /// The pod's updates, so a hook stops waiting when a kill arrives.
    updates: Option<watch::Receiver<PodUpdate>>,
    /// The pod's volumes, made when the worker runs (object changes wake it).
    volumes: Option<Volumes>,
    /// When a volume (a token) is next due for a refresh.
    volume_refresh: Wake,
    /// What each container's cgroup was last set to (in-place resize).
    actuated: crate::pods::kuberuntime::resize::Actuated,
    /// A resize is being actuated (`ResizeCompleted` when it is done).
    resizing: bool,
    /// Why the runtime refused the last resize, if it did.
    resize_error: Option<String>,
}

impl Worker {
    pub fn new(
        uid: String,
        runtime: Arc<dyn Runtime>,
        node: NodeContext,
        cache: Arc<PodCache>,
        rep: Reporter,
    ) -> Self {
        let images = ImageManager::new(
            runtime.clone(),
            node.objects.clone(),
            node.credential_providers.clone(),
            node.image_pulls.clone(),
        );
        let start_time = Time(node.clock.now());
        Worker {
            uid,
            runtime,
            node,
            cache,
            rep,
            images,
            sandbox: None,
            backoffs: Backoffs::default(),
            waiting: BTreeMap::new(),
            start_time,
            own_kill: None,
            killed: None,
            terminal: false,
            messages: BTreeMap::new(),
            last_action: 0,
            actions: 0,
            prober: None,
            updates: None,
            volumes: None,
            volume_refresh: None,
            actuated: Default::default(),
            resizing: false,
            resize_error: None,
        }
    }

    /// A pod adopted after a restart keeps its start time.
    pub fn set_start_time(&mut self, t: Time) {
        self.start_time = t;
    }

    /// Runs the pod through its phases; returns at the end or at shutdown
    /// (leaving what runs running).
    pub async fn run(
        mut self,
        mut updates: watch::Receiver<PodUpdate>,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) {
        self.prober = Some(Prober::new(
            self.runtime.clone(),
            self.rep.clone(),
            wake.clone(),
            self.node.started,
            self.node.metrics.clone(),
        ));
        self.updates = Some(updates.clone());
        self.volumes = Some(Volumes::new(
            self.node.facts.clone(),
            self.node.store.clone(),
            self.node.volume_sources.clone(),
            wake.clone(),
        ));
        let Some(u) = self.syncing(&mut updates, &wake, &shutdown).await else {
            return;
        };
        self.terminate(&u).await;
        self.remove_volumes().await;
        self.rep
            .send(Report::Terminated {
                uid: self.uid.clone(),
            })
            .await;
        let mut u = updates.borrow_and_update().clone();
        while !u.wants_removal() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = updates.changed() => if r.is_err() { return },
            }
            u = updates.borrow_and_update().clone();
        }
        self.cleanup(&u.pod).await;
        let pod = Box::new((*u.pod).clone());
        self.rep
            .send(Report::Removed {
                uid: self.uid.clone(),
                pod,
            })
            .await;
    }

    /// Syncs until a termination is asked for; returns that update.
    async fn syncing(
        &mut self,
        updates: &mut watch::Receiver<PodUpdate>,
        wake: &Notify,
        shutdown: &CancellationToken,
    ) -> Option<PodUpdate> {
        loop {
            let mut u = updates.borrow_and_update().clone();
            if let Some(k) = self.own_kill.take() {
                u.kill = Some(k);
            }
            if u.wants_termination() {
                return Some(u);
            }
            let current = tokio::select! {
                _ = shutdown.cancelled() => return None,
                c = self.cache.newer_than(&self.uid, self.last_action) => c,
            };
            let acted = self.actions;
            let next = self.sync(&u.pod, &current).await;
            if self.terminal {
                return Some(u);
            }
            // Having changed something, look again at once: the next round
            // asks for a relist newer than the change and reports it.
            if self.own_kill.is_some() || self.actions != acted {
                continue;
            }
            let timer = tokio::time::sleep(next.unwrap_or(Duration::from_secs(3600)));
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                r = updates.changed() => if r.is_err() { return None },
                _ = wake.notified() => {}
                _ = timer => {}
            }
        }
    }

    /// Called after each change made to the runtime.
    fn acted(&mut self) {
        self.last_action = self.cache.mark();
        self.actions += 1;
    }

    fn grace(pod: &Pod, kill: Option<&KillRequest>) -> Duration {
        kill.and_then(|k| k.grace).unwrap_or_else(|| {
            let s = pod
                .metadata
                .deletion_grace_period_seconds
                .or(pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds))
                .unwrap_or(30);
            Duration::from_secs(s.max(0) as u64)
        })
    }

    /// Stops every container within the grace period (then SIGKILL, by the
    /// runtime), each after its `preStop` hook, and reports the final
    /// status. Probes stop first: nothing restarts a container now.
    async fn terminate(&mut self, u: &PodUpdate) {
        let pod = &u.pod;
        let grace = Self::grace(pod, u.kill.as_ref());
        self.killed = u.kill.clone();
        if let Some(k) = u.kill.as_ref().filter(|k| k.reason == EVICTED) {
            self.rep
                .event(pod, "Warning", EVICTED, k.message.clone())
                .await;
        }
        if let Some(p) = &mut self.prober {
            p.stop();
        }
        let current = self.cache.newer_than(&self.uid, self.last_action).await;
        let running: Vec<(Container, &ContainerStatus)> = current
            .iter()
            .filter(|c| c.state != ContainerState::Exited)
            .filter_map(|st| Self::container(pod, &st.name).map(|c| (c, st)))
            .collect();
        self.stop_in_order(pod, &running, grace).await;
        self.acted();
        let current = self.cache.newer_than(&self.uid, self.last_action).await;
        self.report(pod, &current, self.sandbox.is_some()).await;
    }

    /// Stops `running` within `grace`. Sidecars (restartable init
    /// containers) outlive the rest, then stop one by one in reverse order,
    /// as upstream's termination ordering: a main container's preStop hook
    /// may still need one (a proxy, a server on the pod's network).
    async fn stop_in_order(
        &self,
        pod: &Pod,
        running: &[(Container, &ContainerStatus)],
        grace: Duration,
    ) {
        let sidecar_rank = |name: &str| {
            let inits = pod.spec.as_ref().and_then(|s| s.init_containers.as_ref());
            inits?
                .iter()
                .position(|c| c.name == name && crate::pods::util::is_sidecar(c))
        };
        let (mut sidecars, rest): (Vec<_>, Vec<_>) = running
            .iter()
            .partition(|(c, _)| sidecar_rank(&c.name).is_some());
        let deadline = Instant::now() + grace;
        let stops = rest.iter().map(|(c, st)| {
            let msg = format!("Stopping container {}", c.name);
            self.kill_container(pod, c, &st.id, grace, msg)
        });
        futures::future::join_all(stops).await;
        sidecars.sort_by_key(|(c, _)| std::cmp::Reverse(sidecar_rank(&c.name)));
        for (c, st) in sidecars {
            let left = deadline.saturating_duration_since(Instant::now());
            let left = if grace.is_zero() {
                left
            } else {
                left.max(MIN_GRACE_AFTER_HOOK)
            };
            let msg = format!("Stopping container {}", c.name);
            self.kill_container(pod, c, &st.id, left, msg).await;
        }
    }

    /// Kills one container as upstream's `killContainer`: the `Killing`
    /// event, the `preStop` hook within the grace period, then the stop
    /// signal with what is left of it (at least upstream's 2 s after a
    /// hook), SIGKILL after.
    async fn kill_container(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        grace: Duration,
        msg: String,
    ) {
        self.rep.event(pod, "Normal", "Killing", msg).await;
        let mut left = grace;
        let pre_stop = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref());
        if let Some(h) = pre_stop.filter(|_| !grace.is_zero()) {
            let began = Instant::now();
            if let Ok(Err(e)) = tokio::time::timeout(grace, self.hook(pod, c, id, h)).await {
                self.rep
                    .event(pod, "Warning", "FailedPreStopHook", e.to_string())
                    .await;
            }
            left = grace
                .saturating_sub(began.elapsed())
                .max(MIN_GRACE_AFTER_HOOK);
        }
        if let Err(e) = self.runtime.stop_container(id, left).await {
            warn!(pod = %pod_name(pod), container = %c.name, error = %e, "stopping container failed");
        }
    }

    async fn hook(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        h: &LifecycleHandler,
    ) -> Result<(), super::hooks::HookError> {
        super::hooks::run(&*self.runtime, pod, c, id, h, &self.pod_ip(pod)).await
    }

    /// Runs `postStart`; `None` when a kill of the pod arrived first (the
    /// termination then stops the container).
    async fn post_start(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        h: &LifecycleHandler,
    ) -> Option<Result<(), super::hooks::HookError>> {
        let hook = self.hook(pod, c, id, h);
        let Some(mut rx) = self.updates.clone() else {
            return Some(hook.await);
        };
        tokio::select! {
            r = hook => Some(r),
            _ = rx.wait_for(|u| u.wants_termination()) => None,
        }
    }

    /// Resolves once an update asks the pod to terminate (never without
    /// updates): what ends a wait that should not outlive the pod.
    fn terminating(&self) -> impl std::future::Future<Output = ()> + use<> {
        let rx = self.updates.clone();
        async move {
            match rx {
                Some(mut rx) => {
                    if rx.wait_for(|u| u.wants_termination()).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    /// The containers probes watch: running regular containers and sidecars.
    fn probed<'p>(
        pod: &'p Pod,
        current: &'p [ContainerStatus],
    ) -> Vec<(&'p Container, &'p ContainerStatus)> {
        let Some(spec) = pod.spec.as_ref() else {
            return Vec::new();
        };
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| crate::pods::util::is_sidecar(c));
        sidecars
            .chain(spec.containers.iter())
            .filter_map(|c| {
                let latest = plan::attempts(current, &c.name).into_iter().next()?;
                (latest.state == ContainerState::Running).then_some((c, latest))
            })
            .collect()
    }

    /// Keeps the probe tasks in step with the running containers and kills
    /// those whose liveness or startup probe failed (the plan restarts
    /// them per the restart policy). `true` when it killed one.
    async fn probe_and_kill(&mut self, pod: &Pod, current: &[ContainerStatus]) -> bool {
        let running = Self::probed(pod, current);
        let pod_ip = self.pod_ip(pod);
        let Some(prober) = self.prober.as_mut() else {
            return false;
        };
        prober.sync(pod, &running, &pod_ip);
        let failed: Vec<(&Container, &ContainerStatus, Kind)> = running
            .iter()
            .filter_map(|(c, st)| prober.failed(&st.id).map(|k| (*c, *st, k)))
            .collect();
        for (c, st, kind) in &failed {
            let what = if *kind == Kind::Startup {
                "startup"
            } else {
                "liveness"
            };
            let msg = format!(
                "Container {} failed {what} probe, will be restarted",
                c.name
            );
            let grace = kind
                .spec(c)
                .and_then(|p| p.termination_grace_period_seconds)
                .map_or_else(
                    || Self::grace(pod, None),
                    |s| Duration::from_secs(s.max(0) as u64),
                );
            self.kill_container(pod, c, &st.id, grace, msg).await;
        }
        if !failed.is_empty() {
            self.acted();
        }
        !failed.is_empty()
    }

    /// Pods with their own network have the sandbox's IP; host-network
    /// pods (or nodes without CNI) the node's. Before its sandbox exists, a
    /// pod with its own network has none yet, as upstream reports it.
    fn pod_ip(&self, pod: &Pod) -> String {
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        match &self.sandbox {
            Some(s) => s.ip.clone().unwrap_or_else(|| self.node.node_ip.clone()),
            None if host_network => self.node.node_ip.clone(),
            None => String::new(),
        }
    }

    /// A terminated pod's volumes go before the pod does, as upstream's
    /// volume manager tears down the volumes of terminated pods: an
    /// evicted or finished pod gives its emptyDirs' space back at once.
    async fn remove_volumes(&mut self) {
        self.volumes = None;
        if let Some(d) =
            crate::pods::util::contained_child(Path::new(&self.node.volume_root), &self.uid)
        {
            let _ = tokio::task::spawn_blocking(move || volumes::remove_pod_dir(&d)).await;
        }
        if let Some(st) = self.node.store.clone() {
            let uid = self.uid.clone();
            let _ = tokio::task::spawn_blocking(move || st.remove_pod(&uid)).await;
        }
    }

    /// Removes everything of the pod from the node.
    async fn cleanup(&mut self, pod: &Pod) {
        self.acted();
        let current = self.cache.newer_than(&self.uid, self.last_action).await;
        for c in current.iter() {
            if let Err(e) = self.runtime.remove_container(&c.id).await {
                warn!(pod = %pod_name(pod), container = %c.name, error = %e, "removing container failed");
            }
        }
        let sandboxes = self.runtime.list_pod_sandboxes().await.unwrap_or_default();
        for s in sandboxes.into_iter().filter(|s| s.pod_uid == self.uid) {
            if let Err(e) = self.runtime.remove_pod_sandbox(&s.id).await {
                warn!(pod = %pod_name(pod), error = %e, "removing sandbox failed");
            }
        }
        // Volumes went at termination; again, for a pod removed before it
        // terminated. Off the async thread, as a large volume takes a while
        // to delete. (The log dir goes a minute later, from the manager, as
        // upstream's container GC removes it.)
        self.remove_volumes().await;
        if let Some(files) = PodFiles::new(&self.node.pods_dir, &self.uid) {
            let _ = tokio::task::spawn_blocking(move || files.remove()).await;
        }
    }

    /// Checks `activeDeadlineSeconds`: past it, the worker asks to kill the
    /// pod, which then fails for good, as upstream's deadline handler.
    /// Returns the time left.
    async fn check_deadline(&mut self, pod: &Pod) -> Wake {
        let deadline = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds)?;
        let active = self.node.clock.now().duration_since(self.start_time.0);
        let limit = jiff::SignedDuration::from_secs(deadline.max(0));
        if active < limit {
            return Some((limit - active).unsigned_abs());
        }
        let message = "Pod was active on the node longer than the specified deadline";
        self.rep
            .event(pod, "Normal", "DeadlineExceeded", message.into())
            .await;
        self.own_kill = Some(KillRequest {
            reason: "DeadlineExceeded".into(),
            message: message.into(),
            grace: None,
        });
        None
    }

    /// One round of syncing; returns when a timer should wake it.
    async fn sync(&mut self, pod: &Pod, current: &[ContainerStatus]) -> Wake {
        let deadline = self.check_deadline(pod).await;
        if self.own_kill.is_some() {
            return None;
        }
        let sb = crate::pods::kuberuntime::sandbox::sandbox_config(pod, &self.node);
        let sandbox_id = match self.ensure_sandbox(pod, &sb, current).await {
            Ok(id) => id,
            Err(retry) => {
                self.report(pod, current, false).await;
                return Some(retry);
            }
        };
        if self.probe_and_kill(pod, current).await {
            return None;
        }
        let resize_retry = self.resize(pod, &sb, &sandbox_id, current).await;
        let now = Instant::now();
        let wall = self.node.clock.now_nanos();
        let steps = plan::plan(pod, current, &self.backoffs, wall, now, self.health());
        let mut wake = soonest(soonest(deadline, self.volume_refresh), resize_retry);
        for s in steps {
            wake = soonest(wake, self.execute(pod, &sb, &sandbox_id, s).await);
        }
        wake = soonest(wake, self.images.retry_in(Instant::now()));
        self.report(pod, current, true).await;
        wake
    }

    /// Finds or makes the pod's sandbox and prepares its volumes; `Err` is
    /// when to try again.
    async fn ensure_sandbox(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        current: &[ContainerStatus],
    ) -> Result<String, Duration> {
        const RETRY: Duration = Duration::from_secs(5);
        if self.sandbox.is_none() {
            self.adopt_sandbox(pod, current).await?;
        }
        let setup = match self.volumes.as_mut() {
            Some(v) => v.setup(pod).await.map_err(|e| e.to_string()),
            None => crate::pods::volumes::host::prepare_volumes(pod, &self.node)
                .map(|_| None)
                .map_err(|e| e.0),
        };
        match setup {
            Ok(refresh) => self.volume_refresh = refresh,
            Err(e) => {
                // As upstream: the error is the event's; the containers keep
                // their default waiting reason (PodInitializing in a pod
                // with init containers, ContainerCreating otherwise) and
                // no message (a spec watches for exactly that).
                self.rep.event(pod, "Warning", "FailedMount", e).await;
                return Err(RETRY);
            }
        }
        if let Some(s) = &self.sandbox {
            return Ok(s.id.clone());
        }
        if let Err(e) = self.user_namespaces_supported(pod).await {
            let msg = format!("Failed to create pod sandbox: {e}");
            self.rep
                .event(pod, "Warning", "FailedCreatePodSandBox", msg)
                .await;
            return Err(RETRY);
        }
        match self.runtime.run_pod_sandbox(sb).await {
            Ok(s) => {
                self.acted();
                let id = s.id.clone();
                self.sandbox = Some(s);
                Ok(id)
            }
            Err(e) => {
                let msg = format!("Failed to create pod sandbox: {e}");
                self.rep
                    .event(pod, "Warning", "FailedCreatePodSandBox", msg)
                    .await;
                Err(RETRY)
            }
        }
    }

    /// `hostUsers: false` asks a user namespace of the pod's own: refused
    /// with upstream's message unless the runtime's default handler has
    /// them (neither kinglet's runtime nor containerd before 1.7 does).
    async fn user_namespaces_supported(&self, pod: &Pod) -> Result<(), SandboxRefused> {
        let wanted = pod.spec.as_ref().and_then(|s| s.host_users) == Some(false);
        if !wanted {
            return Ok(());
        }
        match self.runtime.status().await? {
            s if s.user_namespaces => Ok(()),
            _ => Err(SandboxRefused::NoUserNamespaces),
        }
    }

    /// Takes over a ready sandbox of the pod (a restart) and removes dead
    /// ones (the machine rebooted), as upstream does. Never makes a second
    /// sandbox because the runtime could not say whether one exists.
    async fn adopt_sandbox(
        &mut self,
        pod: &Pod,
        current: &[ContainerStatus],
    ) -> Result<(), Duration> {
        let existing = match self.runtime.list_pod_sandboxes().await {
            Ok(e) => e,
            Err(e) => {
                warn!(pod = %pod_name(pod), error = %e, "cannot list pod sandboxes");
                return Err(Duration::from_secs(5));
            }
        };
        let (ready, dead): (Vec<_>, Vec<_>) = existing
            .into_iter()
            .filter(|s| s.pod_uid == self.uid)
            .partition(|s| s.ready);
        for s in dead {
            for c in current
                .iter()
                .filter(|c| c.sandbox_id == s.id && c.state == ContainerState::Running)
            {
                let _ = self.runtime.stop_container(&c.id, Duration::ZERO).await;
            }
            if let Err(e) = self.runtime.remove_pod_sandbox(&s.id).await {
                warn!(pod = %pod_name(pod), sandbox = %s.id, error = %e, "cannot remove a dead sandbox");
            }
            self.acted();
        }
        self.sandbox = ready.into_iter().next();
        Ok(())
    }

    /// A container of the pod by name: init, regular or ephemeral.
    fn container(pod: &Pod, name: &str) -> Option<Container> {
        let spec = pod.spec.as_ref()?;
        let found = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| c.name == name);
        match found {
            Some(c) => Some(c.clone()),
            None => crate::pods::util::ephemeral_containers(spec)
                .into_iter()
                .find(|c| c.name == name),
        }
    }

    /// Carries out one step of the plan; returns when to look again.
    async fn execute(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        s: plan::ContainerStep,
    ) -> Wake {
        let c = Self::container(pod, &s.name)?;
        let c = &c;
        if s.reset_backoff {
            self.backoffs.restart.remove(&s.name);
        }
        match s.step {
            Step::Keep => {
                self.waiting.remove(&s.name);
                None
            }
            Step::StartCreated(id) => {
                let wake = self.start_created(pod, c, &id).await;
                self.acted();
                wake
            }
            Step::Replace {
                unknown,
                attempt,
                mut remove,
            } => {
                // Upstream kills a container of unknown state before its
                // restart: it may still run.
                if let Err(e) = self.runtime.stop_container(&unknown, Duration::ZERO).await {
                    warn!(pod = %pod_name(pod), container = %c.name, error = %e, "killing a container of unknown state failed");
                }
                remove.insert(0, unknown);
                let a = Attempt::new(attempt, remove, s.reset_backoff);
                self.start_attempt(pod, sb, sandbox_id, c, a).await
            }
            Step::Start { attempt, remove } => {
                let a = Attempt::new(attempt, remove, s.reset_backoff);
                self.start_attempt(pod, sb, sandbox_id, c, a).await
            }
            Step::CrashLoop { delay, left } => {
                self.crash_loop(pod, c, delay).await;
                Some(left)
            }
            Step::RetryLater { left } => Some(left),
        }
    }

    /// Starts a container created before a crash (of kinglet, or of the
    /// runtime mid-start). A refusal removes it, so the next look, after a
    /// fresh relist, creates a new one under the back-off already running
    /// instead of asking again; only a failed removal adds a back-off.
    async fn start_created(&mut self, pod: &Pod, c: &Container, id: &str) -> Wake {
        let e = match self.runtime.start_container(id).await {
            Ok(()) => return None,
            Err(e) => e,
        };
        warn!(pod = %pod_name(pod), container = %c.name, error = %e, "starting a created container failed");
        let reason = WaitingReason::RunContainerError;
        self.waiting.insert(c.name.clone(), (reason, e.to_string()));
        let e = self.runtime.remove_container(id).await.err()?;
        warn!(pod = %pod_name(pod), container = %c.name, error = %e, "removing a container that would not start failed");
        let next = plan::next_backoff(self.backoffs.failure.get(&c.name), Instant::now());
        self.backoffs.failure.insert(c.name.clone(), next);
        Some(next.delay)
    }

    /// Removes older attempts and starts attempt `a.n`, counting a restart
    /// into the back-off.
    async fn start_attempt(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        c: &Container,
        a: Attempt,
    ) -> Wake {
        let (attempt, remove) = (a.n, a.remove);
        if attempt > 0 && !self.backoffs.failure.contains_key(&c.name) {
            let now = Instant::now();
            let seeded = (!a.reset_backoff)
                .then(|| plan::seeded_backoff(attempt - 1, now))
                .flatten();
            let prev = self.backoffs.restart.get(&c.name).or(seeded.as_ref());
            let next = plan::next_backoff(prev, now);
            self.backoffs.restart.insert(c.name.clone(), next);
        }
        for id in remove {
            let _ = self.runtime.remove_container(&id).await;
        }
        let wake = self.start(pod, sb, sandbox_id, c, attempt).await;
        self.acted();
        wake
    }

    async fn crash_loop(&mut self, pod: &Pod, c: &Container, delay: Duration) {
        let msg = format!(
            "back-off {} restarting failed container={} pod={}_{}({})",
            fmt_secs(delay),
            c.name,
            pod.metadata.name.as_deref().unwrap_or(""),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.uid
        );
        if self
            .waiting
            .get(&c.name)
            .is_none_or(|w| w.0 != WaitingReason::CrashLoopBackOff)
        {
            let ev = format!(
                "Back-off restarting failed container {} in pod {}",
                c.name,
                pod_name(pod)
            );
            self.rep.event(pod, "Warning", "BackOff", ev).await;
        }
        self.waiting
            .insert(c.name.clone(), (WaitingReason::CrashLoopBackOff, msg));
    }

    /// Pulls, configures, creates and starts one container. A failure sets
    /// the waiting reason and a back-off before the next try (upstream
    /// backs off too); returns when to try again.
    async fn start(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        c: &Container,
        attempt: u32,
    ) -> Wake {
        match self.create_and_start(pod, sb, sandbox_id, c, attempt).await {
            Ok(()) => {
                self.waiting.remove(&c.name);
                self.backoffs.failure.remove(&c.name);
                None
            }
            Err((reason, message, backoff)) => {
                self.waiting.insert(c.name.clone(), (reason, message));
                if !backoff {
                    return None;
                }
                // A container that was never made retries flat, as
                // upstream's pod worker; one that failed to start or its
                // postStart hook exited, and that backs off growing.
                let now = Instant::now();
                let next = match reason {
                    WaitingReason::CreateContainerConfigError
                    | WaitingReason::CreateContainerError => plan::create_retry(now),
                    _ => plan::next_backoff(self.backoffs.failure.get(&c.name), now),
                };
                self.backoffs.failure.insert(c.name.clone(), next);
                Some(next.delay)
            }
        }
    }

    /// `Err` is (reason, message, whether to back off before retrying).
    async fn create_and_start(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        c: &Container,
        attempt: u32,
    ) -> Result<(), (WaitingReason, String, bool)> {
        let cancel = self.terminating();
        let image = match self.images.ensure(&self.rep, pod, c, cancel).await {
            Ok(image) => image,
            // Pull failures have the image back-off of their own.
            Err((reason, msg)) => return Err((reason, msg, !reason.is_pull_failure())),
        };
        self.ensure_image_volumes(pod, c).await?;
        if let Err(e) = crate::pods::kuberuntime::container::verify_run_as_non_root(pod, c, &image)
        {
            return Err(self.config_error(pod, e.0).await);
        }
        let cfg = match self.container_config(pod, c, attempt).await {
            Ok(cfg) => cfg,
            Err(e) => return Err(self.config_error(pod, e.to_string()).await),
        };
        let id = match self.runtime.create_container(sandbox_id, &cfg, sb).await {
            Ok(id) => id,
            Err(e) => {
                return Err(self
                    .failed(pod, WaitingReason::CreateContainerError, e.to_string())
                    .await);
            }
        };
        let made_with = c.resources.clone().unwrap_or_default();
        self.actuated.set(&c.name, &id, made_with);
        let msg = format!("Created container {}", c.name);
        self.rep.event(pod, "Normal", "Created", msg).await;
        if let Err(e) = self.runtime.start_container(&id).await {
            return Err(self
                .failed(pod, WaitingReason::RunContainerError, e.to_string())
                .await);
        }
        let msg = format!("Started container {}", c.name);
        self.rep.event(pod, "Normal", "Started", msg).await;
        self.after_start(pod, c, &id).await
    }

    /// The container's `postStart` hook, if it has one: a failing hook is
    /// evented and kills the container, as upstream.
    async fn after_start(
        &mut self,
        pod: &Pod,
        c: &Container,
        id: &str,
    ) -> Result<(), (WaitingReason, String, bool)> {
        let post_start = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref());
        let Some(h) = post_start else {
            return Ok(());
        };
        match self.post_start(pod, c, id, h).await {
            Some(Err(e)) => {
                let msg = e.to_string();
                self.rep
                    .event(pod, "Warning", "FailedPostStartHook", msg.clone())
                    .await;
                let grace = Self::grace(pod, None);
                self.kill_container(pod, c, id, grace, "FailedPostStartHook".into())
                    .await;
                Err((WaitingReason::PostStartHookError, msg, true))
            }
            _ => Ok(()),
        }
    }

    /// The runtime's config for `c` (upstream's `generateContainerConfig`):
    /// its environment from the API server's objects and services, or the
    /// last kept copy when the API server does not answer in time, and the
    /// ID of an ephemeral container's target. `Err` is the message of a
    /// `CreateContainerConfigError`.
    async fn container_config(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
    ) -> Result<kinglet_runtime::ContainerConfig, ContainerConfigError> {
        let store = self.node.store.clone();
        let kept = super::objects::read_kept_env(store.as_ref(), &self.uid, &c.name).await;
        let read = async {
            let mut objects =
                super::objects::env_objects(self.node.objects.as_deref(), pod, c).await;
            if let (Ok(o), Some(svc)) = (objects.as_mut(), &self.node.services) {
                match svc.env(pod).await {
                    Ok(vars) => o.1 = vars,
                    Err(e) => objects = Err(e),
                }
            }
            objects
        };
        // With the last environment kept, the API server gets a few
        // seconds (an offline reboot behind a dead route must not wait for
        // connect timeouts), as the volumes give it.
        let wait = self.node.volume_sources.as_ref().map(|s| s.kept_wait());
        let objects = match (&kept, wait) {
            (Some(_), Some(wait)) => tokio::time::timeout(wait, read)
                .await
                .unwrap_or(Err(ObjectError::NoAnswer)),
            _ => read.await,
        };
        let o = super::objects::kept_env(store, &self.uid, &c.name, objects, kept).await?;
        let pid_target = self.pid_target(pod, c)?;
        let (cfg, sub_paths) =
            crate::pods::kuberuntime::container::container_config(pod, c, attempt, &self.node, &o)
                .map_err(|e| ContainerConfigError::Spec(e.0))?;
        self.prepare_sub_paths(pod, c, sub_paths).await?;
        let mut cfg = kinglet_runtime::ContainerConfig { pid_target, ..cfg };
        if let Some(devices) = &self.node.devices {
            devices
                .pre_start(&self.uid, &c.name)
                .await
                .map_err(ContainerConfigError::Devices)?;
            let opts = devices.run_options(&self.uid, &c.name);
            crate::pods::kuberuntime::container::apply_devices(&mut cfg, &opts);
        }
        let files = self.kubelet_files(pod, c, attempt, &cfg.mounts).await?;
        cfg.mounts.extend(files);
        Ok(cfg)
    }

    /// The kubelet's files of container `c` as mounts (upstream's
    /// `makeMounts`): the pod's `/etc/hosts`, unless the container mounts
    /// its own, and the attempt's termination-message file.
    async fn kubelet_files(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        mounts: &[kinglet_runtime::Mount],
    ) -> Result<Vec<kinglet_runtime::Mount>, ContainerConfigError> {
        let Some(files) = PodFiles::new(&self.node.pods_dir, &self.uid) else {
            return Ok(Vec::new());
        };
        let hosts = !mounts.iter().any(|m| m.container_path == "/etc/hosts");
        let path = crate::pods::kuberuntime::container::termination_message_path(c).to_string();
        let (pod_ip, name) = (self.pod_ip(pod), c.name.clone());
        let (pod, facts) = (pod.clone(), self.node.facts.clone());
        let made = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            if hosts {
                let content = crate::pods::kuberuntime::sandbox::etc_hosts(&pod, &facts, &pod_ip);
                out.push(files.hosts(&content)?);
            }
            if !path.is_empty() {
                out.push(files.termination(&name, attempt, &path)?);
            }
            Ok::<_, FileError>(out)
        })
        .await?;
        Ok(made?)
    }

    /// Binds the container's sub paths onto their targets (off the async
    /// thread), as upstream's `PrepareSafeSubpath`; the cause is logged,
    /// not told to the pod (it may name host paths).
    async fn prepare_sub_paths(
        &self,
        pod: &Pod,
        c: &Container,
        sub_paths: Vec<crate::pods::volumes::subpath::SubPath>,
    ) -> Result<(), ContainerConfigError> {
        if sub_paths.is_empty() {
            return Ok(());
        }
        let prepared = tokio::task::spawn_blocking(move || {
            for s in &sub_paths {
                crate::pods::volumes::subpath::prepare(s).map_err(|e| (s.name.clone(), e))?;
            }
            Ok(())
        })
        .await?;
        prepared.map_err(|(mount, e)| {
            warn!(pod = %pod_name(pod), container = %c.name, error = %e, "preparing a subPath failed");
            ContainerConfigError::SubPath {
                mount,
                container: c.name.clone(),
            }
        })
    }

    /// The ID of the container an ephemeral container targets (its newest,
    /// as upstream's `getTargetID`), or upstream's error when the pod has
    /// none of that name.
    fn pid_target(&self, pod: &Pod, c: &Container) -> Result<Option<String>, ContainerConfigError> {
        let Some(target) = pod
            .spec
            .as_ref()
            .and_then(|s| crate::pods::util::ephemeral_target(s, &c.name))
        else {
            return Ok(None);
        };
        let current = self.cache.get(&self.uid);
        current
            .iter()
            .filter(|s| s.name == target)
            .max_by_key(|s| (s.created_at, s.attempt))
            .map(|s| Some(s.id.clone()))
            .ok_or_else(|| ContainerConfigError::NoTarget(target.to_string()))
    }

    /// The images of the image volumes `c` mounts, pulled per their pull
    /// policy, when the runtime can mount images at all (else upstream's
    /// `CreateContainerConfigError`, with why).
    async fn ensure_image_volumes(
        &mut self,
        pod: &Pod,
        c: &Container,
    ) -> Result<(), (WaitingReason, String, bool)> {
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        let mounted: Vec<&k8s_openapi::api::core::v1::Volume> = volumes
            .filter(|v| v.image.is_some())
            .filter(|v| c.volume_mounts.iter().flatten().any(|m| m.name == v.name))
            .collect();
        if mounted.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.runtime.image_mounts().await {
            return Err(self.config_error(pod, e.to_string()).await);
        }
        for v in mounted {
            let src = v.image.as_ref().cloned().unwrap_or_default();
            // Pulled as a container's image is, under the volume's policy.
            let as_container = Container {
                name: c.name.clone(),
                image: src.reference.clone(),
                image_pull_policy: src.pull_policy.clone(),
                ..Default::default()
            };
            let cancel = self.terminating();
            let pulled = self.images.ensure(&self.rep, pod, &as_container, cancel);
            if let Err((reason, msg)) = pulled.await {
                return Err((reason, msg, !reason.is_pull_failure()));
            }
        }
        Ok(())
    }

    /// [`Self::failed`] with `CreateContainerConfigError`.
    async fn config_error(&self, pod: &Pod, message: String) -> (WaitingReason, String, bool) {
        self.failed(pod, WaitingReason::CreateContainerConfigError, message)
            .await
    }

    async fn failed(
        &self,
        pod: &Pod,
        reason: WaitingReason,
        message: String,
    ) -> (WaitingReason, String, bool) {
        self.rep
            .event(pod, "Warning", "Failed", format!("Error: {message}"))
            .await;
        (reason, message, true)
    }

    /// Fills the message of exited containers as upstream's
    /// `getTerminationMessage`: what they wrote to their termination-message
    /// file (after the runtime's own message, if any), or, for those that
    /// failed without writing one and ask for it, their log's tail. Each
    /// container's is read once, off the async thread.
    async fn with_messages(
        &mut self,
        pod: &Pod,
        current: &[ContainerStatus],
    ) -> Vec<ContainerStatus> {
        let fallback: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .filter(|c| c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError"))
            .map(|c| c.name.clone())
            .collect();
        self.messages
            .retain(|id, _| current.iter().any(|c| &c.id == id));
        let unread: Vec<ContainerStatus> = current
            .iter()
            .filter(|c| c.state == ContainerState::Exited && !self.messages.contains_key(&c.id))
            .cloned()
            .collect();
        if !unread.is_empty() {
            let files = PodFiles::new(&self.node.pods_dir, &self.uid);
            let read = tokio::task::spawn_blocking(move || {
                unread
                    .into_iter()
                    .map(|c| {
                        let file = files.as_ref().map(|f| f.message(&c.name, c.attempt));
                        let mut m = file.unwrap_or_default();
                        if m.is_empty() && c.exit_code != 0 && fallback.contains(&c.name) {
                            m = super::logs::termination_tail(Path::new(&c.log_path));
                        }
                        (c.id, m)
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            self.messages.extend(read);
        }
        current
            .iter()
            .map(|c| {
                let mut c = c.clone();
                match self.messages.get(&c.id).filter(|m| !m.is_empty()) {
                    Some(m) if c.message.is_empty() => c.message = m.clone(),
                    Some(m) => c.message = format!("{}: {m}", c.message),
                    None => {}
                }
                c
            })
            .collect()
    }

    /// What the prober knows of the containers' startup and readiness
    /// (nothing probed yet: running is started and ready).
    fn health(&self) -> &dyn Health {
        match &self.prober {
            Some(p) => p,
            None => &Unprobed,
        }
    }

    async fn report(&mut self, pod: &Pod, current: &[ContainerStatus], sandbox_ready: bool) {
        let current = &self.with_messages(pod, current).await[..];
        let pod_ip = self.pod_ip(pod);
        let mut st = status::pod_status(
            pod,
            current,
            sandbox_ready,
            &self.waiting,
            &status::Placement {
                host_ip: &self.node.node_ip,
                pod_ip: &pod_ip,
                start_time: &self.start_time,
                scheme: &self.node.container_id_scheme,
            },
            self.health(),
        );
        self.resize_status(&mut st, pod, current);
        if let Some(k) = self.killed.as_ref().filter(|k| !k.reason.is_empty()) {
            st.phase = Some("Failed".into());
            st.reason = Some(k.reason.clone());
            st.message = Some(k.message.clone());
            if k.reason == EVICTED {
                // As upstream's eviction manager: the pod says who ended it.
                st.conditions
                    .get_or_insert_with(Vec::new)
                    .push(PodCondition {
                        type_: "DisruptionTarget".into(),
                        status: "True".into(),
                        reason: Some("TerminationByKubelet".into()),
                        message: Some(k.message.clone()),
                        ..Default::default()
                    });
            }
        }
        self.terminal = matches!(st.phase.as_deref(), Some("Succeeded") | Some("Failed"));
        self.rep.status(pod, st).await;
    }
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}
