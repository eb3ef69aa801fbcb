//! A container's bundle: its root filesystem (an overlay of the image's
//! shared layers, or a flattened copy) and its OCI `config.json`, made from
//! the image's config and the CRI-shaped container config. All of it is
//! blocking filesystem work: the runtime runs it on tokio's blocking pool,
//! never on the async thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kinglet_runtime::{ContainerConfig, RuntimeError, SandboxConfig};

use crate::images::{ImageRecord, ImageStore};
use crate::{SandboxMeta, rt_err, spec};

/// The parts of an image config a container starts from.
#[derive(Debug, Default)]
pub(crate) struct ImageDefaults {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
    pub stop_signal: String,
}

/// Everything one bundle is made from (owned: it moves to a blocking task).
pub(crate) struct BundleInput {
    pub store: Arc<ImageStore>,
    pub id: String,
    /// `containers/<id>`.
    pub dir: PathBuf,
    /// `sandboxes/<sandbox id>`.
    pub sandbox_dir: PathBuf,
    pub sandbox_meta: Option<SandboxMeta>,
    pub image: ImageRecord,
    /// The images of image mounts, by mount index.
    pub image_mounts: Vec<(usize, ImageRecord)>,
    pub cfg: ContainerConfig,
    pub sandbox: SandboxConfig,
    /// The PID namespace to join (an ephemeral container's target's).
    pub join_pid: Option<PathBuf>,
    /// Where CDI specs are, lowest priority first.
    pub cdi_spec_dirs: Vec<PathBuf>,
}

/// What a made bundle needs remembered.
pub(crate) struct Made {
    pub overlay: bool,
    pub stop_signal: i32,
    /// Why its process could not be exec'd (see [`preflight`]).
    pub start_error: Option<String>,
}

/// Makes the bundle in `input.dir`; on failure the caller tears it down.
pub(crate) fn make(input: &BundleInput) -> Result<Made, RuntimeError> {
    let dir = &input.dir;
    let cfg = &input.cfg;
    let overlay = prepare_rootfs(&input.store, dir, &input.image)?;
    let mut mounts = mounts(input)?;
    let mut cdi = devices(cfg, &input.cdi_spec_dirs)?;
    mounts.append(&mut cdi.mounts);
    let ic = image_config(&input.store, &input.image);
    let mut env = environment(&ic, cfg);
    env.append(&mut cdi.env);
    let (uid, gid) = match (cfg.uid, cfg.gid) {
        (Some(u), g) => (u, g.unwrap_or(0)),
        (None, g) => {
            let (u, ig) = resolve_user(&ic.user, &dir.join("rootfs"));
            (u, g.unwrap_or(ig))
        }
    };
    let args = merge_args(&ic, &cfg.command, &cfg.args);
    if args.is_empty() {
        return Err(RuntimeError::Other(
            "no command specified: the image has neither Entrypoint nor Cmd".into(),
        ));
    }
    let cwd = if cfg.working_dir.is_empty() {
        ic.working_dir.clone()
    } else {
        cfg.working_dir.clone()
    };
    let smeta = input.sandbox_meta.as_ref();
    let netns = smeta.and_then(|m| m.netns.clone());
    let sandbox = &input.sandbox;
    let oci = spec::ContainerConfig {
        args,
        env,
        cwd,
        uid,
        gid,
        additional_gids: cfg.supplemental_groups.clone(),
        hostname: sandbox.hostname.clone(),
        rootfs: dir.join("rootfs"),
        readonly_rootfs: cfg.readonly_rootfs,
        cgroups_path: format!(
            "{}/{}",
            sandbox.cgroup_parent.trim_end_matches('/'),
            input.id
        ),
        memory_limit: cfg.memory_limit,
        memory_swap_limit: cfg.memory_swap_limit,
        unified: cfg.unified.clone(),
        cpu_shares: cfg.cpu_shares,
        cpu_quota: cfg.cpu_quota,
        cpu_period: cfg.cpu_quota.map(|_| 100_000),
        pids_limit: cfg.pids_limit,
        oom_score_adj: cfg.oom_score_adj,
        privileged: cfg.privileged,
        no_new_privileges: cfg.no_new_privileges,
        capabilities_add: cfg.capabilities_add.clone(),
        capabilities_drop: cfg.capabilities_drop.clone(),
        host_network: netns.is_none(),
        join_network: netns,
        host_pid: sandbox.host_pid,
        host_ipc: sandbox.host_ipc,
        host_uts: sandbox.host_network,
        join_ipc: smeta.and_then(|m| m.ipc.clone()),
        join_pid: input.join_pid.clone(),
        join_uts: smeta.and_then(|m| m.uts.clone()),
        mounts,
        sysctls: cfg.sysctls.clone(),
        devices: cdi.devices,
        annotations: cfg.annotations.clone(),
        hooks: cdi.hooks,
    };
    let spec = serde_json::to_vec(&oci.to_spec()).map_err(|e| rt_err("spec", e))?;
    write_private(&dir.join("config.json"), &spec).map_err(|e| rt_err("config.json", e))?;
    Ok(Made {
        overlay,
        stop_signal: parse_signal(&ic.stop_signal),
        start_error: preflight(dir).err().map(|e| e.to_string()),
    })
}

