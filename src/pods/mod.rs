//! The pod lifecycle, one owner per part (upstream's package map):
//!
//! - [`config`]: the source merge and `SourcesReady`; the sources are
//!   [`config::api`] (the watch of pods bound to this node, with its
//!   checkpoint) and [`config::file`] (static pods), and
//!   [`config::validate`] the one gate every pod (static or API) passes
//!   before anything of it touches the disk;
//! - [`manager`]: the task that joins the parts, admission ([`admit`],
//!   with the sysctl allowlist of [`sysctls`]), the allocation of
//!   in-place resizes ([`allocation`]: what each pod's containers are
//!   allocated, which the workers run), and removal of what pods that
//!   are gone left behind;
//! - [`pod_workers`]: each UID's phase, syncing → terminating →
//!   terminated, and the rule that a terminated UID never comes back;
//! - [`worker`]: one task per pod that plans, executes and reports
//!   ([`report`]), and takes kill requests; it owns the handles of the
//!   node it is given ([`worker::NodeContext`]);
//! - [`kuberuntime`]: pure, from the pod spec to runtime actions and
//!   configs: the plan (upstream's `computePodActions`), the sandbox
//!   config, each container's config and environment, and what a resize
//!   does to running containers;
//! - [`pleg`]: the relist, its timestamped per-pod cache and its health;
//! - [`status`]: the pod status computed from container states;
//!   [`status::manager`] its single writer (local records and, through
//!   [`status::api_writer`], the API);
//! - [`services`]: service environment variables from the cluster's
//!   Services;
//! - [`volumes`]: each pod's volumes, their host dirs, prepared before its
//!   containers and kept current (configMap, secret, downwardAPI,
//!   projected tokens), and `subPath` mounts opened without following
//!   links and bound by descriptor, so a pod cannot race them out of the
//!   volume;
//! - [`prober`]: liveness, readiness and startup probes, one task per
//!   container and kind, owned by the worker; [`hooks`]: `postStart` and
//!   `preStop`;
//! - [`podfiles`]: the kubelet's files of a pod's containers (its
//!   `/etc/hosts`, termination-message files), given to the runtime as
//!   mounts;
//! - [`images`] (pull policy, pull secrets, pull back-off; [`images::gc`]
//!   the garbage collector), [`objects`] (ConfigMaps and Secrets),
//!   [`fieldpath`] (`fieldRef`
//!   and `resourceFieldRef` values), [`logs`], [`ls`] (`kinglet pods ls`);
//! - [`util`]: the leaf every part shares (pod names and UIDs, contained
//!   paths, the node's plain facts, the clock); it imports nothing of
//!   `pods`.
//!
//! QoS classes, cgroup parents and OOM scores are the container
//! manager's ([`crate::cm`]). The modules form no import cycle
//! (`tests/lint/modgraph.py`, run by CI's lint step). Nothing here imports
//! a runtime crate: runtimes sit behind the `kinglet_runtime::Runtime`
//! trait.

pub mod admit;
pub mod allocation;
pub mod config;
pub mod fieldpath;
pub mod fuzz;
pub mod hooks;
pub mod images;
pub mod kuberuntime;
pub mod logs;
pub mod ls;
pub mod manager;
pub mod objects;
pub mod pleg;
pub mod pod_workers;
pub mod podfiles;
pub mod prober;
pub mod report;
pub mod services;
pub mod status;
pub mod sysctls;
pub mod util;
pub mod volumes;
pub mod worker;

#[cfg(test)]
mod tests;

/// An empty pod with just a UID, for unit tests.
#[cfg(test)]
pub(crate) fn test_pod(uid: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut p = k8s_openapi::api::core::v1::Pod::default();
    p.metadata.uid = Some(uid.into());
    p
}

/// A running container `name` with ID `id` as a runtime reports it, for
/// unit tests.
#[cfg(test)]
pub(crate) fn running_container(id: &str, name: &str) -> kinglet_runtime::ContainerStatus {
    kinglet_runtime::ContainerStatus {
        id: id.into(),
        sandbox_id: "s".into(),
        pod_uid: "u1".into(),
        name: name.into(),
        attempt: 0,
        image: "x".into(),
        image_ref: "x".into(),
        image_id: "x".into(),
        state: kinglet_runtime::ContainerState::Running,
        created_at: 1,
        started_at: jiff::Timestamp::now().as_nanosecond() as i64,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        log_path: String::new(),
        pid: 1,
    }
}

pub use config::SourceUpdate;
pub use ls::table;
pub use manager::{PodKiller, PodManager};
pub use status::manager::{PodEntry, StatusManager, StatusView};
pub use worker::{EVICTED, KillRequest};
