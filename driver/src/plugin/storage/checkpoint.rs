//! The checkpoint of prepared claims: one record per claim, versioned JSON with a checksum,
//! made durable before the kubelet hears that the claim is prepared and removed (durably) when
//! it is unprepared. A record is written beside its name and renamed into place whole; a
//! prepare alone fsyncs its record after the rename (one journal commit instead of two,
//! [`RecordSync`]), so a power loss before it is answered can leave the record empty, which the
//! load takes for the prepare cut short that it was. One file per claim keeps a prepare's cost
//! independent of how many claims the node holds; a corrupt record is moved aside and reported, never a reason to
//! crash-loop, and costs only that claim (which the state re-adopts from its CDI spec).
//!
//! Version 1 kept every claim in one `checkpoint.json`; it is migrated on first load.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cdi_spec::Spec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vgpu_scheduling::Uid;

pub use super::record_file::{CheckpointError, RecordSync, StagedRecord, WrittenRecord};
use crate::plugin::claim::{ClaimDevice, ClaimRef};

/// The record format version this driver writes.
pub const VERSION: u32 = 2;
const LEGACY_VERSION: u32 = 1;

/// Everything needed to answer a repeated prepare and to rebuild the ledger after a restart, as
/// the driver holds it; its record on disk has the whole spec ([`Recorded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// Its shares, in claim order.
    pub devices: Vec<ClaimDevice>,
    /// What is held of the CDI spec written for it; the whole spec is in its record.
    pub spec: super::held_spec::HeldSpec,
    /// The MIG instances its devices stand for (dynamic MIG only).
    pub mig: Vec<crate::plugin::mig::MigHold>,
    /// The pod it was prepared for, as read then; in memory only (the record is written while
    /// the pod is read), so a record loaded at start has none and its pod is read when asked.
    pub consumer: Option<crate::plugin::containers::Consumer>,
}

/// A prepared claim as its record holds it: with the whole CDI spec written for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// The claim.
    pub claim: ClaimRef,
    /// Its shares, in claim order.
    pub devices: Vec<ClaimDevice>,
    /// The CDI spec written for it (rewritten from here if the tmpfs CDI dir lost it).
    pub spec: Spec,
    /// The MIG instances its devices stand for (dynamic MIG only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<crate::plugin::mig::MigHold>,
}

/// A record's claim as written, borrowed from the prepared claim and its spec: the same JSON
/// as [`Recorded`]'s, so the checksum reads back.
#[derive(Serialize)]
struct RecordedRef<'a> {
    claim: &'a ClaimRef,
    devices: &'a [ClaimDevice],
    spec: &'a Spec,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    mig: &'a [crate::plugin::mig::MigHold],
}

impl<'a> RecordedRef<'a> {
    fn of(claim: &'a Recorded) -> Self {
        let Recorded { claim, devices, spec, mig } = claim;
        Self { claim, devices, spec, mig }
    }

    /// The record of prepared claim `claim`, whose spec is `spec`.
    fn of_prepared(claim: &'a PreparedClaim, spec: &'a Spec) -> Self {
        debug_assert!(claim.spec.is(spec), "a record holds the spec its claim holds");
        let PreparedClaim { claim, devices, mig, .. } = claim;
        Self { claim, devices, spec, mig }
    }
}

impl Recorded {
    /// The claim as the driver holds it, with no consumer known yet.
    pub fn held(self) -> PreparedClaim {
        let Self { claim, devices, spec, mig } = self;
        PreparedClaim { claim, devices, spec: super::held_spec::HeldSpec::new(&spec), mig, consumer: None }
    }
}

/// A record on disk; written from a borrowed claim, read into an owned one.
#[derive(Serialize, Deserialize)]
struct Record<C = Recorded> {
    version: u32,
    checksum: String,
    claim: C,
}

#[derive(Deserialize)]
struct Legacy {
    version: u32,
    checksum: String,
    claims: BTreeMap<Uid, Recorded>,
}

