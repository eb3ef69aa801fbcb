//! End to end: kinglet joins the real loopback control plane (Node authorizer
//! and NodeRestriction on) as a node, stays healthy, and recovers from what
//! admins and controllers do to its objects.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

#[tokio::test]
async fn node_registers_ready_with_lease_conditions_and_events() {
    let admin = admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = unique_name("kl-ready");
    let start = Instant::now();
    let k = Kinglet::start(&name, FAST_CONFIG);
    let node = wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    eprintln!("figure: time to Ready {:?}", start.elapsed());

    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], name);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(labels.contains_key("kubernetes.io/arch"));
    let status = node.status.clone().unwrap();
    for (t, want) in [
        ("Ready", ("True", "KubeletReady")),
        ("MemoryPressure", ("False", "KubeletHasSufficientMemory")),
        ("DiskPressure", ("False", "KubeletHasNoDiskPressure")),
        ("PIDPressure", ("False", "KubeletHasSufficientPID")),
    ] {
        assert_eq!(
            condition(&node, t),
            Some((want.0.to_string(), want.1.to_string())),
            "{t}"
        );
    }
    let cap = status.capacity.unwrap();
    for r in ["cpu", "memory", "ephemeral-storage", "pods"] {
        assert!(cap.contains_key(r), "capacity lacks {r}");
    }
    assert_eq!(cap["pods"].0, "110");
    let info = status.node_info.unwrap();
    assert!(
        info.kubelet_version.starts_with("v1.37."),
        "{}",
        info.kubelet_version
    );
    assert!(info.container_runtime_version.starts_with("kinglet-oci://"));
    assert!(!info.boot_id.is_empty() && !info.kernel_version.is_empty());
    let addrs = status.addresses.unwrap();
    assert!(
        addrs
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.1")
    );
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(k.api_port),
        "daemonEndpoints names the configured kubelet API port"
    );

    // kubectl sees it Ready too.
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cluster())
        .args(["get", "node", &name, "--no-headers"])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.split_whitespace().nth(1) == Some("Ready"),
        "kubectl says: {line}"
    );

    // The Lease is held by the node, owned by it, and renewed every
    // nodeLeaseDurationSeconds/4 (8 s / 4 = 2 s here).
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let first = wait_for("lease", Duration::from_secs(10), || async {
        leases.get_opt(&name).await.ok().flatten()
    })
    .await;
    let spec = first.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(name.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(8));
    let t0 = spec.renew_time.unwrap().0;
    let owner = &first.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", name.as_str())
    );
    assert_eq!(Some(owner.uid.clone()), node.metadata.uid);
    let renewed = wait_for("lease renewal", Duration::from_secs(8), || async {
        let l = leases.get(&name).await.ok()?;
        let t = l.spec?.renew_time?.0;
        (t > t0).then_some(t)
    })
    .await;
    let gap = renewed.duration_since(t0);
    eprintln!("figure: lease renewal gap {gap:?}");
    assert!(gap.as_secs_f64() > 1.0, "renewed too often: {gap:?}");

    // Events explain the node's state, as upstream's do.
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let reasons = wait_for("node events", Duration::from_secs(10), || async {
        let evs = events.list(&ListParams::default()).await.ok()?;
        let r: Vec<String> = evs
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
            .filter_map(|e| e.reason)
            .collect();
        (r.iter().any(|x| x == "NodeReady") && r.iter().any(|x| x == "Starting")).then_some(r)
    })
    .await;
    assert!(
        reasons.iter().any(|r| r == "NodeHasSufficientMemory"),
        "{reasons:?}"
    );

    assert_eq!(k.healthz().await, Some(200));
}

#[tokio::test]
async fn deleted_node_is_registered_again() {
    let nodes: Api<Node> = Api::all(admin().await);
    let name = unique_name("kl-del");
    let _k = Kinglet::start(&name, FAST_CONFIG);
    let node = wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    let uid = node.metadata.uid.unwrap();
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
    let again = wait_for("re-registration", Duration::from_secs(20), || async {
        let n = nodes.get_opt(&name).await.ok().flatten()?;
        (n.metadata.uid.as_deref() != Some(uid.as_str()) && is_ready(&n)).then_some(n)
    })
    .await;
    assert_ne!(again.metadata.uid.unwrap(), uid);
}

