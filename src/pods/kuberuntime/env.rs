//! A container's environment (upstream's `makeEnvironmentVariables`):
//! service variables, `envFrom`, `env` with `valueFrom`, in upstream's
//! order, and `$(VAR)` expansion for values, commands and sub paths.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pods::fieldpath::{field_ref, resource_field};
use crate::pods::objects::EnvObjects;
use crate::pods::util::{ConfigError, NodeFacts, ObjectKind, namespace_and_name};

/// A C identifier-ish name as upstream's `IsEnvVarName` accepts:
/// `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "-._".contains(c))
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

/// A probe's or hook's command with `$(VAR)` expanded from the container's
/// literal `env` values only (upstream's `ExpandContainerCommandOnlyStatic`).
pub fn expand_static(cmd: &[String], c: &Container) -> Vec<String> {
    let env: BTreeMap<String, String> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    cmd.iter().map(|s| expand(s, &env)).collect()
}

/// Expands `$(VAR)` from `env`; `$$(VAR)` escapes, unknown stays as is.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$(") {
            out.push_str("$(");
            rest = after;
        } else if let Some(inner) = tail.strip_prefix("$(")
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&tail[..end + 3]),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment in order (envFrom first, so that env
/// overrides it, as upstream), and the values by name for `$(VAR)`
/// expansion.
#[allow(clippy::type_complexity)]
pub(super) fn environment(
    pod: &Pod,
    c: &Container,
    node: &NodeFacts,
    objects: &EnvObjects,
) -> Result<(Vec<(String, String)>, BTreeMap<String, String>), ConfigError> {
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    let mut ordered: Vec<(String, String)> = Vec::new();
    let mut set = |k: String, v: String, values: &mut BTreeMap<String, String>| {
        values.insert(k.clone(), v.clone());
        ordered.retain(|(o, _)| *o != k);
        ordered.push((k, v));
    };
    for (k, v) in &objects.1 {
        set(k.clone(), v.clone(), &mut values);
    }
    for ef in c.env_from.iter().flatten() {
        for (k, v) in env_from(ef, objects)? {
            set(k, v, &mut values);
        }
    }
    let (ns, _) = namespace_and_name(pod);
    for e in c.env.iter().flatten() {
        let value = match &e.value_from {
            Some(vf) => match env_value_from(pod, c, &e.name, vf, &ns, node, objects)? {
                Some(v) => v,
                None => continue,
            },
            None => expand(e.value.as_deref().unwrap_or(""), &values),
        };
        set(e.name.clone(), value, &mut values);
    }
    Ok((ordered, values))
}

/// The variables one `envFrom` source brings; invalid names are skipped
/// (upstream also records an event).
fn env_from(
    ef: &k8s_openapi::api::core::v1::EnvFromSource,
    objects: &EnvObjects,
) -> Result<Vec<(String, String)>, ConfigError> {
    let prefix = ef.prefix.clone().unwrap_or_default();
    let (kind, name, optional) = match (&ef.config_map_ref, &ef.secret_ref) {
        (Some(r), _) => (ObjectKind::ConfigMap, &r.name, r.optional == Some(true)),
        (None, Some(r)) => (ObjectKind::Secret, &r.name, r.optional == Some(true)),
        (None, None) => return Ok(Vec::new()),
    };
    let Some(data) = objects.get(kind, name) else {
        if optional {
            return Ok(Vec::new());
        }
        return Err(ConfigError(format!("{} {name:?} not found", kind.lower())));
    };
    Ok(data
        .iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
        .filter(|(k, _)| is_env_var_name(k))
        .collect())
}

/// One `env[].valueFrom`: a field, a resource, or a ConfigMap/Secret key;
/// `None`: an optional key that is absent (the variable is left out).
fn env_value_from(
    pod: &Pod,
    c: &Container,
    var: &str,
    vf: &k8s_openapi::api::core::v1::EnvVarSource,
    ns: &str,
    node: &NodeFacts,
    objects: &EnvObjects,
) -> Result<Option<String>, ConfigError> {
    if let Some(f) = &vf.field_ref {
        return field_ref(pod, &f.field_path, node)
            .map(Some)
            .ok_or_else(|| {
                ConfigError(format!(
                    "unsupported fieldRef {:?} in env {var}",
                    f.field_path
                ))
            });
    }
    if let Some(r) = &vf.resource_field_ref {
        return Ok(Some(resource_field(c, r, node)));
    }
    let key_ref = vf
        .config_map_key_ref
        .as_ref()
        .map(|k| (ObjectKind::ConfigMap, &k.name, &k.key, k.optional))
        .or(vf
            .secret_key_ref
            .as_ref()
            .map(|k| (ObjectKind::Secret, &k.name, &k.key, k.optional)));
    match key_ref {
        Some((kind, name, key, optional)) => {
            objects.key(kind, ns, name, key, optional == Some(true))
        }
        None => Ok(Some(String::new())),
    }
}
