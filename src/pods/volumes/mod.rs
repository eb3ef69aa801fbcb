//! The volume manager of one pod (upstream's volume manager and the
//! `configmap`, `secret`, `downwardapi`, `projected` and `emptydir`
//! plugins), owned by the pod's worker: every volume is ready before a
//! container starts, and kept current while the pod runs.
//!
//! - emptyDir on disk, or on tmpfs with `medium: Memory`; hostPath type
//!   checks ([`host::prepare_volumes`]);
//! - configMap, secret, downwardAPI and projected volumes written with
//!   upstream's atomic writer ([`atomic`]) from what [`render`] computes;
//!   secrets and projected volumes on tmpfs, never on disk;
//! - the objects they read are followed by the node's [`ObjectCache`] (one
//!   watch per object): a change wakes the worker, whose next round writes
//!   the new files into the running pod — no restart, no polling; labels
//!   and annotations (downwardAPI) follow the pod's own updates;
//! - service account tokens through the TokenRequest API, bound to the pod,
//!   refreshed at 80 % of their life or after 24 h, as upstream's token
//!   manager; the round after a refresh is due is what the worker's timer
//!   wakes for.
//!
//! - what they read is kept in the node's [`crate::store::LocalStore`] as it is read, and
//!   read back from there when the API server cannot be reached (a token
//!   only while it has not expired), so a pod's volumes are made again
//!   after an offline reboot.
//!
//! Failures come back as upstream's `FailedMount` messages; the worker
//! reports them and retries.

pub mod atomic;
mod certs;
pub mod host;
pub mod lazywatch;
pub mod podcert;
pub mod render;
pub mod subpath;
pub mod trust;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{ClusterTrustBundle, PodCertificateRequest};
use k8s_openapi::api::core::v1::{Pod, Volume, VolumeProjection};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::objects::{Object, ObjectCache, Subscription};
use crate::pods::util::NodeFacts;
use crate::pods::util::{ObjectError, ObjectKind};
use render::Payload;

/// What the volumes of a node's pods read from the API server.
pub struct Sources {
    pub objects: Arc<ObjectCache>,
    /// ClusterTrustBundles, watched while a pod projects one.
    pub trust: Arc<trust::TrustBundles>,
    /// The node's PodCertificateRequests, watched while a pod projects a
    /// pod certificate.
    pub requests: Arc<podcert::Requests>,
    /// The Node object's UID, which pod certificate requests name.
    pub node_uid: tokio::sync::OnceCell<String>,
    pub client: kube::Client,
    /// Whether the API server is known unreachable (the lease's last
    /// renewal failed, before a reboot too): kept copies are then used
    /// without waiting for it.
    pub link: Option<crate::health::ApiLink>,
}

impl Sources {
    pub fn new(client: kube::Client, node: &str, link: Option<crate::health::ApiLink>) -> Self {
        Sources {
            objects: ObjectCache::new(client.clone()),
            trust: trust::watch(client.clone()),
            requests: podcert::watch(client.clone(), node),
            node_uid: tokio::sync::OnceCell::new(),
            client,
            link,
        }
    }

    /// How long to wait for the API server when a kept copy exists:
    /// [`KEPT_WAIT`], or not at all once this run has seen the node
    /// offline (the file of an earlier run is not enough: a node that lost
    /// power while offline may boot with the link back, and must then take
    /// the objects as they are now, not as they were kept).
    pub fn kept_wait(&self) -> Duration {
        if self.link.as_ref().is_some_and(|l| l.known_offline()) {
            Duration::ZERO
        } else {
            KEPT_WAIT
        }
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("volume sources")
    }
}

/// How long a volume waits for the first answer about an object.
const OBJECT_WAIT: Duration = Duration::from_secs(10);
/// How long it waits for the API server when the local store has the
/// last copy to start from: after an offline reboot behind a dead route
/// (every packet dropped, so calls hang until their connect timeout) a
/// pod starts from its kept copies within seconds, not minutes. The copy
/// is refreshed from the API server once it answers.
pub const KEPT_WAIT: Duration = Duration::from_secs(3);
/// Upstream's token lifetime when `expirationSeconds` is not set.
const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// Upstream refreshes a token at least once a day.
const TOKEN_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

struct Token {
    value: String,
    refresh_at: Instant,
}

