//! Pulling images from OCI / Docker v2 registries with `oci-client`:
//! manifests and indexes resolved to this node's platform, every blob
//! verified against its digest, layers streamed to disk with bounded
//! concurrency (resumed after a cut: [`super::download`]), then unpacked
//! and recorded in the store.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;
use tracing::{debug, info};

use super::auth::{Credentials, Endpoint, RegistriesConfig};
use super::download::{self, Blob, Progress};
use super::platform::Platform;
use super::{
    ImageError, ImageRecord, ImageStore, LayerRecord, canonical, du, parse_reference, sha256_digest,
};

const ACCEPT: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// Layer downloads at once: small machines have little bandwidth and memory
/// to share (containerd's default is 3 as well).
pub const MAX_CONCURRENT_DOWNLOADS: usize = 3;

/// Pulls into one store; deduplicates concurrent pulls of the same image.
pub struct Puller {
    store: Arc<ImageStore>,
    config: RegistriesConfig,
    platform: Platform,
    clients: Mutex<HashMap<String, Client>>,
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The parts of a manifest or index we dispatch on.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<IndexEntry>>,
    #[serde(default)]
    schema_version: Option<u8>,
    #[serde(default)]
    config: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IndexEntry {
    pub digest: String,
    #[serde(default)]
    pub platform: Option<IndexPlatform>,
}

#[derive(Deserialize)]
pub(crate) struct IndexPlatform {
    pub os: String,
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

/// The parts of an image config we need.
#[derive(Deserialize)]
pub(crate) struct ConfigProbe {
    pub rootfs: RootFs,
}

#[derive(Deserialize)]
pub(crate) struct RootFs {
    pub diff_ids: Vec<String>,
}

/// Picks this platform's manifest from index entries.
pub(crate) fn pick_manifest<'a>(platform: &Platform, entries: &'a [IndexEntry]) -> Option<&'a str> {
    platform.pick(entries.iter().filter_map(|e| {
        let p = e.platform.as_ref()?;
        Some((
            e.digest.as_str(),
            p.os.as_str(),
            p.architecture.as_str(),
            p.variant.as_deref(),
        ))
    }))
}

/// A registry client for `ep`, or why none could be built (`Client::new`
/// would panic instead). A system without CA certificates is handled at
/// start (`kinglet::images::without_system_roots`): oci-client builds a
/// default reqwest client inside every `try_from`, which panics then.
fn new_client(ep: &Endpoint) -> Result<Client, OciDistributionError> {
    Client::try_from(ClientConfig {
        protocol: if ep.plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        accept_invalid_certificates: ep.insecure,
        extra_root_certificates: ep
            .ca_pem
            .iter()
            .map(|pem| Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.clone(),
            })
            .collect(),
        platform_resolver: None,
        max_concurrent_download: MAX_CONCURRENT_DOWNLOADS,
        connect_timeout: Some(Duration::from_secs(30)),
        read_timeout: Some(Duration::from_secs(120)),
        user_agent: concat!("kinglet/", env!("CARGO_PKG_VERSION")),
        ..Default::default()
    })
}

pub(super) fn map_err(image: &str, e: OciDistributionError) -> ImageError {
    let image = image.to_string();
    match e {
        OciDistributionError::AuthenticationFailure(m) => {
            ImageError::Unauthorized { image, message: m }
        }
        OciDistributionError::UnauthorizedError { url } => ImageError::Unauthorized {
            image,
            message: format!("authentication required for {url}"),
        },
        OciDistributionError::ImageManifestNotFoundError(m) => {
            ImageError::NotFound { image, message: m }
        }
        OciDistributionError::RegistryError { envelope, url } => {
            let codes: Vec<_> = envelope.errors.iter().map(|e| &e.code).collect();
            let msg = format!("{envelope} ({url})");
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                )
            }) {
                ImageError::NotFound {
                    image,
                    message: msg,
                }
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                ImageError::Unauthorized {
                    image,
                    message: msg,
                }
            } else {
                ImageError::Registry {
                    image,
                    message: msg,
                }
            }
        }
        OciDistributionError::ServerError {
            code: 404,
            url,
            message,
        } => ImageError::NotFound {
            image,
            message: format!("{message} ({url})"),
        },
        OciDistributionError::ServerError {
            code: 401 | 403,
            url,
            message,
        } => ImageError::Unauthorized {
            image,
            message: format!("{message} ({url})"),
        },
        OciDistributionError::DigestError(d) => ImageError::Digest {
            what: image,
            expected: String::new(),
            actual: d.to_string(),
        },
        other => {
            // reqwest's top-level message hides the cause (TLS, refused).
            let mut message = other.to_string();
            let mut src = std::error::Error::source(&other);
            while let Some(e) = src {
                message.push_str(&format!(": {e}"));
                src = e.source();
            }
            ImageError::Registry { image, message }
        }
    }
}

