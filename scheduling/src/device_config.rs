//! The device configuration file, in either of its two forms, read into one model that the node
//! driver and an admission webhook share.
//!
//! - vgpu-dra's own form: `driverName`, `deviceSplitCount`, `deviceMemoryScaling`,
//!   `deviceCoreScaling`, `filterDevices`, `nodeConfig` at the top level. Unknown keys are refused
//!   here, since a typo in our own keys would otherwise silently change nothing.
//! - HAMi's `device-config.yaml` (HAMi's chart and volcano-vgpu-device-plugin): everything NVIDIA
//!   under `nvidia:`, next to other vendors' sections. Keys with a meaning here take effect; the
//!   others are accepted and listed in [`DeviceConfig::ignored`], so a HAMi user's file is
//!   accepted unchanged.
//!
//! In both forms a value of the wrong type is an error naming the file, line and key path.

use crate::yaml_tree::{self, Bad, Node};
use crate::{DeviceFilter, DriverName, Inventory, NodeOverride, Ratio};

pub use crate::device_config_hami::{HamiRequestSettings, MigGeometry, MigGeometryGroup, MigModels};

/// Which form the file was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigForm {
    /// vgpu-dra's own top-level keys only.
    Own,
    /// HAMi's `device-config.yaml` (an `nvidia:` or another vendor's section).
    Hami,
    /// HAMi's form as volcano-vgpu-device-plugin writes it (`volcano.sh/` resource names).
    Volcano,
}

/// A key that was read but has no effect in vgpu-dra, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredKey {
    /// The key path, such as `nvidia.overwriteEnv` or `cambricon`.
    pub key: String,
    /// Why it has no effect here.
    pub why: &'static str,
}

/// A device configuration file that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceConfigError {
    /// The text is not YAML (or JSON); the parser's message carries line and column.
    #[error("{file}: {message}")]
    Syntax {
        /// The file's name, as messages show it.
        file: String,
        /// The parser's message.
        message: String,
    },
    /// A value of the wrong type, out of range, or set twice.
    #[error("{file} line {line}: {key}: {reason}")]
    Value {
        /// The file's name, as messages show it.
        file: String,
        /// The line of the value (1-based).
        line: u64,
        /// The key path, such as `nvidia.deviceSplitCount`.
        key: String,
        /// What is wrong with the value.
        reason: String,
    },
}

/// Everything a device configuration file says, before flags are applied.
///
/// Sharing settings are `None` where the file leaves them out, so the caller can apply its own
/// precedence (defaults, file, flags, then the node's override).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The form the file was written in.
    pub form: ConfigForm,
    /// `driverName` (vgpu-dra's own key; HAMi's form has none).
    pub driver_name: Option<DriverName>,
    /// `deviceSplitCount` (top level or `nvidia.`).
    pub device_split_count: Option<u32>,
    /// `deviceMemoryScaling` (top level or `nvidia.`), where it over-subscribes memory.
    pub memory_scaling: Option<Ratio>,
    /// `deviceCoreScaling` (top level or `nvidia.`).
    pub core_scaling: Option<Ratio>,
    /// `filterDevices`.
    pub filter: Option<DeviceFilter>,
    /// `nodeConfig` entries.
    pub node_overrides: Vec<NodeOverride>,
    /// The resource names and defaults a webhook converts HAMi's pod resources with.
    pub compat: HamiRequestSettings,
    /// `nvidia.knownMigGeometries` and `nvidia.migProfileAllowlist`, by model.
    pub mig: Vec<MigModels>,
    /// Keys accepted without effect, in file order.
    pub ignored: Vec<IgnoredKey>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            form: ConfigForm::Own,
            driver_name: None,
            device_split_count: None,
            memory_scaling: None,
            core_scaling: None,
            filter: None,
            node_overrides: Vec::new(),
            compat: HamiRequestSettings::default(),
            mig: Vec::new(),
            ignored: Vec::new(),
        }
    }
}

