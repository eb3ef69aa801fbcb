//! The local store for offline autonomy: the last copy of each value a
//! pod's volumes read from the API server (ConfigMaps, Secrets, service
//! account tokens), so that a pod can start again — after a reboot, with no
//! container, mount or tmpfs left — while the API server is unreachable.
//!
//! Layout: `<root>/store/pods/<pod uid>/<sha256 of kind/namespace/name>`,
//! one file per value, kept with the pod and removed with it; and the
//! node's own values, `<root>/store/node/<sha256 of name>`; and the node's
//! sets of values, `<root>/store/<set>/<key>`, one file a member, so that a
//! change rewrites one member alone: the API pods bound to the node
//! (`api-pods/<pod uid>`, which replaced the whole snapshot `node/api/pods`
//! and, before it, the plain `api-checkpoint.json`: both are migrated at
//! start). Every file is
//! sealed with ChaCha20-Poly1305 under a node-local key (`<root>/store/key`,
//! 32 random bytes, 0600), its name bound in as associated data so that no
//! file can stand in for another; written whole through a temp file, an
//! fsync of its data and an atomic rename, so a power cut leaves the old or
//! the new value (the rename is not waited for: it reaches the disk with
//! the filesystem's next commit, as upstream's checkpoints do, so a pod
//! start costs one journal commit for its values, not two; see
//! [`crate::fsutil::Flush::Data`]). Files and dirs are root's only.
//!
//! Why files and not an embedded database (redb, SQLite): the values are
//! few and small (a few KiB per pod), each is read and written whole, and
//! they share the lifetime of a pod dir; an atomic rename gives the same
//! crash safety as a database's commit for one value, at no cost to the
//! binary (which is within 1 MB of its 15 MB budget) — upstream's kubelet
//! keeps its checkpoints the same way.

use std::path::{Path, PathBuf};

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

/// A store failure, with the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a sealed value of this node (wrong key, or damaged)")]
    Unsealed { path: PathBuf },
    #[error("no randomness for the store key")]
    Random,
    #[error("the store's blocking task failed")]
    Task,
    #[error("{key:?}: not a key of a store set")]
    BadKey { key: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub struct LocalStore {
    dir: PathBuf,
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalStore({})", self.dir.display())
    }
}

