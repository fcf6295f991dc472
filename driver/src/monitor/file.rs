//! A claim's region file, opened and read as a hostile tenant's file (blocking calls only).
//!
//! The claim directory is writable by the container, so the name may hold anything: a link to a
//! host file, a FIFO, a device node, a sparse file of any size, another file swapped in between
//! two ticks. The rules:
//! - the directory is opened under the claims root with `O_NOFOLLOW`, the name within it with
//!   `O_PATH | O_NOFOLLOW`, which opens nothing (no FIFO blocks, no device acts); only a regular
//!   file with one link is then reopened for I/O through `/proc/self/fd`, which reaches the same
//!   inode whatever happened to the name since;
//! - the file is never mapped (a truncation would SIGBUS the daemon); it is read with `pread` of
//!   the few fields needed, and a short read is a bad region;
//! - writes are two `int`s in place, only into a file this driver created (owned by its user),
//!   never through a name.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use rustix::fs::{CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::monitor::region::{self, DeviceUsage, Region, RegionError, offset};

/// Why a region was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// No file yet, or an empty one: no CUDA process has started.
    #[error("no region yet")]
    NotYet,
    /// Not a regular file (a link, a FIFO, a device, a directory).
    #[error("{0} where a regular file belongs")]
    NotRegular(&'static str),
    /// A regular file with other names elsewhere.
    #[error("a file with {0} links")]
    Links(u64),
    /// The bytes are not a usable region.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// A system call failed.
    #[error("{op}: {errno}")]
    Io {
        /// The call.
        op: &'static str,
        /// Its error.
        errno: Errno,
    },
}

impl FileError {
    /// Whether a tenant or a fault is behind it (counted and logged), not a region yet to come.
    pub fn is_bad(&self) -> bool {
        !matches!(self, Self::NotYet | Self::Region(RegionError::Uninitialised(_)))
    }

    /// A short reason for the metric's label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotYet => "absent",
            Self::NotRegular(_) => "not_regular",
            Self::Links(_) => "links",
            Self::Region(e) => e.reason(),
            Self::Io { .. } => "io",
        }
    }
}

fn io(op: &'static str) -> impl FnOnce(Errno) -> FileError {
    move |errno| FileError::Io { op, errno }
}

/// An open region file.
#[derive(Debug)]
pub struct RegionFile {
    fd: OwnedFd,
    /// Created by this driver (owned by its user): the only kind written to.
    pub ours: bool,
}

fn dir_flags() -> OFlags {
    OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY
}

/// The claims' root, opened once for a tick's regions (the driver's own directory, which no
/// container can write).
#[derive(Debug)]
pub struct ClaimsRoot(OwnedFd);

impl ClaimsRoot {
    /// Opens `path`.
    ///
    /// # Errors
    /// The system call's error.
    pub fn open(path: &Path) -> Result<Self, Errno> {
        rustix::fs::openat(CWD, path, dir_flags(), Mode::empty()).map(Self)
    }

    /// Opens `<root>/<claim>/<name>`, where `claim` and `name` are single components.
    ///
    /// # Errors
    /// [`FileError`]: [`FileError::NotYet`] for no file or an empty one.
    pub fn open_region(&self, claim: &str, name: &str) -> Result<RegionFile, FileError> {
        open_in(&self.0, claim, name)
    }
}

/// [`ClaimsRoot::open_region`] of a root opened for one region (the tests').
#[cfg(test)]
fn open(claims_root: &Path, claim: &str, name: &str) -> Result<RegionFile, FileError> {
    ClaimsRoot::open(claims_root).map_err(io("open claims root"))?.open_region(claim, name)
}

