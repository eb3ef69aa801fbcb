//! Image credential provider plugins, as upstream's
//! `pkg/credentialprovider/plugin` (GA since 1.26): for an image one of a
//! provider's `matchImages` matches, kinglet runs the provider's executable
//! from `--image-credential-provider-bin-dir` with a
//! `CredentialProviderRequest` on its stdin and reads a
//! `CredentialProviderResponse` from its stdout; the credentials of the
//! answer's `auth` entries that match the image are tried after the pod's
//! image pull secrets. Answers are cached by the answer's `cacheKeyType`
//! (the image, its registry, or once for all) for its `cacheDuration` or
//! the provider's `defaultCacheDuration` (0: not cached). With
//! `tokenAttributes`, the plugin is also given a token of the pod's
//! service account for the configured audience, bound to the pod, and
//! the annotations the config names (upstream's
//! `KubeletServiceAccountTokenForCredentialProviders`).
//!
//! A plugin that fails, times out (1 minute, as upstream), writes more
//! than 1 MiB or answers in another API version gives no credentials and
//! a warning; the pull goes on with what else there is, as upstream's.

pub mod config;
pub mod matching;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use kinglet_runtime::PullAuth;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use config::{Provider, ProviderConfig, ProviderConfigError};
use matching::Pattern;

/// How long a plugin may run.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// The most a plugin may write on stdout (and of its stderr kept).
const MAX_OUTPUT: u64 = 1 << 20;
/// Cached answers per plugin, at most (expired ones go first).
const MAX_CACHED: usize = 256;

/// The configured plugins.
pub struct CredentialProviders {
    plugins: Vec<Plugin>,
    /// For service account tokens, when an API server is configured.
    client: Option<kube::Client>,
}

impl std::fmt::Debug for CredentialProviders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.plugins.iter().map(|p| p.spec.name.as_str()).collect();
        f.debug_struct("CredentialProviders")
            .field("plugins", &names)
            .finish()
    }
}

struct Plugin {
    spec: Provider,
    patterns: Vec<Pattern>,
    bin: std::path::PathBuf,
    cache: Mutex<HashMap<String, Cached>>,
    /// One run at a time per plugin: a burst of pulls of one image runs
    /// it once (upstream's singleflight), the others find the cache.
    running: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Cached {
    expires: Instant,
    auth: Vec<(String, PullAuth)>,
}

/// The pod an image is pulled for (for service account tokens).
#[derive(Clone, Debug, Default)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub service_account: String,
}

/// Why a plugin gave no credentials.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("error execing credential provider plugin {name} for image {image}: {message}")]
    Exec {
        name: String,
        image: String,
        message: String,
    },
    #[error("credential provider plugin {name}: {message}")]
    Response { name: String, message: String },
    #[error("credential provider plugin {name}: service account {namespace}/{account}: {message}")]
    ServiceAccount {
        name: String,
        namespace: String,
        account: String,
        message: String,
    },
}