/// Top-level sections of HAMi's file for devices other than NVIDIA GPUs.
const OTHER_VENDORS: [&str; 14] = [
    "cambricon",
    "hygon",
    "metax",
    "mthreads",
    "iluvatar",
    "iluvatars",
    "enflame",
    "kunlun",
    "awsneuron",
    "amd",
    "vastai",
    "biren",
    "vnpus",
    "ascend",
];

/// Why another vendor's section is ignored.
const OTHER_VENDOR_WHY: &str = "another vendor's devices; vgpu-dra shares NVIDIA GPUs only";

/// The keys of vgpu-dra's own form, for the message on an unknown one.
const OWN_KEYS: &str =
    "driverName, deviceSplitCount, deviceMemoryScaling, deviceCoreScaling, filterDevices, nodeConfig, or HAMi's nvidia section";

/// A setting read from one of two places, kept with where it came from to refuse the other.
pub(crate) struct Setting<T> {
    pub value: T,
    pub line: u64,
    pub key: String,
}

impl<T> Setting<T> {
    /// Takes `next`, refusing it when the same setting was already given under another key.
    pub(crate) fn set(slot: &mut Option<Self>, node: &Node, key: &str, value: T) -> Result<(), Bad> {
        if let Some(first) = slot {
            return Err(Bad::new(node, key, format!("also set as {} on line {}; keep one", first.key, first.line)));
        }
        *slot = Some(Self { value, line: node.line, key: key.to_owned() });
        Ok(())
    }
}

/// The settings both forms can give, before they are checked against each other.
#[derive(Default)]
pub(crate) struct Sharing {
    pub split: Option<Setting<u32>>,
    pub memory: Option<Setting<Ratio>>,
    pub cores: Option<Setting<Ratio>>,
}

impl DeviceConfig {
    /// Reads a device configuration file. `file` names it in messages (`device-config.yaml`).
    ///
    /// # Errors
    /// [`DeviceConfigError::Syntax`] when the text is not YAML; [`DeviceConfigError::Value`]
    /// naming line and key for a value of the wrong type, out of range or given twice, and for
    /// an unknown key in vgpu-dra's own form.
    pub fn parse(file: &str, text: &str) -> Result<Self, DeviceConfigError> {
        let root = yaml_tree::parse(text).map_err(|message| DeviceConfigError::Syntax { file: file.to_owned(), message })?;
        read(&root).map_err(|b| DeviceConfigError::Value { file: file.to_owned(), line: b.line, key: b.key, reason: b.reason })
    }

    /// The models listed under `knownMigGeometries` or `migProfileAllowlist` that are present in
    /// `inventory`, each once, in the file's order. A model is present when a card's product name
    /// contains it, as HAMi and Volcano match it (`A800-SXM4-80GB` in `NVIDIA A800-SXM4-80GB`).
    pub fn mig_models_present(&self, inventory: &Inventory) -> Vec<String> {
        let mut present: Vec<String> = Vec::new();
        for model in self.mig.iter().flat_map(|m| &m.models) {
            if !present.contains(model) && inventory.gpus.iter().any(|g| g.product_name.contains(model.as_str())) {
                present.push(model.clone());
            }
        }
        present
    }
}