impl Puller {
    pub fn new(store: Arc<ImageStore>, config: RegistriesConfig) -> Self {
        Puller {
            store,
            config,
            platform: Platform::host(),
            clients: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
        }
    }

    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    /// One client per endpoint and credentials: an oci-client `Client`
    /// keeps the first credentials it was given for a registry, so pulls
    /// with other credentials (another pod's pull secret) need their own.
    fn client(
        &self,
        ep: &Endpoint,
        auth: &RegistryAuth,
        image: &str,
    ) -> Result<Client, ImageError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let who = match auth {
            RegistryAuth::Anonymous => String::new(),
            RegistryAuth::Basic(u, p) => sha256_digest(format!("{u}\0{p}").as_bytes()),
            RegistryAuth::Bearer(t) => sha256_digest(t.as_bytes()),
        };
        let key = format!(
            "{}://{}#{who}",
            if ep.plain_http { "http" } else { "https" },
            ep.host
        );
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let client = new_client(ep).map_err(|e| ImageError::Registry {
            image: image.to_string(),
            message: format!("registry client for {}: {e}", ep.host),
        })?;
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// Pulls `image` (by tag or digest) and records it. `secrets` are
    /// credentials from the pod's pull secrets, tried before the configured
    /// ones and before anonymous access.
    pub async fn pull(
        &self,
        image: &str,
        secrets: &[Credentials],
    ) -> Result<ImageRecord, ImageError> {
        self.pull_observed(image, secrets, &Progress::default())
            .await
    }

    /// As [`Puller::pull`], counting its bytes into `progress`.
    pub async fn pull_observed(
        &self,
        image: &str,
        secrets: &[Credentials],
        progress: &Progress,
    ) -> Result<ImageRecord, ImageError> {
        let r = parse_reference(image)?;
        let name = canonical(&r);
        let gate = {
            let mut m = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            m.entry(name.clone()).or_default().clone()
        };
        // A second pull of the same image waits for the first, then finds
        // every blob already present and downloads nothing.
        let _held = gate.lock().await;
        let endpoints = self
            .config
            .endpoints(r.registry())
            .map_err(|e| ImageError::Invalid {
                image: name.clone(),
                message: e.to_string(),
            })?;
        let mut first: Option<ImageError> = None;
        let n = endpoints.len();
        for (i, ep) in endpoints.into_iter().enumerate() {
            match self.pull_from(&r, &ep, secrets, progress).await {
                Ok(rec) => return Ok(rec),
                Err(e) => {
                    let scheme = if ep.plain_http { "http" } else { "https" };
                    if i + 1 < n {
                        debug!(image = %name, endpoint = %format!("{scheme}://{}", ep.host), error = %e, "endpoint failed, trying the next");
                    }
                    // A registry that answered (not found, unauthorized, bad
                    // digest) has the final word; else the first endpoint's
                    // error is the informative one (a TLS failure rather than
                    // the plain-HTTP fallback's).
                    let answered = !matches!(e, ImageError::Registry { .. });
                    if answered && ep.host == r.registry() {
                        return Err(e);
                    }
                    first.get_or_insert(e);
                }
            }
        }
        Err(first.unwrap_or(ImageError::NotFound {
            image: name,
            message: "no endpoint".into(),
        }))
    }

