//! Resumable blob downloads. A layer is fetched into `partial/<hex>` of
//! the store, which stays when the link fails (within a pull, across
//! pulls, across restarts); the next attempt re-hashes what is on disk and
//! asks the registry for the rest with an HTTP `Range` request. The whole
//! blob is checked against its digest before it enters the blob store; a
//! mismatch discards the partial file. A download never grows past the
//! size its descriptor states. One download of a blob at a time, across
//! processes: the partial file is `flock`ed.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use oci_client::client::BlobResponse;
use oci_client::errors::OciDistributionError;
use oci_client::{Client, Reference};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use tracing::{info, warn};

use super::{ImageError, ImageStore, io_err};

/// Attempts in a row that received nothing before a download gives up
/// (its partial file stays for the next pull).
const STALLED_ATTEMPTS: u32 = 3;
/// Attempts of one download at most, however many made progress.
const MAX_ATTEMPTS: u32 = 20;

/// Bytes of one pull, for progress lines and figures: `total` of the
/// blobs it downloads, `done` of them on disk, `fetched` over the network,
/// `reused` found on disk from an earlier, interrupted attempt.
#[derive(Debug, Default)]
pub struct Progress {
    pub total: AtomicU64,
    pub done: AtomicU64,
    pub fetched: AtomicU64,
    pub reused: AtomicU64,
}

impl Progress {
    fn add(&self, field: &AtomicU64, n: u64) {
        field.fetch_add(n, Ordering::Relaxed);
    }

    /// (done, total, fetched, reused).
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
            self.fetched.load(Ordering::Relaxed),
            self.reused.load(Ordering::Relaxed),
        )
    }
}

/// One blob to fetch: where from and what it must be.
pub struct Blob<'a> {
    pub client: &'a Client,
    pub target: &'a Reference,
    pub image: &'a str,
    pub digest: &'a str,
    /// From the manifest's descriptor; 0 when it gave none.
    pub size: u64,
}

/// How one attempt's body ended.
enum Copied {
    /// The registry sent all it had.
    Ended,
    /// The connection failed midway; what came is on disk.
    Cut(std::io::Error),
}

/// Fetches `b` into the store unless it is there, resuming a partial file.
/// The partial file's lock is held until the blob is committed or
/// discarded.
pub async fn fetch(
    store: &Arc<ImageStore>,
    b: &Blob<'_>,
    max_bytes: u64,
    progress: &Progress,
) -> Result<(), ImageError> {
    if store.has_blob(b.digest) {
        return Ok(());
    }
    if b.size > max_bytes {
        return Err(ImageError::Invalid {
            image: b.image.into(),
            message: format!(
                "layer {} of {} bytes is over the {max_bytes}-byte limit",
                b.digest, b.size
            ),
        });
    }
    let path = store.partial_path(b.digest)?;
    let file = lock(path.clone()).await?;
    // Another download (this process or another) may have finished it.
    if store.has_blob(b.digest) {
        let _ = tokio::fs::remove_file(&path).await;
        return Ok(());
    }
    let bound = if b.size > 0 { b.size } else { max_bytes };
    let (file, hasher, have) = resume_point(file, path.clone(), bound).await?;
    if have > 0 {
        info!(
            image = b.image,
            blob = b.digest,
            bytes = have,
            "resuming a download"
        );
    }
    let mut p = Partial {
        file: tokio::fs::File::from_std(file),
        hasher,
        have,
        bound,
        path: &path,
        reused: have,
    };
    progress.add(&progress.reused, have);
    progress.add(&progress.done, have);
    let mut actual = download(b, &mut p, progress).await?;
    if actual != b.digest && have > 0 {
        // What a crash left on disk may not be what the registry has:
        // once more, from the start.
        warn!(
            image = b.image,
            blob = b.digest,
            "a resumed download does not match its digest; from the start"
        );
        p.restart(progress).await?;
        actual = download(b, &mut p, progress).await?;
    }
    if actual != b.digest {
        drop(p.file);
        let _ = tokio::fs::remove_file(&path).await;
        return Err(ImageError::Digest {
            what: format!("{}: blob", b.image),
            expected: b.digest.into(),
            actual,
        });
    }
    let file = p.file.into_std().await;
    let store = store.clone();
    let digest = b.digest.to_string();
    tokio::task::spawn_blocking(move || {
        let done = store.commit_blob(&path, &digest);
        // Unlocked only now: a waiter finds the blob committed.
        drop(file);
        done
    })
    .await
    .map_err(|e| ImageError::Invalid {
        image: b.image.into(),
        message: e.to_string(),
    })?
}

