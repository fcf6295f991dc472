//! Reading files from directories that anyone on the node may have written into: a FIFO, a
//! device node, a directory or a dangling link where a spec or record should be must never block
//! or crash the reader, and a huge file must not be read whole.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What a directory entry is, by its own metadata (links are not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file: the only kind read.
    Regular,
    /// Anything else (directory, link, FIFO, socket, device), with a word for the log.
    Other(&'static str),
}

/// The kind of `path` without following a link.
///
/// # Errors
/// The `lstat` error.
pub fn entry_kind(path: &Path) -> io::Result<EntryKind> {
    use std::os::unix::fs::FileTypeExt;
    let t = fs::symlink_metadata(path)?.file_type();
    Ok(if t.is_file() {
        EntryKind::Regular
    } else if t.is_dir() {
        EntryKind::Other("directory")
    } else if t.is_symlink() {
        EntryKind::Other("symbolic link")
    } else if t.is_fifo() {
        EntryKind::Other("FIFO")
    } else if t.is_socket() {
        EntryKind::Other("socket")
    } else {
        EntryKind::Other("device node")
    })
}

/// Whether `path` still names the open `file` (same device and inode, the link itself not
/// followed): false once someone removed or replaced it, when a rename of it would move nothing
/// or another file.
pub fn names_open_file(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::symlink_metadata(path), file.metadata()) {
        (Ok(named), Ok(open)) => named.dev() == open.dev() && named.ino() == open.ino(),
        _ => false,
    }
}

/// Reads `path` if it is a regular file of at most `max` bytes; `Ok(None)` when it does not
/// exist. It is opened without following a link and without blocking (a FIFO swapped in after a
/// directory listing cannot hang the caller), and checked on the open descriptor.
///
/// # Errors
/// `InvalidData` naming what the entry is when it is not a regular file or is larger than `max`;
/// other I/O errors as they come.
pub fn read_regular(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: the last component is a link, which we never follow.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a symbolic link, not a regular file"));
        }
        Err(e) => return Err(e),
    };
    read_open(&file, max).map(Some)
}

fn read_open(file: &File, max: u64) -> io::Result<Vec<u8>> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    if meta.len() > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} bytes, more than the {max} allowed", meta.len())));
    }
    let mut body = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // The file may grow after the check: never read past the bound.
    file.take(max + 1).read_to_end(&mut body)?;
    if body.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("more than the {max} bytes allowed")));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        fs::write(p.join("ok"), b"{}").unwrap();
        fs::write(p.join("big"), vec![b'x'; 100]).unwrap();
        fs::create_dir(p.join("dir")).unwrap();
        std::os::unix::fs::symlink(p.join("missing"), p.join("dangling")).unwrap();
        std::os::unix::fs::symlink(p.join("ok"), p.join("link")).unwrap();
        let fifo = std::process::Command::new("mkfifo").arg(p.join("fifo")).status().unwrap();
        assert!(fifo.success());

        assert_eq!(read_regular(&p.join("ok"), 10).unwrap().unwrap(), b"{}");
        assert_eq!(read_regular(&p.join("absent"), 10).unwrap(), None);
        for bad in ["big", "dir", "dangling", "link", "fifo"] {
            let err = read_regular(&p.join(bad), 10).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{bad}: {err}");
        }
        assert_eq!(entry_kind(&p.join("ok")).unwrap(), EntryKind::Regular);
        assert_eq!(entry_kind(&p.join("fifo")).unwrap(), EntryKind::Other("FIFO"));
        assert_eq!(entry_kind(&p.join("dangling")).unwrap(), EntryKind::Other("symbolic link"));
        assert_eq!(entry_kind(&p.join("dir")).unwrap(), EntryKind::Other("directory"));
    }
}
