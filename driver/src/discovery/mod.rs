//! Where the node's GPUs come from: NVML on a real node, a mock inventory elsewhere.

pub mod mock;
pub mod nvml;
pub mod xid;

use std::path::{Path, PathBuf};

use vgpu_scheduling::Inventory;

/// A source of the node's GPU inventory.
pub trait DeviceSource: Send + Sync {
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
    /// A `--mock-inventory` file cannot be read or parsed.
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
}

/// A mock inventory read from a JSON or YAML file on every call, so tests and operators can
/// change cards and health by editing it.
#[derive(Debug, Clone)]
pub struct MockFileSource {
    path: PathBuf,
}

impl MockFileSource {
    /// A source reading `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl DeviceSource for MockFileSource {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        let err = |reason: String| DiscoveryError::MockFile { path: self.path.clone(), reason };
        let text = std::fs::read_to_string(&self.path).map_err(|e| err(e.to_string()))?;
        if self.path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| err(e.to_string()))
        } else {
            serde_saphyr::from_str(&text).map_err(|e| err(e.to_string()))
        }
    }
}