/// Writes a file only root can read: a spec carries the container's
/// environment, Secrets included.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)
}

/// The pod's resolv.conf and hostname files and the container's mounts
/// (the kubelet's files among them; image mounts read-only from the
/// store).
fn mounts(input: &BundleInput) -> Result<Vec<spec::BindMount>, RuntimeError> {
    let (sandbox_dir, dir, cfg) = (&input.sandbox_dir, &input.dir, &input.cfg);
    let mut mounts: Vec<spec::BindMount> = ["resolv.conf", "hostname"]
        .into_iter()
        .map(|f| spec::BindMount {
            source: sandbox_dir.join(f),
            destination: format!("/etc/{f}"),
            readonly: false,
            propagation: Default::default(),
        })
        .collect();
    for (i, m) in cfg.mounts.iter().enumerate() {
        let image = input.image_mounts.iter().find(|(n, _)| *n == i);
        let (source, readonly) = match image {
            Some((_, img)) => {
                let at = dir.join("image-volumes").join(i.to_string());
                let root = image_source(&input.store, img, &at)?;
                (contained(&root, &m.image_sub_path)?, true)
            }
            None => (host_source(&m.host_path)?, m.readonly),
        };
        mounts.push(spec::BindMount {
            source,
            destination: m.container_path.clone(),
            readonly,
            propagation: m.propagation,
        });
    }
    Ok(mounts)
}

/// The container's devices: those given by host path, then what its CDI
/// devices inject (their nodes after the others, with their env, mounts
/// and hooks).
fn devices(
    cfg: &ContainerConfig,
    cdi_dirs: &[PathBuf],
) -> Result<crate::cdi::Injected, RuntimeError> {
    let dirs: Vec<&Path> = cdi_dirs.iter().map(PathBuf::as_path).collect();
    let mut cdi = crate::cdi::inject(&cfg.cdi_devices, &dirs)?;
    let mut nodes = crate::devices::resolve(&cfg.devices)?;
    nodes.append(&mut cdi.devices);
    cdi.devices = nodes;
    Ok(cdi)
}

/// A bind mount's source on the host, made a directory if missing, as
/// containerd's CRI makes it (a device plugin's mount, a hostPath of no
/// type).
fn host_source(path: &str) -> Result<PathBuf, RuntimeError> {
    let p = PathBuf::from(path);
    if std::fs::symlink_metadata(&p).is_err() {
        std::fs::create_dir_all(&p).map_err(|e| rt_err(&format!("mount source {path}"), e))?;
    }
    Ok(p)
}

/// An image's filesystem for an image mount: its only layer as it is, an
/// overlay of its layers without an upper dir (read-only) at `at`, or a
/// copy there where overlayfs is missing.
fn image_source(
    store: &ImageStore,
    image: &ImageRecord,
    at: &Path,
) -> Result<PathBuf, RuntimeError> {
    std::fs::create_dir_all(at).map_err(|e| rt_err("image volume", e))?;
    if !store.uses_overlay() {
        store
            .flatten(image, at)
            .map_err(|e| rt_err("image volume copy", e))?;
        return Ok(at.to_path_buf());
    }
    let mut lowers = store
        .layer_dirs(image)
        .map_err(|e| rt_err("image volume layers", e))?;
    lowers.reverse();
    match lowers.len() {
        0 => Ok(at.to_path_buf()),
        1 => Ok(lowers.remove(0)),
        _ => {
            let list: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
            let data = std::ffi::CString::new(format!("lowerdir={}", list.join(":")))
                .map_err(|e| rt_err("overlay options", e))?;
            rustix::mount::mount(
                "overlay",
                at,
                "overlay",
                rustix::mount::MountFlags::RDONLY,
                Some(data.as_c_str()),
            )
            .map_err(|e| rt_err("image volume overlay", e))?;
            Ok(at.to_path_buf())
        }
    }
}

