//! kinglet's side of the image store: the `kinglet images` commands and
//! the import directory watched for archives (inotify, no polling). Image
//! garbage collection is the pod lifecycle's ([`crate::pods::images::gc`]),
//! over the runtime, for both runtimes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use kinglet_runtime_oci::images::auth::{Credentials, RegistriesConfig};
use kinglet_runtime_oci::images::download::Progress;
use kinglet_runtime_oci::images::registry::Puller;
use kinglet_runtime_oci::images::{ImageStore, Index, UnpackLimits, parse_reference};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::flags::{ImageLimits, ImagesCommand};

/// The store under `<root-dir>/images`.
pub fn open_store(root_dir: &Path, limits: &ImageLimits) -> anyhow::Result<Arc<ImageStore>> {
    let dir = root_dir.join("images");
    let store = ImageStore::open(&dir)
        .with_context(|| format!("cannot open the image store at {}", dir.display()))?;
    Ok(Arc::new(store.with_limits(UnpackLimits {
        max_layer_bytes: limits.max_layer_bytes,
        max_ratio: limits.max_ratio,
        reserve_percent: limits.reserve_percent,
    })))
}

pub fn puller(store: Arc<ImageStore>, registry_config: &Path) -> anyhow::Result<Puller> {
    let cfg = RegistriesConfig::load(registry_config)
        .map_err(|e| anyhow::anyhow!("registry configuration: {e}"))?;
    Ok(Puller::new(store, cfg))
}

/// Awaits `pull`, printing its bytes (done of total) to stderr each
/// second, as a progress line.
async fn with_progress<T>(
    image: &str,
    progress: &Progress,
    pull: impl std::future::Future<Output = T>,
) -> T {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.tick().await;
    tokio::pin!(pull);
    loop {
        tokio::select! {
            out = &mut pull => return out,
            _ = tick.tick() => {
                let (done, total, _, _) = progress.snapshot();
                if total > 0 {
                    eprintln!("pulling {image}: {done} of {total} bytes");
                }
            }
        }
    }
}

/// Runs one `kinglet images` command.
pub async fn command(
    cmd: ImagesCommand,
    root_dir: &Path,
    registry_config: &Path,
    limits: &ImageLimits,
) -> anyhow::Result<()> {
    let store = open_store(root_dir, limits)?;
    match cmd {
        ImagesCommand::Import { files } => {
            for f in files {
                let s = store.clone();
                let file = f.clone();
                let out = tokio::task::spawn_blocking(move || s.import_archive(&file)).await??;
                for (img, names) in out.images {
                    let shown = if names.is_empty() {
                        img.id.clone()
                    } else {
                        names.join(", ")
                    };
                    println!("imported {shown} ({})", short_id(&img.id));
                }
            }
        }
        ImagesCommand::Pull { image, creds } => {
            let creds: Vec<Credentials> = match creds {
                Some(c) => {
                    let (u, p) = c.split_once(':').context("--creds must be USER:PASSWORD")?;
                    vec![Credentials {
                        username: u.into(),
                        password: p.into(),
                    }]
                }
                None => Vec::new(),
            };
            let puller = puller(store, registry_config)?;
            let progress = Progress::default();
            let rec = with_progress(
                &image,
                &progress,
                puller.pull_observed(&image, &creds, &progress),
            )
            .await?;
            let (_, _, fetched, reused) = progress.snapshot();
            println!(
                "pulled {image} ({}): {fetched} bytes fetched, {reused} resumed from disk",
                short_id(&rec.id)
            );
        }
        ImagesCommand::Ls => print!("{}", table(&store.read_index()?)),
        ImagesCommand::Rm { images } => {
            for i in images {
                let removed = store.remove(&i)?;
                println!("untagged {i}");
                for id in removed {
                    println!("deleted {id}");
                }
            }
        }
    }
    Ok(())
}

fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(13)]
}

fn human(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.1}{}", units[u])
    }
}

/// `crictl images`-style listing: IMAGE, TAG, IMAGE ID, SIZE.
pub fn table(index: &Index) -> String {
    let mut rows = vec![[
        "IMAGE".to_string(),
        "TAG".into(),
        "IMAGE ID".into(),
        "SIZE".into(),
    ]];
    for img in index.images.values() {
        let names = index.names_of(&img.id);
        let size = human(img.size);
        if names.is_empty() {
            rows.push([
                "<none>".into(),
                "<none>".into(),
                short_id(&img.id).into(),
                size.clone(),
            ]);
        }
        for n in names {
            let (repo, tag) = match parse_reference(&n) {
                Ok(r) => (
                    format!("{}/{}", r.registry(), r.repository()),
                    r.tag().unwrap_or("<none>").to_string(),
                ),
                Err(_) => (n.clone(), "<none>".into()),
            };
            rows.push([repo, tag, short_id(&img.id).into(), size.clone()]);
        }
    }
    crate::table::render(&rows)
}

