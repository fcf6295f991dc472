//! Where the node's GPUs come from: NVML on a real node, a mock inventory elsewhere.

pub mod mock;

use vgpu_scheduling::Inventory;

/// A source of the node's GPU inventory.
pub trait DeviceSource {
    /// Reads the current inventory.
    ///
    /// # Errors
    /// [`DiscoveryError`] saying which step of discovery failed.
    fn inventory(&self) -> Result<Inventory, DiscoveryError>;
}

/// Discovery failures.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A `--mock-gpus` spec is malformed.
    #[error(transparent)]
    MockSpec(#[from] mock::MockSpecError),
}
