//! Device health for the kubelet (`DRAResourceHealth`, v1alpha1 and v1): the complete list of the
//! node's devices, sent at once and again on every change.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};
use vgpu_dra_proto::{health_v1, health_v1alpha1};

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
    /// The device list, updated by the publisher.
    pub devices: watch::Receiver<Vec<DeviceHealthState>>,
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
