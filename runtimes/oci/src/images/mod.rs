//! The image store: content-addressed blobs, unpacked layers shared between
//! images, and a small index naming them, all under `<root-dir>/images`.
//!
//! Crash safety: everything is written under `tmp/` and renamed into place;
//! the index (`index.json`) is rewritten atomically under an exclusive
//! `flock`, so the agent and the `kinglet images` CLI can work on the same
//! store at once. A blob or layer is visible only once complete; the index
//! names an image only once all its parts are in place. Anything a killed
//! process left in `tmp/` is removed by the next open.
//!
//! Layout:
//! - `blobs/sha256/<hex>`: manifests, configs and compressed layers;
//! - `layers/sha256/<diff-id hex>/`: a layer unpacked in overlayfs lower-dir
//!   form, present where the kernel offers overlayfs;
//! - `index.json`: images by ID (config digest) and names → ID;
//! - `tmp/<pid>-<n>/`: work in progress of a live process.

pub mod archive;
pub mod auth;
pub mod download;
pub mod platform;
pub mod registry;
pub mod unpack;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use oci_client::Reference;

/// How long an interrupted download is kept for a pull to resume it.
const PARTIAL_KEPT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Errors of the image store, each mapping onto an upstream waiting reason.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("couldn't parse image name {name:?}: {message}")]
    InvalidName { name: String, message: String },
    #[error("{image}: not found: {message}")]
    NotFound { image: String, message: String },
    #[error("{image}: unauthorized: {message}")]
    Unauthorized { image: String, message: String },
    #[error("{image}: no manifest for platform {platform}")]
    NoPlatform { image: String, platform: String },
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    Digest {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{image}: {message}")]
    Registry { image: String, message: String },
    #[error("{image}: {message}")]
    Invalid { image: String, message: String },
    #[error("{image}: layer {layer}: {source}")]
    Unpack {
        image: String,
        layer: String,
        #[source]
        source: unpack::UnpackError,
    },
    #[error("archive {file}: {message}")]
    Archive { file: String, message: String },
    #[error("image {0:?} is not present")]
    NotPresent(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl ImageError {
    /// The container waiting reason the upstream kubelet reports for it.
    pub fn reason(&self) -> kinglet_runtime::WaitingReason {
        use kinglet_runtime::WaitingReason as W;
        match self {
            ImageError::InvalidName { .. } => W::InvalidImageName,
            ImageError::NotPresent(_) => W::ErrImageNeverPull,
            _ => W::ErrImagePull,
        }
    }
}

/// `path` opened (made if missing) for reading and writing, with an
/// exclusive `flock` on it: waits for whoever holds it.
fn locked_file(path: &Path) -> Result<std::fs::File, ImageError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
        ImageError::Io {
            path: path.display().to_string(),
            source: e.into(),
        }
    })?;
    Ok(file)
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Parses and normalises an image reference as the kubelet and containerd
/// do: `busybox` is `docker.io/library/busybox:latest`. Hand-written after
/// the distribution reference grammar: the regex-based parser of `oci-spec`
/// costs about 18 MB of memory to compile, more than all of kinglet.
pub fn parse_reference(name: &str) -> Result<Reference, ImageError> {
    let n = kinglet_runtime::image::parse(name).map_err(|e| ImageError::InvalidName {
        name: e.name,
        message: e.message,
    })?;
    Ok(match (n.tag, n.digest) {
        (Some(t), Some(d)) => Reference::with_tag_and_digest(n.registry, n.repository, t, d),
        (None, Some(d)) => Reference::with_digest(n.registry, n.repository, d),
        (Some(t), None) => Reference::with_tag(n.registry, n.repository, t),
        (None, None) => Reference::with_tag(n.registry, n.repository, "latest".into()),
    })
}