/// Opens and locks the partial file at `path` (waiting for another
/// download of it), making sure the lock is on the file the path names
/// now (one that finished or failed may have renamed or removed it).
async fn lock(path: PathBuf) -> Result<std::fs::File, ImageError> {
    tokio::task::spawn_blocking(move || {
        loop {
            let file = super::locked_file(&path)?;
            let held = rustix::fs::fstat(&file).map(|s| s.st_ino).ok();
            let named = rustix::fs::stat(&path).map(|s| s.st_ino).ok();
            if held.is_some() && held == named {
                return Ok(file);
            }
        }
    })
    .await
    .map_err(|e| ImageError::Io {
        path: String::new(),
        source: std::io::Error::other(e),
    })?
}

/// What is on disk already, hashed: the file positioned at its end, the
/// hash of its bytes and their count. A file longer than `bound` starts
/// over.
async fn resume_point(
    mut file: std::fs::File,
    path: PathBuf,
    bound: u64,
) -> Result<(std::fs::File, Sha256, u64), ImageError> {
    tokio::task::spawn_blocking(move || {
        let len = file.metadata().map_err(io_err(&path))?.len();
        if len > bound {
            file.set_len(0).map_err(io_err(&path))?;
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut have = 0u64;
        file.rewind().map_err(io_err(&path))?;
        loop {
            let n = file.read(&mut buf).map_err(io_err(&path))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            have += n as u64;
        }
        Ok((file, hasher, have))
    })
    .await
    .map_err(|e| ImageError::Io {
        path: String::new(),
        source: std::io::Error::other(e),
    })?
}

/// The partial file being written: where it is, what is in it.
struct Partial<'a> {
    file: tokio::fs::File,
    hasher: Sha256,
    have: u64,
    bound: u64,
    path: &'a Path,
    /// Bytes found on disk and counted as reused.
    reused: u64,
}

