//! A container's config (upstream's `kuberuntime_container`): command
//! and args expanded, environment, mounts (sub paths bound by the worker
//! onto targets in the pod's dir), cgroup limits, OOM score and security
//! context, from the pod spec and the node's facts alone.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use kinglet_runtime::{ContainerConfig, ContainerResources};

use super::env::{environment, expand};
use crate::cm::qos::oom_score_adj;
use crate::config::parse_quantity;
use crate::pods::objects::EnvObjects;
use crate::pods::util::{
    ConfigError, NodeFacts, contained_path, namespace_and_name, pod_uid, quantity_milli,
};
use crate::pods::volumes::host::{image_volume, object_backed, volume_paths};
use crate::pods::volumes::subpath::{self, SubPath};

/// The container's mounts: each volume's host dir, or for a `subPath` (or
/// `subPathExpr` expanded with the container's environment, as upstream)
/// the target in the pod's dir that [`subpath::prepare`] binds it onto
/// before the container is made; the sub paths to prepare come with them.
fn volume_mounts(
    pod: &Pod,
    c: &Container,
    node: &NodeFacts,
    env: &BTreeMap<String, String>,
) -> Result<(Vec<kinglet_runtime::Mount>, Vec<SubPath>), ConfigError> {
    let paths = volume_paths(pod, node)?;
    let written: BTreeSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| object_backed(v))
        .map(|v| v.name.as_str())
        .collect();
    let (mut out, mut subs) = (Vec::new(), Vec::new());
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if let Some(reference) = image_volume(pod, &m.name) {
            out.push(kinglet_runtime::Mount {
                container_path: m.mount_path.clone(),
                readonly: true,
                image: reference.to_string(),
                image_sub_path: m.sub_path.clone().unwrap_or_default(),
                ..Default::default()
            });
            continue;
        }
        let (path, _) = paths.get(&m.name).ok_or_else(|| {
            ConfigError(format!("volumeMount {:?}: no volume of that name", m.name))
        })?;
        let sub = match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
            (Some(s), _) if !s.is_empty() => s.to_string(),
            (_, Some(e)) if !e.is_empty() => expand(e, env),
            _ => String::new(),
        };
        let host = if sub.is_empty() {
            path.clone()
        } else {
            let s = sub_path(pod, c, i, m, path, &sub, node)?;
            let target = s.target.display().to_string();
            subs.push(s);
            target
        };
        out.push(kinglet_runtime::Mount {
            host_path: host,
            container_path: m.mount_path.clone(),
            readonly: m.read_only.unwrap_or(false) || written.contains(m.name.as_str()),
            propagation: propagation(c, m)?,
            ..Default::default()
        });
    }
    Ok((out, subs))
}

/// A mount's `mountPropagation`, as upstream's `translateMountPropagation`:
/// `Bidirectional` only for privileged containers.
fn propagation(
    c: &Container,
    m: &k8s_openapi::api::core::v1::VolumeMount,
) -> Result<kinglet_runtime::Propagation, ConfigError> {
    use kinglet_runtime::Propagation;
    let privileged = c
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    match m.mount_propagation.as_deref() {
        None | Some("None") => Ok(Propagation::Private),
        Some("HostToContainer") => Ok(Propagation::HostToContainer),
        Some("Bidirectional") if privileged => Ok(Propagation::Bidirectional),
        Some("Bidirectional") => Err(ConfigError(
            "Bidirectional mount propagation is available only to privileged containers".into(),
        )),
        Some(p) => Err(ConfigError(format!("invalid MountPropagation mode: {p:?}"))),
    }
}

