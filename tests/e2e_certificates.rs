//! End to end: the node's certificates against the real control plane.
//! - a client certificate near the end of a 10-minute life is renewed
//!   through a CSR the real controller-manager approves (as
//!   `selfnodeclient`) and signs; the node stays Ready past the old one's
//!   expiry and still runs and reports pods (on new connections);
//! - `serverTLSBootstrap`: the kubelet API refuses TLS until its serving
//!   CSR is approved, then serves a certificate of the cluster's CA for
//!   its IP (verified by curl against the CA), kept across a restart;
//! - a CSR-issued serving certificate near its end is renewed through a
//!   new CSR and served once approved, TLS never interrupted;
//! - `tlsCertFile`: rewritten files are served without a restart.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A node client certificate from the test CA, valid from `start` (Unix
/// seconds) for `lifetime` seconds: (certificate PEM, key PEM).
fn node_cert(name: &str, start: u64, lifetime: u64) -> (String, String) {
    ca_signed(name, start, lifetime, false)
}

/// As [`node_cert`]; `serving`: a serving certificate for 127.0.0.1
/// (what a `kubernetes.io/kubelet-serving` CSR gets) instead.
fn ca_signed(name: &str, start: u64, lifetime: u64, serving: bool) -> (String, String) {
    let pki = cluster_dir().join("pki");
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key")).unwrap()).unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "kinglet-test-ca");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    p.distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{name}"));
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    p.not_before = epoch + Duration::from_secs(start);
    p.not_after = epoch + Duration::from_secs(start + lifetime);
    p.extended_key_usages = vec![if serving {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    }];
    if serving {
        p.subject_alt_names = vec![rcgen::SanType::IpAddress([127, 0, 0, 1].into())];
    }
    p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let cert = p.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// `openssl x509` of a PEM file: (subject, issuer, notAfter as Unix s).
fn x509(path: &Path) -> (String, String, u64) {
    let out = output_ok(
        Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-issuer", "-enddate", "-in"])
            .arg(path),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let end = field("notAfter=");
    let secs = Command::new("date")
        .args(["-d", &end, "+%s"])
        .output()
        .unwrap();
    let secs: u64 = String::from_utf8_lossy(&secs.stdout)
        .trim()
        .parse()
        .unwrap();
    (field("subject="), field("issuer="), secs)
}

/// Whether a command succeeded, and its stdout and stderr together.
fn outcome(out: std::process::Output) -> (bool, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn kubectl(args: &[&str]) -> (bool, String) {
    outcome(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(cluster_dir().join("admin.kubeconfig"))
            .args(args)
            .output()
            .unwrap(),
    )
}

/// The node's CSRs for `signer`.
async fn csrs_of(admin: &kube::Client, node: &str, signer: &str) -> Vec<CertificateSigningRequest> {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let user = format!("system:node:{node}");
    let all = api.list(&Default::default()).await.unwrap().items;
    all.into_iter()
        .filter(|c| {
            c.spec.username.as_deref() == Some(user.as_str()) && c.spec.signer_name == signer
        })
        .collect()
}

/// The renewal tests change what the cluster approves for every node
/// (`system:nodes`): one at a time.
static RBAC: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A kubeconfig for `name` in `dir` with a client certificate valid from
/// `start` for `lifetime` seconds.
fn short_kubeconfig(dir: &Path, name: &str, start: u64, lifetime: u64) -> std::path::PathBuf {
    let (cert, key) = node_cert(name, start, lifetime);
    let pem = dir.join("short.pem");
    std::fs::write(&pem, format!("{cert}{key}")).unwrap();
    let kubeconfig = dir.join("short.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{}', certificate-authority: '{}'}}}}]\nusers: [{{name: u, user: {{client-certificate: '{p}', client-key: '{p}'}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
            cluster_port(),
            cluster_dir().join("pki/ca.crt").display(),
            p = pem.display()
        ),
    )
    .unwrap();
    kubeconfig
}

/// A renewal refused (the CSR denied) in the certificate's last tenth of
/// life: a Warning event on the Node and the renewal-error metric, as an
/// operator needs to see it before the node goes NotReady.
#[tokio::test]
async fn a_refused_renewal_near_expiry_is_evented() {
    use k8s_openapi::api::events::v1::Event;
    let _one = RBAC.lock().await;
    let admin = admin().await;
    let name = unique_name("kl-expiring");
    let mut k = Kinglet::unstarted(&name, &format!("{FAST_CONFIG}rotateCertificates: true\n"));
    // 1000 s of life, 90 left: past the renewal deadline, in the last tenth.
    let start = now() - 910;
    k.kubeconfig_override = Some(short_kubeconfig(k.dir.path(), &name, start, 1000));
    k.spawn();
    let signer = "kubernetes.io/kube-apiserver-client-kubelet";
    let csr = wait_for("the renewal CSR", Duration::from_secs(30), || async {
        csrs_of(&admin, &name, signer).await.into_iter().next()
    })
    .await;
    let csr_name = csr.metadata.name.clone().unwrap();
    let (ok, out) = kubectl(&["certificate", "deny", &csr_name]);
    assert!(ok, "{out}");
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let note = wait_for(
        "the CertificateExpiring event",
        Duration::from_secs(30),
        || async {
            let l = events.list(&Default::default()).await.ok()?;
            l.items.into_iter().find_map(|e| {
                let ours =
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str());
                (ours
                    && e.reason.as_deref() == Some("CertificateExpiring")
                    && e.type_.as_deref() == Some("Warning"))
                .then(|| e.note.unwrap_or_default())
            })
        },
    )
    .await;
    assert!(
        note.contains("could not be renewed") && note.contains("denied"),
        "{note}"
    );
    let log = k.log();
    assert!(log.contains("certificate renewal failed"), "{log}");
}

