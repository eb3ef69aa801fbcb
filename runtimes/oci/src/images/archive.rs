//! Air-gapped import: OCI image-layout tarballs (`skopeo copy ...
//! oci-archive:`, `ctr export`) and `docker save` tarballs, plain, gzip or
//! zstd compressed, imported under the names they carry.
//!
//! The archive is first spooled into a private work dir (regular files
//! only, names checked, every `blobs/sha256/*` verified against its name as
//! it streams), then its images are recorded. Any problem leaves nothing in
//! the store: the work dir is removed and the error names the archive.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::platform::Platform;
use super::registry::{ConfigProbe, IndexEntry, pick_manifest};
use super::{
    ImageError, ImageRecord, ImageStore, LayerRecord, canonical, du, parse_reference, sha256_digest,
};

/// What one import produced.
#[derive(Debug)]
pub struct Imported {
    pub images: Vec<(ImageRecord, Vec<String>)>,
}

fn archive_err(file: &Path, message: impl Into<String>) -> ImageError {
    ImageError::Archive {
        file: file.display().to_string(),
        message: message.into(),
    }
}

/// Spools the archive's regular files into `dir`; returns name → sha256.
fn spool(file: &Path, dir: &Path) -> Result<HashMap<String, String>, ImageError> {
    let f = std::fs::File::open(file).map_err(|e| archive_err(file, e.to_string()))?;
    let r = super::unpack::decompress(f).map_err(|e| archive_err(file, e.to_string()))?;
    let mut ar = tar::Archive::new(r);
    let mut digests = HashMap::new();
    let entries = ar
        .entries()
        .map_err(|e| archive_err(file, format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| archive_err(file, format!("corrupt tar: {e}")))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let raw = entry.path_bytes().into_owned();
        let mut parts = Vec::new();
        for c in raw.split(|b| *b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => {
                    return Err(archive_err(
                        file,
                        format!(
                            "entry {:?} has a '..' component",
                            String::from_utf8_lossy(&raw)
                        ),
                    ));
                }
                c => parts.push(
                    String::from_utf8(c.to_vec())
                        .map_err(|_| archive_err(file, "entry name is not UTF-8"))?,
                ),
            }
        }
        if parts.is_empty() || parts.len() > 3 {
            continue; // no image archive nests deeper than blobs/sha256/x
        }
        let rel = parts.join("/");
        let dest = parts.iter().fold(dir.to_path_buf(), |p, c| p.join(c));
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| archive_err(file, e.to_string()))?;
        }
        let mut out = std::fs::File::create_new(&dest)
            .map_err(|e| archive_err(file, format!("{rel}: {e}")))?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| archive_err(file, format!("{rel}: {e}")))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| archive_err(file, format!("{rel}: {e}")))?;
        }
        let digest = format!("sha256:{}", hex::encode(hash.finalize()));
        if let Some(name) = rel.strip_prefix("blobs/sha256/")
            && format!("sha256:{name}") != digest
        {
            return Err(ImageError::Digest {
                what: format!("archive {}: {rel}", file.display()),
                expected: format!("sha256:{name}"),
                actual: digest,
            });
        }
        digests.insert(rel, digest);
    }
    Ok(digests)
}

#[derive(Deserialize)]
struct OciIndex {
    manifests: Vec<OciIndexEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciIndexEntry {
    digest: String,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
}

/// Normalised names from an index entry's annotations. A bare tag (as
/// `skopeo` writes `ref.name` for `oci-archive:f:1.0`) carries no
/// repository, so it cannot name an image and is skipped.
fn names_from(ann: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = BTreeSet::new();
    for key in [
        "io.containerd.image.name",
        "org.opencontainers.image.ref.name",
    ] {
        if let Some(v) = ann.get(key) {
            let has_repo =
                v.contains('/') || v.split_once(':').is_some_and(|(repo, _)| !repo.is_empty());
            if let (true, Ok(r)) = (has_repo, parse_reference(v)) {
                out.insert(canonical(&r));
            }
        }
    }
    out.into_iter().collect()
}

impl ImageStore {
    /// Imports every image of an archive for this node's platform.
    pub fn import_archive(&self, file: &Path) -> Result<Imported, ImageError> {
        let work = self.tmp_dir()?;
        let res = self.import_in(file, &work);
        let _ = super::remove_path(&work);
        res
    }