/// Imports one archive from the import dir: removed on success, moved to
/// `failed/` with a `.error` note otherwise, so it is never retried forever.
async fn import_one(store: &Arc<ImageStore>, dir: &Path, file: PathBuf) {
    let s = store.clone();
    let f = file.clone();
    let res = tokio::task::spawn_blocking(move || s.import_archive(&f)).await;
    let name = file
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    match res {
        Ok(Ok(out)) => {
            for (img, names) in &out.images {
                info!(archive = %name, image = %names.join(","), id = %img.id, "imported image archive");
            }
            if let Err(e) = std::fs::remove_file(&file) {
                warn!(archive = %name, error = %e, "imported, but cannot remove the archive");
            }
        }
        Ok(Err(e)) => {
            warn!(archive = %name, error = %e, "image archive rejected; moved to failed/");
            let failed = dir.join("failed");
            let _ = std::fs::create_dir_all(&failed);
            let _ = std::fs::rename(&file, failed.join(&name));
            let _ = std::fs::write(failed.join(format!("{name}.error")), format!("{e}\n"));
        }
        Err(e) => warn!(archive = %name, error = %e, "import task failed"),
    }
}

/// Whether a directory entry is an archive ready to import (not hidden, not
/// a partial copy).
fn importable(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    !name.starts_with('.')
        && !name.ends_with(".tmp")
        && !name.ends_with(".part")
        && std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// Imports the archives already in `dir` (dropped while kinglet was not
/// running, or shipped with it in an air-gap bundle). Kinglet awaits this
/// before any pod starts, so a pod of a shipped image finds it at once
/// instead of failing a pull and backing off.
pub async fn import_pending(store: &Arc<ImageStore>, dir: &Path) {
    if let Err(e) = std::fs::create_dir_all(dir) {
        warn!(dir = %dir.display(), error = %e, "cannot create the image import dir; imports are off");
        return;
    }
    let mut pending: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| importable(p))
                .collect()
        })
        .unwrap_or_default();
    pending.sort();
    for f in pending {
        import_one(store, dir, f).await;
    }
}

/// Imports whatever is closed after writing or moved into `dir` (and what
/// arrived since [`import_pending`]), until `shutdown`.
pub async fn watch_import_dir(store: Arc<ImageStore>, dir: PathBuf, shutdown: CancellationToken) {
    use crate::dirwatch::{DirWatch, Flags};
    let mut watch = match DirWatch::new(&dir, Flags::CLOSE_WRITE | Flags::MOVED_TO) {
        Ok(w) => w,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot watch the image import dir; imports are off");
            return;
        }
    };
    // What came between the first scan and the watch.
    import_pending(&store, &dir).await;
    info!(dir = %dir.display(), "watching for image archives");
    loop {
        let names = tokio::select! {
            _ = shutdown.cancelled() => return,
            n = watch.changed() => match n {
                Ok(n) => n,
                Err(e) => {
                    warn!(dir = %dir.display(), error = %e, "the import dir watch broke; imports are off");
                    return;
                }
            },
        };
        for name in names {
            let f = dir.join(name);
            if importable(&f) {
                import_one(&store, &dir, f).await;
            }
        }
    }
}

/// On a system without CA certificates (no `ca-certificates`: Debian's
/// minbase, many Yocto images), the file `SSL_CERT_FILE` should name, made
/// under `root_dir`; `None` when the system has some. The registry client
/// (oci-client over reqwest) builds a default client inside every
/// `Client::try_from`, and reqwest panics when its platform verifier finds
/// no root at all: found in the VM lab, where every pull took the agent
/// down. The file holds one self-signed certificate whose key was dropped
/// when it was made, so it signs nothing: registries over plain HTTP or
/// with a configured CA work, other HTTPS registries fail verification
/// (an error for the pod, as with containerd on such a system).
pub fn without_system_roots(root_dir: &Path) -> std::io::Result<Option<PathBuf>> {
    if !rustls_native_certs::load_native_certs().certs.is_empty() {
        return Ok(None);
    }
    let path = root_dir.join("no-system-roots.pem");
    if !path.exists() {
        let pem = rcgen::KeyPair::generate()
            .and_then(|key| rcgen::CertificateParams::new(Vec::new())?.self_signed(&key))
            .map_err(std::io::Error::other)?
            .pem();
        std::fs::create_dir_all(root_dir)?;
        crate::fsutil::write_private_atomic(&path, pem.as_bytes(), crate::fsutil::Flush::All)?;
    }
    Ok(Some(path))
}
