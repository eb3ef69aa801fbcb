//! End to end: configMap, secret, downwardAPI and projected volumes on a
//! node joined to the real control plane, on both runtimes, in the spirit
//! of upstream's `configmap_volume.go`, `secrets_volume.go`,
//! `projected_*.go` and `downwardapi_volume.go`: contents and modes seen
//! from inside the container, read-only mounts, secrets on tmpfs, a
//! ConfigMap update and a label change reaching the running container's
//! files without a restart (the delay is printed), optional and missing
//! objects and keys with upstream's `FailedMount` message, the pod starting
//! once the missing object appears, and the automatic `kube-api-access`
//! volume: a pod authenticates to the API server with its own token
//! (a `SelfSubjectReview` names its service account). ClusterTrustBundles
//! projected by name and by signer, a changed or added bundle reaching the
//! running container. Nothing is left mounted after deletion.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

crate::both_runtimes!(
    object_volumes_are_written_and_kept_current,
    trust_bundles_are_projected_and_kept_current,
    the_service_account_token_authenticates,
    image_volumes_mount_read_only,
);

/// Figures, in-process only: the setup time of a pod with 100 ConfigMap
/// volumes, and the agent's memory per watched object.
#[tokio::test]
async fn figures_setup_time_and_memory_per_watched_object() {
    watched_objects_cost(Rt::Oci).await
}

const BB: &str = "kinglet.test/busybox:1";

fn from_yaml<T: serde::de::DeserializeOwned>(y: &str) -> T {
    let v: serde_json::Value = serde_saphyr::from_str(y).unwrap();
    serde_json::from_value(v).unwrap()
}

struct Joined {
    k: Kinglet,
    dir: tempfile::TempDir,
}

fn join(rt: Rt, prefix: &str, images: &[&Path]) -> Joined {
    let (k, dir) = join_logged(rt, prefix, images);
    Joined { k, dir }
}

/// A Ready joined node, the admin client and the default namespace's pods.
async fn ready_node(rt: Rt, prefix: &str, images: &[&Path]) -> (Joined, kube::Client, Api<Pod>) {
    let admin = admin().await;
    let j = join(rt, prefix, images);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    wait_ready(&nodes, &j.k.name, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    (j, admin, pods)
}

/// What the pod's containers logged so far (the CRI log files' lines).
fn pod_log(dir: &Path, pod: &str) -> String {
    let mut out = String::new();
    let prefix = format!("default_{pod}_");
    for e in std::fs::read_dir(dir.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if !e.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let mut stack = vec![e.path()];
        while let Some(d) = stack.pop() {
            for f in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if f.path().is_dir() {
                    stack.push(f.path());
                } else if let Ok(t) = std::fs::read_to_string(f.path()) {
                    for l in t.lines() {
                        // <time> <stream> <tag> <line>
                        out.push_str(l.splitn(4, ' ').nth(3).unwrap_or(""));
                        out.push('\n');
                    }
                }
            }
        }
    }
    out
}

async fn wait_log(dir: &Path, pod: &str, part: &str, secs: u64) -> String {
    wait_for(
        &format!("{pod} logs {part:?}"),
        Duration::from_secs(secs),
        || async {
            let l = pod_log(dir, pod);
            l.contains(part).then_some(l)
        },
    )
    .await
}

async fn create(pods: &Api<Pod>, node: &str, name: &str, spec: &str) {
    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{tier: one}}}}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{spec}"
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

async fn delete_all(pods: &Api<Pod>, names: &[String]) {
    delete_pods(pods, names).await
}

/// Mounts under the node's volume dir (what a deleted pod must not leave).
fn mounts_under(root: &Path) -> Vec<String> {
    let root = root.join("volumes").display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&root))
        .map(str::to_string)
        .collect()
}

/// A self-signed CA certificate's PEM, for trust bundles.
fn ca_pem(cn: &str) -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn.to_string());
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().pem()
}