/// `root/sub`, refused when `sub` (after the image's own symlinks) leaves
/// `root` or does not exist, as CRI asks of image sub paths.
fn contained(root: &Path, sub: &str) -> Result<PathBuf, RuntimeError> {
    if sub.is_empty() {
        return Ok(root.to_path_buf());
    }
    let base = std::fs::canonicalize(root).map_err(|e| rt_err("image volume", e))?;
    let p = std::fs::canonicalize(root.join(sub.trim_start_matches('/')))
        .map_err(|e| RuntimeError::Other(format!("image volume sub path {sub:?}: {e}")))?;
    if !p.starts_with(&base) {
        return Err(RuntimeError::Other(format!(
            "image volume sub path {sub:?} leaves the image"
        )));
    }
    Ok(p)
}

/// The image's environment overridden by the pod's, with a default `PATH`
/// as containerd adds one.
fn environment(ic: &ImageDefaults, cfg: &ContainerConfig) -> Vec<String> {
    let mut env: Vec<(String, String)> = ic
        .env
        .iter()
        .filter_map(|e| {
            e.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    for (k, v) in &cfg.env {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.insert(
            0,
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
        );
    }
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The root filesystem: an overlay of the image's layers, or a copy.
fn prepare_rootfs(
    store: &ImageStore,
    dir: &Path,
    image: &ImageRecord,
) -> Result<bool, RuntimeError> {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).map_err(|e| rt_err("rootfs", e))?;
    if !store.uses_overlay() {
        store
            .flatten(image, &rootfs)
            .map_err(|e| rt_err("rootfs copy", e))?;
        return Ok(false);
    }
    let upper = dir.join("upper");
    let work = dir.join("work");
    std::fs::create_dir_all(&upper).map_err(|e| rt_err("upper", e))?;
    std::fs::create_dir_all(&work).map_err(|e| rt_err("work", e))?;
    let mut lowers: Vec<String> = store
        .layer_dirs(image)
        .map_err(|e| rt_err("layers", e))?
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    lowers.reverse();
    if lowers.is_empty() {
        return Ok(false);
    }
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowers.join(":"),
        upper.display(),
        work.display()
    );
    let data = std::ffi::CString::new(data).map_err(|e| rt_err("overlay options", e))?;
    rustix::mount::mount(
        "overlay",
        &rootfs,
        "overlay",
        rustix::mount::MountFlags::empty(),
        Some(data.as_c_str()),
    )
    .map_err(|e| rt_err("overlay mount", e))?;
    Ok(true)
}

/// The kernel's `MAX_ARG_STRLEN`: one argument or environment string
/// longer than this makes `execve` fail with E2BIG.
const MAX_ARG_STRLEN: usize = 32 * 4096;

/// A start `execve` would refuse, in runc's words (containerd's
/// `StartError` message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StartRefused {
    #[error("the container's config.json is unreadable")]
    Unreadable,
    #[error("no command specified")]
    NoCommand,
    #[error("exec: {0:?}: argument list too long")]
    TooLong(String),
    #[error("exec: {0:?}: stat {0}: no such file or directory")]
    NoFile(String),
    #[error("exec: {0:?}: executable file not found in $PATH")]
    NotInPath(String),
}

/// What `execve` in the container would refuse, checked once the bundle is
/// made: an argument list too long, an executable that is not there. The
/// container's init reports the first as an exit 255 with an empty log and
/// libcontainer refuses the second at create in words of its own; kinglet
/// reports both at the start, as containerd does (`StartError`).
pub(crate) fn preflight(dir: &Path) -> Result<(), StartRefused> {
    let spec: serde_json::Value = std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(StartRefused::Unreadable)?;
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let args = strings(&spec["process"]["args"]);
    let env = strings(&spec["process"]["env"]);
    let arg0 = args.first().ok_or(StartRefused::NoCommand)?;
    // SAFETY: sysconf has no preconditions.
    let arg_max = usize::try_from(unsafe { libc::sysconf(libc::_SC_ARG_MAX) }).unwrap_or(0);
    let total: usize = args.iter().chain(&env).map(|s| s.len() + 1 + 8).sum();
    if args.iter().chain(&env).any(|s| s.len() >= MAX_ARG_STRLEN) || arg_max > 0 && total > arg_max
    {
        return Err(StartRefused::TooLong(arg0.clone()));
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    let cwd = spec["process"]["cwd"].as_str().unwrap_or("/");
    let candidates: Vec<String> = if arg0.contains('/') {
        vec![if arg0.starts_with('/') {
            arg0.clone()
        } else {
            format!("{cwd}/{arg0}")
        }]
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| format!("{d}/{arg0}"))
            .collect()
    };
    // A command in a volume (a script from a ConfigMap, a binary an init
    // container left in an emptyDir) is not in the rootfs: the mounts are
    // not made yet, so such a command is not checked here.
    let mounted: Vec<String> = spec["mounts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["destination"].as_str())
                .map(|d| d.trim_end_matches('/').to_string())
                .collect()
        })
        .unwrap_or_default();
    let in_volume = |c: &str| {
        mounted
            .iter()
            .any(|m| !m.is_empty() && (c == m || c.starts_with(&format!("{m}/"))))
    };
    let rootfs = dir.join("rootfs");
    if candidates
        .iter()
        .any(|c| in_volume(c) || executable_in(&rootfs, c))
    {
        return Ok(());
    }
    Err(if arg0.contains('/') {
        StartRefused::NoFile(arg0.clone())
    } else {
        StartRefused::NotInPath(arg0.clone())
    })
}

