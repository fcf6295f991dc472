//! The model both forms of the device configuration are read into, and the pieces their readers
//! share.

use crate::yaml_tree::{Bad, Node};
use crate::{DeviceFilter, DriverName, Inventory, NodeOverride, Ratio};

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

/// HAMi's resource names and request defaults, as a webhook converting HAMi pods needs them.
///
/// [`Default`] holds HAMi's defaults; a file's `nvidia:` section replaces what it sets. Field
/// names follow the admission conversion's settings (`compat`), which are filled from these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HamiRequestSettings {
    /// `resourceCountName`: how many cards a container asks for (`nvidia.com/gpu`).
    pub count_resource: String,
    /// `resourceMemoryName`: memory per card, in units of `memory_factor` MiB (`nvidia.com/gpumem`).
    pub memory_resource: String,
    /// `resourceMemoryPercentageName`: memory per card in percent (`nvidia.com/gpumem-percentage`).
    pub memory_percentage_resource: String,
    /// `resourceCoreName`: percent of a card's compute (`nvidia.com/gpucores`).
    pub cores_resource: String,
    /// `resourcePriorityName`: HAMi-core's task priority (`nvidia.com/priority`); `None` in
    /// Volcano's form unless the file names one, since volcano-vgpu has no priority resource.
    pub priority_resource: Option<String>,
    /// `defaultMemory`: MiB per card when a pod gives no memory; 0 means the whole card.
    pub default_memory_mib: u64,
    /// `defaultCores`: percent of compute when a pod gives none (0-100).
    pub default_cores: u32,
    /// `defaultGPUNum`: cards when a pod gives memory or cores but no count; 0 adds no count.
    pub default_gpu_num: u32,
    /// `gpuMemoryFactor` (HAMi's newer name `memoryFactor`): MiB per unit of the memory resource.
    pub memory_factor: u64,
    /// `gpuCorePolicy`: `default`, `force` or `disable`, as HAMi-core reads it; `None` if unset.
    pub core_policy: Option<String>,
}

impl Default for HamiRequestSettings {
    fn default() -> Self {
        Self {
            count_resource: "nvidia.com/gpu".into(),
            memory_resource: "nvidia.com/gpumem".into(),
            memory_percentage_resource: "nvidia.com/gpumem-percentage".into(),
            cores_resource: "nvidia.com/gpucores".into(),
            priority_resource: Some("nvidia.com/priority".into()),
            default_memory_mib: 0,
            default_cores: 0,
            default_gpu_num: 1,
            memory_factor: 1,
            core_policy: None,
        }
    }
}

/// MIG layouts HAMi or Volcano may cut for some card models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigModels {
    /// Model names, matched as a part of a card's product name.
    pub models: Vec<String>,
    /// `knownMigGeometries`: the whole-card layouts allowed.
    pub groups: Vec<MigGeometryGroup>,
    /// `migProfileAllowlist`: the profiles allowed, without layouts.
    pub profiles: Vec<String>,
}

/// One allowed layout of a card: instances that fit on it together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigGeometryGroup {
    /// The group's name (Volcano's `group`; `geometry-N` for HAMi's unnamed lists).
    pub group: String,
    /// The instances of the layout.
    pub geometries: Vec<MigGeometry>,
}

/// A MIG profile and how many instances of it a layout holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigGeometry {
    /// The profile, such as `1g.10gb`.
    pub name: String,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Instances of this profile in the layout.
    pub count: u32,
}

/// Why a key vgpu-dra does not know is ignored.
pub(crate) const UNKNOWN_WHY: &str = "not a key vgpu-dra knows";

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
