//! The sharing configuration: defaults, then the config file, then flags, then the node's
//! override from the file. Invalid values are refused at start with the key and the reason.

use std::path::Path;

use serde::Deserialize;
use vgpu_scheduling::{ConfigError, DeviceFilter, DriverName, NodeOverride, Ratio, SharingConfig};

/// A number or a string in YAML, kept as text so ratios stay exact.
#[derive(Debug, Clone, PartialEq)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FilterFile {
    #[serde(default)]
    uuid: Vec<String>,
    #[serde(default)]
    index: Vec<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeConfigFile {
    name: NodeNames,
    device_split_count: Option<u32>,
    device_memory_scaling: Option<Scalar>,
    device_core_scaling: Option<Scalar>,
    filter_devices: Option<FilterFile>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum NodeNames {
    One(String),
    Many(Vec<String>),
}

/// The config file (YAML or JSON), HAMi's keys in camelCase.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigFile {
    driver_name: Option<String>,
    device_split_count: Option<u32>,
    device_memory_scaling: Option<Scalar>,
    device_core_scaling: Option<Scalar>,
    filter_devices: Option<FilterFile>,
    #[serde(default)]
    node_config: Vec<NodeConfigFile>,
}

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

/// Resolves the configuration that applies to `node`.
///
/// # Errors
/// [`ConfigError`] naming the key (file keys as written in the file, flags as `--flag`).
pub fn resolve(file: Option<&Path>, flags: &ConfigFlags, node: &str) -> Result<SharingConfig, ConfigError> {
    let parsed = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError { key: "--config", reason: format!("{}: {e}", path.display()) })?;
            serde_saphyr::from_str::<ConfigFile>(&text)
                .map_err(|e| ConfigError { key: "--config", reason: format!("{}: {e}", path.display()) })?
        }
        None => ConfigFile::default(),
    };
    let mut config = SharingConfig::default();
    if let Some(name) = flags.driver_name.as_ref().or(parsed.driver_name.as_ref()) {
        let key = if flags.driver_name.is_some() { "--driver-name" } else { "driverName" };
        config.driver_name = DriverName::new(name.clone()).map_err(|e| ConfigError { key, reason: e.to_string() })?;
    }
    if let Some(n) = flags.device_split_count.or(parsed.device_split_count) {
        config.device_split_count = n;
    }
    let ratio = |key: &'static str, v: &str| Ratio::parse(key, v);
    match (&flags.device_memory_scaling, &parsed.device_memory_scaling) {
        (Some(v), _) => config.memory_scaling = ratio("--device-memory-scaling", v)?,
        (None, Some(Scalar(v))) => config.memory_scaling = ratio("deviceMemoryScaling", v)?,
        _ => {}
    }
    match (&flags.device_core_scaling, &parsed.device_core_scaling) {
        (Some(v), _) => config.core_scaling = ratio("--device-core-scaling", v)?,
        (None, Some(Scalar(v))) => config.core_scaling = ratio("deviceCoreScaling", v)?,
        _ => {}
    }
    if let Some(f) = &parsed.filter_devices {
        config.filter = DeviceFilter { uuids: f.uuid.clone(), indices: f.index.clone() };
    }
    if !flags.filter_uuids.is_empty() || !flags.filter_indices.is_empty() {
        config.filter = DeviceFilter { uuids: flags.filter_uuids.clone(), indices: flags.filter_indices.clone() };
    }
    let mut overrides = Vec::new();
    for n in &parsed.node_config {
        let nodes = match &n.name {
            NodeNames::One(s) => vec![s.clone()],
            NodeNames::Many(v) => v.clone(),
        };
        overrides.push(NodeOverride {
            nodes,
            device_split_count: n.device_split_count,
            memory_scaling: n
                .device_memory_scaling
                .as_ref()
                .map(|Scalar(v)| ratio("nodeConfig.deviceMemoryScaling", v))
                .transpose()?,
            core_scaling: n.device_core_scaling.as_ref().map(|Scalar(v)| ratio("nodeConfig.deviceCoreScaling", v)).transpose()?,
            filter: n.filter_devices.as_ref().map(|f| DeviceFilter { uuids: f.uuid.clone(), indices: f.index.clone() }),
        });
    }
    config.for_node(&overrides, node)
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
    fn bad_values_name_their_key() {
        let cases = [
            ("deviceMemoryScaling: 0.5\n", "deviceMemoryScaling: "),
            ("deviceSplitCount: 0\n", "deviceSplitCount: must be at least 1"),
            ("driverName: Bad_Name\n", "driverName: "),
            ("devicesplitcount: 3\n", "--config: "),
            ("nodeConfig:\n- name: n1\n  deviceCoreScaling: lots\n", "nodeConfig.deviceCoreScaling: "),
        ];
        for (text, want) in cases {
            let f = file(text);
            let e = resolve(Some(f.path()), &ConfigFlags::default(), "n1").unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        let e = resolve(None, &ConfigFlags { device_core_scaling: Some("x".into()), ..Default::default() }, "n").unwrap_err();
        assert_eq!(e.key, "--device-core-scaling");
    }
}
