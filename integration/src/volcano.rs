//! Volcano on the test bed, installed as its release's manifest (`installer/volcano-development.yaml`)
//! installs it: its CRDs, `vc-controller-manager`, `vc-scheduler` with a scheduler configuration,
//! and `vc-webhook-manager` with the admission webhooks that manifest registers and enables. The
//! test bed has no Service networking, so the webhooks are registered by URL
//! (`https://127.0.0.1:<port>/<path>`) under a CA made for the run; the webhook manager then finds
//! them by their names, as in a cluster, and checks their CA bundle.
//!
//! The scheduler runs with [`DRA_SCHEDULER_CONF`] unless told otherwise: Volcano's default tiers
//! with the `predicates` plugin allocating DRA claims and the `capacity` plugin (instead of
//! `proportion`) counting them against queue capabilities, and with the Kubernetes feature gate
//! its scheduling library needs for consumable capacity (alpha, off by default, in the
//! Kubernetes release Volcano links).
//!
//! The `default` queue is made by the scheduler when it starts and opened by the controller
//! manager; [`Volcano::start`] returns once it is open and the API server calls the webhooks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use crate::webhook_tls::{base64, make_certificates, path_str};
use crate::{ControlPlane, Kubectl, ManagedProcess, VolcanoComponents, eventually, free_port};

/// The scheduler configuration for DRA: Volcano's default actions and tiers (from its install
/// manifest's `volcano-scheduler-configmap`), with
/// - `predicates` allocating claims (`predicate.DynamicResourceAllocationEnable`), through the
///   scheduler framework's DRA plugin;
/// - `capacity` in place of `proportion` (the two divide queues two ways and are not used
///   together), counting DRA requests against a queue's `capability`
///   (`capacity.DynamicResourceAllocationEnable`) by device count (`deviceclass/<class>`) and by
///   consumable capacity (`capacity.DRAConsumableCapacityEnable`, `<name>.deviceclass/<class>`).
pub const DRA_SCHEDULER_CONF: &str = r#"actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
    enablePreemptable: false
  - name: predicates
    arguments:
      predicate.DynamicResourceAllocationEnable: true
  - name: capacity
    arguments:
      capacity.DynamicResourceAllocationEnable: true
      capacity.DRAConsumableCapacityEnable: true
  - name: nodeorder
  - name: binpack
"#;

/// Kubernetes feature gates for `vc-scheduler`. Volcano v1.15 links the Kubernetes 1.35 scheduler
/// framework, where `DRAConsumableCapacity` (beta, on, in the 1.36 test bed) is alpha and off:
/// without it the DRA plugin ignores capacity requests and `allowMultipleAllocations`, and
/// Volcano's cache counts no capacity against queues. `DRADeviceTaints` stays off: with it the
/// 1.35 framework waits for an informer of `resource.k8s.io/v1alpha3` DeviceTaintRules, a version
/// the 1.36 API server does not serve, and never schedules; so vc-scheduler does not see the
/// taints the driver puts on unhealthy cards.
pub const SCHEDULER_FEATURE_GATES: &str = "DRAConsumableCapacity=true";

/// How to start [`Volcano`].
#[derive(Debug, Clone)]
pub struct VolcanoOptions {
    /// The scheduler configuration (`--scheduler-conf`), as a `volcano-scheduler.conf` reads.
    pub scheduler_conf: String,
    /// `vc-scheduler --feature-gates`.
    pub scheduler_feature_gates: String,
}

impl Default for VolcanoOptions {
    fn default() -> Self {
        Self { scheduler_conf: DRA_SCHEDULER_CONF.to_owned(), scheduler_feature_gates: SCHEDULER_FEATURE_GATES.to_owned() }
    }
}

/// A running Volcano; dropping it stops its three processes.
pub struct Volcano {
    scheduler: ManagedProcess,
    controller_manager: ManagedProcess,
    webhook_manager: ManagedProcess,
    scheduler_conf: PathBuf,
}

