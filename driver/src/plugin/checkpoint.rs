//! The checkpoint of prepared claims: one record per claim, versioned JSON with a checksum,
//! written atomically before the kubelet hears that the claim is prepared and removed (durably)
//! when it is unprepared. One file per claim keeps a prepare's cost independent of how many
//! claims the node holds; a corrupt record is moved aside and reported, never a reason to
//! crash-loop, and costs only that claim (which the state re-adopts from its CDI spec).
//!
//! Version 1 kept every claim in one `checkpoint.json`; it is migrated on first load.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vgpu_scheduling::Uid;

use super::claim::{ClaimDevice, ClaimRef};

/// The record format version this driver writes.
pub const VERSION: u32 = 2;
const LEGACY_VERSION: u32 = 1;

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
struct Record {
    version: u32,
    checksum: String,
    claim: PreparedClaim,
}

#[derive(Deserialize)]
struct Legacy {
    version: u32,
    checksum: String,
    claims: BTreeMap<Uid, PreparedClaim>,
}

/// Checkpoint failures.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file cannot be read or written.
    #[error("checkpoint {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A file is not a valid record (truncated, edited, unknown version).
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// What [`Checkpoint::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The claims with a valid record.
    pub claims: BTreeMap<Uid, PreparedClaim>,
    /// Records that were corrupt, each already moved aside to the path given.
    pub corrupt: Vec<(CheckpointError, PathBuf)>,
}

/// The checkpoint directory.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
}

fn checksum<T: Serialize>(value: &T) -> String {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Sha256::digest(&body).iter().map(|b| format!("{b:02x}")).collect()
}

impl Checkpoint {
    /// The checkpoint kept in directory `dir` (version 1's file is `dir` + `.json`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn legacy(&self) -> PathBuf {
        self.dir.with_extension("json")
    }

    fn record_path(&self, uid: &Uid) -> PathBuf {
        // Uids are validated to a file-name-safe alphabet, so this stays in the directory.
        self.dir.join(format!("{}.json", uid.as_str()))
    }

    /// Reads every record, moving corrupt ones aside, and migrates a version-1 file.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the directory cannot be read or a file moved or written.
    pub fn load(&self) -> Result<Loaded, CheckpointError> {
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| CheckpointError::Io { path, source }
        };
        let mut loaded = Loaded::default();
        self.migrate(&mut loaded)?;
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(loaded),
            Err(source) => return Err(CheckpointError::Io { path: self.dir.clone(), source }),
        };
        for entry in entries {
            let path = entry.map_err(io_err(&self.dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with(crate::fsutil::TEMP_PREFIX) {
                // A write cut short by a crash; the record it was replacing still stands.
                fs::remove_file(&path).map_err(io_err(&path))?;
                continue;
            }
            let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".json")) else { continue };
            match read_record(&path, stem) {
                Ok(claim) => {
                    loaded.claims.insert(claim.claim.uid.clone(), claim);
                }
                Err(e @ CheckpointError::Corrupt { .. }) => {
                    let aside = quarantine(&path)?;
                    loaded.corrupt.push((e, aside));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(loaded)
    }

    /// Rewrites a version-1 file as records (a corrupt one is moved aside), then removes it.
    fn migrate(&self, loaded: &mut Loaded) -> Result<(), CheckpointError> {
        let path = self.legacy();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(CheckpointError::Io { path, source }),
        };
        let corrupt = |reason: String| CheckpointError::Corrupt { path: path.clone(), reason };
        let parsed = serde_json::from_slice::<Legacy>(&bytes).map_err(|e| corrupt(e.to_string())).and_then(|f| {
            if f.version != LEGACY_VERSION {
                Err(corrupt(format!("version {} is not {LEGACY_VERSION}", f.version)))
            } else if checksum(&f.claims) != f.checksum {
                Err(corrupt("checksum mismatch".into()))
            } else {
                Ok(f.claims)
            }
        });
        match parsed {
            Ok(claims) => {
                for claim in claims.values() {
                    self.record(claim)?;
                }
                tracing::info!(claims = claims.len(), from = %path.display(), "checkpoint migrated to one record per claim");
                fs::remove_file(&path).map_err(|source| CheckpointError::Io { path: path.clone(), source })?;
            }
            Err(e) => {
                let aside = quarantine(&path)?;
                loaded.corrupt.push((e, aside));
            }
        }
        Ok(())
    }

    /// Writes `claim`'s record atomically (temp file, fsync, rename, directory fsync).
    ///
    /// # Errors
    /// [`CheckpointError::Io`]; a previous record is then unchanged.
    pub fn record(&self, claim: &PreparedClaim) -> Result<(), CheckpointError> {
        let path = self.record_path(&claim.claim.uid);
        let io_err = |source| CheckpointError::Io { path: path.clone(), source };
        let record = Record { version: VERSION, checksum: checksum(claim), claim: claim.clone() };
        let body = serde_json::to_vec(&record).map_err(|e| io_err(io::Error::other(e)))?;
        crate::fsutil::write_atomically(&path, &body).map_err(io_err)
    }

    /// Removes `uid`'s record durably; a missing one is fine.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the file cannot be removed.
    pub fn forget(&self, uid: &Uid) -> Result<(), CheckpointError> {
        let path = self.record_path(uid);
        crate::fsutil::remove_durably(&path).map_err(|source| CheckpointError::Io { path, source })
    }
}

