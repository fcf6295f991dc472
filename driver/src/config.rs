//! The sharing configuration: defaults, then the config file, then flags, then the node's
//! override from the file. Invalid values are refused at start with the key and the reason.
//!
//! The file is either vgpu-dra's own form or HAMi's `device-config.yaml` (HAMi's chart or
//! volcano-vgpu-device-plugin's); [`vgpu_scheduling::DeviceConfig`] reads both, and the same
//! precedence applies to the settings either form gives.

use std::path::Path;

use vgpu_scheduling::{ConfigError, DeviceConfig, DriverName, Inventory, Ratio, SharingConfig};

/// Values given on the command line, which win over the file.
#[derive(Debug, Clone, Default)]
pub struct ConfigFlags {
    /// `--driver-name`.
    pub driver_name: Option<String>,
    /// `--device-split-count`.
    pub device_split_count: Option<u32>,
    /// `--device-memory-scaling`.
    pub device_memory_scaling: Option<String>,
    /// `--device-core-scaling`.
    pub device_core_scaling: Option<String>,
    /// `--filter-uuid`.
    pub filter_uuids: Vec<String>,
    /// `--filter-index`.
    pub filter_indices: Vec<u32>,
}

/// The configuration for one node, and what the file said beyond sharing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The sharing settings that apply to the node.
    pub sharing: SharingConfig,
    /// The file as read (the defaults when there is none): HAMi's request settings for a
    /// webhook, MIG geometries, and the keys that have no effect.
    pub file: DeviceConfig,
}

/// Resolves the configuration that applies to `node`, logging the file's ignored keys once.
///
/// # Errors
/// [`ConfigError`] naming the key (file errors as `--config` with file, line and key path;
/// flags as `--flag`).
pub fn resolve(file: Option<&Path>, flags: &ConfigFlags, node: &str) -> Result<SharingConfig, ConfigError> {
    let resolved = resolve_all(file, flags, node)?;
    resolved.log_ignored();
    Ok(resolved.sharing)
}

/// [`resolve`] without logging, keeping the whole file for callers that need more than sharing.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_all(file: Option<&Path>, flags: &ConfigFlags, node: &str) -> Result<Resolved, ConfigError> {
    let parsed = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError { key: "--config", reason: format!("{}: {e}", path.display()) })?;
            DeviceConfig::parse(&path.display().to_string(), &text)
                .map_err(|e| ConfigError { key: "--config", reason: e.to_string() })?
        }
        None => DeviceConfig::default(),
    };
    let mut config = SharingConfig::default();
    if let Some(name) = &flags.driver_name {
        config.driver_name =
            DriverName::new(name.clone()).map_err(|e| ConfigError { key: "--driver-name", reason: e.to_string() })?;
    } else if let Some(name) = &parsed.driver_name {
        config.driver_name = name.clone();
    }
    if let Some(n) = flags.device_split_count.or(parsed.device_split_count) {
        config.device_split_count = n;
    }
    match (&flags.device_memory_scaling, parsed.memory_scaling) {
        (Some(v), _) => config.memory_scaling = Ratio::parse("--device-memory-scaling", v)?,
        (None, Some(r)) => config.memory_scaling = r,
        _ => {}
    }
    match (&flags.device_core_scaling, parsed.core_scaling) {
        (Some(v), _) => config.core_scaling = Ratio::parse("--device-core-scaling", v)?,
        (None, Some(r)) => config.core_scaling = r,
        _ => {}
    }
    if let Some(f) = &parsed.filter {
        config.filter = f.clone();
    }
    if !flags.filter_uuids.is_empty() || !flags.filter_indices.is_empty() {
        config.filter =
            vgpu_scheduling::DeviceFilter { uuids: flags.filter_uuids.clone(), indices: flags.filter_indices.clone() };
    }
    let sharing = config.for_node(&parsed.node_overrides, node)?;
    Ok(Resolved { sharing, file: parsed })
}

