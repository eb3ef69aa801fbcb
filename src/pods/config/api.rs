//! The API pod source: a watch of the pods bound to this node
//! (`spec.nodeName`), sent as whole snapshots, and checkpointed in the
//! local store (sealed, one member a pod in the set `api-pods`) so the
//! pods come back after a reboot while the control plane is unreachable.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::fsutil::{Flush, write_private_atomic};
use crate::pods::config::SourceUpdate;
use crate::pods::status::api_writer::is_mirror;

/// Sends a snapshot of this node's API pods after the first list and after
/// every change. Mirror pods are the node's own reflection: not pods to
/// run, they go beside the snapshot (their status is reconciled).
///
/// Each snapshot is also written to the checkpoint; at start, before the
/// API server has answered, the last checkpoint is the snapshot, so the
/// pods this node ran come back after a reboot while the control plane is
/// unreachable (a deliberate difference from upstream, which waits).
pub async fn watch(
    client: Client,
    node_name: String,
    mut checkpoint: Checkpoint,
    tx: mpsc::Sender<SourceUpdate>,
    shutdown: CancellationToken,
) {
    if let Some(pods) = checkpoint.read().await {
        info!(
            pods = pods.len(),
            "starting the API pods of the last checkpoint until the API server answers"
        );
        let _ = tx.send(SourceUpdate::pods("api", pods)).await;
    }
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    let mut set = PodSet::default();
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        let changed = match ev {
            None => return,
            Some(Err(e)) => {
                debug!(error = %e, "pod watch interrupted");
                false
            }
            Some(Ok(ev)) => set.apply(ev),
        };
        if !changed {
            continue;
        }
        let (mirrors, snapshot): (Vec<Pod>, Vec<Pod>) =
            set.pods.values().cloned().partition(is_mirror);
        checkpoint.write(&snapshot).await;
        let update = SourceUpdate {
            source: "api",
            pods: snapshot,
            mirrors,
        };
        if tx.send(update).await.is_err() {
            return;
        }
    }
}

/// The pods the watch has seen, by UID; a relist replaces them whole.
#[derive(Default)]
struct PodSet {
    pods: BTreeMap<String, Pod>,
    listing: BTreeMap<String, Pod>,
    ready: bool,
}

impl PodSet {
    /// Applies one watch event; true when a new snapshot is due (never
    /// before the first list completed).
    fn apply(&mut self, ev: watcher::Event<Pod>) -> bool {
        match ev {
            watcher::Event::Init => {
                self.listing.clear();
                false
            }
            watcher::Event::InitApply(p) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    self.listing.insert(uid, p);
                }
                false
            }
            watcher::Event::InitDone => {
                self.pods = std::mem::take(&mut self.listing);
                self.ready = true;
                true
            }
            watcher::Event::Apply(p) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    self.pods.insert(uid, p);
                }
                self.ready
            }
            watcher::Event::Delete(p) => {
                if let Some(uid) = &p.metadata.uid {
                    self.pods.remove(uid);
                }
                self.ready
            }
        }
    }
}

/// Where the last snapshot is kept: the local store's set `api-pods`, one
/// sealed member a pod, each pod in the form [`kept_form`] gives it, so
/// that a pod's start or end rewrites its own member and nothing else
/// (a whole snapshot rewritten at every watch event cost the flash a
/// write of every pod's object for each status change of any pod).
/// Earlier versions' forms are read once and replaced: the whole snapshot
/// in the store (`api/pods`) and the plain file before it. Without a store
/// (it could not be opened) the plain file stays in use.
pub struct Checkpoint {
    store: Option<std::sync::Arc<crate::store::LocalStore>>,
    legacy: std::path::PathBuf,
    /// What each kept member holds (a hash of its bytes).
    kept: HashMap<String, u64>,
    /// An earlier version's form was read: it goes after the first write.
    migrate: bool,
    /// Without a store: a hash of the plain file's last snapshot.
    legacy_kept: Option<u64>,
}

const STORED: &str = "api/pods";
const SET: &str = "api-pods";