/// The canonical name of a reference: `registry/repository[:tag][@digest]`.
pub fn canonical(r: &Reference) -> String {
    r.whole()
}

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// The hex part of a `sha256:` digest, checked so it can name a file.
pub fn digest_hex(digest: &str) -> Result<&str, ImageError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(hex)
    } else {
        Err(ImageError::Invalid {
            image: digest.into(),
            message: "only sha256 digests are supported".into(),
        })
    }
}

/// One layer of an image.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LayerRecord {
    /// Digest of the (compressed) blob.
    pub blob: String,
    /// Digest of the uncompressed tar.
    pub diff_id: String,
    /// Size of the blob in bytes.
    pub size: u64,
}

/// One image in the index.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageRecord {
    /// The image ID: the config digest.
    pub id: String,
    /// The manifest digest (a `repo@digest` reference pulls exactly this).
    pub manifest: String,
    /// `registry/repository@manifest-digest` for each repository.
    pub repo_digests: BTreeSet<String>,
    pub layers: Vec<LayerRecord>,
    /// Bytes on disk: blobs plus unpacked layers (shared ones counted fully).
    pub size: u64,
    /// Seconds since the epoch.
    pub created: u64,
    pub last_used: u64,
}

/// `index.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Index {
    pub images: BTreeMap<String, ImageRecord>,
    /// Name (`registry/repo:tag`) → image ID.
    pub names: BTreeMap<String, String>,
}

