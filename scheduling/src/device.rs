//! The devices a node publishes: one per card (or per MIG instance), with HAMi DRA's attributes
//! and the consumable capacities `memory`, `cores` and `shares`.

use std::collections::BTreeMap;

use crate::config::SharingConfig;
use crate::model::{Gpu, Health, Inventory};
use crate::policy::{Capacity, RequestPolicy, ValidRequests};
use crate::{DeviceName, Format, Quantity};

/// Capacity holding the memory of a share, in bytes.
pub const CAPACITY_MEMORY: &str = "memory";
/// Capacity holding the compute of a share, in percent of the card's SMs.
pub const CAPACITY_CORES: &str = "cores";
/// Capacity bounding how many shares a card holds (HAMi `deviceSplitCount`); each takes 1.
pub const CAPACITY_SHARES: &str = "shares";
/// The `type` attribute value HAMi's DeviceClass selects on.
pub const DEVICE_TYPE: &str = "hami-gpu";
/// Standard attribute for the PCIe root complex, used to align devices across drivers.
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

const MIB: u64 = 1 << 20;

/// A device attribute value, as `resource.k8s.io/v1` `DeviceAttribute`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute {
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `string`, at most 64 characters.
    String(String),
    /// `version`: semantic version 2.0.0.
    Version(String),
}

/// A device as published in the node's ResourceSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    /// The device name: `hami-gpu-<minor>`, or `hami-gpu-<minor>-mig-<gi>-<ci>`.
    pub name: DeviceName,
    /// The card (or MIG instance) UUID, for `NVIDIA_VISIBLE_DEVICES`.
    pub uuid: String,
    /// Minor number of the card's device node.
    pub minor: u32,
    /// Attributes, unqualified names being in the driver's domain.
    pub attributes: BTreeMap<String, Attribute>,
    /// Consumable capacities.
    pub capacity: BTreeMap<String, Capacity>,
    /// Whether the card is healthy; unhealthy devices are published with a taint.
    pub health: Health,
}

impl PublishedDevice {
    /// The capacity totals, for the ledger.
    pub fn capacity_values(&self) -> BTreeMap<String, Quantity> {
        self.capacity.iter().map(|(k, c)| (k.clone(), c.value)).collect()
    }

    /// The card's index as NVML numbers it (the `index` attribute), else its minor: what the
    /// NVIDIA toolkit's CDI names and HAMi's metrics call the card.
    pub fn index(&self) -> u32 {
        match self.attributes.get("index") {
            Some(Attribute::Int(i)) => u32::try_from(*i).unwrap_or(self.minor),
            _ => self.minor,
        }
    }
}

/// The devices of `inventory` under `config`, in minor order: cards in MIG mode publish their MIG
/// instances instead of the card, filtered cards publish nothing.
pub fn publish(inventory: &Inventory, config: &SharingConfig) -> Vec<PublishedDevice> {
    let mut gpus: Vec<&Gpu> = inventory
        .gpus
        .iter()
        .filter(|g| !config.filter.uuids.contains(&g.uuid) && !config.filter.indices.contains(&g.index))
        .collect();
    gpus.sort_by_key(|g| g.minor);
    let mut out = Vec::new();
    for gpu in gpus {
        let mut attrs = card_attributes(inventory, gpu);
        match &gpu.mig {
            Some(instances) => {
                for mig in instances {
                    let name = format!("{DEVICE_TYPE}-{}-mig-{}-{}", gpu.minor, mig.gpu_instance, mig.compute_instance);
                    let Ok(name) = DeviceName::new(name) else { continue };
                    let mut attrs = attrs.clone();
                    attrs.insert("uuid".into(), Attribute::String(mig.uuid.clone()));
                    attrs.insert("parentUUID".into(), Attribute::String(gpu.uuid.clone()));
                    attrs.insert("migProfile".into(), Attribute::String(truncate(&mig.profile)));
                    out.push(PublishedDevice {
                        name,
                        uuid: mig.uuid.clone(),
                        minor: gpu.minor,
                        attributes: attrs,
                        capacity: share_capacities(mig.memory_bytes, config),
                        health: gpu.health,
                    });
                }
            }
            None => {
                let Ok(name) = DeviceName::new(format!("{DEVICE_TYPE}-{}", gpu.minor)) else { continue };
                attrs.insert("uuid".into(), Attribute::String(gpu.uuid.clone()));
                out.push(PublishedDevice {
                    name,
                    uuid: gpu.uuid.clone(),
                    minor: gpu.minor,
                    attributes: attrs,
                    capacity: share_capacities(gpu.memory_bytes, config),
                    health: gpu.health,
                });
            }
        }
    }
    out
}

