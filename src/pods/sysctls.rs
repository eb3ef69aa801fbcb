//! Which `securityContext.sysctls` a pod may set (upstream's
//! `pkg/kubelet/sysctl`): the safe set (namespaced, and on this kernel),
//! plus `allowedUnsafeSysctls` from the config (names or `prefix*`
//! patterns, each known to be namespaced). Anything else, or a net/IPC
//! sysctl in a pod sharing the host's network/IPC namespace, is refused at
//! admission with `SysctlForbidden`.

use std::collections::BTreeMap;

/// The namespace a sysctl lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    Ipc,
    Net,
    Uts,
    User,
}

impl Namespace {
    /// As upstream spells it in messages (`host Net enabled`).
    fn as_str(self) -> &'static str {
        match self {
            Namespace::Ipc => "IPC",
            Namespace::Net => "Net",
            Namespace::Uts => "UTS",
            Namespace::User => "User",
        }
    }
}

/// Upstream's safe sysctls, with the kernel each became namespaced in.
const SAFE: &[(&str, (u32, u32))] = &[
    ("kernel.shm_rmid_forced", (0, 0)),
    ("net.ipv4.ip_local_port_range", (0, 0)),
    ("net.ipv4.tcp_syncookies", (0, 0)),
    ("net.ipv4.ping_group_range", (0, 0)),
    ("net.ipv4.ip_unprivileged_port_start", (0, 0)),
    ("net.ipv4.ip_local_reserved_ports", (3, 16)),
    ("net.ipv4.tcp_keepalive_time", (4, 5)),
    ("net.ipv4.tcp_fin_timeout", (4, 6)),
    ("net.ipv4.tcp_keepalive_intvl", (4, 5)),
    ("net.ipv4.tcp_keepalive_probes", (4, 5)),
    ("net.ipv4.tcp_rmem", (4, 15)),
    ("net.ipv4.tcp_wmem", (4, 15)),
    ("net.ipv4.tcp_slow_start_after_idle", (4, 13)),
    ("net.ipv4.tcp_notsent_lowat", (3, 12)),
];

/// `net.ipv4.conf.eth0/100.rp_filter` for `net/ipv4/conf/eth0.100/rp_filter`.
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

fn namespace_of(name: &str) -> Option<Namespace> {
    const NAMES: &[(&str, Namespace)] = &[
        ("kernel.domainname", Namespace::Uts),
        ("kernel.sem", Namespace::Ipc),
        ("kernel.shmall", Namespace::Ipc),
        ("kernel.shmmax", Namespace::Ipc),
        ("kernel.shmmni", Namespace::Ipc),
        ("kernel.shm_rmid_forced", Namespace::Ipc),
        ("kernel.shm", Namespace::Ipc),
        ("kernel.msgmax", Namespace::Ipc),
        ("kernel.msgmnb", Namespace::Ipc),
        ("kernel.msgmni", Namespace::Ipc),
        ("kernel.msg", Namespace::Ipc),
    ];
    const PREFIXES: &[(&str, Namespace)] = &[
        ("net.", Namespace::Net),
        ("fs.mqueue.", Namespace::Ipc),
        ("user.", Namespace::User),
    ];
    NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .or_else(|| PREFIXES.iter().find(|(p, _)| name.starts_with(p)))
        .map(|(_, ns)| *ns)
}

/// The sysctls this node allows; the default is upstream's safe set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowlist {
    names: BTreeMap<String, Namespace>,
    prefixes: Vec<(String, Namespace)>,
}

/// `major.minor` of the running kernel.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// A sysctl refused, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysctlError {
    #[error("sysctl {0:?} may only end in \"*\"")]
    BadPattern(String),
    #[error("the sysctls {0:?} are not known to be namespaced")]
    NotNamespaced(String),
    #[error("{0:?} not allowlisted")]
    NotAllowed(String),
    #[error("{sysctl:?} not allowed with host {namespace} enabled")]
    HostNamespace {
        sysctl: String,
        namespace: &'static str,
    },
    /// A pod's sysctl refused at admission.
    #[error("forbidden sysctl: {0}")]
    Forbidden(Box<SysctlError>),
}

impl Default for Allowlist {
    fn default() -> Self {
        Self::new(&[]).unwrap_or_else(|_| Allowlist {
            names: BTreeMap::new(),
            prefixes: Vec::new(),
        })
    }
}

impl Allowlist {
    /// The safe set on this kernel plus `unsafe_allowed`; `Err` names the
    /// pattern that cannot be allowed (as upstream refuses to start).
    pub fn new(unsafe_allowed: &[String]) -> Result<Self, SysctlError> {
        Self::with_kernel(unsafe_allowed, kernel_version())
    }