type TokenKey = (String, String, i64);

/// The keys of a ConfigMap or Secret a volume (or projection) asks for.
struct Keys<'a> {
    kind: ObjectKind,
    name: &'a str,
    items: Option<&'a [k8s_openapi::api::core::v1::KeyToPath]>,
    optional: bool,
}

impl<'a> Keys<'a> {
    fn new(
        kind: ObjectKind,
        name: &'a str,
        items: Option<&'a [k8s_openapi::api::core::v1::KeyToPath]>,
        optional: Option<bool>,
    ) -> Self {
        Keys {
            kind,
            name,
            items,
            optional: optional == Some(true),
        }
    }
}

/// Why a pod's volumes are not set up; the `Display` is upstream's
/// `FailedMount` message.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A host dir's check or creation (hostPath types, emptyDir dirs).
    #[error("{0}")]
    Host(String),
    #[error("MountVolume.SetUp failed for volume {volume:?} : {cause}")]
    SetUp { volume: String, cause: SetUpError },
}

/// What failed in one volume's setup.
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    #[error("not a valid volume name")]
    InvalidName,
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// The API server could not be asked for an object, and no copy is
    /// kept.
    #[error("{0}")]
    Unreachable(ObjectError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mounting tmpfs on {}: {source}", path.display())]
    Tmpfs {
        path: PathBuf,
        source: rustix::io::Errno,
    },
    #[error("unsupported projection source")]
    UnsupportedProjection,
    #[error("{0}")]
    Trust(#[from] trust::TrustError),
    #[error("{0}")]
    Certificate(#[from] podcert::CertError),
    #[error("failed to fetch token: {0}")]
    Token(String),
    #[error("{0}")]
    Render(#[from] render::RenderError),
    #[error("volume setup task failed: {0}")]
    Task(String),
}

/// What one round of a pod's volumes read, so what it no longer reads
/// is let go.
#[derive(Default)]
struct Used {
    objects: BTreeSet<(ObjectKind, String)>,
    trust: bool,
    certs: BTreeSet<(String, usize)>,
}

/// The mode of a credential's file (a token, trust anchors, a pod
/// certificate): the default mode, or 0600 when the pod has an `fsGroup`
/// (which then reads it through the group), as upstream.
fn credential_mode(pod: &Pod, default_mode: Option<i32>) -> Result<u32, render::RenderError> {
    if fs_group(pod).is_some() {
        return Ok(0o600);
    }
    render::mode(default_mode, render::DEFAULT_MODE)
}

/// One pod's volumes.
pub struct Volumes {
    node: NodeFacts,
    /// The local store, which keeps what volumes read for offline starts.
    store: Option<Arc<crate::store::LocalStore>>,
    /// What configMap, secret and projected volumes read (none without an
    /// API server).
    sources: Option<Arc<Sources>>,
    wake: Arc<Notify>,
    subs: HashMap<(ObjectKind, String), Subscription>,
    tokens: HashMap<TokenKey, Token>,
    /// The ClusterTrustBundle watch, while a projection reads it.
    trust: Option<lazywatch::Subscription<ClusterTrustBundle, trust::Bundle>>,
    /// The node's PodCertificateRequest watch, while a projection waits.
    requests: Option<lazywatch::Subscription<PodCertificateRequest, podcert::Request>>,
    /// Each podCertificate source's state, by volume and source index.
    certs: HashMap<(String, usize), podcert::CertState>,
    /// What was last written to each volume, so unchanged rounds write
    /// nothing.
    written: HashMap<String, Payload>,
    /// emptyDirs already set up (tmpfs, mode, `fsGroup`).
    owned: BTreeSet<String>,
    /// What was last kept in the local store under each name.
    kept: HashMap<String, Vec<u8>>,
}

/// A token as the local store keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptToken {
    token: String,
    /// Unix seconds.
    expires: i64,
}

/// How soon a value read back from the local store is asked for again.
const OFFLINE_RETRY: Duration = Duration::from_secs(30);

impl Volumes {
    pub fn new(
        node: NodeFacts,
        store: Option<Arc<crate::store::LocalStore>>,
        sources: Option<Arc<Sources>>,
        wake: Arc<Notify>,
    ) -> Self {
        Volumes {
            node,
            store,
            sources,
            wake,
            subs: HashMap::new(),
            tokens: HashMap::new(),
            trust: None,
            requests: None,
            certs: HashMap::new(),
            written: HashMap::new(),
            owned: BTreeSet::new(),
            kept: HashMap::new(),
        }
    }

    /// Keeps `value` (`None`: forgets it) as the pod's copy of `name`,
    /// unless that is what was kept last.
    async fn keep(&mut self, pod: &Pod, name: &str, value: Option<Vec<u8>>) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let bytes = value.clone().unwrap_or_default();
        if self.kept.get(name) == Some(&bytes) {
            return;
        }
        match store.write(&uid, name, value).await {
            Ok(()) => {
                self.kept.insert(name.to_string(), bytes);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot keep a volume's source in the local store")
            }
        }
    }

    /// The pod's kept copy of `name`, if any.
    async fn kept<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        pod: &Pod,
        name: &str,
    ) -> Option<T> {
        let store = self.store.as_ref()?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        store.read_json(&uid, name).await
    }

    /// Prepares (or refreshes) every volume of the pod. `Ok` says when a
    /// token is next due.
    pub async fn setup(&mut self, pod: &Pod) -> Result<Option<Duration>, VolumeError> {
        host::prepare_volumes(pod, &self.node).map_err(|e| VolumeError::Host(e.0))?;
        let mut used = Used::default();
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        for v in volumes {
            let fail = |cause: SetUpError| VolumeError::SetUp {
                volume: v.name.clone(),
                cause,
            };
            let dir = self
                .dir(pod, &v.name)
                .ok_or_else(|| fail(SetUpError::InvalidName))?;
            if v.empty_dir.is_some() {
                self.empty_dir(pod, v, dir).await.map_err(fail)?;
                continue;
            }
            let Some((payload, tmpfs)) = self.payload(pod, v, &mut used).await.map_err(fail)?
            else {
                continue;
            };
            if self.written.get(&v.name) == Some(&payload) {
                continue;
            }
            let gid = fs_group(pod);
            let p = payload.clone();
            blocking(move || {
                if tmpfs {
                    ensure_tmpfs(&dir, None)?;
                }
                atomic::write(&dir, &p, gid)
                    .map(|_| ())
                    .map_err(|source| SetUpError::Io { path: dir, source })
            })
            .await
            .map_err(fail)?;
            self.written.insert(v.name.clone(), payload);
        }
        self.subs.retain(|k, _| used.objects.contains(k));
        if !used.trust {
            self.trust = None;
        }
        self.certs.retain(|k, _| used.certs.contains(k));
        if self.certs.is_empty() {
            self.requests = None;
        }
        let now = Instant::now();
        let token = self
            .tokens
            .values()
            .map(|t| t.refresh_at.saturating_duration_since(now))
            .min();
        Ok(crate::pods::util::soonest(
            token,
            podcert::next_refresh(self.certs.values()),
        ))
    }

    /// An emptyDir, once per worker: on tmpfs with `medium: Memory`,
    /// mode 0777 as upstream makes it, and given to the pod's `fsGroup`
    /// (with `fsGroupChangePolicy: OnRootMismatch` only when its root is
    /// not already right), as upstream's `SetVolumeOwnership`.
    async fn empty_dir(&mut self, pod: &Pod, v: &Volume, dir: PathBuf) -> Result<(), SetUpError> {
        if self.owned.contains(&v.name) {
            return Ok(());
        }
        let size = memory_medium(v);
        let gid = fs_group(pod);
        let on_mismatch = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group_change_policy.as_deref())
            == Some("OnRootMismatch");
        blocking(move || {
            use std::os::unix::fs::PermissionsExt;
            if let Some(size) = size {
                ensure_tmpfs(&dir, size)?;
            }
            let err = |source| SetUpError::Io {
                path: dir.clone(),
                source,
            };
            let mode = std::fs::metadata(&dir).map_err(err)?.permissions().mode();
            if mode & 0o777 != 0o777 {
                let mode = (mode & 0o7000) | 0o777;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                    .map_err(err)?;
            }
            match gid {
                Some(g) => set_ownership(&dir, g, on_mismatch).map_err(err),
                None => Ok(()),
            }
        })
        .await?;
        self.owned.insert(v.name.clone());
        Ok(())
    }

    fn dir(&self, pod: &Pod, volume: &str) -> Option<PathBuf> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        super::util::contained_path(Path::new(&self.node.volume_root), &[&uid, volume])
    }

    /// The files of an object-backed volume and whether it lives on tmpfs;
    /// `None` for the other kinds.
    async fn payload(
        &mut self,
        pod: &Pod,
        v: &Volume,
        used: &mut Used,
    ) -> Result<Option<(Payload, bool)>, SetUpError> {
        if let Some(cm) = &v.config_map {
            let src = Keys::new(
                ObjectKind::ConfigMap,
                &cm.name,
                cm.items.as_deref(),
                cm.optional,
            );
            let p = self.keys(pod, &src, cm.default_mode, used).await?;
            return Ok(Some((p, false)));
        }
        if let Some(s) = &v.secret {
            let name = s.secret_name.as_deref().unwrap_or_default();
            let src = Keys::new(ObjectKind::Secret, name, s.items.as_deref(), s.optional);
            let p = self.keys(pod, &src, s.default_mode, used).await?;
            return Ok(Some((p, true)));
        }
        if let Some(d) = &v.downward_api {
            let items = d.items.as_deref().unwrap_or_default();
            let p = render::downward(pod, items, d.default_mode, &self.node)?;
            return Ok(Some((p, false)));
        }
        if let Some(pr) = &v.projected {
            let mut out = Payload::new();
            for (i, src) in pr.sources.iter().flatten().enumerate() {
                let at = (v.name.as_str(), i);
                out.extend(self.projection(pod, src, at, pr.default_mode, used).await?);
            }
            return Ok(Some((out, true)));
        }
        Ok(None)
    }

    async fn projection(
        &mut self,
        pod: &Pod,
        src: &VolumeProjection,
        at: (&str, usize),
        default_mode: Option<i32>,
        used: &mut Used,
    ) -> Result<Payload, SetUpError> {
        if let Some(cm) = &src.config_map {
            let k = Keys::new(
                ObjectKind::ConfigMap,
                &cm.name,
                cm.items.as_deref(),
                cm.optional,
            );
            return self.keys(pod, &k, default_mode, used).await;
        }
        if let Some(s) = &src.secret {
            let k = Keys::new(ObjectKind::Secret, &s.name, s.items.as_deref(), s.optional);
            return self.keys(pod, &k, default_mode, used).await;
        }
        if let Some(d) = &src.downward_api {
            let items = d.items.as_deref().unwrap_or_default();
            return Ok(render::downward(pod, items, default_mode, &self.node)?);
        }
        if let Some(t) = &src.service_account_token {
            let token = self
                .token(
                    pod,
                    t.audience.as_deref().unwrap_or(""),
                    t.expiration_seconds,
                )
                .await?;
            let f = atomic::FileProjection {
                data: token.into_bytes(),
                mode: credential_mode(pod, default_mode)?,
            };
            return Ok(Payload::from([(t.path.clone(), f)]));
        }
        if let Some(c) = &src.cluster_trust_bundle {
            used.trust = true;
            let f = atomic::FileProjection {
                data: self.trust_anchors(pod, c).await?,
                mode: credential_mode(pod, default_mode)?,
            };
            return Ok(Payload::from([(c.path.clone(), f)]));
        }
        if let Some(c) = &src.pod_certificate {
            let key = (at.0.to_string(), at.1);
            used.certs.insert(key.clone());
            let cred = self.pod_certificate(pod, key, c).await?;
            let mode = credential_mode(pod, default_mode)?;
            let files = podcert::files(c, &cred)
                .into_iter()
                .map(|(p, data)| (p, atomic::FileProjection { data, mode }));
            return Ok(files.collect());
        }
        Err(SetUpError::UnsupportedProjection)
    }

    /// The files of a ConfigMap's or Secret's keys (a volume or a
    /// projection of one).
    async fn keys(
        &mut self,
        pod: &Pod,
        k: &Keys<'_>,
        default_mode: Option<i32>,
        used: &mut Used,
    ) -> Result<Payload, SetUpError> {
        let o = self.object(pod, k.kind, k.name, k.optional, used).await?;
        Ok(render::keys(k.kind, &o, k.items, default_mode, k.optional)?)
    }

    /// A ConfigMap or Secret of the pod's namespace, followed from now on;
    /// a missing one is empty when optional, upstream's error otherwise.
    async fn object(
        &mut self,
        pod: &Pod,
        kind: ObjectKind,
        name: &str,
        optional: bool,
        used: &mut Used,
    ) -> Result<Object, SetUpError> {
        let (ns, _) = crate::pods::util::namespace_and_name(pod);
        used.objects.insert((kind, name.to_string()));
        let found = match &self.sources {
            None => None,
            Some(src) => {
                let kept_as = format!("{}/{ns}/{name}", kind.lower());
                let key = (kind, name.to_string());
                self.subs
                    .entry(key.clone())
                    .or_insert_with(|| src.objects.subscribe(kind, &ns, name, self.wake.clone()));
                // The API server gets the short wait first; the kept copy
                // is read (and unsealed) only when it has not answered, so
                // a healthy sync reads nothing from the disk.
                let short = src.kept_wait();
                let answer = match self.subs[&key].get(short).await {
                    Ok(o) => Ok(o),
                    Err(e) => match self.kept::<Object>(pod, &kept_as).await {
                        // The API server cannot be reached: the last copy.
                        Some(o) => Err(Some(o)),
                        None => {
                            match self.subs[&key].get(OBJECT_WAIT.saturating_sub(short)).await {
                                Ok(o) => Ok(o),
                                Err(_) => return Err(SetUpError::Unreachable(e)),
                            }
                        }
                    },
                };
                match answer {
                    Ok(o) => {
                        let bytes = o.as_ref().and_then(|o| serde_json::to_vec(o).ok());
                        self.keep(pod, &kept_as, bytes).await;
                        o
                    }
                    Err(kept) => kept,
                }
            }
        };
        match found {
            Some(o) => Ok(o),
            None if optional => Ok(Object::default()),
            None => Err(SetUpError::NotFound {
                kind: kind.lower(),
                name: name.into(),
            }),
        }
    }

    /// A token for the pod's service account, bound to the pod.
    async fn token(
        &mut self,
        pod: &Pod,
        audience: &str,
        expiration: Option<i64>,
    ) -> Result<String, SetUpError> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::api::core::v1::ServiceAccount;
        let (ns, pod_name) = crate::pods::util::namespace_and_name(pod);
        let sa = crate::pods::util::service_account(pod);
        let seconds = expiration.unwrap_or(DEFAULT_TOKEN_SECONDS);
        let key = (sa.clone(), audience.to_string(), seconds);
        if let Some(t) = self.tokens.get(&key)
            && Instant::now() < t.refresh_at
        {
            return Ok(t.value.clone());
        }
        let Some(src) = &self.sources else {
            return Err(SetUpError::Token("no API server to ask".into()));
        };
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: (!audience.is_empty()).then(|| vec![audience.to_string()]),
                expiration_seconds: Some(seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod_name),
                    uid: pod.metadata.uid.clone(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api = kube::Api::<ServiceAccount>::namespaced(src.client.clone(), &ns);
        let kept_as = format!("token/{ns}/{sa}/{audience}/{seconds}");
        let post = Default::default();
        let request = api.create_token_request(&sa, &post, &req);
        let now = jiff::Timestamp::now().as_second();
        let kept = self.kept::<KeptToken>(pod, &kept_as).await;
        let answer = match kept.filter(|t| t.expires > now) {
            // A kept token to fall back on: the API server gets KEPT_WAIT.
            Some(_) => tokio::time::timeout(src.kept_wait(), request)
                .await
                .unwrap_or_else(|_| Err(kube::Error::Service("no answer in time".into()))),
            None => request.await,
        };
        let resp = match answer {
            Ok(r) => r,
            Err(e) => return self.kept_token(pod, &kept_as, key, e).await,
        };
        let requested = Duration::from_secs(seconds.max(0) as u64);
        let (token, left) = granted(resp, requested)?;
        let t = Token {
            value: token.clone(),
            refresh_at: Instant::now() + refresh_after(requested, left),
        };
        self.tokens.insert(key, t);
        let kept = KeptToken {
            token: token.clone(),
            expires: jiff::Timestamp::now().as_second() + left.as_secs() as i64,
        };
        self.keep(pod, &kept_as, serde_json::to_vec(&kept).ok())
            .await;
        Ok(token)
    }

    /// The kept token while the API server cannot be reached, if it has
    /// not expired (upstream's token manager also serves its cached token
    /// until it expires); asked for again soon.
    async fn kept_token(
        &mut self,
        pod: &Pod,
        kept_as: &str,
        key: TokenKey,
        e: kube::Error,
    ) -> Result<String, SetUpError> {
        let now = jiff::Timestamp::now().as_second();
        match self.kept::<KeptToken>(pod, kept_as).await {
            Some(t) if t.expires > now => {
                let value = t.token.clone();
                let refresh_at = Instant::now() + OFFLINE_RETRY;
                self.tokens.insert(
                    key,
                    Token {
                        value: t.token,
                        refresh_at,
                    },
                );
                Ok(value)
            }
            _ => Err(SetUpError::Token(e.to_string())),
        }
    }
}

