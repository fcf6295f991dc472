//! Kueue's controller manager on the test bed (`integration/k8s/kueue-manager`), installed as a
//! cluster has it: its CRDs, its admission webhooks called by the API server over TLS, and a
//! Configuration file. The test bed has no Service networking, so the webhooks of the same
//! release are registered by URL (`https://127.0.0.1:<port>/<path>`) under a CA made for the run,
//! and Kueue's own certificate management is off. Only the webhooks this manager serves are
//! registered: Kueue's own kinds and batch/v1 Jobs.
//!
//! Two releases are built from one source: v0.18 ([`Kueue::start`]) and v0.19
//! ([`Kueue::start_version`] with [`KueueVersion::V019`]), whose manager can count a claim
//! template's consumable capacity (`KueueDRAIntegrationConsumableCapacity`). Each start installs
//! the CRDs of the release it runs.
//!
//! Kueue admits a Job by unsuspending it; the pods are then made by kube-controller-manager's Job
//! controller, which [`Kueue::start`] runs beside the plane's controller manager (whose
//! `--controllers` list has none).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use crate::webhook_tls::{base64, make_certificates, path_str};
use crate::{ControlPlane, Kubectl, ManagedProcess, eventually, free_port, http_get};

/// The API groups whose webhooks the manager serves (its linked integrations: batch/v1 Job).
const SERVED_GROUPS: [&str; 2] = ["kueue.x-k8s.io", "batch"];

/// Which Kueue release's manager to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KueueVersion {
    /// v0.18.1, the release of source document 003.
    V018,
    /// v0.19.2: adds consumable-capacity quotas for DRA claims (alpha).
    V019,
}

/// Feature gates that only v0.19 knows: a Configuration naming one needs [`KueueVersion::V019`].
const V019_GATES: [&str; 1] = ["KueueDRAIntegrationConsumableCapacity"];

impl KueueVersion {
    /// The release a manager Configuration needs: v0.19 when it names a gate v0.18 does not
    /// know (`KueueDRAIntegrationConsumableCapacity`), else v0.18.
    #[must_use]
    pub fn for_configuration(configuration: &str) -> Self {
        if V019_GATES.iter().any(|gate| configuration.contains(gate)) { Self::V019 } else { Self::V018 }
    }

    /// The manager binary of this release.
    fn manager(self, bins: &crate::Components) -> &Path {
        match self {
            Self::V018 => &bins.kueue_manager,
            Self::V019 => &bins.kueue_manager_v0_19,
        }
    }
}

/// A running Kueue; dropping it stops the manager and the Job controller.
pub struct Kueue {
    manager: ManagedProcess,
    job_controller: ManagedProcess,
    config: PathBuf,
    health_port: u16,
    metrics_port: u16,
}

impl Kueue {
    /// Installs Kueue v0.18's CRDs and webhooks on `plane` and starts its manager with
    /// `configuration`, a manager Configuration (`config.kueue.x-k8s.io/v1beta2`) as a user
    /// writes it. The test bed adds its own top-level keys, which `configuration` must therefore
    /// not set: `health`, `metrics`, `webhook`, `leaderElection`, `internalCertManagement`.
    /// Returns once the API server calls Kueue's Job webhook.
    ///
    /// # Errors
    /// When a step of the install fails or the manager does not come up (its log is quoted).
    pub fn start(plane: &ControlPlane, configuration: &str) -> anyhow::Result<Self> {
        Self::start_version(plane, configuration, KueueVersion::V018)
    }

    /// As [`Kueue::start`], with the manager, CRDs and webhooks of release `version`.
    ///
    /// # Errors
    /// When a step of the install fails or the manager does not come up (its log is quoted).
    pub fn start_version(plane: &ControlPlane, configuration: &str, version: KueueVersion) -> anyhow::Result<Self> {
        let bins = plane.components();
        let binary = version.manager(bins);
        let kubectl = plane.kubectl();
        let dir = plane.dir().join("kueue");
        std::fs::create_dir_all(&dir)?;
        kubectl.run(&["apply", "--server-side", "--force-conflicts", "-f", path_str(&binary.with_file_name("crds"))?])?;
        kubectl.wait_crds_established(Duration::from_secs(60))?;
        if kubectl.run(&["get", "namespace", "kueue-system", "-o", "name"]).is_err() {
            kubectl.run(&["create", "namespace", "kueue-system"])?;
        }

        let ca = make_certificates(&dir, "kueue-test-ca")?;
        let (webhook_port, health_port, metrics_port) = (free_port()?, free_port()?, free_port()?);
        let webhooks = binary.with_file_name("webhooks.yaml");
        register_webhooks(kubectl, &webhooks, webhook_port, &ca)?;

        let config = dir.join("config.yaml");
        let text = format!(
            "{}\nhealth:\n  healthProbeBindAddress: 127.0.0.1:{health_port}\nmetrics:\n  bindAddress: 127.0.0.1:{metrics_port}\n\
webhook:\n  port: {webhook_port}\n  host: 127.0.0.1\n  certDir: {}\nleaderElection:\n  leaderElect: false\n\
internalCertManagement:\n  enable: false\n",
            configuration.trim_end(),
            dir.display()
        );
        std::fs::write(&config, text)?;
        let kc = format!("--kubeconfig={}", plane.kubeconfig().display());
        let job_controller = ManagedProcess::spawn(
            "kube-controller-manager-jobs",
            &bins.kube_controller_manager,
            &[kc.clone(), "--leader-elect=false".into(), "--secure-port=0".into(), "--controllers=job-controller".into()],
            plane.dir(),
        )?;
        let manager = ManagedProcess::spawn(
            "kueue-manager",
            binary,
            &[kc, format!("--config={}", config.display()), "--zap-log-level=2".into()],
            plane.dir(),
        )?;
        let mut kueue = Self { manager, job_controller, config, health_port, metrics_port };
        kueue.wait_serving(kubectl)?;
        Ok(kueue)
    }

