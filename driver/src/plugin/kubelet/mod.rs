//! The kubelet's side of the plugin: the unix sockets (with the HTTP/2 shim the kubelet's
//! registration client needs), registration, the DRA services and device health. Translation
//! only; the work is in [`super::state`].

pub mod health;
pub mod probe;
pub mod service;
pub mod uds;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use vgpu_dra_proto::registration::registration_server::RegistrationServer;
use vgpu_dra_proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1};

use self::health::HealthService;
use self::service::{CallMetrics, DraService, Registrar};
use super::state::State;

/// The kubelet's directories and our sockets in them, computed once.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `<kubelet-dir>/plugins_registry/<driver>-reg.sock`.
    pub registration_socket: PathBuf,
    /// `<kubelet-dir>/plugins/<driver>/`: service socket and checkpoint.
    pub plugin_dir: PathBuf,
    /// `<plugin_dir>/dra.sock`.
    pub dra_socket: PathBuf,
    /// `<plugin_dir>/checkpoint/`: one record per prepared claim.
    pub checkpoint: PathBuf,
}

impl Paths {
    /// The paths for `driver` under `kubelet_dir`.
    pub fn new(kubelet_dir: &Path, driver: &str) -> Self {
        let plugin_dir = kubelet_dir.join("plugins").join(driver);
        Self {
            registration_socket: kubelet_dir.join("plugins_registry").join(format!("{driver}-reg.sock")),
            dra_socket: plugin_dir.join("dra.sock"),
            checkpoint: plugin_dir.join("checkpoint"),
            plugin_dir,
        }
    }
}

/// Serves the DRA services and then the registration socket until `cancel`; removes the
/// registration socket on the way out so the kubelet sees the plugin leave.
///
/// # Errors
/// When a socket cannot be bound.
pub async fn serve(
    paths: &Paths,
    driver: &str,
    state: Arc<State>,
    health: HealthService,
    registered: Arc<AtomicBool>,
    metrics: Option<CallMetrics>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for dir in [paths.plugin_dir.as_path(), paths.registration_socket.parent().unwrap_or(Path::new("."))] {
        tokio::fs::create_dir_all(dir).await.with_context(|| format!("creating {}", dir.display()))?;
    }
    let dra = uds::bind(&paths.dra_socket).with_context(|| format!("binding {}", paths.dra_socket.display()))?;
    std::fs::set_permissions(&paths.dra_socket, std::fs::Permissions::from_mode(0o750))?;
    let service = DraService { state, metrics };
    let dra_server = tonic::transport::Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(service.clone()))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(service))
        .add_service(health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(health.clone()))
        .add_service(health_v1::dra_resource_health_server::DraResourceHealthServer::new(health))
        .serve_with_incoming_shutdown(dra, cancel.clone().cancelled_owned());
    // Register only once the service answers, so the kubelet's first call finds it.
    let reg =
        uds::bind(&paths.registration_socket).with_context(|| format!("binding {}", paths.registration_socket.display()))?;
    std::fs::set_permissions(&paths.registration_socket, std::fs::Permissions::from_mode(0o750))?;
    let registrar = Registrar { driver: driver.to_owned(), endpoint: paths.dra_socket.display().to_string(), registered };
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registrar))
        .serve_with_incoming_shutdown(reg, cancel.clone().cancelled_owned());
    tracing::info!(registration = %paths.registration_socket.display(), service = %paths.dra_socket.display(), "kubelet plugin sockets bound");
    let result = tokio::try_join!(dra_server, reg_server);
    let _ = std::fs::remove_file(&paths.registration_socket);
    result.map(|_| ()).context("serving the kubelet plugin")
}
