//! Durable file replacement for the driver's own files (checkpoint, ld.so.preload); CDI specs
//! have their own staged variant in `cdi-spec`.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The name prefix of a temp file that [`write_atomically`] has not renamed yet.
pub const TEMP_PREFIX: &str = ".vgpu-dra-tmp-";

/// The fsyncs this module has made in this process.
static FSYNCS: AtomicU64 = AtomicU64::new(0);

/// How many fsyncs of files and directories this module has made in this process (the
/// checkpoint, claim files, host files): the durable writes a prepare costs, for the metrics.
pub fn fsyncs() -> u64 {
    FSYNCS.load(Ordering::Relaxed)
}

/// `fsync(2)` of `file`, counted.
fn sync(file: &File) -> io::Result<()> {
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    file.sync_all()
}

/// Writes `body` to `path` with permission bits `mode` so readers see the old file or the new
/// one, never a mix, and the new one survives a crash: temp file in the same directory, mode
/// set, fsync, rename, directory fsync. The mode is set explicitly because the temp file is
/// created 0600: a host file that containers read (`ld.so.preload`) must say 0644, or every
/// container not running as root would silently run without HAMi-core.
///
/// # Errors
/// The I/O error of the step that failed; the previous file is then unchanged.
pub fn write_atomically(path: &Path, body: &[u8], mode: u32) -> io::Result<()> {
    stage(path, body, mode)?.commit()
}

/// First half of [`write_atomically`]: `body` is durable in a temp file beside `path`, not yet
/// visible under it. The slow part (the file's fsync) can so run while other work is pending
/// and be thrown away unseen; dropping the result removes the temp file.
///
/// # Errors
/// The I/O error of the step that failed.
pub fn stage(path: &Path, body: &[u8], mode: u32) -> io::Result<Staged> {
    reserve(path.parent().unwrap_or(Path::new("/")))?.fill(path, body, mode)
}

/// Creates an empty temp file in `dir` (and `dir` if missing), to be filled by
/// [`Reserved::fill`] once its content is known. Creating a file is the slow step of staging on
/// some file systems (ext4 without a journal looks through recently freed inodes first), so it
/// can run while the content is still being read; dropping the result removes the file.
///
/// # Errors
/// The I/O error of the directory or the file.
pub fn reserve(dir: &Path) -> io::Result<Reserved> {
    std::fs::create_dir_all(dir)?;
    let tmp = tempfile::Builder::new().prefix(TEMP_PREFIX).tempfile_in(dir)?;
    Ok(Reserved { tmp, dir: dir.to_owned() })
}

/// An empty temp file made by [`reserve`], not yet bound to a target.
#[derive(Debug)]
pub struct Reserved {
    tmp: tempfile::NamedTempFile,
    dir: PathBuf,
}

impl Reserved {
    /// Whether the temp file is still in its directory under its name (someone may have emptied
    /// the directory since it was made, and a rename of it would then fail).
    pub fn still_there(&self) -> bool {
        cdi_spec::file::names_open_file(self.tmp.path(), self.tmp.as_file())
    }

    /// Writes `body` with permission bits `mode` and fsyncs it, for [`Staged::commit`] to rename
    /// over `path`.
    ///
    /// # Errors
    /// As [`Reserved::write`], and the I/O error of the fsync.
    pub fn fill(self, path: &Path, body: &[u8], mode: u32) -> io::Result<Staged> {
        let Written { tmp, target } = self.write(path, body, mode)?;
        sync(tmp.as_file())?;
        Ok(Staged { tmp, target })
    }

    /// Writes `body` with permission bits `mode`, not fsynced, for [`Written::rename_and_sync`]
    /// to rename over `path`.
    ///
    /// # Errors
    /// `InvalidInput` when `path` is not in the reserved file's directory (a rename could not be
    /// atomic there); otherwise the I/O error of the write.
    pub fn write(self, path: &Path, body: &[u8], mode: u32) -> io::Result<Written> {
        use std::os::unix::fs::PermissionsExt;
        if path.parent() != Some(self.dir.as_path()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not in {}, where its temp file was made", path.display(), self.dir.display()),
            ));
        }
        let mut tmp = self.tmp;
        tmp.write_all(body)?;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
        Ok(Written { tmp, target: path.to_owned() })
    }
}

/// A file written beside its target, neither fsynced nor visible yet; dropping it removes it.
#[derive(Debug)]
pub struct Written {
    tmp: tempfile::NamedTempFile,
    target: PathBuf,
}

impl Written {
    /// Renames the file over its target, then fsyncs the file; the directory's fsync, which
    /// makes the name durable, is the caller's ([`sync_dir`], shared among several).
    ///
    /// Why this order: on a journaled file system the file's fsync commits the journal
    /// transaction that holds the rename too, so the directory's fsync after it finds nothing
    /// left to commit; fsync first, rename second costs two commits in a row (measured on ext4:
    /// 1.2 to 1.4 ms against 0.5 to 0.7 ms for the pair). The price: the target is visible
    /// before it is durable, and a power loss before this returns can leave it empty (the data
    /// not yet written when the rename was committed); a caller answers no one before this and
    /// the directory's fsync return, and treats an empty file as a write cut short.
    ///
    /// # Errors
    /// The I/O error of the rename (the previous target unchanged, the temp file removed) or
    /// of the fsync (the target then holds the new content, possibly not durably).
    pub fn rename_and_sync(self) -> io::Result<()> {
        let file = self.tmp.persist(&self.target).map_err(|e| e.error)?;
        sync(&file)
    }
}

