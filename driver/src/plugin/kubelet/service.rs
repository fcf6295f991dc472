//! The kubelet-facing gRPC services: registration, DRA v1 and v1beta1. Translation only; the
//! work is in [`crate::plugin::state`]. Every claim of a batch gets its own answer.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tonic::{Request, Response, Status};
use vgpu_dra_proto::registration::registration_server::Registration;
use vgpu_dra_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use vgpu_dra_proto::{dra_v1, dra_v1beta1, service_names};
use vgpu_scheduling::Uid;

use crate::plugin::claim::ClaimRef;
use crate::plugin::state::{PreparedDevice, State};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{Labels, histogram, labels};

/// Answers the kubelet's plugin watcher.
pub struct Registrar {
    /// The driver name.
    pub driver: String,
    /// The DRA service socket.
    pub endpoint: String,
    /// Set once the kubelet accepted the registration.
    pub registered: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: service_names::PLUGIN_TYPE_DRA.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![
                service_names::DRA_V1.into(),
                service_names::DRA_V1BETA1.into(),
                service_names::HEALTH_V1ALPHA1.into(),
                service_names::HEALTH_V1.into(),
            ],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        self.registered.store(status.plugin_registered, Ordering::SeqCst);
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "the kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The kubelet's calls as the metrics count them.
#[derive(Clone)]
pub struct CallMetrics {
    /// Prepare latency by result (`ok`, `error`).
    pub(crate) prepare_seconds: Family<Labels, Histogram>,
    /// Unprepare latency by result.
    pub(crate) unprepare_seconds: Family<Labels, Histogram>,
    /// Prepare failures by reason.
    pub(crate) prepare_errors: Family<Labels, Counter>,
}

impl CallMetrics {
    /// Registers the families.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            prepare_seconds: Family::new_with_constructor(histogram),
            unprepare_seconds: Family::new_with_constructor(histogram),
            prepare_errors: Family::default(),
        };
        registry.register(
            "vgpu_dra_prepare_duration_seconds",
            "NodePrepareResources latency per claim",
            m.prepare_seconds.clone(),
        );
        registry.register(
            "vgpu_dra_unprepare_duration_seconds",
            "NodeUnprepareResources latency per claim",
            m.unprepare_seconds.clone(),
        );
        registry.register("vgpu_dra_prepare_errors", "Claims whose prepare failed, by reason", m.prepare_errors.clone());
        m
    }

    /// One prepare: its latency, and its reason when it failed.
    pub fn prepared(&self, took: f64, failed: Option<&str>) {
        let result = if failed.is_none() { "ok" } else { "error" };
        self.prepare_seconds.get_or_create(&labels(&[("result", result)])).observe(took);
        if let Some(reason) = failed {
            self.prepare_errors.get_or_create(&labels(&[("reason", reason)])).inc();
        }
    }

    /// One unprepare's latency.
    pub fn unprepared(&self, took: f64, ok: bool) {
        self.unprepare_seconds.get_or_create(&labels(&[("result", if ok { "ok" } else { "error" })])).observe(took);
    }
}

/// The DRA service over [`State`]; it records latencies and errors, the state knows nothing of
/// metrics.
#[derive(Clone)]
pub struct DraService {
    /// Shared state.
    pub state: Arc<State>,
    /// Where prepare and unprepare figures go.
    pub metrics: Option<CallMetrics>,
}

type Answers = HashMap<String, Result<Vec<PreparedDevice>, String>>;