/// What a plugin writes (`credentialprovider.kubelet.k8s.io`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Response {
    api_version: String,
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    cache_duration: Option<crate::config::GoDuration>,
    #[serde(default)]
    auth: BTreeMap<String, AuthConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthConfig {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

impl CredentialProviders {
    /// Reads the config and finds each plugin's executable, as upstream
    /// does at start: a missing one is an error.
    pub fn load(
        config: &Path,
        bin_dir: &Path,
        client: Option<kube::Client>,
    ) -> Result<CredentialProviders, ProviderConfigError> {
        if !bin_dir.is_dir() {
            return Err(ProviderConfigError::BinDir(bin_dir.into()));
        }
        let cfg = ProviderConfig::load(config)?;
        let mut plugins = Vec::new();
        for spec in cfg.providers {
            let bin = bin_dir.join(&spec.name);
            if !bin.is_file() {
                return Err(ProviderConfigError::Binary(bin));
            }
            let patterns = spec
                .match_images
                .iter()
                .filter_map(|m| Pattern::parse(m).ok())
                .collect();
            plugins.push(Plugin {
                spec,
                patterns,
                bin,
                cache: Mutex::new(HashMap::new()),
                running: tokio::sync::Mutex::new(()),
            });
        }
        Ok(CredentialProviders { plugins, client })
    }

    /// The credentials the plugins give for `image`, most specific key
    /// first, earlier plugins first. Failures are logged and skipped.
    pub async fn credentials(&self, image: &str, pod: &PodIdentity) -> Vec<PullAuth> {
        let mut out = Vec::new();
        for p in &self.plugins {
            if !p.patterns.iter().any(|m| m.matches(image)) {
                continue;
            }
            match p.provide(image, pod, self.client.as_ref()).await {
                Ok(auth) => out.extend(keyring_lookup(&auth, image)),
                Err(e) => {
                    tracing::warn!(error = %e, "Failed getting credential from external registry credential provider")
                }
            }
        }
        out
    }
}

/// The credentials whose key matches `image`, more specific keys first
/// (upstream sorts its keyring's index in reverse).
fn keyring_lookup(auth: &[(String, PullAuth)], image: &str) -> Vec<PullAuth> {
    let mut hits: Vec<&(String, PullAuth)> = auth
        .iter()
        .filter(|(key, _)| Pattern::parse(key).is_ok_and(|p| p.matches(image)))
        .collect();
    hits.sort_by(|a, b| b.0.cmp(&a.0));
    hits.into_iter().map(|(_, a)| a.clone()).collect()
}

/// The registry part of an image, as upstream's `parseRegistry`.
fn registry(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

impl Plugin {
    async fn provide(
        &self,
        image: &str,
        pod: &PodIdentity,
        client: Option<&kube::Client>,
    ) -> Result<Vec<(String, PullAuth)>, PluginError> {
        let sa = match &self.spec.token_attributes {
            Some(t) => self.service_account(t, pod, client).await?,
            None => None,
        };
        let suffix = sa
            .as_ref()
            .map(|s| s.cache_suffix(self))
            .unwrap_or_default();
        if let Some(hit) = self.cached(image, &suffix) {
            return Ok(hit);
        }
        let _one = self.running.lock().await;
        if let Some(hit) = self.cached(image, &suffix) {
            return Ok(hit);
        }
        let request = self.request(image, sa.as_ref());
        let response = self.exec(image, &request).await?;
        self.remember(image, &suffix, response)
    }

    fn cached(&self, image: &str, suffix: &str) -> Option<Vec<(String, PullAuth)>> {
        let now = Instant::now();
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        [image, registry(image), "global"].iter().find_map(|k| {
            let e = cache.get(&format!("{k}\n{suffix}"))?;
            (e.expires > now).then(|| e.auth.clone())
        })
    }

    /// Checks the answer, caches it as it asks, and returns its
    /// credentials.
    fn remember(
        &self,
        image: &str,
        suffix: &str,
        r: Response,
    ) -> Result<Vec<(String, PullAuth)>, PluginError> {
        let bad = |message: String| PluginError::Response {
            name: self.spec.name.clone(),
            message,
        };
        if r.api_version != self.spec.api_version {
            return Err(bad(format!(
                "apiVersion from credential plugin response did not match expected apiVersion:{}, actual apiVersion:{}",
                self.spec.api_version, r.api_version
            )));
        }
        if r.kind != "CredentialProviderResponse" {
            return Err(bad(format!("unexpected kind {:?}", r.kind)));
        }
        let key = match r.cache_key_type.as_str() {
            "Image" => image,
            "Registry" => registry(image),
            "Global" => "global",
            other => {
                return Err(bad(format!(
                    "did not return a valid cacheKeyType: {other:?}"
                )));
            }
        };
        let auth: Vec<(String, PullAuth)> = r
            .auth
            .into_iter()
            .map(|(k, a)| {
                let pa = PullAuth {
                    username: a.username,
                    password: a.password,
                };
                (k, pa)
            })
            .collect();
        let ttl = r.cache_duration.map_or(self.spec.cache_duration(), |d| d.0);
        if !ttl.is_zero() {
            self.insert(format!("{key}\n{suffix}"), ttl, auth.clone());
        }
        Ok(auth)
    }

    fn insert(&self, key: String, ttl: Duration, auth: Vec<(String, PullAuth)>) {
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|_, e| e.expires > now);
        if cache.len() >= MAX_CACHED
            && let Some(oldest) = cache
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone())
        {
            cache.remove(&oldest);
        }
        let expires = now + ttl;
        cache.insert(key, Cached { expires, auth });
    }

    fn request(&self, image: &str, sa: Option<&ServiceAccountData>) -> Vec<u8> {
        let mut req = serde_json::json!({
            "apiVersion": self.spec.api_version,
            "kind": "CredentialProviderRequest",
            "image": image,
        });
        if let Some(sa) = sa {
            req["serviceAccountToken"] = sa.token.clone().into();
            req["serviceAccountAnnotations"] = serde_json::json!(sa.annotations);
        }
        req.to_string().into_bytes()
    }

    /// Runs the executable: the request on stdin, the answer from stdout,
    /// within [`EXEC_TIMEOUT`] and [`MAX_OUTPUT`].
    async fn exec(&self, image: &str, request: &[u8]) -> Result<Response, PluginError> {
        let fail = |message: String| PluginError::Exec {
            name: self.spec.name.clone(),
            image: image.into(),
            message,
        };
        let mut child = tokio::process::Command::new(&self.bin)
            .args(&self.spec.args)
            .envs(self.spec.env.iter().map(|e| (&e.name, &e.value)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(e.to_string()))?;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let run = async {
            let write = async {
                if let Some(mut s) = stdin {
                    let _ = s.write_all(request).await;
                }
            };
            let (_, out, err) = tokio::join!(write, read_bounded(stdout), read_bounded(stderr));
            (child.wait().await, out, err)
        };
        let (status, out, err) = tokio::time::timeout(EXEC_TIMEOUT, run)
            .await
            .map_err(|_| fail("context deadline exceeded".into()))?;
        // Too much output first: the plugin then dies of SIGPIPE.
        let out = out.ok_or_else(|| fail(format!("more than {MAX_OUTPUT} bytes on stdout")))?;
        let status = status.map_err(|e| fail(e.to_string()))?;
        let err = String::from_utf8_lossy(&err.unwrap_or_default())
            .trim()
            .to_string();
        if !status.success() {
            return Err(fail(format!("{status}: {err}")));
        }
        // The decoding error is not shown: the answer may hold secrets.
        serde_json::from_slice(&out).map_err(|_| PluginError::Response {
            name: self.spec.name.clone(),
            message: "error decoding credential provider plugin response from stdout".into(),
        })
    }
}

/// All of a pipe, or `None` past [`MAX_OUTPUT`] bytes.
async fn read_bounded<R: tokio::io::AsyncRead + Unpin>(r: Option<R>) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let r = r?;
    r.take(MAX_OUTPUT + 1).read_to_end(&mut buf).await.ok()?;
    (buf.len() as u64 <= MAX_OUTPUT).then_some(buf)
}