/// `clusterTrustBundle` sources, by name and by signer and labels: the
/// anchors are in the running container, and a bundle changed or added
/// is there too within seconds, without a restart.
async fn trust_bundles_are_projected_and_kept_current(rt: Rt) {
    use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
    let (j, admin, pods) = ready_node(rt, "kl-ctb", &[pods::busybox_archive()]).await;
    let node = j.k.name.clone();
    let ctbs: Api<ClusterTrustBundle> = Api::all(admin.clone());
    // A signer's bundles are named after it (slashes as colons).
    let signer = format!("kinglet.test/{node}");
    let named = format!("{node}-plain");
    let of_signer = |i: u32| format!("kinglet.test:{node}:{i}");
    let bundle = |name: &str, signer: Option<&str>, pem: &str| -> ClusterTrustBundle {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"team": "edge"}},
            "spec": {"signerName": signer, "trustBundle": pem}
        }))
        .unwrap()
    };
    let (a, b, c) = (ca_pem("a"), ca_pem("b"), ca_pem("c"));
    let pp = PostParams::default();
    ctbs.create(&pp, &bundle(&named, None, &a)).await.unwrap();
    ctbs.create(&pp, &bundle(&of_signer(1), Some(&signer), &b))
        .await
        .unwrap();
    let script = "while true; do echo now $(grep -c BEGIN /v/named.pem) $(grep -c BEGIN /v/signer.pem) $(md5sum < /v/named.pem | cut -c1-8); sleep 0.2; done";
    create(&pods, &node, &format!("{node}-ctb"), &format!(
        "  containers:\n  - name: c\n    image: {BB}\n    command: [sh, -c, {script:?}]\n    volumeMounts:\n    - {{name: t, mountPath: /v}}\n  volumes:\n  - name: t\n    projected:\n      sources:\n      - clusterTrustBundle: {{name: {named}, path: named.pem}}\n      - clusterTrustBundle: {{signerName: {signer}, labelSelector: {{matchLabels: {{team: edge}}}}, path: signer.pem}}\n"
    )).await;
    let l = wait_log(j.dir.path(), &format!("{node}-ctb"), "now 1 1 ", 60).await;
    let first = l
        .lines()
        .find(|x| x.starts_with("now 1 1 "))
        .unwrap()
        .to_string();
    // Another bundle of the signer, and the named one changed.
    ctbs.create(&pp, &bundle(&of_signer(2), Some(&signer), &c))
        .await
        .unwrap();
    let mut changed = bundle(&named, None, &c);
    changed.metadata.resource_version = ctbs.get(&named).await.unwrap().metadata.resource_version;
    ctbs.replace(&named, &pp, &changed).await.unwrap();
    let t = Instant::now();
    let old_sum = first.trim_start_matches("now 1 1 ").to_string();
    let dir = j.dir.path().to_path_buf();
    let pod = format!("{node}-ctb");
    wait_for(
        "both changes in the running container",
        Duration::from_secs(30),
        || async {
            let l = pod_log(&dir, &pod);
            l.lines()
                .any(|x| x.starts_with("now 1 2 ") && !x.ends_with(old_sum.as_str()))
                .then_some(())
        },
    )
    .await;
    println!(
        "figure: ClusterTrustBundle changes in the running container after {:?}",
        t.elapsed()
    );
    pods.delete(
        &format!("{node}-ctb"),
        &DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap();
    for n in [named, of_signer(1), of_signer(2)] {
        let _ = ctbs.delete(&n, &DeleteParams::default()).await;
    }
}