    async fn pull_from(
        &self,
        r: &Reference,
        ep: &Endpoint,
        secrets: &[Credentials],
        progress: &Progress,
    ) -> Result<ImageRecord, ImageError> {
        let name = canonical(r);
        let target = endpoint_target(r, ep);
        let (bytes, auth, client) = self.first_manifest(&target, ep, secrets, &name).await?;
        let (manifest_bytes, manifest_digest) = self
            .platform_manifest(&client, &auth, &target, r, &name, bytes)
            .await?;
        let manifest: OciImageManifest =
            serde_json::from_slice(&manifest_bytes).map_err(|e| ImageError::Invalid {
                image: name.clone(),
                message: format!("invalid manifest: {e}"),
            })?;
        let (config_digest, config) = self.config(&client, &target, &name, &manifest).await?;

        // Layers: download (streamed to a file, digest-checked), then unpack.
        let layers: Vec<LayerRecord> = manifest
            .layers
            .iter()
            .zip(&config.rootfs.diff_ids)
            .map(|(d, diff)| LayerRecord {
                blob: d.digest.clone(),
                diff_id: diff.clone(),
                size: u64::try_from(d.size).unwrap_or(0),
            })
            .collect();
        let started = std::time::Instant::now();
        let missing = layers.iter().filter(|l| !self.store.has_blob(&l.blob));
        progress.total.fetch_add(
            missing.map(|l| l.size).sum(),
            std::sync::atomic::Ordering::Relaxed,
        );
        futures::stream::iter(layers.clone())
            .map(|l| {
                let client = client.clone();
                let target = target.clone();
                let name = name.clone();
                async move { self.fetch_layer(&client, &target, &name, l, progress).await }
            })
            .buffer_unordered(MAX_CONCURRENT_DOWNLOADS)
            .try_collect::<Vec<()>>()
            .await?;
        self.store.write_blob(&manifest_bytes)?;

        let mut size: u64 = layers.iter().map(|l| l.size).sum();
        if self.store.uses_overlay() {
            for l in &layers {
                size += du(&self.store.layer_path(&l.diff_id)?);
            }
        }
        let mut names = Vec::new();
        if r.digest().is_none() {
            names.push(name.clone());
        }
        let record = ImageRecord {
            id: config_digest,
            manifest: manifest_digest.clone(),
            repo_digests: BTreeSet::from([format!(
                "{}/{}@{manifest_digest}",
                r.registry(),
                r.repository()
            )]),
            layers,
            size,
            created: super::now_secs(),
            last_used: super::now_secs(),
        };
        let rec = self.store.commit_image(record, &names)?;
        info!(image = %name, id = %rec.id, elapsed = ?started.elapsed(), "pulled image");
        Ok(rec)
    }