/// Certificates nothing renews (`rotateCertificates: false`, serving
/// files): a client certificate in its last tenth of life and an expired
/// serving one are both said, in the log and as Warning events on the
/// Node, while the node goes on working.
#[tokio::test]
async fn certificates_nothing_renews_are_evented_before_and_after_expiry() {
    use k8s_openapi::api::events::v1::Event;
    let admin = admin().await;
    let name = unique_name("kl-norotate");
    let certs = tempfile::tempdir().unwrap();
    let (crt, key) = ca_signed(&name, now() - 2000, 1000, true);
    let (crt_file, key_file) = (certs.path().join("s.crt"), certs.path().join("s.key"));
    std::fs::write(&crt_file, crt).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let config = format!(
        "{FAST_CONFIG}rotateCertificates: false\ntlsCertFile: {}\ntlsPrivateKeyFile: {}\n",
        crt_file.display(),
        key_file.display()
    );
    let mut k = Kinglet::unstarted(&name, &config);
    // 1000 s of life, 90 left: in the last tenth, and nothing renews it.
    k.kubeconfig_override = Some(short_kubeconfig(k.dir.path(), &name, now() - 910, 1000));
    k.spawn();
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    for (reason, says) in [
        ("CertificateExpiring", "client certificate expires at"),
        ("CertificateExpired", "serving certificate expired at"),
    ] {
        let note = wait_for(reason, Duration::from_secs(30), || async {
            let l = events.list(&Default::default()).await.ok()?;
            l.items.into_iter().find_map(|e| {
                let ours =
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str());
                (ours
                    && e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning"))
                .then(|| e.note.unwrap_or_default())
            })
        })
        .await;
        assert!(note.contains(says), "{reason}: {note}");
    }
    let log = k.log();
    assert!(log.contains("nothing renews it"), "{log}");
}

