//! CDI (the Container Device Interface) in process, as containerd's CRI
//! plugin resolves a container's `CDIDevices`: the spec files in
//! `/etc/cdi` and `/var/run/cdi` (JSON or YAML; a device in a later
//! directory wins), a fully qualified name (`vendor.com/class=name`)
//! looked up in them, and its spec's and its own `containerEdits` applied:
//! environment, device nodes (made from their type and numbers, or from
//! the host's node), mounts and OCI hooks. A name no spec has fails the
//! container with containerd's words. Blocking (it reads files): it runs
//! with the bundle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kinglet_runtime::RuntimeError;
use serde::Deserialize;

use crate::spec::{BindMount, DeviceNode};

/// Where CDI spec files are, lowest priority first.
pub const SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// The most one spec file may weigh, and the most files read.
const MAX_SPEC_BYTES: u64 = 4 << 20;
const MAX_SPECS: usize = 256;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    kind: String,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Edits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<Node>,
    #[serde(default)]
    mounts: Vec<Mount>,
    #[serde(default)]
    hooks: Vec<Hook>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Node {
    path: String,
    host_path: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    major: Option<u64>,
    minor: Option<u64>,
    file_mode: Option<u32>,
    permissions: Option<String>,
    uid: Option<u32>,
    gid: Option<u32>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mount {
    host_path: String,
    container_path: String,
    #[serde(default)]
    options: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Hook {
    hook_name: String,
    path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout: Option<i64>,
}

/// What the named devices add to a container.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Injected {
    /// `KEY=VALUE`, after the container's own.
    pub env: Vec<String>,
    pub devices: Vec<DeviceNode>,
    pub mounts: Vec<BindMount>,
    /// OCI hooks by their name (`createContainer`, `startContainer`…).
    pub hooks: BTreeMap<String, Vec<serde_json::Value>>,
}

/// Resolves `names` against the specs in `dirs`.
pub(crate) fn inject(names: &[String], dirs: &[&Path]) -> Result<Injected, RuntimeError> {
    let mut out = Injected::default();
    if names.is_empty() {
        return Ok(out);
    }
    let specs = read_specs(dirs);
    let mut missing = Vec::new();
    for name in names {
        let found = name.split_once('=').and_then(|(kind, dev)| {
            // The last spec of the kind that has the device: later dirs win.
            specs.iter().rev().find_map(|s| {
                let d = s.devices.iter().find(|d| d.name == dev)?;
                (s.kind == kind).then_some((s, d))
            })
        });
        match found {
            Some((spec, dev)) => {
                apply(&mut out, &spec.container_edits)?;
                apply(&mut out, &dev.container_edits)?;
            }
            None => missing.push(name.as_str()),
        }
    }
    if !missing.is_empty() {
        let why = format!(
            "failed to inject CDI devices: unresolvable CDI devices {}",
            missing.join(", ")
        );
        return Err(RuntimeError::Other(why));
    }
    Ok(out)
}

/// Every readable spec in `dirs`, in priority order (lowest first);
/// a file that is not a spec is skipped, as containerd skips it.
fn read_specs(dirs: &[&Path]) -> Vec<Spec> {
    let mut specs = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files.into_iter().take(MAX_SPECS) {
            let ext = f.extension().and_then(|e| e.to_str()).unwrap_or_default();
            if !matches!(ext, "json" | "yaml" | "yml") {
                continue;
            }
            if let Some(s) = read_spec(&f) {
                specs.push(s);
            }
        }
    }
    specs
}

fn read_spec(path: &Path) -> Option<Spec> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_SPEC_BYTES).read_to_string(&mut text).ok()?;
    match serde_saphyr::from_str::<Spec>(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(path = %path.display(), "CDI spec skipped: {e}");
            None
        }
    }
}

fn apply(out: &mut Injected, edits: &Edits) -> Result<(), RuntimeError> {
    out.env.extend(edits.env.iter().cloned());
    for n in &edits.device_nodes {
        out.devices.push(node(n)?);
    }
    for m in &edits.mounts {
        out.mounts.push(BindMount {
            source: PathBuf::from(&m.host_path),
            destination: m.container_path.clone(),
            readonly: m.options.iter().any(|o| o == "ro"),
            propagation: Default::default(),
        });
    }
    for h in &edits.hooks {
        let mut v = serde_json::to_value(h).map_err(|e| RuntimeError::Other(e.to_string()))?;
        if let Some(o) = v.as_object_mut() {
            o.remove("hookName");
        }
        out.hooks.entry(h.hook_name.clone()).or_default().push(v);
    }
    Ok(())
}

