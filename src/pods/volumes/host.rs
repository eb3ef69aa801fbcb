//! Each volume's directory on the host: emptyDirs and the volumes kinglet
//! writes under the pod's volume dir, hostPaths where they point (made or
//! checked by their type, as upstream's hostPath plugin).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::pods::util::{ConfigError, NodeFacts, contained_path, pod_uid};

/// The host directory of each volume of the pod (emptyDir and hostPath;
/// other kinds need the API server and are refused here).
pub fn volume_paths(
    pod: &Pod,
    node: &NodeFacts,
) -> Result<BTreeMap<String, (String, Option<String>)>, ConfigError> {
    let mut out = BTreeMap::new();
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
    {
        // emptyDirs and the volumes kinglet writes (configMap, secret,
        // downwardAPI, projected) live under the pod's volume dir.
        if v.empty_dir.is_some() || object_backed(&v) {
            let base = std::path::Path::new(&node.volume_root);
            let dir = contained_path(base, &[&pod_uid(pod), &v.name]).ok_or_else(|| {
                ConfigError(format!("volume {:?}: not a valid volume name", v.name))
            })?;
            let dir = dir.display().to_string();
            out.insert(v.name.clone(), (dir, Some("DirectoryOrCreate".into())));
        } else if let Some(h) = &v.host_path {
            out.insert(v.name.clone(), (h.path.clone(), h.type_.clone()));
        } else if v.image.is_some() {
            // Mounted by the runtime from its image store: no host dir.
        } else {
            return Err(ConfigError(format!(
                "volume {:?}: only emptyDir, hostPath, configMap, secret, downwardAPI, projected and image volumes are supported",
                v.name
            )));
        }
    }
    Ok(out)
}

/// The image reference of the pod's image volume `name`, if it is one.
pub fn image_volume<'p>(pod: &'p Pod, name: &str) -> Option<&'p str> {
    pod.spec
        .as_ref()?
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)?
        .image
        .as_ref()?
        .reference
        .as_deref()
}

/// Whether kinglet writes the volume's files (configMap, secret,
/// downwardAPI, projected): they are mounted read-only, as upstream.
pub fn object_backed(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

/// Prepares the volumes of a pod on the host (creating emptyDirs and
/// `DirectoryOrCreate` hostPaths, checking typed hostPaths).
pub fn prepare_volumes(pod: &Pod, node: &NodeFacts) -> Result<(), ConfigError> {
    for (name, (path, kind)) in volume_paths(pod, node)? {
        let p = std::path::Path::new(&path);
        match kind.as_deref().unwrap_or("") {
            "DirectoryOrCreate" => std::fs::create_dir_all(p)
                .map_err(|e| ConfigError(format!("volume {name:?}: {path}: {e}")))?,
            "Directory" if !p.is_dir() => {
                return Err(ConfigError(format!(
                    "volume {name:?}: hostPath type check failed: {path} is not a directory"
                )));
            }
            "File" if !p.is_file() => {
                return Err(ConfigError(format!(
                    "volume {name:?}: hostPath type check failed: {path} is not a file"
                )));
            }
            "FileOrCreate" if !p.exists() => {
                std::fs::write(p, b"")
                    .map_err(|e| ConfigError(format!("volume {name:?}: {path}: {e}")))?;
            }
            t @ ("Socket" | "CharDevice" | "BlockDevice") => {
                use std::os::unix::fs::FileTypeExt;
                let ft = std::fs::metadata(p).map(|m| m.file_type());
                let (ok, what) = match t {
                    "Socket" => (ft.as_ref().is_ok_and(|f| f.is_socket()), "a socket file"),
                    "CharDevice" => (
                        ft.as_ref().is_ok_and(|f| f.is_char_device()),
                        "a character device",
                    ),
                    _ => (
                        ft.as_ref().is_ok_and(|f| f.is_block_device()),
                        "a block device",
                    ),
                };
                if !ok {
                    return Err(ConfigError(format!(
                        "volume {name:?}: hostPath type check failed: {path} is not {what}"
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    const BASE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: edge, uid: u-1, labels: {app: web}}\n";

    #[test]
    fn host_path_types_are_checked_as_upstream() {
        let node = NodeFacts::default();
        let check = |path: &str, t: &str| {
            let p = pod(&format!(
                "{BASE}spec: {{containers: [{{name: a, image: x}}], volumes: [{{name: v, hostPath: {{path: {path}, type: {t}}}}}]}}"
            ));
            prepare_volumes(&p, &node).map_err(|e| e.0)
        };
        assert_eq!(check("/dev/null", "CharDevice"), Ok(()));
        assert_eq!(
            check("/dev/null", "BlockDevice"),
            Err("volume \"v\": hostPath type check failed: /dev/null is not a block device".into())
        );
        assert_eq!(
            check("/tmp", "Socket"),
            Err("volume \"v\": hostPath type check failed: /tmp is not a socket file".into())
        );
        assert!(check("/dev/null", "Directory").is_err());
        assert_eq!(check("/tmp", "Directory"), Ok(()));
    }
}