/// Mount `index` of container `c` at `volume/sub`: `sub` checked (no
/// `..`, relative), and its target, upstream's
/// `volume-subpaths/<volume>/<container>/<index>`, in the pod's volume dir.
fn sub_path(
    pod: &Pod,
    c: &Container,
    index: usize,
    m: &k8s_openapi::api::core::v1::VolumeMount,
    volume: &str,
    sub: &str,
    node: &NodeFacts,
) -> Result<SubPath, ConfigError> {
    crate::pods::config::validate::expanded_sub_path(sub)
        .map_err(|msg| ConfigError(format!("volumeMount {:?}: subPath {sub:?} {msg}", m.name)))?;
    let parts = [
        pod_uid(pod),
        subpath::TARGETS_DIR.to_string(),
        m.name.clone(),
        c.name.clone(),
        index.to_string(),
    ];
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let target = contained_path(std::path::Path::new(&node.volume_root), &parts)
        .ok_or_else(|| ConfigError(format!("volumeMount {:?}: not a valid volume name", m.name)))?;
    Ok(SubPath {
        name: m.name.clone(),
        volume: volume.into(),
        sub: sub.into(),
        target,
    })
}

/// The runtime's container config for `c`, restart number `attempt`.
pub fn container_config(
    pod: &Pod,
    c: &Container,
    attempt: u32,
    node: &NodeFacts,
    objects: &EnvObjects,
) -> Result<(ContainerConfig, Vec<SubPath>), ConfigError> {
    let (env, values) = environment(pod, c, node, objects)?;
    let command = c.command.iter().flatten().map(|s| expand(s, &values));
    let args = c.args.iter().flatten().map(|s| expand(s, &values));
    let pod_sc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let uid = sc.run_as_user.or(pod_sc.run_as_user).map(|u| u as u32);
    let gid = sc.run_as_group.or(pod_sc.run_as_group).map(|g| g as u32);
    let mut groups: Vec<u32> = pod_sc
        .supplemental_groups
        .iter()
        .flatten()
        .map(|g| *g as u32)
        .collect();
    groups.extend(pod_sc.fs_group.map(|g| g as u32));
    let (mounts, sub_paths) = volume_mounts(pod, c, node, &values)?;
    let res = container_resources(pod, c, node);
    let caps = sc.capabilities.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let cfg = ContainerConfig {
        name: c.name.clone(),
        attempt,
        image: c.image.clone().unwrap_or_default(),
        command: command.collect(),
        args: args.collect(),
        env,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        uid,
        gid,
        supplemental_groups: groups,
        log_path: format!("{}/{attempt}.log", c.name),
        mounts,
        memory_limit: res.memory_limit,
        memory_swap_limit: res.memory_swap_limit,
        unified: res.unified,
        cpu_shares: Some(res.cpu_shares),
        cpu_quota: res.cpu_quota,
        pids_limit: (node.pod_pids_limit > 0).then_some(node.pod_pids_limit),
        oom_score_adj: Some(
            oom_score_adj(pod, c, node.memory_capacity).max(node.min_oom_score_adj),
        ),
        privileged,
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        no_new_privileges: sc.allow_privilege_escalation == Some(false) && !privileged,
        seccomp_runtime_default: sc
            .seccomp_profile
            .as_ref()
            .or(pod_sc.seccomp_profile.as_ref())
            .is_some_and(|p| p.type_ == "RuntimeDefault"),
        capabilities_add: caps.add.unwrap_or_default(),
        capabilities_drop: caps.drop.unwrap_or_default(),
        sysctls: pod_sc
            .sysctls
            .iter()
            .flatten()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect(),
        // Resolved by the worker from the runtime cache (it needs IDs).
        pid_target: None,
        // The device manager's allocation, added by the worker.
        devices: Vec::new(),
        annotations: Default::default(),
        cdi_devices: Vec::new(),
    };
    Ok((cfg, sub_paths))
}

