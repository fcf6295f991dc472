//! A CDI spec directory (`/var/run/cdi` by default) holding one spec file per prepared claim.
//!
//! Container runtimes read this directory at any moment, so a spec file must never be seen half
//! written: each write goes to a hidden temp file in the same directory (which runtimes ignore,
//! lacking a `.json` suffix) and is renamed over the target. Whether the file and the directory
//! are also fsynced is the owner's choice ([`Durability`]): a spec the owner rebuilds from its own
//! durable record needs no fsync of its own.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{DeviceName, Kind, NameError, Spec};

/// Prefix of temp files; they lack a `.json` suffix so no CDI reader loads them.
const TEMP_PREFIX: &str = ".cdi-tmp-";
/// Our specs are a few KiB; anything past this is not one of ours and is not read whole.
pub const MAX_SPEC_BYTES: u64 = 1 << 20;

/// Failures of spec directory operations, each naming the file involved.
#[derive(Debug, thiserror::Error)]
pub enum SpecDirError {
    /// A spec ID would not make a safe file name.
    #[error("spec id {id:?} is not a safe file name")]
    BadId {
        /// The ID as given.
        id: String,
        /// Why it is refused.
        #[source]
        source: NameError,
    },
    /// The directory could not be created or read.
    #[error("CDI spec directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Writing a spec file failed; the previous file, if any, is unchanged.
    #[error("writing CDI spec {path}")]
    Write {
        /// The target file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Removing a spec file failed.
    #[error("removing CDI spec {path}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A spec file could not be read or parsed.
    #[error("reading CDI spec {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
}

/// A directory of CDI specs of one kind, owned by this driver.
#[derive(Debug, Clone)]
pub struct SpecDir {
    path: PathBuf,
    kind: Kind,
    durability: Durability,
}

/// What a write or removal of a spec file promises after a power loss (never for a running
/// system: readers always see the old file or the new one, whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// The file and the directory are fsynced: the change survives a power loss.
    #[default]
    Durable,
    /// Rename only, no fsync: after a power loss a spec may be missing, empty or back. For owners
    /// that rebuild their specs from a durable record of their own at start-up (and where
    /// `/var/run/cdi` is tmpfs, as on most hosts, a power loss empties it anyway).
    Rebuildable,
}

/// An entry with one of our spec names that is not a regular file (a directory, link, FIFO...):
/// never read, never removed, reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredEntry {
    /// The entry.
    pub path: PathBuf,
    /// What it is.
    pub what: &'static str,
}

/// What [`SpecDir::scan`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Our spec files, sorted by ID.
    pub owned: Vec<OwnedSpec>,
    /// Entries under our names that are not regular files.
    pub ignored: Vec<IgnoredEntry>,
}

/// A spec file of this driver found in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedSpec {
    /// The ID the spec was written under (the claim UID).
    pub id: String,
    /// Its file.
    pub path: PathBuf,
}

impl SpecDir {
    /// A handle on `path` for specs of `kind`; nothing is touched until the first operation.
    pub fn new(path: impl Into<PathBuf>, kind: Kind) -> Self {
        Self { path: path.into(), kind, durability: Durability::default() }
    }

    /// The same directory with writes and removals of `durability`.
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The kind of the specs this handle owns.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The file that holds the spec stored under `id`.
    ///
    /// # Errors
    /// [`SpecDirError::BadId`] when `id` is not a valid CDI device name (so never a path).
    pub fn file_for(&self, id: &str) -> Result<PathBuf, SpecDirError> {
        DeviceName::new(id).map_err(|source| SpecDirError::BadId { id: id.into(), source })?;
        Ok(self.path.join(format!("{}_{id}.json", self.kind.file_stem())))
    }

    /// Writes `spec` under `id` atomically: readers see the old file or the new one, never a mix.
    ///
    /// # Errors
    /// [`SpecDirError`] naming the file; on error the previous file is unchanged.
    pub fn write(&self, id: &str, spec: &Spec) -> Result<PathBuf, SpecDirError> {
        let staged = self.stage(id, spec)?;
        staged.commit()
    }

