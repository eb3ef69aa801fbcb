//! Pod validation, the one gate every pod passes before anything of it
//! touches the disk: static pods (after the file source named them) and API
//! pods alike, as upstream's `pkg/apis/core/validation` checks them — the
//! names kinglet builds host paths from (pod, namespace, UID, containers,
//! volumes), uniqueness, hostPath and subPath without `..` — plus the
//! bounds kinglet adds so that one pod cannot cost the node its memory
//! (see docs/differences.md). Messages are
//! upstream's field errors (`spec.containers[0].name: Invalid value: ...`).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Volume};

/// The reason of a pod refused here (kinglet's: upstream trusts the
/// apiserver's validation and skips invalid static manifests in silence).
pub const REASON: &str = "InvalidPod";

/// At most this many containers (init and regular) in one pod: a pod past
/// it is refused, not run (upstream has no such bound; the apiserver's
/// request size limits it at a few thousand, which costs a small node all
/// its memory).
pub const MAX_CONTAINERS: usize = 100;

/// At most this many volumes in one pod.
pub const MAX_VOLUMES: usize = 256;

/// A static pod manifest larger than this is not read (etcd's default
/// request limit, the largest pod an apiserver stores).
pub const MAX_MANIFEST_BYTES: u64 = 1536 * 1024;

const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// Upstream's `IsDNS1123Label`: at most 63 characters.
pub fn is_label(s: &str) -> bool {
    s.len() <= 63 && label_chars(s)
}

/// Upstream's `IsDNS1123Subdomain`: at most 253 characters in all; its
/// dot-separated parts have no length limit of their own (upstream's
/// regex), so a 70-character pod name is valid.
pub fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(label_chars)
}

/// A UID kinglet may name a directory after: what the apiserver issues
/// (a UUID) or the file source derives; letters, digits and `-` only.
fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
}

/// A relative path without `..` components (upstream's
/// `validateLocalDescendingPath`); `Err` is the message.
fn descending_path(p: &str) -> Result<(), &'static str> {
    if p.starts_with('/') {
        return Err("must be a relative path");
    }
    if p.split('/').any(|c| c == "..") {
        return Err("must not contain '..'");
    }
    if p.contains('\0') {
        return Err("must not contain a NUL character");
    }
    Ok(())
}

/// The field errors of one pod, as upstream words them.
#[derive(Debug, Default)]
pub struct Errors(Vec<String>);

impl Errors {
    fn invalid(&mut self, field: &str, value: &str, msg: &str) {
        self.0
            .push(format!("{field}: Invalid value: {value:?}: {msg}"));
    }

    fn required(&mut self, field: &str) {
        self.0.push(format!("{field}: Required value"));
    }

    fn duplicate(&mut self, field: &str, value: &str) {
        self.0.push(format!("{field}: Duplicate value: {value:?}"));
    }

    fn too_many(&mut self, field: &str, n: usize, max: usize) {
        self.0.push(format!(
            "{field}: Too many: {n}: must have at most {max} items"
        ));
    }

    fn not_found(&mut self, field: &str, value: &str) {
        self.0.push(format!("{field}: Not found: {value:?}"));
    }

    fn label(&mut self, field: &str, value: &str) {
        if value.len() > 63 {
            self.invalid(field, value, "must be no more than 63 characters");
        } else if !is_label(value) {
            self.invalid(field, value, LABEL_MSG);
        }
    }
}

impl std::fmt::Display for Errors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Upstream joins an aggregate as `[a, b]`; one error stands alone.
        match self.0.as_slice() {
            [one] => f.write_str(one),
            many => write!(f, "[{}]", many.join(", ")),
        }
    }
}

/// Validates `pod`; `Err` lists every field error.
pub fn pod(pod: &Pod) -> Result<(), Errors> {
    let mut errs = Errors::default();
    let m = &pod.metadata;
    match m.name.as_deref() {
        None | Some("") => errs.required("metadata.name"),
        Some(n) if !is_subdomain(n) => errs.invalid("metadata.name", n, SUBDOMAIN_MSG),
        Some(_) => {}
    }
    if let Some(ns) = m.namespace.as_deref() {
        errs.label("metadata.namespace", ns);
    }
    match m.uid.as_deref() {
        None | Some("") => errs.required("metadata.uid"),
        Some(u) if !is_uid(u) => errs.invalid(
            "metadata.uid",
            u,
            "must consist of letters, digits and '-' (at most 64)",
        ),
        Some(_) => {}
    }
    match &pod.spec {
        None => errs.required("spec"),
        Some(spec) => validate_spec(spec, &mut errs),
    }
    if errs.0.is_empty() { Ok(()) } else { Err(errs) }
}

