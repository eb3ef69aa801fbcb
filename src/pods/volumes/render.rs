//! What each object-backed volume holds (upstream's `MakePayload`s):
//! pure functions from the pod, its objects and tokens to the files of
//! the volume, with upstream's modes and messages.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod};

use super::atomic::FileProjection;
use crate::pods::objects::Object;
use crate::pods::util::NodeFacts;
use crate::pods::util::ObjectKind;

pub type Payload = BTreeMap<String, FileProjection>;

/// Upstream's default file mode of configMap, secret, downwardAPI and
/// projected volumes.
pub const DEFAULT_MODE: i32 = 0o644;

/// Why a volume's files cannot be made from its source; the `Display` is
/// upstream's wording where it has one.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("mode {0} must be a number between 0 and 0777 (octal)")]
    Mode(i32),
    #[error("configmap references non-existent config key: {0}")]
    ConfigMapKey(String),
    #[error("references non-existent secret key: {0}")]
    SecretKey(String),
    #[error("unsupported fieldPath {path:?} in volume item {item:?}")]
    FieldPath { path: String, item: String },
    #[error("container {container:?} not found for volume item {item:?}")]
    Container { container: String, item: String },
    #[error("volume item {0:?} has neither fieldRef nor resourceFieldRef")]
    NoSource(String),
}

/// A mode from the API, checked as the apiserver does (0–0777).
pub fn mode(m: Option<i32>, default: i32) -> Result<u32, RenderError> {
    let m = m.unwrap_or(default);
    if !(0..=0o777).contains(&m) {
        return Err(RenderError::Mode(m));
    }
    Ok(m as u32)
}

/// The files of a ConfigMap or Secret: every key, or the `items` asked
/// for. A missing object is the caller's; a missing key fails unless the
/// source is optional.
pub fn keys(
    kind: ObjectKind,
    obj: &Object,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload, RenderError> {
    let default = mode(default_mode, DEFAULT_MODE)?;
    let mut out = Payload::new();
    let Some(items) = items.filter(|i| !i.is_empty()) else {
        for (k, v) in &obj.data {
            let f = FileProjection {
                data: v.clone(),
                mode: default,
            };
            out.insert(k.clone(), f);
        }
        return Ok(out);
    };
    for i in items {
        let Some(data) = obj.data.get(&i.key) else {
            if optional {
                continue;
            }
            return Err(match kind {
                ObjectKind::ConfigMap => RenderError::ConfigMapKey(i.key.clone()),
                ObjectKind::Secret => RenderError::SecretKey(i.key.clone()),
            });
        };
        let f = FileProjection {
            data: data.clone(),
            mode: mode(i.mode, default as i32)?,
        };
        out.insert(i.path.clone(), f);
    }
    Ok(out)
}

/// `metadata.labels` or `.annotations` as a downwardAPI file: sorted
/// `key="value"` lines, as upstream's `FormatMap`.
fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    m.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The files of a downwardAPI volume or source.
pub fn downward(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    node: &NodeFacts,
) -> Result<Payload, RenderError> {
    let default = mode(default_mode, DEFAULT_MODE)?;
    let mut out = Payload::new();
    for i in items {
        let value = if let Some(f) = &i.field_ref {
            match f.field_path.as_str() {
                "metadata.labels" => format_map(pod.metadata.labels.as_ref()),
                "metadata.annotations" => format_map(pod.metadata.annotations.as_ref()),
                p => crate::pods::fieldpath::field_ref(pod, p, node).ok_or_else(|| {
                    RenderError::FieldPath {
                        path: p.into(),
                        item: i.path.clone(),
                    }
                })?,
            }
        } else if let Some(r) = &i.resource_field_ref {
            let name = r.container_name.as_deref().unwrap_or("");
            let spec = pod.spec.as_ref();
            let c = spec
                .and_then(|s| s.containers.iter().find(|c| c.name == name))
                .or_else(|| spec.and_then(|s| s.containers.first()))
                .ok_or_else(|| RenderError::Container {
                    container: name.into(),
                    item: i.path.clone(),
                })?;
            crate::pods::fieldpath::resource_field(c, r, node)
        } else {
            return Err(RenderError::NoSource(i.path.clone()));
        };
        let f = FileProjection {
            data: value.into_bytes(),
            mode: mode(i.mode, default as i32)?,
        };
        out.insert(i.path.clone(), f);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(kv: &[(&str, &str)]) -> Object {
        Object {
            data: kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            immutable: false,
        }
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
            ..Default::default()
        }
    }

    #[test]
    fn keys_items_modes_and_missing_keys_as_upstream() {
        let o = obj(&[("a", "1"), ("b", "2")]);
        let all = keys(ObjectKind::ConfigMap, &o, None, Some(0o400), false).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all["a"].mode, 0o400);
        let some = [item("b", "dir/b.txt", Some(0o600))];
        let p = keys(ObjectKind::ConfigMap, &o, Some(&some), None, false).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["dir/b.txt"]);
        assert_eq!(p["dir/b.txt"].mode, 0o600);
        let missing = [item("zz", "zz", None)];
        assert_eq!(
            keys(ObjectKind::ConfigMap, &o, Some(&missing), None, false)
                .unwrap_err()
                .to_string(),
            "configmap references non-existent config key: zz"
        );
        assert_eq!(
            keys(ObjectKind::Secret, &o, Some(&missing), None, false),
            Err(RenderError::SecretKey("zz".into()))
        );
        assert!(
            keys(ObjectKind::Secret, &o, Some(&missing), None, true)
                .unwrap()
                .is_empty()
        );
        assert!(keys(ObjectKind::Secret, &o, None, Some(0o1777), false).is_err());
    }

    #[test]
    fn labels_and_annotations_as_upstreams_format_map() {
        let mut p = crate::pods::test_pod("u1");
        p.metadata.name = Some("web".into());
        p.metadata.labels = Some(BTreeMap::from([
            ("b".into(), "two \"q\"".into()),
            ("a".into(), "one".into()),
        ]));
        let items: Vec<DownwardAPIVolumeFile> = serde_json::from_value(serde_json::json!([
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o400}
        ]))
        .unwrap();
        let out = downward(&p, &items, None, &NodeFacts::default()).unwrap();
        assert_eq!(out["labels"].data, b"a=\"one\"\nb=\"two \\\"q\\\"\"");
        assert_eq!(out["name"].data, b"web");
        assert_eq!(out["name"].mode, 0o400);
    }
}
