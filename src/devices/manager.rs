//! The device manager (upstream's `cm/devicemanager`): which device
//! resources the node has and which devices are healthy (fed by device
//! plugins and the built-in source), which pod's container holds which
//! devices (chosen at admission, checkpointed so a restart or a power cut
//! keeps them), and what each container needs to use them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tracing::{info, warn};

use super::allocate::{self, DeviceSets, Grant, PodGrants, RunOptions, Unavailable};
use super::checkpoint::{self, Checkpoint};

/// How long a plugin that went away keeps its resource on the node (its
/// devices unhealthy) before the resource is removed: upstream's
/// `endpointStopGracePeriod`.
pub const STOP_GRACE: Duration = Duration::from_secs(5 * 60);

/// Where a resource's devices come from and what it answers for them: a
/// device plugin's endpoint or the built-in source.
pub trait Source: Send + Sync {
    /// What a container needs to use `ids` (the plugin's `Allocate`).
    fn allocate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<RunOptions, String>>;
    /// The source's choice of `size` among `available`, with `must`
    /// included (`GetPreferredAllocation`); empty: no preference (the
    /// default).
    fn preferred<'a>(
        &'a self,
        _available: &'a [String],
        _must: &'a [String],
        _size: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Called before a container with `ids` starts (`PreStartContainer`),
    /// if the source asks for it; nothing by default.
    fn pre_start<'a>(&'a self, _ids: &'a [String]) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// Why devices could not be given to a pod; admission refuses it.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    #[error("allocating {resource}: {message}")]
    Source { resource: String, message: String },
    #[error("writing the device checkpoint {path}: {source}")]
    Checkpoint {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl AllocateError {
    /// Upstream's `UnexpectedAdmissionError` message.
    pub fn admission_message(&self) -> String {
        format!("Allocate failed due to {self}, which is unexpected")
    }
}

/// One device resource.
struct Resource {
    /// Device ID → healthy.
    devices: BTreeMap<String, bool>,
    /// `None` while nobody serves it: restored from the checkpoint, or its
    /// plugin went away at `stopped`.
    source: Option<Arc<dyn Source>>,
    stopped: Option<Instant>,
    /// Which registration serves it: a plugin's stream that ends after the
    /// plugin registered again does not stop the newer one.
    generation: u64,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    /// Resources removed while running: reported with 0 (a merge patch
    /// would keep the old figure).
    gone: BTreeSet<String>,
    /// The last registration's number.
    generation: u64,
    /// Pod UID → its containers' grants.
    pods: BTreeMap<String, PodGrants>,
}

impl State {
    fn healthy(&self) -> DeviceSets {
        let healthy = |r: &Resource| {
            r.devices
                .iter()
                .filter(|d| *d.1)
                .map(|d| d.0.clone())
                .collect()
        };
        self.resources
            .iter()
            .map(|(name, r)| (name.clone(), healthy(r)))
            .collect()
    }

    /// Devices held by pods other than `except`.
    fn in_use(&self, except: &str) -> DeviceSets {
        let mut used = DeviceSets::new();
        let grants = self.pods.iter().filter(|(uid, _)| *uid != except);
        for (resource, g) in grants.flat_map(|(_, p)| p.values().flatten()) {
            used.entry(resource.clone())
                .or_default()
                .extend(g.ids.iter().cloned());
        }
        used
    }

    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            pods: self.pods.clone(),
            registered: self
                .resources
                .iter()
                .map(|(name, r)| (name.clone(), r.devices.keys().cloned().collect()))
                .collect(),
        }
    }
}

