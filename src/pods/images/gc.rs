//! Image garbage collection at the kubelet level, over the runtime trait
//! (upstream's `images/image_gc_manager.go`), so CRI nodes collect too.
//!
//! Every 5 minutes (upstream's `ImageGCPeriod`): when the image
//! filesystem's usage is at or above `imageGCHighThresholdPercent`, the
//! images no container uses (in any state, as upstream counts them) are
//! removed (pinned ones never: containerd's sandbox image), least
//! recently used first, until usage is below
//! `imageGCLowThresholdPercent`. Images first seen less than
//! `imageMinimumGCAge` ago are spared, and so are the images of every pod
//! the node holds that has not finished, whether its containers exist or
//! not: a pod restored offline (or crash-looping with its dead container
//! collected) must find its image where it left it, with no registry.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kinglet_runtime::{ImageInfo, Runtime, RuntimeError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Upstream's `ImageGCPeriod`.
pub const PERIOD: Duration = Duration::from_secs(300);

/// The thresholds, from the kubelet configuration.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub high_percent: u8,
    pub low_percent: u8,
    pub min_age: Duration,
}

/// Capacity and free bytes of the image filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskUsage {
    pub capacity: u64,
    pub available: u64,
}

/// When each image was first seen and last used by a container.
#[derive(Clone, Copy, Debug)]
struct Record {
    first_seen: Instant,
    last_used: Instant,
}

/// The bytes to free to get from `usage` below the low threshold, when
/// usage has reached the high one.
pub fn bytes_to_free(usage: DiskUsage, p: &Policy) -> u64 {
    let used = usage.capacity.saturating_sub(usage.available);
    let cap = u128::from(usage.capacity);
    if cap == 0 || u128::from(used) * 100 < cap * u128::from(p.high_percent) {
        return 0;
    }
    let target = (cap * u128::from(p.low_percent) / 100) as u64;
    used.saturating_sub(target)
}

/// The image collector; keeps its first-seen/last-used records.
pub struct ImageGc {
    runtime: Arc<dyn Runtime>,
    policy: Policy,
    records: HashMap<String, Record>,
    /// The node's pods, once the pod manager exists (set at start).
    pods: Arc<std::sync::OnceLock<crate::pods::StatusView>>,
}

impl ImageGc {
    pub fn new(runtime: Arc<dyn Runtime>, policy: Policy) -> Self {
        ImageGc {
            runtime,
            policy,
            records: HashMap::new(),
            pods: Arc::default(),
        }
    }

    /// Where the node's pods will be found: their images are pinned.
    pub fn pods_slot(&self) -> Arc<std::sync::OnceLock<crate::pods::StatusView>> {
        self.pods.clone()
    }