/// What of a pod is kept to run it again without the API server: the
/// object without its managed fields and resource version, and of its
/// status only what kinglet does not write itself: the conditions of its
/// readiness gates (others set them; readiness reads them), and the phase
/// once it has ended (it changes no more; kinglet's own record of a
/// finished pod is what keeps it from running again). The rest of the
/// status changes with every start and probe, and kinglet makes it anew.
pub fn kept_form(pod: &Pod) -> Pod {
    let mut p = pod.clone();
    p.metadata.managed_fields = None;
    p.metadata.resource_version = None;
    let gates: Vec<&str> = (pod.spec.iter())
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| g.condition_type.as_str())
        .collect();
    p.status = pod.status.as_ref().and_then(|s| {
        let conditions: Vec<PodCondition> = (s.conditions.iter().flatten())
            .filter(|c| gates.contains(&c.type_.as_str()))
            .cloned()
            .collect();
        let phase = s
            .phase
            .clone()
            .filter(|ph| ph == "Succeeded" || ph == "Failed");
        (phase.is_some() || !conditions.is_empty()).then(|| PodStatus {
            phase,
            conditions: (!conditions.is_empty()).then_some(conditions),
            ..Default::default()
        })
    });
    p
}

fn hash(data: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(data);
    h.finish()
}

impl Checkpoint {
    pub fn new(
        store: Option<std::sync::Arc<crate::store::LocalStore>>,
        legacy: std::path::PathBuf,
    ) -> Checkpoint {
        Checkpoint {
            store,
            legacy,
            kept: HashMap::new(),
            migrate: false,
            legacy_kept: None,
        }
    }

    /// The last snapshot: an earlier version's form if one is still there
    /// (it is removed only once every member is written, so its presence
    /// means a migration did not finish: it is whole, the members may not
    /// be), else the store's members. Every member on disk is remembered,
    /// so that the first write rewrites or removes what no longer matches.
    async fn read(&mut self) -> Option<Vec<Pod>> {
        let (store, legacy) = (self.store.clone(), self.legacy.clone());
        let (keys, members, older) = tokio::task::spawn_blocking(move || {
            let keys = store
                .as_ref()
                .map(|st| st.member_keys(SET))
                .unwrap_or_default();
            let members = store.as_ref().map(|st| st.members(SET)).unwrap_or_default();
            let older = match store.as_ref().map(|st| st.get_node(STORED)) {
                Some(Ok(Some(v))) => Some(v),
                Some(Err(e)) => {
                    warn!(error = %e, "cannot read the pod checkpoint");
                    None
                }
                _ => None,
            };
            (keys, members, older.or_else(|| std::fs::read(&legacy).ok()))
        })
        .await
        .ok()?;
        // A member that does not open or parse reads as changed.
        self.kept.extend(keys.into_iter().map(|k| (k, 0)));
        let mut pods = Vec::new();
        for (uid, raw) in members {
            if let Ok(p) = serde_json::from_slice::<Pod>(&raw) {
                self.kept.insert(uid, hash(&raw));
                pods.push(p);
            }
        }
        if let Some(raw) = older {
            self.migrate = self.store.is_some();
            return serde_json::from_slice(&raw).ok();
        }
        (!pods.is_empty()).then_some(pods)
    }

    /// Keeps the snapshot for a start without the API server (flushed to
    /// disk, on the blocking pool): the members that changed are written,
    /// those of pods gone removed, nothing when nothing changed. What
    /// failed is tried again at the next write.
    async fn write(&mut self, pods: &[Pod]) {
        let entries: Vec<(String, Vec<u8>)> = pods
            .iter()
            .filter_map(|p| {
                let uid = p.metadata.uid.clone()?;
                Some((uid, serde_json::to_vec(&kept_form(p)).ok()?))
            })
            .collect();
        let Some(store) = self.store.clone() else {
            return self.write_legacy(entries).await;
        };
        let changed: Vec<(String, Vec<u8>)> = (entries.iter())
            .filter(|(uid, raw)| self.kept.get(uid) != Some(&hash(raw)))
            .cloned()
            .collect();
        let gone: Vec<String> = (self.kept.keys())
            .filter(|k| !entries.iter().any(|(uid, _)| uid == *k))
            .cloned()
            .collect();
        if changed.is_empty() && gone.is_empty() && !self.migrate {
            return;
        }
        let (migrate, legacy) = (self.migrate, self.legacy.clone());
        let done = tokio::task::spawn_blocking(move || {
            let mut done: Vec<(String, Option<u64>)> = Vec::new();
            let mut failed = false;
            for (uid, raw) in changed {
                match store.put_member(SET, &uid, &raw) {
                    Ok(()) => done.push((uid, Some(hash(&raw)))),
                    Err(e) => {
                        warn!(error = %e, "cannot write the pod checkpoint");
                        failed = true;
                    }
                }
            }
            for uid in gone {
                match store.remove_member(SET, &uid) {
                    Ok(()) => done.push((uid, None)),
                    Err(e) => {
                        warn!(error = %e, "cannot remove a pod from the checkpoint");
                        failed = true;
                    }
                }
            }
            // The older form goes once the members hold everything.
            if migrate && !failed {
                store.remove_node(STORED);
                let _ = std::fs::remove_file(&legacy);
            }
            (done, failed)
        })
        .await;
        let Ok((done, failed)) = done else {
            return warn!("cannot write the pod checkpoint: its task failed");
        };
        for (uid, h) in done {
            match h {
                Some(h) => self.kept.insert(uid, h),
                None => self.kept.remove(&uid),
            };
        }
        self.migrate &= failed;
    }