/// What [`Checkpoint::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The claims with a valid record.
    pub claims: BTreeMap<Uid, PreparedClaim>,
    /// Records that were corrupt, each moved aside to the path given (`None`: it could not be
    /// moved, and stays where it is).
    pub corrupt: Vec<(CheckpointError, Option<PathBuf>)>,
    /// Entries that are not records at all (directories, links, FIFOs) or could not be read:
    /// skipped, never read blocking, never removed.
    pub ignored: Vec<(PathBuf, String)>,
    /// Empty records, removed: prepares cut short by a power loss before they were answered.
    pub cut_short: Vec<PathBuf>,
    /// The version-1 file was corrupt: any claim may have lost its record.
    pub legacy_lost: bool,
    /// Records moved aside by an earlier start whose claim was not re-adopted yet (the API did
    /// not answer then): the claim's spec is still its, not an orphan.
    pub quarantined: Vec<PathBuf>,
}

impl Loaded {
    /// Whether the record of `uid` may have been lost (a corrupt or unreadable entry under its
    /// name, or a corrupt version-1 file): then a spec without a record is that claim's, to be
    /// re-adopted through the API, not an orphan.
    pub fn may_have_lost(&self, uid: &Uid) -> bool {
        let named = |p: &Path| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{uid}.json")));
        self.legacy_lost
            || self.ignored.iter().any(|(p, _)| named(p))
            || self.quarantined.iter().any(|p| named(p))
            || self.corrupt.iter().any(|(e, _)| matches!(e, CheckpointError::Corrupt { path, .. } if named(path)))
    }
}

/// The largest record read: a claim's devices and its spec are a few KiB.
const MAX_RECORD_BYTES: u64 = 4 << 20;