fn read(root: &Node) -> Result<DeviceConfig, Bad> {
    let top = root.map("the top level")?;
    let is_hami = top.iter().any(|(k, _)| {
        let k = k.key_text();
        k == "nvidia" || OTHER_VENDORS.contains(&k.as_str())
    });
    let mut config = DeviceConfig { form: if is_hami { ConfigForm::Hami } else { ConfigForm::Own }, ..Default::default() };
    let mut sharing = Sharing::default();
    for (k, v) in top {
        let key = k.key_text();
        match key.as_str() {
            "driverName" => {
                let name = v.text(&key)?;
                config.driver_name = Some(DriverName::new(name).map_err(|e| Bad::new(v, &key, e.to_string()))?);
            }
            "deviceSplitCount" => Setting::set(&mut sharing.split, v, &key, v.int32(&key, 1, u32::MAX)?)?,
            "deviceMemoryScaling" => Setting::set(&mut sharing.memory, v, &key, v.ratio(&key)?)?,
            "deviceCoreScaling" => Setting::set(&mut sharing.cores, v, &key, v.ratio(&key)?)?,
            "filterDevices" => config.filter = Some(filter(v, &key, is_hami, &mut config.ignored)?),
            "nodeConfig" => {
                for (i, entry) in v.seq(&key)?.iter().enumerate() {
                    let override_ = node_override(entry, &format!("nodeConfig[{i}]"), is_hami, &mut config.ignored)?;
                    config.node_overrides.push(override_);
                }
            }
            "nvidia" => crate::device_config_hami::read_nvidia(v, &mut config, &mut sharing)?,
            other if OTHER_VENDORS.contains(&other) => config.ignored.push(IgnoredKey { key, why: OTHER_VENDOR_WHY }),
            _ if is_hami => config.ignored.push(IgnoredKey { key, why: crate::device_config_hami::UNKNOWN_WHY }),
            _ => return Err(Bad::new(k, &key, format!("unknown key; expected {OWN_KEYS}"))),
        }
    }
    config.device_split_count = sharing.split.map(|s| s.value);
    config.memory_scaling = sharing.memory.map(|s| s.value);
    config.core_scaling = sharing.cores.map(|s| s.value);
    Ok(config)
}

/// `filterDevices: {uuid: [...], index: [...]}`.
fn filter(node: &Node, key: &str, lenient: bool, ignored: &mut Vec<IgnoredKey>) -> Result<DeviceFilter, Bad> {
    let mut filter = DeviceFilter::default();
    for (k, v) in node.map(key)? {
        let name = k.key_text();
        let path = format!("{key}.{name}");
        match name.as_str() {
            "uuid" => filter.uuids = v.seq(&path)?.iter().map(|u| u.text(&path)).collect::<Result<_, _>>()?,
            "index" => filter.indices = v.int32_list(&path)?,
            _ => unknown(k, path, lenient, "uuid, index", ignored)?,
        }
    }
    Ok(filter)
}

/// One `nodeConfig` entry: `name` (one node or a list) and the settings it replaces there.
fn node_override(node: &Node, key: &str, lenient: bool, ignored: &mut Vec<IgnoredKey>) -> Result<NodeOverride, Bad> {
    let mut o = NodeOverride::default();
    for (k, v) in node.map(key)? {
        let name = k.key_text();
        let path = format!("{key}.{name}");
        match name.as_str() {
            "name" => o.nodes = v.text_list(&path)?,
            "deviceSplitCount" => o.device_split_count = Some(v.int32(&path, 1, u32::MAX)?),
            "deviceMemoryScaling" => o.memory_scaling = Some(v.ratio(&path)?),
            "deviceCoreScaling" => o.core_scaling = Some(v.ratio(&path)?),
            "filterDevices" => o.filter = Some(filter(v, &path, lenient, ignored)?),
            _ => unknown(
                k,
                path,
                lenient,
                "name, deviceSplitCount, deviceMemoryScaling, deviceCoreScaling, filterDevices",
                ignored,
            )?,
        }
    }
    if o.nodes.is_empty() {
        return Err(Bad::new(node, &format!("{key}.name"), "every entry needs the node name(s) it applies to"));
    }
    Ok(o)
}

/// An unknown key of ours: listed as ignored in HAMi's form, refused in our own.
fn unknown(k: &Node, path: String, lenient: bool, expected: &str, ignored: &mut Vec<IgnoredKey>) -> Result<(), Bad> {
    if lenient {
        ignored.push(IgnoredKey { key: path, why: crate::device_config_hami::UNKNOWN_WHY });
        Ok(())
    } else {
        Err(Bad::new(k, &path, format!("unknown key; expected {expected}")))
    }
}

#[cfg(test)]
#[path = "device_config_tests.rs"]
mod tests;