/// Requests and writes the rest of the blob, again after a cut, until it
/// is whole or the attempts run out; the digest of all its bytes.
async fn download(
    b: &Blob<'_>,
    p: &mut Partial<'_>,
    progress: &Progress,
) -> Result<String, ImageError> {
    let (mut attempts, mut stalled) = (0u32, 0u32);
    while b.size == 0 || p.have < b.size {
        attempts += 1;
        let before = p.have;
        let asked = b
            .client
            .pull_blob_stream_partial(b.target, b.digest, p.have, None);
        let ended = match asked.await {
            Ok(BlobResponse::Partial(s)) => p.copy(s, b.image, progress).await?,
            Ok(BlobResponse::Full(s)) => {
                p.restart(progress).await?;
                p.copy(s, b.image, progress).await?
            }
            Err(e) if transient(&e) => Copied::Cut(std::io::Error::other(e)),
            Err(e) => {
                p.discard().await;
                return Err(super::registry::map_err(b.image, e));
            }
        };
        let cause = match ended {
            Copied::Ended if b.size == 0 || p.have == b.size => break,
            Copied::Ended => {
                // The registry sent all it has and it is short of the
                // descriptor: not a cut; nothing to resume.
                p.discard().await;
                return Err(ImageError::Invalid {
                    image: b.image.into(),
                    message: format!(
                        "blob {} ended at {} of the {} bytes its descriptor states",
                        b.digest, p.have, b.size
                    ),
                });
            }
            Copied::Cut(e) => e,
        };
        warn!(image = b.image, blob = b.digest, bytes = p.have, error = %cause, "download cut; resuming");
        stalled = if p.have > before { 0 } else { stalled + 1 };
        if stalled >= STALLED_ATTEMPTS || attempts >= MAX_ATTEMPTS {
            return Err(ImageError::Registry {
                image: b.image.into(),
                message: format!(
                    "download of {} stopped at {} of {} bytes (kept for the next pull): {cause}",
                    b.digest, p.have, b.size
                ),
            });
        }
        tokio::time::sleep(Duration::from_secs(1 << stalled.min(3))).await;
    }
    p.file.sync_data().await.map_err(io_err(p.path))?;
    let hasher = std::mem::take(&mut p.hasher);
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// Errors of the link, worth another attempt; the registry's answers are
/// final.
fn transient(e: &OciDistributionError) -> bool {
    matches!(
        e,
        OciDistributionError::RequestError(_)
            | OciDistributionError::IoError(_)
            | OciDistributionError::ServerError {
                code: 408 | 429 | 500 | 502 | 503 | 504,
                ..
            }
    )
}

impl Partial<'_> {
    /// Empties the file: the registry ignored the range and sends it all,
    /// or what was on disk did not match.
    async fn restart(&mut self, progress: &Progress) -> Result<(), ImageError> {
        self.file.set_len(0).await.map_err(io_err(self.path))?;
        self.file.rewind().await.map_err(io_err(self.path))?;
        progress.done.fetch_sub(self.have, Ordering::Relaxed);
        progress.reused.fetch_sub(self.reused, Ordering::Relaxed);
        (self.hasher, self.have, self.reused) = (Sha256::new(), 0, 0);
        Ok(())
    }

    /// Drops what is on disk: it cannot become the blob.
    async fn discard(&mut self) {
        let _ = self.file.set_len(0).await;
        let _ = tokio::fs::remove_file(self.path).await;
    }

    /// Writes one response body, hashing it, never past the bound.
    async fn copy(
        &mut self,
        mut body: oci_client::client::SizedStream,
        image: &str,
        progress: &Progress,
    ) -> Result<Copied, ImageError> {
        let mut w = tokio::io::BufWriter::with_capacity(64 * 1024, &mut self.file);
        let ended = loop {
            let chunk = match body.next().await {
                None => break Copied::Ended,
                Some(Err(e)) => break Copied::Cut(e),
                Some(Ok(chunk)) => chunk,
            };
            let n = chunk.len() as u64;
            if self.have + n > self.bound {
                drop(w);
                self.discard().await;
                return Err(ImageError::Invalid {
                    image: image.into(),
                    message: format!(
                        "a blob larger than the {} bytes its descriptor states",
                        self.bound
                    ),
                });
            }
            if let Err(e) = w.write_all(&chunk).await {
                // A full disk keeps nothing half-written for later.
                drop(w);
                if e.raw_os_error() == Some(28) {
                    self.discard().await;
                }
                return Err(io_err(self.path)(e));
            }
            self.hasher.update(&chunk);
            self.have += n;
            progress.add(&progress.done, n);
            progress.add(&progress.fetched, n);
        };
        w.flush().await.map_err(io_err(self.path))?;
        Ok(ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_partial_file_resumes_from_its_bytes_unless_longer_than_the_blob() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, b"0123456789").unwrap();
        let file = lock(path.clone()).await.unwrap();
        let (_, hasher, have) = resume_point(file, path.clone(), 20).await.unwrap();
        assert_eq!(have, 10);
        assert_eq!(
            format!("sha256:{}", hex::encode(hasher.finalize())),
            super::super::sha256_digest(b"0123456789")
        );
        let file = lock(path.clone()).await.unwrap();
        let (_, _, have) = resume_point(file, path.clone(), 5).await.unwrap();
        assert_eq!(have, 0, "longer than the descriptor: from the start");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    #[tokio::test]
    async fn a_second_download_of_a_blob_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let first = lock(path.clone()).await.unwrap();
        let second = tokio::spawn(lock(path.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!second.is_finished(), "locked twice");
        // The first finished: its file moved into the blob store.
        std::fs::rename(&path, dir.path().join("done")).unwrap();
        drop(first);
        let f = second.await.unwrap().unwrap();
        let ino = rustix::fs::fstat(&f).unwrap().st_ino;
        assert_eq!(
            ino,
            rustix::fs::stat(&path).unwrap().st_ino,
            "locked the new file"
        );
    }
}