/// Adds a container's device options (upstream's `GetResources`): the
/// device nodes, mounts, annotations and CDI devices; the devices' env
/// before the container's own, which overrides it.
pub fn apply_devices(cfg: &mut ContainerConfig, opts: &crate::devices::allocate::RunOptions) {
    cfg.devices
        .extend(opts.devices.iter().map(|d| kinglet_runtime::Device {
            host_path: d.host_path.clone(),
            container_path: d.container_path.clone(),
            permissions: d.permissions.clone(),
        }));
    let mounts = opts.mounts.iter().map(|m| kinglet_runtime::Mount {
        host_path: m.host_path.clone(),
        container_path: m.container_path.clone(),
        readonly: m.read_only,
        ..Default::default()
    });
    cfg.mounts.splice(0..0, mounts);
    let env = opts.envs.iter().map(|(k, v)| (k.clone(), v.clone()));
    cfg.env.splice(0..0, env);
    for (k, v) in &opts.annotations {
        cfg.annotations
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    cfg.cdi_devices.extend(opts.cdi_devices.iter().cloned());
}

/// The CPU and memory settings of `c` as a start makes them and an
/// in-place resize changes them (the pod passed is the allocated one).
pub fn container_resources(pod: &Pod, c: &Container, node: &NodeFacts) -> ContainerResources {
    let limits = Limits::of(c);
    let swap = super::swap::container_swap(pod, c, &node.swap, node.memory_capacity, limits.memory);
    ContainerResources {
        cpu_shares: limits.cpu_shares,
        cpu_quota: limits.cpu_quota,
        memory_limit: limits.memory,
        memory_swap_limit: swap.memory_swap,
        unified: swap
            .swap_max
            .map(|v| ("memory.swap.max".to_string(), v.to_string()))
            .into_iter()
            .collect(),
    }
}

/// Where the container's termination message is mounted (upstream's
/// default `/dev/termination-log`); empty: none.
pub fn termination_message_path(c: &Container) -> &str {
    c.termination_message_path
        .as_deref()
        .unwrap_or("/dev/termination-log")
}

/// Upstream's `verifyRunAsNonRoot`: with `runAsNonRoot`, the container's
/// user (its `runAsUser`, else the image's) must be known not to be root;
/// an image with no user runs as root.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image: &kinglet_runtime::ImageInfo,
) -> Result<(), ConfigError> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(pod_sc.and_then(|s| s.run_as_non_root));
    if non_root != Some(true) {
        return Ok(());
    }
    let (ns, name) = namespace_and_name(pod);
    let who = format!(
        "(pod: \"{name}_{ns}({})\", container: {})",
        pod_uid(pod),
        c.name
    );
    let run_as = sc
        .and_then(|s| s.run_as_user)
        .or(pod_sc.and_then(|s| s.run_as_user));
    let err = |m: String| Err(ConfigError(m));
    match (run_as, image.uid, image.username.as_str()) {
        (Some(0), _, _) => err(format!(
            "container's runAsUser breaks non-root policy {who}"
        )),
        (Some(_), _, _) => Ok(()),
        (None, None, user) if !user.is_empty() => err(format!(
            "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root {who}"
        )),
        (None, Some(0) | None, _) => err(format!(
            "container has runAsNonRoot and image will run as root {who}"
        )),
        (None, Some(u), _) if !(1..=i64::from(i32::MAX)).contains(&u) => err(format!(
            "container has runAsNonRoot and image has an invalid user id ({u}). (Must be 1-({})): must be between 0 and 2147483647, inclusive {who}",
            i32::MAX
        )),
        (None, Some(_), _) => Ok(()),
    }
}

/// The cgroup limits of a container, as upstream's `kuberuntime` computes
/// them (`MilliCPUToShares`, `MilliCPUToQuota`).
#[derive(Debug, PartialEq, Eq)]
struct Limits {
    /// Bytes; a limit past what the kernel takes saturates (no limit).
    memory: Option<i64>,
    cpu_shares: u64,
    /// Microseconds per 100 ms period.
    cpu_quota: Option<i64>,
}

/// Upstream's `MinShares`, `MaxShares`, `MinQuotaPeriod` (µs), and
/// `QuotaPeriod` (µs).
const MIN_SHARES: u128 = 2;
const MAX_SHARES: u128 = 262_144;
const MIN_QUOTA: u128 = 1000;
const QUOTA_PERIOD: u128 = 100_000;

