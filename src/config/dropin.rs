//! `--config-dir`: drop-in files merged over the config file as upstream
//! merges them (KEP 3983, GA in 1.35). Every `*.conf` file under the dir
//! (subdirectories too, in the lexical order of a walk, as Go's
//! `filepath.WalkDir`) is a `KubeletConfiguration` of its own, checked
//! field by field, then applied to the configuration so far as a JSON
//! merge patch (RFC 7386): maps merged key by key, lists and scalars
//! replaced, `null` back to the default. Flags still win over both, and the
//! result is validated as a whole afterwards.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{ConfigError, KubeletConfiguration, from_tree, tree_of};

/// The largest drop-in read: a config is a few KiB; a huge file costs
/// nothing but an error.
pub const MAX_DROP_IN_BYTES: u64 = 1 << 20;

/// `base` with the drop-ins of `dir` applied, in order.
pub fn merge(
    base: KubeletConfiguration,
    dir: &Path,
    warn: &mut dyn FnMut(String),
) -> Result<KubeletConfiguration, ConfigError> {
    let in_dir = |e: ConfigError| ConfigError::DropIn {
        path: dir.display().to_string(),
        source: Box::new(e),
    };
    let mut files = Vec::new();
    walk(dir, &mut files).map_err(|source| {
        in_dir(ConfigError::Read {
            path: dir.display().to_string(),
            source,
        })
    })?;
    let mut tree = serde_json::to_value(&base).map_err(|e| {
        in_dir(super::field_err(
            "",
            format!("the configuration so far: {e}"),
        ))
    })?;
    for f in files {
        let name = f.display().to_string();
        let patch = read_drop_in(&f, warn).map_err(|e| ConfigError::DropIn {
            path: name,
            source: Box::new(e),
        })?;
        merge_patch(&mut tree, patch);
    }
    from_tree(&tree, &dir.display().to_string(), &mut |_| {}).map_err(in_dir)
}

/// One drop-in's tree, once its fields are known to be right on their own.
fn read_drop_in(path: &Path, warn: &mut dyn FnMut(String)) -> Result<Value, ConfigError> {
    let name = path.display().to_string();
    let read_err = |source| ConfigError::Read {
        path: name.clone(),
        source,
    };
    let Some(bytes) = crate::fsutil::read_at_most(path, MAX_DROP_IN_BYTES).map_err(read_err)?
    else {
        return Err(ConfigError::Syntax {
            path: name,
            message: format!("a drop-in must be at most {MAX_DROP_IN_BYTES} bytes"),
        });
    };
    let text = String::from_utf8(bytes).map_err(|_| {
        read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })?;
    let tree = tree_of(&text, &name)?;
    // `null` is no value of its own but a patch's "back to the default"
    // (Go's decoder skips it too): checked without them.
    from_tree(&without_nulls(&tree), &name, warn)?;
    Ok(tree)
}

fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The `*.conf` files under `dir`, depth first, each directory's entries
/// in byte order of their names; links to directories are not followed.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        if e.file_type()?.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "conf") {
            out.push(path);
        }
    }
    Ok(())
}

/// RFC 7386: a mapping patches a mapping key by key (`null` removes the
/// key); anything else replaces the target.
fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, v) in patch {
        if v.is_null() {
            t.remove(&k);
        } else {
            merge_patch(t.entry(k).or_insert(Value::Null), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn write(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("{HEAD}{body}")).unwrap();
    }

    fn base(body: &str) -> KubeletConfiguration {
        super::super::parse(&format!("{HEAD}{body}"), "base", &mut |_| {}).unwrap()
    }

    #[test]
    fn maps_merge_lists_replace_and_later_files_win() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "10-a.conf",
            "maxPods: 42\nclusterDNS: [10.0.0.1]\nevictionHard:\n  nodefs.available: 5%\n",
        );
        write(d.path(), "20-b.conf", "maxPods: 43\n");
        write(
            d.path(),
            "15-sub/x.conf",
            "systemReserved:\n  memory: 64Mi\n",
        );
        write(d.path(), "99-not-a-drop-in.yaml", "maxPods: 1\n");
        let b = base(
            "clusterDNS: [10.96.0.10, 10.96.0.11]\nsystemReserved:\n  cpu: 100m\nevictionHard:\n  memory.available: 50Mi\n",
        );
        let c = merge(b, d.path(), &mut |_| {}).unwrap();
        assert_eq!(
            c.max_pods, 43,
            "20-b.conf after 10-a.conf; the .yaml ignored"
        );
        assert_eq!(c.cluster_dns, ["10.0.0.1"], "a list is replaced whole");
        assert_eq!(
            c.system_reserved.len(),
            2,
            "maps merge: {:?}",
            c.system_reserved
        );
        let hard = c.eviction_hard.unwrap();
        assert_eq!(hard.len(), 2, "{hard:?}");
    }

    #[test]
    fn a_bad_drop_in_is_named_with_its_field() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "10-bad.conf", "maxPods: lots\n");
        let e = merge(base(""), d.path(), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("10-bad.conf") && e.contains("field maxPods"),
            "{e}"
        );
        std::fs::write(d.path().join("10-bad.conf"), "kind: Pod\n").unwrap();
        let e = merge(base(""), d.path(), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("10-bad.conf") && e.contains("field kind"), "{e}");
        let missing = d.path().join("nope");
        let e = merge(base(""), &missing, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn unknown_fields_are_warned_with_the_file_and_null_restores_the_default() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "10.conf", "maxPods: 7\nfancyField: 1\n");
        write(d.path(), "20.conf", "maxPods: null\n");
        let mut warned = Vec::new();
        let c = merge(base(""), d.path(), &mut |w| warned.push(w)).unwrap();
        assert_eq!(c.max_pods, 110);
        assert!(
            warned
                .iter()
                .any(|w| w.contains("10.conf") && w.contains("fancyField")),
            "{warned:?}"
        );
    }

    #[test]
    fn a_huge_drop_in_is_refused_unread() {
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(d.path().join("big.conf")).unwrap();
        f.set_len(MAX_DROP_IN_BYTES + 1).unwrap();
        let e = merge(base(""), d.path(), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most"), "{e}");
    }
}
