//! The NVIDIA Container Toolkit's own CDI specs (`nvidia.com/gpu`), when the node has them: the
//! toolkit's device for a card brings the driver libraries, so its ID is returned beside ours.

use std::path::{Path, PathBuf};

/// The kind the toolkit generates.
const TOOLKIT_KIND: &str = "nvidia.com/gpu";

/// The toolkit's specs are tens of KiB; a file past this is not one of them and is not read.
const MAX_TOOLKIT_SPEC_BYTES: u64 = 4 << 20;

/// Identity of a file's content as far as metadata tells: a rewrite changes one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    inode: u64,
    size: u64,
    modified_ns: i128,
}

/// The toolkit's device names under a set of directories, re-read only for files whose metadata
/// changed: a prepare costs one directory listing and a `stat` per file, never a parse of a file
/// it has seen. Non-regular files (FIFOs, links, directories) and oversized files are skipped
/// without being opened for reading, so nothing in those directories can block or bloat a
/// prepare. Scans run off the plugin's state lock, on a blocking thread.
#[derive(Debug, Default)]
pub struct ToolkitIndex {
    files: std::sync::Mutex<std::collections::HashMap<PathBuf, (FileKey, Vec<String>)>>,
}

impl ToolkitIndex {
    /// Device names in the toolkit's specs under `dirs`, now. Files whose name starts with
    /// `own_prefix` (this driver's claim specs) are not even looked at.
    pub fn devices(&self, dirs: &[PathBuf], own_prefix: &str) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let Ok(mut files) = self.files.lock() else { return Vec::new() };
        let mut seen = std::collections::HashSet::new();
        let mut names = Vec::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                if entry.file_name().to_str().is_none_or(|n| n.starts_with(own_prefix) || n.starts_with('.')) {
                    continue;
                }
                let path = entry.path();
                // lstat: a link or a FIFO is never followed or opened.
                let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
                if !meta.file_type().is_file() || meta.len() > MAX_TOOLKIT_SPEC_BYTES {
                    continue;
                }
                let key = FileKey {
                    inode: meta.ino(),
                    size: meta.len(),
                    modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                };
                seen.insert(path.clone());
                match files.get(&path) {
                    Some((k, devices)) if *k == key => names.extend(devices.iter().cloned()),
                    _ => {
                        let devices = read_spec(&path).map(|v| toolkit_names(&v)).unwrap_or_default();
                        names.extend(devices.iter().cloned());
                        files.insert(path, (key, devices));
                    }
                }
            }
        }
        files.retain(|p, _| seen.contains(p));
        names
    }
}

fn toolkit_names(v: &serde_json::Value) -> Vec<String> {
    if v.get("kind").and_then(|k| k.as_str()) != Some(TOOLKIT_KIND) {
        return Vec::new();
    }
    let devices = v.get("devices").and_then(|d| d.as_array()).cloned().unwrap_or_default();
    devices.iter().filter_map(|d| d.get("name").and_then(|n| n.as_str()).map(str::to_owned)).collect()
}

fn read_spec(path: &Path) -> Option<serde_json::Value> {
    let bytes = cdi_spec::file::read_regular(path, MAX_TOOLKIT_SPEC_BYTES).ok()??;
    let text = String::from_utf8(bytes).ok()?;
    match path.extension()?.to_str()? {
        "json" => serde_json::from_str(&text).ok(),
        "yaml" | "yml" => serde_saphyr::from_str(&text).ok(),
        _ => None,
    }
}

/// The toolkit's ID for a card, preferring its UUID name over its index name.
pub fn toolkit_id(available: &[String], uuid: &str, index: u32) -> Option<String> {
    let index = index.to_string();
    [uuid, index.as_str()].iter().find(|n| available.iter().any(|a| a == *n)).map(|n| format!("{TOOLKIT_KIND}={n}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_toolkit_devices_by_uuid_or_index() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n- name: GPU-abc\n  containerEdits: {}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("other.json"), r#"{"kind":"vendor.com/x","devices":[{"name":"GPU-zzz"}]}"#).unwrap();
        std::fs::write(dir.path().join("broken.json"), "{").unwrap();
        // Our own claim specs are skipped unread, even one that looks like the toolkit's.
        std::fs::write(dir.path().join("k8s.x.io-claim_u1.json"), r#"{"kind":"nvidia.com/gpu","devices":[{"name":"GPU-own"}]}"#)
            .unwrap();
        let found = ToolkitIndex::default().devices(&[dir.path().to_path_buf(), dir.path().join("missing")], "k8s.x.io-claim_");
        assert_eq!(found.len(), 2);
        assert_eq!(toolkit_id(&found, "GPU-abc", 0).as_deref(), Some("nvidia.com/gpu=GPU-abc"));
        assert_eq!(toolkit_id(&found, "GPU-other", 0).as_deref(), Some("nvidia.com/gpu=0"));
        assert_eq!(toolkit_id(&found, "GPU-other", 5), None);
    }

    #[test]
    fn fifos_links_and_huge_files_are_skipped_and_unchanged_files_not_reparsed() {
        let dir = tempfile::tempdir().unwrap();
        let spec = |name: &str| {
            format!("{{\"cdiVersion\":\"0.5.0\",\"kind\":\"nvidia.com/gpu\",\"devices\":[{{\"name\":\"{name}\"}}]}}")
        };
        std::fs::write(dir.path().join("a.json"), spec("GPU-a")).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(dir.path().join("fifo.json")).status().unwrap().success());
        std::os::unix::fs::symlink(dir.path().join("a.json"), dir.path().join("link.json")).unwrap();
        let huge = std::fs::File::create(dir.path().join("huge.json")).unwrap();
        huge.set_len(MAX_TOOLKIT_SPEC_BYTES + 1).unwrap();
        let index = ToolkitIndex::default();
        let dirs = [dir.path().to_path_buf()];
        assert_eq!(index.devices(&dirs, "own_"), ["GPU-a"]);
        // A second look reuses the parse; a rewrite (new size) is seen.
        assert_eq!(index.devices(&dirs, "own_"), ["GPU-a"]);
        std::fs::write(dir.path().join("a.json"), spec("GPU-abc")).unwrap();
        assert_eq!(index.devices(&dirs, "own_"), ["GPU-abc"]);
        std::fs::remove_file(dir.path().join("a.json")).unwrap();
        assert!(index.devices(&dirs, "own_").is_empty());
    }
}
