//! Local storage of a pod, as upstream's eviction measures it for disk
//! pressure and for `localStorageEviction`: the bytes its emptyDirs on
//! disk, its container logs and its containers' writable layers (as the
//! runtime reports them, CRI's `writable_layer`) take (`du`'s blocks, one
//! filesystem, no symlinks followed, off the async thread).
//!
//! Evicted whatever the node's state, with upstream's messages and in
//! upstream's order ([`limit_breach`]): a pod whose emptyDir exceeds its
//! `sizeLimit`, whose total exceeds the sum of its containers'
//! `ephemeral-storage` limits, or with a container over its own limit
//! (writable layer and logs).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

/// Where pods keep their files.
#[derive(Clone, Debug)]
pub struct Roots {
    /// `<root-dir>/volumes`: `<uid>/<volume>`.
    pub volumes: PathBuf,
    /// The pod log dir: `<ns>_<name>_<uid>/<container>/`.
    pub logs: PathBuf,
}

pub use kinglet_runtime::disk::du;

/// One emptyDir on disk: its name, directory, and `sizeLimit` as
/// written and in bytes.
type EmptyDir = (String, PathBuf, Option<(String, u64)>);

/// The pod's emptyDirs on disk (not `medium: Memory`), under `volumes`
/// (`<root-dir>/volumes`).
pub fn empty_dirs(pod: &Pod, uid: &str, volumes: &Path) -> Vec<EmptyDir> {
    let specs = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    specs
        .filter_map(|v| {
            let e = v.empty_dir.as_ref()?;
            if e.medium.as_deref() == Some("Memory") {
                return None;
            }
            let dir = crate::pods::util::contained_path(volumes, &[uid, &v.name])?;
            let limit = e.size_limit.as_ref().and_then(|q| {
                crate::config::parse_quantity(&q.0)
                    .ok()
                    .map(|b| (q.0.clone(), b))
            });
            Some((v.name.clone(), dir, limit))
        })
        .collect()
}

/// An emptyDir walked: its name, `sizeLimit` (as written, in bytes),
/// bytes used.
type DirUse = (String, Option<(String, u64)>, u64);

/// The pod's emptyDirs, each walked once.
fn empty_dir_use(pod: &Pod, uid: &str, r: &Roots) -> Vec<DirUse> {
    empty_dirs(pod, uid, &r.volumes)
        .into_iter()
        .map(|(name, dir, limit)| (name, limit, du(&dir)))
        .collect()
}

/// Upstream's message for the first emptyDir over its `sizeLimit`.
#[cfg(test)]
fn over_limit(pod: &Pod, uid: &str, r: &Roots) -> Option<String> {
    size_limit_message(&empty_dir_use(pod, uid, r))
}

/// Upstream's message for the first emptyDir over its `sizeLimit`.
fn size_limit_message(dirs: &[DirUse]) -> Option<String> {
    dirs.iter().find_map(|(name, limit, used)| {
        let (text, bytes) = limit.as_ref()?;
        (used > bytes)
            .then(|| format!("Usage of EmptyDir volume {name:?} exceeds the limit {text:?}. "))
    })
}

/// A container's `ephemeral-storage` limit, if it has one.
fn ephemeral_limit(
    c: &k8s_openapi::api::core::v1::Container,
) -> Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("ephemeral-storage"))
}

/// Writable-layer bytes of a pod's containers, by container name.
pub type Writable = std::collections::BTreeMap<String, u64>;

/// Which local-storage limit a pod broke, first in upstream's order
/// (emptyDir `sizeLimit`, the pod's total, one container's): the
/// eviction signal upstream names it by and upstream's message.
pub fn limit_breach(
    pod: &Pod,
    uid: &str,
    r: &Roots,
    writable: &Writable,
) -> Option<(&'static str, String)> {
    let dirs = empty_dir_use(pod, uid, r);
    if let Some(m) = size_limit_message(&dirs) {
        return Some(("emptydirfs.limit", m));
    }
    // (name, limit as written and in bytes, bytes used)
    type Use = (String, Option<(String, u64)>, u64);
    let containers: Vec<Use> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            let limit = ephemeral_limit(c).and_then(|q| {
                let b = crate::config::parse_quantity(&q.0).ok()?;
                Some((q.0.clone(), b))
            });
            let used =
                writable.get(&c.name).copied().unwrap_or(0) + du(&container_logs(pod, r, &c.name));
            (c.name.clone(), limit, used)
        })
        .collect();
    let limits: Vec<&(String, u64)> = containers.iter().filter_map(|c| c.1.as_ref()).collect();
    if !limits.is_empty() {
        let total: u64 = limits.iter().map(|l| l.1).sum();
        let dirs: u64 = dirs.iter().map(|d| d.2).sum();
        let used = dirs + containers.iter().map(|c| c.2).sum::<u64>();
        if used > total {
            let text = match limits.as_slice() {
                [(one, _)] => one.clone(),
                _ => super::rank::quantity(total),
            };
            return Some((
                "ephemeralpodfs.limit",
                format!(
                    "Pod ephemeral local storage usage exceeds the total limit of containers {text}. "
                ),
            ));
        }
    }
    containers.into_iter().find_map(|(name, limit, used)| {
        let (text, bytes) = limit?;
        (used > bytes).then(|| {
            (
                "ephemeralcontainerfs.limit",
                format!("Container {name} exceeded its local ephemeral storage limit {text:?}. "),
            )
        })
    })
}