/// The token an answer grants and how long it lives: by its own claims,
/// else by the answer's expiry on this node's clock, else as asked.
fn granted(
    resp: k8s_openapi::api::authentication::v1::TokenRequest,
    requested: Duration,
) -> Result<(String, Duration), SetUpError> {
    let status = resp
        .status
        .ok_or_else(|| SetUpError::Token("no status in the answer".into()))?;
    let token = status
        .token
        .ok_or_else(|| SetUpError::Token("no token in the answer".into()))?;
    let left = token_life(&token).unwrap_or_else(|| {
        let exp = status.expiration_timestamp.map(|t| t.0);
        let left = exp.map(|t| t.duration_since(jiff::Timestamp::now()));
        match left.and_then(|d| Duration::try_from(d).ok()) {
            Some(d) if !d.is_zero() => d,
            // Expired by this node's clock though just issued: the clock
            // is wrong, not the token.
            _ => requested,
        }
    });
    Ok((token, left))
}

/// A token's life as its issuer counts it (`exp` − `iat` of its JWT
/// claims), so a node clock that is off — a board without a battery, an
/// NTP step of a day — neither keeps an expired token nor renews a fresh
/// one in a loop: the refresh is then timed on the monotonic clock.
pub fn token_life(token: &str) -> Option<Duration> {
    use base64::Engine;
    let claims = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let (exp, iat) = (v["exp"].as_i64()?, v["iat"].as_i64()?);
    (exp > iat).then(|| Duration::from_secs((exp - iat) as u64))
}