impl Resolved {
    /// Logs, in one line, the file's keys that have no effect here and why.
    pub fn log_ignored(&self) {
        if self.file.ignored.is_empty() {
            return;
        }
        let keys: Vec<String> = self.file.ignored.iter().map(|i| format!("{} ({})", i.key, i.why)).collect();
        tracing::warn!(form = ?self.file.form, ignored = %keys.join("; "), "device config keys with no effect in vgpu-dra");
    }

    /// Logs which models of the file's MIG geometries are on this node (they are kept for MIG
    /// profiles; the driver publishes the instances NVML reports).
    pub fn log_mig(&self, inventory: &Inventory) {
        if self.file.mig.is_empty() {
            return;
        }
        let present = self.file.mig_models_present(inventory);
        if present.is_empty() {
            tracing::info!(
                models = self.file.mig.iter().map(|m| m.models.len()).sum::<usize>(),
                "no model of the device config's MIG geometries is on this node"
            );
        } else {
            tracing::info!(models = %present.join(", "), "device config lists MIG geometries for models on this node");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn file_then_flags_then_node_override() {
        let f = file(
            "deviceSplitCount: 5\ndeviceMemoryScaling: 1.5\nfilterDevices:\n  index: [3]\nnodeConfig:\n- name: gpu-big\n  deviceSplitCount: 20\n",
        );
        let c = resolve(Some(f.path()), &ConfigFlags::default(), "gpu-small").unwrap();
        assert_eq!((c.device_split_count, c.memory_scaling.to_string(), c.filter.indices.clone()), (5, "1500m".into(), vec![3]));
        let c = resolve(Some(f.path()), &ConfigFlags { device_split_count: Some(7), ..Default::default() }, "gpu-small").unwrap();
        assert_eq!(c.device_split_count, 7);
        let c = resolve(Some(f.path()), &ConfigFlags::default(), "gpu-big").unwrap();
        assert_eq!(c.device_split_count, 20);
    }

    #[test]
    fn hami_form_takes_the_same_precedence() {
        let f = file(
            "nvidia:\n  deviceSplitCount: 6\n  deviceCoreScaling: 2\n  overwriteEnv: true\nnodeConfig:\n- name: big\n  deviceSplitCount: 12\n",
        );
        let r = resolve_all(Some(f.path()), &ConfigFlags::default(), "small").unwrap();
        assert_eq!((r.sharing.device_split_count, r.sharing.core_scaling.to_string()), (6, "2".into()));
        assert_eq!(r.file.ignored.len(), 1);
        let flags = ConfigFlags { device_split_count: Some(3), ..Default::default() };
        assert_eq!(resolve(Some(f.path()), &flags, "small").unwrap().device_split_count, 3);
        assert_eq!(resolve(Some(f.path()), &flags, "big").unwrap().device_split_count, 12);
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("deviceMemoryScaling: 0.5\n", "line 1: deviceMemoryScaling: "),
            ("deviceSplitCount: 0\n", "line 1: deviceSplitCount: 0 is outside"),
            ("driverName: Bad_Name\n", "line 1: driverName: "),
            ("devicesplitcount: 3\n", "line 1: devicesplitcount: unknown key"),
            ("nodeConfig:\n- name: n1\n  deviceCoreScaling: lots\n", "line 3: nodeConfig[0].deviceCoreScaling: "),
            ("nvidia:\n  deviceSplitCount: ten\n", "line 2: nvidia.deviceSplitCount: expected an integer, got \"ten\""),
        ];
        for (text, want) in cases {
            let f = file(text);
            let e = resolve(Some(f.path()), &ConfigFlags::default(), "n1").unwrap_err().to_string();
            assert!(e.starts_with(&format!("--config: {}", f.path().display())) && e.contains(want), "{text:?}: {e}");
        }
        let f = file("nodeConfig:\n- name: n1\n  deviceSplitCount: 0\n");
        let e = resolve(Some(f.path()), &ConfigFlags::default(), "n1").unwrap_err().to_string();
        assert!(e.contains("nodeConfig[0].deviceSplitCount: 0 is outside"), "{e}");
        let e = resolve(None, &ConfigFlags { device_core_scaling: Some("x".into()), ..Default::default() }, "n").unwrap_err();
        assert_eq!(e.key, "--device-core-scaling");
    }
}