impl Volcano {
    /// Installs Volcano on `plane` (CRDs, webhooks) and starts its controller manager, scheduler
    /// and webhook manager. Returns once the `default` queue is open and the API server calls
    /// Volcano's Job webhook.
    ///
    /// # Errors
    /// When Volcano was not built (the reason is quoted), a step of the install fails or a
    /// component does not come up in time (its log is quoted).
    pub fn start(plane: &ControlPlane, options: &VolcanoOptions) -> anyhow::Result<Self> {
        let bins = plane.components().volcano.as_ref().map_err(|why| anyhow::anyhow!("{why}"))?;
        let kubectl = plane.kubectl();
        let dir = plane.dir().join("volcano");
        std::fs::create_dir_all(&dir)?;
        let crds = &plane.components().volcano_crds;
        kubectl.run(&["apply", "--server-side", "--force-conflicts", "-f", path_str(crds)?])?;
        kubectl.wait_crds_established(Duration::from_secs(60))?;
        if kubectl.run(&["get", "namespace", "volcano-system", "-o", "name"]).is_err() {
            kubectl.run(&["create", "namespace", "volcano-system"])?;
        }

        let manifest = Manifest::read(kubectl, bins)?;
        let ca = make_certificates(&dir, "volcano-test-ca")?;
        let webhook_port = free_port()?;
        let admissions = manifest.enabled_admissions()?;
        manifest.register_webhooks(kubectl, &admissions, webhook_port, &ca)?;

        let scheduler_conf = dir.join("volcano-scheduler.conf");
        std::fs::write(&scheduler_conf, &options.scheduler_conf)?;
        let kc = format!("--kubeconfig={}", plane.kubeconfig().display());
        let file = |name: &str| dir.join(name).display().to_string();
        let controller_manager = ManagedProcess::spawn(
            "vc-controller-manager",
            &bins.controller_manager,
            &[
                kc.clone(),
                "--logtostderr".into(),
                "--leader-elect=false".into(),
                "--enable-healthz=true".into(),
                format!("--healthz-address=127.0.0.1:{}", free_port()?),
                "-v=4".into(),
            ],
            plane.dir(),
        )?;
        let scheduler = ManagedProcess::spawn(
            "vc-scheduler",
            &bins.scheduler,
            &[
                kc.clone(),
                "--logtostderr".into(),
                format!("--scheduler-conf={}", scheduler_conf.display()),
                "--leader-elect=false".into(),
                "--schedule-period=1s".into(),
                "--enable-healthz=true".into(),
                format!("--healthz-address=127.0.0.1:{}", free_port()?),
                format!("--feature-gates={}", options.scheduler_feature_gates),
                "-v=4".into(),
            ],
            plane.dir(),
        )?;
        let webhook_manager = ManagedProcess::spawn(
            "vc-webhook-manager",
            &bins.webhook_manager,
            &[
                kc,
                "--logtostderr".into(),
                format!("--enabled-admission={}", admissions.join(",")),
                format!("--tls-cert-file={}", file("tls.crt")),
                format!("--tls-private-key-file={}", file("tls.key")),
                format!("--ca-cert-file={}", file("ca.crt")),
                format!("--webhook-url=https://127.0.0.1:{webhook_port}"),
                "--listen-address=127.0.0.1".into(),
                format!("--port={webhook_port}"),
                "-v=4".into(),
            ],
            plane.dir(),
        )?;
        let mut volcano = Self { scheduler, controller_manager, webhook_manager, scheduler_conf };
        volcano.wait_serving(kubectl)?;
        Ok(volcano)
    }

