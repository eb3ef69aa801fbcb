//! What the host is and has: capacity, identity and the free-resource
//! readings behind the pressure conditions. Reads `/proc`, `/sys` and
//! `statvfs` directly; nothing here talks to the API.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Where host files are read from; tests point it at a fake tree.
#[derive(Clone, Debug)]
pub struct HostPaths {
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub etc: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            proc: "/proc".into(),
            sys: "/sys".into(),
            etc: "/etc".into(),
        }
    }
}

/// Static facts about the machine, read once at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineInfo {
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Hugepage size in bytes → bytes reserved as hugepages of that size.
    pub hugepages: BTreeMap<u64, u64>,
    pub kernel_version: String,
    pub os_image: String,
    pub architecture: &'static str,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    /// `SwapTotal`, bytes.
    pub swap_bytes: u64,
}

/// Memory readings from `/proc/meminfo`, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    pub free: u64,
    pub inactive_file: u64,
}

impl MemInfo {
    /// `memory.available` as the eviction manager defines it: capacity minus
    /// the working set, where working set = usage − inactive file pages.
    pub fn available(&self) -> u64 {
        let usage = self.total.saturating_sub(self.free);
        let working_set = usage.saturating_sub(self.inactive_file);
        self.total.saturating_sub(working_set)
    }
}

/// A filesystem's size and free space (`statvfs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// The architecture name Kubernetes uses (`GOARCH`).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

fn read_trimmed(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Parses `/proc/meminfo` text.
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut m = MemInfo::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(key), Some(val)) = (it.next(), it.next()) else {
            continue;
        };
        let bytes = val.parse::<u64>().unwrap_or(0) * 1024;
        match key {
            "MemTotal:" => m.total = bytes,
            "MemFree:" => m.free = bytes,
            "Inactive(file):" => m.inactive_file = bytes,
            _ => {}
        }
    }
    m
}

/// `PRETTY_NAME` from os-release, as upstream reports `osImage`.
pub fn parse_os_release(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.strip_prefix("PRETTY_NAME=")
            .map(|v| v.trim().trim_matches('"').to_string())
    })
}

impl HostPaths {
    pub fn meminfo(&self) -> MemInfo {
        parse_meminfo(&std::fs::read_to_string(self.proc.join("meminfo")).unwrap_or_default())
    }

    /// Hugepages reserved per page size, from `/sys/kernel/mm/hugepages`.
    fn hugepages(&self) -> BTreeMap<u64, u64> {
        let mut out = BTreeMap::new();
        let Ok(dir) = std::fs::read_dir(self.sys.join("kernel/mm/hugepages")) else {
            return out;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(kb) = name
                .strip_prefix("hugepages-")
                .and_then(|s| s.strip_suffix("kB"))
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let n: u64 = read_trimmed(&entry.path().join("nr_hugepages"))
                .parse()
                .unwrap_or(0);
            out.insert(kb * 1024, n * kb * 1024);
        }
        out
    }

    /// Reads the machine's static facts.
    pub fn machine_info(&self) -> MachineInfo {
        let cpus = match sysinfo::System::new() {
            Ok(mut sys) => {
                sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
                sys.cpus().len()
            }
            Err(_) => 0,
        };
        let cpus = match cpus {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        } as u32;
        let os_image = std::fs::read_to_string(self.etc.join("os-release"))
            .ok()
            .and_then(|t| parse_os_release(&t))
            .or_else(|| sysinfo::System::long_os_version().ok())
            .unwrap_or_else(|| "Linux".into());
        let mut system_uuid = read_trimmed(&self.sys.join("class/dmi/id/product_uuid"));
        if system_uuid.is_empty() {
            // Boards without DMI (most ARM SBCs) expose a device-tree serial.
            system_uuid = read_trimmed(&self.proc.join("device-tree/serial-number"))
                .trim_end_matches('\0')
                .to_string();
        }
        MachineInfo {
            cpus,
            memory_bytes: self.meminfo().total,
            hugepages: self.hugepages(),
            kernel_version: sysinfo::System::kernel_version().unwrap_or_default(),
            os_image,
            architecture: go_arch(),
            machine_id: read_trimmed(&self.etc.join("machine-id")),
            system_uuid,
            boot_id: read_trimmed(&self.proc.join("sys/kernel/random/boot_id")),
            swap_bytes: crate::cm::swap::capacity(
                &std::fs::read_to_string(self.proc.join("meminfo")).unwrap_or_default(),
            ),
        }
    }

    /// Processes the kernel allows and those in use, for `pid.available`.
    pub fn pids(&self) -> (u64, u64) {
        let max: u64 = read_trimmed(&self.proc.join("sys/kernel/pid_max"))
            .parse()
            .unwrap_or(32768);
        // The fourth field of loadavg is "running/total" scheduling entities.
        let running = read_trimmed(&self.proc.join("loadavg"))
            .split_whitespace()
            .nth(3)
            .and_then(|f| f.split_once('/'))
            .and_then(|(_, t)| t.parse().ok())
            .unwrap_or(0);
        (max, running)
    }
}