/// A CDI device node: its type and numbers as the spec gives them, else
/// the host node's (at `hostPath`, else at `path`).
fn node(n: &Node) -> Result<DeviceNode, RuntimeError> {
    let host = n.host_path.as_deref().unwrap_or(&n.path);
    let access = n.permissions.clone().unwrap_or_else(|| "rwm".into());
    if let (Some(kind), Some(major), Some(minor)) = (&n.kind, n.major, n.minor) {
        let kind = match kind.as_str() {
            "c" | "u" => 'c',
            "b" => 'b',
            other => {
                return Err(RuntimeError::Other(format!(
                    "CDI device {}: type {other:?} is not c or b",
                    n.path
                )));
            }
        };
        return Ok(DeviceNode {
            path: n.path.clone(),
            kind,
            major,
            minor,
            file_mode: n.file_mode.unwrap_or(0o666),
            uid: n.uid.unwrap_or(0),
            gid: n.gid.unwrap_or(0),
            access,
        });
    }
    let meta = std::fs::metadata(host)
        .map_err(|e| RuntimeError::Other(format!("CDI device {host}: {e}")))?;
    let mut d = crate::devices::node(&meta, &n.path, &access)
        .ok_or_else(|| RuntimeError::Other(format!("CDI device {host}: not a device node")))?;
    d.file_mode = n.file_mode.unwrap_or(d.file_mode);
    d.uid = n.uid.unwrap_or(d.uid);
    d.gid = n.gid.unwrap_or(d.gid);
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's sample device plugin's spec, as it writes it.
    const SAMPLE: &str = r#"{"cdiVersion":"0.3.0","kind":"example.com/resource","devices":[
        {"name":"CDI-Dev-1","containerEdits":{"env":["CDI_DEVICE=CDI-Dev-1"],"deviceNodes":[{"path":"/tmp/CDI-Dev-1","type":"b","major":1,"minor":0}]}},
        {"name":"CDI-Dev-2","containerEdits":{"env":["CDI_DEVICE=CDI-Dev-2"],"deviceNodes":[{"path":"/tmp/CDI-Dev-2","type":"b","major":1,"minor":1}]}}]}"#;

    #[test]
    fn a_device_is_found_in_its_kinds_spec_and_its_edits_applied() {
        let etc = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        std::fs::write(etc.path().join("example.com.json"), SAMPLE).unwrap();
        let yaml = "cdiVersion: 0.6.0\nkind: vendor.io/gpu\ncontainerEdits:\n  env: [GPU_ALL=1]\n  hooks: [{hookName: createContainer, path: /bin/true, args: [true]}]\ndevices:\n- name: g0\n  containerEdits:\n    deviceNodes: [{path: /dev/g0, hostPath: /dev/null}]\n    mounts: [{hostPath: /srv/lib, containerPath: /usr/lib/gpu, options: [ro, bind]}]\n";
        std::fs::write(run.path().join("gpu.yaml"), yaml).unwrap();
        std::fs::write(run.path().join("broken.json"), "{").unwrap();
        let dirs = [etc.path(), run.path()];
        let names = [
            "example.com/resource=CDI-Dev-2".to_string(),
            "vendor.io/gpu=g0".into(),
        ];
        let got = inject(&names, &dirs).unwrap();
        assert_eq!(got.env, ["CDI_DEVICE=CDI-Dev-2", "GPU_ALL=1"]);
        assert_eq!(got.devices.len(), 2);
        let (b, g) = (&got.devices[0], &got.devices[1]);
        assert_eq!(
            (b.path.as_str(), b.kind, b.major, b.minor),
            ("/tmp/CDI-Dev-2", 'b', 1, 1)
        );
        assert_eq!(
            (g.path.as_str(), g.kind, g.major, g.minor),
            ("/dev/g0", 'c', 1, 3)
        );
        assert!(got.mounts[0].readonly);
        assert_eq!(got.hooks["createContainer"][0]["path"], "/bin/true");
        assert!(got.hooks["createContainer"][0].get("hookName").is_none());
    }

    #[test]
    fn an_unknown_device_fails_with_containerds_words() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("example.com.json"), SAMPLE).unwrap();
        let names = ["example.com/resource=nope".to_string()];
        let err = inject(&names, &[dir.path()]).unwrap_err().to_string();
        assert!(
            err.contains("unresolvable CDI devices example.com/resource=nope"),
            "{err}"
        );
    }
}