    fn with_kernel(unsafe_allowed: &[String], kernel: (u32, u32)) -> Result<Self, SysctlError> {
        let mut w = Allowlist {
            names: BTreeMap::new(),
            prefixes: Vec::new(),
        };
        let safe = SAFE
            .iter()
            .filter(|(_, since)| kernel >= *since)
            .map(|(n, _)| n.to_string());
        for p in safe.chain(unsafe_allowed.iter().cloned()) {
            let n = normalize(&p);
            let (name, prefixed) = match n.find('*') {
                Some(i) if i == n.len() - 1 => (n[..i].to_string(), true),
                Some(_) => return Err(SysctlError::BadPattern(p)),
                None => (n, false),
            };
            let Some(ns) = namespace_of(&name) else {
                return Err(SysctlError::NotNamespaced(name));
            };
            if prefixed {
                w.prefixes.push((name, ns));
            } else {
                w.names.insert(name, ns);
            }
        }
        Ok(w)
    }

    /// Upstream's check of one sysctl: allowed, and not in a namespace the
    /// pod shares with the host.
    pub fn check(
        &self,
        sysctl: &str,
        host_net: bool,
        host_ipc: bool,
        host_users: bool,
    ) -> Result<(), SysctlError> {
        let s = normalize(sysctl);
        let ns = self.names.get(&s).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| s.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        let Some(ns) = ns else {
            return Err(SysctlError::NotAllowed(s));
        };
        let shared = match ns {
            Namespace::Ipc => host_ipc,
            Namespace::Net => host_net,
            Namespace::User => host_users,
            Namespace::Uts => false,
        };
        if shared {
            return Err(SysctlError::HostNamespace {
                sysctl: s,
                namespace: ns.as_str(),
            });
        }
        Ok(())
    }

    /// The pod's sysctls checked: `Err` is upstream's message.
    pub fn admit(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Result<(), SysctlError> {
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_ref());
        let host_users = spec.host_users.unwrap_or(true);
        for s in sysctls.into_iter().flatten() {
            let host_net = spec.host_network.unwrap_or(false);
            let host_ipc = spec.host_ipc.unwrap_or(false);
            self.check(&s.name, host_net, host_ipc, host_users)
                .map_err(|e| SysctlError::Forbidden(Box::new(e)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<T>(r: Result<T, SysctlError>) -> Result<T, String> {
        r.map_err(|e| e.to_string())
    }

    #[test]
    fn the_safe_set_and_allowed_patterns_as_upstream() {
        let w =
            Allowlist::with_kernel(&["kernel.msg*".into(), "net.core.somaxconn".into()], (6, 1))
                .unwrap();
        assert_eq!(
            msg(w.check("kernel.shm_rmid_forced", false, false, true)),
            Ok(())
        );
        assert_eq!(
            msg(w.check("net.ipv4.tcp_rmem", false, false, true)),
            Ok(())
        );
        assert_eq!(msg(w.check("kernel.msgmax", false, false, true)), Ok(()));
        assert_eq!(
            msg(w.check("net/core/somaxconn", false, false, true)),
            Ok(())
        );
        assert_eq!(
            msg(w.check("kernel.sem", false, false, true)),
            Err("\"kernel.sem\" not allowlisted".to_string())
        );
        assert_eq!(
            msg(w.check("net.ipv4.tcp_syncookies", true, false, true)),
            Err("\"net.ipv4.tcp_syncookies\" not allowed with host Net enabled".to_string())
        );
        assert_eq!(
            msg(w.check("kernel.shm_rmid_forced", false, true, true)),
            Err("\"kernel.shm_rmid_forced\" not allowed with host IPC enabled".to_string())
        );
        let old = Allowlist::with_kernel(&[], (4, 4)).unwrap();
        assert!(
            old.check("net.ipv4.tcp_keepalive_time", false, false, true)
                .is_err()
        );
    }

    #[test]
    fn patterns_that_cannot_be_allowed_are_refused() {
        assert_eq!(
            msg(Allowlist::with_kernel(&["vm.swappiness".into()], (6, 1)).map(|_| ())),
            Err("the sysctls \"vm.swappiness\" are not known to be namespaced".to_string())
        );
        assert!(Allowlist::with_kernel(&["net.*.x".into()], (6, 1)).is_err());
    }

    #[test]
    fn slashes_and_dots_swap_as_upstream() {
        assert_eq!(
            normalize("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(
            normalize("net.ipv4.conf.eno2/100.rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
    }
}