/// A file written and fsynced beside its target, made visible by [`Staged::commit`].
#[derive(Debug)]
pub struct Staged {
    tmp: tempfile::NamedTempFile,
    target: PathBuf,
}

impl Staged {
    /// Renames the temp file over the target and fsyncs the directory.
    ///
    /// # Errors
    /// The I/O error of the rename or the fsync; after a failed rename the previous target is
    /// unchanged and the temp file removed.
    pub fn commit(self) -> io::Result<()> {
        let dir = self.target.parent().unwrap_or(Path::new("/")).to_owned();
        self.rename()?;
        sync_dir(&dir)
    }

    /// First half of [`Staged::commit`]: renames the temp file over the target, without the
    /// directory fsync, for a caller that shares one [`sync_dir`] among several renames (group
    /// commit). Until that fsync returns, a crash may undo the rename.
    ///
    /// # Errors
    /// As [`Staged::commit`]'s rename.
    pub fn rename(self) -> io::Result<()> {
        self.tmp.persist(&self.target).map(drop).map_err(|e| e.error)
    }
}

/// `fsync(2)` of directory `dir`, counted: makes the renames and removals in it so far survive a
/// crash.
///
/// # Errors
/// The I/O error of the open or the fsync.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    sync(&File::open(dir)?)
}

/// Removes `path` so the removal survives a crash (directory fsync); a missing file is fine.
///
/// # Errors
/// The I/O error of the removal or the fsync.
pub fn remove_durably(path: &Path) -> io::Result<()> {
    if remove_if_present(path)? { sync_dir(path.parent().unwrap_or(Path::new("/"))) } else { Ok(()) }
}

/// Removes `path` without making the removal durable (for a caller that shares one
/// [`sync_dir`] among several); whether it was there.
///
/// # Errors
/// The I/O error of the removal, other than the file missing.
pub fn remove_if_present(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_staged_file_is_invisible_until_committed_and_gone_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomically(&path, b"old", 0o600).unwrap();
        let names = || std::fs::read_dir(dir.path()).unwrap().count();
        let dropped = stage(&path, b"dropped", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old", "staging changes nothing visible");
        assert_eq!(names(), 2, "the temp file sits beside the target");
        drop(dropped);
        assert_eq!(names(), 1, "a dropped stage leaves nothing behind");
        let staged = stage(&path, b"new", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        staged.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o644);
        assert_eq!(names(), 1);
    }

    #[test]
    fn a_written_file_is_invisible_until_renamed_and_gone_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomically(&path, b"old", 0o600).unwrap();
        let names = || std::fs::read_dir(dir.path()).unwrap().count();
        drop(reserve(dir.path()).unwrap().write(&path, b"dropped", 0o600).unwrap());
        assert_eq!((names(), std::fs::read(&path).unwrap()), (1, b"old".to_vec()), "a dropped write leaves nothing behind");
        let written = reserve(dir.path()).unwrap().write(&path, b"new", 0o644).unwrap();
        assert_eq!((names(), std::fs::read(&path).unwrap()), (2, b"old".to_vec()), "written beside the target, unseen");
        written.rename_and_sync().unwrap();
        assert_eq!((names(), std::fs::read(&path).unwrap()), (1, b"new".to_vec()));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o644);
        let err = reserve(dir.path()).unwrap().write(&dir.path().join("sub").join("f"), b"x", 0o600).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "only beside the reserved file");
        assert_eq!(names(), 1);
    }

    #[test]
    fn a_reserved_file_is_filled_only_for_a_target_beside_it_and_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let names = || std::fs::read_dir(dir.path()).unwrap().count();
        let sub = dir.path().join("sub");
        let reserved = reserve(&sub).unwrap();
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "the empty temp file exists");
        let err = reserve(&sub).unwrap().fill(&dir.path().join("f"), b"x", 0o600).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(names(), 1, "nothing written outside the reserved directory");
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "the refused reservation is gone");
        drop(reserved);
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 0);
        let target = sub.join("f");
        reserve(&sub).unwrap().fill(&target, b"body", 0o640).unwrap().commit().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"body");
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777, 0o640);
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1);
    }

    #[test]
    fn a_reserved_file_knows_when_its_name_is_gone_or_taken() {
        let dir = tempfile::tempdir().unwrap();
        let kept = reserve(dir.path()).unwrap();
        assert!(kept.still_there());
        let (removed, replaced) = (reserve(dir.path()).unwrap(), reserve(dir.path()).unwrap());
        std::fs::remove_file(removed.tmp.path()).unwrap();
        std::fs::remove_file(replaced.tmp.path()).unwrap();
        std::fs::write(replaced.tmp.path(), b"another file under the same name").unwrap();
        assert!(!removed.still_there(), "removed");
        assert!(!replaced.still_there(), "another file now has its name");
        assert!(kept.still_there());
    }

    #[test]
    fn the_file_has_the_mode_asked_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o600] {
            let path = dir.path().join(format!("f{mode:o}"));
            write_atomically(&path, b"x", mode).unwrap();
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, mode);
            assert_eq!(std::fs::read(&path).unwrap(), b"x");
        }
        remove_durably(&dir.path().join("f644")).unwrap();
        remove_durably(&dir.path().join("f644")).unwrap();
        assert!(!dir.path().join("f644").exists());
    }
}
