//! What the conversion is configured with: HAMi's resource names and defaults
//! ([`CompatSettings`]) and what the class's ResourceSlices offer ([`ClassFacts`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceSlice};

use super::mig_names::{MIG_DEVICE_TYPE, default_mig_device_class};
use super::volcano::VolcanoSettings;
use crate::Quantity;
use crate::config::DEFAULT_DRIVER_NAME;
use crate::device::{Attribute, CAPACITY_MEMORY, PublishedDevice};
use crate::device_config::HamiRequestSettings;

/// HAMi's `gpuCorePolicy`: how HAMi-core throttles compute (`GPU_CORE_UTILIZATION_POLICY`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CorePolicy {
    /// Throttle to the SM limit only while other processes share the card (HAMi-core's default;
    /// nothing is passed to the container).
    #[default]
    Default,
    /// Always throttle to the SM limit.
    Force,
    /// Never throttle.
    Disable,
}

impl CorePolicy {
    /// The value HAMi-core reads, `None` for the default (HAMi sets no variable then).
    pub fn env_value(self) -> Option<&'static str> {
        match self {
            Self::Default => None,
            Self::Force => Some("force"),
            Self::Disable => Some("disable"),
        }
    }
}

/// HAMi's device configuration as far as admission needs it: resource names, defaults and the
/// DeviceClass the converted requests go to. Plain data; the device-config loader fills it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatSettings {
    /// Number of cards (`resourceCountName`).
    pub count_resource: String,
    /// Memory per card, MiB (`resourceMemoryName`).
    pub memory_resource: String,
    /// Memory per card in percent of the card (`resourceMemoryPercentageName`).
    pub memory_percentage_resource: String,
    /// Compute per card in percent (`resourceCoreName`).
    pub cores_resource: String,
    /// HAMi-core task priority (`resourcePriorityName`); `None` where the flavour has none.
    pub priority_resource: Option<String>,
    /// Prefix of the MIG resources of NVIDIA's device plugin (`nvidia.com/mig-<profile>`), each
    /// converted into instances of its profile on [`Self::mig_device_class`].
    pub mig_resource_prefix: String,
    /// Memory when none is asked, MiB (`defaultMemory`); 0 means the whole card.
    pub default_memory_mib: u64,
    /// Compute when none is asked, percent (`defaultCores`).
    pub default_cores: u32,
    /// Cards when memory or compute is asked without a count (`defaultGPUNum`); 0 turns that off.
    pub default_gpu_num: u32,
    /// Multiplier of plain-number memory requests (`gpuMemoryFactor`/`memoryFactor`), at least 1.
    pub memory_factor: u64,
    /// Compute throttling policy passed to HAMi-core (`gpuCorePolicy`).
    pub core_policy: CorePolicy,
    /// DeviceClass of the converted requests.
    pub device_class: String,
    /// DeviceClass of the driver's dynamic-MIG devices (`type: hami-mig`), for `vgpu-mode: mig`
    /// and `nvidia.com/mig-<profile>`; [`default_mig_device_class`] of the class by default.
    pub mig_device_class: String,
    /// Driver name: the domain of the device attributes and capacities the claims select on.
    pub driver: String,
    /// How converted pods of Volcano's scheduler keep a request Volcano counts.
    pub volcano: VolcanoSettings,
    /// Deny what no card or node published at this moment can hold (more cards than the largest
    /// node, more memory than the largest card). Off by default: such a pod is admitted with a
    /// warning and waits, as HAMi leaves it pending, until a node that fits joins.
    pub strict_fit: bool,
    /// A pod without `vgpu-mode` asking one card and a memory amount may land on a share or, when
    /// no share fits on the node, on a MIG instance: HAMi's fit between the modes. Off by
    /// default (shares only): see [`super::mig::either_claim_spec`].
    pub unannotated_mig: bool,
}

impl Default for CompatSettings {
    fn default() -> Self {
        Self::hami()
    }
}