/// Whether `path` names an executable regular file inside `rootfs`,
/// resolved with the rootfs as `/` (symlinks included, never out of it).
fn executable_in(rootfs: &Path, path: &str) -> bool {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let Ok(root) = rustix::fs::open(
        rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let Ok(fd) = rustix::fs::openat2(
        &root,
        path.trim_start_matches('/'),
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT,
    ) else {
        return false;
    };
    rustix::fs::fstat(&fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
            && st.st_mode & 0o111 != 0
    })
}

/// Unmounts the rootfs and the image volumes, and removes the container's
/// directory.
pub(crate) fn teardown(dir: &Path) {
    let rootfs = dir.join("rootfs");
    let _ = rustix::mount::unmount(&rootfs, rustix::mount::UnmountFlags::DETACH);
    for e in std::fs::read_dir(dir.join("image-volumes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = rustix::mount::unmount(e.path(), rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The image config's `User`.
pub(crate) fn image_user(store: &ImageStore, image: &ImageRecord) -> String {
    image_config(store, image).user
}

/// The image config's Entrypoint, Cmd, Env, WorkingDir, User, StopSignal.
fn image_config(store: &ImageStore, image: &ImageRecord) -> ImageDefaults {
    let Ok(raw) = store.read_blob(&image.id) else {
        return ImageDefaults::default();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&raw) else {
        return ImageDefaults::default();
    };
    let c = &v["config"];
    let strings = |x: &serde_json::Value| -> Vec<String> {
        x.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    ImageDefaults {
        entrypoint: strings(&c["Entrypoint"]),
        cmd: strings(&c["Cmd"]),
        env: strings(&c["Env"]),
        working_dir: c["WorkingDir"].as_str().unwrap_or("").to_string(),
        user: c["User"].as_str().unwrap_or("").to_string(),
        stop_signal: c["StopSignal"].as_str().unwrap_or("").to_string(),
    }
}

/// The process to run, as the kubelet and containerd merge them: a pod
/// `command` replaces the Entrypoint (and drops the Cmd), pod `args`
/// replace the Cmd.
pub(crate) fn merge_args(
    image: &ImageDefaults,
    command: &[String],
    args: &[String],
) -> Vec<String> {
    let mut out = if command.is_empty() {
        image.entrypoint.clone()
    } else {
        command.to_vec()
    };
    if !args.is_empty() {
        out.extend_from_slice(args);
    } else if command.is_empty() {
        out.extend(image.cmd.iter().cloned());
    }
    out
}

/// The image's `User` (`uid[:gid]` or names from the rootfs's passwd and
/// group files) as numbers; root when unset or unknown.
pub(crate) fn resolve_user(user: &str, rootfs: &Path) -> (u32, u32) {
    if user.is_empty() {
        return (0, 0);
    }
    let (u, g) = user
        .split_once(':')
        .map_or((user, None), |(u, g)| (u, Some(g)));
    let lookup = |file: &str, name: &str| -> Option<(u32, u32)> {
        let text = std::fs::read_to_string(rootfs.join(file)).ok()?;
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name) && f.len() > 3)
                .then(|| (f[2].parse().unwrap_or(0), f[3].parse().unwrap_or(0)))
        })
    };
    let (uid, pgid) = match u.parse::<u32>() {
        Ok(n) => (n, lookup("etc/passwd", u).map_or(n, |x| x.1)),
        Err(_) => lookup("etc/passwd", u).unwrap_or((0, 0)),
    };
    let gid = match g {
        Some(g) => g
            .parse()
            .unwrap_or_else(|_| lookup("etc/group", g).map_or(0, |x| x.0)),
        None => pgid,
    };
    (uid, gid)
}

