//! The conversions between kinglet's runtime types and CRI's messages,
//! both ways: sandbox and container configs as upstream's `kuberuntime`
//! fills them (labels, annotations, namespaces, DNS, mounts), and the
//! statuses, images and usage CRI answers. Pure: no calls.

use super::*;

/// `nameserver`/`search`/`options` lines of the pod's resolv.conf as CRI's
/// `DNSConfig`.
pub(crate) fn dns_config(resolv: &str) -> proto::DnsConfig {
    let mut d = proto::DnsConfig::default();
    for line in resolv.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => d.servers.extend(words.map(String::from)),
            Some("search") => d.searches.extend(words.map(String::from)),
            Some("options") => d.options.extend(words.map(String::from)),
            _ => {}
        }
    }
    d
}

pub(crate) fn ns_mode(host: bool, private: proto::NamespaceMode) -> i32 {
    if host {
        proto::NamespaceMode::Node as i32
    } else {
        private as i32
    }
}

pub(crate) fn namespace_options(cfg: &SandboxConfig) -> proto::NamespaceOption {
    proto::NamespaceOption {
        network: ns_mode(cfg.host_network, proto::NamespaceMode::Pod),
        // Upstream shares a pod's PID namespace only with
        // shareProcessNamespace; kinglet does not offer it yet.
        pid: ns_mode(cfg.host_pid, proto::NamespaceMode::Container),
        ipc: ns_mode(cfg.host_ipc, proto::NamespaceMode::Pod),
        ..Default::default()
    }
}

/// A container's namespaces: the pod's, and for an ephemeral container
/// with a target the target's PID namespace, as upstream's
/// `namespacesForPod` (only where the PID namespace would be the
/// container's own).
pub(crate) fn container_namespace_options(
    sandbox: &SandboxConfig,
    cfg: &ContainerConfig,
) -> proto::NamespaceOption {
    let mut ns = namespace_options(sandbox);
    if let Some(target) = cfg.pid_target.as_ref()
        && ns.pid == proto::NamespaceMode::Container as i32
    {
        ns.pid = proto::NamespaceMode::Target as i32;
        ns.target_id = target.clone();
    }
    ns
}

pub(crate) fn pod_labels(cfg: &SandboxConfig) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.into(), cfg.pod_name.clone()),
        (POD_NAMESPACE.into(), cfg.namespace.clone()),
        (POD_UID.into(), cfg.pod_uid.clone()),
    ])
}

/// The CRI `PodSandboxConfig` of a pod, as upstream's
/// `generatePodSandboxConfig` builds it.
pub(crate) fn sandbox_config(cfg: &SandboxConfig) -> proto::PodSandboxConfig {
    proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: cfg.pod_name.clone(),
            uid: cfg.pod_uid.clone(),
            namespace: cfg.namespace.clone(),
            attempt: 0,
        }),
        hostname: if cfg.host_network {
            String::new()
        } else {
            cfg.hostname.clone()
        },
        log_directory: cfg.log_directory.clone(),
        dns_config: Some(dns_config(&cfg.resolv_conf)),
        port_mappings: cfg
            .port_mappings
            .iter()
            .map(|p| proto::PortMapping {
                protocol: match p.protocol.as_str() {
                    "udp" => proto::Protocol::Udp as i32,
                    "sctp" => proto::Protocol::Sctp as i32,
                    _ => proto::Protocol::Tcp as i32,
                },
                container_port: p.container_port,
                host_port: p.host_port,
                host_ip: p.host_ip.clone(),
            })
            .collect(),
        labels: pod_labels(cfg),
        annotations: HashMap::new(),
        linux: Some(proto::LinuxPodSandboxConfig {
            cgroup_parent: format!("/{}", cfg.cgroup_parent.trim_start_matches('/')),
            security_context: Some(proto::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(cfg)),
                privileged: cfg.privileged,
                ..Default::default()
            }),
            sysctls: cfg.sysctls.iter().cloned().collect(),
            ..Default::default()
        }),
        windows: None,
    }
}