#[tokio::test]
async fn restart_adopts_the_existing_node_and_sigterm_is_clean() {
    let nodes: Api<Node> = Api::all(admin().await);
    let name = unique_name("kl-restart");
    let mut k = Kinglet::start(&name, FAST_CONFIG);
    let node = wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    let uid = node.metadata.uid.clone().unwrap();

    let (st, took) = k.terminate(Duration::from_secs(5));
    eprintln!("figure: exit after SIGTERM in {took:?}");
    assert!(st.success(), "exit status {st}\n{}", k.log());

    // An admin labels the node while kinglet is down; the next start adopts
    // the Node (same UID) and keeps what others wrote.
    let patch = serde_json::json!({"metadata": {"labels": {"example.com/owner": "ops"}}});
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let restarted_at = jiff::Timestamp::now();
    k.spawn();
    // The new process renews the lease and the node is Ready.
    let leases: Api<Lease> = Api::namespaced(admin().await, "kube-node-lease");
    wait_for(
        "lease renewed by the restarted kinglet",
        Duration::from_secs(20),
        || async {
            let t = leases.get(&name).await.ok()?.spec?.renew_time?.0;
            (t > restarted_at).then_some(())
        },
    )
    .await;
    let n = wait_ready(&nodes, &name, Duration::from_secs(10)).await;
    // Both runs registered the same Node object.
    let line = format!("node registered node={name} uid={uid}");
    wait_for(
        "the restarted kinglet to register",
        Duration::from_secs(10),
        || async { (k.log().matches(&line).count() == 2).then_some(()) },
    )
    .await;
    assert_eq!(
        n.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "node was re-created"
    );
    assert_eq!(n.metadata.labels.unwrap()["example.com/owner"], "ops");
}

#[tokio::test]
async fn ready_is_restored_when_another_writer_changes_it() {
    let nodes: Api<Node> = Api::all(admin().await);
    let name = unique_name("kl-unknown");
    let _k = Kinglet::start(&name, FAST_CONFIG);
    wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    // What the node lifecycle controller writes when heartbeats stop.
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}});
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let n = nodes.get(&name).await.unwrap();
    assert_eq!(condition(&n, "Ready").unwrap().0, "Unknown");
    let n = wait_ready(&nodes, &name, Duration::from_secs(10)).await;
    let ready = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    // A real transition, stamped now, as upstream does.
    assert!(
        ready.last_transition_time.unwrap().0
            > jiff::Timestamp::from_second(1_767_225_600).unwrap()
    );
}

