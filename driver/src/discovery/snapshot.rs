//! The device loop's latest inventory, shared over a watch channel: readers get the last complete
//! read at the cost of a clone, never I/O, so they may read on runtime threads and under locks.

use std::time::Duration;

use tokio::sync::watch;
use vgpu_scheduling::Inventory;

use super::source::{DeviceSource, DiscoveryError};

/// A [`DeviceSource`] answering with the latest snapshot; `None` in the channel until the first
/// read completes.
#[derive(Debug, Clone)]
pub struct SnapshotSource {
    snapshots: watch::Receiver<Option<Inventory>>,
}

impl SnapshotSource {
    /// A source over `snapshots` (from [`super::device_loop::DeviceLoop::source`], or a test's own channel).
    pub fn new(snapshots: watch::Receiver<Option<Inventory>>) -> Self {
        Self { snapshots }
    }

    /// A receiver of the snapshots, for tasks that act on every change (`changed()`).
    pub fn subscribe(&self) -> watch::Receiver<Option<Inventory>> {
        self.snapshots.clone()
    }

    /// Waits until a first snapshot exists, at most `timeout`.
    ///
    /// # Errors
    /// [`DiscoveryError::NoSnapshot`] when none came in time or the loop has stopped.
    pub async fn first(&self, timeout: Duration) -> Result<(), DiscoveryError> {
        let mut snapshots = self.snapshots.clone();
        match tokio::time::timeout(timeout, async move { snapshots.wait_for(Option::is_some).await.is_ok() }).await {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => Err(DiscoveryError::NoSnapshot),
        }
    }
}

impl DeviceSource for SnapshotSource {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        self.snapshots.borrow().clone().ok_or(DiscoveryError::NoSnapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::mock::{MockSource, parse_spec};

    #[tokio::test]
    async fn answers_the_latest_snapshot_and_errors_before_the_first() {
        let (tx, rx) = watch::channel(None);
        let source = SnapshotSource::new(rx);
        assert!(matches!(source.inventory(), Err(DiscoveryError::NoSnapshot)));
        assert!(source.first(Duration::from_millis(20)).await.is_err(), "no snapshot yet");

        let mut inventory = MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()).inventory().unwrap();
        let waiting = tokio::spawn({
            let source = source.clone();
            async move { source.first(Duration::from_secs(5)).await }
        });
        tx.send_replace(Some(inventory.clone()));
        waiting.await.unwrap().unwrap();
        assert_eq!(source.inventory().unwrap(), inventory);

        inventory.gpus.pop();
        tx.send_replace(Some(inventory.clone()));
        assert_eq!(source.inventory().unwrap().gpus.len(), 1, "always the latest");
        assert_eq!(source.cards().unwrap().indices, [0], "per-card reads come from the snapshot too");
        assert!(matches!(source.card(1), Err(DiscoveryError::NoSuchCard { index: 1 })));
    }
}
