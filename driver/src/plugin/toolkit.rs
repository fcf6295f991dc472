//! The NVIDIA Container Toolkit's own CDI specs (`nvidia.com/gpu`), when the node has them: the
//! toolkit's device for a card brings the driver libraries, so its ID is returned beside ours.

use std::path::{Path, PathBuf};

/// The kind the toolkit generates.
const TOOLKIT_KIND: &str = "nvidia.com/gpu";

/// Device names found in the toolkit's specs under `dirs`, re-read on each call (the toolkit can
/// regenerate them at any time). Unreadable files are skipped: they are not ours. Files whose
/// name starts with `own_prefix` (this driver's claim specs, one per prepared claim) are not
/// even opened, so the cost does not grow with the claims on the node.
pub fn toolkit_devices(dirs: &[PathBuf], own_prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(|n| n.starts_with(own_prefix) || n.starts_with('.')) {
                continue;
            }
            let path = entry.path();
            if let Some(v) = read_spec(&path)
                && v.get("kind").and_then(|k| k.as_str()) == Some(TOOLKIT_KIND)
            {
                let devices = v.get("devices").and_then(|d| d.as_array()).cloned().unwrap_or_default();
                names.extend(devices.iter().filter_map(|d| d.get("name").and_then(|n| n.as_str()).map(str::to_owned)));
            }
        }
    }
    names
}

fn read_spec(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
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
        let found = toolkit_devices(&[dir.path().to_path_buf(), dir.path().join("missing")], "k8s.x.io-claim_");
        assert_eq!(found.len(), 2);
        assert_eq!(toolkit_id(&found, "GPU-abc", 0).as_deref(), Some("nvidia.com/gpu=GPU-abc"));
        assert_eq!(toolkit_id(&found, "GPU-other", 0).as_deref(), Some("nvidia.com/gpu=0"));
        assert_eq!(toolkit_id(&found, "GPU-other", 5), None);
    }
}