#[tokio::test]
async fn a_short_lived_client_certificate_is_renewed_without_a_not_ready_blip() {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let _one = RBAC.lock().await;
    let admin = admin().await;
    let name = unique_name("kl-rot");
    // What kubeadm binds: nodes may have their own client CSRs approved.
    let binding = format!("kinglet-test:{name}-renew");
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let b: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]
    }))
    .unwrap();
    bindings.create(&PostParams::default(), &b).await.unwrap();
    // A 10-minute certificate with 2 minutes left: past 80 % of its life,
    // so the renewal is due within a minute of the start.
    let start = now() - 480;
    let old_end = start + 600;
    let mut k = Kinglet::unstarted(&name, &format!("{FAST_CONFIG}rotateCertificates: true\n"));
    k.kubeconfig_override = Some(short_kubeconfig(k.dir.path(), &name, start, 600));
    k.import(pods::busybox_archive());
    k.spawn();
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(30)).await;

    // Renewed: a certificate of the cluster's CA for the same node, in
    // upstream's place, requested by the node itself and approved.
    let current = k.dir.path().join("root/pki/kubelet-client-current.pem");
    wait_for(
        "the renewed client certificate",
        Duration::from_secs(90),
        || async { current.exists().then_some(()) },
    )
    .await;
    let (subject, issuer, end) = x509(&current);
    assert!(
        subject.contains(&format!("system:node:{name}")),
        "{subject}"
    );
    assert!(issuer.contains("kinglet-test-ca"), "{issuer}");
    assert!(
        end > old_end + 3600,
        "the new certificate is short-lived too"
    );
    let mine = csrs_of(&admin, &name, "kubernetes.io/kube-apiserver-client-kubelet").await;
    assert!(mine.iter().any(csr_approved), "{mine:?}");
    let log = k.log();
    assert!(log.contains("certificate rotated"), "{log}");

    // Ready all along, past the old certificate's expiry.
    while now() < old_end + 15 {
        let n = nodes.get(&name).await.unwrap();
        assert!(is_ready(&n), "NotReady during the rotation: {:?}", n.status);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The node still works on connections made after the old expiry:
    // a pod bound to it runs and its status comes back.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod_name = format!("{name}-after");
    let spec = serde_json::json!({"containers": [{"name": "c", "image": "kinglet.test/busybox:1",
                                                 "command": ["sleep", "3600"]}]});
    pods::create_running(&pods, &name, &pod_name, spec).await;
    let log = k.log();
    assert!(
        !log.contains("Unauthorized"),
        "requests were refused: {log}"
    );
    delete_pods(&pods, &[pod_name]).await;
    let _ = bindings.delete(&binding, &Default::default()).await;
}

/// `curl` of the kubelet API with the admin certificate, verifying the
/// server against the cluster CA (not `-k`): (ok, body or error).
fn curl_verified(port: u16, path: &str) -> (bool, String) {
    let pki = cluster_dir().join("pki");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    outcome(out)
}

#[tokio::test]
async fn a_serving_certificate_is_requested_and_served_once_approved() {
    let admin = admin().await;
    let name = unique_name("kl-serve");
    let mut k = Kinglet::start(&name, &format!("{FAST_CONFIG}serverTLSBootstrap: true\n"));
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    let signer = "kubernetes.io/kubelet-serving";
    let csr = wait_for("the serving CSR", Duration::from_secs(30), || async {
        csrs_of(&admin, &name, signer).await.into_iter().next()
    })
    .await;
    let usages = csr.spec.usages.clone().unwrap_or_default();
    assert!(usages.iter().any(|u| u == "server auth"), "{usages:?}");
    // Not approved yet: no certificate to serve, so no TLS at all.
    let (ok, out) = curl_verified(k.api_port, "/healthz");
    assert!(!ok, "served before approval: {out}");
    let csr_name = csr.metadata.name.clone().unwrap();
    let (ok, out) = kubectl(&["certificate", "approve", &csr_name]);
    assert!(ok, "{out}");
    // Signed by the cluster's CA for 127.0.0.1 (curl checks both).
    let body = wait_for(
        "the approved certificate served",
        Duration::from_secs(30),
        || async {
            let (ok, out) = curl_verified(k.api_port, "/healthz");
            ok.then_some(out)
        },
    )
    .await;
    assert_eq!(body, "ok");
    let current = k.dir.path().join("root/pki/kubelet-server-current.pem");
    let (subject, issuer, _) = x509(&current);
    assert!(
        subject.contains(&format!("system:node:{name}")),
        "{subject}"
    );
    assert!(issuer.contains("kinglet-test-ca"), "{issuer}");
    // A restart serves the stored certificate without a new request.
    k.terminate(Duration::from_secs(5));
    k.spawn();
    wait_for(
        "served after a restart",
        Duration::from_secs(30),
        || async { curl_verified(k.api_port, "/healthz").0.then_some(()) },
    )
    .await;
    assert_eq!(csrs_of(&admin, &name, signer).await.len(), 1);
}

/// The end of validity (Unix s) of the certificate the kubelet API
/// serves, checked against the cluster CA.
fn served_not_after(port: u16) -> Option<u64> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} -verify_return_error -CAfile {} </dev/null 2>/dev/null | openssl x509 -noout -enddate -dateopt iso_8601",
            cluster_dir().join("pki/ca.crt").display()
        ))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let when = text.trim().strip_prefix("notAfter=")?;
    let ts: jiff::Timestamp = when.replace(' ', "T").parse().ok()?;
    Some(ts.as_second() as u64)
}