fn open_in(root: &OwnedFd, claim: &str, name: &str) -> Result<RegionFile, FileError> {
    let dir = match rustix::fs::openat(root, claim, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(FileError::NotYet),
        Err(e) => return Err(io("open claim directory")(e)),
    };
    let path = match rustix::fs::openat(&dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(FileError::NotYet),
        Err(e) => return Err(io("open region")(e)),
    };
    let stat = rustix::fs::fstat(&path).map_err(io("stat region"))?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {}
        FileType::Symlink => return Err(FileError::NotRegular("a symbolic link")),
        FileType::Fifo => return Err(FileError::NotRegular("a FIFO")),
        FileType::Directory => return Err(FileError::NotRegular("a directory")),
        FileType::CharacterDevice | FileType::BlockDevice => return Err(FileError::NotRegular("a device node")),
        _ => return Err(FileError::NotRegular("a socket")),
    }
    #[allow(clippy::useless_conversion)] // st_nlink is u32 on some targets.
    let links = u64::from(stat.st_nlink);
    if links != 1 {
        return Err(FileError::Links(links));
    }
    if stat.st_size == 0 {
        return Err(FileError::NotYet);
    }
    // The O_PATH descriptor pins the inode: reopening it through procfs cannot reach another file.
    let proc = format!("/proc/self/fd/{}", path.as_raw_fd());
    let fd = rustix::fs::open(proc.as_str(), OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK, Mode::empty())
        .map_err(io("reopen region"))?;
    Ok(RegionFile { fd, ours: stat.st_uid == rustix::process::geteuid().as_raw() })
}

impl RegionFile {
    fn read_at(&self, buf: &mut [u8], at: usize) -> Result<(), FileError> {
        let mut done = 0;
        while done < buf.len() {
            let n = rustix::io::pread(self.fd.as_fd(), &mut buf[done..], (at + done) as u64).map_err(io("read region"))?;
            if n == 0 {
                return Err(RegionError::Short(at + done, at + buf.len()).into());
            }
            done += n;
        }
        Ok(())
    }

    /// Reads the header, the tail and the slots of the processes the tail counts: at most the
    /// region's size, whatever the file's size.
    ///
    /// # Errors
    /// [`FileError`] for a short read or a region that fails its checks.
    pub fn read(&self) -> Result<Region, FileError> {
        let mut head = vec![0u8; offset::HEAD_LEN];
        self.read_at(&mut head, 0)?;
        let head = region::parse_head(&head)?;
        let mut tail = [0u8; offset::TAIL_LEN];
        self.read_at(&mut tail, offset::PROC_NUM)?;
        let tail = region::parse_tail(&tail)?;
        let mut usage = vec![DeviceUsage::default(); head.device_num()];
        let mut slot = vec![0u8; offset::SLOT_SIZE];
        for p in 0..tail.proc_num {
            self.read_at(&mut slot, offset::PROCS + p * offset::SLOT_SIZE)?;
            region::add_slot(&slot, &mut usage)?;
        }
        Ok(region::assemble(head, tail, usage))
    }