/// What a plugin in token mode is given of the pod's service account.
struct ServiceAccountData {
    namespace: String,
    name: String,
    uid: String,
    annotations: BTreeMap<String, String>,
    token: String,
}

impl ServiceAccountData {
    /// The cache key's part for the account: by account (and its
    /// annotations), or by the token itself (`cacheType`).
    fn cache_suffix(&self, p: &Plugin) -> String {
        let by_token = p
            .spec
            .token_attributes
            .as_ref()
            .is_some_and(|t| t.cache_type == "Token");
        if by_token {
            return self.token.clone();
        }
        let ann = serde_json::json!(self.annotations);
        format!("{}/{}/{}/{ann}", self.namespace, self.name, self.uid)
    }
}

impl Plugin {
    /// The pod's service account data and a token for the plugin's
    /// audience; `None` when the pod has no account and the plugin runs
    /// without one.
    async fn service_account(
        &self,
        t: &config::TokenAttributes,
        pod: &PodIdentity,
        client: Option<&kube::Client>,
    ) -> Result<Option<ServiceAccountData>, PluginError> {
        let fail = |message: String| PluginError::ServiceAccount {
            name: self.spec.name.clone(),
            namespace: pod.namespace.clone(),
            account: pod.service_account.clone(),
            message,
        };
        if pod.service_account.is_empty() {
            return match t.require_service_account {
                Some(true) => Err(fail("the pod has no service account".into())),
                _ => Ok(None),
            };
        }
        let client = client.ok_or_else(|| fail("no API server to ask".into()))?;
        let api = kube::Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
            client.clone(),
            &pod.namespace,
        );
        let sa = api
            .get(&pod.service_account)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let have = sa.metadata.annotations.unwrap_or_default();
        let mut annotations = BTreeMap::new();
        for k in &t.required_service_account_annotation_keys {
            let v = have
                .get(k)
                .ok_or_else(|| fail(format!("required annotation {k} not found")))?;
            annotations.insert(k.clone(), v.clone());
        }
        for k in &t.optional_service_account_annotation_keys {
            if let Some(v) = have.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let token = bound_token(&api, pod, &t.service_account_token_audience)
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok(Some(ServiceAccountData {
            namespace: pod.namespace.clone(),
            name: pod.service_account.clone(),
            uid: sa.metadata.uid.unwrap_or_default(),
            annotations,
            token,
        }))
    }
}

/// A token of the pod's service account for `audience`, bound to the pod
/// (the apiserver's default lifetime, as upstream asks).
async fn bound_token(
    api: &kube::Api<k8s_openapi::api::core::v1::ServiceAccount>,
    pod: &PodIdentity,
    audience: &str,
) -> Result<String, kube::Error> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_string()]),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let resp = api
        .create_token_request(&pod.service_account, &Default::default(), &req)
        .await?;
    Ok(resp.status.and_then(|s| s.token).unwrap_or_default())
}

#[cfg(test)]
mod tests;
