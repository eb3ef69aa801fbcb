//! The runtime interface: what kinglet's node and pod logic may ask of a
//! container runtime, shaped after CRI's `runtime.v1` services so that the
//! in-process runtime (`runtimes/oci`) and the containerd client
//! (`runtimes/cri`) are interchangeable.
//!
//! The surface grows with the work that needs it: today it carries the calls
//! the node agent makes (`Version`, `Status`); sandboxes, containers, images,
//! logs, exec and stats join as the pod lifecycle lands. Every method returns
//! a boxed future so the agent can hold one `Arc<dyn Runtime>` chosen at start.

use std::future::Future;
use std::pin::Pin;

pub mod fake;

/// A future returned by a runtime call.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Errors any runtime may return; implementations add context in the message.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime cannot be reached at all (socket gone, daemon restarting).
    #[error("container runtime is unavailable: {0}")]
    Unavailable(String),
    /// Anything else the runtime reported.
    #[error("container runtime error: {0}")]
    Other(String),
}

/// What CRI's `Version` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// e.g. `containerd` or `kinglet-oci`.
    pub runtime_name: String,
    /// e.g. `1.6.20`.
    pub runtime_version: String,
    /// The CRI API version spoken, `v1`.
    pub runtime_api_version: String,
}

impl RuntimeVersion {
    /// The `nodeInfo.containerRuntimeVersion` string, `<name>://<version>`.
    pub fn node_info(&self) -> String {
        format!("{}://{}", self.runtime_name, self.runtime_version)
    }
}

/// One CRI runtime condition (`RuntimeReady`, `NetworkReady`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeCondition {
    pub kind: ConditionKind,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The two conditions CRI defines and the kubelet requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionKind {
    RuntimeReady,
    NetworkReady,
}

/// What CRI's `Status` answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStatus {
    pub conditions: Vec<RuntimeCondition>,
}

impl RuntimeStatus {
    /// The condition of that kind; a missing condition counts as not ready,
    /// as the upstream kubelet treats it.
    pub fn condition(&self, kind: ConditionKind) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// Whether the condition of that kind is present and true.
    pub fn is_ready(&self, kind: ConditionKind) -> bool {
        self.condition(kind).is_some_and(|c| c.status)
    }
}

/// A container runtime as the node agent and pod workers see it.
pub trait Runtime: Send + Sync {
    /// CRI `Version`.
    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>>;
    /// CRI `Status`.
    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>>;
}
