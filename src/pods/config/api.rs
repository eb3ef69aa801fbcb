//! The API pod source: a watch of the pods bound to this node
//! (`spec.nodeName`), sent as whole snapshots, and checkpointed in the
//! local store (sealed, `api/pods`) so the pods come back after a reboot
//! while the control plane is unreachable.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::fsutil::write_private_atomic;
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
    checkpoint: Checkpoint,
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

/// Where the last snapshot is kept: the local store (`api/pods`), or the
/// plain file of earlier versions, read once, moved into the store and
/// removed. Without a store (it could not be opened) the plain file stays
/// in use.
pub struct Checkpoint {
    pub store: Option<std::sync::Arc<crate::store::LocalStore>>,
    pub legacy: std::path::PathBuf,
}

const STORED: &str = "api/pods";

impl Checkpoint {
    /// The last snapshot, migrating the plain file into the store.
    async fn read(&self) -> Option<Vec<Pod>> {
        let (store, legacy) = (self.store.clone(), self.legacy.clone());
        let raw = tokio::task::spawn_blocking(move || -> Option<Vec<u8>> {
            if let Some(st) = &store {
                match st.get_node(STORED) {
                    Ok(Some(v)) => return Some(v),
                    Ok(None) => {}
                    Err(e) => warn!(error = %e, "cannot read the pod checkpoint"),
                }
            }
            let old = std::fs::read(&legacy).ok()?;
            if let Some(st) = &store
                && st.put_node(STORED, &old).is_ok()
            {
                info!(file = %legacy.display(), "pod checkpoint moved into the local store");
                let _ = std::fs::remove_file(&legacy);
            }
            Some(old)
        })
        .await
        .ok()??;
        serde_json::from_slice(&raw).ok()
    }

    /// Keeps the snapshot for a start without the API server (flushed to
    /// disk, on the blocking pool).
    async fn write(&self, pods: &[Pod]) {
        let Ok(data) = serde_json::to_vec(pods) else {
            return;
        };
        let (store, legacy) = (self.store.clone(), self.legacy.clone());
        let written = tokio::task::spawn_blocking(move || match &store {
            Some(st) => st.put_node(STORED, &data).map_err(|e| e.to_string()),
            None => write_private_atomic(&legacy, &data, true).map_err(|e| e.to_string()),
        })
        .await;
        if let Ok(Err(e)) = written {
            warn!(error = %e, "cannot write the pod checkpoint");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pods::test_pod as pod;

    /// An upgrade from the plain checkpoint file: read once, moved into
    /// the store (sealed), the file removed; later snapshots go there.
    #[tokio::test]
    async fn the_plain_checkpoint_moves_into_the_store() {
        let d = tempfile::tempdir().unwrap();
        let legacy = d.path().join("api-checkpoint.json");
        let pods = vec![pod("a")];
        std::fs::write(&legacy, serde_json::to_vec(&pods).unwrap()).unwrap();
        let store = std::sync::Arc::new(crate::store::LocalStore::open(d.path()).unwrap());
        let cp = Checkpoint {
            store: Some(store.clone()),
            legacy: legacy.clone(),
        };
        let read = cp.read().await.unwrap();
        assert_eq!(read.len(), 1);
        assert!(!legacy.exists(), "the plain file stays");
        assert!(store.get_node(STORED).unwrap().is_some());
        cp.write(&[pod("a"), pod("b")]).await;
        assert_eq!(cp.read().await.unwrap().len(), 2);
        assert!(!legacy.exists());
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