/// When to ask again for a token, as upstream's token manager: when a
/// fifth of the life asked for is left before it expires, and at the
/// latest after a day (tokens the apiserver extends live a year). A token
/// granted shorter than that margin is renewed at 80 % of what it has.
pub fn refresh_after(requested: Duration, left: Duration) -> Duration {
    let margin = requested / 5;
    let at = if left > margin {
        left - margin
    } else {
        left.mul_f64(0.8)
    };
    at.min(TOKEN_MAX_AGE)
}

/// The `fsGroup` files get as their group.
fn fs_group(pod: &Pod) -> Option<u32> {
    let g = pod.spec.as_ref()?.security_context.as_ref()?.fs_group?;
    u32::try_from(g).ok()
}

/// Upstream's `SetVolumeOwnership` for a writable volume: every file and
/// dir gets group `gid` and group read-write (dirs also execute and
/// setgid, so new files keep the group). Symlinks are not followed.
fn set_ownership(root: &Path, gid: u32, on_root_mismatch: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const DIR_BITS: u32 = 0o2070;
    const FILE_BITS: u32 = 0o060;
    if on_root_mismatch {
        let m = std::fs::metadata(root)?;
        if m.gid() == gid && m.mode() & DIR_BITS == DIR_BITS {
            return Ok(());
        }
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p)?;
        if m.file_type().is_symlink() {
            continue;
        }
        std::os::unix::fs::lchown(&p, None, Some(gid))?;
        let bits = if m.is_dir() { DIR_BITS } else { FILE_BITS };
        let mode = (m.mode() & 0o7777) | bits;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
        if m.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(())
}