    /// Waits until the `default` queue is open (made by the scheduler, opened by the controller
    /// manager) and the API server calls Volcano's Job webhook: a server-side dry run of a Job that
    /// names no queue comes back with the default one.
    fn wait_serving(&mut self, kubectl: &Kubectl) -> anyhow::Result<()> {
        eventually("Volcano's default queue open", Duration::from_secs(90), || {
            self.check_running()?;
            let queue = kubectl.get_json(&["queues.scheduling.volcano.sh", "default"])?;
            Ok((queue["status"]["state"] == "Open").then_some(()))
        })?;
        let probe = "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: volcano-probe, namespace: default}\n\
spec:\n  minAvailable: 1\n  tasks:\n  - name: probe\n    replicas: 1\n    template:\n      spec:\n        restartPolicy: Never\n        containers: [{name: c, image: registry.invalid/none}]\n";
        eventually("the API server calling Volcano's Job webhook", Duration::from_secs(60), || {
            self.check_running()?;
            let out = kubectl.run_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(probe))?;
            let job: Value = serde_json::from_str(&out)?;
            Ok((job["spec"]["queue"] == "default" && job["spec"]["schedulerName"] == "volcano").then_some(()))
        })
    }

    /// Fails when a Volcano process has exited, quoting its log.
    ///
    /// # Errors
    /// When any of the three is no longer running.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.scheduler.check_running()?;
        self.controller_manager.check_running()?;
        self.webhook_manager.check_running()
    }

    /// The logs of the scheduler, the controller manager and the webhook manager.
    pub fn logs(&self) -> [&Path; 3] {
        [self.scheduler.log(), self.controller_manager.log(), self.webhook_manager.log()]
    }

    /// The scheduler configuration file in use.
    pub fn scheduler_conf(&self) -> &Path {
        &self.scheduler_conf
    }
}

/// The objects of Volcano's install manifest, as the API server reads them.
struct Manifest {
    items: Vec<Value>,
    path: PathBuf,
}

impl Manifest {
    fn read(kubectl: &Kubectl, bins: &VolcanoComponents) -> anyhow::Result<Self> {
        let path = bins.install_manifest();
        let out = kubectl.run(&["create", "--dry-run=client", "-o", "json", "-f", path_str(&path)?])?;
        // One JSON object per YAML document.
        let items = serde_json::Deserializer::from_str(&out)
            .into_iter()
            .collect::<Result<_, _>>()
            .with_context(|| format!("kubectl printed no JSON for {}", path.display()))?;
        Ok(Self { items, path })
    }

    /// The admission paths the manifest's `vc-webhook-manager` Deployment enables
    /// (`--enabled-admission`); the webhook manager waits for a registration of each.
    fn enabled_admissions(&self) -> anyhow::Result<Vec<String>> {
        let deployment = self
            .items
            .iter()
            .find(|i| i["kind"] == "Deployment" && i["metadata"]["name"].as_str().is_some_and(|n| n.contains("admission")))
            .with_context(|| format!("{}: no admission Deployment", self.path.display()))?;
        let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array().cloned().unwrap_or_default();
        let list = args
            .iter()
            .filter_map(Value::as_str)
            .find_map(|a| a.strip_prefix("--enabled-admission="))
            .with_context(|| format!("{}: the admission Deployment has no --enabled-admission", self.path.display()))?;
        Ok(list.split(',').map(str::to_owned).collect())
    }

    /// Registers the manifest's webhook configurations for the `admissions` paths, each webhook
    /// called at `https://127.0.0.1:<port><path>` and trusted through `ca_pem`.
    fn register_webhooks(&self, kubectl: &Kubectl, admissions: &[String], port: u16, ca_pem: &str) -> anyhow::Result<()> {
        let ca_bundle = base64(ca_pem.as_bytes());
        let mut configs = Vec::new();
        for item in &self.items {
            let kind = item["kind"].as_str().unwrap_or_default();
            if kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
                continue;
            }
            let mut item = item.clone();
            let mut webhooks = item["webhooks"].as_array().cloned().unwrap_or_default();
            webhooks.retain(|w| w["clientConfig"]["service"]["path"].as_str().is_some_and(|p| admissions.iter().any(|a| a == p)));
            if webhooks.is_empty() {
                continue;
            }
            for w in &mut webhooks {
                let path = w["clientConfig"]["service"]["path"].as_str().unwrap_or("/").to_owned();
                w["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle});
            }
            item["webhooks"] = Value::Array(webhooks);
            configs.push(item);
        }
        let registered: usize = configs.iter().map(|c| c["webhooks"].as_array().map_or(0, Vec::len)).sum();
        anyhow::ensure!(
            registered == admissions.len(),
            "{}: {registered} webhooks registered for {} enabled admissions {admissions:?}",
            self.path.display(),
            admissions.len()
        );
        kubectl.apply(&serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": configs}))?)?;
        Ok(())
    }
}