/// A record's permission bits: only the driver reads its records.
const RECORD_MODE: u32 = 0o600;

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

    /// Reads every record, moving corrupt ones aside, and migrates a version-1 file. Nothing in
    /// the directory stops the load: entries that are not regular files are skipped without
    /// being opened, and a record that cannot be read or moved is reported in [`Loaded`].
    ///
    /// # Errors
    /// [`CheckpointError::Io`] only when the directory itself cannot be listed.
    pub fn load(&self) -> Result<Loaded, CheckpointError> {
        let mut loaded = Loaded::default();
        self.migrate(&mut loaded);
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(loaded),
            Err(source) => return Err(CheckpointError::Io { path: self.dir.clone(), source }),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            let name = entry.file_name().to_str().unwrap_or_default().to_owned();
            let kind = cdi_spec::file::entry_kind(&path);
            if let Ok(cdi_spec::file::EntryKind::Other(what)) = kind {
                loaded.ignored.push((path, format!("a {what}, not a record")));
                continue;
            }
            if name.starts_with(crate::fsutil::TEMP_PREFIX) {
                // A write cut short by a crash; the record it was replacing still stands.
                if let Err(e) = fs::remove_file(&path) {
                    loaded.ignored.push((path, format!("left-over temp file not removed: {e}")));
                }
                continue;
            }
            if name.contains(".json.corrupt-") {
                loaded.quarantined.push(path);
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else { continue };
            if entry.metadata().is_ok_and(|m| m.len() == 0) {
                // What a power loss between a prepare's rename and its fsync leaves (see
                // `WrittenRecord::publish`): the prepare was never answered, and a spec of the
                // claim on disk is older than it (a spec is written only once its record is
                // durable), so the claim was not prepared.
                match fs::remove_file(&path) {
                    Ok(()) => loaded.cut_short.push(path),
                    Err(e) => loaded.ignored.push((path, format!("empty record not removed: {e}"))),
                }
                continue;
            }
            match read_record(&path, stem) {
                Ok(claim) => {
                    loaded.claims.insert(claim.claim.uid.clone(), claim.held());
                }
                Err(e @ CheckpointError::Corrupt { .. }) => {
                    let aside = quarantine(&path).ok();
                    loaded.corrupt.push((e, aside));
                }
                Err(e) => loaded.ignored.push((path, format!("{:#}", anyhow::Error::from(e)))),
            }
        }
        Ok(loaded)
    }

    /// Rewrites a version-1 file as records (a corrupt one is moved aside), then removes it;
    /// every failure is reported in `loaded`.
    fn migrate(&self, loaded: &mut Loaded) {
        let path = self.legacy();
        let bytes = match cdi_spec::file::read_regular(&path, MAX_RECORD_BYTES) {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                loaded.legacy_lost = true;
                loaded.ignored.push((path, format!("version-1 checkpoint unreadable: {e}")));
                return;
            }
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
                // The old file goes only once every record stands on its own.
                let written = claims.values().try_for_each(|claim| self.write(&RecordedRef::of(claim)));
                match written
                    .and_then(|()| fs::remove_file(&path).map_err(|source| CheckpointError::Io { path: path.clone(), source }))
                {
                    Ok(()) => {
                        tracing::info!(claims = claims.len(), from = %path.display(), "checkpoint migrated to one record per claim");
                    }
                    Err(e) => {
                        loaded.ignored.push((path.clone(), format!("migration not finished: {:#}", anyhow::Error::from(e))))
                    }
                }
                loaded.claims.extend(claims.into_iter().map(|(uid, claim)| (uid, claim.held())));
            }
            Err(e) => {
                loaded.legacy_lost = true;
                let aside = quarantine(&path).ok();
                loaded.corrupt.push((e, aside));
            }
        }
    }

    /// Writes `claim`'s record, with `spec`, the spec it holds, atomically (temp file, fsync,
    /// rename, directory fsync).
    ///
    /// # Errors
    /// [`CheckpointError::Io`]; a previous record is then unchanged.
    pub fn record(&self, claim: &PreparedClaim, spec: &Spec) -> Result<(), CheckpointError> {
        self.stage_in(self.reserve()?, claim, spec)?.commit()
    }

    fn write(&self, claim: &RecordedRef<'_>) -> Result<(), CheckpointError> {
        self.stage(self.reserve()?, claim)?.commit()
    }

    /// The whole CDI spec of prepared claim `claim`, read back from its record.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the record cannot be read, [`CheckpointError::Corrupt`]
    /// when it is not a valid record of the claim or holds another spec than the one prepared
    /// (nothing is moved aside: the load does that at the next start).
    pub fn spec_of(&self, claim: &PreparedClaim) -> Result<Spec, CheckpointError> {
        let path = self.record_path(&claim.claim.uid);
        let recorded = read_record(&path, claim.claim.uid.as_str())?;
        if !claim.spec.is(&recorded.spec) {
            return Err(CheckpointError::Corrupt { path, reason: "its spec is not the one the claim was prepared with".into() });
        }
        Ok(recorded.spec)
    }

    /// Creates an empty temp file in the checkpoint directory for [`Checkpoint::write_in`], so
    /// that the file exists before the record is known (see [`crate::fsutil::reserve`]).
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming the directory.
    pub fn reserve(&self) -> Result<crate::fsutil::Reserved, CheckpointError> {
        crate::fsutil::reserve(&self.dir).map_err(|source| CheckpointError::Io { path: self.dir.clone(), source })
    }

    /// First half of [`Checkpoint::record`], into a file made by [`Checkpoint::reserve`]: the
    /// record is durable in a temp file that the load ignores (and removes), until
    /// [`StagedRecord::commit`]; dropping it removes the file.
    ///
    /// # Errors
    /// [`CheckpointError::Io`], also when `reserved` was made in another directory.
    fn stage_in(
        &self,
        reserved: crate::fsutil::Reserved,
        claim: &PreparedClaim,
        spec: &Spec,
    ) -> Result<StagedRecord, CheckpointError> {
        self.stage(reserved, &RecordedRef::of_prepared(claim, spec))
    }

    fn stage(&self, reserved: crate::fsutil::Reserved, claim: &RecordedRef<'_>) -> Result<StagedRecord, CheckpointError> {
        let (path, body) = self.body(claim)?;
        StagedRecord::fill(reserved, path, &body, RECORD_MODE)
    }

    /// A prepare's record, into a file made by [`Checkpoint::reserve`]: written beside its name
    /// and fsynced when `sync` says so; [`WrittenRecord::publish`] makes it part of the
    /// checkpoint once its claim is admitted. Dropping it removes the file.
    ///
    /// # Errors
    /// [`CheckpointError::Io`], also when `reserved` was made in another directory.
    pub fn write_in(
        &self,
        reserved: crate::fsutil::Reserved,
        claim: &PreparedClaim,
        spec: &Spec,
        sync: RecordSync,
    ) -> Result<WrittenRecord, CheckpointError> {
        let (path, body) = self.body(&RecordedRef::of_prepared(claim, spec))?;
        WrittenRecord::write(reserved, path, &body, RECORD_MODE, sync)
    }

    /// The record file of `claim` and what it holds.
    fn body(&self, claim: &RecordedRef<'_>) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
        let path = self.record_path(&claim.claim.uid);
        let record = Record { version: VERSION, checksum: checksum(claim), claim };
        match serde_json::to_vec(&record) {
            Ok(body) => Ok((path, body)),
            Err(e) => Err(CheckpointError::Io { path, source: io::Error::other(e) }),
        }
    }

    /// Removes the records of `uid` moved aside as corrupt, once the claim has been re-adopted
    /// or is known gone; they are not needed to tell its spec from an orphan any more.
    pub fn clear_quarantine(&self, uid: &Uid) {
        let prefix = format!("{uid}.json.corrupt-");
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Makes every record renamed into the checkpoint so far ([`WrittenRecord::publish`]) survive
    /// a crash: one fsync of the directory.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming the directory.
    pub fn sync(&self) -> Result<(), CheckpointError> {
        crate::fsutil::sync_dir(&self.dir).map_err(|source| CheckpointError::Io { path: self.dir.clone(), source })
    }

    /// Removes `uid`'s record, without the directory fsync that makes the removal durable
    /// ([`Checkpoint::sync`], which one fsync can do for many records); whether there was one.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the file cannot be removed.
    pub fn remove(&self, uid: &Uid) -> Result<bool, CheckpointError> {
        let path = self.record_path(uid);
        crate::fsutil::remove_if_present(&path).map_err(|source| CheckpointError::Io { path, source })
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

fn read_record(path: &Path, stem: &str) -> Result<Recorded, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { path: path.to_owned(), reason };
    let bytes = match cdi_spec::file::read_regular(path, MAX_RECORD_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err(CheckpointError::Io { path: path.to_owned(), source: io::ErrorKind::NotFound.into() }),
        Err(source) => return Err(CheckpointError::Io { path: path.to_owned(), source }),
    };
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
    use vgpu_scheduling::{Amounts, DeviceName, Quantity};

    fn sample(uid: &str) -> PreparedClaim {
        let uid = Uid::new(uid).unwrap();
        let claim = ClaimRef::new("ns", "c", uid.as_str()).unwrap();
        let devices = vec![ClaimDevice {
            request: "gpu".into(),
            device: DeviceName::new("hami-gpu-0").unwrap(),
            share_id: Some(Uid::new("s1").unwrap()),
            consumption: Amounts::from([("memory", Quantity::parse("4Gi").unwrap())]),
            admin: false,
        }];
        let spec = super::super::held_spec::HeldSpec::new(&spec_of(uid.as_str()));
        PreparedClaim { claim, devices, spec, mig: Vec::new(), consumer: None }
    }

    /// A spec with an env and a mount, naming its claim.
    fn spec_of(uid: &str) -> Spec {
        let kind = cdi_spec::Kind::parse("k8s.x.io/claim").unwrap();
        let mut spec = Spec::new(&kind, vec![]).unwrap();
        spec.container_edits.env = vec![format!("CUDA_DEVICE_MEMORY_SHARED_CACHE=/claims/{uid}/x.cache")];
        spec.container_edits.mounts = vec![cdi_spec::Mount {
            host_path: format!("/claims/{uid}"),
            container_path: format!("/claims/{uid}"),
            options: vec!["rw".into()],
            kind: None,
        }];
        spec
    }

    fn record(cp: &Checkpoint, uid: &str) {
        cp.record(&sample(uid), &spec_of(uid)).unwrap();
    }

    const A: &str = "0b7e2c4a-1111-4222-8333-444455556666";
    const B: &str = "0b7e2c4a-1111-4222-8333-777788889999";

    #[test]
    fn records_round_trip_and_forget() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        assert!(cp.load().unwrap().claims.is_empty());
        record(&cp, A);
        record(&cp, B);
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims.len(), 2);
        assert_eq!(loaded.claims[&Uid::new(A).unwrap()], sample(A));
        cp.forget(&Uid::new(A).unwrap()).unwrap();
        cp.forget(&Uid::new(A).unwrap()).unwrap();
        assert_eq!(cp.load().unwrap().claims.keys().map(Uid::as_str).collect::<Vec<_>>(), [B]);
    }

    #[test]
    fn a_removal_says_whether_there_was_a_record_and_is_durable_after_a_sync() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        record(&cp, A);
        record(&cp, B);
        assert!(cp.remove(&Uid::new(A).unwrap()).unwrap());
        assert!(!cp.remove(&Uid::new(A).unwrap()).unwrap(), "gone already");
        cp.sync().unwrap();
        assert_eq!(cp.load().unwrap().claims.keys().map(Uid::as_str).collect::<Vec<_>>(), [B]);
        // Something that is not a file under a record's name is an error, not "no record".
        fs::create_dir(cp.dir().join(format!("{A}.json"))).unwrap();
        let err = cp.remove(&Uid::new(A).unwrap()).unwrap_err();
        assert!(err.to_string().contains(A), "{err}");
    }

    #[test]
    fn a_corrupt_record_costs_only_its_claim() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        record(&cp, A);
        record(&cp, B);
        let a = cp.dir().join(format!("{A}.json"));
        let text = fs::read_to_string(&a).unwrap();
        fs::write(&a, &text[..text.len() / 2]).unwrap();
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims.keys().map(Uid::as_str).collect::<Vec<_>>(), [B]);
        assert_eq!(loaded.corrupt.len(), 1);
        assert!(loaded.corrupt[0].1.as_ref().unwrap().exists() && !a.exists());
        assert!(loaded.may_have_lost(&Uid::new(A).unwrap()) && !loaded.may_have_lost(&Uid::new(B).unwrap()));
        // An edited record fails its checksum; one renamed to another claim is refused too.
        record(&cp, A);
        fs::write(&a, fs::read_to_string(&a).unwrap().replace("4Gi", "8Gi")).unwrap();
        let loaded = cp.load().unwrap();
        assert!(loaded.corrupt[0].0.to_string().contains("checksum mismatch"), "{}", loaded.corrupt[0].0);
        fs::copy(cp.dir().join(format!("{B}.json")), &a).unwrap();
        assert!(cp.load().unwrap().corrupt[0].0.to_string().contains("another name"));
    }

    #[test]
    fn a_prepares_record_is_part_of_the_checkpoint_only_once_published() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        let names = || fs::read_dir(cp.dir()).unwrap().count();
        for sync in [RecordSync::AfterRename, RecordSync::BeforeRename] {
            drop(cp.write_in(cp.reserve().unwrap(), &sample(A), &spec_of(A), sync).unwrap());
            assert_eq!(names(), 0, "a refused prepare's record leaves nothing");
        }
        let written = cp.write_in(cp.reserve().unwrap(), &sample(A), &spec_of(A), RecordSync::AfterRename).unwrap();
        assert!(cp.load().unwrap().claims.is_empty(), "written, not part of the checkpoint");
        assert_eq!(names(), 0, "a crash before the rename leaves a temp file, which the load removes");
        drop(written);
        for (uid, sync) in [(A, RecordSync::AfterRename), (B, RecordSync::BeforeRename)] {
            cp.write_in(cp.reserve().unwrap(), &sample(uid), &spec_of(uid), sync).unwrap().publish().unwrap();
            cp.sync().unwrap();
            let loaded = cp.load().unwrap();
            assert_eq!(loaded.claims[&Uid::new(uid).unwrap()], sample(uid), "{sync:?}");
            assert_eq!(cp.spec_of(&sample(uid)).unwrap(), spec_of(uid));
        }
        assert_eq!(names(), 2, "under their own names only");
        assert_eq!(RecordSync::for_prepare(0), RecordSync::AfterRename, "alone: one journal commit");
        assert_eq!(RecordSync::for_prepare(1), RecordSync::BeforeRename, "among others: the fsyncs overlap");
    }

    #[test]
    fn an_empty_record_is_a_prepare_cut_short_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        record(&cp, B);
        // What a power loss between a prepare's rename and its fsync can leave.
        let a = cp.dir().join(format!("{A}.json"));
        fs::write(&a, b"").unwrap();
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims.keys().map(Uid::as_str).collect::<Vec<_>>(), [B]);
        assert_eq!(loaded.cut_short, std::slice::from_ref(&a));
        assert!(loaded.corrupt.is_empty() && !a.exists(), "removed, not moved aside: it holds nothing");
        assert!(!loaded.may_have_lost(&Uid::new(A).unwrap()), "a spec of A is older than the prepare cut short: an orphan");
        // Anything else short of a whole record is corrupt, as before.
        fs::write(&a, b"{").unwrap();
        assert_eq!(cp.load().unwrap().corrupt.len(), 1);
    }

    #[test]
    fn directories_links_and_fifos_are_skipped_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        record(&cp, A);
        fs::create_dir(cp.dir().join(format!("{B}.json"))).unwrap();
        std::os::unix::fs::symlink(dir.path().join("nowhere"), cp.dir().join("dangling.json")).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(cp.dir().join("fifo.json")).status().unwrap().success());
        fs::create_dir(cp.dir().join(format!("{}x", crate::fsutil::TEMP_PREFIX))).unwrap();
        // Would block a plain read forever: the load must finish.
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims.keys().map(Uid::as_str).collect::<Vec<_>>(), [A]);
        assert_eq!(loaded.ignored.len(), 4, "{:?}", loaded.ignored);
        assert!(loaded.may_have_lost(&Uid::new(B).unwrap()), "a directory in place of B's record");
        assert!(cp.dir().join("fifo.json").exists(), "nothing is removed");
    }

    #[test]
    fn version_one_file_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        let s = sample(A);
        let recorded = Recorded { claim: s.claim.clone(), devices: s.devices.clone(), spec: spec_of(A), mig: Vec::new() };
        let v1_claims = BTreeMap::from([(Uid::new(A).unwrap(), recorded)]);
        let v1 = serde_json::json!({"version": 1, "checksum": checksum(&v1_claims), "claims": v1_claims});
        fs::write(dir.path().join("checkpoint.json"), v1.to_string()).unwrap();
        let claims = BTreeMap::from([(Uid::new(A).unwrap(), sample(A))]);
        let loaded = cp.load().unwrap();
        assert_eq!(loaded.claims, claims);
        assert!(!dir.path().join("checkpoint.json").exists());
        assert_eq!(cp.spec_of(&sample(A)).unwrap(), spec_of(A), "the whole spec is in the new record");
        assert_eq!(cp.load().unwrap().claims, claims, "the records now stand on their own");
    }

    #[test]
    fn a_record_holds_the_whole_spec_in_the_form_records_always_had() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        record(&cp, A);
        let text = fs::read_to_string(cp.dir().join(format!("{A}.json"))).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        // Records written before the driver held less than the spec have this form and checksum.
        let s = sample(A);
        let expected = serde_json::json!({
            "claim": s.claim,
            "devices": s.devices,
            "spec": spec_of(A),
        });
        assert_eq!(value["claim"], expected);
        let body = serde_json::to_vec(&serde_json::from_value::<Recorded>(expected).unwrap()).unwrap();
        let sum: String = Sha256::digest(&body).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(value["checksum"], sum);
        assert_eq!(cp.spec_of(&sample(A)).unwrap(), spec_of(A));
    }

    #[test]
    fn the_spec_is_read_back_only_from_the_claims_own_valid_record() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("checkpoint"));
        // No record.
        assert!(matches!(cp.spec_of(&sample(A)), Err(CheckpointError::Io { .. })));
        record(&cp, A);
        record(&cp, B);
        // Another claim's record under its name.
        let a = cp.dir().join(format!("{A}.json"));
        fs::copy(cp.dir().join(format!("{B}.json")), &a).unwrap();
        assert!(matches!(cp.spec_of(&sample(A)), Err(CheckpointError::Corrupt { .. })));
        // Its own, valid, but with another spec than the one held: stale, never written back.
        let mut other = sample(A);
        other.spec = super::super::held_spec::HeldSpec::new(&spec_of(B));
        cp.record(&other, &spec_of(B)).unwrap();
        let err = cp.spec_of(&sample(A)).unwrap_err();
        assert!(err.to_string().contains("not the one the claim was prepared with"), "{err}");
        // Edited: the checksum refuses it.
        record(&cp, A);
        fs::write(&a, fs::read_to_string(&a).unwrap().replace("rw", "ro")).unwrap();
        assert!(cp.spec_of(&sample(A)).unwrap_err().to_string().contains("checksum"));
        // Nothing was moved aside by reading.
        assert!(a.exists());
    }
}