/// `Some(size limit)` for an emptyDir with `medium: Memory`.
fn memory_medium(v: &Volume) -> Option<Option<u64>> {
    let e = v.empty_dir.as_ref()?;
    (e.medium.as_deref() == Some("Memory")).then(|| {
        e.size_limit
            .as_ref()
            .and_then(|q| crate::config::units::parse_quantity_milli(&q.0).ok())
            .map(|m| (m / 1000) as u64)
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SetUpError> + Send + 'static,
) -> Result<T, SetUpError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SetUpError::Task(e.to_string()))?
}

/// Whether `dir` is a mount point (another device than its parent).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(d), Some(Ok(p))) = (std::fs::metadata(dir), dir.parent().map(std::fs::metadata)) else {
        return false;
    };
    d.dev() != p.dev()
}

/// Mounts a tmpfs on `dir` unless one is there (a restart of kinglet
/// keeps it; a reboot does not, and the files are written again).
fn ensure_tmpfs(dir: &Path, size: Option<u64>) -> Result<(), SetUpError> {
    if is_mount_point(dir) {
        return Ok(());
    }
    // No `mode=`: the root is tmpfs's 1777, as upstream mounts it (an
    // emptyDir keeps the sticky bit; a secret volume's root reads
    // drwxrwxrwt as on any kubelet).
    let opts = match size.filter(|s| *s > 0) {
        Some(s) => format!("size={s}"),
        None => String::new(),
    };
    use rustix::mount::{MountFlags, mount};
    // Digits only: no NUL to refuse.
    let data = std::ffi::CString::new(opts).unwrap_or_default();
    mount(
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        data.as_c_str(),
    )
    .map_err(|source| SetUpError::Tmpfs {
        path: dir.to_path_buf(),
        source,
    })
}

