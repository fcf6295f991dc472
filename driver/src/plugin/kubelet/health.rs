//! Device health for the kubelet (`DRAResourceHealth`, v1alpha1 and v1): the complete list of the
//! node's devices, sent at once and again on every change.
//!
//! The list follows the device loop's snapshots ([`follow_snapshots`]), not the API server: a
//! card that fails is reported while the API is unreachable too.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use vgpu_dra_proto::{health_v1, health_v1alpha1};
use vgpu_scheduling::{Health, PublishedDevice, SharingConfig, publish};

use crate::discovery::SnapshotSource;

/// How long the kubelet may trust a report without an update; updates come on change, so this is
/// generous.
const TIMEOUT_SECONDS: i64 = 60;

/// One device's health as last observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealthState {
    /// Device name.
    pub device: String,
    /// Healthy or not.
    pub healthy: bool,
    /// Why, for the kubelet's events.
    pub message: String,
}

/// The health service over a watch of the device list.
#[derive(Clone)]
pub struct HealthService {
    /// Pool (node) name.
    pub pool: String,
    /// The device list, fed by [`follow_snapshots`].
    pub devices: watch::Receiver<Vec<DeviceHealthState>>,
}

/// The health of each of `devices`, as the kubelet is told it.
pub fn device_states(devices: &[PublishedDevice]) -> Vec<DeviceHealthState> {
    devices
        .iter()
        .map(|d| DeviceHealthState {
            device: d.name.to_string(),
            healthy: d.health == Health::Healthy,
            message: if d.health == Health::Healthy { String::new() } else { format!("GPU {} is unhealthy", d.uuid) },
        })
        .collect()
}

/// Keeps `tx` equal to the health of the devices in the latest snapshot until `cancel` fires or
/// the device loop stops; the kubelet's streams are sent only real changes.
pub async fn follow_snapshots(
    snapshots: SnapshotSource,
    config: SharingConfig,
    tx: watch::Sender<Vec<DeviceHealthState>>,
    cancel: CancellationToken,
) {
    let mut changes = snapshots.subscribe();
    loop {
        let states = changes.borrow_and_update().as_ref().map(|inventory| device_states(&publish(inventory, &config)));
        if let Some(states) = states {
            tx.send_if_modified(|current| {
                let changed = *current != states;
                if changed {
                    *current = states;
                }
                changed
            });
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
}

macro_rules! health_service {
    ($version:ident) => {
        #[tonic::async_trait]
        impl $version::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream =
                Pin<Box<dyn Stream<Item = Result<$version::NodeWatchResourcesResponse, Status>> + Send>>;

            async fn node_watch_resources(
                &self,
                _: Request<$version::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let pool = self.pool.clone();
                let stream = WatchStream::new(self.devices.clone()).map(move |list| {
                    let devices = list
                        .iter()
                        .map(|d| $version::DeviceHealth {
                            device: Some($version::DeviceIdentifier { pool_name: pool.clone(), device_name: d.device.clone() }),
                            health: if d.healthy { $version::HealthStatus::Healthy } else { $version::HealthStatus::Unhealthy }
                                as i32,
                            last_updated_time: now(),
                            health_check_timeout_seconds: TIMEOUT_SECONDS,
                            message: d.message.chars().take(1024).collect(),
                        })
                        .collect();
                    Ok($version::NodeWatchResourcesResponse { devices })
                });
                Ok(Response::new(Box::pin(stream)))
            }
        }
    };
}

health_service!(health_v1alpha1);
health_service!(health_v1);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::discovery::DeviceSource;
    use crate::discovery::mock::{MockSource, parse_spec};

    #[tokio::test]
    async fn the_health_list_follows_the_snapshots_without_an_api() {
        let mut inventory = MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()).inventory().unwrap();
        let (snapshot_tx, snapshot_rx) = watch::channel(None);
        let (tx, mut rx) = watch::channel(Vec::new());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(follow_snapshots(SnapshotSource::new(snapshot_rx), SharingConfig::default(), tx, cancel.clone()));

        snapshot_tx.send_replace(Some(inventory.clone()));
        let list = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|l| l.len() == 2)).await.unwrap().unwrap().clone();
        assert!(list.iter().all(|d| d.healthy && d.message.is_empty()), "{list:?}");

        inventory.gpus[1].health = Health::Unhealthy;
        snapshot_tx.send_replace(Some(inventory.clone()));
        let list = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|l| l.iter().any(|d| !d.healthy)))
            .await
            .unwrap()
            .unwrap()
            .clone();
        assert!(list[0].healthy);
        assert_eq!(list[1].message, format!("GPU {} is unhealthy", inventory.gpus[1].uuid));

        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    }
}