/// `statvfs` of the filesystem holding `path`.
pub fn fs_stats(path: &Path) -> std::io::Result<FsStats> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated string and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    // The field types are 32-bit on some targets (armv7) and 64-bit on others.
    #[allow(clippy::useless_conversion)]
    let stats = FsStats {
        capacity_bytes: u64::from(st.f_blocks) * u64::from(st.f_frsize),
        available_bytes: u64::from(st.f_bavail) * u64::from(st.f_frsize),
        inodes: u64::from(st.f_files),
        inodes_free: u64::from(st.f_ffree),
    };
    Ok(stats)
}

/// The node's addresses: the given IP or one found as upstream does (the
/// hostname's address if it is not loopback, else the address on the
/// default-route interface), then the hostname.
pub fn node_addresses(node_ip: Option<IpAddr>, hostname: &str) -> Vec<(String, String)> {
    let ip = node_ip
        .or_else(|| resolve_non_loopback(hostname))
        .or_else(default_route_ip);
    let mut out = Vec::new();
    if let Some(ip) = ip {
        out.push(("InternalIP".to_string(), ip.to_string()));
    }
    out.push(("Hostname".to_string(), hostname.to_string()));
    out
}

fn resolve_non_loopback(host: &str) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    (host, 0)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// The IPv4 address of the interface that carries the default route.
fn default_route_ip() -> Option<IpAddr> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    let iface = routes.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[1] == "00000000").then(|| f[0].to_string())
    })?;
    interface_ipv4(&iface)
}

fn interface_ipv4(name: &str) -> Option<IpAddr> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
        let ifname = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        // SAFETY: ifa_addr is non-null; its family says how to read it.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if ifname.to_bytes() == name.as_bytes() && family == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(IpAddr::from(
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
            ));
            break;
        }
    }
    // SAFETY: frees the list from getifaddrs exactly once.
    unsafe { libc::freeifaddrs(addrs) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_host() -> (tempfile::TempDir, HostPaths) {
        let dir = tempfile::tempdir().unwrap();
        let p = HostPaths {
            proc: dir.path().join("proc"),
            sys: dir.path().join("sys"),
            etc: dir.path().join("etc"),
        };
        let w = |path: PathBuf, text: &str| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        w(
            p.proc.join("meminfo"),
            "MemTotal:        2048000 kB\nMemFree:          512000 kB\nMemAvailable:    1024000 kB\nInactive(file):   256000 kB\n",
        );
        w(p.proc.join("sys/kernel/random/boot_id"), "b00t\n");
        w(p.proc.join("sys/kernel/pid_max"), "4194304\n");
        w(p.proc.join("loadavg"), "0.00 0.01 0.05 1/321 4242\n");
        w(p.etc.join("machine-id"), "abc123\n");
        w(
            p.etc.join("os-release"),
            "NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        );
        w(p.sys.join("class/dmi/id/product_uuid"), "UUID-1\n");
        w(
            p.sys
                .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
            "4\n",
        );
        w(
            p.sys
                .join("kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"),
            "0\n",
        );
        (dir, p)
    }

    #[test]
    fn reads_machine_facts() {
        let (_d, p) = fake_host();
        let m = p.machine_info();
        assert_eq!(m.memory_bytes, 2048000 * 1024);
        assert_eq!(m.hugepages[&(2 << 20)], 8 << 20);
        assert_eq!(m.hugepages[&(1 << 30)], 0);
        assert_eq!(m.os_image, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(m.machine_id, "abc123");
        assert_eq!(m.system_uuid, "UUID-1");
        assert_eq!(m.boot_id, "b00t");
        assert!(m.cpus >= 1);
        assert_eq!(p.pids(), (4194304, 321));
    }

    #[test]
    fn memory_available_is_capacity_minus_working_set() {
        let (_d, p) = fake_host();
        let m = p.meminfo();
        // usage = total - free; working set = usage - inactive_file.
        let ws = (2048000 - 512000 - 256000) * 1024;
        assert_eq!(m.available(), 2048000 * 1024 - ws);
    }

    #[test]
    fn statvfs_of_a_real_dir() {
        let st = fs_stats(Path::new("/")).unwrap();
        assert!(st.capacity_bytes > 0 && st.available_bytes <= st.capacity_bytes);
        assert!(fs_stats(Path::new("/nonexistent/dir")).is_err());
    }

    #[test]
    fn addresses_prefer_the_given_ip() {
        let a = node_addresses(Some("192.0.2.7".parse().unwrap()), "pi");
        assert_eq!(a[0], ("InternalIP".into(), "192.0.2.7".into()));
        assert_eq!(
            a.last().unwrap(),
            &("Hostname".to_string(), "pi".to_string())
        );
    }
}
