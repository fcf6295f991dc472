//! The host files and directories containers of prepared claims read and write: HAMi-core's
//! `ld.so.preload`, the per-claim directories (its shared-cache file) and its lock directory.
//! Their modes are part of enforcement: the container's user is whatever the pod says, so a
//! preload file only root can read, or a directory only root can write, silently turns the
//! limits off for every non-root container.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::plugin::cdi::CdiOptions;

/// `ld.so.preload`: read by the dynamic loader of every process in the container, as its user.
pub const PRELOAD_MODE: u32 = 0o644;
/// A claim's directory: HAMi-core creates its cache file there as the container's user.
pub const CLAIM_DIR_MODE: u32 = 0o777;
/// The lock directory, shared by every container of the node: writable by all, and sticky so no
/// user removes another's lock (as `/tmp`).
pub const LOCK_DIR_MODE: u32 = 0o1777;
/// The parent of the claim directories: only traversed by containers.
pub const CLAIMS_ROOT_MODE: u32 = 0o755;
/// A claim's HAMi-core region file: every process of its containers opens it `O_RDWR`, as
/// whatever user it runs as, and exits if it cannot.
pub const REGION_FILE_MODE: u32 = 0o666;

/// Failures preparing the host side, each naming the path.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A directory could not be created or given its mode.
    #[error("preparing directory {path}")]
    Dir {
        /// The directory.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A claim's region file could not be created.
    #[error("creating {path}")]
    Region {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The preload file could not be written or given its mode.
    #[error("preparing {path}")]
    Preload {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Creates `path` (and its parents) and sets `mode` on it explicitly: `create_dir_all` applies
/// the process umask, and an existing directory keeps whatever mode it had.
///
/// # Errors
/// [`HostError::Dir`].
pub fn ensure_dir(path: &Path, mode: u32) -> Result<(), HostError> {
    let err = |source| HostError::Dir { path: path.to_owned(), source };
    std::fs::create_dir_all(path).map_err(err)?;
    let meta = std::fs::symlink_metadata(path).map_err(err)?;
    if !meta.is_dir() {
        return Err(err(io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a directory")));
    }
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    }
    Ok(())
}

/// Makes a prepared claim's directory with its mode, and in it the empty region file named
/// `region` (see [`create_region_file`]).
///
/// # Errors
/// [`HostError`] naming the path.
pub fn ensure_claim_dir(dir: &Path, region: Option<&str>) -> Result<(), HostError> {
    ensure_dir(dir, CLAIM_DIR_MODE)?;
    if let Some(name) = region {
        create_region_file(dir, name).map_err(|source| HostError::Region { path: dir.join(name), source })?;
    }
    Ok(())
}

/// Creates the empty region file that a claim's containers initialise (HAMi-core extends and
/// fills an existing file as it would a new one), with [`REGION_FILE_MODE`] whatever the umask.
/// The driver makes it so that the node monitor writes only into a file of its own: a file the
/// tenant put in its place is owned by another user, or is no regular file. An existing entry,
/// whatever it is, is left alone and never followed.
///
/// # Errors
/// When the directory cannot be opened or the file created.
pub fn create_region_file(dir: &Path, name: &str) -> io::Result<()> {
    use rustix::fs::{CWD, Mode, OFlags};
    let dir_fd = rustix::fs::openat(CWD, dir, OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    let flags = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(&dir_fd, name, flags, Mode::from_raw_mode(REGION_FILE_MODE)) {
        Ok(fd) => Ok(rustix::fs::fchmod(&fd, Mode::from_raw_mode(REGION_FILE_MODE))?),
        Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Prepares the node once at start: the lock and claims directories with their modes, and the
/// `ld.so.preload` that names the library. A missing preload is written atomically; an existing
/// one is never replaced under running containers, but a wrong mode is corrected (an earlier
/// version wrote it 0600).
///
/// # Errors
/// [`HostError`] naming the path.
pub fn prepare(cdi: &CdiOptions) -> Result<(), HostError> {
    ensure_dir(&cdi.lock_dir, LOCK_DIR_MODE)?;
    ensure_dir(&cdi.claims_root, CLAIMS_ROOT_MODE)?;
    let preload_err = |source| HostError::Preload { path: cdi.preload.clone(), source };
    match std::fs::metadata(&cdi.preload) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o7777;
            if mode != PRELOAD_MODE {
                tracing::warn!(path = %cdi.preload.display(), mode = format!("{mode:o}"), "ld.so.preload had a mode non-root containers cannot read; setting 0644");
                std::fs::set_permissions(&cdi.preload, std::fs::Permissions::from_mode(PRELOAD_MODE)).map_err(preload_err)?;
            }
            let named = std::fs::read_to_string(&cdi.preload).map_err(preload_err)?;
            if named.trim() != cdi.libvgpu.display().to_string() {
                tracing::warn!(path = %cdi.preload.display(), names = %named.trim(), expected = %cdi.libvgpu.display(), "ld.so.preload names another library; left as it is");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let body = format!("{}\n", cdi.libvgpu.display());
            crate::fsutil::write_atomically(&cdi.preload, body.as_bytes(), PRELOAD_MODE).map_err(preload_err)?;
        }
        Err(e) => return Err(preload_err(e)),
    }
    if std::fs::metadata(&cdi.libvgpu).is_err() {
        tracing::warn!(path = %cdi.libvgpu.display(), "HAMi-core library not found; containers of prepared claims cannot start until it is installed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(root: &Path) -> CdiOptions {
        let driver = vgpu_scheduling::DriverName::new("hami-core-gpu.project-hami.io").unwrap();
        CdiOptions { lock_dir: root.join("lock"), ..CdiOptions::for_driver(&driver, &root.join("vgpu")).unwrap() }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn every_container_user_can_read_the_preload_and_write_its_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let cdi = options(tmp.path());
        prepare(&cdi).unwrap();
        assert_eq!(mode(&cdi.preload), 0o644);
        assert_eq!(std::fs::read_to_string(&cdi.preload).unwrap(), format!("{}\n", cdi.libvgpu.display()));
        assert_eq!(mode(&cdi.lock_dir), 0o1777);
        assert_eq!(mode(&cdi.claims_root), 0o755);
        let claim = cdi.claims_root.join("u1");
        ensure_dir(&claim, CLAIM_DIR_MODE).unwrap();
        assert_eq!(mode(&claim), 0o777);
    }

    #[test]
    fn an_existing_preload_keeps_its_content_and_gets_the_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let cdi = options(tmp.path());
        std::fs::create_dir_all(cdi.preload.parent().unwrap()).unwrap();
        std::fs::write(&cdi.preload, "/opt/other/libvgpu.so\n").unwrap();
        std::fs::set_permissions(&cdi.preload, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::create_dir_all(&cdi.lock_dir).unwrap();
        std::fs::set_permissions(&cdi.lock_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare(&cdi).unwrap();
        assert_eq!(mode(&cdi.preload), 0o644);
        assert_eq!(std::fs::read_to_string(&cdi.preload).unwrap(), "/opt/other/libvgpu.so\n");
        assert_eq!(mode(&cdi.lock_dir), 0o1777);
    }

    #[test]
    fn a_file_where_a_directory_belongs_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), "").unwrap();
        let err = ensure_dir(&tmp.path().join("f"), 0o777).unwrap_err();
        assert!(err.to_string().contains("/f"), "{err}");
    }
}