async fn object_volumes_are_written_and_kept_current(rt: Rt) {
    let (j, admin, pods) = ready_node(rt, "kl-vol", &[pods::busybox_archive()]).await;
    let node = j.k.name.clone();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let n = |s: &str| format!("{node}-{s}");
    let cm: ConfigMap = from_yaml(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {}}}\ndata: {{greeting: hello, other: x}}\nbinaryData: {{blob: AAEC}}\n",
        n("cm")
    ));
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let s: Secret = from_yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {}}}\nstringData: {{password: s3cret}}\n",
        n("sec")
    ));
    secrets.create(&PostParams::default(), &s).await.unwrap();

    // A Service of the namespace: its variables reach the container, as
    // the kubernetes Service's do.
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(admin.clone(), "default");
    let svc: k8s_openapi::api::core::v1::Service = from_yaml(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {}}}\nspec: {{ports: [{{name: sql, port: 5432}}]}}\n",
        n("db")
    ));
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let db_ip = svc.spec.unwrap().cluster_ip.unwrap();
    let api_ip = services
        .get("kubernetes")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let db_var = n("db").to_uppercase().replace('-', "_");

    // Every kind at once; the container reports what it sees, then
    // watches the ConfigMap's and the labels' files.
    let script = "cd /v; echo modes $(stat -c '%a' cm/..data/greeting) $(stat -c '%a' items/dir/g.txt) $(stat -c '%a' sec/..data/password); \
        echo cm $(cat cm/greeting) items $(cat items/dir/g.txt) blob $(od -An -tx1 cm/blob | tr -d ' '); \
        echo secret $(cat sec/password) opt $(ls opt | wc -l); \
        echo mounts $(grep -c ' /v/sec tmpfs' /proc/mounts) ro $(touch cm/x 2>/dev/null && echo rw || echo ro); \
        echo name $(cat down/name) labels $(cat down/labels | tr '\\n' ' '); \
        env | grep -E '_SERVICE_(HOST|PORT_HTTPS)=' | sed 's/^/svc /'; \
        while true; do echo now $(cat cm/greeting) $(cat down/labels | tr '\\n' ' '); sleep 0.2; done";
    create(&pods, &node, &n("all"), &format!(
        "  containers:\n  - name: c\n    image: {BB}\n    command: [sh, -c, {script:?}]\n    volumeMounts:\n    - {{name: cm, mountPath: /v/cm}}\n    - {{name: items, mountPath: /v/items}}\n    - {{name: sec, mountPath: /v/sec}}\n    - {{name: opt, mountPath: /v/opt}}\n    - {{name: down, mountPath: /v/down}}\n  volumes:\n  - {{name: cm, configMap: {{name: {cm}, defaultMode: 288}}}}\n  - {{name: items, configMap: {{name: {cm}, items: [{{key: greeting, path: dir/g.txt, mode: 384}}]}}}}\n  - {{name: sec, secret: {{secretName: {sec}}}}}\n  - {{name: opt, configMap: {{name: {node}-nothere, optional: true}}}}\n  - {{name: down, downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}, {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}}}\n",
        cm = n("cm"), sec = n("sec")
    )).await;
    let l = wait_log(j.dir.path(), &n("all"), "svc ", 60).await;
    for want in [
        format!("svc KUBERNETES_SERVICE_HOST={api_ip}"),
        "svc KUBERNETES_SERVICE_PORT_HTTPS=443".into(),
        format!("svc {db_var}_SERVICE_HOST={db_ip}"),
    ] {
        assert!(l.contains(&want), "{want} in {l}");
    }
    assert!(l.contains("modes 440 600 644"), "{l}");
    assert!(l.contains("cm hello items hello blob 000102"), "{l}");
    assert!(l.contains("secret s3cret opt 0"), "{l}");
    assert!(l.contains("mounts 1 ro ro"), "{l}");
    assert!(
        l.contains(&format!("name {} labels tier=\"one\"", n("all"))),
        "{l}"
    );

    // fsGroup: the emptyDir (0777, setgid) and the ConfigMap's files belong
    // to the group, and a non-root user's new file inherits it.
    let fsg = "echo fsg $(stat -c '%g %a' /v/e) $(stat -c '%g %a' /v/c/..data/g) $(touch /v/e/x && stat -c %g /v/e/x); sleep 600";
    create(&pods, &node, &n("fsg"), &format!(
        "  securityContext: {{fsGroup: 1234, runAsUser: 1000}}\n  containers:\n  - name: c\n    image: {BB}\n    command: [sh, -c, {fsg:?}]\n    volumeMounts: [{{name: e, mountPath: /v/e}}, {{name: c, mountPath: /v/c}}]\n  volumes:\n  - {{name: e, emptyDir: {{}}}}\n  - {{name: c, configMap: {{name: {}, items: [{{key: greeting, path: g, mode: 384}}]}}}}\n",
        n("cm")
    ))
    .await;
    let l = wait_log(j.dir.path(), &n("fsg"), "fsg ", 60).await;
    assert!(l.contains("fsg 1234 2777 1234 640 1234"), "{l}");

    // An update reaches the running container; so does a new label.
    let t0 = Instant::now();
    let patch = serde_json::json!({"data": {"greeting": "bonjour"}});
    cms.patch(&n("cm"), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_log(j.dir.path(), &n("all"), "now bonjour", 60).await;
    eprintln!(
        "figure: ConfigMap update seen in the running container's file after {:?} ({rt:?})",
        t0.elapsed()
    );
    let t0 = Instant::now();
    let patch = serde_json::json!({"metadata": {"labels": {"extra": "yes"}}});
    pods.patch(&n("all"), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_log(j.dir.path(), &n("all"), "extra=\"yes\"", 60).await;
    eprintln!(
        "figure: label change seen in the downwardAPI file after {:?} ({rt:?})",
        t0.elapsed()
    );
    assert_eq!(
        restarts(&pods.get(&n("all")).await.unwrap()),
        0,
        "updated without a restart"
    );

    // A missing ConfigMap: upstream's FailedMount, the pod waits; it starts
    // once the object exists. A missing key: its own message.
    create(&pods, &node, &n("wait"), &format!(
        "  containers:\n  - name: c\n    image: {BB}\n    command: [sh, -c, 'echo $(cat /v/k); sleep 600']\n    volumeMounts: [{{name: v, mountPath: /v}}]\n  volumes: [{{name: v, configMap: {{name: {}}}}}]\n", n("late")
    )).await;
    create(&pods, &node, &n("nokey"), &format!(
        "  containers:\n  - name: c\n    image: {BB}\n    command: [sleep, '600']\n    volumeMounts: [{{name: v, mountPath: /v}}]\n  volumes: [{{name: v, configMap: {{name: {}, items: [{{key: absent, path: a}}]}}}}]\n", n("cm")
    )).await;
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let failed_mount = |pod: String, part: String| {
        let events = events.clone();
        async move {
            let lp = ListParams::default()
                .fields(&format!("involvedObject.name={pod},reason=FailedMount"));
            events
                .list(&lp)
                .await
                .ok()?
                .items
                .into_iter()
                .filter_map(|e| e.message)
                .find(|m| m.contains(&part))
        }
    };
    let m = wait_for(
        "FailedMount for the missing ConfigMap",
        Duration::from_secs(60),
        || failed_mount(n("wait"), "not found".into()),
    )
    .await;
    assert_eq!(
        m,
        format!(
            "MountVolume.SetUp failed for volume \"v\" : configmap \"{}\" not found",
            n("late")
        )
    );
    let m = wait_for(
        "FailedMount for the missing key",
        Duration::from_secs(60),
        || failed_mount(n("nokey"), "absent".into()),
    )
    .await;
    assert!(
        m.ends_with("configmap references non-existent config key: absent"),
        "{m}"
    );
    let late: ConfigMap = from_yaml(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {}}}\ndata: {{k: arrived}}\n",
        n("late")
    ));
    cms.create(&PostParams::default(), &late).await.unwrap();
    wait_log(j.dir.path(), &n("wait"), "arrived", 60).await;

    let root = j.k.dir.path().join("root");
    assert!(
        !mounts_under(&root).is_empty(),
        "the secret's tmpfs is mounted"
    );
    delete_all(&pods, &[n("all"), n("fsg"), n("wait"), n("nokey")]).await;
    wait_for("no volume mount left", Duration::from_secs(30), || async {
        mounts_under(&root).is_empty().then_some(())
    })
    .await;
    for c in [n("cm"), n("late")] {
        let _ = cms.delete(&c, &DeleteParams::default()).await;
    }
    let _ = secrets.delete(&n("sec"), &DeleteParams::default()).await;
    let _ = services.delete(&n("db"), &DeleteParams::default()).await;
}

