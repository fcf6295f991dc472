//! Test support for vgpu-dra's end-to-end tests: real etcd, kube-apiserver, kube-scheduler and
//! kube-controller-manager on loopback, built from the Go module proxy by `integration/k8s/`.
//!
//! Fixtures are builders that bring up what a test needs and tear it down on drop, also when the
//! test panics (then the components' logs are printed). Every wait has a deadline; the patience of
//! [`eventually`] scales with `VGPU_DRA_TEST_PATIENCE` (a factor, default 1) for slow machines.

mod components;
mod control_plane;
mod driver;
pub mod image;
mod kubelet_sim;
pub mod kueue;
pub mod node;
pub mod pki;
pub mod pod_network;
mod process;
pub mod volcano;
mod webhook_tls;

pub use components::{Components, VolcanoComponents, components, kubernetes_minor, kubernetes_version};
pub use control_plane::{ControlPlane, FrozenApiServer, Kubectl, PlaneOptions, WEBHOOK_CLIENT_NAME, write_kubeconfig};
pub use driver::{driver_binary, node_host_dir, plugin_dir, start_driver, start_driver_as};
pub use kubelet_sim::{KubeletSim, KubeletSimOptions};
pub use process::{ManagedProcess, free_port, http_get};

use std::time::{Duration, Instant};

/// The factor applied to every timeout, from `VGPU_DRA_TEST_PATIENCE`.
pub fn patience() -> f64 {
    std::env::var("VGPU_DRA_TEST_PATIENCE").ok().and_then(|v| v.parse().ok()).filter(|f: &f64| *f > 0.0).unwrap_or(1.0)
}

/// Retries `check` every 100 ms until it returns `Some` or `timeout` (scaled by [`patience`]) passes.
///
/// # Errors
/// The last error `check` reported, with what was awaited.
pub fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> anyhow::Result<Option<T>>) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout.mul_f64(patience());
    let mut last = None;
    loop {
        match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = Some(e),
        }
        if Instant::now() > deadline {
            let why = last.map_or_else(|| "condition never held".to_owned(), |e| format!("{e:#}"));
            anyhow::bail!("timed out after {timeout:?} waiting for {what}: {why}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
