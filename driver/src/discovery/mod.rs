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

/// A source whose successful reads are reused for `ttl`: prepares and metric scrapes come in
/// bursts, and an NVML read is a round of driver queries each time. Errors are never reused.
pub struct CachedSource {
    inner: std::sync::Arc<dyn DeviceSource>,
    ttl: std::time::Duration,
    last: std::sync::Mutex<Option<(std::time::Instant, Inventory)>>,
}

impl CachedSource {
    /// Caches `inner`'s reads for `ttl`.
    pub fn new(inner: std::sync::Arc<dyn DeviceSource>, ttl: std::time::Duration) -> Self {
        Self { inner, ttl, last: std::sync::Mutex::new(None) }
    }
}

impl DeviceSource for CachedSource {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        if let Ok(last) = self.last.lock()
            && let Some((at, inventory)) = last.as_ref()
            && at.elapsed() < self.ttl
        {
            return Ok(inventory.clone());
        }
        let fresh = self.inner.inventory()?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some((std::time::Instant::now(), fresh.clone()));
        }
        Ok(fresh)
    }
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

#[cfg(test)]
mod cache_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    struct Counting(AtomicUsize);

    impl DeviceSource for Counting {
        fn inventory(&self) -> Result<Inventory, DiscoveryError> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            if n == 1 {
                return Err(DiscoveryError::NvmlUnavailable("flaky".into()));
            }
            mock::MockSource::new("n1", mock::parse_spec("1xTesla T4:15Gi").unwrap()).inventory()
        }
    }

    #[test]
    fn reuses_reads_within_ttl_and_never_errors() {
        let inner = Arc::new(Counting(AtomicUsize::new(0)));
        let cached = CachedSource::new(inner.clone(), Duration::from_secs(60));
        cached.inventory().unwrap();
        cached.inventory().unwrap();
        assert_eq!(inner.0.load(Ordering::SeqCst), 1, "the second read came from the cache");
        let expired = CachedSource::new(inner.clone(), Duration::ZERO);
        assert!(expired.inventory().is_err(), "a failing read is passed on");
        expired.inventory().unwrap();
        assert!(expired.inventory().is_ok());
    }
}