async fn the_service_account_token_authenticates(rt: Rt) {
    use base64::Engine as _;
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let admin = admin().await;
    let j = join(
        rt,
        "kl-sa",
        &[pods::busybox_archive(), pods::agnhost_archive()],
    );
    let node = j.k.name.clone();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    wait_ready(&nodes, &node, Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let name = format!("{node}-sa");
    let port = cluster_port();
    // The apiserver adds the kube-api-access volume. agnhost's in-cluster
    // client (client-go's InClusterConfig: the token, the CA, verified
    // TLS) calls the apiserver every second; an invalid token would be
    // refused (401) even there. The other container shows the files.
    let script = "d=/var/run/secrets/kubernetes.io/serviceaccount; echo ns $(cat $d/namespace); echo ca $(base64 $d/ca.crt | tr -d '\\n'); echo token $(cat $d/token); sleep 600";
    create(&pods, &node, &name, &format!(
        "  containers:\n  - name: client\n    image: kinglet.test/agnhost:2.66.1\n    args: [inclusterclient, --poll-interval=1]\n    env: [{{name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}}, {{name: KUBERNETES_SERVICE_PORT, value: '{port}'}}]\n  - name: c\n    image: {BB}\n    command: [sh, -c, {script:?}]\n"
    )).await;
    let l = wait_log(j.dir.path(), &name, "token ", 60).await;
    assert!(l.contains("ns default"), "{l}");
    let field = |k: &str| {
        l.lines()
            .find_map(|x| x.strip_prefix(&format!("{k} ")))
            .unwrap()
            .trim()
            .to_string()
    };
    let token = field("token");
    let ca = base64::engine::general_purpose::STANDARD
        .decode(field("ca"))
        .unwrap();
    let cluster_ca = std::fs::read(cluster_dir().join("pki/ca.crt")).unwrap();
    assert_eq!(
        ca, cluster_ca,
        "ca.crt is the cluster's CA (kube-root-ca.crt)"
    );
    // In the pod: authenticated calls, no failure.
    let calls = wait_for(
        "the in-cluster client's calls",
        Duration::from_secs(60),
        || async {
            let l = pod_log(j.dir.path(), &name);
            (l.matches("calling /healthz").count() >= 3).then_some(l)
        },
    )
    .await;
    assert!(!calls.contains("status=failed"), "{calls}");
    assert!(calls.contains("authz_header="), "{calls}");
    // Who the token is: the pod's service account, bound to the pod.
    let mut cfg = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
    cfg.root_cert = Some(vec![pem_der(&ca)]);
    cfg.auth_info.token = Some(token.into());
    let client = kube::Client::try_from(cfg).unwrap();
    let ssr: SelfSubjectReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"
    }))
    .unwrap();
    let who = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &ssr)
        .await
        .unwrap();
    let user = who.status.unwrap().user_info.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:default")
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec![name.clone()])
    );
    delete_all(&pods, &[name]).await;
    wait_for("no volume mount left", Duration::from_secs(30), || async {
        mounts_under(&j.k.dir.path().join("root"))
            .is_empty()
            .then_some(())
    })
    .await;
}