impl CompatSettings {
    /// HAMi's defaults: `nvidia.com/gpu`, `gpumem`, `gpumem-percentage`, `gpucores`, `priority`,
    /// taken from the device configuration model's defaults so the two cannot drift apart.
    pub fn hami() -> Self {
        let base = Self {
            count_resource: String::new(),
            memory_resource: String::new(),
            memory_percentage_resource: String::new(),
            cores_resource: String::new(),
            priority_resource: None,
            mig_resource_prefix: "nvidia.com/mig-".into(),
            default_memory_mib: 0,
            default_cores: 0,
            default_gpu_num: 0,
            memory_factor: 1,
            core_policy: CorePolicy::Default,
            device_class: DEFAULT_DRIVER_NAME.into(),
            mig_device_class: default_mig_device_class(DEFAULT_DRIVER_NAME),
            driver: DEFAULT_DRIVER_NAME.into(),
            volcano: VolcanoSettings::default(),
            strict_fit: false,
            unannotated_mig: false,
        };
        base.with_device_config(&HamiRequestSettings::default())
    }

    /// volcano-vgpu-device-plugin's names (`volcano.sh/vgpu-*`) with the same defaults; it has no
    /// priority resource.
    pub fn volcano() -> Self {
        Self {
            count_resource: "volcano.sh/vgpu-number".into(),
            memory_resource: "volcano.sh/vgpu-memory".into(),
            memory_percentage_resource: "volcano.sh/vgpu-memory-percentage".into(),
            cores_resource: "volcano.sh/vgpu-cores".into(),
            priority_resource: None,
            ..Self::hami()
        }
    }

    /// These settings with the names and defaults of a parsed HAMi device configuration; the
    /// class and driver stay. An unknown `gpuCorePolicy` is HAMi-core's default, as HAMi-core
    /// reads it.
    pub fn with_device_config(self, c: &HamiRequestSettings) -> Self {
        let core_policy = match c.core_policy.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("force") => CorePolicy::Force,
            Some("disable") => CorePolicy::Disable,
            _ => CorePolicy::Default,
        };
        Self {
            count_resource: c.count_resource.clone(),
            memory_resource: c.memory_resource.clone(),
            memory_percentage_resource: c.memory_percentage_resource.clone(),
            cores_resource: c.cores_resource.clone(),
            priority_resource: c.priority_resource.clone(),
            default_memory_mib: c.default_memory_mib,
            default_cores: c.default_cores,
            default_gpu_num: c.default_gpu_num,
            memory_factor: c.memory_factor.max(1),
            core_policy,
            ..self
        }
    }

    /// The resource names this flavour converts, priority included.
    pub fn resource_names(&self) -> Vec<&str> {
        let mut names = vec![
            self.count_resource.as_str(),
            self.memory_resource.as_str(),
            self.memory_percentage_resource.as_str(),
            self.cores_resource.as_str(),
        ];
        names.extend(self.priority_resource.as_deref());
        names
    }

    /// Whether `name` is one this flavour converts, MIG resources included.
    pub fn is_own_resource(&self, name: &str) -> bool {
        self.resource_names().contains(&name) || self.is_mig(name)
    }

    /// Whether `name` is a MIG resource (`nvidia.com/mig-<profile>`).
    pub fn is_mig(&self, name: &str) -> bool {
        !self.mig_resource_prefix.is_empty() && name.starts_with(&self.mig_resource_prefix)
    }
}

/// A card model the class offers: its `productName` attribute and its `memory` capacity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CardModel {
    /// The `productName` attribute, as published (at most 64 characters).
    pub product_name: String,
    /// The `memory` capacity in bytes, as published (scaled when memory is over-subscribed).
    pub memory_bytes: u64,
}

impl CardModel {
    /// `NAME=MEMORY` as a flag gives it (`NVIDIA A100-SXM4-80GB=81920Mi`): the product name as
    /// the node publishes it and the card's published memory (times `deviceMemoryScaling`).
    ///
    /// # Errors
    /// A message naming the value when there is no `=`, no name, a name over 64 characters or a
    /// memory that is not a whole, positive number of bytes.
    pub fn parse(value: &str) -> Result<Self, String> {
        let (name, memory) =
            value.rsplit_once('=').ok_or_else(|| format!("{value:?}: a card model is NAME=MEMORY, e.g. \"Tesla T4=15Gi\""))?;
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 64 {
            return Err(format!("{value:?}: the product name must be 1 to 64 characters, as the node publishes it"));
        }
        let memory_bytes = Quantity::parse(memory.trim())
            .ok()
            .and_then(|q| q.as_u64_exact())
            .filter(|b| *b > 0)
            .ok_or_else(|| format!("{value:?}: the memory must be a whole number of bytes above 0, such as 15Gi"))?;
        Ok(Self { product_name: name.to_owned(), memory_bytes })
    }
}