/// A STOPSIGNAL as images write it (`SIGQUIT`, `QUIT`, `3`); 0 when
/// absent or unknown, meaning SIGTERM.
pub(crate) fn parse_signal(s: &str) -> i32 {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        return if (1..=64).contains(&n) { n } else { 0 };
    }
    let name = s.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        "STOP" => libc::SIGSTOP,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals_as_images_write_them() {
        assert_eq!(parse_signal("SIGQUIT"), libc::SIGQUIT);
        assert_eq!(parse_signal("usr1"), libc::SIGUSR1);
        assert_eq!(parse_signal("9"), 9);
        assert_eq!(parse_signal(""), 0);
        assert_eq!(parse_signal("SIGNOPE"), 0);
        assert_eq!(parse_signal("99"), 0);
    }

    #[test]
    fn command_and_args_merge_like_upstream() {
        let img = ImageDefaults {
            entrypoint: vec!["/ep".into()],
            cmd: vec!["c1".into()],
            ..Default::default()
        };
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(merge_args(&img, &[], &[]), s(&["/ep", "c1"]));
        assert_eq!(merge_args(&img, &[], &s(&["a"])), s(&["/ep", "a"]));
        assert_eq!(merge_args(&img, &s(&["/x"]), &[]), s(&["/x"]));
        assert_eq!(merge_args(&img, &s(&["/x"]), &s(&["a"])), s(&["/x", "a"]));
    }

    #[test]
    fn users_resolve_from_the_rootfs() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(
            d.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(d.path().join("etc/group"), "staff:x:50:\n").unwrap();
        assert_eq!(resolve_user("", d.path()), (0, 0));
        assert_eq!(resolve_user("app", d.path()), (1000, 1001));
        assert_eq!(resolve_user("1000", d.path()), (1000, 1000));
        assert_eq!(resolve_user("app:staff", d.path()), (1000, 50));
        assert_eq!(resolve_user("42:7", d.path()), (42, 7));
    }

    #[test]
    fn preflight_finds_what_exec_would_refuse() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("rootfs/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("sh"), "#!").unwrap();
        std::fs::set_permissions(
            bin.join("sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(bin.join("data"), "x").unwrap();
        let check = |args: serde_json::Value| {
            let spec = serde_json::json!({
                "process": {"args": args, "env": ["PATH=/bin"], "cwd": "/"},
                "mounts": [{"destination": "/scripts", "type": "bind", "source": "/x"}],
            });
            std::fs::write(d.path().join("config.json"), spec.to_string()).unwrap();
            preflight(d.path()).map_err(|e| e.to_string())
        };
        assert_eq!(check(serde_json::json!(["sh", "-c", "true"])), Ok(()));
        assert_eq!(check(serde_json::json!(["/bin/sh"])), Ok(()));
        assert_eq!(
            check(serde_json::json!(["nope"])),
            Err("exec: \"nope\": executable file not found in $PATH".into())
        );
        assert_eq!(
            check(serde_json::json!(["/no/such/tool"])),
            Err("exec: \"/no/such/tool\": stat /no/such/tool: no such file or directory".into())
        );
        assert!(
            check(serde_json::json!(["data"])).is_err(),
            "not executable"
        );
        // In a volume: the mounts are not made yet; exec decides.
        assert_eq!(check(serde_json::json!(["/scripts/run.sh"])), Ok(()));
        let long = "x".repeat(MAX_ARG_STRLEN);
        assert_eq!(
            check(serde_json::json!(["sh", long])),
            Err("exec: \"sh\": argument list too long".into())
        );
    }

    #[test]
    fn the_pod_environment_overrides_the_image() {
        let ic = ImageDefaults {
            env: vec!["A=1".into(), "PATH=/img".into()],
            ..Default::default()
        };
        let cfg = ContainerConfig {
            env: vec![("A".into(), "2".into())],
            ..Default::default()
        };
        assert_eq!(environment(&ic, &cfg), ["PATH=/img", "A=2"]);
        let no_path = environment(&ImageDefaults::default(), &cfg);
        assert!(
            no_path[0].starts_with("PATH=/usr/local/sbin"),
            "{no_path:?}"
        );
    }
}