impl LocalStore {
    /// Opens the store under `root` (`<root>/store`), making its key the
    /// first time.
    pub fn open(root: &Path) -> Result<LocalStore, StoreError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = root.join("store");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("pods"))
            .map_err(io(&dir))?;
        let rng = SystemRandom::new();
        let key_path = dir.join("key");
        let key = match std::fs::read(&key_path) {
            Ok(k) if k.len() == 32 => k,
            Ok(_) => return Err(StoreError::Unsealed { path: key_path }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut k = vec![0u8; 32];
                rng.fill(&mut k).map_err(|_| StoreError::Random)?;
                crate::fsutil::write_private_atomic(&key_path, &k, crate::fsutil::Flush::All)
                    .map_err(io(&key_path))?;
                k
            }
            Err(e) => return Err(io(&key_path)(e)),
        };
        let key = UnboundKey::new(&CHACHA20_POLY1305, &key)
            .map_err(|_| StoreError::Unsealed { path: key_path })?;
        Ok(LocalStore {
            dir,
            key: LessSafeKey::new(key),
            rng,
        })
    }

    fn pod_dir(&self, pod_uid: &str) -> Option<PathBuf> {
        crate::pods::util::contained_child(&self.dir.join("pods"), pod_uid)
    }

    /// The file of one value and the name sealed into it.
    fn file(&self, pod_uid: &str, name: &str) -> Option<(PathBuf, String)> {
        let hash = hex::encode(Sha256::digest(name.as_bytes()));
        let path = self.pod_dir(pod_uid)?.join(hash);
        Some((path, format!("{pod_uid}/{name}")))
    }

    /// Keeps `value` as the pod's copy of `name` (blocking: call it off
    /// the async thread).
    pub fn put(&self, pod_uid: &str, name: &str, value: &[u8]) -> Result<(), StoreError> {
        match self.file(pod_uid, name) {
            Some((path, aad)) => self.seal_to(&path, &aad, value),
            None => Ok(()),
        }
    }

    /// The pod's copy of `name`, if one was kept.
    pub fn get(&self, pod_uid: &str, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.file(pod_uid, name) {
            Some((path, aad)) => self.open_from(path, &aad),
            None => Ok(None),
        }
    }

    /// The file of one of the node's own values (not a pod's: kept until
    /// replaced), `<store>/node/<sha256 of name>`.
    fn node_file(&self, name: &str) -> (PathBuf, String) {
        let hash = hex::encode(Sha256::digest(name.as_bytes()));
        (self.dir.join("node").join(hash), format!("node/{name}"))
    }

    /// Keeps `value` as the node's `name` (blocking).
    pub fn put_node(&self, name: &str, value: &[u8]) -> Result<(), StoreError> {
        let (path, aad) = self.node_file(name);
        self.seal_to(&path, &aad, value)
    }

    /// The node's `name`, if kept (blocking).
    pub fn get_node(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (path, aad) = self.node_file(name);
        self.open_from(path, &aad)
    }

    /// Forgets the node's `name`.
    pub fn remove_node(&self, name: &str) {
        let _ = std::fs::remove_file(self.node_file(name).0);
    }

    /// The file of member `key` of the node's set `set`, and the name
    /// sealed into it. Keys are plain names (a pod UID): nothing that
    /// could leave the set's dir or pass for a temp file.
    fn member_file(&self, set: &str, key: &str) -> Result<(PathBuf, String), StoreError> {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if key.is_empty() || key.len() > 128 || !key.chars().all(plain) {
            return Err(StoreError::BadKey { key: key.into() });
        }
        Ok((self.dir.join(set).join(key), format!("{set}/{key}")))
    }

    /// Keeps `value` as member `key` of the node's set `set` (blocking).
    pub fn put_member(&self, set: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let (path, aad) = self.member_file(set, key)?;
        self.seal_to(&path, &aad, value)
    }

    /// Forgets member `key` of `set` (blocking); one that is not there is
    /// forgotten already.
    pub fn remove_member(&self, set: &str, key: &str) -> Result<(), StoreError> {
        let (path, _) = self.member_file(set, key)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&path)(e)),
            _ => Ok(()),
        }
    }

    /// The keys of every member of `set` on disk, whether or not it opens
    /// (blocking).
    pub fn member_keys(&self, set: &str) -> Vec<String> {
        std::fs::read_dir(self.dir.join(set))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|k| self.member_file(set, k).is_ok())
            .collect()
    }

    /// Every member of `set` that opens, by key (blocking). A member that
    /// does not open (damaged, another node's) is logged and skipped; a
    /// temp file a power cut left is removed.
    pub fn members(&self, set: &str) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.dir.join(set))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok((path, aad)) = self.member_file(set, &name) else {
                if name.ends_with(".tmp") {
                    let _ = std::fs::remove_file(e.path());
                }
                continue;
            };
            match self.open_from(path, &aad) {
                Ok(Some(v)) => out.push((name, v)),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "a kept value does not open; skipped"),
            }
        }
        out
    }

    /// Seals `value` with `aad` bound in and writes it whole to `path`.
    fn seal_to(&self, path: &Path, aad: &str, value: &[u8]) -> Result<(), StoreError> {
        if let Some(d) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .map_err(io(d))?;
        }
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| StoreError::Random)?;
        let mut sealed = value.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| StoreError::Random)?;
        let mut data = nonce.to_vec();
        data.extend_from_slice(&sealed);
        crate::fsutil::write_private_atomic(path, &data, crate::fsutil::Flush::Data)
            .map_err(io(path))
    }

    /// Reads and opens the value sealed at `path` with `aad`; none if the
    /// file is not there.
    fn open_from(&self, path: PathBuf, aad: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
        };
        if data.len() < NONCE_LEN {
            return Err(StoreError::Unsealed { path });
        }
        let (nonce, sealed) = data.split_at(NONCE_LEN);
        let mut sealed = sealed.to_vec();
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| StoreError::Unsealed { path: path.clone() })?;
        let open = self
            .key
            .open_in_place(nonce, Aad::from(aad.as_bytes()), &mut sealed)
            .map_err(|_| StoreError::Unsealed { path: path.clone() })?;
        Ok(Some(open.to_vec()))
    }

    /// [`Self::put`] (with `None`, [`Self::remove`]) off the async thread.
    pub async fn write(
        self: &std::sync::Arc<Self>,
        pod_uid: &str,
        name: &str,
        value: Option<Vec<u8>>,
    ) -> Result<(), StoreError> {
        let (st, uid, name) = (self.clone(), pod_uid.to_string(), name.to_string());
        tokio::task::spawn_blocking(move || match value {
            Some(v) => st.put(&uid, &name, &v),
            None => {
                st.remove(&uid, &name);
                Ok(())
            }
        })
        .await
        .map_err(|_| StoreError::Task)?
    }

    /// The pod's kept copy of `name` as JSON, read off the async thread; a
    /// copy that cannot be read is logged and reads as none.
    pub async fn read_json<T: serde::de::DeserializeOwned + Send + 'static>(
        self: &std::sync::Arc<Self>,
        pod_uid: &str,
        name: &str,
    ) -> Option<T> {
        let (st, uid, n) = (self.clone(), pod_uid.to_string(), name.to_string());
        let got = tokio::task::spawn_blocking(move || st.get(&uid, &n))
            .await
            .map_err(|_| StoreError::Task)
            .and_then(|r| r);
        match got {
            Ok(v) => serde_json::from_slice(&v?).ok(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the local store");
                None
            }
        }
    }

    /// Forgets the pod's copy of `name`.
    pub fn remove(&self, pod_uid: &str, name: &str) {
        if let Some((path, _)) = self.file(pod_uid, name) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Forgets everything kept for the pod.
    pub fn remove_pod(&self, pod_uid: &str) {
        if let Some(d) = self.pod_dir(pod_uid) {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// The pods with values kept.
    pub fn pods(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.join("pods"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn set_members_are_kept_one_file_each() {
        let d = tempfile::tempdir().unwrap();
        let s = LocalStore::open(d.path()).unwrap();
        s.put_member("api-pods", "uid-1", b"one").unwrap();
        s.put_member("api-pods", "uid-2", b"two").unwrap();
        s.put_member("api-pods", "uid-2", b"two'").unwrap();
        let mut m = s.members("api-pods");
        m.sort();
        assert_eq!(
            m,
            vec![
                ("uid-1".into(), b"one".to_vec()),
                ("uid-2".into(), b"two'".to_vec())
            ]
        );
        s.remove_member("api-pods", "uid-1").unwrap();
        s.remove_member("api-pods", "uid-1").unwrap();
        assert_eq!(s.members("api-pods").len(), 1);
        // A member moved under another key does not open; leftovers and
        // keys that could leave the dir are refused or skipped.
        let dir = d.path().join("store/api-pods");
        std::fs::copy(dir.join("uid-2"), dir.join("uid-3")).unwrap();
        std::fs::write(dir.join("uid-4.tmp"), b"half").unwrap();
        assert_eq!(s.members("api-pods").len(), 1);
        assert!(!dir.join("uid-4.tmp").exists());
        let mut keys = s.member_keys("api-pods");
        keys.sort();
        assert_eq!(
            keys,
            ["uid-2", "uid-3"],
            "one that does not open is still listed"
        );
        for bad in ["", "..", "../x", "a/b", "x.tmp"] {
            assert!(matches!(
                s.put_member("api-pods", bad, b"v"),
                Err(StoreError::BadKey { .. })
            ));
        }
        assert!(s.members("none").is_empty());
    }

    #[test]
    fn values_are_sealed_kept_whole_and_bound_to_their_name() {
        let d = tempfile::tempdir().unwrap();
        let s = LocalStore::open(d.path()).unwrap();
        s.put("uid-1", "secret/ns/db", b"hunter2").unwrap();
        assert_eq!(
            s.get("uid-1", "secret/ns/db").unwrap().as_deref(),
            Some(&b"hunter2"[..])
        );
        assert_eq!(s.get("uid-1", "secret/ns/other").unwrap(), None);
        // Nothing in clear on the disk; root's only.
        let (path, _) = s.file("uid-1", "secret/ns/db").unwrap();
        let raw = std::fs::read(&path).unwrap();
        assert!(!raw.windows(7).any(|w| w == b"hunter2"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let key_mode = std::fs::metadata(d.path().join("store/key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(key_mode & 0o777, 0o600);
        // A file moved to stand for another value does not open.
        let (other, _) = s.file("uid-1", "secret/ns/other").unwrap();
        std::fs::copy(&path, &other).unwrap();
        assert!(matches!(
            s.get("uid-1", "secret/ns/other"),
            Err(StoreError::Unsealed { .. })
        ));
        // Reopened (a restart): the same key reads the same value.
        let s = LocalStore::open(d.path()).unwrap();
        assert_eq!(
            s.get("uid-1", "secret/ns/db").unwrap().as_deref(),
            Some(&b"hunter2"[..])
        );
        s.remove_pod("uid-1");
        assert_eq!(s.get("uid-1", "secret/ns/db").unwrap(), None);
        // The node's own values: apart from every pod's, bound to their
        // own names.
        s.put_node("api/pods", b"[]").unwrap();
        assert_eq!(s.get_node("api/pods").unwrap().as_deref(), Some(&b"[]"[..]));
        assert!(s.pods().is_empty(), "a node value is no pod");
        assert_eq!(s.get_node("other").unwrap(), None);
        // A hostile pod UID names nothing outside the store.
        s.put("../../x", "n", b"v").unwrap();
        assert!(!d.path().join("x").exists());
    }

    /// The size budget (issue #17: a few MB for 110 pods), with what a
    /// typical pod keeps: its service account token (a JWT with its
    /// expiry), the cluster CA ConfigMap its token volume projects, one
    /// more ConfigMap, and its containers' environment with service
    /// variables. Disk blocks count, not only bytes: small files take a
    /// block each.
    #[test]
    fn a_hundred_and_ten_pods_fit_in_a_few_megabytes() {
        let d = tempfile::tempdir().unwrap();
        let s = LocalStore::open(d.path()).unwrap();
        let value = |n: usize| vec![b'x'; n];
        for i in 0..110 {
            let uid = format!("0b6f3a1e-0000-4000-8000-{i:012}");
            s.put(&uid, "token/default/default", &value(1300)).unwrap();
            s.put(&uid, "configmap/default/kube-root-ca.crt", &value(1600))
                .unwrap();
            s.put(&uid, "configmap/default/app-config", &value(800))
                .unwrap();
            s.put(&uid, "env/app", &value(2400)).unwrap();
        }
        let store = d.path().join("store");
        let disk = kinglet_runtime::disk::du(&store);
        println!(
            "figure: store: 110 pods, 4 values each: {} KiB on disk",
            disk / 1024
        );
        assert!(disk < 4 << 20, "{disk} bytes");
    }
}