    /// Without a store: the whole snapshot in the plain file, when it
    /// changed.
    async fn write_legacy(&mut self, entries: Vec<(String, Vec<u8>)>) {
        let mut data = b"[".to_vec();
        for (i, (_, raw)) in entries.iter().enumerate() {
            if i > 0 {
                data.push(b',');
            }
            data.extend_from_slice(raw);
        }
        data.push(b']');
        let h = hash(&data);
        if self.legacy_kept == Some(h) {
            return;
        }
        let legacy = self.legacy.clone();
        let written =
            tokio::task::spawn_blocking(move || write_private_atomic(&legacy, &data, Flush::Data))
                .await;
        match written {
            Ok(Ok(())) => {
                self.legacy_kept = Some(h);
            }
            Ok(Err(e)) => warn!(error = %e, "cannot write the pod checkpoint"),
            Err(_) => warn!("cannot write the pod checkpoint: its task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pods::test_pod as pod;

    fn store(d: &std::path::Path) -> std::sync::Arc<crate::store::LocalStore> {
        std::sync::Arc::new(crate::store::LocalStore::open(d).unwrap())
    }

    /// The inode of each kept member: a rewrite (temp file, rename) makes
    /// a new one.
    fn inodes(d: &std::path::Path) -> BTreeMap<String, u64> {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir(d.join("store").join(SET))
            .unwrap()
            .flatten()
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name, e.metadata().unwrap().ino())
            })
            .collect()
    }

    /// Upgrades: the plain checkpoint file of early versions, and the
    /// whole snapshot in the store after it, are read once and replaced
    /// by one member a pod at the first write.
    #[tokio::test]
    async fn earlier_checkpoints_move_into_the_set() {
        let d = tempfile::tempdir().unwrap();
        let legacy = d.path().join("api-checkpoint.json");
        std::fs::write(&legacy, serde_json::to_vec(&[pod("a")]).unwrap()).unwrap();
        let st = store(d.path());
        let mut cp = Checkpoint::new(Some(st.clone()), legacy.clone());
        assert_eq!(cp.read().await.unwrap().len(), 1);
        cp.write(&[pod("a"), pod("b")]).await;
        assert!(!legacy.exists());
        assert_eq!(inodes(d.path()).len(), 2);

        let d = tempfile::tempdir().unwrap();
        let st = store(d.path());
        st.put_node(STORED, &serde_json::to_vec(&[pod("c")]).unwrap())
            .unwrap();
        let mut cp = Checkpoint::new(Some(st.clone()), d.path().join("none"));
        assert_eq!(cp.read().await.unwrap().len(), 1);
        cp.write(&[pod("c")]).await;
        assert!(st.get_node(STORED).unwrap().is_none());
        let mut again = Checkpoint::new(Some(st), d.path().join("none"));
        let pods = again.read().await.unwrap();
        assert_eq!(pods[0].metadata.uid.as_deref(), Some("c"));
    }

