//! The OCI runtime spec (`config.json`) for one container, with the
//! defaults containerd's CRI plugin applies: its capability set, masked and
//! read-only paths, the standard mounts, namespaces, and cgroup resources.

use std::path::PathBuf;

use serde_json::{Value, json};

/// containerd's default capabilities for unprivileged containers.
pub const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

const MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

const READONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// A bind mount into the container.
#[derive(Clone, Debug, PartialEq)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: String,
    pub readonly: bool,
    pub propagation: kinglet_runtime::Propagation,
}

/// Everything the spec is made from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerConfig {
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
    pub hostname: String,
    pub rootfs: PathBuf,
    pub readonly_rootfs: bool,
    /// `kubepods/<qos>/pod<uid>/<container>` (cgroupfs driver).
    pub cgroups_path: String,
    pub memory_limit: Option<i64>,
    pub memory_swap_limit: Option<i64>,
    pub unified: std::collections::BTreeMap<String, String>,
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub pids_limit: Option<i64>,
    pub oom_score_adj: Option<i32>,
    pub privileged: bool,
    pub no_new_privileges: bool,
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    /// Share the host's network namespace (hostNetwork, or no pod network).
    pub host_network: bool,
    pub host_pid: bool,
    pub host_ipc: bool,
    /// Share the host's UTS namespace (hostNetwork pods, as containerd does).
    pub host_uts: bool,
    /// Namespaces to join (`/proc/<pid>/ns/x` or a bind-mounted ns file),
    /// shared between the containers of a pod.
    pub join_network: Option<PathBuf>,
    pub join_ipc: Option<PathBuf>,
    /// An ephemeral container's target's (`/proc/<pid>/ns/pid`).
    pub join_pid: Option<PathBuf>,
    pub join_uts: Option<PathBuf>,
    pub mounts: Vec<BindMount>,
    pub sysctls: Vec<(String, String)>,
    /// Host device nodes made in the container and allowed by its device
    /// cgroup (v1 `devices.allow`, v2 libcontainer's eBPF filter).
    pub devices: Vec<DeviceNode>,
    pub annotations: std::collections::BTreeMap<String, String>,
    /// OCI hooks by name (CDI devices may bring some).
    pub hooks: std::collections::BTreeMap<String, Vec<Value>>,
}

/// A device node as the OCI spec's `linux.devices` names it, with the
/// cgroup access it is allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceNode {
    /// Inside the container.
    pub path: String,
    /// `c` or `b`.
    pub kind: char,
    pub major: u64,
    pub minor: u64,
    /// The permission bits of the host's node.
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// `rwm` or a part of it.
    pub access: String,
}

impl ContainerConfig {
    /// The `config.json` document.
    pub fn to_spec(&self) -> Value {
        let mut spec = json!({
            "ociVersion": "1.0.2",
            "process": self.process(),
            "root": {"path": self.rootfs, "readonly": self.readonly_rootfs},
            "mounts": self.mounts_spec(),
            "linux": self.linux(),
        });
        if !self.annotations.is_empty() {
            spec["annotations"] = json!(self.annotations);
        }
        if !self.hooks.is_empty() {
            spec["hooks"] = json!(self.hooks);
        }
        // The host's UTS namespace keeps the host's name.
        if !self.host_uts {
            spec["hostname"] = json!(self.hostname);
        }
        spec
    }

    /// The capability set: the defaults (every one the process has when
    /// privileged) with the container's adds and drops (none privileged).
    fn capabilities(&self) -> Vec<String> {
        let mut caps: Vec<String> = if self.privileged {
            current_caps()
        } else {
            DEFAULT_CAPS.iter().map(|s| s.to_string()).collect()
        };
        let (adds, drops) = if self.privileged {
            (&[][..], &[][..])
        } else {
            (&self.capabilities_add[..], &self.capabilities_drop[..])
        };
        apply_capability_changes(&mut caps, adds, drops);
        caps
    }

    fn process(&self) -> Value {
        let caps = self.capabilities();
        let mut process = json!({
            "terminal": false,
            "user": {"uid": self.uid, "gid": self.gid, "additionalGids": self.additional_gids},
            "args": self.args,
            "env": self.env,
            "cwd": if self.cwd.is_empty() { "/" } else { &self.cwd },
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": self.no_new_privileges,
        });
        if let Some(adj) = self.oom_score_adj {
            process["oomScoreAdj"] = json!(adj);
        }
        process
    }

    /// The namespaces: new ones, or the sandbox's to join, none where the
    /// pod shares the host's.
    fn namespaces(&self) -> Vec<Value> {
        let ns = |kind: &str, path: &Option<PathBuf>| match path {
            Some(p) => json!({"type": kind, "path": p}),
            None => json!({"type": kind}),
        };
        let mut namespaces = vec![json!({"type": "mount"})];
        if !self.host_pid {
            namespaces.push(ns("pid", &self.join_pid));
        }
        if !self.host_ipc {
            namespaces.push(ns("ipc", &self.join_ipc));
        }
        if !self.host_network {
            namespaces.push(ns("network", &self.join_network));
        }
        if !self.host_uts {
            namespaces.push(ns("uts", &self.join_uts));
        }
        namespaces.push(json!({"type": "cgroup"}));
        namespaces
    }