    fn import_in(&self, file: &Path, work: &Path) -> Result<Imported, ImageError> {
        let digests = spool(file, work)?;
        let platform = Platform::host();
        let mut images = Vec::new();
        if digests.contains_key("index.json") {
            let idx: OciIndex = read_json(file, &work.join("index.json"))?;
            // docker save (v25+) writes both; its manifest.json has the tags.
            let docker_tags: Vec<String> = if digests.contains_key("manifest.json") {
                read_json::<Vec<DockerEntry>>(file, &work.join("manifest.json"))?
                    .into_iter()
                    .flat_map(|e| e.repo_tags.unwrap_or_default())
                    .collect()
            } else {
                Vec::new()
            };
            for entry in &idx.manifests {
                let mut names = names_from(&entry.annotations);
                if names.is_empty() && idx.manifests.len() == 1 {
                    names = docker_tags
                        .iter()
                        .filter_map(|t| parse_reference(t).ok())
                        .map(|r| canonical(&r))
                        .collect();
                }
                let manifest_digest = self.resolve_in_layout(file, work, entry, &platform)?;
                let Some(manifest_digest) = manifest_digest else {
                    continue;
                };
                let rec = self.import_manifest(file, work, &manifest_digest, &names)?;
                images.push((rec, names));
            }
        } else if digests.contains_key("manifest.json") {
            let entries: Vec<DockerEntry> = read_json(file, &work.join("manifest.json"))?;
            for e in entries {
                let names: Vec<String> = e
                    .repo_tags
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|t| parse_reference(t).ok())
                    .map(|r| canonical(&r))
                    .collect();
                let rec = self.import_docker(file, work, &digests, &e.config, &e.layers, &names)?;
                images.push((rec, names));
            }
        } else {
            return Err(archive_err(
                file,
                "neither an OCI image layout (index.json) nor a docker save archive (manifest.json)",
            ));
        }
        if images.is_empty() {
            return Err(archive_err(
                file,
                format!("no image for platform {}", platform.describe()),
            ));
        }
        Ok(Imported { images })
    }

    /// Follows an index entry (possibly a nested index) to this platform's
    /// manifest digest; `None` if the entry is for another platform.
    fn resolve_in_layout(
        &self,
        file: &Path,
        work: &Path,
        entry: &OciIndexEntry,
        platform: &Platform,
    ) -> Result<Option<String>, ImageError> {
        let is_index = entry
            .media_type
            .as_deref()
            .is_some_and(|m| m.contains("index") || m.contains("manifest.list"));
        if !is_index {
            if let Some(p) = &entry.platform {
                let os = p.get("os").and_then(|v| v.as_str()).unwrap_or("");
                let arch = p.get("architecture").and_then(|v| v.as_str()).unwrap_or("");
                let variant = p.get("variant").and_then(|v| v.as_str());
                if platform.score(os, arch, variant).is_none() {
                    return Ok(None);
                }
            }
            return Ok(Some(entry.digest.clone()));
        }
        let nested: NestedIndex = read_json(file, &blob_in(work, &entry.digest)?)?;
        let d =
            pick_manifest(platform, &nested.manifests).ok_or_else(|| ImageError::NoPlatform {
                image: file.display().to_string(),
                platform: platform.describe(),
            })?;
        Ok(Some(d.to_string()))
    }

    fn import_manifest(
        &self,
        file: &Path,
        work: &Path,
        digest: &str,
        names: &[String],
    ) -> Result<ImageRecord, ImageError> {
        let mpath = blob_in(work, digest)?;
        let mbytes = std::fs::read(&mpath)
            .map_err(|e| archive_err(file, format!("manifest {digest}: {e}")))?;
        let m: Manifest = serde_json::from_slice(&mbytes)
            .map_err(|e| archive_err(file, format!("manifest {digest}: {e}")))?;
        let config_path = blob_in(work, &m.config.digest)?;
        let layer_paths = m
            .layers
            .iter()
            .map(|l| Ok((blob_in(work, &l.digest)?, l.digest.clone())))
            .collect::<Result<Vec<_>, ImageError>>()?;
        self.record(
            file,
            &config_path,
            &m.config.digest,
            layer_paths,
            Some(mbytes),
            names,
        )
    }

    fn import_docker(
        &self,
        file: &Path,
        work: &Path,
        digests: &HashMap<String, String>,
        config: &str,
        layers: &[String],
        names: &[String],
    ) -> Result<ImageRecord, ImageError> {
        let lookup = |rel: &str| -> Result<(PathBuf, String), ImageError> {
            let rel = rel.trim_start_matches("./");
            let d = digests.get(rel).ok_or_else(|| {
                archive_err(
                    file,
                    format!("manifest.json names {rel:?}, which the archive lacks"),
                )
            })?;
            Ok((work.join(rel), d.clone()))
        };
        let (config_path, config_digest) = lookup(config)?;
        let layer_paths = layers
            .iter()
            .map(|l| lookup(l))
            .collect::<Result<Vec<_>, _>>()?;
        self.record(file, &config_path, &config_digest, layer_paths, None, names)
    }

