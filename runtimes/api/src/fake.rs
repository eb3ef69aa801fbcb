//! An in-memory runtime for unit tests: its answers are set by the test, and
//! it records how often it was asked.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{
    BoxFuture, ConditionKind, ContainerConfig, ContainerState, ContainerStatus, ImageFailure,
    ImageInfo, PullAuth, Runtime, RuntimeCondition, RuntimeError, RuntimeStatus, RuntimeVersion,
    SandboxConfig, SandboxStatus,
};

/// A runtime whose version and status are whatever the test last set.
#[derive(Debug)]
pub struct FakeRuntime {
    state: Mutex<FakeState>,
    /// How many `status` calls were made.
    pub status_calls: AtomicUsize,
}

#[derive(Debug)]
struct FakeState {
    up: bool,
    status: RuntimeStatus,
    seq: u64,
    sandboxes: BTreeMap<String, SandboxStatus>,
    containers: BTreeMap<String, ContainerStatus>,
    images: BTreeMap<String, ImageInfo>,
    /// Exit code each named container gets when it starts (None: runs).
    exits: BTreeMap<String, i32>,
    /// Exit code of an exec in each container ID (absent: not found).
    exec_exits: BTreeMap<String, i32>,
    /// Recorded calls, e.g. `start <name>`.
    pub calls: Vec<String>,
    /// How many sandbox removals still fail (a refused CNI DEL, say).
    failing_sandbox_removals: usize,
    /// Memory working set each container ID reports (absent: 0).
    usage: BTreeMap<String, u64>,
    /// How many container starts are still refused (containerd's "task
    /// already exists" after it restarted mid-start, say).
    refused_starts: usize,
    /// Container times follow tokio's (pausable) clock from this base.
    tokio_clock: Option<(i64, tokio::time::Instant)>,
}

/// The wall clock in Unix nanoseconds, as a runtime stamps containers.
fn system_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl FakeState {
    fn wall_nanos(&self) -> i64 {
        match self.tokio_clock {
            Some((base, at)) => base + at.elapsed().as_nanos() as i64,
            None => system_nanos(),
        }
    }
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeRuntime {
    /// A runtime that is up and ready.
    pub fn new() -> Self {
        let cond = |kind| RuntimeCondition {
            kind,
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        FakeRuntime {
            state: Mutex::new(FakeState {
                up: true,
                status: RuntimeStatus {
                    conditions: vec![
                        cond(ConditionKind::RuntimeReady),
                        cond(ConditionKind::NetworkReady),
                    ],
                    user_namespaces: false,
                },
                seq: 0,
                sandboxes: BTreeMap::new(),
                containers: BTreeMap::new(),
                images: BTreeMap::new(),
                exits: BTreeMap::new(),
                exec_exits: BTreeMap::new(),
                calls: Vec::new(),
                failing_sandbox_removals: 0,
                refused_starts: 0,
                usage: BTreeMap::new(),
                tokio_clock: None,
            }),
            status_calls: AtomicUsize::new(0),
        }
    }

    /// Stamps container times from tokio's clock (from now on), so tests in
    /// paused time see exits age as their back-offs do.
    pub fn follow_tokio_clock(&self) {
        self.lock().tokio_clock = Some((system_nanos(), tokio::time::Instant::now()));
    }

    /// What an exec in container `id` exits with from now on.
    pub fn set_exec_exit(&self, id: &str, code: i32) {
        self.lock().exec_exits.insert(id.into(), code);
    }

    /// Makes the next `n` sandbox removals fail (the sandbox stays).
    pub fn fail_sandbox_removals(&self, n: usize) {
        self.lock().failing_sandbox_removals = n;
    }

    /// The sandboxes that exist.
    pub fn sandboxes(&self) -> Vec<SandboxStatus> {
        self.lock().sandboxes.values().cloned().collect()
    }

    /// Makes every call fail as if the runtime's socket were gone.
    pub fn set_up(&self, up: bool) {
        self.lock().up = up;
    }

    /// Replaces the status the runtime reports.
    pub fn set_status(&self, status: RuntimeStatus) {
        self.lock().status = status;
    }

    /// Makes an image pullable.
    pub fn add_image(&self, name: &str) {
        self.lock().images.insert(
            name.into(),
            ImageInfo {
                // A distinct ID per name (FNV-1a), stable across calls.
                id: format!(
                    "sha256:{:064x}",
                    name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
                    })
                ),
                repo_tags: vec![name.into()],
                repo_digests: vec![],
                size: 1,
                // Images run as a non-root user unless a test says otherwise.
                uid: Some(1000),
                username: String::new(),
                pinned: false,
            },
        );
    }

    /// Marks an image pinned (as containerd pins its sandbox image).
    pub fn pin_image(&self, name: &str) {
        if let Some(i) = self.lock().images.get_mut(name) {
            i.pinned = true;
        }
    }

    /// Adds a container as the runtime would list it (a test's pods that
    /// ran before).
    pub fn insert_container(&self, c: ContainerStatus) {
        self.lock().containers.insert(c.id.clone(), c);
    }

    /// The memory working set container `id` reports in its stats.
    pub fn set_usage(&self, id: &str, bytes: u64) {
        self.lock().usage.insert(id.into(), bytes);
    }

    /// Refuses the next `n` container starts (the container stays created).
    pub fn refuse_starts(&self, n: usize) {
        self.lock().refused_starts = n;
    }

    /// Puts the containers named `name` in `state`, as a runtime that lost
    /// track of them (containerd restarted under a start) reports them.
    pub fn set_state(&self, name: &str, state: ContainerState) {
        for c in self.lock().containers.values_mut() {
            if c.name == name {
                c.state = state;
            }
        }
    }

    /// Containers named `name` exit with `code` as soon as they start.
    pub fn exit_on_start(&self, name: &str, code: i32) {
        self.lock().exits.insert(name.into(), code);
    }

    /// Ends a running container as if its process exited.
    pub fn finish(&self, name: &str, code: i32) {
        let mut s = self.lock();
        let now = s.wall_nanos();
        for c in s.containers.values_mut() {
            if c.name == name && c.state == ContainerState::Running {
                c.state = ContainerState::Exited;
                c.exit_code = code;
                c.finished_at = now;
                c.reason = if code == 0 {
                    "Completed".into()
                } else {
                    "Error".into()
                };
            }
        }
    }

    /// The calls made so far.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    pub fn containers(&self) -> Vec<ContainerStatus> {
        self.lock().containers.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        // A test that panicked while holding the lock already failed; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_up(&self) -> Result<(), RuntimeError> {
        if self.lock().up {
            Ok(())
        } else {
            Err(RuntimeError::Unavailable("fake runtime is down".into()))
        }
    }
}

