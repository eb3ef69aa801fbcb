//! kinglet's built-in device source: device classes declared in a file of
//! its own (`--device-config`, `/etc/kinglet/devices.yaml` by default) by
//! path patterns and a resource name, offered as extended resources
//! without any plugin process (each one is another 20–40 MB on a 512 MB
//! board). Devices are followed as they come and go with inotify on their
//! directories (no polling); a device present is healthy. A container given
//! one gets the device node at the same path (`/dev/<name>` for a node
//! outside `/dev`) and access to it in its device cgroup, without being
//! privileged.
//!
//! ```yaml
//! devices:
//! - resource: devices.kinglet.io/serial
//!   paths: ["/dev/ttyUSB*", "/dev/ttyACM*"]
//!   shareCount: 1      # pods one device serves at once (default 1)
//!   permissions: rw    # cgroup access: r, w, m (default rw)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::allocate::{DeviceSpec, RunOptions};
use super::manager::{DeviceManager, Source};
use crate::dirwatch::{DirWatch, Flags};

/// The most a device config file may weigh.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The most devices one share count may multiply a device into.
const MAX_SHARE: u32 = 1000;

/// `--device-config`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    #[serde(default)]
    pub devices: Vec<DeviceClass>,
}

/// One class of devices offered as one resource.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceClass {
    pub resource: String,
    /// Absolute paths; `*` and `?` may appear in the last part only.
    pub paths: Vec<String>,
    #[serde(default = "one")]
    pub share_count: u32,
    #[serde(default = "rw")]
    pub permissions: String,
}

fn one() -> u32 {
    1
}

fn rw() -> String {
    "rw".into()
}

/// A bad device config, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("device config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("device config {path}: larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("device config {path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("device config {path}: field {field}: {message}")]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
}

impl DeviceConfig {
    /// The config at `path`; none (no classes) if the file is missing.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let read = crate::fsutil::read_at_most(path, MAX_CONFIG_BYTES);
        let bytes = match read {
            Ok(Some(b)) => b,
            Ok(None) => return Err(ConfigError::TooLarge { path: path.into() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.into(),
                    source,
                });
            }
        };
        Self::parse(&String::from_utf8_lossy(&bytes), path)
    }

    /// Parses and validates config text (YAML or JSON).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let syntax = |message: String| ConfigError::Syntax {
            path: path.into(),
            message,
        };
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let tree: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| syntax(e.to_string()))?;
        let cfg: DeviceConfig =
            serde_path_to_error::deserialize(&tree).map_err(|e| ConfigError::Field {
                path: path.into(),
                field: e.path().to_string(),
                message: e.into_inner().to_string(),
            })?;
        cfg.validate()
            .map_err(|(field, message)| ConfigError::Field {
                path: path.into(),
                field,
                message,
            })?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let mut seen = BTreeSet::new();
        for (i, c) in self.devices.iter().enumerate() {
            let field = |f: &str| format!("devices[{i}].{f}");
            if let Err(e) = super::validate_resource_name(&c.resource) {
                return Err((field("resource"), e));
            }
            if !seen.insert(&c.resource) {
                return Err((
                    field("resource"),
                    format!("{:?} is declared twice", c.resource),
                ));
            }
            if c.paths.is_empty() {
                return Err((field("paths"), "at least one path is required".into()));
            }
            for (j, p) in c.paths.iter().enumerate() {
                pattern(p).map_err(|e| (field(&format!("paths[{j}]")), e))?;
            }
            if !(1..=MAX_SHARE).contains(&c.share_count) {
                let why = format!("must be between 1 and {MAX_SHARE}");
                return Err((field("shareCount"), why));
            }
            let p = &c.permissions;
            if p.is_empty() || !p.chars().all(|ch| "rwm".contains(ch)) {
                return Err((
                    field("permissions"),
                    format!("{p:?} is not made of r, w and m"),
                ));
            }
        }
        Ok(())
    }
}

/// A path pattern split into its directory and the name pattern.
fn pattern(p: &str) -> Result<(&Path, &str), String> {
    let path = Path::new(p);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(format!("{p:?} names no file"));
    };
    if !path.is_absolute() {
        return Err(format!("{p:?} is not absolute"));
    }
    let dir_str = dir.to_string_lossy();
    if dir_str.contains(['*', '?']) {
        return Err(format!("{p:?}: only its last part may hold * or ?"));
    }
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(format!("{p:?} holds '..'"));
    }
    Ok((dir, name))
}

