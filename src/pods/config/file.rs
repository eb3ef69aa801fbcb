//! The static pod source: manifests (YAML or JSON, one pod each) in
//! `staticPodPath`, watched with inotify. Each snapshot carries every valid
//! pod; an invalid file is reported and skipped, as upstream does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use sha2::Digest as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::pods::SourceUpdate;
use crate::pods::config::validate;

/// Why a manifest was skipped; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: a pod manifest must be at most {} bytes", path.display(), validate::MAX_MANIFEST_BYTES)]
    TooLarge { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Yaml {
        path: PathBuf,
        source: Box<serde_saphyr::Error>,
    },
    #[error("{}: not a valid Pod: {source}", path.display())]
    NotAPod {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: metadata.name is required", path.display())]
    NoName { path: PathBuf },
    #[error("{}: spec: Required value", path.display())]
    NoSpec { path: PathBuf },
    #[error("{}: {errors}", path.display())]
    Invalid {
        path: PathBuf,
        errors: validate::Errors,
    },
}

/// Reads one manifest and makes it this node's static pod: name suffixed
/// with the node name, UID derived from content and node (stable across
/// restarts), `kubernetes.io/config.*` annotations as upstream sets them.
pub fn load_manifest(path: &Path, node_name: &str) -> Result<Pod, ManifestError> {
    let path_buf = || path.to_path_buf();
    let text = crate::fsutil::read_at_most(path, validate::MAX_MANIFEST_BYTES)
        .map_err(|source| ManifestError::Read {
            path: path_buf(),
            source,
        })?
        .ok_or_else(|| ManifestError::TooLarge { path: path_buf() })?;
    let v: serde_json::Value =
        serde_saphyr::from_slice(&text).map_err(|e| ManifestError::Yaml {
            path: path_buf(),
            source: Box::new(e),
        })?;
    let mut pod: Pod = serde_json::from_value(v).map_err(|source| ManifestError::NotAPod {
        path: path_buf(),
        source,
    })?;
    let name = pod
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ManifestError::NoName { path: path_buf() })?;
    let spec = pod
        .spec
        .as_mut()
        .ok_or_else(|| ManifestError::NoSpec { path: path_buf() })?;
    spec.node_name = Some(node_name.into());
    let mut h = sha2::Sha256::new();
    h.update(&text);
    h.update(node_name.as_bytes());
    h.update(b"file");
    let hex = hex::encode(h.finalize());
    let uid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    pod.metadata.name = Some(format!("{name}-{node_name}"));
    pod.metadata
        .namespace
        .get_or_insert_with(|| "default".into());
    pod.metadata.uid = Some(uid.clone());
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert("kubernetes.io/config.source".into(), "file".into());
    ann.insert("kubernetes.io/config.hash".into(), uid);
    validate::pod(&pod).map_err(|errors| ManifestError::Invalid {
        path: path_buf(),
        errors,
    })?;
    Ok(pod)
}

fn scan(dir: &Path, node_name: &str) -> Vec<Pod> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut pods = Vec::new();
    for f in files {
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.starts_with('.')
            || !(name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json"))
        {
            continue;
        }
        match load_manifest(&f, node_name) {
            Ok(p) if pods.iter().any(|q| same_name(q, &p)) => warn!(
                file = %f.display(),
                pod = %crate::pods::util::pod_name(&p),
                "static pod manifest skipped: an earlier file (in name order) defines a pod of that name"
            ),
            Ok(p) => pods.push(p),
            Err(e) => warn!(error = %e, "invalid static pod manifest skipped"),
        }
    }
    pods
}

fn same_name(a: &Pod, b: &Pod) -> bool {
    a.metadata.name == b.metadata.name && a.metadata.namespace == b.metadata.namespace
}