impl Runtime for FakeRuntime {
    fn exec_sync<'a>(
        &'a self,
        id: &'a str,
        cmd: &'a [String],
        _timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<crate::ExecResult, RuntimeError>> {
        let mut st = self.lock();
        st.calls.push(format!("exec {id} {}", cmd.join(" ")));
        let r = match st.exec_exits.get(id) {
            Some(code) => Ok(crate::ExecResult {
                exit_code: *code,
                stdout: format!("exit {code}\n").into_bytes(),
                stderr: Vec::new(),
            }),
            None => Err(RuntimeError::NotFound(format!("container {id}"))),
        };
        Box::pin(async move { r })
    }

    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            Ok(RuntimeVersion {
                runtime_name: "fake".into(),
                runtime_version: "0.0.1".into(),
                runtime_api_version: "v1".into(),
            })
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>> {
        Box::pin(async move {
            self.status_calls.fetch_add(1, Ordering::Relaxed);
            self.check_up()?;
            Ok(self.lock().status.clone())
        })
    }

    fn run_pod_sandbox<'a>(
        &'a self,
        cfg: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<SandboxStatus, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            let mut s = self.lock();
            s.seq += 1;
            let id = format!("sandbox-{}", s.seq);
            s.calls.push(format!("run_pod_sandbox {}", cfg.pod_name));
            s.sandboxes.insert(
                id.clone(),
                SandboxStatus {
                    id: id.clone(),
                    pod_uid: cfg.pod_uid.clone(),
                    ready: true,
                    ip: None,
                    created_at: 1,
                },
            );
            Ok(s.sandboxes[&id].clone())
        })
    }

    fn remove_pod_sandbox<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let mut s = self.lock();
            s.calls.push(format!("remove_pod_sandbox {id}"));
            if s.failing_sandbox_removals > 0 {
                s.failing_sandbox_removals -= 1;
                return Err(RuntimeError::Other(format!(
                    "sandbox {id}: teardown refused"
                )));
            }
            s.sandboxes.remove(id);
            Ok(())
        })
    }

    fn list_pod_sandboxes(&self) -> BoxFuture<'_, Result<Vec<SandboxStatus>, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            let mut s = self.lock();
            s.calls.push("list_pod_sandboxes".into());
            Ok(s.sandboxes.values().cloned().collect())
        })
    }

    fn create_container<'a>(
        &'a self,
        sandbox_id: &'a str,
        cfg: &'a ContainerConfig,
        sandbox: &'a SandboxConfig,
    ) -> BoxFuture<'a, Result<String, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            let mut s = self.lock();
            s.seq += 1;
            let id = format!("c{}-{}", s.seq, cfg.name);
            let target =
                (cfg.pid_target.as_ref()).map_or(String::new(), |t| format!(" target={t}"));
            s.calls
                .push(format!("create {} {}{target}", cfg.name, cfg.attempt));
            s.containers.insert(
                id.clone(),
                ContainerStatus {
                    id: id.clone(),
                    sandbox_id: sandbox_id.into(),
                    pod_uid: sandbox.pod_uid.clone(),
                    name: cfg.name.clone(),
                    attempt: cfg.attempt,
                    image: cfg.image.clone(),
                    image_ref: cfg.image.clone(),
                    image_id: String::new(),
                    state: ContainerState::Created,
                    created_at: 1,
                    started_at: 0,
                    finished_at: 0,
                    exit_code: 0,
                    reason: String::new(),
                    message: String::new(),
                    log_path: cfg.log_path.clone(),
                    pid: 0,
                },
            );
            Ok(id)
        })
    }

    fn start_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let mut s = self.lock();
            if s.refused_starts > 0 {
                s.refused_starts -= 1;
                s.calls.push(format!("refused start {id}"));
                return Err(RuntimeError::Other(format!("task {id}: already exists")));
            }
            let exits = s.exits.clone();
            let now = s.wall_nanos();
            let c = s
                .containers
                .get_mut(id)
                .ok_or_else(|| RuntimeError::NotFound(format!("container {id}")))?;
            c.state = ContainerState::Running;
            c.started_at = now;
            if let Some(code) = exits.get(&c.name) {
                c.state = ContainerState::Exited;
                c.exit_code = *code;
                c.finished_at = now;
                c.reason = if *code == 0 {
                    "Completed".into()
                } else {
                    "Error".into()
                };
            }
            let name = c.name.clone();
            s.calls.push(format!("start {name}"));
            Ok(())
        })
    }

    fn stop_container<'a>(
        &'a self,
        id: &'a str,
        _timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let mut s = self.lock();
            let now = s.wall_nanos();
            if let Some(c) = s.containers.get_mut(id)
                && c.state == ContainerState::Running
            {
                c.state = ContainerState::Exited;
                c.finished_at = now;
                c.exit_code = 137;
                c.reason = "Error".into();
            }
            s.calls.push(format!("stop {id}"));
            Ok(())
        })
    }

    fn remove_container<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let mut s = self.lock();
            s.containers.remove(id);
            s.calls.push(format!("remove {id}"));
            Ok(())
        })
    }

    fn update_container_resources<'a>(
        &'a self,
        id: &'a str,
        r: &'a crate::ContainerResources,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let mut s = self.lock();
            if !s.containers.contains_key(id) {
                return Err(RuntimeError::NotFound(format!("container {id}")));
            }
            let q = r.cpu_quota.map_or("-".into(), |q| q.to_string());
            let m = r.memory_limit.map_or("-".into(), |m| m.to_string());
            s.calls.push(format!(
                "update {id} shares={} quota={q} memory={m}",
                r.cpu_shares
            ));
            Ok(())
        })
    }

    fn container_stats(&self) -> BoxFuture<'_, Result<Vec<crate::Usage>, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            let s = self.lock();
            let usage = s.containers.values().map(|c| crate::Usage {
                id: c.id.clone(),
                pod_uid: c.pod_uid.clone(),
                cpu_usage_core_nanos: 0,
                memory_working_set_bytes: s.usage.get(&c.id).copied().unwrap_or(0),
                writable_layer_bytes: 0,
                network: Vec::new(),
            });
            Ok(usage.collect())
        })
    }

    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerStatus>, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            Ok(self.lock().containers.values().cloned().collect())
        })
    }

    fn pull_image<'a>(
        &'a self,
        image: &'a str,
        _auth: &'a [PullAuth],
    ) -> BoxFuture<'a, Result<ImageInfo, ImageFailure>> {
        Box::pin(async move {
            let mut s = self.lock();
            s.calls.push(format!("pull {image}"));
            s.images.get(image).cloned().ok_or_else(|| ImageFailure {
                reason: crate::WaitingReason::ErrImagePull,
                message: format!("{image}: not found"),
            })
        })
    }

    fn image_status<'a>(
        &'a self,
        image: &'a str,
    ) -> BoxFuture<'a, Result<Option<ImageInfo>, ImageFailure>> {
        Box::pin(async move { Ok(self.lock().images.get(image).cloned()) })
    }

    fn list_images(&self) -> BoxFuture<'_, Result<Vec<ImageInfo>, RuntimeError>> {
        Box::pin(async move {
            self.check_up()?;
            Ok(self.lock().images.values().cloned().collect())
        })
    }

    fn remove_image<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let mut s = self.lock();
            s.calls.push(format!("remove_image {image}"));
            let before = s.images.len();
            s.images.retain(|n, i| n != image && i.id != image);
            if s.images.len() == before {
                return Err(RuntimeError::NotFound(format!("image {image}")));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_what_the_test_sets() {
        let rt = FakeRuntime::new();
        assert!(
            rt.status()
                .await
                .unwrap()
                .is_ready(ConditionKind::NetworkReady)
        );
        assert_eq!(rt.version().await.unwrap().node_info(), "fake://0.0.1");
        rt.set_status(RuntimeStatus::default());
        assert!(
            !rt.status()
                .await
                .unwrap()
                .is_ready(ConditionKind::RuntimeReady)
        );
        rt.set_up(false);
        assert!(matches!(
            rt.status().await,
            Err(RuntimeError::Unavailable(_))
        ));
        assert_eq!(rt.status_calls.load(Ordering::Relaxed), 3);
    }
}
