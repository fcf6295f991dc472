//! The NVIDIA driver's MIG capability files: which `/dev/nvidia-caps/nvidia-cap<M>` node opens
//! a GPU instance or a compute instance. A container needs both nodes of its instance (NVIDIA's
//! MIG user guide, "Device Nodes and Capabilities"); the driver writes their minors under
//! `/proc/driver/nvidia/capabilities` when the instance is made.

use std::path::Path;

/// The minor of the `/dev/nvidia-caps/nvidia-cap*` node of GPU instance `gi` (or of its compute
/// instance `ci`) on the card with minor `gpu_minor`: the `DeviceFileMinor:` line of
/// `<root>/gpu<minor>/mig/gi<gi>[/ci<ci>]/access`, `root` being `/proc/driver/nvidia/capabilities`.
///
/// # Errors
/// The file cannot be read or has no such line.
pub fn caps_minor(root: &Path, gpu_minor: u32, gi: u32, ci: Option<u32>) -> std::io::Result<u32> {
    let mut path = root.join(format!("gpu{gpu_minor}/mig/gi{gi}"));
    if let Some(ci) = ci {
        path.push(format!("ci{ci}"));
    }
    path.push("access");
    let text = std::fs::read_to_string(&path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    parse_caps_minor(&text).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: no DeviceFileMinor line", path.display()))
    })
}

fn parse_caps_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor:")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_minors_are_read_from_the_access_files() {
        assert_eq!(parse_caps_minor("DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n"), Some(12));
        assert_eq!(parse_caps_minor("DeviceFileMode: 292\n"), None);
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("gpu2/mig/gi5/ci0")).unwrap();
        std::fs::write(root.path().join("gpu2/mig/gi5/access"), "DeviceFileMinor: 48\n").unwrap();
        std::fs::write(root.path().join("gpu2/mig/gi5/ci0/access"), "DeviceFileMinor:49\n").unwrap();
        assert_eq!(caps_minor(root.path(), 2, 5, None).unwrap(), 48);
        assert_eq!(caps_minor(root.path(), 2, 5, Some(0)).unwrap(), 49);
        assert_eq!(caps_minor(root.path(), 2, 6, None).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }
}
