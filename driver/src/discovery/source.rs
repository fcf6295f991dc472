//! What a source of the node's GPU inventory is, and how it fails.

use std::path::PathBuf;

use vgpu_scheduling::mock::MockSpecError;
use vgpu_scheduling::{Gpu, Inventory};

/// The node-wide part of an inventory: versions and which cards there are, before any card is
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardList {
    /// Kernel driver version, such as `550.54.15`.
    pub driver_version: String,
    /// CUDA driver API version, `(major, minor)`.
    pub cuda_driver_version: (u32, u32),
    /// NVML indices of the cards present, lost ones included.
    pub indices: Vec<u32>,
}

/// A source of the node's GPU inventory.
///
/// Reads may block (NVML, files); callers on an async runtime read a [`super::SnapshotSource`] instead.
/// A source whose cards can be read one by one implements [`DeviceSource::cards`] and
/// [`DeviceSource::card`], so the device loop can give each card its own deadline; the defaults
/// read the whole inventory, which suits sources that never block.
pub trait DeviceSource: Send + Sync {
    /// Reads the current inventory.
    ///
    /// # Errors
    /// [`DiscoveryError`] saying which step of discovery failed.
    fn inventory(&self) -> Result<Inventory, DiscoveryError>;

    /// Reads the node-wide facts and lists the cards without reading them.
    ///
    /// # Errors
    /// [`DiscoveryError`] saying which step of discovery failed.
    fn cards(&self) -> Result<CardList, DiscoveryError> {
        let inventory = self.inventory()?;
        Ok(CardList {
            driver_version: inventory.driver_version,
            cuda_driver_version: inventory.cuda_driver_version,
            indices: inventory.gpus.iter().map(|g| g.index).collect(),
        })
    }

    /// Reads the card with NVML index `index`.
    ///
    /// # Errors
    /// [`DiscoveryError::CardLost`] when the card fell off the bus, [`DiscoveryError::NoSuchCard`]
    /// when there is none by that index, other variants when a query failed.
    fn card(&self, index: u32) -> Result<Gpu, DiscoveryError> {
        self.inventory()?.gpus.into_iter().find(|g| g.index == index).ok_or(DiscoveryError::NoSuchCard { index })
    }
}

/// The whole inventory through [`DeviceSource::cards`] and [`DeviceSource::card`], for sources
/// whose per-card reads are the primitive. A lost card is left out with a warning (a one-shot
/// read has no earlier details to report it with).
///
/// # Errors
/// The first failure other than a lost card.
pub fn read_all(source: &(impl DeviceSource + ?Sized)) -> Result<Inventory, DiscoveryError> {
    let list = source.cards()?;
    let mut gpus = Vec::with_capacity(list.indices.len());
    for index in list.indices {
        match source.card(index) {
            Ok(gpu) => gpus.push(gpu),
            Err(DiscoveryError::CardLost { .. }) => tracing::warn!(index, "GPU is lost (fell off the bus); left out"),
            Err(e) => return Err(e),
        }
    }
    Ok(Inventory { driver_version: list.driver_version, cuda_driver_version: list.cuda_driver_version, gpus })
}

/// Discovery failures.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A `--mock-gpus` spec is malformed.
    #[error(transparent)]
    MockSpec(#[from] MockSpecError),
    /// A `--mock-inventory` file cannot be read or parsed, or simulates a failure.
    #[error("mock inventory {path}: {reason}")]
    MockFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// NVML cannot be used on this node at all.
    #[error("NVML unavailable: {0}")]
    NvmlUnavailable(String),
    /// One NVML query failed.
    #[error("NVML {what}: {reason}")]
    Nvml {
        /// Which query.
        what: &'static str,
        /// NVML's answer.
        reason: String,
    },
    /// A card fell off the bus.
    #[error("GPU {index} is lost (fell off the bus)")]
    CardLost {
        /// Its NVML index.
        index: u32,
    },
    /// No card has this index (any more).
    #[error("no GPU with index {index}")]
    NoSuchCard {
        /// The index asked for.
        index: u32,
    },
    /// The device loop has not finished a first read yet.
    #[error("no GPU inventory read yet (the device loop logs why)")]
    NoSnapshot,
}