    /// The standard filesystems (as containerd's defaults), then the bind
    /// mounts with their propagation.
    fn mounts_spec(&self) -> Vec<Value> {
        let rw = if self.privileged { "rw" } else { "ro" };
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", rw]}),
            json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", rw]}),
        ];
        for m in &self.mounts {
            use kinglet_runtime::Propagation;
            let propagation = match m.propagation {
                Propagation::Private => "rprivate",
                Propagation::HostToContainer => "rslave",
                Propagation::Bidirectional => "rshared",
            };
            let opts = ["rbind", propagation, if m.readonly { "ro" } else { "rw" }];
            mounts.push(json!({"destination": m.destination, "type": "bind", "source": m.source, "options": opts}));
        }
        mounts
    }

    /// Devices, memory, CPU and PID limits.
    fn resources(&self) -> Value {
        let mut rules = vec![json!({"allow": false, "access": "rwm"})];
        if self.privileged {
            rules = vec![json!({"allow": true, "access": "rwm"})];
        }
        // After the deny-all: each allocated device is allowed (libcontainer
        // keeps its own defaults, /dev/null and the like, beside them).
        rules.extend(self.devices.iter().map(|d| {
            json!({"allow": true, "type": d.kind.to_string(), "major": d.major, "minor": d.minor, "access": d.access})
        }));
        let mut resources = json!({ "devices": rules });
        if let Some(m) = self.memory_limit {
            resources["memory"] = json!({"limit": m});
        }
        if let Some(m) = self.memory_swap_limit {
            resources["memory"]["swap"] = json!(m);
        }
        if !self.unified.is_empty() {
            resources["unified"] = json!(self.unified);
        }
        let mut cpu = serde_json::Map::new();
        if let Some(s) = self.cpu_shares {
            cpu.insert("shares".into(), json!(s));
        }
        if let Some(q) = self.cpu_quota {
            cpu.insert("quota".into(), json!(q));
            cpu.insert("period".into(), json!(self.cpu_period.unwrap_or(100_000)));
        }
        if !cpu.is_empty() {
            resources["cpu"] = Value::Object(cpu);
        }
        if let Some(p) = self.pids_limit {
            resources["pids"] = json!({"limit": p});
        }
        resources
    }

    fn linux(&self) -> Value {
        let sysctl: serde_json::Map<String, Value> = self
            .sysctls
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let mut linux = json!({
            "namespaces": self.namespaces(),
            "cgroupsPath": self.cgroups_path,
            "resources": self.resources(),
            "sysctl": sysctl,
        });
        if !self.devices.is_empty() {
            linux["devices"] = self
                .devices
                .iter()
                .map(|d| {
                    json!({"path": d.path, "type": d.kind.to_string(), "major": d.major, "minor": d.minor,
                        "fileMode": d.file_mode, "uid": d.uid, "gid": d.gid})
                })
                .collect();
        }
        if !self.privileged {
            linux["maskedPaths"] = json!(MASKED);
            linux["readonlyPaths"] = json!(READONLY);
        }
        // A propagating mount needs the container's root to propagate at
        // least as much, as containerd sets it.
        use kinglet_runtime::Propagation;
        let props: Vec<Propagation> = self.mounts.iter().map(|m| m.propagation).collect();
        if props.contains(&Propagation::Bidirectional) {
            linux["rootfsPropagation"] = json!("shared");
        } else if props.contains(&Propagation::HostToContainer) {
            linux["rootfsPropagation"] = json!("slave");
        }
        linux
    }
}

fn cap_name(c: &str) -> String {
    let up = c.to_ascii_uppercase();
    if up.starts_with("CAP_") {
        up
    } else {
        format!("CAP_{up}")
    }
}

/// Adds and drops as containerd's CRI plugin does (`WithCapabilities`):
/// "ALL" first (added, then dropped), then each named one added, then each
/// dropped, so that `drop: [ALL], add: [NET_BIND_SERVICE]` keeps the one
/// added, and `add: [ALL], drop: [CHOWN]` is all but that one.
fn apply_capability_changes(caps: &mut Vec<String>, adds: &[String], drops: &[String]) {
    let all = |l: &[String]| l.iter().any(|c| cap_name(c) == "CAP_ALL");
    if all(adds) {
        *caps = current_caps();
    }
    if all(drops) {
        caps.clear();
    }
    for c in adds.iter().map(|c| cap_name(c)).filter(|c| c != "CAP_ALL") {
        if !caps.contains(&c) {
            caps.push(c);
        }
    }
    for c in drops.iter().map(|c| cap_name(c)).filter(|c| c != "CAP_ALL") {
        caps.retain(|x| *x != c);
    }
}

