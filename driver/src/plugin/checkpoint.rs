//! The checkpoint of prepared claims: versioned JSON with a checksum, written atomically before
//! the kubelet hears that a claim is prepared. A corrupt file is moved aside and reported, never
//! a reason to crash-loop.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vgpu_scheduling::Uid;

use super::claim::{ClaimDevice, ClaimRef};

/// The format version this driver writes; older versions are migrated on read when they appear.
pub const VERSION: u32 = 1;

/// Everything needed to answer a repeated prepare and to rebuild the ledger after a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// Its shares, in claim order.
    pub devices: Vec<ClaimDevice>,
    /// The CDI spec written for it (rewritten if the tmpfs CDI dir lost it).
    pub spec: cdi_spec::Spec,
}

#[derive(Serialize, Deserialize)]
struct File1 {
    version: u32,
    checksum: String,
    claims: BTreeMap<Uid, PreparedClaim>,
}

/// Checkpoint failures.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file cannot be read or written.
    #[error("checkpoint {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not a valid checkpoint (truncated, edited, unknown version).
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The checkpoint file.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    path: PathBuf,
}

fn checksum(claims: &BTreeMap<Uid, PreparedClaim>) -> String {
    let body = serde_json::to_vec(claims).unwrap_or_default();
    Sha256::digest(&body).iter().map(|b| format!("{b:02x}")).collect()
}

impl Checkpoint {
    /// The checkpoint at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the prepared claims; a missing file is an empty checkpoint.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] for a bad file, [`CheckpointError::Io`] when unreadable.
    pub fn load(&self) -> Result<BTreeMap<Uid, PreparedClaim>, CheckpointError> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(source) => return Err(CheckpointError::Io { path: self.path.clone(), source }),
        };
        let corrupt = |reason: String| CheckpointError::Corrupt { path: self.path.clone(), reason };
        let file: File1 = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if file.version != VERSION {
            return Err(corrupt(format!("version {} is not {VERSION}", file.version)));
        }
        if checksum(&file.claims) != file.checksum {
            return Err(corrupt("checksum mismatch".into()));
        }
        Ok(file.claims)
    }

    /// Writes the prepared claims atomically (temp file, fsync, rename, directory fsync).
    ///
    /// # Errors
    /// [`CheckpointError::Io`]; the previous file is unchanged.
    pub fn save(&self, claims: &BTreeMap<Uid, PreparedClaim>) -> Result<(), CheckpointError> {
        let io_err = |source| CheckpointError::Io { path: self.path.clone(), source };
        let file = File1 { version: VERSION, checksum: checksum(claims), claims: claims.clone() };
        let body = serde_json::to_vec_pretty(&file).map_err(|e| io_err(io::Error::other(e)))?;
        crate::fsutil::write_atomically(&self.path, &body).map_err(io_err)
    }

    /// Moves a corrupt file aside (kept for inspection) so a fresh one can be written.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the rename fails.
    pub fn quarantine(&self) -> Result<PathBuf, CheckpointError> {
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let aside = self.path.with_extension(format!("corrupt-{stamp}"));
        fs::rename(&self.path, &aside).map_err(|source| CheckpointError::Io { path: self.path.clone(), source })?;
        Ok(aside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_scheduling::{Consumption, DeviceName, Quantity};

    fn sample() -> BTreeMap<Uid, PreparedClaim> {
        let uid = Uid::new("0b7e2c4a-1111-4222-8333-444455556666").unwrap();
        let claim = ClaimRef { namespace: "ns".into(), name: "c".into(), uid: uid.clone() };
        let devices = vec![ClaimDevice {
            request: "gpu".into(),
            device: DeviceName::new("hami-gpu-0").unwrap(),
            share_id: Some(Uid::new("s1").unwrap()),
            consumption: Consumption::from([("memory".into(), Quantity::parse("4Gi").unwrap())]),
        }];
        let kind = cdi_spec::Kind::parse("k8s.x.io/claim").unwrap();
        let spec = cdi_spec::Spec::new(&kind, vec![]).unwrap();
        BTreeMap::from([(uid, PreparedClaim { claim, devices, spec })])
    }

    #[test]
    fn round_trip_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint.json"));
        assert!(cp.load().unwrap().is_empty());
        cp.save(&sample()).unwrap();
        assert_eq!(cp.load().unwrap(), sample());
    }

    #[test]
    fn truncated_or_edited_files_are_corrupt_and_can_be_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint.json"));
        cp.save(&sample()).unwrap();
        let text = fs::read_to_string(cp.path()).unwrap();
        fs::write(cp.path(), &text[..text.len() / 2]).unwrap();
        assert!(matches!(cp.load(), Err(CheckpointError::Corrupt { .. })));
        fs::write(cp.path(), text.replace("4Gi", "8Gi")).unwrap();
        let err = cp.load().unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        let aside = cp.quarantine().unwrap();
        assert!(aside.exists() && !cp.path().exists());
        assert!(cp.load().unwrap().is_empty());
    }
}