    /// A power cut in the middle of a migration: the older form is still
    /// there and whole, so it is read, and the members that do not match
    /// it (one of a pod since gone, one that does not open) are set right
    /// by the first write, after which the older form goes.
    #[tokio::test]
    async fn an_unfinished_migration_and_damaged_members_are_set_right() {
        let d = tempfile::tempdir().unwrap();
        let st = store(d.path());
        st.put_node(STORED, &serde_json::to_vec(&[pod("a"), pod("b")]).unwrap())
            .unwrap();
        st.put_member(SET, "a", b"{}").unwrap();
        st.put_member(SET, "gone", b"{}").unwrap();
        let dir = d.path().join("store").join(SET);
        std::fs::write(dir.join("damaged"), b"not sealed").unwrap();
        let mut cp = Checkpoint::new(Some(st.clone()), d.path().join("none"));
        let read = cp.read().await.unwrap();
        assert_eq!(read.len(), 2, "the older, whole form");
        cp.write(&read).await;
        assert_eq!(inodes(d.path()).into_keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(st.get_node(STORED).unwrap().is_none());
        let mut again = Checkpoint::new(Some(st), d.path().join("none"));
        let uids: Vec<_> = (again.read().await.unwrap().into_iter())
            .map(|p| p.metadata.uid.unwrap())
            .collect();
        assert_eq!(uids.len(), 2);
    }

    /// A pod's status changing (kinglet's own writes coming back through
    /// the watch) writes nothing; a change of its object rewrites its
    /// member alone; a pod gone loses its member; after a restart the same
    /// snapshot writes nothing.
    #[tokio::test]
    async fn only_changed_pods_are_written() {
        let d = tempfile::tempdir().unwrap();
        let mut cp = Checkpoint::new(Some(store(d.path())), d.path().join("none"));
        assert!(cp.read().await.is_none());
        let (mut a, b) = (pod("a"), pod("b"));
        cp.write(&[a.clone(), b.clone()]).await;
        let first = inodes(d.path());
        a.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.0.0.2".into()),
            ..Default::default()
        });
        a.metadata.resource_version = Some("7".into());
        cp.write(&[a.clone(), b.clone()]).await;
        assert_eq!(inodes(d.path()), first, "a status change wrote");
        a.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        cp.write(&[a.clone(), b.clone()]).await;
        let second = inodes(d.path());
        assert_ne!(second["a"], first["a"]);
        assert_eq!(second["b"], first["b"]);
        cp.write(&[a.clone()]).await;
        assert_eq!(inodes(d.path()).len(), 1);

        let mut again = Checkpoint::new(Some(store(d.path())), d.path().join("none"));
        let read = again.read().await.unwrap();
        assert_eq!(read[0].metadata.labels, a.metadata.labels);
        let before = inodes(d.path());
        again.write(&[a]).await;
        assert_eq!(inodes(d.path()), before);
    }

    /// What is kept of a pod's status: its readiness gates' conditions and
    /// an ended phase; never the managed fields or resource version.
    #[test]
    fn the_kept_form_drops_what_kinglet_makes_anew() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "u", "resourceVersion": "9",
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"containers": [], "readinessGates": [{"conditionType": "example.com/lb"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.2", "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "example.com/lb", "status": "False"}]}
        }))
        .unwrap();
        let k = kept_form(&p);
        assert!(k.metadata.managed_fields.is_none() && k.metadata.resource_version.is_none());
        let st = k.status.unwrap();
        assert_eq!(st.phase, None);
        assert_eq!(st.pod_ip, None);
        let types: Vec<_> = st
            .conditions
            .unwrap()
            .into_iter()
            .map(|c| c.type_)
            .collect();
        assert_eq!(types, ["example.com/lb"]);
        p.spec.as_mut().unwrap().readiness_gates = None;
        assert!(kept_form(&p).status.is_none());
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(
            kept_form(&p).status.unwrap().phase.as_deref(),
            Some("Succeeded")
        );
    }

    /// Without a store the plain file holds the whole snapshot, written
    /// when it changed.
    #[tokio::test]
    async fn without_a_store_the_plain_file_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let legacy = d.path().join("api-checkpoint.json");
        let mut cp = Checkpoint::new(None, legacy.clone());
        cp.write(&[pod("a")]).await;
        let t = std::fs::metadata(&legacy).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        cp.write(&[pod("a")]).await;
        assert_eq!(std::fs::metadata(&legacy).unwrap().modified().unwrap(), t);
        let mut again = Checkpoint::new(None, legacy);
        assert_eq!(again.read().await.unwrap().len(), 1);
    }

    #[test]
    fn snapshots_start_after_the_first_list_and_a_relist_replaces_them() {
        let mut set = PodSet::default();
        assert!(!set.apply(watcher::Event::Apply(pod("early"))));
        assert!(!set.apply(watcher::Event::Init));
        assert!(!set.apply(watcher::Event::InitApply(pod("a"))));
        assert!(!set.apply(watcher::Event::InitApply(pod("b"))));
        assert!(set.apply(watcher::Event::InitDone));
        assert_eq!(set.pods.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(set.apply(watcher::Event::Delete(pod("a"))));
        // A relist (after a watch expired) drops what it no longer lists.
        set.apply(watcher::Event::Init);
        set.apply(watcher::Event::InitApply(pod("c")));
        assert_eq!(
            set.pods.len(),
            1,
            "the old set stays until the list is done"
        );
        assert!(set.apply(watcher::Event::InitDone));
        assert_eq!(set.pods.keys().collect::<Vec<_>>(), ["c"]);
    }
}
