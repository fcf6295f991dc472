//! How claim directories leave the node. A claim's directory is bind-mounted read-write into its
//! containers, so whatever a tenant left there is hostile input: 100,000 nested directories, a
//! million files, FIFOs, sockets, a directory it made unreadable, a file a process still holds.
//! `std::fs::remove_dir_all` recurses once per level and keeps a descriptor per level, so such a
//! tree overflows the stack or the open-file limit of the daemon.
//!
//! So an unprepare only renames the directory into [`TRASH_DIR`] beside the claim directories (one
//! `rename`, whatever the content; containers never see the trash: each sees only its own claim
//! directory), and [`Trash::empty`] removes what the trash holds later, on a blocking thread:
//! - depth costs neither stack nor descriptors: the walk holds the directory it is in (plus one
//!   for reading it and one while climbing) and goes back up through `..`, recognising the top by
//!   its device and inode; a tenant can move entries only inside its own directory (its mount),
//!   so `..` never leads out of the tree being removed;
//! - nothing is opened but directories, always relative to an open parent and never through a
//!   symbolic link, so a link, FIFO or device is unlinked, never followed or read;
//! - each call has a budget of file operations, and what it cannot remove (a directory a
//!   process keeps filling) stays for the next call: the caller never waits on a tenant.

use std::collections::HashSet;
use std::ffi::{CStr, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The trash's name inside the claims' root; no claim UID can take it (UIDs have no dot).
pub const TRASH_DIR: &str = ".trash";

/// File operations one [`Trash::empty`] may make before it stops for this time.
pub const DEFAULT_BUDGET: usize = 2_000_000;

/// Directories that could not be removed in one walk, remembered so the walk does not go back
/// into them; past this many the walk stops for this time.
const MAX_STUCK: usize = 4096;

/// The trash of one claims' root.
#[derive(Debug, Clone)]
pub struct Trash {
    dir: PathBuf,
}

/// What one [`Trash::empty`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Emptied {
    /// Entries removed whole.
    pub removed: usize,
    /// Entries still there (a budget spent, or something that cannot be removed now).
    pub left: usize,
    /// The first error met, for the log.
    pub error: Option<String>,
}

impl Trash {
    /// The trash of the claim directories under `claims_root`.
    pub fn new(claims_root: &Path) -> Self {
        Self { dir: claims_root.join(TRASH_DIR) }
    }

