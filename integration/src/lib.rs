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
pub use process::{Exited, ManagedProcess, free_port, http_get};

use std::time::{Duration, Instant};

/// The factor applied to every timeout, from `VGPU_DRA_TEST_PATIENCE`.
pub fn patience() -> f64 {
    std::env::var("VGPU_DRA_TEST_PATIENCE").ok().and_then(|v| v.parse().ok()).filter(|f: &f64| *f > 0.0).unwrap_or(1.0)
}

/// Retries `check` every 100 ms until it returns `Some` or `timeout` (scaled by [`patience`]) passes.
/// An error that holds [`Exited`] ends the wait at once: the process it names cannot come back.
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
            Err(e) if e.chain().any(|cause| cause.is::<Exited>()) => return Err(e.context(format!("while waiting for {what}"))),
            Err(e) => last = Some(e),
        }
        if Instant::now() > deadline {
            let why = last.map_or_else(|| "condition never held".to_owned(), |e| format!("{e:#}"));
            anyhow::bail!("timed out after {timeout:?} waiting for {what}: {why}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_process_that_exited_ends_the_wait_at_once() {
        let dir = tempfile::tempdir().unwrap();
        // Polled as running until it exits; from then on no retry may follow.
        let mut gone = ManagedProcess::spawn("gone", Path::new("true"), &[], dir.path()).unwrap();
        let start = Instant::now();
        let err = eventually("nothing", Duration::from_secs(30), || {
            gone.check_running()?;
            Ok(None::<()>)
        })
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(10), "waited {:?}", start.elapsed());
        let text = format!("{err:#}");
        assert!(text.contains("while waiting for nothing") && text.contains("gone exited with"), "{text}");
    }

    #[test]
    fn other_errors_are_retried_until_the_check_holds() {
        let mut tries = 0;
        let got = eventually("the third try", Duration::from_secs(30), || {
            tries += 1;
            anyhow::ensure!(tries >= 3, "try {tries} failed");
            Ok(Some(tries))
        })
        .unwrap();
        assert_eq!(got, 3);
    }
}