/// Octal escapes of `/proc/self/mountinfo` undone.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Removes a pod's volume dir: the tmpfs mounts under it first (deepest
/// first), so no mount is left behind and nothing is deleted through one.
/// Blocking.
pub fn remove_pod_dir(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape(m)))
        .filter(|m| m.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in mounts {
        let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_group_owns_the_volume_and_on_root_mismatch_skips_a_right_root() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("v");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f"), b"x").unwrap();
        std::fs::set_permissions(root.join("sub/f"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        set_ownership(&root, 1234, false).unwrap();
        let f = std::fs::metadata(root.join("sub/f")).unwrap();
        assert_eq!((f.gid(), f.mode() & 0o7777), (1234, 0o660));
        let sub = std::fs::metadata(root.join("sub")).unwrap();
        assert_eq!(sub.gid(), 1234);
        assert_eq!(sub.mode() & 0o2070, 0o2070, "setgid and group rwx");
        // A file added later, with the root already right: left alone.
        std::fs::write(root.join("late"), b"y").unwrap();
        std::os::unix::fs::chown(root.join("late"), None, Some(0)).unwrap();
        set_ownership(&root, 1234, true).unwrap();
        assert_eq!(std::fs::metadata(root.join("late")).unwrap().gid(), 0);
        set_ownership(&root, 1234, false).unwrap();
        assert_eq!(std::fs::metadata(root.join("late")).unwrap().gid(), 1234);
    }

    #[test]
    fn a_tokens_life_comes_from_its_claims_not_the_node_clock() {
        use base64::Engine;
        let enc = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        // Issued a day before this node's clock, as a node a day ahead
        // sees a fresh token: still an hour of life.
        let claims = r#"{"exp":1700003600,"iat":1700000000,"sub":"system:serviceaccount:d:s"}"#;
        let jwt = format!("{}.{}.sig", enc(r#"{"alg":"RS256"}"#), enc(claims));
        assert_eq!(token_life(&jwt), Some(Duration::from_secs(3600)));
        for bad in [
            "",
            "a.b.c",
            "x",
            &format!("h.{}.s", enc(r#"{"exp":5,"iat":9}"#)),
        ] {
            assert_eq!(token_life(bad), None, "{bad}");
        }
    }

    #[test]
    fn tokens_are_refreshed_at_80_percent_or_after_a_day() {
        let h = Duration::from_secs(3600);
        assert_eq!(refresh_after(h, h), Duration::from_secs(2880));
        // The apiserver granted less than asked: 80 % of what is left.
        assert_eq!(
            refresh_after(h, Duration::from_secs(600)),
            Duration::from_secs(480)
        );
        // An extended token (a year) is refreshed after a day.
        let year = Duration::from_secs(365 * 24 * 3600);
        assert_eq!(refresh_after(year, year), TOKEN_MAX_AGE);
    }
}