impl Index {
    pub fn names_of(&self, id: &str) -> Vec<String> {
        self.names
            .iter()
            .filter(|(_, v)| *v == id)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Finds an image by name, `repo@digest`, ID or unique ID prefix.
    pub fn find(&self, name: &str) -> Option<&ImageRecord> {
        if let Some(id) = self.names.get(name) {
            return self.images.get(id);
        }
        if let Ok(r) = parse_reference(name) {
            let c = canonical(&r);
            if let Some(id) = self.names.get(&c) {
                return self.images.get(id);
            }
            if let Some(d) = r.digest() {
                let repo = format!("{}/{}@{d}", r.registry(), r.repository());
                if let Some(img) = self
                    .images
                    .values()
                    .find(|i| i.repo_digests.contains(&repo) || i.manifest == d)
                {
                    return Some(img);
                }
            }
        }
        let id = if name.starts_with("sha256:") {
            name.to_string()
        } else {
            format!("sha256:{name}")
        };
        if let Some(img) = self.images.get(&id) {
            return Some(img);
        }
        let mut m = self
            .images
            .values()
            .filter(|i| name.len() >= 6 && i.id.starts_with(&id));
        match (m.next(), m.next()) {
            (Some(i), None) => Some(i),
            _ => None,
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Holds the store's exclusive lock while alive.
pub struct Locked<'a> {
    _file: std::fs::File,
    store: &'a ImageStore,
}

impl Locked<'_> {
    pub fn read(&self) -> Result<Index, ImageError> {
        self.store.read_index()
    }

    /// Replaces the index atomically: temp file, fsync, rename, fsync dir.
    pub fn write(&self, index: &Index) -> Result<(), ImageError> {
        let path = self.store.root.join("index.json");
        let tmp = self.store.root.join("index.json.tmp");
        let data = serde_json::to_vec_pretty(index).map_err(|e| ImageError::Io {
            path: path.display().to_string(),
            source: io::Error::other(e),
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(&data).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(&self.store.root);
        Ok(())
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The image store.
#[derive(Debug)]
pub struct ImageStore {
    root: PathBuf,
    /// Whether layers are unpacked for overlayfs (else rootfs are flattened).
    overlay: bool,
    tmp_seq: AtomicU64,
    limits: UnpackLimits,
    /// When each image was last used by a container start since this
    /// process started (unix seconds), in memory as upstream's image GC
    /// keeps `lastUsed`: written to the index at every container start it
    /// cost the flash a rewrite and two fsyncs each time. After a restart
    /// the index's time (the pull or import) stands in.
    used: std::sync::Mutex<HashMap<String, u64>>,
}

/// What one layer may unpack to (kinglet's limits; containerd has none):
/// at most `max_layer_bytes`, at most `max_ratio` times its compressed size
/// (past a 64 MiB floor), and never into the `reserve_percent` of the image
/// filesystem that the `imagefs.available` eviction threshold keeps free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnpackLimits {
    pub max_layer_bytes: u64,
    pub max_ratio: u64,
    pub reserve_percent: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_layer_bytes: 8 << 30,
            max_ratio: 100,
            // Upstream's default evictionHard imagefs.available.
            reserve_percent: 15,
        }
    }
}

/// Below this, the ratio limit does not apply: small layers of zeros or
/// text compress far and are harmless.
const RATIO_FLOOR: u64 = 64 << 20;

/// Unreferenced blobs and layers younger than this are left alone: a pull in
/// another process may have just renamed them into place.
const PRUNE_GRACE: Duration = Duration::from_secs(600);

impl ImageStore {
    /// Opens (creating) the store at `root` and removes work left by dead
    /// processes.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ImageError> {
        let root = root.into();
        for d in ["blobs/sha256", "layers/sha256", "tmp", "partial"] {
            let p = root.join(d);
            std::fs::create_dir_all(&p).map_err(io_err(&p))?;
        }
        let store = ImageStore {
            root,
            overlay: unpack::overlay_supported(),
            tmp_seq: AtomicU64::new(0),
            limits: UnpackLimits::default(),
            used: Default::default(),
        };
        store.clean_tmp();
        store.clean_partial(PARTIAL_KEPT);
        Ok(store)
    }

    /// Sets the limits layers unpack under.
    pub fn with_limits(mut self, limits: UnpackLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn limits(&self) -> &UnpackLimits {
        &self.limits
    }

    /// The budget of a layer whose blob is `compressed` bytes: the smallest
    /// of the limits and the room left above the reserve now.
    fn layer_budget(&self, compressed: u64) -> unpack::Budget {
        let l = &self.limits;
        let mut b = unpack::Budget {
            bytes: l.max_layer_bytes,
            why: format!("the layer size limit of {} bytes", l.max_layer_bytes),
        };
        let ratio = compressed.saturating_mul(l.max_ratio).max(RATIO_FLOOR);
        if ratio < b.bytes {
            b = unpack::Budget {
                bytes: ratio,
                why: format!(
                    "{} times its compressed size of {compressed} bytes: a decompression bomb?",
                    l.max_ratio
                ),
            };
        }
        if let Ok(st) = rustix::fs::statvfs(&self.root) {
            let total = st.f_blocks.saturating_mul(st.f_frsize);
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            let room = free.saturating_sub(total / 100 * l.reserve_percent);
            if room < b.bytes {
                b = unpack::Budget {
                    bytes: room,
                    why: format!(
                        "the free space of {} above the {}% imagefs reserve",
                        self.root.display(),
                        l.reserve_percent
                    ),
                };
            }
        }
        b
    }

    /// Whether layers are kept unpacked for overlayfs.
    pub fn uses_overlay(&self) -> bool {
        self.overlay
    }

    /// Removes `tmp/<pid>-*` entries of processes that no longer run.
    fn clean_tmp(&self) {
        let tmp = self.root.join("tmp");
        let Ok(rd) = std::fs::read_dir(&tmp) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: Option<i32> = name.split('-').next().and_then(|p| p.parse().ok());
            let alive = pid.is_some_and(|p| {
                p as u32 != std::process::id() && Path::new(&format!("/proc/{p}")).exists()
            });
            if !alive {
                let _ = remove_path(&e.path());
            }
        }
    }

    /// Removes partial downloads nobody touched for `kept`: an image
    /// nobody pulls any more should not hold disk.
    fn clean_partial(&self, kept: std::time::Duration) {
        let dir = self.root.join("partial");
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            // A time in the future (a board whose clock was set back) is
            // young: its download is kept.
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > kept);
            // One another process is writing into is locked: kept.
            let idle = std::fs::File::open(e.path()).is_ok_and(|f| {
                rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
            });
            if old && idle {
                let _ = remove_path(&e.path());
            }
        }
    }