fn read_record(path: &Path, stem: &str) -> Result<PreparedClaim, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { path: path.to_owned(), reason };
    let bytes = fs::read(path).map_err(|source| CheckpointError::Io { path: path.to_owned(), source })?;
    let record: Record = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    if record.version != VERSION {
        return Err(corrupt(format!("version {} is not {VERSION}", record.version)));
    }
    if checksum(&record.claim) != record.checksum {
        return Err(corrupt("checksum mismatch".into()));
    }
    if record.claim.claim.uid.as_str() != stem {
        return Err(corrupt(format!("holds claim {} under another name", record.claim.claim.uid)));
    }
    Ok(record.claim)
}

/// Moves a corrupt file aside (kept for inspection, out of the `.json` pattern).
fn quarantine(path: &Path) -> Result<PathBuf, CheckpointError> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".corrupt-{stamp}"));
    let aside = PathBuf::from(aside);
    fs::rename(path, &aside).map_err(|source| CheckpointError::Io { path: path.to_owned(), source })?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_scheduling::{Consumption, DeviceName, Quantity};

    fn sample(uid: &str) -> PreparedClaim {
        let uid = Uid::new(uid).unwrap();
        let claim = ClaimRef { namespace: "ns".into(), name: "c".into(), uid };
        let devices = vec![ClaimDevice {
            request: "gpu".into(),
            device: DeviceName::new("hami-gpu-0").unwrap(),
            share_id: Some(Uid::new("s1").unwrap()),
            consumption: Consumption::from([("memory".into(), Quantity::parse("4Gi").unwrap())]),
        }];
        let kind = cdi_spec::Kind::parse("k8s.x.io/claim").unwrap();
        let spec = cdi_spec::Spec::new(&kind, vec![]).unwrap();
        PreparedClaim { claim, devices, spec }
    }

    const A: &str = "0b7e2c4a-1111-4222-8333-444455556666";
    const B: &str = "0b7e2c4a-1111-4222-8333-777788889999";

    #[test]
    fn records_round_trip_and_forget() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        assert!(cp.load().unwrap().claims.is_empty());
        cp.record(&sample(A)).unwrap();
        cp.record(&sample(B)).unwrap();
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims.len(), 2);
        assert_eq!(loaded.claims[&Uid::new(A).unwrap()], sample(A));
        cp.forget(&Uid::new(A).unwrap()).unwrap();
        cp.forget(&Uid::new(A).unwrap()).unwrap();
        assert_eq!(cp.load().unwrap().claims.keys().map(Uid::as_str).collect::<Vec<_>>(), [B]);
    }

    #[test]
    fn a_corrupt_record_costs_only_its_claim() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        cp.record(&sample(A)).unwrap();
        cp.record(&sample(B)).unwrap();
        let a = cp.dir().join(format!("{A}.json"));
        let text = fs::read_to_string(&a).unwrap();
        fs::write(&a, &text[..text.len() / 2]).unwrap();
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims.keys().map(Uid::as_str).collect::<Vec<_>>(), [B]);
        assert_eq!(loaded.corrupt.len(), 1);
        assert!(loaded.corrupt[0].1.exists() && !a.exists());
        // An edited record fails its checksum; one renamed to another claim is refused too.
        cp.record(&sample(A)).unwrap();
        fs::write(&a, fs::read_to_string(&a).unwrap().replace("4Gi", "8Gi")).unwrap();
        let loaded = cp.load().unwrap();
        assert!(loaded.corrupt[0].0.to_string().contains("checksum mismatch"), "{}", loaded.corrupt[0].0);
        fs::copy(cp.dir().join(format!("{B}.json")), &a).unwrap();
        assert!(cp.load().unwrap().corrupt[0].0.to_string().contains("another name"));
    }

    #[test]
    fn version_one_file_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        let claims = BTreeMap::from([(Uid::new(A).unwrap(), sample(A))]);
        let v1 = serde_json::json!({"version": 1, "checksum": checksum(&claims), "claims": claims});
        fs::write(dir.path().join("checkpoint.json"), v1.to_string()).unwrap();
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims, claims);
        assert!(!dir.path().join("checkpoint.json").exists());
        assert_eq!(cp.load().unwrap().claims, claims, "the records now stand on their own");
    }
}
