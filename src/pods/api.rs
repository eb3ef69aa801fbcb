//! The API pod source: a watch of the pods bound to this node
//! (`spec.nodeName`), sent as whole snapshots, and checkpointed so the
//! pods come back after a reboot while the control plane is unreachable.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::api_writer::is_mirror;
use super::sources::SourceUpdate;

/// Sends a snapshot of this node's API pods after the first list and after
/// every change. Mirror pods are the node's own reflection and are skipped.
///
/// Each snapshot is also written to `checkpoint`; at start, before the API
/// server has answered, the last checkpoint is the snapshot, so the pods
/// this node ran come back after a reboot while the control plane is
/// unreachable (a deliberate difference from upstream, which waits).
pub async fn watch(
    client: Client,
    node_name: String,
    checkpoint: std::path::PathBuf,
    tx: mpsc::Sender<SourceUpdate>,
    shutdown: CancellationToken,
) {
    if let Some(pods) = std::fs::read(&checkpoint)
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<Pod>>(&b).ok())
    {
        info!(
            pods = pods.len(),
            "starting the API pods of the last checkpoint until the API server answers"
        );
        let _ = tx
            .send(SourceUpdate {
                source: "api",
                pods,
            })
            .await;
    }
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    let mut listing: BTreeMap<String, Pod> = BTreeMap::new();
    let mut ready = false;
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
            Some(Ok(watcher::Event::Init)) => {
                listing.clear();
                false
            }
            Some(Ok(watcher::Event::InitApply(p))) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    listing.insert(uid, p);
                }
                false
            }
            Some(Ok(watcher::Event::InitDone)) => {
                pods = std::mem::take(&mut listing);
                ready = true;
                true
            }
            Some(Ok(watcher::Event::Apply(p))) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    pods.insert(uid, p);
                }
                true
            }
            Some(Ok(watcher::Event::Delete(p))) => {
                if let Some(uid) = &p.metadata.uid {
                    pods.remove(uid);
                }
                true
            }
        };
        if changed && ready {
            let snapshot: Vec<Pod> = pods.values().filter(|p| !is_mirror(p)).cloned().collect();
            if let Ok(data) = serde_json::to_vec(&snapshot) {
                let tmp = checkpoint.with_extension("tmp");
                if std::fs::write(&tmp, data).is_ok() {
                    let _ = std::fs::rename(&tmp, &checkpoint);
                }
            }
            if tx
                .send(SourceUpdate {
                    source: "api",
                    pods: snapshot,
                })
                .await
                .is_err()
            {
                return;
            }
        }
    }
}
