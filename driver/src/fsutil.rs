//! Durable file replacement for the driver's own files (checkpoint, ld.so.preload); CDI specs
//! have their own staged variant in `cdi-spec`.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// The name prefix of a temp file that [`write_atomically`] has not renamed yet.
pub const TEMP_PREFIX: &str = ".vgpu-dra-tmp-";

/// Writes `body` to `path` so readers see the old file or the new one, never a mix, and the new
/// one survives a crash: temp file in the same directory, fsync, rename, directory fsync.
///
/// # Errors
/// The I/O error of the step that failed; the previous file is then unchanged.
pub fn write_atomically(path: &Path, body: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(TEMP_PREFIX).tempfile_in(dir)?;
    tmp.write_all(body)?;
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