/// Every capability this process may pass on (its bounding set), as
/// containerd gives privileged containers (`WithAllCurrentCapabilities`):
/// where kinglet itself runs without some (a restricted host, a container),
/// asking for those would fail the container's start.
fn current_caps() -> Vec<String> {
    static BOUNDING: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let bnd = *BOUNDING.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("CapBnd:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(u64::MAX)
    });
    ALL_CAPS
        .iter()
        .enumerate()
        .filter(|(i, _)| bnd & (1u64 << i) != 0)
        .map(|(_, c)| c.to_string())
        .collect()
}

/// Every capability, in the kernel's order (the index is its number).
const ALL_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

#[cfg(test)]
mod tests {
    #[test]
    fn drop_all_then_add_keeps_the_added_one_as_containerd() {
        let s = |l: &[&str]| l.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let mut caps = s(&["CAP_CHOWN", "CAP_KILL"]);
        super::apply_capability_changes(&mut caps, &s(&["NET_BIND_SERVICE"]), &s(&["ALL"]));
        assert_eq!(caps, s(&["CAP_NET_BIND_SERVICE"]));
        let mut caps = s(&["CAP_KILL"]);
        super::apply_capability_changes(&mut caps, &s(&["ALL"]), &s(&["CHOWN"]));
        assert!(!caps.contains(&"CAP_CHOWN".to_string()));
        assert!(caps.contains(&"CAP_KILL".to_string()));
    }

    use super::*;

    #[test]
    fn a_device_is_made_and_allowed_after_the_deny_all() {
        let c = ContainerConfig {
            devices: vec![DeviceNode {
                path: "/dev/ttyUSB0".into(),
                kind: 'c',
                major: 188,
                minor: 0,
                file_mode: 0o660,
                uid: 0,
                gid: 20,
                access: "rw".into(),
            }],
            ..Default::default()
        };
        let spec = c.to_spec();
        let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}));
        assert_eq!(
            rules[1],
            json!({"allow": true, "type": "c", "major": 188, "minor": 0, "access": "rw"})
        );
        let dev = &spec["linux"]["devices"][0];
        assert_eq!(dev["path"], "/dev/ttyUSB0");
        assert_eq!(dev["gid"], 20);
        assert_eq!(dev["fileMode"], 0o660);
        // The document is a valid OCI spec for libcontainer.
        let parsed: oci_spec::runtime::Spec = serde_json::from_value(spec).unwrap();
        let linux = parsed.linux().as_ref().unwrap();
        assert_eq!(linux.devices().as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_target_pid_namespace_is_joined_by_path() {
        let pid_ns = |c: &ContainerConfig| {
            c.to_spec()["linux"]["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["type"] == "pid")
                .cloned()
        };
        let own = ContainerConfig::default();
        assert_eq!(pid_ns(&own), Some(json!({"type": "pid"})));
        let target = ContainerConfig {
            join_pid: Some("/proc/42/ns/pid".into()),
            ..Default::default()
        };
        assert_eq!(
            pid_ns(&target),
            Some(json!({"type": "pid", "path": "/proc/42/ns/pid"}))
        );
    }

    #[test]
    fn spec_parses_as_oci_and_applies_settings() {
        let c = ContainerConfig {
            args: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
            env: vec!["PATH=/bin".into()],
            uid: 1000,
            gid: 1000,
            rootfs: "/tmp/rootfs".into(),
            cgroups_path: "kubepods/besteffort/podabc/c1".into(),
            memory_limit: Some(64 << 20),
            cpu_quota: Some(50_000),
            pids_limit: Some(100),
            oom_score_adj: Some(1000),
            capabilities_add: vec!["NET_ADMIN".into()],
            capabilities_drop: vec!["MKNOD".into()],
            no_new_privileges: true,
            host_network: true,
            ..Default::default()
        };
        let v = c.to_spec();
        let spec: oci_spec::runtime::Spec = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(
            spec.process().as_ref().unwrap().args().as_ref().unwrap()[2],
            "echo hi"
        );
        let caps = v["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert!(caps.contains(&json!("CAP_NET_ADMIN")) && !caps.contains(&json!("CAP_MKNOD")));
        assert_eq!(v["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(v["linux"]["resources"]["cpu"]["period"], 100_000);
        assert_eq!(v["process"]["oomScoreAdj"], 1000);
        let kinds: Vec<&str> = v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert!(
            !kinds.contains(&"network"),
            "host network must share the host namespace"
        );
        assert!(kinds.contains(&"pid") && kinds.contains(&"mount"));
        assert!(
            v["linux"]["maskedPaths"]
                .as_array()
                .unwrap()
                .contains(&json!("/proc/kcore"))
        );

        let p = ContainerConfig {
            privileged: true,
            ..c
        }
        .to_spec();
        assert!(p["linux"].get("maskedPaths").is_none());
        assert_eq!(
            p["process"]["capabilities"]["bounding"]
                .as_array()
                .unwrap()
                .len(),
            current_caps().len(),
            "every capability kinglet itself has"
        );
    }
}
