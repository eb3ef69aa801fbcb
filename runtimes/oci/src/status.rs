//! What the runtime reports of its containers, as CRI shapes it: the
//! monitor's records joined with the meta kinglet wrote, the files each
//! sandbox and container keeps, and their cgroups' usage.

use super::*;

/// The containers as CRI reports them: the monitor's records joined with
/// the meta kinglet wrote (files under `containers`, read on the blocking
/// pool), and the containers whose start failed before libcontainer saw
/// them.
pub(crate) fn statuses(
    containers: &Path,
    records: Vec<monitor::ContainerRecord>,
) -> Vec<ContainerStatus> {
    let mut out = Vec::new();
    let known: std::collections::HashSet<String> = records.iter().map(|r| r.id.clone()).collect();
    for r in records {
        let dir = containers.join(&r.id);
        let Some(meta) = read_json::<ContainerMeta>(&dir.join("meta.json")) else {
            continue;
        };
        out.push(container_status(r, meta));
    }
    let Ok(rd) = std::fs::read_dir(containers) else {
        return out;
    };
    for e in rd.flatten() {
        let Some(id) = e.file_name().to_str().map(String::from) else {
            continue;
        };
        if known.contains(&id) {
            continue;
        }
        let Some(meta) = read_json::<ContainerMeta>(&e.path().join("meta.json")) else {
            continue;
        };
        let Some((_, at)) = meta.start_error else {
            continue;
        };
        let r = monitor::ContainerRecord {
            id: id.clone(),
            status: "created".into(),
            created_at: at,
            ..Default::default()
        };
        out.push(container_status(r, meta));
    }
    out
}

/// The sandbox's dir with the pod's `resolv.conf` and `hostname` (bound
/// into its containers), and the pod's log dir. Blocking.
pub(crate) fn sandbox_files(dir: &Path, cfg: &SandboxConfig) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|e| rt_err("sandbox dir", e))?;
    std::fs::write(dir.join("resolv.conf"), &cfg.resolv_conf)
        .map_err(|e| rt_err("resolv.conf", e))?;
    std::fs::write(dir.join("hostname"), format!("{}\n", cfg.hostname))
        .map_err(|e| rt_err("hostname", e))?;
    if !cfg.log_directory.is_empty() {
        std::fs::create_dir_all(&cfg.log_directory).map_err(|e| rt_err("log dir", e))?;
    }
    Ok(())
}

/// What kinglet records of a container beside its bundle.
pub(crate) fn container_meta(
    sandbox_id: &str,
    cfg: &ContainerConfig,
    sandbox: &SandboxConfig,
    image: &ImageRecord,
    made: bundle::Made,
) -> ContainerMeta {
    let log_path = Path::new(&sandbox.log_directory).join(&cfg.log_path);
    ContainerMeta {
        sandbox_id: sandbox_id.into(),
        pod_uid: sandbox.pod_uid.clone(),
        name: cfg.name.clone(),
        attempt: cfg.attempt,
        image: cfg.image.clone(),
        image_ref: image
            .repo_digests
            .iter()
            .next()
            .cloned()
            .unwrap_or_else(|| image.id.clone()),
        image_id: image.id.clone(),
        log_path: log_path.display().to_string(),
        overlay: made.overlay,
        stop_signal: made.stop_signal,
        start_error: made
            .start_error
            .map(|m| (m, jiff::Timestamp::now().as_nanosecond() as i64)),
    }
}

/// A container as CRI reports it, from the monitor's record and the meta
/// kinglet wrote; a start refused before the process ran reads as an exit
/// with code 128 and reason `StartError`, as containerd reports it.
pub(crate) fn container_status(
    r: monitor::ContainerRecord,
    meta: ContainerMeta,
) -> ContainerStatus {
    let mut state = match r.status.as_str() {
        "created" => ContainerState::Created,
        "running" => ContainerState::Running,
        "exited" => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    let mut finished_at = r.finished_at.unwrap_or(0);
    let exit_code = r.exit_code.unwrap_or(if state == ContainerState::Exited {
        255
    } else {
        0
    });
    let (reason, exit_code, message) = match (&meta.start_error, state) {
        (Some((msg, at)), ContainerState::Created) => {
            state = ContainerState::Exited;
            finished_at = *at;
            ("StartError", 128, msg.clone())
        }
        (_, ContainerState::Exited) => {
            let reason = match () {
                _ if r.oom_killed => "OOMKilled",
                _ if r.exit_code.is_none() => "Unknown",
                _ if exit_code == 0 => "Completed",
                _ => "Error",
            };
            // The termination message is the kubelet's to read.
            (reason, exit_code, String::new())
        }
        _ => ("", exit_code, String::new()),
    };
    ContainerStatus {
        id: r.id,
        sandbox_id: meta.sandbox_id,
        pod_uid: meta.pod_uid,
        name: meta.name,
        attempt: meta.attempt,
        image: meta.image,
        image_ref: meta.image_ref,
        image_id: meta.image_id,
        state,
        created_at: r.created_at,
        started_at: r.started_at.unwrap_or(0),
        finished_at,
        exit_code,
        reason: reason.into(),
        message,
        log_path: meta.log_path,
        pid: r.pid,
    }
}

/// CPU time and working set of the cgroup at `path` (relative to the
/// hierarchy root), read as upstream's cAdvisor reads them
/// ([`kinglet_runtime::cgstats`]).
pub(crate) fn cgroup_usage(root: &Path, path: &str, id: String, pod_uid: String) -> Usage {
    let (cpu, working_set) =
        kinglet_runtime::cgstats::CgroupStats::read_usage(root, Hierarchy::detect(root), path);
    Usage {
        id,
        pod_uid,
        cpu_usage_core_nanos: cpu,
        memory_working_set_bytes: working_set,
        ..Usage::default()
    }
}
