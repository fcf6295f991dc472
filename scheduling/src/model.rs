//! The GPUs of a node as discovery reports them (NVML or a mock inventory).

use serde::{Deserialize, Serialize};

/// Whether a card can take new shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Working.
    #[default]
    Healthy,
    /// Lost, or hit an error that needs a reset.
    Unhealthy,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// NVML UUID, `GPU-...`.
    pub uuid: String,
    /// Minor number of `/dev/nvidia<minor>`; names the published device.
    pub minor: u32,
    /// NVML index.
    pub index: u32,
    /// Product name, such as `Tesla T4`.
    pub product_name: String,
    /// Brand, such as `Tesla` or `GeForce`.
    #[serde(default = "default_brand")]
    pub brand: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Architecture, such as `Turing` or `Hopper`.
    #[serde(default)]
    pub architecture: String,
    /// CUDA compute capability, `(major, minor)`.
    #[serde(default)]
    pub compute_capability: (u32, u32),
    /// PCI bus ID, `0000:3b:00.0`.
    #[serde(default)]
    pub pci_bus_id: String,
    /// PCIe root complex (`pci0000:00`), for `resource.kubernetes.io/pcieRoot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// Streaming multiprocessors of the whole card.
    #[serde(default)]
    pub multiprocessors: u32,
    /// MIG instances when the card is in MIG mode (then they are published instead of the card).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<Vec<MigDevice>>,
    /// Current health.
    #[serde(default)]
    pub health: Health,
}

fn default_brand() -> String {
    "Tesla".into()
}

/// A MIG instance (GPU instance + compute instance) of a card in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDevice {
    /// MIG UUID, `MIG-...`.
    pub uuid: String,
    /// Profile name, such as `1g.18gb`.
    pub profile: String,
    /// GPU instance ID.
    pub gpu_instance: u32,
    /// Compute instance ID.
    pub compute_instance: u32,
    /// Memory of the instance in bytes.
    pub memory_bytes: u64,
    /// Streaming multiprocessors of the instance.
    #[serde(default)]
    pub multiprocessors: u32,
    /// Where the GPU instance sits on the card, when discovery could read it: dynamic MIG
    /// offers no placement that overlaps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<MigPlacement>,
}

/// A GPU instance's profile and first memory slice, as NVML reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigPlacement {
    /// NVML's GPU-instance profile id (19 for `1g.10gb`).
    pub profile_id: u32,
    /// The first memory slice it holds.
    pub start: u8,
}

/// Everything discovery knows about a node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    /// Kernel driver version, such as `550.54.15`.
    #[serde(default)]
    pub driver_version: String,
    /// CUDA driver API version, `(major, minor)`.
    #[serde(default)]
    pub cuda_driver_version: (u32, u32),
    /// The cards, in NVML index order.
    pub gpus: Vec<Gpu>,
}
