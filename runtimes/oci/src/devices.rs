//! Host devices given to a container, resolved to the OCI spec's device
//! nodes as containerd's `WithDevices` does: the host node's type, numbers,
//! mode and owner, at the container path asked for; a directory gives every
//! device node in it (not the ones below: containerd skips nested trees
//! such as `/dev/pts` too). Blocking (it stats the host's files): it runs
//! with the bundle, on tokio's blocking pool.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use kinglet_runtime::{Device, RuntimeError};

use crate::spec::DeviceNode;

/// The device nodes `devices` name, or the first one that is not a device.
pub(crate) fn resolve(devices: &[Device]) -> Result<Vec<DeviceNode>, RuntimeError> {
    let mut nodes = Vec::new();
    for d in devices {
        let host = Path::new(&d.host_path);
        let dest = if d.container_path.is_empty() {
            &d.host_path
        } else {
            &d.container_path
        };
        let access = if d.permissions.is_empty() {
            "rwm"
        } else {
            &d.permissions
        };
        let meta = std::fs::metadata(host).map_err(|e| not_a_device(&d.host_path, e))?;
        if meta.is_dir() {
            let entries = std::fs::read_dir(host).map_err(|e| not_a_device(&d.host_path, e))?;
            let mut inside: Vec<_> = entries.filter_map(Result::ok).collect();
            inside.sort_by_key(|e| e.file_name());
            for e in inside {
                // Followed: a symlink to a device counts as the device.
                let Ok(m) = std::fs::metadata(e.path()) else {
                    continue;
                };
                let path = Path::new(dest).join(e.file_name());
                if let Some(n) = node(&m, &path.to_string_lossy(), access) {
                    nodes.push(n);
                }
            }
            continue;
        }
        let why = std::io::Error::other("not a device node");
        nodes.push(node(&meta, dest, access).ok_or_else(|| not_a_device(&d.host_path, why))?);
    }
    Ok(nodes)
}

fn not_a_device(path: &str, e: std::io::Error) -> RuntimeError {
    RuntimeError::Other(format!("device {path}: {e}"))
}

/// The node `meta` describes at `path`; `None` for anything but a
/// character or block device.
pub(crate) fn node(meta: &std::fs::Metadata, path: &str, access: &str) -> Option<DeviceNode> {
    let ft = meta.file_type();
    let kind = if ft.is_char_device() {
        'c'
    } else if ft.is_block_device() {
        'b'
    } else {
        return None;
    };
    let rdev = meta.rdev();
    Some(DeviceNode {
        path: path.to_string(),
        kind,
        major: u64::from(libc::major(rdev)),
        minor: u64::from(libc::minor(rdev)),
        file_mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        access: access.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(host: &str, container: &str, perms: &str) -> Device {
        Device {
            host_path: host.into(),
            container_path: container.into(),
            permissions: perms.into(),
        }
    }

    #[test]
    fn a_char_device_keeps_its_numbers_at_the_container_path() {
        let nodes = resolve(&[dev("/dev/null", "/dev/mine", "rw")]).unwrap();
        assert_eq!(nodes.len(), 1);
        let n = &nodes[0];
        assert_eq!((n.kind, n.major, n.minor), ('c', 1, 3));
        assert_eq!(n.path, "/dev/mine");
        assert_eq!(n.access, "rw");
        let n = &resolve(&[dev("/dev/zero", "", "")]).unwrap()[0];
        assert_eq!(
            (n.path.as_str(), n.minor, n.access.as_str()),
            ("/dev/zero", 5, "rwm")
        );
    }

    #[test]
    fn a_regular_file_or_a_missing_path_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let err = resolve(&[dev(file.to_str().unwrap(), "/dev/f", "")]).unwrap_err();
        assert!(err.to_string().contains("not a device node"), "{err}");
        let err = resolve(&[dev("/dev/no-such-device", "", "")]).unwrap_err();
        assert!(err.to_string().contains("/dev/no-such-device"), "{err}");
    }

    #[test]
    fn a_directory_gives_the_device_nodes_in_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain"), b"").unwrap();
        // A symlink to a device counts as the device (metadata follows it).
        std::os::unix::fs::symlink("/dev/null", dir.path().join("n0")).unwrap();
        let nodes = resolve(&[dev(dir.path().to_str().unwrap(), "/dev/bus", "r")]).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].path, "/dev/bus/n0");
    }
}
