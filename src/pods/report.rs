//! What a pod worker tells the pod manager: statuses (for the status
//! manager), events, and the lifecycle transitions of its pod.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::mpsc;
use tracing::info;

use crate::pods::util::pod_name;

/// A message from a worker.
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
    /// Every container of the pod has stopped; it never runs again.
    Terminated { uid: String },
    /// Everything of the pod is gone from the node; the worker has ended.
    Removed { uid: String, pod: Box<Pod> },
}

/// A worker's sending side.
#[derive(Clone, Debug)]
pub struct Reporter {
    pub uid: String,
    pub tx: mpsc::Sender<Report>,
}

impl Reporter {
    pub async fn event(&self, pod: &Pod, type_: &'static str, reason: &str, message: String) {
        info!(pod = %pod_name(pod), reason, "{message}");
        let _ = self
            .tx
            .send(Report::Event {
                pod: Box::new(pod.clone()),
                type_,
                reason: reason.into(),
                message,
            })
            .await;
    }

    pub async fn status(&self, pod: &Pod, status: PodStatus) {
        let _ = self
            .tx
            .send(Report::Status {
                uid: self.uid.clone(),
                pod: Box::new(pod.clone()),
                status: Box::new(status),
            })
            .await;
    }

    pub async fn send(&self, r: Report) {
        let _ = self.tx.send(r).await;
    }
}
