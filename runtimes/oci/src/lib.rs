//! The in-process runtime: containers run through youki's `libcontainer`
//! inside kinglet's own process tree, with no container daemon.
//!
//! This crate owns the runtime's state directory and its health. Today it
//! answers `Version` and `Status` from real checks of the host (a usable
//! cgroup hierarchy, a writable state directory); sandboxes and containers
//! arrive with the pod lifecycle.

pub mod container;
pub mod images;
pub mod monitor;
pub mod spec;

use std::path::{Path, PathBuf};

use kinglet_runtime::{
    BoxFuture, ConditionKind, Runtime, RuntimeCondition, RuntimeError, RuntimeStatus,
    RuntimeVersion,
};

/// The name reported in `nodeInfo.containerRuntimeVersion`.
pub const RUNTIME_NAME: &str = "kinglet-oci";

/// Which cgroup hierarchy the host offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupMode {
    /// The unified hierarchy (`cgroup.controllers` at the mount root).
    V2,
    /// Per-controller hierarchies (a `memory` controller directory).
    V1,
}

/// Detects the cgroup hierarchy mounted at `root` (normally `/sys/fs/cgroup`).
pub fn detect_cgroups(root: &Path) -> Option<CgroupMode> {
    if root.join("cgroup.controllers").is_file() {
        Some(CgroupMode::V2)
    } else if root.join("memory").is_dir() {
        Some(CgroupMode::V1)
    } else {
        None
    }
}

/// The in-process runtime.
#[derive(Debug)]
pub struct OciRuntime {
    state_dir: PathBuf,
    cgroup_root: PathBuf,
}

impl OciRuntime {
    /// A runtime keeping its state under `state_dir`, using the cgroup
    /// hierarchy mounted at `cgroup_root`.
    pub fn new(state_dir: impl Into<PathBuf>, cgroup_root: impl Into<PathBuf>) -> Self {
        OciRuntime {
            state_dir: state_dir.into(),
            cgroup_root: cgroup_root.into(),
        }
    }

    async fn runtime_condition(&self) -> RuntimeCondition {
        let not_ready = |reason: &str, message: String| RuntimeCondition {
            kind: ConditionKind::RuntimeReady,
            status: false,
            reason: reason.into(),
            message,
        };
        if detect_cgroups(&self.cgroup_root).is_none() {
            return not_ready(
                "CgroupsUnavailable",
                format!("no cgroup hierarchy at {}", self.cgroup_root.display()),
            );
        }
        if let Err(e) = probe_writable(&self.state_dir).await {
            return not_ready(
                "StateDirUnwritable",
                format!("state dir {}: {e}", self.state_dir.display()),
            );
        }
        RuntimeCondition {
            kind: ConditionKind::RuntimeReady,
            status: true,
            reason: String::new(),
            message: String::new(),
        }
    }
}

/// Creates the directory if needed and proves a file can be written in it.
async fn probe_writable(dir: &Path) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let probe = dir.join(".probe");
    tokio::fs::write(&probe, b"ok").await?;
    tokio::fs::remove_file(&probe).await
}

impl Runtime for OciRuntime {
    fn version(&self) -> BoxFuture<'_, Result<RuntimeVersion, RuntimeError>> {
        Box::pin(async {
            Ok(RuntimeVersion {
                runtime_name: RUNTIME_NAME.into(),
                runtime_version: env!("CARGO_PKG_VERSION").into(),
                runtime_api_version: "v1".into(),
            })
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<RuntimeStatus, RuntimeError>> {
        Box::pin(async {
            let runtime = self.runtime_condition().await;
            // Pods share the host network until CNI support lands with the pod
            // lifecycle; there is no plugin whose readiness could be checked yet.
            let network = RuntimeCondition {
                kind: ConditionKind::NetworkReady,
                status: true,
                reason: String::new(),
                message: String::new(),
            };
            Ok(RuntimeStatus {
                conditions: vec![runtime, network],
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_cgroup_versions() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(detect_cgroups(dir.path()), None);
        std::fs::create_dir(dir.path().join("memory")).unwrap();
        assert_eq!(detect_cgroups(dir.path()), Some(CgroupMode::V1));
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory").unwrap();
        assert_eq!(detect_cgroups(dir.path()), Some(CgroupMode::V2));
    }

    #[tokio::test]
    async fn status_reflects_host_checks() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cg");
        let rt = OciRuntime::new(dir.path().join("state"), &cg);
        let st = rt.status().await.unwrap();
        let c = st.condition(ConditionKind::RuntimeReady).unwrap();
        assert!(!c.status);
        assert_eq!(c.reason, "CgroupsUnavailable");

        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "memory").unwrap();
        let st = rt.status().await.unwrap();
        assert!(st.is_ready(ConditionKind::RuntimeReady));
        assert!(dir.path().join("state").is_dir());

        // A state dir that is a file cannot hold state.
        let blocked = OciRuntime::new(dir.path().join("cg/cgroup.controllers"), &cg);
        let st = blocked.status().await.unwrap();
        let c = st.condition(ConditionKind::RuntimeReady).unwrap();
        assert_eq!(c.reason, "StateDirUnwritable");
        assert_eq!(
            rt.version().await.unwrap().node_info(),
            "kinglet-oci://0.1.0"
        );
    }
}
