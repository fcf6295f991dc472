//! A checkpoint record on its way to disk (written beside its name, fsynced before or after its
//! rename into place), and the checkpoint's errors.

use std::io;
use std::path::PathBuf;

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

/// When a prepare's record is fsynced: either way it is durable once the directory's fsync
/// after its rename returns, and the load reads what either leaves after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordSync {
    /// While the claim is checked, before its admission: the fsync overlaps that work and the
    /// other prepares in flight, and the directory's fsync after the rename is a second journal
    /// commit. For a prepare among others.
    BeforeRename,
    /// After the rename: one journal commit covers the rename and the data, so the directory's
    /// fsync after it has nothing left to commit ([`crate::fsutil::Written::rename_and_sync`]),
    /// but the record is visible before it is durable: a power loss then can leave it empty,
    /// which the load takes for the prepare cut short that it was. For a prepare alone.
    AfterRename,
}

impl RecordSync {
    /// The order for a prepare with `others` other prepares in flight. Measured on a journaled
    /// ext4 disk (BENCHMARKS.md, issue 35, seventh pass): alone, fsyncing after the rename took
    /// a third off a prepare; with 16 in flight it showed no gain, its runs at the low end of
    /// the old order's, so prepares among others keep fsyncing while their claim is checked.
    pub fn for_prepare(others: usize) -> Self {
        if others == 0 { Self::AfterRename } else { Self::BeforeRename }
    }
}

/// A prepare's record written beside its final name, not part of the checkpoint yet.
#[derive(Debug)]
pub struct WrittenRecord {
    file: RecordFile,
    path: PathBuf,
}

/// A prepare's record file, fsynced or not yet.
#[derive(Debug)]
enum RecordFile {
    Synced(crate::fsutil::Staged),
    Unsynced(crate::fsutil::Written),
}

impl WrittenRecord {
    /// `body`, the record at `path`, into `reserved` (beside `path`) with permission bits
    /// `mode`, fsynced as `sync` says.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming `path`.
    pub(super) fn write(
        reserved: crate::fsutil::Reserved,
        path: PathBuf,
        body: &[u8],
        mode: u32,
        sync: RecordSync,
    ) -> Result<Self, CheckpointError> {
        let io_err = |source| CheckpointError::Io { path: path.clone(), source };
        let file = match sync {
            RecordSync::BeforeRename => RecordFile::Synced(reserved.fill(&path, body, mode).map_err(io_err)?),
            RecordSync::AfterRename => RecordFile::Unsynced(reserved.write(&path, body, mode).map_err(io_err)?),
        };
        Ok(Self { file, path })
    }

    /// Renames the record into place, fsyncing it after the rename if it was not before,
    /// without the directory fsync that makes the name durable
    /// ([`Checkpoint::sync`](super::checkpoint::Checkpoint::sync), which one fsync can do for
    /// many records).
    ///
    /// # Errors
    /// [`CheckpointError::Io`]; after a failed rename a previous record is unchanged, after a
    /// failed fsync the record is in place and may not be durable (the caller removes it).
    pub fn publish(self) -> Result<(), CheckpointError> {
        let Self { file, path } = self;
        let done = match file {
            RecordFile::Synced(staged) => staged.rename(),
            RecordFile::Unsynced(written) => written.rename_and_sync(),
        };
        done.map_err(|source| CheckpointError::Io { path, source })
    }
}

/// A record written (durably) beside its final name, not yet part of the checkpoint.
#[derive(Debug)]
pub struct StagedRecord {
    staged: crate::fsutil::Staged,
    path: PathBuf,
}

impl StagedRecord {
    /// `body`, the record at `path`, into `reserved` (beside `path`) with permission bits
    /// `mode`, fsynced.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] naming `path`.
    pub(super) fn fill(
        reserved: crate::fsutil::Reserved,
        path: PathBuf,
        body: &[u8],
        mode: u32,
    ) -> Result<Self, CheckpointError> {
        match reserved.fill(&path, body, mode) {
            Ok(staged) => Ok(Self { staged, path }),
            Err(source) => Err(CheckpointError::Io { path, source }),
        }
    }

    /// Makes the record part of the checkpoint (rename, directory fsync).
    ///
    /// # Errors
    /// [`CheckpointError::Io`]; a previous record is then unchanged.
    pub fn commit(self) -> Result<(), CheckpointError> {
        let Self { staged, path } = self;
        staged.commit().map_err(|source| CheckpointError::Io { path, source })
    }
}