/// Whether `name` matches `pat` (`*`: any run, `?`: one character).
fn matches(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    // The usual backtracking glob: linear for one star, fine for names.
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The device nodes a class matches now: path → device IDs (one per
/// share). Blocking (it reads directories).
fn scan(class: &DeviceClass) -> BTreeMap<PathBuf, Vec<String>> {
    let mut found = BTreeMap::new();
    for p in &class.paths {
        let Ok((dir, pat)) = pattern(p) else { continue };
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !matches(pat, name) {
                continue;
            }
            let path = dir.join(name);
            // A symlink to a device counts (udev's by-id names).
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !(meta.file_type().is_char_device() || meta.file_type().is_block_device()) {
                continue;
            }
            let id = path.to_string_lossy().into_owned();
            let ids = if class.share_count == 1 {
                vec![id]
            } else {
                (0..class.share_count)
                    .map(|k| format!("{id}:{k}"))
                    .collect()
            };
            found.insert(path, ids);
        }
    }
    found
}

/// One class as the device manager's source: allocation gives the device
/// nodes the IDs stand for.
struct ClassSource {
    permissions: String,
}

impl Source for ClassSource {
    fn allocate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<RunOptions, String>> {
        let mut paths: Vec<&str> = ids.iter().map(|id| device_path(id)).collect();
        paths.dedup();
        let devices = paths
            .into_iter()
            .map(|p| DeviceSpec {
                container_path: container_path(p),
                host_path: p.to_string(),
                permissions: self.permissions.clone(),
            })
            .collect();
        Box::pin(async move {
            Ok(RunOptions {
                devices,
                ..Default::default()
            })
        })
    }
}

/// Where a device appears in the container: at its own path under
/// `/dev`, else as `/dev/<name>` (device nodes live in the container's
/// `/dev`; libcontainer makes them nowhere else).
fn container_path(host: &str) -> String {
    if host.starts_with("/dev/") {
        host.to_string()
    } else {
        let name = Path::new(host).file_name().map(|n| n.to_string_lossy());
        format!("/dev/{}", name.unwrap_or_default())
    }
}

/// The device path an ID stands for (`/dev/i2c-1:3` → `/dev/i2c-1`).
fn device_path(id: &str) -> &str {
    match id.rsplit_once(':') {
        Some((path, k)) if k.bytes().all(|b| b.is_ascii_digit()) => path,
        _ => id,
    }
}

/// Offers `cfg`'s classes to `manager` with the devices there now (before
/// any pod is admitted: a pod that held one before a restart must find it
/// again), and returns what follows them until `shutdown`.
pub async fn start(
    cfg: DeviceConfig,
    manager: Arc<DeviceManager>,
    shutdown: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let flags = Flags::CREATE | Flags::DELETE | Flags::MOVED_FROM | Flags::MOVED_TO | Flags::ATTRIB;
    let dirs: BTreeSet<PathBuf> = cfg
        .devices
        .iter()
        .flat_map(|c| {
            c.paths
                .iter()
                .filter_map(|p| pattern(p).ok().map(|(d, _)| d.to_path_buf()))
        })
        .collect();
    // Watched before the first scan, so nothing made between is missed.
    let mut watches = Vec::new();
    for d in &dirs {
        match DirWatch::new(d, flags) {
            Ok(w) => watches.push(w),
            Err(e) => {
                warn!(dir = %d.display(), "device directory not watched (devices there are found at start only): {e}")
            }
        }
    }
    let generations: Generations = cfg
        .devices
        .iter()
        .map(|c| {
            let source = Arc::new(ClassSource {
                permissions: c.permissions.clone(),
            });
            (c.resource.clone(), manager.serve(&c.resource, source))
        })
        .collect();
    rescan(&cfg, &manager, &generations).await;
    follow(cfg, manager, generations, watches, shutdown)
}

/// Each class's registration with the device manager.
type Generations = BTreeMap<String, u64>;

/// Scans again after each change in the watched directories.
async fn follow(
    cfg: DeviceConfig,
    manager: Arc<DeviceManager>,
    generations: Generations,
    mut watches: Vec<DirWatch>,
    shutdown: CancellationToken,
) {
    while !watches.is_empty() {
        let (result, i) = {
            let changed =
                futures::future::select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                (r, i, _) = changed => (r, i),
            }
        };
        if let Err(e) = result {
            warn!("device directory watch broken: {e}");
            watches.remove(i);
        }
        rescan(&cfg, &manager, &generations).await;
    }
}