/// What the class's ResourceSlices offer, for checks and percentages. Empty means unknown:
/// checks that need it are skipped, and percentages below 100 cannot be expressed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassFacts {
    /// Distinct card models, sorted (the order of the prioritized list they become).
    pub models: Vec<CardModel>,
    /// The most devices any one node publishes; 0 when unknown.
    pub max_cards_per_node: u32,
}

impl ClassFacts {
    /// Facts from explicit models and node size; models are sorted and deduplicated so the
    /// templates built from them do not depend on listing order.
    pub fn new(models: impl IntoIterator<Item = CardModel>, max_cards_per_node: u32) -> Self {
        let models: BTreeSet<CardModel> = models.into_iter().collect();
        Self { models: models.into_iter().collect(), max_cards_per_node }
    }

    /// Facts from the ResourceSlices of `driver`: one model per distinct (productName, memory),
    /// and the largest device count of one pool (a pool is a node). Devices without a
    /// `productName` or `memory` are counted but offer no model. Dynamic-MIG devices (`type:
    /// hami-mig`, one per profile and placement of a card) are neither: they are not cards, and
    /// their card is counted by its whole-card device.
    pub fn from_slices(slices: &[ResourceSlice], driver: &str) -> Self {
        let mut models = BTreeSet::new();
        let mut per_pool: BTreeMap<&str, u32> = BTreeMap::new();
        for slice in slices.iter().filter(|s| s.spec.driver == driver) {
            let devices = slice.spec.devices.as_deref().unwrap_or_default();
            let cards: Vec<_> = devices
                .iter()
                .filter(|d| d.attributes.as_ref().and_then(|a| attribute(a, driver, "type")).as_deref() != Some(MIG_DEVICE_TYPE))
                .collect();
            let count = per_pool.entry(slice.spec.pool.name.as_str()).or_default();
            *count = count.saturating_add(u32::try_from(cards.len()).unwrap_or(u32::MAX));
            for device in cards {
                let product = device.attributes.as_ref().and_then(|a| attribute(a, driver, "productName"));
                let memory = device
                    .capacity
                    .as_ref()
                    .and_then(|c| c.get(CAPACITY_MEMORY).or_else(|| c.get(&format!("{driver}/{CAPACITY_MEMORY}"))))
                    .and_then(|c| Quantity::parse(&c.value.0).ok())
                    .and_then(|q| q.as_u64_exact());
                if let (Some(product_name), Some(memory_bytes)) = (product, memory) {
                    models.insert(CardModel { product_name, memory_bytes });
                }
            }
        }
        Self { models: models.into_iter().collect(), max_cards_per_node: per_pool.into_values().max().unwrap_or(0) }
    }

    /// These facts with `known` models added: card models the configuration names (a node
    /// group that scales from zero publishes none until a pod waits for it).
    #[must_use]
    pub fn with_models(self, known: impl IntoIterator<Item = CardModel>) -> Self {
        Self::new(self.models.into_iter().chain(known), self.max_cards_per_node)
    }

    /// Facts from the devices one node would publish ([`crate::publish`]): a preview without a
    /// cluster sees what the webhook would list.
    pub fn from_devices(devices: &[PublishedDevice]) -> Self {
        let models = devices.iter().filter_map(|d| {
            let Some(Attribute::String(product_name)) = d.attributes.get("productName") else { return None };
            let memory_bytes = d.capacity.get(CAPACITY_MEMORY)?.value.as_u64_exact()?;
            Some(CardModel { product_name: product_name.clone(), memory_bytes })
        });
        Self::new(models, u32::try_from(devices.len()).unwrap_or(u32::MAX))
    }

    /// The largest card memory, `None` when unknown.
    pub fn largest_memory(&self) -> Option<u64> {
        self.models.iter().map(|m| m.memory_bytes).max()
    }
}

/// A string attribute by its unqualified name (the driver's domain) or qualified with `driver`.
fn attribute(attrs: &BTreeMap<String, DeviceAttribute>, driver: &str, name: &str) -> Option<String> {
    attrs.get(name).or_else(|| attrs.get(&format!("{driver}/{name}"))).and_then(|a| a.string.clone())
}