#[tokio::test]
async fn invalid_config_is_refused_before_contacting_the_api() {
    let nodes: Api<Node> = Api::all(admin().await);
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("kl-badcfg");
    let kubeconfig = node_kubeconfig(&name);
    let cases = [
        ("maxPods: lots\n", "maxPods"),
        (
            "evictionHard:\n  memory.available: plenty\n",
            "evictionHard[memory.available]",
        ),
        (
            "evictionSoft:\n  memory.available: 1Gi\n",
            "evictionSoftGracePeriod[memory.available]",
        ),
        (
            "nodeStatusUpdateFrequency: sometimes\n",
            "nodeStatusUpdateFrequency",
        ),
    ];
    for (body, field) in cases {
        let cfg = dir.path().join("bad.yaml");
        std::fs::write(
            &cfg,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}"
            ),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_kinglet"))
            .arg("--config")
            .arg(&cfg)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--hostname-override", &name, "--root-dir"])
            .arg(dir.path().join("root"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{body:?}: {stderr}");
        assert!(
            stderr.contains(&format!("field {field}:")),
            "{body:?}: {stderr}"
        );
    }
    // A bad flag is refused the same way.
    let out = Command::new(env!("CARGO_BIN_EXE_kinglet"))
        .args([
            "--node-labels",
            "no-equals-sign",
            "--hostname-override",
            &name,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-labels"));
    assert!(
        nodes.get_opt(&name).await.unwrap().is_none(),
        "a node was registered"
    );
    assert!(!dir.path().join("root").exists(), "state was written");
}

#[tokio::test]
async fn config_drop_ins_merge_over_the_file_as_upstream_and_configz_shows_them() {
    let nodes: Api<Node> = Api::all(admin().await);
    let name = unique_name("kl-dropin");
    let drop_ins = tempfile::tempdir().unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    for (file, body) in [
        ("10-pods.conf", "maxPods: 42\n"),
        ("20-pods.conf", "maxPods: 43\n"),
        ("30-not-a-drop-in.yaml", "maxPods: 1\n"),
    ] {
        std::fs::write(drop_ins.path().join(file), format!("{head}{body}")).unwrap();
    }
    let dir = drop_ins.path().display().to_string();
    let k = Kinglet::start_with_root_prep(&name, FAST_CONFIG, &["--config-dir", &dir], |_| {});
    let node = wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    let cap = node.status.unwrap().capacity.unwrap();
    assert_eq!(
        cap["pods"].0, "43",
        "the last .conf wins; the .yaml is no drop-in"
    );
    // /configz shows the merged configuration (straight to the node with
    // a client certificate of the cluster's CA).
    let configz: serde_json::Value = serde_json::from_str(&k.api_get("/configz")).unwrap();
    let kc = &configz["kubeletconfig"];
    assert_eq!(kc["maxPods"], 43, "{configz}");
    assert_eq!(
        kc["nodeStatusUpdateFrequency"], "1s",
        "the file's own field kept"
    );
    // A bad drop-in stops kinglet at start, naming the file and the field.
    std::fs::write(
        drop_ins.path().join("40-bad.conf"),
        format!("{head}maxPods: lots\n"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kinglet"))
        .args([
            "--config-dir",
            &dir,
            "--hostname-override",
            &name,
            "--root-dir",
        ])
        .arg(drop_ins.path().join("root"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("40-bad.conf") && stderr.contains("field maxPods"),
        "{stderr}"
    );
    assert!(!drop_ins.path().join("root").exists(), "state was written");
}

#[test]
fn version_names_kinglet_and_kubernetes() {
    let out = Command::new(env!("CARGO_BIN_EXE_kinglet"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.starts_with("kinglet 0.") && v.contains("Kubernetes v1.37."),
        "{v}"
    );
}

/// TLS bootstrap with a bootstrap token, as kubeadm sets a node up: the
/// token's group may create CSRs and have node-client CSRs approved; the
/// real controller-manager approves and signs; the node writes its
/// certificate and kubeconfig, registers as `system:node:<name>` (the
/// Node authorizer and NodeRestriction accept it) and becomes Ready. A
/// restart uses the written certificate without a new request.
#[tokio::test]
async fn tls_bootstrap_from_a_bootstrap_token_to_ready() {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    use kube::api::PostParams;
    let admin = admin().await;
    let name = unique_name("kl-boot");
    let id: String = format!("{:06x}", std::process::id() & 0xff_ffff);
    let secret = "0123456789abcdef";
    let tok: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": id, "token-secret": secret,
                       "usage-bootstrap-authentication": "true"}
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");
    let _ = secrets.create(&PostParams::default(), &tok).await;
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    for (n, role, group) in [
        (
            "kinglet-test:bootstrappers-create-csrs",
            "system:node-bootstrapper",
            "system:bootstrappers",
        ),
        (
            "kinglet-test:bootstrappers-auto-approve",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers",
        ),
        (
            "kinglet-test:nodes-auto-renew",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        let b: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": n},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]
        }))
        .unwrap();
        let _ = bindings.create(&PostParams::default(), &b).await;
    }
    let mut k = Kinglet::unstarted(&name, FAST_CONFIG);
    let boot = k.dir.path().join("bootstrap.kubeconfig");
    let kubeconfig = k.dir.path().join("written/kubelet.kubeconfig");
    std::fs::write(
        &boot,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{}', certificate-authority: '{}'}}}}]\nusers: [{{name: u, user: {{token: '{id}.{secret}'}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
            cluster_port(),
            cluster_dir().join("pki/ca.crt").display()
        ),
    )
    .unwrap();
    k.kubeconfig_override = Some(kubeconfig.clone());
    k.extra_args.extend([
        "--bootstrap-kubeconfig".to_string(),
        boot.display().to_string(),
    ]);
    k.spawn();
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(60)).await;
    // What upstream writes: the dated pem and the current symlink to it.
    let pki = k.dir.path().join("root/pki");
    let current = pki.join("kubelet-client-current.pem");
    let target = std::fs::read_link(&current).unwrap();
    assert!(
        target
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("kubelet-client-2"),
        "{target:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(written.contains("kubelet-client-current.pem"), "{written}");
    // The CSR was the node's, approved by the controller-manager.
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let mine = bootstrap_csrs(&csrs, &id).await;
    assert!(!mine.is_empty(), "no CSR from the bootstrap token");
    let approved = mine.iter().any(csr_approved);
    assert!(approved, "{mine:?}");
    // A restart uses the certificate it has: no second request.
    let before = mine.len();
    k.terminate(Duration::from_secs(5));
    k.spawn();
    wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    assert_eq!(std::fs::read_link(&current).unwrap(), target);
    let after = bootstrap_csrs(&csrs, &id).await.len();
    assert_eq!(after, before, "a restart requested another certificate");
    let _ = secrets
        .delete(&format!("bootstrap-token-{id}"), &Default::default())
        .await;
    for n in [
        "kinglet-test:bootstrappers-create-csrs",
        "kinglet-test:bootstrappers-auto-approve",
        "kinglet-test:nodes-auto-renew",
    ] {
        let _ = bindings.delete(n, &Default::default()).await;
    }
}

/// The CSRs made with bootstrap token `id`.
async fn bootstrap_csrs(
    csrs: &Api<k8s_openapi::api::certificates::v1::CertificateSigningRequest>,
    id: &str,
) -> Vec<k8s_openapi::api::certificates::v1::CertificateSigningRequest> {
    let user = format!("system:bootstrap:{id}");
    let all = csrs.list(&Default::default()).await.unwrap().items;
    all.into_iter()
        .filter(|c| c.spec.username.as_deref() == Some(user.as_str()))
        .collect()
}
