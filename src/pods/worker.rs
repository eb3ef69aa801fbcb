//! One task per pod UID, holding only the newest desired spec: it syncs the
//! pod towards that spec whenever the spec, the pod's containers (from the
//! relist) or a back-off timer says so, and terminates it when the spec goes
//! away. Level-triggered and idempotent: every sync looks at what runs now.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kinglet_runtime::{ContainerState, ContainerStatus, Runtime, SandboxConfig};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::convert::{self, NodeContext};
use super::status;

/// Upstream's container restart and image pull back-off: 10 s doubling
/// to 300 s; reset after 10 minutes of clean running.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// What a worker reports.
#[derive(Debug)]
pub enum Report {
    Status {
        uid: String,
        pod: Box<Pod>,
        status: Box<PodStatus>,
    },
    Event {
        pod: Box<Pod>,
        type_: &'static str,
        reason: String,
        message: String,
    },
    Terminated {
        uid: String,
        pod: Box<Pod>,
    },
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    delay: Duration,
    /// The exit (or failure) this back-off counts from.
    since: Instant,
}

pub struct Worker {
    pub uid: String,
    pub runtime: Arc<dyn Runtime>,
    pub node: NodeContext,
    pub reports: mpsc::Sender<Report>,
    sandbox: Option<String>,
    backoff: BTreeMap<String, Backoff>,
    image_backoff: BTreeMap<String, Backoff>,
    waiting: BTreeMap<String, (String, String)>,
    start_time: Time,
    /// The sandbox's own IP, when the pod has its own network.
    pod_ip: Option<String>,
    /// Set once `activeDeadlineSeconds` has passed: the pod has failed.
    deadline_exceeded: bool,
    /// `FallbackToLogsOnError` messages by container ID, read once.
    log_messages: BTreeMap<String, String>,
}

fn is_restartable(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Always" => true,
        "OnFailure" => exit_code != 0,
        _ => false,
    }
}

impl Worker {
    pub fn new(
        uid: String,
        runtime: Arc<dyn Runtime>,
        node: NodeContext,
        reports: mpsc::Sender<Report>,
    ) -> Self {
        Worker {
            uid,
            runtime,
            node,
            reports,
            sandbox: None,
            backoff: BTreeMap::new(),
            image_backoff: BTreeMap::new(),
            waiting: BTreeMap::new(),
            start_time: Time(jiff::Timestamp::now()),
            pod_ip: None,
            deadline_exceeded: false,
            log_messages: BTreeMap::new(),
        }
    }

    pub fn set_start_time(&mut self, t: Time) {
        self.start_time = t;
    }

    async fn event(&self, pod: &Pod, type_: &'static str, reason: &str, message: String) {
        info!(pod = %pod_name(pod), reason, "{message}");
        let _ = self
            .reports
            .send(Report::Event {
                pod: Box::new(pod.clone()),
                type_,
                reason: reason.into(),
                message,
            })
            .await;
    }

