//! Images for a pod's containers: the pull policy, pulls with the pod's
//! image pull secrets and the credential provider plugins' credentials
//! ([`providers`]), the image pull back-off, and how many pulls run at
//! once on the node ([`PullSlots`]), as upstream's `images/image_manager.go`
//! and its serial and parallel pullers. Runtime-neutral: the runtime pulls.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use kinglet_runtime::{ImageInfo, PullAuth, Runtime, WaitingReason, image};
use tokio::time::Instant;

pub mod gc;
pub mod providers;

use super::report::Reporter;
use crate::pods::kuberuntime::plan::{Backoff, next_backoff};
use crate::pods::util::ObjectKind;
use crate::pods::util::ObjectSource;

/// Why a container's image is not there yet: the waiting reason and
/// message.
pub type Waiting = (WaitingReason, String);

/// How many image pulls run at once on the node: one
/// (`serializeImagePulls`, upstream's default), at most
/// `maxParallelImagePulls`, or any number. Shared by every pod's worker.
#[derive(Debug)]
pub struct PullSlots(Option<Arc<tokio::sync::Semaphore>>);

impl PullSlots {
    /// `None`: no limit.
    pub fn new(slots: Option<usize>) -> Self {
        PullSlots(slots.map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1)))))
    }

    /// Waits for a slot; held until the permit drops.
    async fn acquire(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        // The semaphore is never closed.
        self.0.as_ref()?.clone().acquire_owned().await.ok()
    }
}

impl Default for PullSlots {
    fn default() -> Self {
        PullSlots::new(Some(1))
    }
}

/// Pulls images for one pod's worker and keeps its pull back-off.
pub struct ImageManager {
    runtime: Arc<dyn Runtime>,
    objects: Option<Arc<dyn ObjectSource>>,
    providers: Option<Arc<providers::CredentialProviders>>,
    slots: Arc<PullSlots>,
    backoff: BTreeMap<String, Backoff>,
}

impl ImageManager {
    pub fn new(
        runtime: Arc<dyn Runtime>,
        objects: Option<Arc<dyn ObjectSource>>,
        providers: Option<Arc<providers::CredentialProviders>>,
        slots: Arc<PullSlots>,
    ) -> Self {
        ImageManager {
            runtime,
            objects,
            providers,
            slots,
            backoff: BTreeMap::new(),
        }
    }

    /// Time left in the pull back-off of any image, the shortest.
    pub fn retry_in(&self, now: Instant) -> Option<std::time::Duration> {
        self.backoff.values().filter_map(|b| b.left(now)).min()
    }

    /// Ensures the container's image per its pull policy; returns what the
    /// runtime reports of it (its user, for runAsNonRoot).
    /// `cancel` resolving (the pod is being terminated) ends a pull or
    /// its wait for a pull slot, with no event and no back-off.
    pub async fn ensure(
        &mut self,
        rep: &Reporter,
        pod: &Pod,
        c: &Container,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<ImageInfo, Waiting> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| image::default_pull_policy(&image).into());
        let status = match self.runtime.image_status(&image).await {
            Ok(p) => p,
            Err(f) => return Err((f.reason, f.message)),
        };
        let present = status.is_some();
        let pull = match policy.as_str() {
            "Never" if !present => {
                let msg =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                let reason = WaitingReason::ErrImageNeverPull;
                rep.event(pod, "Warning", reason.as_str(), msg.clone())
                    .await;
                return Err((reason, msg));
            }
            "Never" => false,
            "IfNotPresent" => !present,
            _ => true,
        };
        if !pull {
            if policy != "Always" {
                let msg = format!("Container image \"{image}\" already present on machine");
                rep.event(pod, "Normal", "Pulled", msg).await;
            }
            return Ok(status.unwrap_or_default());
        }
        if self
            .backoff
            .get(&image)
            .is_some_and(|b| b.left(Instant::now()).is_some())
        {
            return Err((
                WaitingReason::ImagePullBackOff,
                format!("Back-off pulling image \"{image}\""),
            ));
        }
        tokio::select! {
            pulled = self.pull(rep, pod, &image) => pulled,
            _ = cancel => Err((
                WaitingReason::ErrImagePull,
                format!("pulling image \"{image}\" cancelled: the pod is being terminated"),
            )),
        }
    }

    async fn pull(&mut self, rep: &Reporter, pod: &Pod, image: &str) -> Result<ImageInfo, Waiting> {
        rep.event(
            pod,
            "Normal",
            "Pulling",
            format!("Pulling image \"{image}\""),
        )
        .await;
        let waited_from = Instant::now();
        let auth = self.pull_auth(rep, pod, image).await;
        let permit = self.slots.acquire().await;
        let started = Instant::now();
        let pulled = self.runtime.pull_image(image, &auth).await;
        drop(permit);
        match pulled {
            Ok(info) => {
                self.backoff.remove(image);
                let msg = format!(
                    "Successfully pulled image \"{image}\" in {} ({} including waiting). Image size: {} bytes.",
                    go_millis(started.elapsed()),
                    go_millis(waited_from.elapsed()),
                    info.size
                );
                rep.event(pod, "Normal", "Pulled", msg).await;
                Ok(info)
            }
            Err(f) => {
                let next = next_backoff(self.backoff.get(image), Instant::now());
                self.backoff.insert(image.to_string(), next);
                let msg = format!("Failed to pull image \"{image}\": {}", f.message);
                rep.event(pod, "Warning", "Failed", msg.clone()).await;
                rep.event(pod, "Warning", "Failed", format!("Error: {}", f.reason))
                    .await;
                Err((f.reason, msg))
            }
        }
    }

    /// Credentials for `image`, tried in order by the runtime as
    /// upstream's keyring: the pod's imagePullSecrets, then what the
    /// credential provider plugins give.
    async fn pull_auth(&self, rep: &Reporter, pod: &Pod, image: &str) -> Vec<PullAuth> {
        let mut auth = self.secrets_auth(rep, pod, image).await;
        if let Some(p) = &self.providers {
            let (namespace, name) = crate::pods::util::namespace_and_name(pod);
            let spec = pod.spec.as_ref();
            let who = providers::PodIdentity {
                namespace,
                name,
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                service_account: spec
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_default(),
            };
            auth.extend(p.credentials(image, &who).await);
        }
        auth
    }

    /// Credentials for `image` from the pod's imagePullSecrets.
    async fn secrets_auth(&self, rep: &Reporter, pod: &Pod, image: &str) -> Vec<PullAuth> {
        let names: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        let Ok(reference) = image::parse(image) else {
            return Vec::new();
        };
        if names.is_empty() {
            return Vec::new();
        }
        let (ns, _) = crate::pods::util::namespace_and_name(pod);
        let mut raw = Vec::new();
        let mut missing = Vec::new();
        for n in names {
            let got = match &self.objects {
                Some(src) => src.get(ObjectKind::Secret, &ns, &n).await.ok().flatten(),
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
            rep.event(pod, "Warning", "FailedToRetrieveImagePullSecret", msg)
                .await;
        }
        image::credentials_from_secrets(&raw, &reference.registry)
    }
}

/// A duration as Go prints one truncated to milliseconds, as upstream's
/// `Pulled` event has it ("1.234s", "945ms").
fn go_millis(d: std::time::Duration) -> crate::config::GoDuration {
    crate::config::GoDuration(std::time::Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}