    /// Moves config and layers into the store, unpacks and checks them, and
    /// records the image. Without a manifest (docker save), one is written.
    fn record(
        &self,
        file: &Path,
        config_path: &Path,
        config_digest: &str,
        layers: Vec<(PathBuf, String)>,
        manifest: Option<Vec<u8>>,
        names: &[String],
    ) -> Result<ImageRecord, ImageError> {
        let label = names
            .first()
            .cloned()
            .unwrap_or_else(|| file.display().to_string());
        let cbytes =
            std::fs::read(config_path).map_err(|e| archive_err(file, format!("config: {e}")))?;
        if sha256_digest(&cbytes) != config_digest {
            return Err(ImageError::Digest {
                what: format!("{label}: config"),
                expected: config_digest.into(),
                actual: sha256_digest(&cbytes),
            });
        }
        let cfg: ConfigProbe = serde_json::from_slice(&cbytes)
            .map_err(|e| archive_err(file, format!("config: {e}")))?;
        if cfg.rootfs.diff_ids.len() != layers.len() {
            return Err(archive_err(
                file,
                "layer count differs from the config's diff_ids",
            ));
        }
        let (recs, descs) = self.commit_layers(&label, &layers, &cfg.rootfs.diff_ids)?;
        self.write_blob(&cbytes)?;
        let mbytes = match manifest {
            Some(m) => m,
            None => serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": cbytes.len()},
                "layers": descs,
            }))
            .map_err(|e| archive_err(file, e.to_string()))?,
        };
        let manifest_digest = self.write_blob(&mbytes)?;
        let mut size: u64 = recs.iter().map(|l| l.size).sum();
        if self.uses_overlay() {
            for l in &recs {
                size += du(&self.layer_path(&l.diff_id)?);
            }
        }
        let repo_digests = names
            .iter()
            .filter_map(|n| parse_reference(n).ok())
            .map(|r| format!("{}/{}@{manifest_digest}", r.registry(), r.repository()))
            .collect();
        let now = super::now_secs();
        let rec = ImageRecord {
            id: config_digest.into(),
            manifest: manifest_digest,
            repo_digests,
            layers: recs,
            size,
            created: now,
            last_used: now,
        };
        self.commit_image(rec, names)
    }

    /// Commits the spooled layers as blobs and unpacks each: their records
    /// and manifest descriptors. A refused layer (over the limits or the
    /// imagefs reserve) takes out the blobs this import brought in.
    fn commit_layers(
        &self,
        label: &str,
        layers: &[(PathBuf, String)],
        diff_ids: &[String],
    ) -> Result<(Vec<LayerRecord>, Vec<serde_json::Value>), ImageError> {
        let mut recs = Vec::new();
        let mut descs = Vec::new();
        let mut brought = Vec::new();
        for ((path, digest), diff) in layers.iter().zip(diff_ids) {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let media = layer_media_type(path);
            // Spooled into this store's tmp: the commit is a rename.
            if path.exists() {
                let blob = self.blob_path(digest)?;
                if !blob.exists() {
                    brought.push(blob);
                }
                self.commit_blob(path, digest)?;
            }
            let rec = LayerRecord {
                blob: digest.clone(),
                diff_id: diff.clone(),
                size,
            };
            if let Err(e) = self.ensure_layer(label, &rec) {
                for b in &brought {
                    let _ = std::fs::remove_file(b);
                }
                return Err(e);
            }
            descs.push(serde_json::json!({"mediaType": media, "digest": digest, "size": size}));
            recs.push(rec);
        }
        Ok((recs, descs))
    }
}

#[derive(Deserialize)]
struct NestedIndex {
    manifests: Vec<IndexEntry>,
}

fn read_json<T: for<'de> Deserialize<'de>>(file: &Path, path: &Path) -> Result<T, ImageError> {
    let b =
        std::fs::read(path).map_err(|e| archive_err(file, format!("{}: {e}", path.display())))?;
    serde_json::from_slice(&b).map_err(|e| {
        archive_err(
            file,
            format!(
                "{}: {e}",
                path.file_name().unwrap_or_default().to_string_lossy()
            ),
        )
    })
}

fn blob_in(work: &Path, digest: &str) -> Result<PathBuf, ImageError> {
    Ok(work.join("blobs/sha256").join(super::digest_hex(digest)?))
}

fn layer_media_type(path: &Path) -> &'static str {
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    match &head[..n] {
        [0x1f, 0x8b, ..] => "application/vnd.oci.image.layer.v1.tar+gzip",
        [0x28, 0xb5, 0x2f, 0xfd] => "application/vnd.oci.image.layer.v1.tar+zstd",
        _ => "application/vnd.oci.image.layer.v1.tar",
    }
}