    /// The images the node's unfinished pods name, normalized (the name as
    /// written too, for IDs and exotic references).
    fn wanted(&self) -> HashSet<String> {
        let Some(view) = self.pods.get() else {
            return HashSet::new();
        };
        let mut out = HashSet::new();
        for (_, e) in view.pods() {
            let done = matches!(
                e.status.phase.as_deref(),
                Some("Succeeded") | Some("Failed")
            );
            let Some(spec) = e.pod.spec.as_ref().filter(|_| !done) else {
                continue;
            };
            let containers = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten());
            for image in containers.filter_map(|c| c.image.as_deref()) {
                if let Ok(n) = kinglet_runtime::image::parse(image) {
                    out.insert(n.canonical());
                }
                out.insert(image.to_string());
            }
        }
        out
    }

    /// Runs every [`PERIOD`], first at once, until shutdown; the eviction
    /// manager shares it to reclaim under disk pressure.
    pub async fn run(gc: Arc<tokio::sync::Mutex<ImageGc>>, shutdown: CancellationToken) {
        loop {
            let mut this = gc.lock().await;
            match this.usage().await {
                Ok(Some(u)) => {
                    if let Err(e) = this.collect(u).await {
                        warn!(error = %e, "image garbage collection failed");
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "image garbage collection cannot read the image filesystem")
                }
            }
            drop(this);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(PERIOD) => {}
            }
        }
    }

    /// The image filesystem's capacity and free bytes, from the runtime's
    /// `ImageFsInfo` mountpoint (statvfs, off the async thread).
    async fn usage(&self) -> Result<Option<DiskUsage>, RuntimeError> {
        let Some(fs) = self.runtime.image_fs_info().await?.into_iter().next() else {
            return Ok(None);
        };
        let stat = tokio::task::spawn_blocking(move || rustix::fs::statvfs(fs.mountpoint.as_str()))
            .await
            .map_err(|e| RuntimeError::Other(e.to_string()))?
            .map_err(|e| RuntimeError::Other(format!("statvfs: {e}")))?;
        Ok(Some(DiskUsage {
            capacity: stat.f_blocks * stat.f_frsize,
            available: stat.f_bavail * stat.f_frsize,
        }))
    }

    /// One round: updates the records from the runtime, then removes
    /// unused images as the usage requires. Returns the removed IDs.
    pub async fn collect(&mut self, usage: DiskUsage) -> Result<Vec<String>, RuntimeError> {
        self.remove_unused(bytes_to_free(usage, &self.policy)).await
    }

    /// Every unused image past the minimum age (upstream's
    /// `DeleteUnusedImages`, the eviction manager's node-level reclaim).
    pub async fn reclaim(&mut self) -> Result<Vec<String>, RuntimeError> {
        self.remove_unused(u64::MAX).await
    }

    /// Updates the records, then removes unused images, least recently
    /// used first, until `to_free` bytes are gone.
    async fn remove_unused(&mut self, mut to_free: u64) -> Result<Vec<String>, RuntimeError> {
        let now = Instant::now();
        let images = self.runtime.list_images().await?;
        let in_use = self.in_use(&images).await?;
        self.records
            .retain(|id, _| images.iter().any(|i| &i.id == id));
        for i in &images {
            let r = self.records.entry(i.id.clone()).or_insert(Record {
                first_seen: now,
                last_used: now,
            });
            if in_use.contains(&i.id) {
                r.last_used = now;
            }
        }
        if to_free == 0 {
            return Ok(Vec::new());
        }
        let wanted = self.wanted();
        let named = |i: &ImageInfo| {
            wanted.contains(&i.id)
                || i.repo_tags
                    .iter()
                    .chain(&i.repo_digests)
                    .any(|n| wanted.contains(n))
        };
        let mut candidates: Vec<(&ImageInfo, Record)> = images
            .iter()
            .filter(|i| !in_use.contains(&i.id) && !i.pinned && !named(i))
            .filter_map(|i| Some((i, *self.records.get(&i.id)?)))
            .filter(|(_, r)| now.saturating_duration_since(r.first_seen) >= self.policy.min_age)
            .collect();
        candidates.sort_by_key(|(_, r)| r.last_used);
        let mut removed = Vec::new();
        for (img, _) in candidates {
            if to_free == 0 {
                break;
            }
            match self.runtime.remove_image(&img.id).await {
                Ok(()) => {
                    to_free = to_free.saturating_sub(img.size);
                    removed.push(img.id.clone());
                }
                Err(e) => {
                    warn!(image = %img.id, error = %e, "image garbage collection could not remove an image")
                }
            }
        }
        for id in &removed {
            self.records.remove(id);
        }
        if !removed.is_empty() {
            info!(images = ?removed, "image garbage collection removed images");
        }
        Ok(removed)
    }

    /// IDs of the images some container (running or not) was made from.
    async fn in_use(&self, images: &[ImageInfo]) -> Result<HashSet<String>, RuntimeError> {
        let containers = self.runtime.list_containers().await?;
        let mut used = HashSet::new();
        for c in &containers {
            for i in images {
                let names = [&c.image_id, &c.image_ref, &c.image];
                let hit = names.iter().any(|n| {
                    !n.is_empty()
                        && (**n == i.id || i.repo_tags.contains(n) || i.repo_digests.contains(n))
                });
                if hit {
                    used.insert(i.id.clone());
                }
            }
        }
        Ok(used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinglet_runtime::fake::FakeRuntime;
    use kinglet_runtime::{ContainerConfig, SandboxConfig};

    const FULL: DiskUsage = DiskUsage {
        capacity: 1000,
        available: 0,
    };

    fn policy(min_age: Duration) -> Policy {
        Policy {
            high_percent: 85,
            low_percent: 80,
            min_age,
        }
    }

    #[test]
    fn frees_down_to_the_low_threshold_once_past_the_high() {
        let p = policy(Duration::ZERO);
        let u = |avail| DiskUsage {
            capacity: 1000,
            available: avail,
        };
        assert_eq!(bytes_to_free(u(200), &p), 0);
        assert_eq!(bytes_to_free(u(150), &p), 50);
        assert_eq!(bytes_to_free(u(0), &p), 200);
        assert_eq!(
            bytes_to_free(
                DiskUsage {
                    capacity: 0,
                    available: 0
                },
                &p
            ),
            0
        );
    }

    /// The tags of the images left.
    async fn tags(rt: &FakeRuntime) -> Vec<String> {
        let images = rt.list_images().await.unwrap();
        images.into_iter().flat_map(|i| i.repo_tags).collect()
    }

    /// The regression: GC once removed images in use, because it was
    /// handed an empty in-use set.
    #[tokio::test(start_paused = true)]
    async fn spares_images_containers_use_even_when_exited() {
        let rt = Arc::new(FakeRuntime::new());
        for i in ["running:1", "exited:1", "unused:1"] {
            rt.add_image(i);
        }
        let sb = SandboxConfig {
            pod_uid: "u".into(),
            ..Default::default()
        };
        let s = rt.run_pod_sandbox(&sb).await.unwrap();
        for (name, image) in [("a", "running:1"), ("b", "exited:1")] {
            let cfg = ContainerConfig {
                name: name.into(),
                image: image.into(),
                ..Default::default()
            };
            let id = rt.create_container(&s.id, &cfg, &sb).await.unwrap();
            rt.start_container(&id).await.unwrap();
        }
        rt.finish("b", 0);
        let mut gc = ImageGc::new(rt.clone(), policy(Duration::ZERO));
        let removed = gc.collect(FULL).await.unwrap();
        assert_eq!(removed.len(), 1);
        let left = tags(&rt).await;
        assert_eq!(left, ["exited:1", "running:1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn never_removes_pinned_images_even_to_reclaim_everything() {
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image("pause:3");
        rt.pin_image("pause:3");
        rt.add_image("old:1");
        let mut gc = ImageGc::new(rt.clone(), policy(Duration::ZERO));
        let removed = gc.reclaim().await.unwrap();
        assert_eq!(removed.len(), 1);
        let left = rt.list_images().await.unwrap();
        assert_eq!(left.len(), 1);
        assert!(left[0].pinned);
    }

    /// A pod the node holds keeps its image though no container uses it
    /// (restored offline, or its dead container collected); a finished
    /// pod's image is fair game. Names match normalized.
    #[tokio::test(start_paused = true)]
    async fn spares_the_images_of_the_nodes_unfinished_pods() {
        let rt = Arc::new(FakeRuntime::new());
        for i in [
            "docker.io/library/busybox:1",
            "docker.io/library/done:1",
            "old:1",
        ] {
            rt.add_image(i);
        }
        let dir = tempfile::tempdir().unwrap();
        let mut status = crate::pods::StatusManager::new(dir.path().to_path_buf(), None);
        let pod = |uid: &str, image: &str| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": uid, "namespace": "default", "uid": uid},
                "spec": {"containers": [{"name": "c", "image": image}]}
            }))
            .unwrap()
        };
        let phase = |p: &str| k8s_openapi::api::core::v1::PodStatus {
            phase: Some(p.into()),
            ..Default::default()
        };
        status.set("u1", &pod("u1", "busybox:1"), phase("Pending"));
        status.set("u2", &pod("u2", "done:1"), phase("Succeeded"));
        let mut gc = ImageGc::new(rt.clone(), policy(Duration::ZERO));
        gc.pods_slot().set(status.view()).unwrap();
        let removed = gc.reclaim().await.unwrap();
        assert_eq!(removed.len(), 2, "{removed:?}");
        let left = tags(&rt).await;
        assert_eq!(left, ["docker.io/library/busybox:1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn spares_images_younger_than_the_minimum_age() {
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image("new:1");
        let mut gc = ImageGc::new(rt.clone(), policy(Duration::from_secs(120)));
        assert!(gc.collect(FULL).await.unwrap().is_empty());
        tokio::time::advance(Duration::from_secs(121)).await;
        assert_eq!(gc.collect(FULL).await.unwrap().len(), 1);
    }
}
