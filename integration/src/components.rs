//! Paths of the Go-built components, from `VGPU_DRA_BIN_<NAME>` (set by `scripts/test.sh`) or by
//! running `integration/k8s/build.sh`, which reuses its cache.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// The binaries the test bed runs.
#[derive(Debug, Clone)]
pub struct Components {
    /// etcd.
    pub etcd: PathBuf,
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// kube-scheduler.
    pub kube_scheduler: PathBuf,
    /// kube-controller-manager.
    pub kube_controller_manager: PathBuf,
    /// kubectl.
    pub kubectl: PathBuf,
    /// helm.
    pub helm: PathBuf,
    /// The kubelet's plugin manager and DRA client, as a command-line peer.
    pub kubelet_sim: PathBuf,
    /// The reference CDI library, as a command-line checker.
    pub cdi_check: PathBuf,
    /// Kueue's own decoder of its manager Configuration.
    pub kueue_check: PathBuf,
    /// The directory of Kueue's CRDs, from the same release.
    pub kueue_crds: PathBuf,
    /// The directory of Volcano's CRDs (batch Jobs, queues, pod groups).
    pub volcano_crds: PathBuf,
    /// Kueue's controller manager (batch/v1 Job integration); its release's webhook
    /// registrations are beside it, in `webhooks.yaml`.
    pub kueue_manager: PathBuf,
    /// Kueue v0.19's controller manager, from the same source; its release's webhook
    /// registrations (`webhooks.yaml`) and CRDs (`crds/`) are beside it.
    pub kueue_manager_v0_19: PathBuf,
    /// Volcano's own scheduler, controller manager and admission webhook server, or why
    /// `build.sh` could not build them (then only the tests that run Volcano fail, with that
    /// reason).
    pub volcano: Result<VolcanoComponents, String>,
}

/// Volcano's binaries, from one release; its install manifest (`volcano-development.yaml`, the
/// source of its webhook registrations and scheduler configuration) is beside them.
#[derive(Debug, Clone)]
pub struct VolcanoComponents {
    /// `vc-scheduler`.
    pub scheduler: PathBuf,
    /// `vc-controller-manager`.
    pub controller_manager: PathBuf,
    /// `vc-webhook-manager`.
    pub webhook_manager: PathBuf,
}

impl VolcanoComponents {
    /// The release's install manifest (`installer/volcano-development.yaml`).
    pub fn install_manifest(&self) -> PathBuf {
        self.scheduler.with_file_name("volcano-development.yaml")
    }
}

/// Volcano's binaries; `build.sh` prints either these or `volcano-unavailable=<why>`.
const VOLCANO_NAMES: [&str; 3] = ["volcano-scheduler", "volcano-controller-manager", "volcano-webhook-manager"];
const VOLCANO_UNAVAILABLE: &str = "volcano-unavailable";

const NAMES: [&str; 13] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
    "helm",
    "kubelet-sim",
    "cdi-check",
    "kueue-check",
    "kueue-crds",
    "volcano-crds",
    "kueue-manager",
    "kueue-manager-v0-19",
];

/// The components, found or built once per test process.
///
/// # Errors
/// When a component is missing and cannot be built; tests fail on it (never skip), so CI notices.
pub fn components() -> anyhow::Result<&'static Components> {
    static FOUND: OnceLock<Result<Components, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| locate().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("test bed components unavailable: {e}"))
}

fn locate() -> anyhow::Result<Components> {
    let from_env =
        |name: &str| std::env::var_os(format!("VGPU_DRA_BIN_{}", name.to_uppercase().replace('-', "_"))).map(PathBuf::from);
    let mut paths: Vec<PathBuf> = NAMES.iter().filter_map(|n| from_env(n)).collect();
    let volcano_found = VOLCANO_NAMES.iter().all(|n| from_env(n).is_some()) || from_env(VOLCANO_UNAVAILABLE).is_some();
    let volcano = if paths.len() == NAMES.len() && volcano_found {
        volcano_from(&from_env)
    } else {
        let printed = build()?;
        let lookup = |name: &str| printed.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).map(PathBuf::from);
        paths = NAMES
            .iter()
            .map(|name| lookup(name).with_context(|| format!("build.sh printed no path for {name}")))
            .collect::<anyhow::Result<_>>()?;
        volcano_from(&lookup)
    };
    for (name, p) in NAMES.iter().zip(&paths) {
        let present = if name.ends_with("-crds") { p.is_dir() } else { p.is_file() };
        if !present {
            bail!("{name}: {} does not exist", p.display());
        }
    }
    let [
        etcd,
        kube_apiserver,
        kube_scheduler,
        kube_controller_manager,
        kubectl,
        helm,
        kubelet_sim,
        cdi_check,
        kueue_check,
        kueue_crds,
        volcano_crds,
        kueue_manager,
        kueue_manager_v0_19,
    ]: [PathBuf; 13] = paths.try_into().map_err(|_| anyhow::anyhow!("wrong number of components"))?;
    Ok(Components {
        etcd,
        kube_apiserver,
        kube_scheduler,
        kube_controller_manager,
        kubectl,
        helm,
        kubelet_sim,
        cdi_check,
        kueue_check,
        kueue_crds,
        volcano_crds,
        kueue_manager,
        kueue_manager_v0_19,
        volcano,
    })
}

/// Volcano's binaries as `lookup` names them, or why there are none.
fn volcano_from(lookup: &dyn Fn(&str) -> Option<PathBuf>) -> Result<VolcanoComponents, String> {
    if let Some(why) = lookup(VOLCANO_UNAVAILABLE) {
        return Err(format!("build.sh could not build Volcano: {}", why.display()));
    }
    let path = |name: &str| {
        let p = lookup(name).ok_or_else(|| format!("build.sh printed no path for {name}"))?;
        if p.is_file() { Ok(p) } else { Err(format!("{name}: {} does not exist", p.display())) }
    };
    Ok(VolcanoComponents {
        scheduler: path(VOLCANO_NAMES[0])?,
        controller_manager: path(VOLCANO_NAMES[1])?,
        webhook_manager: path(VOLCANO_NAMES[2])?,
    })
}

/// Runs `build.sh` and returns what it printed: `NAME=PATH` lines.
fn build() -> anyhow::Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/build.sh");
    let out = Command::new(&script).output().with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed:\n{}", script.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The Kubernetes release the test bed runs, `K8S_VERSION` as `build.sh` reads it (v1.36.3
/// unless set).
pub fn kubernetes_version() -> String {
    std::env::var("K8S_VERSION").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "v1.36.3".to_owned())
}

/// Its minor release (36 for v1.36.3), for what a test must do differently per release.
pub fn kubernetes_minor() -> u32 {
    let version = kubernetes_version();
    version.trim_start_matches('v').split('.').nth(1).and_then(|m| m.parse().ok()).unwrap_or(36)
}