/// The node's device resources and their allocation to pods.
pub struct DeviceManager {
    state: Mutex<State>,
    checkpoint: PathBuf,
    /// Bumped when capacity or health changes: the node status follows.
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

impl DeviceManager {
    /// A manager restored from `checkpoint` (if it is there and whole):
    /// pods keep their devices, and the resources known before stay on the
    /// node while their sources come back.
    pub async fn load(checkpoint: PathBuf) -> Self {
        let path = checkpoint.clone();
        let read = tokio::task::spawn_blocking(move || checkpoint::read(&path)).await;
        let mut state = State::default();
        match read {
            Ok(Ok(Some(cp))) => {
                state.pods = cp.pods;
                // As upstream: a resource known before has no devices
                // (0 of 0) until its source is back, and goes after the
                // grace if it never is; the pods' devices stay theirs.
                for name in cp.registered.into_keys() {
                    let r = Resource {
                        devices: BTreeMap::new(),
                        source: None,
                        stopped: Some(Instant::now()),
                        generation: 0,
                    };
                    state.resources.insert(name, r);
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => warn!(
                path = %checkpoint.display(),
                "device checkpoint ignored (device allocations may not be up to date): {e}"
            ),
            Err(e) => warn!("reading the device checkpoint: {e}"),
        }
        DeviceManager {
            state: Mutex::new(state),
            checkpoint,
            changed: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes of capacity or health.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// `resource` is served by `source` from now on (a plugin registered,
    /// or registered again); the registration's generation, for
    /// [`DeviceManager::stopped`].
    pub fn serve(&self, resource: &str, source: Arc<dyn Source>) -> u64 {
        let mut st = self.lock();
        st.gone.remove(resource);
        st.generation += 1;
        let generation = st.generation;
        let r = st
            .resources
            .entry(resource.to_string())
            .or_insert(Resource {
                devices: BTreeMap::new(),
                source: None,
                stopped: None,
                generation,
            });
        r.source = Some(source);
        r.stopped = None;
        r.generation = generation;
        drop(st);
        info!(resource, "device resource served");
        self.bump();
        generation
    }

    /// The devices of `resource` now, with their health (a plugin's
    /// `ListAndWatch` answer, the built-in source's scan), from the source
    /// of `generation`: an older registration's word no longer counts.
    pub fn update(&self, resource: &str, generation: u64, devices: BTreeMap<String, bool>) {
        let mut st = self.lock();
        let Some(r) = st.resources.get_mut(resource) else {
            return;
        };
        if r.generation != generation || r.devices == devices {
            return;
        }
        r.devices = devices;
        drop(st);
        self.bump();
    }

    /// `resource`'s source of `generation` went away: its devices are
    /// unhealthy, and the resource goes after [`STOP_GRACE`] unless it
    /// comes back.
    pub fn stopped(&self, resource: &str, generation: u64) {
        let mut st = self.lock();
        let Some(r) = st.resources.get_mut(resource) else {
            return;
        };
        if r.generation != generation {
            return;
        }
        r.source = None;
        r.stopped = Some(Instant::now());
        r.devices.values_mut().for_each(|h| *h = false);
        drop(st);
        warn!(resource, "device resource stopped");
        self.bump();
    }

    /// Capacity and allocatable per resource: every device, the healthy
    /// ones. A resource stopped longer than the grace is removed here and
    /// reported at 0 from then on.
    pub fn capacity(&self) -> BTreeMap<String, (i64, i64)> {
        let mut st = self.lock();
        let expired: Vec<String> = st
            .resources
            .iter()
            .filter(|(_, r)| {
                r.source.is_none() && r.stopped.is_some_and(|t| t.elapsed() >= STOP_GRACE)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            st.resources.remove(&name);
            st.gone.insert(name);
        }
        let mut out: BTreeMap<String, (i64, i64)> =
            st.gone.iter().map(|n| (n.clone(), (0, 0))).collect();
        for (name, r) in &st.resources {
            let healthy = r.devices.values().filter(|h| **h).count();
            out.insert(name.clone(), (r.devices.len() as i64, healthy as i64));
        }
        out
    }

    /// Whether `resource` is the device manager's (upstream's
    /// `isDevicePluginResource`).
    pub fn knows(&self, resource: &str) -> bool {
        self.lock().resources.contains_key(resource)
    }

    /// Gives `pod`'s containers their devices, or tells why it cannot. A
    /// pod that has its devices already (a restart) keeps them. Pods not in
    /// `active` give theirs back first (`None` until every pod source has
    /// been read: a pod not seen yet is not gone).
    pub async fn allocate(
        &self,
        pod: &Pod,
        active: Option<&BTreeSet<String>>,
    ) -> Result<(), AllocateError> {
        let uid = crate::pods::util::pod_uid(pod);
        let released = active.is_some_and(|a| self.retain(a));
        let (healthy, in_use, held) = {
            let st = self.lock();
            (st.healthy(), st.in_use(&uid), st.pods.contains_key(&uid))
        };
        if held {
            return if released { self.save().await } else { Ok(()) };
        }
        let grants = self.choose(pod, &healthy, &in_use).await?;
        if grants.is_empty() {
            return if released { self.save().await } else { Ok(()) };
        }
        self.lock().pods.insert(uid, grants);
        self.save().await
    }

    /// Each container's devices (with the sources' preferences) and the
    /// sources' answers for them.
    async fn choose(
        &self,
        pod: &Pod,
        healthy: &DeviceSets,
        in_use: &DeviceSets,
    ) -> Result<PodGrants, AllocateError> {
        let mut planner = allocate::Planner::new(pod, healthy, in_use);
        let mut grants = PodGrants::new();
        while let Some(ask) = planner.ask() {
            let ask = ask?;
            let source = self.source(&ask.resource)?;
            let preferred = if ask.needed() > 0 {
                let p = source.preferred(&ask.available, &ask.reused, ask.wanted);
                p.await.map_err(|message| AllocateError::Source {
                    resource: ask.resource.clone(),
                    message,
                })?
            } else {
                Vec::new()
            };
            let ids = allocate::choose(&ask, &preferred);
            let options = source
                .allocate(&ids)
                .await
                .map_err(|message| AllocateError::Source {
                    resource: ask.resource.clone(),
                    message,
                })?;
            planner.give(&ask, &ids);
            let grant = Grant { ids, options };
            grants
                .entry(ask.container)
                .or_default()
                .insert(ask.resource, grant);
        }
        Ok(grants)
    }

    fn source(&self, resource: &str) -> Result<Arc<dyn Source>, AllocateError> {
        let st = self.lock();
        let source = st.resources.get(resource).and_then(|r| r.source.clone());
        source.ok_or_else(|| AllocateError::Source {
            resource: resource.to_string(),
            message: "no device plugin serves it".into(),
        })
    }

    /// Forgets the grants of pods not in `active`; whether any went.
    pub fn retain(&self, active: &BTreeSet<String>) -> bool {
        let mut st = self.lock();
        let before = st.pods.len();
        st.pods.retain(|uid, _| active.contains(uid));
        before != st.pods.len()
    }

    /// Writes the checkpoint (fsynced, renamed into place).
    pub async fn save(&self) -> Result<(), AllocateError> {
        let cp = self.lock().checkpoint();
        let path = self.checkpoint.clone();
        let written = tokio::task::spawn_blocking(move || checkpoint::write(&path, &cp)).await;
        let written = written.unwrap_or_else(|e| Err(std::io::Error::other(e)));
        written.map_err(|source| AllocateError::Checkpoint {
            path: self.checkpoint.clone(),
            source,
        })
    }

    /// What container `name` of pod `uid` needs for its devices; empty if
    /// it has none.
    pub fn run_options(&self, uid: &str, name: &str) -> RunOptions {
        let st = self.lock();
        let mut out = RunOptions::default();
        for g in st
            .pods
            .get(uid)
            .and_then(|p| p.get(name))
            .into_iter()
            .flat_map(|c| c.values())
        {
            out.merge(&g.options);
        }
        out
    }

    /// Asks the sources of container `name`'s devices to prepare them
    /// before it starts (upstream does it before each start); `Err` is the
    /// message of the container's `CreateContainerConfigError`.
    pub async fn pre_start(&self, uid: &str, name: &str) -> Result<(), String> {
        let grants: Vec<(String, Vec<String>)> = {
            let st = self.lock();
            let c = st.pods.get(uid).and_then(|p| p.get(name));
            c.into_iter()
                .flatten()
                .map(|(r, g)| (r.clone(), g.ids.clone()))
                .collect()
        };
        for (resource, ids) in grants {
            let Ok(source) = self.source(&resource) else {
                return Err(format!(
                    "endpoint not found in cache for a registered resource: {resource}"
                ));
            };
            source.pre_start(&ids).await?;
        }
        Ok(())
    }

    /// Every pod's grants (the pod resources API).
    pub fn grants(&self) -> BTreeMap<String, PodGrants> {
        self.lock().pods.clone()
    }

    /// Each resource's healthy devices (the pod resources API's
    /// allocatable).
    pub fn healthy(&self) -> DeviceSets {
        self.lock().healthy()
    }
}

#[cfg(test)]
mod tests;