/// `serverTLSBootstrap` with a CSR-issued serving certificate near the
/// end of a 10-minute life (planted where the kubelet keeps it): it is
/// served until a new one is requested, approved and signed, then the new
/// one is served without a restart, and TLS never stops in between.
#[tokio::test]
async fn a_csr_issued_serving_certificate_is_renewed_and_served_without_a_gap() {
    let admin = admin().await;
    let name = unique_name("kl-srot");
    let start = now() - 480;
    let old_end = start + 600;
    let mut k = Kinglet::unstarted(&name, &format!("{FAST_CONFIG}serverTLSBootstrap: true\n"));
    let pki = k.dir.path().join("root/pki");
    std::fs::create_dir_all(&pki).unwrap();
    let (crt, key) = ca_signed(&name, start, 600, true);
    let dated = pki.join("kubelet-server-2000-01-01-00-00-00.pem");
    std::fs::write(&dated, format!("{crt}{key}")).unwrap();
    std::os::unix::fs::symlink(&dated, pki.join("kubelet-server-current.pem")).unwrap();
    k.spawn();
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    assert_eq!(
        served_not_after(k.api_port),
        Some(old_end),
        "the planted one first"
    );
    // Past 80 % of its life: the renewal is requested at once.
    let signer = "kubernetes.io/kubelet-serving";
    let csr = wait_for("the renewal CSR", Duration::from_secs(60), || async {
        csrs_of(&admin, &name, signer).await.into_iter().next()
    })
    .await;
    // Still served while the request waits for approval.
    assert!(
        curl_verified(k.api_port, "/healthz").0,
        "TLS stopped before approval"
    );
    let (ok, out) = kubectl(&[
        "certificate",
        "approve",
        csr.metadata.name.as_deref().unwrap(),
    ]);
    assert!(ok, "{out}");
    let end = wait_for(
        "the renewed certificate served",
        Duration::from_secs(30),
        || async {
            let end = served_not_after(k.api_port)?;
            (end > old_end + 3600).then_some(end)
        },
    )
    .await;
    let (subject, issuer, stored_end) = x509(&pki.join("kubelet-server-current.pem"));
    assert!(
        subject.contains(&format!("system:node:{name}")),
        "{subject}"
    );
    assert!(issuer.contains("kinglet-test-ca"), "{issuer}");
    assert_eq!(stored_end, end, "the stored pair is the one served");
    assert!(k.log().contains("certificate rotated"));
    assert!(k.alive(), "kinglet restarted");
}

/// A self-signed pair with subject `CN=<cn>` written whole to `dir/<cn>.*`.
fn openssl_pair(dir: &Path, cn: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (crt, key) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
    output_ok(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args([
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&crt),
    );
    (crt, key)
}

/// The subject of the certificate the kubelet API serves.
fn served_subject(port: u16) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | openssl x509 -noout -subject"
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn rewritten_serving_files_are_served_without_a_restart() {
    let admin = admin().await;
    let name = unique_name("kl-files");
    let certs = tempfile::tempdir().unwrap();
    let (crt1, key1) = openssl_pair(certs.path(), "kinglet-one");
    let (crt, key) = (certs.path().join("tls.crt"), certs.path().join("tls.key"));
    std::fs::copy(&crt1, &crt).unwrap();
    std::fs::copy(&key1, &key).unwrap();
    let mut k = Kinglet::start(
        &name,
        &format!(
            "{FAST_CONFIG}tlsCertFile: {}\ntlsPrivateKeyFile: {}\n",
            crt.display(),
            key.display()
        ),
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(30)).await;
    assert!(served_subject(k.api_port).contains("kinglet-one"));
    // Rotated as tools do: each file renamed over (the key first).
    let (crt2, key2) = openssl_pair(certs.path(), "kinglet-two");
    std::fs::rename(&key2, &key).unwrap();
    std::fs::rename(&crt2, &crt).unwrap();
    wait_for(
        "the new certificate served",
        Duration::from_secs(10),
        || async {
            served_subject(k.api_port)
                .contains("kinglet-two")
                .then_some(())
        },
    )
    .await;
    assert!(k.alive(), "kinglet restarted");
}