/// CRI's `ContainerConfig` for `cfg` in `sandbox`.
pub(crate) fn container_config(
    cfg: &ContainerConfig,
    sandbox: &SandboxConfig,
) -> proto::ContainerConfig {
    let mounts = cfg.mounts.iter().map(mount).collect();
    let mut labels = pod_labels(sandbox);
    labels.insert(CONTAINER_NAME.into(), cfg.name.clone());
    let int64 = |v: Option<u32>| {
        v.map(|value| proto::Int64Value {
            value: value as i64,
        })
    };
    proto::ContainerConfig {
        metadata: Some(proto::ContainerMetadata {
            name: cfg.name.clone(),
            attempt: cfg.attempt,
        }),
        image: Some(proto::ImageSpec {
            image: cfg.image.clone(),
            ..Default::default()
        }),
        command: cfg.command.clone(),
        args: cfg.args.clone(),
        working_dir: cfg.working_dir.clone(),
        envs: cfg
            .env
            .iter()
            .map(|(key, value)| proto::KeyValue {
                key: key.clone(),
                value: value.clone().into_bytes(),
            })
            .collect(),
        mounts,
        devices: cfg
            .devices
            .iter()
            .map(|d| proto::Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        labels,
        annotations: cfg.annotations.clone().into_iter().collect(),
        cdi_devices: cfg
            .cdi_devices
            .iter()
            .map(|name| proto::CdiDevice { name: name.clone() })
            .collect(),
        log_path: cfg.log_path.clone(),
        stdin: cfg.stdin,
        stdin_once: cfg.stdin_once,
        tty: cfg.tty,
        linux: Some(proto::LinuxContainerConfig {
            resources: Some(proto::LinuxContainerResources {
                // At creation an unset limit is left out, as upstream.
                cpu_period: if cfg.cpu_quota.is_some() { 100_000 } else { 0 },
                cpu_quota: cfg.cpu_quota.unwrap_or(0),
                cpu_shares: cfg.cpu_shares.unwrap_or(0) as i64,
                oom_score_adj: cfg.oom_score_adj.unwrap_or(0) as i64,
                ..linux_resources(&cfg.resources())
            }),
            security_context: Some(proto::LinuxContainerSecurityContext {
                capabilities: Some(proto::Capability {
                    add_capabilities: cfg.capabilities_add.clone(),
                    drop_capabilities: cfg.capabilities_drop.clone(),
                    ..Default::default()
                }),
                privileged: cfg.privileged,
                namespace_options: Some(container_namespace_options(sandbox, cfg)),
                run_as_user: int64(cfg.uid),
                run_as_group: int64(cfg.gid),
                supplemental_groups: cfg.supplemental_groups.iter().map(|g| *g as i64).collect(),
                readonly_rootfs: cfg.readonly_rootfs,
                no_new_privs: cfg.no_new_privileges,
                seccomp: cfg.seccomp_runtime_default.then(|| proto::SecurityProfile {
                    profile_type: proto::security_profile::ProfileType::RuntimeDefault as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// One mount as CRI takes it (an image volume names its image).
pub(crate) fn mount(m: &kinglet_runtime::Mount) -> proto::Mount {
    use kinglet_runtime::Propagation;
    let propagation = match m.propagation {
        Propagation::Private => proto::MountPropagation::PropagationPrivate,
        Propagation::HostToContainer => proto::MountPropagation::PropagationHostToContainer,
        Propagation::Bidirectional => proto::MountPropagation::PropagationBidirectional,
    };
    proto::Mount {
        container_path: m.container_path.clone(),
        host_path: m.host_path.clone(),
        readonly: m.readonly,
        image: (!m.image.is_empty()).then(|| proto::ImageSpec {
            image: m.image.clone(),
            ..Default::default()
        }),
        image_sub_path: m.image_sub_path.clone(),
        propagation: propagation as i32,
        ..Default::default()
    }
}

/// A sandbox's interfaces from CRI's `NetworkUsage`, the default first.
pub(crate) fn interfaces(n: proto::NetworkUsage) -> Vec<kinglet_runtime::InterfaceUsage> {
    let v = |x: Option<proto::UInt64Value>| x.map_or(0, |x| x.value);
    n.default_interface
        .into_iter()
        .chain(n.interfaces)
        .map(|i| kinglet_runtime::InterfaceUsage {
            name: i.name,
            rx_bytes: v(i.rx_bytes),
            rx_errors: v(i.rx_errors),
            tx_bytes: v(i.tx_bytes),
            tx_errors: v(i.tx_errors),
        })
        .collect()
}

pub(crate) fn convert_status(
    s: proto::ContainerStatus,
    pod_uid: String,
    sandbox_id: String,
) -> ContainerStatus {
    let state = match proto::ContainerState::try_from(s.state) {
        Ok(proto::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(proto::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(proto::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    // The termination message file is the kubelet's to read.
    let message = s.message;
    let meta = s.metadata.unwrap_or_default();
    ContainerStatus {
        id: s.id,
        sandbox_id,
        pod_uid,
        name: meta.name,
        attempt: meta.attempt,
        image: s.image.map(|i| i.image).unwrap_or_default(),
        image_id: if s.image_id.is_empty() {
            s.image_ref.clone()
        } else {
            s.image_id
        },
        image_ref: s.image_ref,
        state,
        created_at: s.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason,
        message,
        log_path: s.log_path,
        pid: 0,
    }
}

pub(crate) fn image_failure(image: &str, s: tonic::Status) -> ImageFailure {
    let msg = s.message().to_string();
    // containerd checks references with the same grammar upstream's kubelet
    // checks before pulling.
    let reason = if msg.contains("invalid reference format") {
        WaitingReason::InvalidImageName
    } else {
        WaitingReason::ErrImagePull
    };
    ImageFailure {
        reason,
        message: if reason == WaitingReason::InvalidImageName {
            format!("Failed to apply default image tag {image:?}: {msg}")
        } else {
            msg
        },
    }
}

pub(crate) fn image_info(i: proto::Image) -> ImageInfo {
    ImageInfo {
        id: i.id,
        repo_tags: i.repo_tags,
        repo_digests: i.repo_digests,
        size: i.size,
        uid: i.uid.map(|u| u.value),
        username: i.username,
        pinned: i.pinned,
    }
}

/// CRI's `LinuxContainerResources` for a container's CPU and memory (at
/// creation and for an in-place resize). A lifted limit is sent as
/// containerd takes it: a quota of -1, a memory limit of 0 (unset), as
/// upstream's kubelet sends them.
pub fn linux_resources(r: &kinglet_runtime::ContainerResources) -> proto::LinuxContainerResources {
    proto::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: r.cpu_quota.unwrap_or(-1),
        cpu_shares: r.cpu_shares as i64,
        memory_limit_in_bytes: r.memory_limit.unwrap_or(0),
        memory_swap_limit_in_bytes: r.memory_swap_limit.unwrap_or(0),
        unified: r.unified.clone().into_iter().collect(),
        ..Default::default()
    }
}