async fn rescan(cfg: &DeviceConfig, manager: &DeviceManager, generations: &Generations) {
    let classes = cfg.devices.clone();
    let scans = tokio::task::spawn_blocking(move || {
        classes
            .iter()
            .map(|c| (c.resource.clone(), scan(c)))
            .collect::<Vec<_>>()
    });
    let Ok(scans) = scans.await else { return };
    for (resource, found) in scans {
        let devices: BTreeMap<String, bool> = found
            .values()
            .flatten()
            .map(|id| (id.clone(), true))
            .collect();
        if !devices.is_empty() || manager.knows(&resource) {
            info!(resource = %resource, devices = found.len(), "device class scanned");
        }
        let generation = generations.get(&resource).copied().unwrap_or_default();
        manager.update(&resource, generation, devices);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_the_shell_does_in_one_directory() {
        assert!(matches("ttyUSB*", "ttyUSB0"));
        assert!(matches("ttyUSB*", "ttyUSB"));
        assert!(matches("i2c-?", "i2c-1"));
        assert!(!matches("i2c-?", "i2c-10"));
        assert!(matches("*", "x"));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(!matches("video*", "ttyUSB0"));
    }

    #[test]
    fn a_bad_config_names_the_field() {
        let p = Path::new("/etc/kinglet/devices.yaml");
        let err = |t: &str| DeviceConfig::parse(t, p).unwrap_err().to_string();
        let e = err("devices:\n- resource: serial\n  paths: [/dev/ttyUSB*]\n");
        assert!(e.contains("devices[0].resource"), "{e}");
        let e = err("devices:\n- resource: devices.kinglet.io/serial\n  paths: [/dev/*/x]\n");
        assert!(
            e.contains("devices[0].paths[0]") && e.contains("last part"),
            "{e}"
        );
        let e = err("devices:\n- resource: a.io/b\n  paths: [dev/x]\n");
        assert!(e.contains("not absolute"), "{e}");
        let e = err("devices:\n- resource: a.io/b\n  paths: [/dev/x]\n  shareCount: 0\n");
        assert!(e.contains("devices[0].shareCount"), "{e}");
        let e = err("devices:\n- resource: a.io/b\n  paths: [/dev/x]\n  permissions: rwx\n");
        assert!(e.contains("devices[0].permissions"), "{e}");
        let e = err("devices:\n- resource: a.io/b\n  path: [/dev/x]\n");
        assert!(e.contains("path"), "{e}");
        assert!(DeviceConfig::parse("", p).unwrap().devices.is_empty());
        let ok =
            DeviceConfig::parse("devices:\n- resource: a.io/b\n  paths: [/dev/x*]\n", p).unwrap();
        assert_eq!(
            (
                ok.devices[0].share_count,
                ok.devices[0].permissions.as_str()
            ),
            (1, "rw")
        );
    }

    #[test]
    fn a_scan_finds_device_nodes_only_and_shares_multiply_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.path().join("tty0")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("tty1")).unwrap();
        std::fs::write(dir.path().join("tty2"), b"").unwrap();
        let class = DeviceClass {
            resource: "a.io/tty".into(),
            paths: vec![format!("{}/tty*", dir.path().display())],
            share_count: 2,
            permissions: "rw".into(),
        };
        let found = scan(&class);
        assert_eq!(found.len(), 2);
        let ids = &found[&dir.path().join("tty0")];
        assert_eq!(ids.len(), 2);
        assert!(ids[1].ends_with("/tty0:1"));
        assert_eq!(
            device_path(&ids[1]),
            dir.path().join("tty0").to_str().unwrap()
        );
        assert_eq!(device_path("/dev/i2c-1"), "/dev/i2c-1");
        assert_eq!(container_path("/dev/serial/by-id/x"), "/dev/serial/by-id/x");
        assert_eq!(container_path("/srv/boards/tty0"), "/dev/tty0");
    }
}