/// Whether any container of the pod has an `ephemeral-storage` limit.
pub fn has_limit(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .any(|c| ephemeral_limit(c).is_some())
}

/// A container's log dir: `<pod log dir>/<container>`.
fn container_logs(pod: &Pod, r: &Roots, container: &str) -> PathBuf {
    let logs = crate::pods::util::log_directory(pod, &r.logs.display().to_string());
    Path::new(&logs).join(container)
}

/// The pod's local storage in use: its emptyDirs on disk, its logs and
/// its containers' writable layers.
pub fn usage(pod: &Pod, uid: &str, r: &Roots, writable: &Writable) -> u64 {
    let dirs: u64 = empty_dir_use(pod, uid, r).iter().map(|d| d.2).sum();
    let logs = crate::pods::util::log_directory(pod, &r.logs.display().to_string());
    dirs + du(Path::new(&logs)) + writable.values().sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(d: &Path) -> Roots {
        Roots {
            volumes: d.join("volumes"),
            logs: d.join("logs"),
        }
    }

    #[test]
    fn an_empty_dir_over_its_size_limit_is_named() {
        let d = tempfile::tempdir().unwrap();
        let r = roots(d.path());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "data", "emptyDir": {"sizeLimit": "1Mi"}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Ki"}}]}
        }))
        .unwrap();
        let data = r.volumes.join("u1/data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("small"), vec![1u8; 4096]).unwrap();
        assert_eq!(over_limit(&pod, "u1", &r), None);
        std::fs::write(data.join("big"), vec![1u8; 2 << 20]).unwrap();
        assert_eq!(
            over_limit(&pod, "u1", &r).as_deref(),
            Some("Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". ")
        );
        assert!(usage(&pod, "u1", &r, &Writable::new()) >= 2 << 20);
        assert_eq!(
            limit_breach(&pod, "u1", &r, &Writable::new()).map(|b| b.0),
            Some("emptydirfs.limit")
        );
        assert_eq!(du(&d.path().join("missing")), 0);
    }

    #[test]
    fn ephemeral_storage_limits_of_the_pod_then_of_a_container() {
        let d = tempfile::tempdir().unwrap();
        let r = roots(d.path());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"ephemeral-storage": "1Mi"}}},
                {"name": "b", "resources": {"limits": {"ephemeral-storage": "4Mi"}}},
                {"name": "free"}],
                "volumes": [{"name": "data", "emptyDir": {}}]}
        }))
        .unwrap();
        let mut w = Writable::new();
        w.insert("a".into(), 512 << 10);
        assert_eq!(limit_breach(&pod, "u1", &r, &w), None);
        // A over its own 1Mi (its writable layer and its logs), the pod
        // within its 5Mi.
        let logs = container_logs(&pod, &r, "a");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::write(logs.join("0.log"), vec![b'x'; 1 << 20]).unwrap();
        assert_eq!(
            limit_breach(&pod, "u1", &r, &w),
            Some((
                "ephemeralcontainerfs.limit",
                "Container a exceeded its local ephemeral storage limit \"1Mi\". ".to_string()
            ))
        );
        // An emptyDir and a container without a limit count for the pod.
        let data = r.volumes.join("u1/data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("f"), vec![1u8; 3 << 20]).unwrap();
        w.insert("free".into(), 1 << 20);
        assert_eq!(
            limit_breach(&pod, "u1", &r, &w),
            Some((
                "ephemeralpodfs.limit",
                "Pod ephemeral local storage usage exceeds the total limit of containers 5Mi. "
                    .to_string()
            ))
        );
    }
}
