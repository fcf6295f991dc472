//! The NVIDIA Container Toolkit's own CDI specs (`nvidia.com/gpu`), when the node has them: the
//! toolkit's device for a card brings the driver libraries, so its ID is returned beside ours.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

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
/// changed, and each directory listed again only when something other than this driver's own
/// specs changed in it. The CDI directory holds one spec of ours per prepared claim, and the
/// index is asked on every prepare: listing it each time made a prepare cost O(claims) in CPU
/// and in short-lived allocations. An inotify watch per directory says when a listing is stale;
/// where there is none (inotify unavailable, a directory missing, the queue overflowed) the
/// directory is listed every time, as before. Non-regular files (FIFOs, links, directories) and
/// oversized files are skipped without being opened for reading, so nothing in those directories
/// can block or bloat a prepare. Scans run off the plugin's state lock, on a blocking thread.
#[derive(Debug, Default)]
pub struct ToolkitIndex {
    state: std::sync::Mutex<IndexState>,
}

#[derive(Debug, Default)]
struct IndexState {
    /// Every file looked at, with the names it held.
    files: HashMap<PathBuf, (FileKey, Vec<String>)>,
    /// Per directory: its files as last listed, while that listing is known to be current.
    listed: HashMap<PathBuf, Vec<PathBuf>>,
    /// The inotify instance; `None` before the first use or when it cannot be had.
    inotify: Option<Inotify>,
    /// Whether creating the inotify instance was tried.
    inotify_tried: bool,
    /// Watched directories by watch.
    watched: HashMap<WatchDescriptor, PathBuf>,
    /// How many directory listings were made (for tests).
    listings: u64,
}

/// Changes in a directory that can make its listing stale. A rewrite in place shows as
/// `MODIFY`/`CLOSE_WRITE`, a rename as `MOVED_*`; the directory's own removal or move ends the watch.
fn watch_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

impl ToolkitIndex {
    /// Device names in the toolkit's specs under `dirs`, now. Files whose name starts with
    /// `own_prefix` (this driver's claim specs) are not even looked at.
    pub fn devices(&self, dirs: &[PathBuf], own_prefix: &str) -> Vec<String> {
        let Ok(mut state) = self.state.lock() else { return Vec::new() };
        state.forget_stale(own_prefix);
        let mut names = Vec::new();
        let mut seen = HashSet::new();
        for dir in dirs {
            let paths = match state.listed.get(dir) {
                Some(paths) => paths.clone(),
                None => {
                    let watched = state.watch(dir);
                    let paths = list(dir, own_prefix);
                    state.listings += 1;
                    if watched {
                        state.listed.insert(dir.clone(), paths.clone());
                    }
                    paths
                }
            };
            for path in paths {
                names.extend(state.names_in(&path));
                seen.insert(path);
            }
        }
        state.files.retain(|p, _| seen.contains(p));
        names
    }

    /// How many directory listings were made so far.
    #[cfg(test)]
    fn listings(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.listings)
    }
}