/// Runs `work` on a task of its own, so that it finishes even if the kubelet gives up on the
/// call (whose answer is then dropped); `None` when the runtime cancelled it, as it does when
/// the driver stops. Its panic goes on in the caller.
async fn own_task<T: Send + 'static>(work: impl std::future::Future<Output = T> + Send + 'static) -> Option<T> {
    match tokio::spawn(work).await {
        Ok(output) => Some(output),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}

impl DraService {
    async fn prepare_all(&self, claims: Vec<(String, String, String)>) -> Answers {
        let jobs = claims.into_iter().map(|(namespace, name, uid)| {
            let state = self.state.clone();
            let metrics = self.metrics.clone();
            async move {
                let started = Instant::now();
                // Names are checked before they reach an API path or a file name.
                let result = match ClaimRef::new(&namespace, &name, &uid) {
                    // On a task of its own: a prepare admitted in the ledger finishes making its
                    // files visible (or undoes its admission) even if the kubelet gives up on the
                    // call, whose answer is then dropped; a retry finds it prepared.
                    Ok(claim) => match own_task(async move { state.prepare(&claim).await }).await {
                        Some(result) => result.map_err(|e| (e.reason(), e.chain())),
                        None => Err(("cancelled", "the prepare was cancelled: the driver is stopping".to_owned())),
                    },
                    Err(e) => Err(("invalid_claim", e.to_string())),
                };
                let took = started.elapsed().as_secs_f64();
                if let Some(m) = &metrics {
                    m.prepared(took, result.as_ref().err().map(|(reason, _)| *reason));
                }
                let result = result.map_err(|(_, e)| e);
                let took_ms = took * 1000.0;
                match &result {
                    Ok(devs) => {
                        let devices: Vec<String> = devs.iter().map(|d| format!("{}({})", d.device, d.consumed)).collect();
                        tracing::info!(claim = %format!("{namespace}/{name}"), %uid, ?devices, took_ms, "prepared");
                    }
                    Err(e) => tracing::warn!(claim = %format!("{namespace}/{name}"), %uid, error = %e, took_ms, "prepare failed"),
                }
                (uid, result)
            }
        });
        futures::future::join_all(jobs).await.into_iter().collect()
    }

    async fn unprepare_all(&self, uids: Vec<String>) -> HashMap<String, String> {
        let mut out = HashMap::new();
        for uid in uids {
            let started = Instant::now();
            let error = match Uid::new(uid.clone()) {
                // On a task of its own, as a prepare: it finishes even if the kubelet gives up.
                Ok(u) => {
                    let state = self.state.clone();
                    match own_task(async move { state.unprepare(&u).await }).await {
                        Some(Ok(())) => {
                            tracing::info!(%uid, "unprepared");
                            String::new()
                        }
                        Some(Err(e)) => {
                            tracing::warn!(%uid, error = %e.chain(), "unprepare failed");
                            e.chain()
                        }
                        None => "the unprepare was cancelled: the driver is stopping".to_owned(),
                    }
                }
                // Nothing can have been prepared under an invalid UID.
                Err(_) => String::new(),
            };
            if let Some(m) = &self.metrics {
                m.unprepared(started.elapsed().as_secs_f64(), error.is_empty());
            }
            out.insert(uid, error);
        }
        out
    }
}

/// One implementation per protocol version: the messages differ only in `Device.share_id`.
macro_rules! dra_service {
    ($version:ident, |$d:ident| $device:expr) => {
        #[tonic::async_trait]
        impl $version::dra_plugin_server::DraPlugin for DraService {
            async fn node_prepare_resources(
                &self,
                req: Request<$version::NodePrepareResourcesRequest>,
            ) -> Result<Response<$version::NodePrepareResourcesResponse>, Status> {
                let claims = req.into_inner().claims.into_iter().map(|c| (c.namespace, c.name, c.uid)).collect();
                let claims = self
                    .prepare_all(claims)
                    .await
                    .into_iter()
                    .map(|(uid, r)| {
                        let resp = match r {
                            Ok(devs) => $version::NodePrepareResourceResponse {
                                devices: devs.into_iter().map(|$d| $device).collect(),
                                error: String::new(),
                            },
                            Err(error) => $version::NodePrepareResourceResponse { devices: vec![], error },
                        };
                        (uid, resp)
                    })
                    .collect();
                Ok(Response::new($version::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                req: Request<$version::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$version::NodeUnprepareResourcesResponse>, Status> {
                let uids = req.into_inner().claims.into_iter().map(|c| c.uid).collect();
                let claims = self
                    .unprepare_all(uids)
                    .await
                    .into_iter()
                    .map(|(uid, error)| (uid, $version::NodeUnprepareResourceResponse { error }))
                    .collect();
                Ok(Response::new($version::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_service!(dra_v1, |d| dra_v1::Device {
    request_names: vec![d.request],
    pool_name: d.pool,
    device_name: d.device,
    cdi_device_ids: d.cdi_ids,
    share_id: d.share_id,
});

// v1beta1 predates share IDs; older kubelets simply do not get them.
dra_service!(dra_v1beta1, |d| dra_v1beta1::Device {
    request_names: vec![d.request],
    pool_name: d.pool,
    device_name: d.device,
    cdi_device_ids: d.cdi_ids,
});
