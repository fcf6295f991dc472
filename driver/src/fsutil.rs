//! Durable file replacement for the driver's own files (checkpoint, ld.so.preload); CDI specs
//! have their own staged variant in `cdi-spec`.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// The name prefix of a temp file that [`write_atomically`] has not renamed yet.
pub const TEMP_PREFIX: &str = ".vgpu-dra-tmp-";

/// Writes `body` to `path` with permission bits `mode` so readers see the old file or the new
/// one, never a mix, and the new one survives a crash: temp file in the same directory, mode
/// set, fsync, rename, directory fsync. The mode is set explicitly because the temp file is
/// created 0600: a host file that containers read (`ld.so.preload`) must say 0644, or every
/// container not running as root would silently run without HAMi-core.
///
/// # Errors
/// The I/O error of the step that failed; the previous file is then unchanged.
pub fn write_atomically(path: &Path, body: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(TEMP_PREFIX).tempfile_in(dir)?;
    tmp.write_all(body)?;
    tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}

/// Removes `path` so the removal survives a crash (directory fsync); a missing file is fine.
///
/// # Errors
/// The I/O error of the removal or the fsync.
pub fn remove_durably(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => File::open(path.parent().unwrap_or(Path::new("/")))?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

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
