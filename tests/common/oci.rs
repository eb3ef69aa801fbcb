//! Builds OCI image layouts for tests, offline, byte by byte: layers as tar
//! (plain, gzip or zstd), configs, manifests and multi-platform indexes.
//! `skopeo` then copies them into a real registry or into archives.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

#[derive(Clone, Copy, Debug)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// A tar layer built entry by entry (raw names allowed, for hostile tests).
#[derive(Default, Clone)]
pub struct Layer {
    b: Vec<u8>,
}

impl Layer {
    fn header(name: &[u8], kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        h
    }
    fn push(&mut self, h: tar::Header, data: &[u8]) {
        self.b.extend_from_slice(h.as_bytes());
        self.b.extend_from_slice(data);
        self.b
            .extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
    }
    pub fn file(mut self, name: &str, data: &[u8]) -> Self {
        self.push(
            Self::header(
                name.as_bytes(),
                tar::EntryType::Regular,
                data.len() as u64,
                0o755,
            ),
            data,
        );
        self
    }
    pub fn dir(mut self, name: &str) -> Self {
        self.push(
            Self::header(name.as_bytes(), tar::EntryType::Directory, 0, 0o755),
            &[],
        );
        self
    }
    pub fn symlink(mut self, name: &str, target: &str) -> Self {
        let mut h = Self::header(name.as_bytes(), tar::EntryType::Symlink, 0, 0o777);
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        self.push(h, &[]);
        self
    }
    pub fn hardlink(mut self, name: &str, target: &str) -> Self {
        let mut h = Self::header(name.as_bytes(), tar::EntryType::Link, 0, 0o644);
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        self.push(h, &[]);
        self
    }
    pub fn tar(&self) -> Vec<u8> {
        let mut b = self.b.clone();
        b.extend(std::iter::repeat_n(0u8, 1024));
        b
    }
}

pub fn compress(data: &[u8], c: Compression) -> Vec<u8> {
    match c {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut e, data).unwrap();
            e.finish().unwrap()
        }
        Compression::Zstd => {
            ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

fn layer_media(c: Compression) -> &'static str {
    match c {
        Compression::None => "application/vnd.oci.image.layer.v1.tar",
        Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
        Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
    }
}

/// An OCI image layout directory being written.
pub struct Layout {
    pub dir: PathBuf,
    entries: Vec<serde_json::Value>,
}

pub struct Built {
    pub manifest_digest: String,
    pub config_digest: String,
    pub diff_ids: Vec<String>,
    pub manifest_size: usize,
}

impl Layout {
    pub fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        Layout {
            dir: dir.to_path_buf(),
            entries: Vec::new(),
        }
    }

    pub fn blob(&self, data: &[u8]) -> String {
        let d = sha256(data);
        std::fs::write(self.dir.join("blobs/sha256").join(&d[7..]), data).unwrap();
        d
    }

    /// Writes one image (not yet listed in index.json).
    pub fn image(
        &self,
        arch: &str,
        variant: Option<&str>,
        layers: &[(Layer, Compression)],
    ) -> Built {
        let mut descs = Vec::new();
        let mut diff_ids = Vec::new();
        for (l, c) in layers {
            let tar = l.tar();
            diff_ids.push(sha256(&tar));
            let blob = compress(&tar, *c);
            let d = self.blob(&blob);
            descs.push(
                serde_json::json!({"mediaType": layer_media(*c), "digest": d, "size": blob.len()}),
            );
        }
        let mut platform = serde_json::json!({"architecture": arch, "os": "linux"});
        if let Some(v) = variant {
            platform["variant"] = v.into();
        }
        let mut config = platform.clone();
        config["config"] = serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]});
        config["rootfs"] = serde_json::json!({"type": "layers", "diff_ids": diff_ids});
        let config = serde_json::to_vec(&config).unwrap();
        let cd = self.blob(&config);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
            "layers": descs,
        }))
        .unwrap();
        let md = self.blob(&manifest);
        Built {
            manifest_digest: md,
            config_digest: cd,
            diff_ids,
            manifest_size: manifest.len(),
        }
    }

    /// Lists an image under `tag` in index.json.
    pub fn tag_image(&mut self, tag: &str, b: &Built) {
        self.entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": b.manifest_digest, "size": b.manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }));
        self.write_index();
    }

    /// Lists a multi-platform index of `images` under `tag`.
    pub fn tag_index(&mut self, tag: &str, images: &[(&Built, &str, Option<&str>)]) -> String {
        let manifests: Vec<_> = images
            .iter()
            .map(|(b, arch, v)| {
                let mut p = serde_json::json!({"architecture": arch, "os": "linux"});
                if let Some(v) = v {
                    p["variant"] = (*v).into();
                }
                serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": b.manifest_digest, "size": b.manifest_size, "platform": p})
            })
            .collect();
        let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests})).unwrap();
        let d = self.blob(&index);
        self.entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.index.v1+json", "digest": d, "size": index.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }));
        self.write_index();
        d
    }

    fn write_index(&self) {
        let idx = serde_json::json!({"schemaVersion": 2, "manifests": self.entries});
        std::fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&idx).unwrap(),
        )
        .unwrap();
    }
}

/// `skopeo copy` with the given extra flags.
pub fn skopeo_copy(src: &str, dest: &str, extra: &[&str]) {
    let out = Command::new("skopeo")
        .args(["--insecure-policy", "copy", "--quiet"])
        .args(extra)
        .args([src, dest])
        .output()
        .expect("run skopeo");
    assert!(
        out.status.success(),
        "skopeo copy {src} {dest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The host's OCI architecture name.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        a => a,
    }
}