fn card_attributes(inventory: &Inventory, gpu: &Gpu) -> BTreeMap<String, Attribute> {
    let mut a = BTreeMap::new();
    let s = |v: &str| Attribute::String(truncate(v));
    a.insert("type".into(), s(DEVICE_TYPE));
    a.insert("minor".into(), Attribute::Int(i64::from(gpu.minor)));
    a.insert("index".into(), Attribute::Int(i64::from(gpu.index)));
    a.insert("productName".into(), s(&gpu.product_name));
    a.insert("brand".into(), s(&gpu.brand));
    if !gpu.architecture.is_empty() {
        a.insert("architecture".into(), s(&gpu.architecture));
    }
    let (major, minor) = gpu.compute_capability;
    if major > 0 {
        a.insert("cudaComputeCapability".into(), Attribute::Version(format!("{major}.{minor}.0")));
    }
    if let Some(v) = semver(&inventory.driver_version) {
        a.insert("driverVersion".into(), Attribute::Version(v));
    }
    let (cuda_major, cuda_minor) = inventory.cuda_driver_version;
    if cuda_major > 0 {
        a.insert("cudaDriverVersion".into(), Attribute::Version(format!("{cuda_major}.{cuda_minor}.0")));
    }
    if !gpu.pci_bus_id.is_empty() {
        a.insert("pcieBusID".into(), s(&gpu.pci_bus_id));
    }
    if let Some(root) = &gpu.pcie_root {
        a.insert(ATTR_PCIE_ROOT.into(), s(root));
    }
    a
}

/// The least `cores` any allocation takes: a request of 0 (HAMi's "no SM limit") is raised to
/// it by the scheduler. So a card whose cores are all held takes no cores-0 share, and a share
/// that takes all the cores (the default when a claim names none) has the card to itself, both
/// as HAMi's fit rules say. Below one percent it is no SM limit ([`crate::limits::sm_limit`]).
pub const MIN_CORES: Quantity = Quantity::from_milli(1);

/// The three capacities for a device of `memory_bytes`, scaled by the configuration. Memory is
/// rounded down to whole MiB so that the 1Mi step grid ends exactly at the total. Cores step by
/// [`MIN_CORES`] from [`MIN_CORES`]: the scheduler rounds on whole values, so a request of 30
/// consumes exactly 30, and only a request below the minimum consumes the minimum.
/// The capacities of a device shared through HAMi-core with `memory_bytes` of memory: memory,
/// cores and the split count, each with the request policy HAMi DRA publishes.
pub fn share_capacities(memory_bytes: u64, config: &SharingConfig) -> BTreeMap<String, Capacity> {
    let mib = Quantity::from_bytes(MIB);
    let memory = config.memory_scaling.apply(Quantity::from_bytes(memory_bytes / MIB * MIB), mib);
    let one = Quantity::from_int(1, Format::DecimalSI);
    let cores = config.core_scaling.apply(Quantity::from_int(100, Format::DecimalSI), one);
    let shares = Quantity::from_int(i64::from(config.device_split_count), Format::DecimalSI);
    let range = |default, min, max, step| {
        Some(RequestPolicy { default: Some(default), valid: ValidRequests::Range { min, max: Some(max), step: Some(step) } })
    };
    BTreeMap::from([
        (CAPACITY_MEMORY.to_owned(), Capacity { value: memory, policy: range(memory, mib, memory, mib) }),
        (CAPACITY_CORES.to_owned(), Capacity { value: cores, policy: range(cores, MIN_CORES, cores, MIN_CORES) }),
        (CAPACITY_SHARES.to_owned(), Capacity { value: shares, policy: range(one, one, shares, one) }),
    ])
}

/// String attributes are limited to 64 characters by the API.
fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// NVIDIA driver versions (`535.104.05`) as semantic versions: three numeric parts without
/// leading zeros (`535.104.5`); missing parts are zero.
pub fn semver(version: &str) -> Option<String> {
    let parts: Vec<u64> = version.trim().split('.').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let part = |i: usize| parts.get(i).copied().unwrap_or(0);
    Some(format!("{}.{}.{}", part(0), part(1), part(2)))
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