    /// First half of [`SpecDir::write`]: the content is in a temp file (fsynced when
    /// [`Durability::Durable`]), not yet visible; dropping the result removes the temp file.
    ///
    /// # Errors
    /// [`SpecDirError`] naming the file.
    pub fn stage(&self, id: &str, spec: &Spec) -> Result<StagedSpec, SpecDirError> {
        self.stage_in(self.reserve()?, id, spec)
    }

    /// Creates an empty temp file in the directory (and the directory if missing), for
    /// [`SpecDir::stage_in`] to fill once the spec is known. Creating a file can be the slow part
    /// of staging, so it may run while the spec is still being worked out; dropping the result
    /// removes the file.
    ///
    /// # Errors
    /// [`SpecDirError::Dir`] or [`SpecDirError::Write`] naming the directory.
    pub fn reserve(&self) -> Result<ReservedSpec, SpecDirError> {
        fs::create_dir_all(&self.path).map_err(|source| SpecDirError::Dir { path: self.path.clone(), source })?;
        let tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.path)
            .map_err(|source| SpecDirError::Write { path: self.path.clone(), source })?;
        Ok(ReservedSpec { tmp, dir: self.path.clone() })
    }

    /// [`SpecDir::stage`] into a file made by [`SpecDir::reserve`].
    ///
    /// # Errors
    /// [`SpecDirError`] naming the file; [`SpecDirError::Write`] with `InvalidInput` when
    /// `reserved` was made in another directory.
    pub fn stage_in(&self, reserved: ReservedSpec, id: &str, spec: &Spec) -> Result<StagedSpec, SpecDirError> {
        let target = self.file_for(id)?;
        let write_err = |source| SpecDirError::Write { path: target.clone(), source };
        if reserved.dir != self.path {
            return Err(write_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the temp file was made in {}", reserved.dir.display()),
            )));
        }
        let mut body = serde_json::to_vec_pretty(spec).map_err(|e| write_err(io::Error::other(e)))?;
        body.push(b'\n');
        let mut tmp = reserved.tmp;
        tmp.write_all(&body).map_err(write_err)?;
        let synced = self.durability == Durability::Durable;
        if synced {
            sync(tmp.as_file()).map_err(write_err)?;
        }
        Ok(StagedSpec { tmp, target, dir: self.path.clone(), synced })
    }

    /// Removes the spec stored under `id`; a missing file is not an error.
    ///
    /// # Errors
    /// [`SpecDirError`] naming the file.
    pub fn remove(&self, id: &str) -> Result<bool, SpecDirError> {
        let path = self.file_for(id)?;
        match fs::remove_file(&path) {
            Ok(()) => {
                if self.durability == Durability::Durable {
                    sync_dir(&self.path).map_err(|source| SpecDirError::Remove { path: path.clone(), source })?;
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(SpecDirError::Remove { path, source }),
        }
    }

    /// Reads back the spec stored under `id`, `None` when there is none.
    ///
    /// # Errors
    /// [`SpecDirError::Read`] when the file exists but cannot be read or parsed.
    /// Only a regular file of at most `MAX_SPEC_BYTES` is read; anything else in its place is
    /// an error, never a blocked read.
    pub fn read(&self, id: &str) -> Result<Option<Spec>, SpecDirError> {
        let path = self.file_for(id)?;
        match crate::file::read_regular(&path, MAX_SPEC_BYTES) {
            Ok(Some(bytes)) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| SpecDirError::Read { path, source: io::Error::new(io::ErrorKind::InvalidData, e) }),
            Ok(None) => Ok(None),
            Err(source) => Err(SpecDirError::Read { path, source }),
        }
    }

    /// Lists the spec files of this kind, by the ID they were written under, sorted by ID.
    /// Files of other kinds and other drivers are left alone, and so is anything under our
    /// names that is not a regular file.
    ///
    /// # Errors
    /// [`SpecDirError::Dir`] when the directory cannot be read (a missing one lists nothing).
    pub fn list_owned(&self) -> Result<Vec<OwnedSpec>, SpecDirError> {
        self.scan().map(|s| s.owned)
    }

    /// [`SpecDir::list_owned`], also reporting the entries under our names that are not regular
    /// files (by their own metadata: links are not followed).
    ///
    /// # Errors
    /// [`SpecDirError::Dir`] when the directory cannot be read (a missing one lists nothing).
    pub fn scan(&self) -> Result<Scan, SpecDirError> {
        let prefix = format!("{}_", self.kind.file_stem());
        let entries = match fs::read_dir(&self.path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Scan::default()),
            Err(source) => return Err(SpecDirError::Dir { path: self.path.clone(), source }),
        };
        let mut scan = Scan::default();
        for entry in entries {
            let entry = entry.map_err(|source| SpecDirError::Dir { path: self.path.clone(), source })?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if DeviceName::new(id).is_err() {
                continue;
            }
            let path = entry.path();
            match crate::file::entry_kind(&path) {
                Ok(crate::file::EntryKind::Regular) => scan.owned.push(OwnedSpec { id: id.to_owned(), path }),
                Ok(crate::file::EntryKind::Other(what)) => scan.ignored.push(IgnoredEntry { path, what }),
                // Gone between the listing and the look: nothing to list.
                Err(_) => {}
            }
        }
        scan.owned.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(scan)
    }

    /// Deletes temp files left by a crash between staging and commit; returns how many.
    ///
    /// # Errors
    /// [`SpecDirError`] when the directory cannot be read or a file not removed.
    pub fn remove_stale_temps(&self) -> Result<usize, SpecDirError> {
        let entries = match fs::read_dir(&self.path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(source) => return Err(SpecDirError::Dir { path: self.path.clone(), source }),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|source| SpecDirError::Dir { path: self.path.clone(), source })?;
            let path = entry.path();
            // Only our own temp files are regular files; anything else under the prefix is left.
            if entry.file_name().to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX))
                && matches!(crate::file::entry_kind(&path), Ok(crate::file::EntryKind::Regular))
            {
                fs::remove_file(&path).map_err(|source| SpecDirError::Remove { path, source })?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// An empty temp file in a spec directory, made by [`SpecDir::reserve`].
#[derive(Debug)]
pub struct ReservedSpec {
    tmp: tempfile::NamedTempFile,
    dir: PathBuf,
}

impl ReservedSpec {
    /// Whether the temp file is still in its directory under its name (someone may have emptied
    /// the directory since it was made, and a rename of it would then fail).
    pub fn still_there(&self) -> bool {
        crate::file::names_open_file(self.tmp.path(), self.tmp.as_file())
    }
}

/// A spec written to a temp file beside its target, made visible by [`StagedSpec::commit`].
#[derive(Debug)]
pub struct StagedSpec {
    tmp: tempfile::NamedTempFile,
    target: PathBuf,
    dir: PathBuf,
    synced: bool,
}

impl StagedSpec {
    /// Renames the temp file over the target and fsyncs the directory (when durable).
    ///
    /// # Errors
    /// [`SpecDirError::Write`]; the previous target, if any, is unchanged.
    pub fn commit(self) -> Result<PathBuf, SpecDirError> {
        let target = self.target;
        self.tmp.persist(&target).map_err(|e| SpecDirError::Write { path: target.clone(), source: e.error })?;
        if self.synced {
            sync_dir(&self.dir).map_err(|source| SpecDirError::Write { path: target.clone(), source })?;
        }
        Ok(target)
    }

    /// Leaves the temp file on disk without committing, as a crash at this point would.
    pub fn abandon(self) -> PathBuf {
        match self.tmp.into_temp_path().keep() {
            Ok(path) => path,
            Err(e) => e.path.to_path_buf(),
        }
    }
}

/// Makes a rename or unlink in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    sync(&File::open(dir)?)
}

/// The fsyncs this module has made in this process.
static FSYNCS: AtomicU64 = AtomicU64::new(0);

/// How many fsyncs of spec files and spec directories this process has made, for a driver's
/// metrics: the durable writes its specs cost.
pub fn fsyncs() -> u64 {
    FSYNCS.load(Ordering::Relaxed)
}

/// `fsync(2)` of `file`, counted.
fn sync(file: &File) -> io::Result<()> {
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    file.sync_all()
}