/// Sends a snapshot now and after every change of `dir`.
pub async fn watch(
    dir: PathBuf,
    node_name: String,
    tx: mpsc::Sender<SourceUpdate>,
    shutdown: CancellationToken,
) {
    if let Err(e) = std::fs::create_dir_all(&dir) {
        warn!(dir = %dir.display(), error = %e, "cannot create the static pod dir");
    }
    use crate::dirwatch::{DirWatch, Flags};
    let watch = DirWatch::new(
        &dir,
        Flags::CLOSE_WRITE | Flags::MOVED_TO | Flags::MOVED_FROM | Flags::DELETE | Flags::CREATE,
    );
    let snapshot = |dir: PathBuf, node: String| async move {
        let pods = tokio::task::spawn_blocking(move || scan(&dir, &node))
            .await
            .unwrap_or_default();
        SourceUpdate::pods("file", pods)
    };
    let _ = tx
        .send(snapshot(dir.clone(), node_name.clone()).await)
        .await;
    info!(dir = %dir.display(), "watching static pod manifests");
    let mut watch = match watch {
        Ok(w) => w,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot watch the static pod dir; changes need a restart");
            return;
        }
    };
    loop {
        let names = tokio::select! {
            _ = shutdown.cancelled() => return,
            n = watch.changed() => match n {
                Ok(n) => n,
                Err(e) => {
                    warn!(dir = %dir.display(), error = %e, "the static pod dir watch broke; changes need a restart");
                    return;
                }
            },
        };
        // Editors' and kinglet's own hidden temp files are no manifests.
        if names
            .iter()
            .any(|n| !n.as_encoded_bytes().starts_with(b"."))
        {
            let _ = tx
                .send(snapshot(dir.clone(), node_name.clone()).await)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_pods_get_node_suffix_stable_uid_and_annotations() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("web.yaml");
        std::fs::write(&f, "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, image: busybox}]}\n").unwrap();
        let a = load_manifest(&f, "pi").unwrap();
        let b = load_manifest(&f, "pi").unwrap();
        assert_eq!(a.metadata.name.as_deref(), Some("web-pi"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(a.metadata.uid, b.metadata.uid);
        assert_ne!(
            a.metadata.uid,
            load_manifest(&f, "other").unwrap().metadata.uid
        );
        assert_eq!(
            a.metadata.annotations.unwrap()["kubernetes.io/config.source"],
            "file"
        );
        assert_eq!(a.spec.unwrap().node_name.as_deref(), Some("pi"));

        for (body, want) in [
            ("kind: Pod\nmetadata: {name: x}\n", "spec: Required value"),
            (
                "kind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n",
                "spec.containers: Required value",
            ),
            (
                "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c}]}\n",
                "spec.containers[0].image: Required value",
            ),
            (
                "kind: Pod\nspec: {containers: [{name: c, image: i}]}\n",
                "metadata.name is required",
            ),
            ("{{{", ""),
            // What a mistyped or hostile manifest must never do: name a
            // path (the log dir and the emptyDir are built from these).
            (
                "kind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: /tmp/x, image: i}]}\n",
                "spec.containers[0].name: Invalid value: \"/tmp/x\"",
            ),
            (
                "kind: Pod\nmetadata: {name: web, namespace: ../../tmp}\nspec: {containers: [{name: c, image: i}]}\n",
                "metadata.namespace: Invalid value",
            ),
            (
                "kind: Pod\nmetadata: {name: ../web}\nspec: {containers: [{name: c, image: i}]}\n",
                "metadata.name: Invalid value",
            ),
        ] {
            std::fs::write(&f, body).unwrap();
            let e = load_manifest(&f, "pi").unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("web.yaml"), "{e}");
        }
        std::fs::write(d.path().join("ok.json"), r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#).unwrap();
        let pods = scan(d.path(), "pi");
        assert_eq!(
            pods.len(),
            1,
            "the invalid file is skipped, the valid one kept"
        );
        // A second manifest naming the same pod is skipped (name order).
        std::fs::write(d.path().join("zz.json"), r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"other","image":"i"}]}}"#).unwrap();
        let pods = scan(d.path(), "pi");
        assert_eq!(pods.len(), 1, "duplicate name kept once");
        assert_eq!(pods[0].spec.as_ref().unwrap().containers[0].name, "c");
        // A file past the bound is not even parsed.
        let big = d.path().join("big.yaml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(validate::MAX_MANIFEST_BYTES + 1).unwrap();
        let e = load_manifest(&big, "pi").unwrap_err().to_string();
        assert!(e.contains("must be at most"), "{e}");
    }
}