    /// Runs until the spec goes away (`None`) and the pod is torn down.
    pub async fn run(
        mut self,
        mut spec: watch::Receiver<Option<Pod>>,
        mut containers: watch::Receiver<Vec<ContainerStatus>>,
        shutdown: CancellationToken,
    ) {
        let mut last: Option<Pod> = None;
        loop {
            let desired = spec.borrow_and_update().clone();
            let Some(pod) = desired.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
                let p = desired_or_last(spec.borrow().clone(), last.clone());
                if let Some(p) = p {
                    let current = containers.borrow().clone();
                    self.terminate(&p, current).await;
                    let _ = self
                        .reports
                        .send(Report::Terminated {
                            uid: self.uid.clone(),
                            pod: Box::new(p),
                        })
                        .await;
                }
                return;
            };
            last = Some(pod.clone());
            // The relist only says when to look: a snapshot taken before this
            // worker's own last action may miss what it just created, so the
            // pod's containers are listed afresh.
            let relisted = containers.borrow_and_update().clone();
            let current = match self.runtime.list_containers().await {
                Ok(all) => all.into_iter().filter(|c| c.pod_uid == self.uid).collect(),
                Err(_) => relisted,
            };
            let wake = self.sync(&pod, &current).await;
            let timer = tokio::time::sleep(wake.unwrap_or(Duration::from_secs(3600)));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = spec.changed() => if r.is_err() { return },
                r = containers.changed() => if r.is_err() { return },
                _ = timer => {}
            }
        }
    }

    /// Stops everything of the pod: the grace period, then SIGKILL; then
    /// removes containers and sandbox.
    async fn terminate(&mut self, pod: &Pod, current: Vec<ContainerStatus>) {
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .or(pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30)
            .max(0) as u64;
        let running: Vec<&ContainerStatus> = current
            .iter()
            .filter(|c| c.state != ContainerState::Exited)
            .collect();
        let stops = running.iter().map(|c| {
            let rt = self.runtime.clone();
            let id = c.id.clone();
            async move { rt.stop_container(&id, Duration::from_secs(grace)).await }
        });
        for (r, c) in futures::future::join_all(stops)
            .await
            .into_iter()
            .zip(&running)
        {
            if let Err(e) = r {
                warn!(pod = %pod_name(pod), container = %c.name, error = %e, "stopping container failed");
            } else {
                self.event(
                    pod,
                    "Normal",
                    "Killing",
                    format!("Stopping container {}", c.name),
                )
                .await;
            }
        }
        for c in &current {
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
        // emptyDir volumes go with the pod.
        let _ =
            std::fs::remove_dir_all(std::path::Path::new(&self.node.volume_root).join(&self.uid));
    }

    /// Ensures the image per pull policy; `Err` is the waiting reason.
    async fn ensure_image(&mut self, pod: &Pod, c: &Container) -> Result<(), (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| kinglet_runtime_oci::images::default_pull_policy(&image).into());
        let present = match self.runtime.image_status(&image).await {
            Ok(p) => p.is_some(),
            Err(f) => return Err((f.reason, f.message)),
        };
        let pull = match policy.as_str() {
            "Never" if !present => {
                let msg =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                self.event(pod, "Warning", "ErrImageNeverPull", msg.clone())
                    .await;
                return Err(("ErrImageNeverPull".into(), msg));
            }
            "Never" => false,
            "IfNotPresent" => !present,
            _ => true,
        };
        if !pull {
            if policy != "Always" {
                self.event(
                    pod,
                    "Normal",
                    "Pulled",
                    format!("Container image \"{image}\" already present on machine"),
                )
                .await;
            }
            return Ok(());
        }
        if let Some(b) = self.image_backoff.get(&image)
            && b.since.elapsed() < b.delay
        {
            return Err((
                "ImagePullBackOff".into(),
                format!("Back-off pulling image \"{image}\""),
            ));
        }
        self.event(
            pod,
            "Normal",
            "Pulling",
            format!("Pulling image \"{image}\""),
        )
        .await;
        let started = Instant::now();
        let auth = self.pull_auth(pod, &image).await;
        match self.runtime.pull_image(&image, &auth).await {
            Ok(info) => {
                self.image_backoff.remove(&image);
                self.event(
                    pod,
                    "Normal",
                    "Pulled",
                    format!(
                        "Successfully pulled image \"{image}\" in {:.3}s. Image size: {} bytes.",
                        started.elapsed().as_secs_f64(),
                        info.size
                    ),
                )
                .await;
                Ok(())
            }
            Err(f) => {
                let next = self
                    .image_backoff
                    .get(&image)
                    .map_or(BACKOFF_INITIAL, |b| (b.delay * 2).min(BACKOFF_MAX));
                self.image_backoff.insert(
                    image.clone(),
                    Backoff {
                        delay: next,
                        since: Instant::now(),
                    },
                );
                let msg = format!("Failed to pull image \"{image}\": {}", f.message);
                self.event(pod, "Warning", "Failed", msg.clone()).await;
                self.event(pod, "Warning", "Failed", format!("Error: {}", f.reason))
                    .await;
                Err((f.reason, msg))
            }
        }
    }

    async fn start(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        c: &Container,
        attempt: u32,
    ) {
        if let Err(w) = self.ensure_image(pod, c).await {
            self.waiting.insert(c.name.clone(), w);
            return;
        }
        let objects = match self.env_objects(pod, c).await {
            Ok(o) => o,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"))
                    .await;
                self.waiting
                    .insert(c.name.clone(), ("CreateContainerConfigError".into(), e));
                return;
            }
        };
        let cfg = match convert::container_config(pod, c, attempt, &self.node, &objects) {
            Ok(cfg) => cfg,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {}", e.0))
                    .await;
                self.waiting
                    .insert(c.name.clone(), ("CreateContainerConfigError".into(), e.0));
                return;
            }
        };
        let id = match self.runtime.create_container(sandbox_id, &cfg, sb).await {
            Ok(id) => id,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"))
                    .await;
                self.waiting.insert(
                    c.name.clone(),
                    ("CreateContainerError".into(), e.to_string()),
                );
                return;
            }
        };
        self.event(
            pod,
            "Normal",
            "Created",
            format!("Created container {}", c.name),
        )
        .await;
        if let Err(e) = self.runtime.start_container(&id).await {
            self.event(pod, "Warning", "Failed", format!("Error: {e}"))
                .await;
            self.waiting
                .insert(c.name.clone(), ("RunContainerError".into(), e.to_string()));
            return;
        }
        self.waiting.remove(&c.name);
        self.event(
            pod,
            "Normal",
            "Started",
            format!("Started container {}", c.name),
        )
        .await;
    }

    /// Decides what one container needs. Returns when to look again.
    async fn sync_container(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        c: &Container,
        mine: &[ContainerStatus],
        restart_policy: &str,
    ) -> (bool, Option<Duration>) {
        let tries = status::attempts(mine, &c.name);
        let Some(latest) = tries.first().copied().cloned() else {
            self.start(pod, sb, sandbox_id, c, 0).await;
            return (
                false,
                self.waiting
                    .contains_key(&c.name)
                    .then_some(Duration::from_secs(1)),
            );
        };
        match latest.state {
            ContainerState::Running => {
                self.waiting.remove(&c.name);
                (false, None)
            }
            ContainerState::Created | ContainerState::Unknown => {
                if let Err(e) = self.runtime.start_container(&latest.id).await {
                    warn!(pod = %pod_name(pod), container = %c.name, error = %e, "starting a created container failed");
                }
                (false, None)
            }
            ContainerState::Exited => {
                let done = !is_restartable(restart_policy, latest.exit_code);
                if done {
                    self.waiting.remove(&c.name);
                    return (latest.exit_code == 0, None);
                }
                let ran =
                    Duration::from_nanos((latest.finished_at - latest.started_at).max(0) as u64);
                if ran >= BACKOFF_RESET {
                    self.backoff.remove(&c.name);
                }
                let finished_ago = Duration::from_nanos(
                    (jiff::Timestamp::now().as_nanosecond() as i64 - latest.finished_at).max(0)
                        as u64,
                );
                if let Some(b) = self.backoff.get(&c.name).copied()
                    && finished_ago < b.delay
                {
                    let left = b.delay - finished_ago;
                    let msg = format!(
                        "back-off {} restarting failed container={} pod={}_{}({})",
                        fmt_secs(b.delay),
                        c.name,
                        pod.metadata.name.as_deref().unwrap_or(""),
                        pod.metadata.namespace.as_deref().unwrap_or("default"),
                        self.uid
                    );
                    if self
                        .waiting
                        .get(&c.name)
                        .is_none_or(|w| w.0 != "CrashLoopBackOff")
                    {
                        self.event(
                            pod,
                            "Warning",
                            "BackOff",
                            format!(
                                "Back-off restarting failed container {} in pod {}",
                                c.name,
                                pod_name(pod)
                            ),
                        )
                        .await;
                    }
                    self.waiting
                        .insert(c.name.clone(), ("CrashLoopBackOff".into(), msg));
                    return (false, Some(left));
                }
                let next = self
                    .backoff
                    .get(&c.name)
                    .map_or(BACKOFF_INITIAL, |b| (b.delay * 2).min(BACKOFF_MAX));
                self.backoff.insert(
                    c.name.clone(),
                    Backoff {
                        delay: next,
                        since: Instant::now(),
                    },
                );
                // Keep only the previous attempt (for lastState).
                for old in tries.iter().skip(1) {
                    let _ = self.runtime.remove_container(&old.id).await;
                }
                self.start(pod, sb, sandbox_id, c, latest.attempt + 1).await;
                (false, None)
            }
        }
    }

    /// One sync of the pod; returns when a timer should wake it.
    async fn sync(&mut self, pod: &Pod, current: &[ContainerStatus]) -> Option<Duration> {
        // activeDeadlineSeconds: past it, the pod's containers are killed
        // and it fails for good, as upstream's active deadline handler does.
        if let Some(deadline) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) {
            let active = jiff::Timestamp::now().duration_since(self.start_time.0);
            let limit = jiff::SignedDuration::from_secs(deadline.max(0));
            if active >= limit || self.deadline_exceeded {
                if !self.deadline_exceeded {
                    self.deadline_exceeded = true;
                    self.event(
                        pod,
                        "Normal",
                        "DeadlineExceeded",
                        "Pod was active on the node longer than the specified deadline".into(),
                    )
                    .await;
                }
                let grace = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30)
                    .max(0) as u64;
                for c in current.iter().filter(|c| c.state != ContainerState::Exited) {
                    let _ = self
                        .runtime
                        .stop_container(&c.id, Duration::from_secs(grace))
                        .await;
                }
                self.report(pod, current, self.sandbox.is_some()).await;
                return None;
            }
            let left = (limit - active).unsigned_abs();
            let wake = self.sync_inner(pod, current).await;
            return Some(wake.map_or(left, |w| w.min(left)));
        }
        self.sync_inner(pod, current).await
    }

    async fn sync_inner(&mut self, pod: &Pod, current: &[ContainerStatus]) -> Option<Duration> {
        let sb = convert::sandbox_config(pod, &self.node);
        if self.sandbox.is_none() {
            // Never make a second sandbox because the runtime could not say
            // whether one exists.
            let existing = match self.runtime.list_pod_sandboxes().await {
                Ok(e) => e,
                Err(e) => {
                    warn!(pod = %pod_name(pod), error = %e, "cannot list pod sandboxes");
                    self.report(pod, current, false).await;
                    return Some(Duration::from_secs(5));
                }
            };
            let (ready, dead): (Vec<_>, Vec<_>) = existing
                .into_iter()
                .filter(|s| s.pod_uid == self.uid)
                .partition(|s| s.ready);
            // A sandbox that is no longer ready (its pause process died, the
            // machine rebooted) is replaced, as upstream does.
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
            }
            if let Some(s) = ready.into_iter().next() {
                self.pod_ip = s.ip;
                self.sandbox = Some(s.id);
            }
        }
        if let Err(e) = convert::prepare_volumes(pod, &self.node) {
            self.event(pod, "Warning", "FailedMount", e.0.clone()).await;
            for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
                self.waiting
                    .insert(c.name.clone(), ("ContainerCreating".into(), e.0.clone()));
            }
            self.report(pod, current, false).await;
            return Some(Duration::from_secs(5));
        }
        let sandbox_id = match &self.sandbox {
            Some(id) => id.clone(),
            None => match self.runtime.run_pod_sandbox(&sb).await {
                Ok(id) => {
                    self.sandbox = Some(id.clone());
                    let sandboxes = self.runtime.list_pod_sandboxes().await.unwrap_or_default();
                    self.pod_ip = sandboxes
                        .into_iter()
                        .find(|s| s.id == id)
                        .and_then(|s| s.ip);
                    for v in pod
                        .spec
                        .iter()
                        .flat_map(|s| s.volumes.iter().flatten())
                        .filter(|v| v.projected.is_some())
                    {
                        let msg = format!(
                            "projected volume {:?} is mounted empty: service account token projection is not supported yet",
                            v.name
                        );
                        self.event(pod, "Warning", "FailedMount", msg).await;
                    }
                    id
                }
                Err(e) => {
                    self.event(
                        pod,
                        "Warning",
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {e}"),
                    )
                    .await;
                    self.report(pod, current, false).await;
                    return Some(Duration::from_secs(5));
                }
            },
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        let mut wake: Option<Duration> = None;
        let mut soonest = |d: Option<Duration>| {
            if let Some(d) = d {
                wake = Some(wake.map_or(d, |w: Duration| w.min(d)));
            }
        };

        // Init containers in order; sidecars (restartPolicy Always) keep
        // running and let the next one start once they run.
        let mut inits_done = true;
        for ic in spec.init_containers.iter().flatten() {
            let sidecar = ic.restart_policy.as_deref() == Some("Always");
            let ic_policy = if sidecar {
                "Always"
            } else if policy == "Never" {
                "Never"
            } else {
                "OnFailure"
            };
            let (succeeded, w) = self
                .sync_container(pod, &sb, &sandbox_id, ic, current, ic_policy)
                .await;
            soonest(w);
            let running = status::attempts(current, &ic.name)
                .first()
                .is_some_and(|c| c.state == ContainerState::Running);
            if !(succeeded || sidecar && running) {
                inits_done = false;
                break;
            }
        }
        if inits_done {
            for c in &spec.containers {
                let (_, w) = self
                    .sync_container(pod, &sb, &sandbox_id, c, current, &policy)
                    .await;
                soonest(w);
            }
        }
        self.report(pod, current, true).await;
        // Soon after starting something, look again (the relist also will).
        wake
    }

    /// Credentials for `image` from the pod's imagePullSecrets, tried in
    /// order by the runtime, as upstream's keyring does.
    async fn pull_auth(&self, pod: &Pod, image: &str) -> Vec<kinglet_runtime::PullAuth> {
        let names: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        let Ok(reference) = kinglet_runtime_oci::images::parse_reference(image) else {
            return Vec::new();
        };
        if names.is_empty() {
            return Vec::new();
        }
        let (ns, _) = convert::namespace_and_name(pod);
        let mut raw = Vec::new();
        let mut missing = Vec::new();
        for n in names {
            let got = match &self.node.objects {
                Some(src) => src
                    .get(convert::ObjectKind::Secret, &ns, &n)
                    .await
                    .ok()
                    .flatten(),
                None => None,
            };
            match got.and_then(|d| d.get(".dockerconfigjson").cloned()) {
                Some(v) => raw.push(v.into_bytes()),
                None => missing.push(n),
            }
        }
        if !missing.is_empty() {
            let msg = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                missing.join(", ")
            );
            self.event(pod, "Warning", "FailedToRetrieveImagePullSecret", msg)
                .await;
        }
        kinglet_runtime_oci::images::auth::credentials_from_secrets(&raw, reference.registry())
            .into_iter()
            .map(|c| kinglet_runtime::PullAuth {
                username: c.username,
                password: c.password,
            })
            .collect()
    }

    /// Fetches the ConfigMaps and Secrets `c`'s environment reads.
    async fn env_objects(&self, pod: &Pod, c: &Container) -> Result<convert::EnvObjects, String> {
        let mut out = convert::EnvObjects::default();
        let refs = convert::EnvObjects::refs(c);
        if refs.is_empty() {
            return Ok(out);
        }
        let (ns, _) = convert::namespace_and_name(pod);
        for (kind, name) in refs {
            // Without an API server nothing can be found: optional
            // references are skipped, the others fail as not found.
            let got = match &self.node.objects {
                Some(src) => src.get(kind, &ns, &name).await?,
                None => None,
            };
            out.0.insert((kind, name), got);
        }
        Ok(out)
    }

    /// Fills the message of containers that failed without writing their
    /// termination message from their log's tail, when they ask for it.
    fn with_log_messages(
        &mut self,
        pod: &Pod,
        current: &[ContainerStatus],
    ) -> Vec<ContainerStatus> {
        let fallback: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .filter(|c| c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError"))
            .map(|c| c.name.as_str())
            .collect();
        self.log_messages
            .retain(|id, _| current.iter().any(|c| &c.id == id));
        current
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if c.state == ContainerState::Exited
                    && c.exit_code != 0
                    && c.message.is_empty()
                    && fallback.contains(&c.name.as_str())
                {
                    c.message = self
                        .log_messages
                        .entry(c.id.clone())
                        .or_insert_with(|| super::logs::termination_tail(Path::new(&c.log_path)))
                        .clone();
                }
                c
            })
            .collect()
    }

    async fn report(&mut self, pod: &Pod, current: &[ContainerStatus], sandbox_ready: bool) {
        let current = &self.with_log_messages(pod, current)[..];
        // Pods with their own network have the sandbox's IP; host-network
        // pods (or nodes without CNI) the node's.
        let pod_ip = self
            .pod_ip
            .clone()
            .unwrap_or_else(|| self.node.node_ip.clone());
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
        );
        if self.deadline_exceeded {
            st.phase = Some("Failed".into());
            st.reason = Some("DeadlineExceeded".into());
            st.message =
                Some("Pod was active on the node longer than the specified deadline".into());
        }
        let _ = self
            .reports
            .send(Report::Status {
                uid: self.uid.clone(),
                pod: Box::new(pod.clone()),
                status: Box::new(st),
            })
            .await;
    }
}

fn desired_or_last(d: Option<Pod>, last: Option<Pod>) -> Option<Pod> {
    d.or(last)
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

pub fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}