    /// Writes one `int` field in place.
    ///
    /// # Errors
    /// [`FileError::Io`]; refused for a file this driver did not create.
    pub fn write_i32(&self, at: usize, value: i32) -> Result<(), FileError> {
        if !self.ours {
            return Err(FileError::Io { op: "write a region this driver did not create", errno: Errno::PERM });
        }
        debug_assert!(at == offset::RECENT_KERNEL || at == offset::UTILIZATION_SWITCH);
        let n = rustix::io::pwrite(self.fd.as_fd(), &value.to_ne_bytes(), at as u64).map_err(io("write region"))?;
        if n != 4 {
            return Err(FileError::Io { op: "write region", errno: Errno::IO });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::super::region::writer::{Process, region};
    use super::*;
    use crate::plugin::storage::host::create_region_file as create;

    fn claim_dir(root: &Path) -> std::path::PathBuf {
        let dir = root.join("uid-1");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_created_region_is_read_and_written_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = claim_dir(tmp.path());
        create(&dir, "GPU-a.cache").unwrap();
        let path = dir.join("GPU-a.cache");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o666);
        assert!(matches!(open(tmp.path(), "uid-1", "GPU-a.cache"), Err(FileError::NotYet)));
        // HAMi-core extends the file to the region and one byte more.
        let mut bytes = region(&["GPU-a"], &[4 << 30], &[Process { pid: 3, memory: 1 << 30, sm_util: 40 }]);
        bytes.push(0);
        std::fs::write(&path, &bytes).unwrap();
        let file = open(tmp.path(), "uid-1", "GPU-a.cache").unwrap();
        assert!(file.ours);
        let r = file.read().unwrap();
        assert_eq!((r.usage[0].total, r.usage[0].sm_util, r.recent_kernel), (1 << 30, 40, 2));
        file.write_i32(offset::RECENT_KERNEL, -1).unwrap();
        file.write_i32(offset::UTILIZATION_SWITCH, 0).unwrap();
        let after = std::fs::read(&path).unwrap();
        assert_eq!(after.len(), bytes.len());
        let changed: Vec<usize> = (0..after.len()).filter(|i| after[*i] != bytes[*i]).collect();
        assert!(changed.iter().all(|i| (offset::UTILIZATION_SWITCH..offset::RECENT_KERNEL + 4).contains(i)), "{changed:?}");
        let r = open(tmp.path(), "uid-1", "GPU-a.cache").unwrap().read().unwrap();
        assert_eq!((r.recent_kernel, r.utilization_switch), (-1, 0));
        // Creating again keeps what the containers wrote.
        create(&dir, "GPU-a.cache").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), after);
    }

    #[test]
    fn hostile_files_are_refused_and_nothing_else_is_touched() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = claim_dir(tmp.path());
        let host = tmp.path().join("host-file");
        let bytes = region(&["GPU-a"], &[1], &[]);
        std::fs::write(&host, &bytes).unwrap();
        std::os::unix::fs::symlink(&host, dir.join("link.cache")).unwrap();
        assert!(matches!(open(tmp.path(), "uid-1", "link.cache"), Err(FileError::NotRegular("a symbolic link"))));
        std::fs::hard_link(&host, dir.join("hard.cache")).unwrap();
        assert!(matches!(open(tmp.path(), "uid-1", "hard.cache"), Err(FileError::Links(2))));
        rustix::fs::mknodat(CWD, dir.join("fifo.cache"), FileType::Fifo, Mode::from_raw_mode(0o666), 0).unwrap();
        // A FIFO with no writer would block an ordinary open forever.
        assert!(matches!(open(tmp.path(), "uid-1", "fifo.cache"), Err(FileError::NotRegular("a FIFO"))));
        std::fs::create_dir(dir.join("dir.cache")).unwrap();
        assert!(matches!(open(tmp.path(), "uid-1", "dir.cache"), Err(FileError::NotRegular(_))));
        // A truncated region: a short read, never a crash.
        std::fs::write(dir.join("short.cache"), &bytes[..offset::HEAD_LEN + 10]).unwrap();
        let e = open(tmp.path(), "uid-1", "short.cache").unwrap().read().unwrap_err();
        assert!(e.is_bad() && e.reason() == "truncated", "{e}");
        // A sparse 10 GiB file is read no further than the region.
        let sparse = std::fs::File::create(dir.join("sparse.cache")).unwrap();
        sparse.set_len(10 << 30).unwrap();
        let e = open(tmp.path(), "uid-1", "sparse.cache").unwrap().read().unwrap_err();
        assert!(!e.is_bad(), "an all-zero region is one not initialised yet: {e}");
        // The claim directory itself replaced by a link.
        std::os::unix::fs::symlink(&dir, tmp.path().join("uid-2")).unwrap();
        assert!(open(tmp.path(), "uid-2", "link.cache").is_err());
        assert_eq!(std::fs::read(&host).unwrap(), bytes, "the host file changed");
    }

    #[test]
    fn a_file_someone_else_created_is_read_but_never_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = claim_dir(tmp.path());
        let path = dir.join("GPU-a.cache");
        std::fs::write(&path, region(&["GPU-a"], &[1], &[])).unwrap();
        let mut file = open(tmp.path(), "uid-1", "GPU-a.cache").unwrap();
        file.ours = false;
        assert!(file.read().is_ok());
        assert!(file.write_i32(offset::RECENT_KERNEL, -1).is_err());
        assert_eq!(file.read().unwrap().recent_kernel, 2);
    }
}