    /// The manifest (or index) of `target`, with the first credentials
    /// the registry accepts (the pod's pull secrets, then the configured
    /// ones, then none), and the client that holds them.
    async fn first_manifest(
        &self,
        target: &Reference,
        ep: &Endpoint,
        secrets: &[Credentials],
        name: &str,
    ) -> Result<(Vec<u8>, RegistryAuth, Client), ImageError> {
        let mut auths: Vec<RegistryAuth> = secrets
            .iter()
            .chain(self.config.credentials(&ep.host).iter())
            .map(|c| RegistryAuth::Basic(c.username.clone(), c.password.clone()))
            .collect();
        auths.push(RegistryAuth::Anonymous);
        let mut last_err = None;
        for auth in auths {
            let client = self.client(ep, &auth, name)?;
            match client.pull_manifest_raw(target, &auth, ACCEPT).await {
                Ok((bytes, _)) => return Ok((bytes.to_vec(), auth, client)),
                Err(e) => {
                    let e = map_err(name, e);
                    let retry = matches!(e, ImageError::Unauthorized { .. });
                    last_err = Some(e);
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last_err.unwrap_or_else(|| ImageError::Registry {
            image: name.to_string(),
            message: "no manifest".into(),
        }))
    }

    /// The image manifest for this node's platform and its digest: `bytes`
    /// checked against the reference's digest, and an index resolved to
    /// its entry for the platform (fetched and checked in turn); schema 1
    /// refused.
    async fn platform_manifest(
        &self,
        client: &Client,
        auth: &RegistryAuth,
        target: &Reference,
        r: &Reference,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<(Vec<u8>, String), ImageError> {
        let digest = sha256_digest(&bytes);
        if let Some(d) = r.digest()
            && d != digest
        {
            return Err(ImageError::Digest {
                what: format!("{name}: manifest"),
                expected: d.into(),
                actual: digest,
            });
        }
        let probe: Probe = serde_json::from_slice(&bytes).map_err(|e| ImageError::Invalid {
            image: name.to_string(),
            message: format!("manifest is not valid JSON: {e}"),
        })?;
        let Some(entries) = probe.manifests else {
            if probe.schema_version == Some(1) || probe.config.is_none() {
                return Err(ImageError::Invalid {
                    image: name.to_string(),
                    message: format!(
                        "unsupported manifest (media type {}); only OCI and Docker schema 2 images are supported",
                        probe.media_type.unwrap_or_default()
                    ),
                });
            }
            return Ok((bytes, digest));
        };
        let d = pick_manifest(&self.platform, &entries).ok_or_else(|| ImageError::NoPlatform {
            image: name.to_string(),
            platform: self.platform.describe(),
        })?;
        debug!(image = %name, manifest = d, "resolved index to this platform");
        let (b, _) = client
            .pull_manifest_raw(&target.clone_with_digest(d.into()), auth, ACCEPT)
            .await
            .map_err(|e| map_err(name, e))?;
        let digest = sha256_digest(&b);
        if digest != d {
            return Err(ImageError::Digest {
                what: format!("{name}: platform manifest"),
                expected: d.into(),
                actual: digest,
            });
        }
        Ok((b.to_vec(), digest))
    }

    /// The image's config blob (fetched unless the store has it, digest
    /// checked), which must list a diff ID for each of the manifest's
    /// layers.
    async fn config(
        &self,
        client: &Client,
        target: &Reference,
        name: &str,
        manifest: &OciImageManifest,
    ) -> Result<(String, ConfigProbe), ImageError> {
        let config_digest = manifest.config.digest.clone();
        super::digest_hex(&config_digest)?;
        if !self.store.has_blob(&config_digest) {
            let mut buf = Vec::new();
            client
                .pull_blob(target, config_digest.as_str(), &mut buf)
                .await
                .map_err(|e| map_err(name, e))?;
            let got = self.store.write_blob(&buf)?;
            if got != config_digest {
                return Err(ImageError::Digest {
                    what: format!("{name}: config"),
                    expected: config_digest,
                    actual: got,
                });
            }
        }
        let config: ConfigProbe = serde_json::from_slice(&self.store.read_blob(&config_digest)?)
            .map_err(|e| ImageError::Invalid {
                image: name.to_string(),
                message: format!("invalid image config: {e}"),
            })?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::Invalid {
                image: name.to_string(),
                message: format!(
                    "manifest has {} layers but the config lists {} diff_ids",
                    manifest.layers.len(),
                    config.rootfs.diff_ids.len()
                ),
            });
        }
        Ok((config_digest, config))
    }

    async fn fetch_layer(
        &self,
        client: &Client,
        target: &Reference,
        image: &str,
        l: LayerRecord,
        progress: &Progress,
    ) -> Result<(), ImageError> {
        let blob = Blob {
            client,
            target,
            image,
            digest: &l.blob,
            size: l.size,
        };
        let max = self.store.limits().max_layer_bytes;
        download::fetch(&self.store, &blob, max, progress).await?;
        let store = self.store.clone();
        let img = image.to_string();
        tokio::task::spawn_blocking(move || store.ensure_layer(&img, &l))
            .await
            .map_err(|e| ImageError::Invalid {
                image: image.into(),
                message: e.to_string(),
            })?
    }
}
/// `r` as asked of endpoint `ep`: a mirror gets the same repository and
/// tag or digest under its own host.
fn endpoint_target(r: &Reference, ep: &Endpoint) -> Reference {
    if ep.host == r.registry() {
        return r.clone();
    }
    let repo = r.repository().to_string();
    match (r.tag(), r.digest()) {
        (_, Some(d)) => Reference::with_digest(ep.host.clone(), repo, d.into()),
        (Some(t), None) => Reference::with_tag(ep.host.clone(), repo, t.into()),
        (None, None) => Reference::with_tag(ep.host.clone(), repo, "latest".into()),
    }
}