    /// Waits until the manager reports ready and the API server calls its Job webhook: a
    /// server-side dry run of a queued Job comes back suspended.
    fn wait_serving(&mut self, kubectl: &Kubectl) -> anyhow::Result<()> {
        let port = self.health_port;
        eventually("kueue-manager ready", Duration::from_secs(90), || {
            self.check_running()?;
            Ok(http_get(port, "/readyz").ok().filter(|body| body.contains("200 OK")).map(|_| ()))
        })?;
        let probe = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: kueue-probe, namespace: default, labels: {kueue.x-k8s.io/queue-name: probe}}\n\
spec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: registry.invalid/none}]\n";
        eventually("the API server calling Kueue's Job webhook", Duration::from_secs(60), || {
            self.check_running()?;
            let out = kubectl.run_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(probe))?;
            let job: Value = serde_json::from_str(&out)?;
            Ok((job["spec"]["suspend"] == true).then_some(()))
        })
    }

    /// Fails when the manager or the Job controller has exited, quoting its log.
    ///
    /// # Errors
    /// When either process is no longer running.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.manager.check_running()?;
        self.job_controller.check_running()
    }

    /// The manager's log file.
    pub fn log(&self) -> &Path {
        self.manager.log()
    }

    /// The Configuration file the manager runs with (the user's and the test bed's keys).
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// The manager's Prometheus metrics (plain HTTP on loopback).
    ///
    /// # Errors
    /// When the metrics server does not answer.
    pub fn metrics(&self) -> anyhow::Result<String> {
        http_get(self.metrics_port, "/metrics")
    }
}

/// Registers the webhooks of Kueue's release (`manifests`) that the manager serves, each called
/// at `https://127.0.0.1:<port><path>` and trusted through `ca_pem`.
fn register_webhooks(kubectl: &Kubectl, manifests: &Path, port: u16, ca_pem: &str) -> anyhow::Result<()> {
    let out = kubectl.run(&["create", "--dry-run=client", "-o", "json", "-f", path_str(manifests)?])?;
    // One JSON object per YAML document.
    let items: Vec<Value> =
        serde_json::Deserializer::from_str(&out).into_iter().collect::<Result<_, _>>().context("kubectl printed no JSON")?;
    let ca_bundle = base64(ca_pem.as_bytes());
    let mut configs = Vec::new();
    for mut item in items {
        let kind = item["kind"].as_str().unwrap_or_default().to_owned();
        let webhooks = item["webhooks"].as_array().cloned().unwrap_or_default();
        let served: Vec<Value> = webhooks
            .into_iter()
            .filter(|w| {
                w["rules"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|r| r["apiGroups"].as_array().cloned().unwrap_or_default())
                    .all(|g| g.as_str().is_some_and(|g| SERVED_GROUPS.contains(&g)))
            })
            .map(|mut w| {
                let path = w["clientConfig"]["service"]["path"].as_str().unwrap_or("/").to_owned();
                w["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle});
                w
            })
            .collect();
        anyhow::ensure!(!served.is_empty(), "{}: no {kind} for Kueue's kinds or batch", manifests.display());
        item["webhooks"] = Value::Array(served);
        // The names a kustomize install of Kueue gives them.
        item["metadata"] = json!({"name": format!("kueue-{}", item["metadata"]["name"].as_str().unwrap_or(&kind))});
        configs.push(item);
    }
    kubectl.apply(&serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": configs}))?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::KueueVersion;

    #[test]
    fn a_configuration_naming_a_v0_19_gate_needs_v0_19() {
        let gate = "featureGates:\n  KueueDRAIntegrationConsumableCapacity: true\n";
        assert_eq!(KueueVersion::for_configuration(gate), KueueVersion::V019);
        assert_eq!(KueueVersion::for_configuration("integrations:\n  frameworks: [batch/job]\n"), KueueVersion::V018);
    }
}