/// The DER of the first certificate in a PEM file.
fn pem_der(pem: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let text = String::from_utf8_lossy(pem);
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// An image volume (GA in 1.36): in-process, the image from kinglet's store
/// mounted read-only, whole and by sub path; through containerd 1.6,
/// upstream's `CreateContainerConfigError` saying why.
async fn image_volumes_mount_read_only(rt: Rt) {
    let (j, _admin, pods) = ready_node(rt, "kl-img", &[pods::busybox_archive()]).await;
    let node = j.k.name.clone();
    let name = format!("{node}-imgvol");
    let script = "echo whole $(ls /img/bin/busybox) sub $(grep -c root /etc-of-image/passwd) $(touch /img/x 2>/dev/null && echo rw || echo ro); sleep 600";
    create(&pods, &node, &name, &format!(
        "  containers:\n  - name: c\n    image: {BB}\n    command: [sh, -c, {script:?}]\n    volumeMounts:\n    - {{name: img, mountPath: /img}}\n    - {{name: img, mountPath: /etc-of-image, subPath: etc}}\n  volumes:\n  - {{name: img, image: {{reference: '{BB}', pullPolicy: IfNotPresent}}}}\n"
    )).await;
    match rt {
        Rt::Oci => {
            let l = wait_log(j.dir.path(), &name, "whole ", 60).await;
            assert!(l.contains("whole /img/bin/busybox sub 1 ro"), "{l}");
        }
        Rt::Cri => {
            let p = wait_for(
                "CreateContainerConfigError",
                Duration::from_secs(60),
                || async {
                    let p = pods.get(&name).await.ok()?;
                    let w = p
                        .status
                        .as_ref()?
                        .container_statuses
                        .as_ref()?
                        .first()?
                        .state
                        .as_ref()?
                        .waiting
                        .clone()?;
                    (w.reason.as_deref() == Some("CreateContainerConfigError")).then_some(w)
                },
            )
            .await;
            let m = p.message.unwrap_or_default();
            assert!(
                m.starts_with("image volumes need containerd 2.1 or newer"),
                "{m}"
            );
        }
    }
    delete_all(&pods, &[name]).await;
    wait_for("no volume mount left", Duration::from_secs(30), || async {
        mounts_under(&j.k.dir.path().join("root"))
            .is_empty()
            .then_some(())
    })
    .await;
}

async fn watched_objects_cost(rt: Rt) {
    const N: usize = 100;
    let admin = admin().await;
    let j = join(rt, "kl-watch", &[pods::busybox_archive()]);
    let node = j.k.name.clone();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    wait_ready(&nodes, &node, Duration::from_secs(30)).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let names: Vec<String> = (0..N).map(|i| format!("{node}-w{i}")).collect();
    for n in &names {
        let cm: ConfigMap = from_yaml(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {n}}}\ndata: {{k: v}}\n"
        ));
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let before = rss_kib(j.k.pid());
    let mut volumes = String::new();
    let mut mounts = String::new();
    for (i, n) in names.iter().enumerate() {
        volumes.push_str(&format!("  - {{name: v{i}, configMap: {{name: {n}}}}}\n"));
        mounts.push_str(&format!("    - {{name: v{i}, mountPath: /v/{i}}}\n"));
    }
    let name = format!("{node}-many");
    let t0 = Instant::now();
    create(&pods, &node, &name, &format!("  containers:\n  - name: c\n    image: {BB}\n    command: [sleep, '600']\n    volumeMounts:\n{mounts}  volumes:\n{volumes}")).await;
    wait_for(
        "the pod with 100 ConfigMap volumes Running",
        Duration::from_secs(120),
        || async {
            let p = pods.get(&name).await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        },
    )
    .await;
    let setup = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(j.k.pid());
    eprintln!("figure: pod with {N} ConfigMap volumes Running after {setup:?} ({rt:?})");
    eprintln!(
        "figure: agent RSS {before} -> {after} KiB with {N} watched ConfigMaps: {:.1} KiB per object (watch, cache, volume)",
        (after.saturating_sub(before)) as f64 / N as f64
    );
    delete_all(&pods, &[name]).await;
    for n in &names {
        let _ = cms.delete(n, &DeleteParams::default()).await;
    }
}
