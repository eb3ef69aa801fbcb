//! The worker's side of an in-place resize: the running containers whose
//! resources differ from what the pod is now allocated are updated in
//! place through the runtime (`UpdateContainerResources`) or restarted,
//! as [`resize::actions`] says; the status reports what each container
//! runs with, and `PodResizeInProgress` until it is what is allocated
//! (`ResizeCompleted` then). What each container was last set to is kept
//! by container ID; after a restart of kinglet it comes from the pod's
//! recorded status.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kinglet_runtime::{ContainerStatus, SandboxConfig};
use tracing::warn;

use super::{Attempt, Wake, Worker};
use crate::pods::allocation::event_message;
use crate::pods::kuberuntime::container::container_resources;
use crate::pods::kuberuntime::plan::attempts;
use crate::pods::kuberuntime::resize::{self, Action};
use crate::pods::util::pod_name;

/// How soon a resize the runtime refused is tried again.
const RETRY: Duration = Duration::from_secs(10);

impl Worker {
    /// What the containers of a pod adopted after a restart were last set
    /// to, from its recorded status.
    pub fn set_actuated(&mut self, recorded: &PodStatus) {
        let statuses = recorded
            .init_container_statuses
            .iter()
            .flatten()
            .chain(recorded.container_statuses.iter().flatten());
        for s in statuses {
            let id = s.container_id.as_deref().and_then(|i| i.split_once("://"));
            if let (Some((_, id)), Some(r)) = (id, &s.resources) {
                self.actuated.set(&s.name, id, r.clone());
            }
        }
    }

    /// Brings the running containers to what `pod` (the allocated pod)
    /// says; returns when to try again after a failure.
    pub(super) async fn resize(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        current: &[ContainerStatus],
    ) -> Wake {
        let actions = resize::actions(pod, current, &self.actuated);
        if actions.is_empty() {
            if std::mem::take(&mut self.resizing) {
                let msg = event_message("Pod resize completed", pod, None);
                self.rep.event(pod, "Normal", "ResizeCompleted", msg).await;
            }
            return None;
        }
        self.resizing = true;
        for a in actions {
            let failed = match a {
                Action::Update { name, id } => self.update(pod, &name, &id).await,
                Action::Restart { name, id } => {
                    self.restart(pod, sb, sandbox_id, current, &name, &id).await;
                    None
                }
            };
            if let Some(e) = failed {
                if self.resize_error.as_deref() != Some(e.as_str()) {
                    let msg = event_message("Pod resize error", pod, Some(&e));
                    self.rep.event(pod, "Warning", "ResizeError", msg).await;
                }
                self.resize_error = Some(e);
                return Some(RETRY);
            }
        }
        self.resize_error = None;
        None
    }

    /// Sets a running container's cgroup to its allocation; the error, if
    /// the runtime refused.
    async fn update(&mut self, pod: &Pod, name: &str, id: &str) -> Option<String> {
        let c = Self::container(pod, name)?;
        let r = container_resources(pod, &c, &self.node);
        match self.runtime.update_container_resources(id, &r).await {
            Ok(()) => {
                let set = c.resources.clone().unwrap_or_default();
                self.actuated.set(name, id, set);
                None
            }
            Err(e) => {
                warn!(pod = %pod_name(pod), container = name, error = %e, "resizing a container failed");
                Some(format!("container {name}: {e}"))
            }
        }
    }

    /// Stops a container whose `resizePolicy` restarts it, and starts its
    /// next attempt with the new resources (whatever the restart policy:
    /// this is no crash).
    async fn restart(
        &mut self,
        pod: &Pod,
        sb: &SandboxConfig,
        sandbox_id: &str,
        current: &[ContainerStatus],
        name: &str,
        id: &str,
    ) {
        let Some(c) = Self::container(pod, name) else {
            return;
        };
        let msg = format!("Container {name} resize requires restart");
        let grace = Self::grace(pod, None);
        self.kill_container(pod, &c, id, grace, msg).await;
        let tries = attempts(current, name);
        let next = tries.first().map_or(0, |l| l.attempt + 1);
        let older = tries.iter().skip(1).map(|t| t.id.clone()).collect();
        self.start_attempt(pod, sb, sandbox_id, &c, Attempt::new(next, older, true))
            .await;
    }

    /// The status' resources of each container and the resize condition.
    pub(super) fn resize_status(&self, st: &mut PodStatus, pod: &Pod, current: &[ContainerStatus]) {
        resize::status_resources(st, pod, current, &self.actuated);
        let pending = !resize::actions(pod, current, &self.actuated).is_empty();
        if let Some(c) = resize::in_progress(pod, pending, self.resize_error.as_deref()) {
            st.conditions.get_or_insert_with(Vec::new).push(c);
        }
    }
}