    /// Where a download of `digest` is kept until it is whole
    /// ([`download`]).
    pub fn partial_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("partial").join(digest_hex(digest)?))
    }

    /// A fresh work directory of this process under `tmp/`.
    pub fn tmp_dir(&self) -> Result<PathBuf, ImageError> {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let p = self
            .root
            .join("tmp")
            .join(format!("{}-{n}-{}", std::process::id(), now_secs()));
        std::fs::create_dir_all(&p).map_err(io_err(&p))?;
        Ok(p)
    }

    pub fn lock(&self) -> Result<Locked<'_>, ImageError> {
        let file = locked_file(&self.root.join(".lock"))?;
        Ok(Locked {
            _file: file,
            store: self,
        })
    }

    pub fn read_index(&self) -> Result<Index, ImageError> {
        let path = self.root.join("index.json");
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| ImageError::Io {
                path: path.display().to_string(),
                source: io::Error::new(io::ErrorKind::InvalidData, e),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Index::default()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("blobs/sha256").join(digest_hex(digest)?))
    }

    pub fn layer_path(&self, diff_id: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("layers/sha256").join(digest_hex(diff_id)?))
    }

    pub fn has_blob(&self, digest: &str) -> bool {
        self.blob_path(digest).is_ok_and(|p| p.is_file())
    }

    /// Moves a verified file into the blob store (no-op if already there).
    pub fn commit_blob(&self, tmp_file: &Path, digest: &str) -> Result<(), ImageError> {
        let dest = self.blob_path(digest)?;
        if dest.exists() {
            let _ = std::fs::remove_file(tmp_file);
            return Ok(());
        }
        std::fs::File::open(tmp_file)
            .and_then(|f| f.sync_all())
            .map_err(io_err(tmp_file))?;
        std::fs::rename(tmp_file, &dest).map_err(io_err(&dest))?;
        Ok(())
    }

    /// Writes small content (manifest, config) as a blob under its digest.
    pub fn write_blob(&self, data: &[u8]) -> Result<String, ImageError> {
        let digest = sha256_digest(data);
        if self.has_blob(&digest) {
            return Ok(digest);
        }
        let dir = self.tmp_dir()?;
        let tmp = dir.join("blob");
        std::fs::write(&tmp, data).map_err(io_err(&tmp))?;
        self.commit_blob(&tmp, &digest)?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(digest)
    }

    pub fn read_blob(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let p = self.blob_path(digest)?;
        std::fs::read(&p).map_err(io_err(&p))
    }

    /// Unpacks a stored layer blob into `layers/` if this store keeps
    /// unpacked layers and it is not there yet; checks its DiffID.
    pub fn ensure_layer(&self, image: &str, layer: &LayerRecord) -> Result<(), ImageError> {
        if !self.overlay {
            return Ok(());
        }
        let dest = self.layer_path(&layer.diff_id)?;
        if dest.is_dir() {
            return Ok(());
        }
        let blob = self.blob_path(&layer.blob)?;
        let work = self.tmp_dir()?;
        let fs = work.join("fs");
        std::fs::create_dir(&fs).map_err(io_err(&fs))?;
        let f = std::fs::File::open(&blob).map_err(io_err(&blob))?;
        let budget = self.layer_budget(f.metadata().map_or(0, |m| m.len()));
        let unpack_err = |source| ImageError::Unpack {
            image: image.into(),
            layer: layer.blob.clone(),
            source,
        };
        let applied = unpack::decompress(f)
            .map_err(|e| unpack_err(unpack::UnpackError::Read(e)))
            .and_then(|r| {
                unpack::apply_layer(r, &fs, unpack::Whiteouts::Overlay, &budget).map_err(unpack_err)
            });
        let applied = match applied {
            Ok(a) => a,
            Err(e) => {
                let _ = remove_path(&work);
                return Err(e);
            }
        };
        if applied.diff_id != layer.diff_id {
            let _ = remove_path(&work);
            return Err(ImageError::Digest {
                what: format!("{image}: layer {} (uncompressed)", layer.blob),
                expected: layer.diff_id.clone(),
                actual: applied.diff_id,
            });
        }
        sync_dir(&fs);
        match std::fs::rename(&fs, &dest) {
            Ok(()) => {}
            // Another process finished the same layer first.
            Err(_) if dest.is_dir() => {}
            Err(e) => return Err(io_err(&dest)(e)),
        }
        let _ = remove_path(&work);
        Ok(())
    }

    /// Records an image whose blobs (and layers) are all in place, under
    /// `names`. A name that pointed at another image moves to this one.
    pub fn commit_image(
        &self,
        mut record: ImageRecord,
        names: &[String],
    ) -> Result<ImageRecord, ImageError> {
        let lock = self.lock()?;
        // Re-check under the lock: a concurrent prune may have run.
        for d in [&record.manifest, &record.id]
            .into_iter()
            .chain(record.layers.iter().map(|l| &l.blob))
        {
            if !self.has_blob(d) {
                return Err(ImageError::Invalid {
                    image: names.first().cloned().unwrap_or_default(),
                    message: format!("blob {d} vanished before the image was recorded; retry"),
                });
            }
        }
        let mut index = lock.read()?;
        if let Some(old) = index.images.get(&record.id) {
            record.repo_digests.extend(old.repo_digests.iter().cloned());
            record.created = old.created;
        }
        record.last_used = record.last_used.max(now_secs());
        for n in names {
            index.names.insert(n.clone(), record.id.clone());
        }
        index.images.insert(record.id.clone(), record.clone());
        lock.write(&index)?;
        Ok(record)
    }

    /// The unpacked layer directories of an image, lowest first (overlayfs
    /// lists them the other way round).
    pub fn layer_dirs(&self, record: &ImageRecord) -> Result<Vec<PathBuf>, ImageError> {
        record
            .layers
            .iter()
            .map(|l| self.layer_path(&l.diff_id))
            .collect()
    }

    /// Builds a flattened copy of the image's filesystem in `dest` (which
    /// must exist and be empty): the rootfs where overlayfs is unavailable.
    pub fn flatten(&self, record: &ImageRecord, dest: &Path) -> Result<(), ImageError> {
        for l in &record.layers {
            let blob = self.blob_path(&l.blob)?;
            let f = std::fs::File::open(&blob).map_err(io_err(&blob))?;
            let budget = self.layer_budget(f.metadata().map_or(0, |m| m.len()));
            let r = unpack::decompress(f).map_err(io_err(&blob))?;
            unpack::apply_layer(r, dest, unpack::Whiteouts::Apply, &budget).map_err(|source| {
                ImageError::Unpack {
                    image: record.id.clone(),
                    layer: l.blob.clone(),
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// Marks an image as just used (for least-recently-used GC), in
    /// memory: nothing is written.
    pub fn touch(&self, id: &str) {
        if let Ok(mut used) = self.used.lock() {
            used.insert(id.to_string(), now_secs());
        }
    }

    /// When the image was last used: this process's memory, else the
    /// index's time.
    fn last_used(&self, img: &ImageRecord) -> u64 {
        let seen = self.used.lock().ok().and_then(|u| u.get(&img.id).copied());
        seen.unwrap_or(0).max(img.last_used)
    }

    /// Removes a name; the image goes when its last name does. Returns the
    /// removed image IDs. Unreferenced content is pruned.
    pub fn remove(&self, name: &str) -> Result<Vec<String>, ImageError> {
        let removed = {
            let lock = self.lock()?;
            let mut index = lock.read()?;
            let Some(img) = index.find(name).cloned() else {
                return Err(ImageError::NotPresent(name.into()));
            };
            let names = index.names_of(&img.id);
            let exact: Vec<String> = names
                .iter()
                .filter(|n| {
                    **n == name || parse_reference(name).is_ok_and(|r| canonical(&r) == **n)
                })
                .cloned()
                .collect();
            // By ID or digest: the whole image goes.
            let drop_names = if exact.is_empty() { names } else { exact };
            for n in &drop_names {
                index.names.remove(n);
            }
            let mut removed = Vec::new();
            if index.names_of(&img.id).is_empty() {
                index.images.remove(&img.id);
                removed.push(img.id.clone());
            }
            lock.write(&index)?;
            removed
        };
        self.prune(Duration::ZERO)?;
        Ok(removed)
    }

    /// Deletes blobs and layers no image references (older than `grace`).
    /// Returns bytes freed.
    pub fn prune(&self, grace: Duration) -> Result<u64, ImageError> {
        let trash = self.tmp_dir()?;
        {
            let lock = self.lock()?;
            let index = lock.read()?;
            let mut keep_blobs = HashSet::new();
            let mut keep_layers = HashSet::new();
            for img in index.images.values() {
                keep_blobs.insert(digest_hex(&img.manifest)?.to_string());
                keep_blobs.insert(digest_hex(&img.id)?.to_string());
                for l in &img.layers {
                    keep_blobs.insert(digest_hex(&l.blob)?.to_string());
                    keep_layers.insert(digest_hex(&l.diff_id)?.to_string());
                }
            }
            let now = SystemTime::now();
            let old_enough = |p: &Path| {
                std::fs::symlink_metadata(p)
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .is_none_or(|t| now.duration_since(t).unwrap_or_default() >= grace)
            };
            for (dir, keep) in [
                ("blobs/sha256", &keep_blobs),
                ("layers/sha256", &keep_layers),
            ] {
                let d = self.root.join(dir);
                let Ok(rd) = std::fs::read_dir(&d) else {
                    continue;
                };
                for (i, e) in rd.flatten().enumerate() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if keep.contains(&name) || !old_enough(&e.path()) {
                        continue;
                    }
                    // Renamed away under the lock, deleted after it.
                    let _ = std::fs::rename(
                        e.path(),
                        trash.join(format!("{}-{i}-{name}", dir.replace('/', "_"))),
                    );
                }
            }
        }
        let freed = du(&trash);
        remove_path(&trash).map_err(io_err(&trash))?;
        Ok(freed)
    }

    /// Image garbage collection as the kubelet's image GC manager does it:
    /// when the image filesystem is above `high` percent used, remove images
    /// not in `in_use`, least recently used first, until it is at `low`
    /// percent; then prune unreferenced content. Returns removed image IDs.
    pub fn gc(
        &self,
        high: u8,
        low: u8,
        in_use: &HashSet<String>,
        min_age: Duration,
    ) -> Result<Vec<String>, ImageError> {
        let (cap, avail) = fs_usage(&self.root).map_err(io_err(&self.root))?;
        let used = cap.saturating_sub(avail);
        let mut removed = Vec::new();
        if cap > 0 && used * 100 >= cap * u64::from(high) {
            let target = cap * u64::from(low) / 100;
            let mut to_free = used.saturating_sub(target);
            let lock = self.lock()?;
            let mut index = lock.read()?;
            let now = now_secs();
            let mut candidates: Vec<ImageRecord> = index
                .images
                .values()
                .filter(|i| {
                    !in_use.contains(&i.id)
                        && now.saturating_sub(self.last_used(i)) >= min_age.as_secs()
                })
                .cloned()
                .collect();
            candidates.sort_by_key(|i| self.last_used(i));
            for img in candidates {
                if to_free == 0 {
                    break;
                }
                index.images.remove(&img.id);
                index.names.retain(|_, id| *id != img.id);
                to_free = to_free.saturating_sub(img.size);
                removed.push(img.id);
            }
            lock.write(&index)?;
        }
        self.prune(if removed.is_empty() {
            PRUNE_GRACE
        } else {
            Duration::ZERO
        })?;
        Ok(removed)
    }
}

/// (capacity, available) bytes of the filesystem holding `path`.
pub fn fs_usage(path: &Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(path)?;
    Ok((st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize))
}

/// Bytes used by a file or tree (not following symlinks).
pub fn du(path: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = m.blocks() * 512;
    if m.is_dir()
        && let Ok(rd) = std::fs::read_dir(path)
    {
        for e in rd.flatten() {
            total += du(&e.path());
        }
    }
    total
}

/// Removes a file or a directory tree.
pub fn remove_path(p: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalise_like_docker() {
        let c = |s: &str| canonical(&parse_reference(s).unwrap());
        assert_eq!(c("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(c("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(c("org/app:v1"), "docker.io/org/app:v1");
        assert_eq!(c("localhost/app"), "localhost/app:latest");
        assert_eq!(c("127.0.0.1:5000/a/b:t"), "127.0.0.1:5000/a/b:t");
        assert_eq!(
            c("registry.example.com/x/y_z.w-v"),
            "registry.example.com/x/y_z.w-v:latest"
        );
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(c(&format!("quay.io/x@{d}")), format!("quay.io/x@{d}"));
        assert_eq!(c(&format!("quay.io/x:1@{d}")), format!("quay.io/x:1@{d}"));
        assert_eq!(
            parse_reference("ubuntu").unwrap().repository(),
            "library/ubuntu"
        );
    }

    #[test]
    fn bad_references_are_invalid_image_names() {
        for bad in [
            "",
            " busybox",
            "UPPER/case",
            "a//b",
            "busybox:",
            "bad::tag",
            "x@sha256:short",
            "-lead",
            "host:port:/x",
            "a/b:t@md5:00",
        ] {
            let e = parse_reference(bad).unwrap_err();
            assert_eq!(e.reason().as_str(), "InvalidImageName", "{bad:?}");
        }
    }

    /// A container start marks its image used in memory (GC's order) and
    /// writes nothing.
    #[test]
    fn use_is_remembered_without_a_write() {
        let d = tempfile::tempdir().unwrap();
        let store = ImageStore::open(d.path().join("images")).unwrap();
        let img = ImageRecord {
            id: format!("sha256:{}", "e".repeat(64)),
            manifest: String::new(),
            repo_digests: BTreeSet::new(),
            layers: vec![],
            size: 0,
            created: 0,
            last_used: 5,
        };
        assert_eq!(store.last_used(&img), 5);
        store.touch(&img.id);
        assert!(store.last_used(&img) + 60 > now_secs());
        assert!(!d.path().join("images/index.json").exists());
    }

    #[test]
    fn index_finds_by_name_digest_and_id() {
        let id = format!("sha256:{}", "c".repeat(64));
        let m = format!("sha256:{}", "d".repeat(64));
        let mut idx = Index::default();
        idx.images.insert(
            id.clone(),
            ImageRecord {
                id: id.clone(),
                manifest: m.clone(),
                repo_digests: BTreeSet::from([format!("docker.io/library/busybox@{m}")]),
                layers: vec![],
                size: 0,
                created: 0,
                last_used: 0,
            },
        );
        idx.names
            .insert("docker.io/library/busybox:1.36".into(), id.clone());
        for q in [
            "docker.io/library/busybox:1.36",
            "busybox:1.36",
            &format!("busybox@{m}"),
            &id,
            "cccccccc",
        ] {
            assert_eq!(idx.find(q).map(|i| i.id.clone()), Some(id.clone()), "{q}");
        }
        assert!(idx.find("busybox:1.35").is_none());
        assert!(idx.find("ccc").is_none(), "too short a prefix");
    }
}