impl IndexState {
    /// Drops the listings that the events since the last call made stale (all of them when
    /// events were lost).
    fn forget_stale(&mut self, own_prefix: &str) {
        let Some(inotify) = self.inotify.as_mut() else { return };
        let mut buffer = [0u8; 4096];
        loop {
            let events = match inotify.read_events(&mut buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "reading inotify events for the toolkit's CDI specs; listing every time");
                    self.inotify = None;
                    self.watched.clear();
                    self.listed.clear();
                    return;
                }
            };
            for event in events {
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    self.listed.clear();
                    continue;
                }
                let Some(dir) = self.watched.get(&event.wd).cloned() else { continue };
                if event.mask.intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF) {
                    self.watched.remove(&event.wd);
                    self.listed.remove(&dir);
                    continue;
                }
                let ours = event.name.and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.') || n.starts_with(own_prefix));
                if !ours {
                    self.listed.remove(&dir);
                }
            }
        }
    }

    /// Watches `dir` if it is not watched yet; whether it is watched now.
    fn watch(&mut self, dir: &Path) -> bool {
        if self.watched.values().any(|d| d == dir) {
            return true;
        }
        if !self.inotify_tried {
            self.inotify_tried = true;
            match Inotify::init() {
                Ok(inotify) => self.inotify = Some(inotify),
                Err(e) => tracing::warn!(error = %e, "no inotify for the toolkit's CDI specs; listing them on every prepare"),
            }
        }
        let Some(inotify) = self.inotify.as_ref() else { return false };
        match inotify.watches().add(dir, watch_mask()) {
            Ok(wd) => {
                self.watched.insert(wd, dir.to_owned());
                true
            }
            // A directory that does not exist (yet) is listed each time, which costs little.
            Err(_) => false,
        }
    }

    /// The toolkit's device names in the file at `path`, parsed again only when it changed.
    fn names_in(&mut self, path: &Path) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        // lstat: a link or a FIFO is never followed or opened.
        let Ok(meta) = std::fs::symlink_metadata(path) else { return Vec::new() };
        if !meta.file_type().is_file() || meta.len() > MAX_TOOLKIT_SPEC_BYTES {
            return Vec::new();
        }
        let key = FileKey {
            inode: meta.ino(),
            size: meta.len(),
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        };
        match self.files.get(path) {
            Some((k, devices)) if *k == key => devices.clone(),
            _ => {
                let devices = read_spec(path).map(|v| toolkit_names(&v)).unwrap_or_default();
                self.files.insert(path.to_owned(), (key, devices.clone()));
                devices
            }
        }
    }
}

/// The entries of `dir` that may be the toolkit's specs: neither hidden nor ours.
fn list(dir: &Path, own_prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| !n.starts_with(own_prefix) && !n.starts_with('.')))
        .map(|e| e.path())
        .collect()
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

    #[test]
    fn a_directory_is_listed_again_only_when_something_not_ours_changed_in_it() {
        let root = tempfile::tempdir().unwrap();
        let (cdi, etc) = (root.path().join("cdi"), root.path().join("etc"));
        std::fs::create_dir(&cdi).unwrap();
        let index = ToolkitIndex::default();
        let dirs = [cdi.clone(), etc.clone()];
        let spec = |name: &str| format!("{{\"kind\":\"nvidia.com/gpu\",\"devices\":[{{\"name\":\"{name}\"}}]}}");
        assert!(index.devices(&dirs, "own_").is_empty());
        let first = index.listings();
        assert_eq!(first, 2);
        // Our own specs come and go (through hidden temp files): no listing of `cdi`; `etc`, which
        // does not exist, costs a failed open each time.
        for i in 0..20 {
            let tmp = cdi.join(format!(".tmp-{i}"));
            std::fs::write(&tmp, spec("GPU-own")).unwrap();
            std::fs::rename(&tmp, cdi.join(format!("own_{i}.json"))).unwrap();
            assert!(index.devices(&dirs, "own_").is_empty());
            std::fs::remove_file(cdi.join(format!("own_{i}.json"))).unwrap();
        }
        assert_eq!(index.listings(), first + 20, "only the missing directory was listed");
        // The toolkit's spec appears, is rewritten in place, and goes: each is seen at once.
        std::fs::write(cdi.join("nvidia.json"), spec("GPU-a")).unwrap();
        assert_eq!(index.devices(&dirs, "own_"), ["GPU-a"]);
        std::fs::write(cdi.join("nvidia.json"), spec("GPU-b")).unwrap();
        assert_eq!(index.devices(&dirs, "own_"), ["GPU-b"]);
        std::fs::remove_file(cdi.join("nvidia.json")).unwrap();
        assert!(index.devices(&dirs, "own_").is_empty());
        // A directory that appears later is found, and one removed and made again is watched anew.
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("nvidia.yaml"), "kind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n").unwrap();
        assert_eq!(index.devices(&dirs, "own_"), ["0"]);
        std::fs::remove_dir_all(&cdi).unwrap();
        assert_eq!(index.devices(&dirs, "own_"), ["0"]);
        std::fs::create_dir(&cdi).unwrap();
        std::fs::write(cdi.join("nvidia.json"), spec("GPU-c")).unwrap();
        assert_eq!(index.devices(&dirs, "own_"), ["GPU-c", "0"]);
    }
}
