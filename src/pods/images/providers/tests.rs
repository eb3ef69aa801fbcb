//! The plugins run for real: small shell scripts in a temporary bin dir.

use super::*;

/// A bin dir with `provider` (a script answering `answer`, recording its
/// request, arguments and runs) and its config.
fn setup(answer: &str, extra: &str) -> (tempfile::TempDir, CredentialProviders) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = format!(
        "#!/bin/sh\ncat > {d}/request.json\necho \"$@ $REGION\" > {d}/args\necho run >> {d}/runs\ncat <<'EOF'\n{answer}\nEOF\n"
    );
    let bin = dir.path().join("provider");
    std::fs::write(&bin, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: provider\n  matchImages: [\"127.0.0.1:5000\", \"*.registry.test\"]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [get-credentials]\n  env: [{{name: REGION, value: edge}}]\n{extra}"
        ),
    )
    .unwrap();
    let p = CredentialProviders::load(&cfg, dir.path(), None).unwrap();
    (dir, p)
}

fn answer(cache_key_type: &str, duration: &str) -> String {
    format!(
        r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"{cache_key_type}",{duration}"auth":{{"127.0.0.1:5000":{{"username":"u","password":"p"}},"127.0.0.1:5000/team":{{"username":"team","password":"t"}},"other.io":{{"username":"x","password":"y"}}}}}}"#
    )
}

fn runs(dir: &tempfile::TempDir) -> usize {
    std::fs::read_to_string(dir.path().join("runs"))
        .unwrap_or_default()
        .lines()
        .count()
}

#[tokio::test]
async fn a_matching_image_gets_the_plugins_credentials_most_specific_first() {
    let (dir, p) = setup(&answer("Registry", ""), "");
    let pod = PodIdentity::default();
    let got = p.credentials("127.0.0.1:5000/team/app:1", &pod).await;
    let users: Vec<&str> = got.iter().map(|a| a.username.as_str()).collect();
    assert_eq!(users, ["team", "u"]);
    let req: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("request.json")).unwrap()).unwrap();
    assert_eq!(req["kind"], "CredentialProviderRequest");
    assert_eq!(req["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(req["image"], "127.0.0.1:5000/team/app:1");
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert_eq!(args.trim(), "get-credentials edge");
    // Not matched by matchImages: the plugin is not run.
    assert!(
        p.credentials("docker.io/library/busybox", &pod)
            .await
            .is_empty()
    );
    assert_eq!(runs(&dir), 1);
}

#[tokio::test]
async fn answers_are_cached_by_their_key_type_and_duration() {
    let pod = PodIdentity::default();
    // By registry: another image of it is answered from the cache.
    let (dir, p) = setup(&answer("Registry", ""), "");
    p.credentials("127.0.0.1:5000/a:1", &pod).await;
    p.credentials("127.0.0.1:5000/b:1", &pod).await;
    assert_eq!(runs(&dir), 1);
    // By image: another image runs it again, the same one does not.
    let (dir, p) = setup(&answer("Image", ""), "");
    p.credentials("127.0.0.1:5000/a:1", &pod).await;
    p.credentials("127.0.0.1:5000/a:1", &pod).await;
    p.credentials("127.0.0.1:5000/b:1", &pod).await;
    assert_eq!(runs(&dir), 2);
    // A duration of 0: never cached.
    let (dir, p) = setup(&answer("Global", r#""cacheDuration":"0s","#), "");
    p.credentials("127.0.0.1:5000/a:1", &pod).await;
    p.credentials("127.0.0.1:5000/a:1", &pod).await;
    assert_eq!(runs(&dir), 2);
    // Concurrent pulls of one image run it once.
    let (dir, p) = setup(&answer("Image", ""), "");
    let (a, b) = tokio::join!(
        p.credentials("127.0.0.1:5000/a:1", &pod),
        p.credentials("127.0.0.1:5000/a:1", &pod)
    );
    assert_eq!((a.len(), b.len(), runs(&dir)), (1, 1, 1));
}

#[tokio::test]
async fn bad_answers_give_no_credentials() {
    let pod = PodIdentity::default();
    for bad in [
        answer("Registry", "").replace("/v1\"", "/v1beta1\""),
        answer("Sometimes", ""),
        answer("Registry", "").replace("\"auth\"", "\"extra\":1,\"auth\""),
        "not json".to_string(),
    ] {
        let (_dir, p) = setup(&bad, "");
        assert!(
            p.credentials("127.0.0.1:5000/a:1", &pod).await.is_empty(),
            "{bad}"
        );
    }
    // A plugin that fails, or floods its stdout.
    let (dir, p) = setup("", "");
    std::fs::write(
        dir.path().join("provider"),
        "#!/bin/sh\necho denied >&2\nexit 3\n",
    )
    .unwrap();
    assert!(p.credentials("127.0.0.1:5000/a:1", &pod).await.is_empty());
    std::fs::write(
        dir.path().join("provider"),
        "#!/bin/sh\nhead -c 2000000 /dev/zero\n",
    )
    .unwrap();
    assert!(p.credentials("127.0.0.1:5000/a:1", &pod).await.is_empty());
    let e = p.plugins[0].exec("i", b"{}").await.unwrap_err().to_string();
    assert!(e.contains("more than 1048576 bytes"), "{e}");
}

#[tokio::test]
async fn a_token_mode_plugin_without_a_service_account_runs_only_if_allowed() {
    let attrs = "  tokenAttributes: {serviceAccountTokenAudience: registry, requireServiceAccount: REQ, cacheType: ServiceAccount}\n";
    let pod = PodIdentity::default();
    let (dir, p) = setup(&answer("Image", ""), &attrs.replace("REQ", "true"));
    assert!(p.credentials("127.0.0.1:5000/a:1", &pod).await.is_empty());
    assert_eq!(runs(&dir), 0);
    let (dir, p) = setup(&answer("Image", ""), &attrs.replace("REQ", "false"));
    assert_eq!(p.credentials("127.0.0.1:5000/a:1", &pod).await.len(), 1);
    let req = std::fs::read_to_string(dir.path().join("request.json")).unwrap();
    assert!(!req.contains("serviceAccountToken"), "{req}");
}

#[test]
fn a_missing_executable_or_bin_dir_is_an_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: gone\n  matchImages: [x.io]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n").unwrap();
    let e = CredentialProviders::load(&cfg, dir.path(), None).unwrap_err();
    assert!(
        e.to_string().contains("plugin binary executable") && e.to_string().contains("gone"),
        "{e}"
    );
    let e = CredentialProviders::load(&cfg, &dir.path().join("nope"), None).unwrap_err();
    assert!(e.to_string().contains("plugin binary directory"), "{e}");
}
