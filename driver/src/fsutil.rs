//! Durable file replacement for the driver's own files (checkpoint, ld.so.preload); CDI specs
//! have their own staged variant in `cdi-spec`.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Writes `body` to `path` so readers see the old file or the new one, never a mix, and the new
/// one survives a crash: temp file in the same directory, fsync, rename, directory fsync.
///
/// # Errors
/// The I/O error of the step that failed; the previous file is then unchanged.
pub fn write_atomically(path: &Path, body: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(".vgpu-dra-tmp-").tempfile_in(dir)?;
    tmp.write_all(body)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}
