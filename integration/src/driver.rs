//! The vgpu-dra binary as a test runs it: built once per test process, started as a managed
//! child against a control plane.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

use crate::{ControlPlane, ManagedProcess};

/// The `vgpu-dra` binary, built (or found up to date) by cargo once per test process.
///
/// # Errors
/// When the build fails.
pub fn driver_binary() -> anyhow::Result<&'static Path> {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let dir = bin_dir()?;
    Ok(BIN.get_or_init(|| dir.join("vgpu-dra")))
}

/// The directory holding `kubectl-vgpu` (and `vgpu-dra`), built once per test process: on
/// PATH, kubectl runs the plugin as `kubectl vgpu`.
///
/// # Errors
/// When the plugin cannot be built.
pub fn plugin_dir() -> anyhow::Result<&'static Path> {
    bin_dir()
}

/// Builds every binary of the workspace (debug) once per test process and returns the directory
/// cargo puts them in. One `--workspace` build for all of them: a `-p` build per package would
/// resolve features per package and write another copy of the shared dependencies for each.
fn bin_dir() -> anyhow::Result<&'static Path> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| build_bins().map_err(|e| format!("{e:#}")))
        .as_deref()
        .map_err(|e| anyhow::anyhow!("building the workspace's binaries: {e}"))
}

fn build_bins() -> anyhow::Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "-q", "--workspace", "--bins"])
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo build --workspace --bins failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    Ok(target.join("debug"))
}

/// The stand-in for `node`'s host file system that [`start_driver`] points a driver at unless told
/// otherwise: `kubelet/`, `cdi/`, `vgpu/` and `vgpulock/` under it.
pub fn node_host_dir(plane: &ControlPlane, node: &str) -> PathBuf {
    plane.dir().join(format!("host-{node}"))
}

/// Starts `vgpu-dra kubelet-plugin` for `node` against `plane` with extra `args`; logs go to
/// `<plane dir>/<name>.log` and are printed if the test fails.
///
/// # Errors
/// When the binary cannot be built or started.
pub fn start_driver(plane: &ControlPlane, name: &str, node: &str, args: &[&str]) -> anyhow::Result<ManagedProcess> {
    start_driver_as(plane, plane.kubeconfig(), name, node, args)
}

/// [`start_driver`] with another identity: `kubeconfig` instead of the plane's admin one (for
/// example a service-account token, to test what the chart's RBAC allows).
///
/// # Errors
/// When the binary cannot be built or started.
pub fn start_driver_as(
    plane: &ControlPlane,
    kubeconfig: &Path,
    name: &str,
    node: &str,
    args: &[&str],
) -> anyhow::Result<ManagedProcess> {
    let mut full = vec![
        "kubelet-plugin".to_owned(),
        format!("--node-name={node}"),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--inventory-poll-ms=200".to_owned(),
    ];
    full.extend(args.iter().map(|a| (*a).to_owned()));
    // Several drivers run at once in tests: never the fixed default port, and never the host's
    // kubelet, CDI or HAMi-core directories.
    let own = node_host_dir(plane, node);
    for (flag, default) in [
        ("--metrics-address", "127.0.0.1:0".to_owned()),
        ("--kubelet-dir", own.join("kubelet").display().to_string()),
        ("--cdi-dir", own.join("cdi").display().to_string()),
        ("--hami-core-dir", own.join("vgpu").display().to_string()),
        ("--lock-dir", own.join("vgpulock").display().to_string()),
    ] {
        if !args.iter().any(|a| a.starts_with(flag)) {
            full.push(format!("{flag}={default}"));
        }
    }
    ManagedProcess::spawn(name, driver_binary()?, &full, plane.dir())
}
