//! The sandbox config (upstream's `kuberuntime_sandbox` and `dns`): the
//! hostname and `/etc/resolv.conf`, the host ports, sysctls, cgroup parent
//! and log dir; and the pod's `/etc/hosts` as the kubelet writes it (the
//! worker mounts it into each container). From the pod spec, the node's
//! facts and the pod's IP alone.

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kinglet_runtime::{PortMapping, SandboxConfig};

use crate::cm::qos::cgroup_parent;
use crate::pods::util::{
    NodeFacts, ephemeral_containers, log_directory, namespace_and_name, pod_uid,
};

/// The sandbox: hostname and DNS as the kubelet gives them.
pub fn sandbox_config(pod: &Pod, node: &NodeFacts) -> SandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let (ns, name) = namespace_and_name(pod);
    let host_network = spec.host_network.unwrap_or(false);
    let (short, domain) = host_and_domain(&spec, &ns, &name, node);
    let hostname = if host_network {
        node.node_name.clone()
    } else if spec.set_hostname_as_fqdn == Some(true) && !domain.is_empty() {
        format!("{short}.{domain}")
    } else {
        short
    };
    SandboxConfig {
        pod_uid: pod_uid(pod),
        resolv_conf: resolv_conf(&spec, &ns, node),
        pod_name: name,
        namespace: ns,
        hostname,
        log_directory: log_directory(pod, &node.log_root),
        host_network,
        host_pid: spec.host_pid.unwrap_or(false),
        host_ipc: spec.host_ipc.unwrap_or(false),
        cgroup_parent: cgroup_parent(pod, &node.pods_cgroup),
        port_mappings: port_mappings(&spec),
        sysctls: spec
            .security_context
            .iter()
            .flat_map(|sc| sc.sysctls.iter().flatten())
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect(),
        pids_limit: (node.pod_pids_limit > 0).then_some(node.pod_pids_limit),
        privileged: has_privileged_container(&spec),
    }
}

/// The pod's `/etc/hosts` (upstream's `ensureHostsFile`): a host-network
/// pod's is the node's own; any other's maps the pod's host name (and its
/// FQDN, with a subdomain) to `pod_ip`, then its `hostAliases`.
pub fn etc_hosts(pod: &Pod, node: &NodeFacts, pod_ip: &str) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.host_network.unwrap_or(false) {
        return node_hosts_file(&spec, node);
    }
    let (ns, name) = namespace_and_name(pod);
    let (short, domain) = host_and_domain(&spec, &ns, &name, node);
    hosts_file(&spec, &short, &domain, pod_ip)
}

/// Upstream's `HasPrivilegedContainer`: any init, regular or ephemeral
/// container with `securityContext.privileged`.
fn has_privileged_container(spec: &k8s_openapi::api::core::v1::PodSpec) -> bool {
    let ephemeral = ephemeral_containers(spec);
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .chain(&ephemeral)
        .any(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
}

/// The pod's `/etc/resolv.conf` by its `dnsPolicy` and `dnsConfig`, as
/// upstream's `dns.Configurer`: the cluster DNS with the namespace's search
/// path and `ndots:5`, or the host's file, or nothing (`None`), then the
/// pod's own nameservers, searches and options.
fn resolv_conf(spec: &PodSpec, ns: &str, node: &NodeFacts) -> String {
    let host_network = spec.host_network.unwrap_or(false);
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster = (policy == "ClusterFirst" && !host_network
        || policy == "ClusterFirstWithHostNet")
        && !node.cluster_dns.is_empty();
    let mut resolv = if policy == "None" {
        String::new()
    } else if cluster {
        let mut search = vec![
            format!("{ns}.svc.{}", node.cluster_domain),
            format!("svc.{}", node.cluster_domain),
            node.cluster_domain.clone(),
        ];
        search.retain(|s| !s.starts_with('.') && !s.is_empty() && !s.ends_with('.'));
        let mut r: String = node
            .cluster_dns
            .iter()
            .map(|ip| format!("nameserver {ip}\n"))
            .collect();
        if !search.is_empty() {
            r.push_str(&format!("search {}\n", search.join(" ")));
        }
        r.push_str("options ndots:5\n");
        r
    } else {
        std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default()
    };
    let Some(cfg) = &spec.dns_config else {
        return resolv;
    };
    for ip in cfg.nameservers.iter().flatten() {
        resolv.push_str(&format!("nameserver {ip}\n"));
    }
    if let Some(s) = &cfg.searches
        && !s.is_empty()
    {
        resolv.push_str(&format!("search {}\n", s.join(" ")));
    }
    let opts: Vec<String> = cfg
        .options
        .iter()
        .flatten()
        .map(|o| match &o.value {
            Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
            None => o.name.clone().unwrap_or_default(),
        })
        .collect();
    if !opts.is_empty() {
        resolv.push_str(&format!("options {}\n", opts.join(" ")));
    }
    resolv
}

/// The pod's host name and domain, as upstream's
/// `GeneratePodHostNameAndDomain`: `hostname` (else the pod's name, cut
/// to 63), `<subdomain>.<ns>.svc.<cluster domain>` with a subdomain, and
/// `hostnameOverride` (beta) replacing both, with no domain.
fn host_and_domain(spec: &PodSpec, ns: &str, name: &str, node: &NodeFacts) -> (String, String) {
    if let Some(o) = spec.hostname_override.as_ref().filter(|o| !o.is_empty()) {
        return (o.clone(), String::new());
    }
    let short = spec
        .hostname
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| {
            name.chars()
                .take(63)
                .collect::<String>()
                .trim_end_matches(['-', '.'])
                .to_string()
        });
    let domain = match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        Some(sub) => format!("{sub}.{ns}.svc.{}", node.cluster_domain),
        None => String::new(),
    };
    (short, domain)
}