fn validate_spec(spec: &PodSpec, errs: &mut Errors) {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let count = spec.containers.len() + inits.len();
    if count > MAX_CONTAINERS {
        // Nothing more is checked of a pod this large: the point is not
        // to spend on it.
        errs.too_many("spec.containers", count, MAX_CONTAINERS);
        return;
    }
    if spec.containers.is_empty() {
        errs.required("spec.containers");
    }
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let names = validate_volumes(volumes, errs);
    let mut seen = BTreeSet::new();
    let all = inits
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    for (field, c) in all {
        if !seen.insert(c.name.as_str()) {
            errs.duplicate(&format!("{field}.name"), &c.name);
        }
        validate_container(&field, c, &names, errs);
    }
}

/// Checks the volumes; returns their names.
fn validate_volumes<'a>(volumes: &'a [Volume], errs: &mut Errors) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    if volumes.len() > MAX_VOLUMES {
        errs.too_many("spec.volumes", volumes.len(), MAX_VOLUMES);
        return names;
    }
    for (i, v) in volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        errs.label(&format!("{field}.name"), &v.name);
        if !names.insert(v.name.as_str()) {
            errs.duplicate(&format!("{field}.name"), &v.name);
        }
        if let Some(h) = &v.host_path {
            let f = format!("{field}.hostPath.path");
            if h.path.is_empty() {
                errs.required(&f);
            } else if h.path.split('/').any(|c| c == "..") {
                errs.invalid(&f, &h.path, "must not contain '..'");
            }
        }
    }
    names
}

fn validate_container(field: &str, c: &Container, volumes: &BTreeSet<&str>, errs: &mut Errors) {
    errs.label(&format!("{field}.name"), &c.name);
    if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        errs.required(&format!("{field}.image"));
    }
    let mut paths = BTreeSet::new();
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        let f = format!("{field}.volumeMounts[{j}]");
        if !volumes.contains(m.name.as_str()) {
            errs.not_found(&format!("{f}.name"), &m.name);
        }
        if m.mount_path.is_empty() {
            errs.required(&format!("{f}.mountPath"));
        } else if !paths.insert(m.mount_path.as_str()) {
            errs.invalid(&format!("{f}.mountPath"), &m.mount_path, "must be unique");
        }
        let sub = m.sub_path.as_deref().unwrap_or("");
        let expr = m.sub_path_expr.as_deref().unwrap_or("");
        if !sub.is_empty() && !expr.is_empty() {
            errs.invalid(
                &format!("{f}.subPathExpr"),
                expr,
                "subPathExpr and subPath are mutually exclusive",
            );
        }
        for (name, p) in [("subPath", sub), ("subPathExpr", expr)] {
            if let Err(msg) = descending_path(p) {
                errs.invalid(&format!("{f}.{name}"), p, msg);
            }
        }
    }
}

