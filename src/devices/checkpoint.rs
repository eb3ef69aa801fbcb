//! The device manager's checkpoint (upstream's `kubelet_internal_checkpoint`,
//! in kinglet's own root dir): each pod's containers' devices with what
//! their source answered, and the devices each resource had, so that a
//! restart (or a power cut) neither gives a held device to another pod nor
//! forgets one. Written whole, fsynced and renamed into place; a checksum
//! catches a file damaged on the medium, which is then ignored as upstream
//! ignores a corrupt checkpoint.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::allocate::PodGrants;

/// The most a checkpoint may weigh: one far larger is not ours.
const MAX_BYTES: u64 = 16 << 20;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Pod UID → container → resource → devices.
    pub pods: BTreeMap<String, PodGrants>,
    /// Resource → its device IDs.
    pub registered: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    data: Checkpoint,
    checksum: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("larger than {MAX_BYTES} bytes")]
    TooLarge,
    #[error("not a checkpoint: {0}")]
    Format(#[from] serde_json::Error),
    #[error("checksum mismatch: the file is damaged")]
    Checksum,
}

fn checksum(data: &Checkpoint) -> Result<String, serde_json::Error> {
    Ok(hex::encode(Sha256::digest(serde_json::to_vec(data)?)))
}

/// The checkpoint at `path`; `None` if there is none.
pub fn read(path: &Path) -> Result<Option<Checkpoint>, ReadError> {
    let bytes = match crate::fsutil::read_at_most(path, MAX_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(ReadError::TooLarge),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let file: File = serde_json::from_slice(&bytes)?;
    if checksum(&file.data)? != file.checksum {
        return Err(ReadError::Checksum);
    }
    Ok(Some(file.data))
}

/// Writes `data` to `path` (its directory made if missing): whole,
/// durable, private. Blocking.
pub fn write(path: &Path, data: &Checkpoint) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = File {
        checksum: checksum(data).map_err(std::io::Error::other)?,
        data: data.clone(),
    };
    let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
    crate::fsutil::write_private_atomic(path, &bytes, crate::fsutil::Flush::Data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::allocate::Grant;

    #[test]
    fn a_checkpoint_reads_back_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/checkpoint.json");
        assert!(read(&path).unwrap().is_none());
        let grant = Grant {
            ids: vec!["d1".into()],
            ..Default::default()
        };
        let cp = Checkpoint {
            pods: [(
                "uid-1".into(),
                [("c".into(), [("r".into(), grant)].into())].into(),
            )]
            .into(),
            registered: [("r".into(), vec!["d1".into(), "d2".into()])].into(),
        };
        write(&path, &cp).unwrap();
        assert_eq!(read(&path).unwrap(), Some(cp));
        let text = std::fs::read_to_string(&path).unwrap().replace("d2", "d9");
        std::fs::write(&path, text).unwrap();
        assert!(matches!(read(&path), Err(ReadError::Checksum)));
        std::fs::write(&path, b"{").unwrap();
        assert!(matches!(read(&path), Err(ReadError::Format(_))));
    }
}