/// The pod's `/etc/hosts` as upstream's `managedHostsFileContent`:
/// localhost and the IPv6 names, its own name (with its FQDN when it has a
/// domain), its `hostAliases`.
fn hosts_file(spec: &PodSpec, hostname: &str, domain: &str, ip: &str) -> String {
    let mut hosts = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    if domain.is_empty() {
        hosts.push_str(&format!("{ip}\t{hostname}\n"));
    } else {
        hosts.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
    }
    hosts.push_str(&host_aliases(spec));
    hosts
}

/// A hostNetwork pod's `/etc/hosts`, as upstream's
/// `nodeHostsFileContent`: the node's own file under a header of its own,
/// then the `hostAliases`. (A small local file, read as the sandbox is
/// made.)
fn node_hosts_file(spec: &PodSpec, node: &NodeFacts) -> String {
    let path = if node.etc_hosts.is_empty() {
        "/etc/hosts"
    } else {
        node.etc_hosts.as_str()
    };
    let mut hosts = String::from("# Kubernetes-managed hosts file (host network).\n");
    hosts.push_str(&std::fs::read_to_string(path).unwrap_or_default());
    hosts.push_str(&host_aliases(spec));
    hosts
}

fn host_aliases(spec: &PodSpec) -> String {
    let aliases = spec.host_aliases.iter().flatten();
    let lines: Vec<String> = aliases
        .map(|h| {
            format!(
                "{}\t{}\n",
                h.ip,
                h.hostnames.clone().unwrap_or_default().join("\t")
            )
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    format!("\n# Entries added by HostAliases.\n{}", lines.concat())
}

/// The containers' `hostPort`s, as the upstream kubelet hands them to CRI
/// (a port without `hostPort` maps nothing).
fn port_mappings(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<PortMapping> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host_port = p.host_port.filter(|h| *h > 0)?;
            Some(PortMapping {
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(v).unwrap()
    }

    const BASE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: edge, uid: u-1, labels: {app: web}}\n";

    #[test]
    fn a_sandbox_is_privileged_when_any_container_is() {
        let node = NodeFacts::default();
        let plain = pod(&format!(
            "{BASE}spec:\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert!(!sandbox_config(&plain, &node).privileged);
        let init = pod(&format!(
            "{BASE}spec:\n  initContainers: [{{name: i, image: x, securityContext: {{privileged: true}}}}]\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert!(sandbox_config(&init, &node).privileged);
    }

    #[test]
    fn dns_and_hosts() {
        let p = pod(&format!(
            "{BASE}spec:\n  hostAliases: [{{ip: 10.1.2.3, hostnames: [db]}}]\n  containers: [{{name: a, image: x}}]\n"
        ));
        let node = NodeFacts {
            node_name: "pi".into(),
            node_ip: "192.0.2.1".into(),
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            log_root: "/var/log/pods".into(),
            ..Default::default()
        };
        let ip = "10.88.0.5";
        let s = sandbox_config(&p, &node);
        assert_eq!(s.hostname, "web");
        assert!(s.resolv_conf.starts_with("nameserver 10.96.0.10\nsearch edge.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5"), "{}", s.resolv_conf);
        let hosts = etc_hosts(&p, &node, ip);
        assert!(hosts.contains("10.1.2.3\tdb") && hosts.contains("10.88.0.5\tweb\n"));
        assert_eq!(s.log_directory, "/var/log/pods/edge_web_u-1");
        assert_eq!(s.cgroup_parent, "kubepods/besteffort/podu-1");
        // A subdomain gives the FQDN line; setHostnameAsFQDN the FQDN as
        // the hostname; hostnameOverride replaces name and domain.
        let sub = pod(&format!(
            "{BASE}spec:\n  subdomain: db\n  setHostnameAsFQDN: true\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert_eq!(
            sandbox_config(&sub, &node).hostname,
            "web.db.edge.svc.cluster.local"
        );
        let hosts = etc_hosts(&sub, &node, ip);
        assert!(
            hosts.contains("10.88.0.5\tweb.db.edge.svc.cluster.local\tweb\n"),
            "{hosts}"
        );
        let over = pod(&format!(
            "{BASE}spec:\n  hostname: h\n  subdomain: db\n  hostnameOverride: other\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert_eq!(sandbox_config(&over, &node).hostname, "other");
        let hosts = etc_hosts(&over, &node, ip);
        assert!(hosts.contains("10.88.0.5\tother\n"), "{hosts}");
        // hostNetwork: the node's own file under its header, then aliases.
        let d = tempfile::tempdir().unwrap();
        let etc = d.path().join("hosts");
        std::fs::write(&etc, "10.0.0.5\tthe-node\n").unwrap();
        let host_node = NodeFacts {
            etc_hosts: etc.display().to_string(),
            ..node.clone()
        };
        let hn = pod(&format!(
            "{BASE}spec:\n  hostNetwork: true\n  hostAliases: [{{ip: 10.1.2.3, hostnames: [db, db2]}}]\n  containers: [{{name: a, image: x}}]\n"
        ));
        assert_eq!(
            etc_hosts(&hn, &host_node, ip),
            "# Kubernetes-managed hosts file (host network).\n10.0.0.5\tthe-node\n\n# Entries added by HostAliases.\n10.1.2.3\tdb\tdb2\n"
        );
    }
}