/// The expanded `subPathExpr` of a mount, or `Err` with the message when
/// the expansion leaves the volume (upstream re-checks after expansion).
pub fn expanded_sub_path(expanded: &str) -> Result<(), &'static str> {
    descending_path(expanded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    fn errors(yaml: &str) -> String {
        match pod(&parse(yaml)) {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    const META: &str =
        "metadata: {name: web, namespace: edge, uid: 0f1e2d3c-aaaa-bbbb-cccc-0123456789ab}";

    #[test]
    fn long_names_are_subdomains_not_labels() {
        // As the conformance suite names its pods.
        let name = "termination-message-container59111524-086a-4090-9625-6209079a0418";
        assert!(name.len() > 63);
        assert!(is_subdomain(name) && !is_label(name));
        assert!(!is_subdomain(&"a".repeat(254)));
        assert!(is_subdomain("a.b-c.d9"));
        assert!(!is_subdomain("a..b") && !is_subdomain(".a") && !is_subdomain("a-"));
    }

    #[test]
    fn a_plain_pod_is_valid() {
        let ok = format!(
            "{META}\nspec: {{containers: [{{name: a, image: x, volumeMounts: [{{name: d, mountPath: /d, subPath: s/t}}]}}], volumes: [{{name: d, emptyDir: {{}}}}, {{name: h, hostPath: {{path: /srv/data}}}}]}}"
        );
        assert_eq!(errors(&ok), "");
    }

    #[test]
    fn names_that_would_leave_a_directory_are_refused() {
        let cases = [
            (
                "metadata: {name: ../x, uid: u1}",
                "metadata.name: Invalid value: \"../x\"",
            ),
            (
                "metadata: {name: web, namespace: ../../etc, uid: u1}",
                "metadata.namespace: Invalid value",
            ),
            (
                "metadata: {name: web, uid: ../../u}",
                "metadata.uid: Invalid value",
            ),
            (
                "metadata: {name: Web Server, uid: u1}",
                "metadata.name: Invalid value: \"Web Server\"",
            ),
        ];
        for (meta, want) in cases {
            let e = errors(&format!(
                "{meta}\nspec: {{containers: [{{name: a, image: x}}]}}"
            ));
            assert!(e.contains(want), "{meta}: {e}");
        }
        for name in ["/tmp/x", "../../../../tmp/x", "A", "a b", ""] {
            let e = errors(&format!(
                "{META}\nspec: {{containers: [{{name: {name:?}, image: x}}]}}"
            ));
            assert!(
                e.contains("spec.containers[0].name: Invalid value"),
                "{name:?}: {e}"
            );
        }
        let e = errors(&format!(
            "{META}\nspec: {{containers: [{{name: a, image: x}}], volumes: [{{name: ../../x, emptyDir: {{}}}}]}}"
        ));
        assert!(
            e.contains("spec.volumes[0].name: Invalid value: \"../../x\""),
            "{e}"
        );
    }

    #[test]
    fn host_and_sub_paths_must_not_climb() {
        let e = errors(&format!(
            "{META}\nspec: {{containers: [{{name: a, image: x, volumeMounts: [{{name: h, mountPath: /h, subPath: ../up}}, {{name: h, mountPath: /i, subPathExpr: /abs}}]}}], volumes: [{{name: h, hostPath: {{path: /srv/../etc}}}}]}}"
        ));
        assert!(e.contains("spec.volumes[0].hostPath.path: Invalid value: \"/srv/../etc\": must not contain '..'"), "{e}");
        assert!(
            e.contains("volumeMounts[0].subPath: Invalid value: \"../up\": must not contain '..'"),
            "{e}"
        );
        assert!(
            e.contains(
                "volumeMounts[1].subPathExpr: Invalid value: \"/abs\": must be a relative path"
            ),
            "{e}"
        );
        assert_eq!(expanded_sub_path("a/../../b"), Err("must not contain '..'"));
        assert_eq!(expanded_sub_path("pod-1/logs"), Ok(()));
    }

    #[test]
    fn duplicates_and_missing_parts_are_refused() {
        let e = errors(&format!(
            "{META}\nspec: {{initContainers: [{{name: a, image: x}}], containers: [{{name: a, image: x}}, {{name: b}}], volumes: [{{name: v, emptyDir: {{}}}}, {{name: v, emptyDir: {{}}}}]}}"
        ));
        assert!(
            e.contains("spec.containers[0].name: Duplicate value: \"a\""),
            "{e}"
        );
        assert!(
            e.contains("spec.containers[1].image: Required value"),
            "{e}"
        );
        assert!(
            e.contains("spec.volumes[1].name: Duplicate value: \"v\""),
            "{e}"
        );
        let e = errors(&format!(
            "{META}\nspec: {{containers: [{{name: a, image: x, volumeMounts: [{{name: nope, mountPath: /n}}]}}]}}"
        ));
        assert!(
            e.contains("volumeMounts[0].name: Not found: \"nope\""),
            "{e}"
        );
        assert!(
            errors(&format!("{META}\nspec: {{containers: []}}"))
                .contains("spec.containers: Required value")
        );
    }

    #[test]
    fn a_pod_past_the_bounds_is_refused_without_more_work() {
        let containers: Vec<String> = (0..10_000)
            .map(|i| format!("{{name: c{i}, image: x}}"))
            .collect();
        let e = errors(&format!(
            "{META}\nspec: {{containers: [{}]}}",
            containers.join(", ")
        ));
        assert_eq!(
            e,
            "spec.containers: Too many: 10000: must have at most 100 items"
        );
    }
}