impl Limits {
    fn of(c: &Container) -> Limits {
        let res = c.resources.clone().unwrap_or_default();
        let lim = res.limits.unwrap_or_default();
        let req = res.requests.unwrap_or_default();
        let memory = lim
            .get("memory")
            .and_then(|q| parse_quantity(&q.0).ok())
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        let cpu_limit = lim.get("cpu").map(|q| quantity_milli(&q.0));
        let cpu_request = req.get("cpu").map(|q| quantity_milli(&q.0)).or(cpu_limit);
        let shares = cpu_request.map_or(MIN_SHARES, |m| m.saturating_mul(1024) / 1000);
        Limits {
            memory,
            cpu_shares: shares.clamp(MIN_SHARES, MAX_SHARES) as u64,
            // A limit of 0 is no limit, as upstream's MilliCPUToQuota.
            cpu_quota: cpu_limit.filter(|m| *m > 0).map(|m| {
                let q = (m.saturating_mul(QUOTA_PERIOD) / 1000).max(MIN_QUOTA);
                i64::try_from(q).unwrap_or(i64::MAX)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::util::{ObjectKind, log_directory, pod_log_dir};

    fn pod(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    const BASE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: edge, uid: u-1, labels: {app: web}}\n";

    #[test]
    fn run_as_non_root_is_checked_against_the_image_user() {
        let p = |sc: &str| {
            pod(&format!(
                "{BASE}spec: {{securityContext: {{runAsNonRoot: true}}, containers: [{{name: a, image: x{sc}}}]}}"
            ))
        };
        let check = |p: &Pod, uid: Option<i64>, user: &str| {
            let img = kinglet_runtime::ImageInfo {
                uid,
                username: user.into(),
                ..Default::default()
            };
            verify_run_as_non_root(p, &p.spec.as_ref().unwrap().containers[0], &img)
                .map_err(|e| e.0)
        };
        let plain = p("");
        assert_eq!(
            check(&plain, None, ""),
            Err("container has runAsNonRoot and image will run as root (pod: \"web_edge(u-1)\", container: a)".into())
        );
        assert!(
            check(&plain, Some(0), "")
                .unwrap_err()
                .contains("image will run as root")
        );
        assert!(
            check(&plain, None, "app")
                .unwrap_err()
                .contains("non-numeric user (app)")
        );
        assert_eq!(check(&plain, Some(1234), ""), Ok(()));
        let explicit = p(", securityContext: {runAsUser: 1000}");
        assert_eq!(check(&explicit, None, ""), Ok(()), "runAsUser decides");
        let root = p(", securityContext: {runAsUser: 0}");
        assert!(
            check(&root, Some(1234), "")
                .unwrap_err()
                .contains("runAsUser breaks non-root policy")
        );
    }

    #[test]
    fn limits_are_clamped_as_upstream() {
        let limits = |lim: &str, req: &str| {
            let p = pod(&format!(
                "{BASE}spec: {{containers: [{{name: a, image: x, resources: {{limits: {{{lim}}}, requests: {{{req}}}}}}}]}}"
            ));
            Limits::of(&p.spec.unwrap().containers[0])
        };
        let l = limits("cpu: 500m, memory: 64Mi", "");
        assert_eq!(
            l,
            Limits {
                memory: Some(64 << 20),
                cpu_shares: 512,
                cpu_quota: Some(50_000)
            }
        );
        // The kernel refuses a quota under 1 ms: upstream's MinQuotaPeriod.
        assert_eq!(limits("cpu: 1m", "").cpu_quota, Some(1000));
        assert_eq!(limits("cpu: 1m", "").cpu_shares, 2);
        // A limit past i64 is no limit, not a negative number.
        assert_eq!(limits("memory: 9Ei", "").memory, Some(i64::MAX));
        assert_eq!(limits("cpu: 1000k", "").cpu_shares, 262_144);
        assert_eq!(limits("", "").cpu_shares, 2);
        assert_eq!(limits("", "cpu: 250m").cpu_shares, 256);
        assert_eq!(limits("cpu: \"0\"", "").cpu_quota, None, "0 is no limit");
        // Past any real CPU count: clamped, never an overflow.
        assert_eq!(limits("cpu: 1e35", "cpu: 1e35").cpu_shares, 262_144);
        assert_eq!(limits("cpu: 1e35", "").cpu_quota, Some(i64::MAX));
    }

    /// Every place that builds a host path from pod data, fed names that
    /// climb or are absolute (as if validation had been skipped): each
    /// result stays under its base, or is refused.
    #[test]
    fn no_path_builder_leaves_its_base() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        let logs = root.join("logs");
        let vols = root.join("volumes");
        std::fs::create_dir_all(&vols).unwrap();
        let node = NodeFacts {
            log_root: logs.display().to_string(),
            volume_root: vols.display().to_string(),
            ..Default::default()
        };
        let hostile = ["../../../../tmp/x", "/tmp/x", "..", ".", "a/../../b", ""];
        for bad in hostile {
            let p = pod(&format!(
                "metadata: {{name: {bad:?}, namespace: {bad:?}, uid: {bad:?}}}\nspec: {{containers: [{{name: {bad:?}, image: x, env: [{{name: D, value: {bad:?}}}], volumeMounts: [{{name: v, mountPath: /v, subPathExpr: '$(D)'}}, {{name: v, mountPath: /w, subPath: {bad:?}}}]}}], volumes: [{{name: v, emptyDir: {{}}}}, {{name: {bad:?}, emptyDir: {{}}}}]}}"
            ));
            let dir = log_directory(&p, &node.log_root);
            assert!(
                std::path::Path::new(&dir).parent() == Some(logs.as_path()),
                "{bad:?}: log dir {dir}"
            );
            if let Some(d) = pod_log_dir(&p, &node) {
                assert_eq!(d.parent(), Some(logs.as_path()), "{bad:?}");
            }
            match volume_paths(&p, &node) {
                Ok(v) => {
                    for (dir, _) in v.values() {
                        assert!(dir.starts_with(&*vols.to_string_lossy()), "{bad:?}: {dir}");
                        assert!(!dir.contains("/../"), "{bad:?}: {dir}");
                    }
                }
                Err(e) => assert!(e.0.contains("not a valid volume name"), "{bad:?}: {e:?}"),
            }
            assert!(
                contained_path(&vols, &[bad, "v"]).is_none(),
                "{bad:?} joined"
            );
        }
        // Sub paths, literal or expanded: refused when they climb, else
        // bound (by the worker, `subpath::prepare`) onto a target in the
        // pod's own dir.
        let p = pod(
            "metadata: {name: p, uid: u1}\nspec: {containers: [{name: c, image: x, env: [{name: D, value: d}], volumeMounts: [{name: v, mountPath: /v}, {name: v, mountPath: /w, subPathExpr: '$(D)/x'}]}], volumes: [{name: v, emptyDir: {}}]}",
        );
        let c = &p.spec.as_ref().unwrap().containers[0];
        let (cfg, subs) = container_config(&p, c, 0, &node, &EnvObjects::default()).unwrap();
        let target = vols.join("u1/.subpaths/v/c/1");
        assert_eq!(cfg.mounts[1].host_path, target.display().to_string());
        assert_eq!(
            subs,
            vec![SubPath {
                name: "v".into(),
                volume: vols.join("u1/v"),
                sub: "d/x".into(),
                target
            }]
        );
        for bad in ["../x", "/etc", "a/../../x"] {
            let m: k8s_openapi::api::core::v1::VolumeMount =
                serde_json::from_value(serde_json::json!({"name": "v", "mountPath": "/v"}))
                    .unwrap();
            let e = sub_path(&p, c, 0, &m, "/vol", bad, &node).unwrap_err();
            assert!(e.0.contains("subPath"), "{bad:?}: {e:?}");
        }
    }

    #[test]
    fn env_expansion_and_field_refs() {
        let p = pod(&format!(
            "{BASE}spec:\n  containers:\n  - name: a\n    image: x\n    command: [sh, -c, 'echo $(GREETING) $(POD) $$(LITERAL) $(MISSING)']\n    env:\n    - {{name: POD, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}\n    - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}\n    - {{name: APP, valueFrom: {{fieldRef: {{fieldPath: \"metadata.labels['app']\"}}}}}}\n    - {{name: GREETING, value: 'hi $(POD)'}}\n    - {{name: MEM, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}\n    resources: {{limits: {{memory: 64Mi}}}}\n"
        ));
        let node = NodeFacts {
            node_name: "pi".into(),
            node_ip: "192.0.2.1".into(),
            ..Default::default()
        };
        let (c, _) = container_config(
            &p,
            &p.spec.as_ref().unwrap().containers[0],
            2,
            &node,
            &EnvObjects::default(),
        )
        .unwrap();
        assert_eq!(c.command[2], "echo hi web web $(LITERAL) $(MISSING)");
        let env: BTreeMap<_, _> = c.env.iter().cloned().collect();
        assert_eq!(env["NODE"], "pi");
        assert_eq!(env["APP"], "web");
        assert_eq!(env["MEM"], "64");
        assert_eq!(c.log_path, "a/2.log");
        assert_eq!(c.memory_limit, Some(64 << 20));
        assert_eq!(
            termination_message_path(&p.spec.as_ref().unwrap().containers[0]),
            "/dev/termination-log"
        );
    }

    #[test]
    fn config_errors_like_upstream() {
        let p = pod(&format!(
            "{BASE}spec:\n  containers:\n  - name: a\n    image: x\n    env:\n    - {{name: K, valueFrom: {{configMapKeyRef: {{name: cm, key: k}}}}}}\n"
        ));
        let e = container_config(
            &p,
            &p.spec.as_ref().unwrap().containers[0],
            0,
            &NodeFacts::default(),
            &EnvObjects::default(),
        )
        .unwrap_err();
        assert!(e.0.contains("configmap \"cm\" not found"), "{e:?}");
    }

    #[test]
    fn env_from_configmaps_and_secrets() {
        let p = pod(&format!(
            "{BASE}spec:\n  containers:\n  - name: a\n    image: x\n    envFrom:\n    - {{configMapRef: {{name: cm}}, prefix: CM_}}\n    - {{secretRef: {{name: gone, optional: true}}}}\n    env:\n    - {{name: CM_a, value: overridden}}\n    - {{name: PW, valueFrom: {{secretKeyRef: {{name: s, key: pw}}}}}}\n    - {{name: OPT, valueFrom: {{configMapKeyRef: {{name: cm, key: nokey, optional: true}}}}}}\n    - {{name: REF, value: '$(CM_b)'}}\n"
        ));
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            EnvObjects::refs(c),
            vec![
                (ObjectKind::ConfigMap, "cm".to_string()),
                (ObjectKind::Secret, "gone".to_string()),
                (ObjectKind::Secret, "s".to_string())
            ]
        );
        let data = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        let mut objs = EnvObjects::default();
        objs.0.insert(
            (ObjectKind::ConfigMap, "cm".into()),
            data(&[("a", "1"), ("b", "2"), ("bad key", "x")]),
        );
        objs.0.insert((ObjectKind::Secret, "gone".into()), None);
        objs.0
            .insert((ObjectKind::Secret, "s".into()), data(&[("pw", "hunter2")]));
        let (cfg, _) = container_config(&p, c, 0, &NodeFacts::default(), &objs).unwrap();
        let env: BTreeMap<_, _> = cfg.env.iter().cloned().collect();
        assert_eq!(env["CM_a"], "overridden");
        assert_eq!(env["CM_b"], "2");
        assert_eq!(env["PW"], "hunter2");
        assert_eq!(env["REF"], "2");
        assert!(!env.contains_key("OPT") && !env.contains_key("CM_bad key"));
        objs.0
            .insert((ObjectKind::Secret, "s".into()), data(&[("other", "x")]));
        let e = container_config(&p, c, 0, &NodeFacts::default(), &objs).unwrap_err();
        assert_eq!(e.0, "couldn't find key pw in Secret edge/s");
    }
}