    /// Where it is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves `dir` into the trash under a name of its own, without looking inside: one rename.
    /// `Ok(false)` when there is nothing at `dir`.
    ///
    /// # Errors
    /// When the trash cannot be made or the rename fails (another file system under `dir`).
    pub fn discard(&self, dir: &Path) -> io::Result<bool> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        match std::fs::symlink_metadata(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        self.make()?;
        let base = dir.file_name().map_or_else(|| "entry".into(), OsStr::to_string_lossy);
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let target = self.dir.join(format!("{base}.{stamp}.{}", SEQUENCE.fetch_add(1, Ordering::Relaxed)));
        match std::fs::rename(dir, &target) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates the trash, readable by root only (it holds what tenants wrote).
    fn make(&self) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes what the trash holds, within `budget` file operations.
    pub fn empty(&self, budget: usize) -> Emptied {
        let mut report = Emptied::default();
        let trash = match rustix::fs::openat(CWD, &self.dir, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return report,
            Err(e) => {
                report.error = Some(format!("opening {}: {}", self.dir.display(), io::Error::from(e)));
                return report;
            }
        };
        let names = match entries(trash.as_fd()) {
            Ok(names) => names,
            Err(e) => {
                report.error = Some(format!("listing {}: {e}", self.dir.display()));
                return report;
            }
        };
        let mut walk = Walk { budget, stuck: HashSet::new() };
        for name in names {
            match walk.remove(trash.as_fd(), &name) {
                Ok(true) => report.removed += 1,
                Ok(false) => report.left += 1,
                Err(e) => {
                    report.left += 1;
                    report.error.get_or_insert_with(|| {
                        format!("removing {}: {e}", self.dir.join(OsStr::from_bytes(name.to_bytes())).display())
                    });
                }
            }
        }
        report
    }
}

/// Opening a directory: never through a link, never kept across an exec.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The names in the directory `fd` (the trash itself: a short list of claim directories).
fn entries(fd: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::CString>> {
    let mut names = Vec::new();
    for entry in Dir::read_from(fd)? {
        let entry = entry?;
        let name = entry.file_name();
        if !is_dot(name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// A directory's identity.
fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// One removal pass: what it may still do, and the directories it found it cannot remove.
struct Walk {
    budget: usize,
    stuck: HashSet<u64>,
}

impl Walk {
    /// Takes one file operation from the budget; false when it is spent.
    fn spend(&mut self) -> bool {
        if self.budget == 0 {
            return false;
        }
        self.budget -= 1;
        true
    }

    /// Removes the entry `name` of `parent` and everything under it. `Ok(false)`: some of it is
    /// left for a later pass.
    fn remove(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
        if !self.spend() {
            return Ok(false);
        }
        let top = match rustix::fs::openat(parent, name, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOTDIR | Errno::LOOP) => return unlink(parent, name).map(|()| true),
            Err(Errno::NOENT) => return Ok(true),
            Err(e) => return Err(e.into()),
        };
        let top_id = identity(top.as_fd())?;
        self.stuck.clear();
        let mut here = top;
        loop {
            if self.stuck.len() > MAX_STUCK || self.budget == 0 {
                return Ok(false);
            }
            if let Some(child) = self.clear_files(here.as_fd())? {
                here = child;
                continue;
            }
            // Nothing here this walk can descend into: it is empty or what is left is stuck.
            let id = identity(here.as_fd())?;
            if id == top_id {
                break;
            }
            let up = rustix::fs::openat(here.as_fd(), c"..", dir_flags(), Mode::empty())?;
            drop(here);
            if !self.remove_child(up.as_fd(), id.1)? {
                self.stuck.insert(id.1);
            }
            here = up;
        }
        drop(here);
        if !self.spend() {
            return Ok(false);
        }
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(true),
            Err(Errno::NOTEMPTY | Errno::EXIST | Errno::BUSY | Errno::PERM | Errno::ACCESS) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Unlinks every entry of the directory `dir` that is not a directory, and returns the first
    /// subdirectory it could open that is not known to be stuck.
    fn clear_files(&mut self, dir: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
        for entry in Dir::read_from(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if is_dot(name) {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(e.into()),
                },
                kind => kind,
            };
            if !self.spend() {
                return Ok(None);
            }
            if kind != FileType::Directory {
                // Whatever it is (a FIFO, a socket, a link, a file held open), unlinking it
                // neither opens nor follows it. One that cannot go leaves its directory stuck.
                let _ = unlink(dir, name);
                continue;
            }
            if self.stuck.contains(&entry.ino()) {
                continue;
            }
            match self.open_child(dir, name) {
                Ok(Some(child)) => return Ok(Some(child)),
                Ok(None) => {
                    self.stuck.insert(entry.ino());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Opens the subdirectory `name` of `dir`; one a tenant made unreadable is given back the
    /// owner's rights first (a daemon without CAP_DAC_OVERRIDE needs that). `None`: it cannot be
    /// entered now.
    fn open_child(&mut self, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<OwnedFd>> {
        match rustix::fs::openat(dir, name, dir_flags(), Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            // Replaced by something else meanwhile: unlinked as such.
            Err(Errno::NOTDIR | Errno::LOOP) => {
                let _ = unlink(dir, name);
                Ok(None)
            }
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::ACCESS | Errno::PERM) => {
                if rustix::fs::chmodat(dir, name, Mode::RWXU, AtFlags::empty()).is_ok()
                    && let Ok(fd) = rustix::fs::openat(dir, name, dir_flags(), Mode::empty())
                {
                    return Ok(Some(fd));
                }
                // An empty one goes without being entered.
                let _ = rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR);
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the (emptied) subdirectory with inode `ino` of `parent`. `Ok(false)`: it could not
    /// be removed (not empty after all).
    fn remove_child(&mut self, parent: BorrowedFd<'_>, ino: u64) -> io::Result<bool> {
        for entry in Dir::read_from(parent)? {
            let entry = entry?;
            if entry.ino() != ino || is_dot(entry.file_name()) {
                continue;
            }
            if !self.spend() {
                return Ok(true);
            }
            return match rustix::fs::unlinkat(parent, entry.file_name(), AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => Ok(true),
                Err(Errno::NOTEMPTY | Errno::EXIST | Errno::BUSY | Errno::PERM | Errno::ACCESS) => Ok(false),
                Err(e) => Err(e.into()),
            };
        }
        // Moved elsewhere in the tree meanwhile: the walk finds it again there.
        Ok(true)
    }
}

/// Unlinks the non-directory `name` of `dir`.
fn unlink(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[path = "trash_tests.rs"]
mod tests;
