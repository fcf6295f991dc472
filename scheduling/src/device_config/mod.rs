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

mod hami;
mod model;
mod ours;

pub use self::model::{
    ConfigForm, DeviceConfig, DeviceConfigError, HamiRequestSettings, IgnoredKey, MigGeometry, MigGeometryGroup, MigModels,
};
use self::model::{Setting, Sharing, UNKNOWN_WHY};
use self::ours::{filter, node_override};
use crate::DriverName;
use crate::yaml_tree::{self, Bad, Node};

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
            "nvidia" => hami::read_nvidia(v, &mut config, &mut sharing)?,
            other if OTHER_VENDORS.contains(&other) => config.ignored.push(IgnoredKey { key, why: OTHER_VENDOR_WHY }),
            _ if is_hami => config.ignored.push(IgnoredKey { key, why: UNKNOWN_WHY }),
            _ => return Err(Bad::new(k, &key, format!("unknown key; expected {OWN_KEYS}"))),
        }
    }
    config.device_split_count = sharing.split.map(|s| s.value);
    config.memory_scaling = sharing.memory.map(|s| s.value);
    config.core_scaling = sharing.cores.map(|s| s.value);
    Ok(config)
}

#[cfg(test)]
mod tests;
