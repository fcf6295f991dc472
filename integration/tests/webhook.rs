//! The HAMi compatibility webhook on the test bed: the real API server calls `vgpu-dra webhook`
//! over TLS; a pod written for HAMi (source document 003, section 3.1) is converted into a claim
//! template, the resource claim controller makes its claim, the real scheduler allocates it and
//! the node driver prepares it with HAMi-core's limits. Bad pods are denied with nothing created,
//! pods without GPUs never reach the webhook, and a deleted pod takes its claim with it.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, ManagedProcess, eventually, free_port};

mod common;

use common::seed_000;
use common::webhook::{self, DEVICE_CLASS};
use common::{Dirs, NODE, cdi_check, claim_response, driver, kubelet};

/// The webhook's own namespace (its Secret lives there; it is never sent to the webhook).
const WEBHOOK_NAMESPACE: &str = "vgpu-dra";

/// The pod of source document 003 section 3.1, unchanged.
const SMOKE_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: hami-compatible-smoke
spec:
  restartPolicy: Never
  containers:
  - name: cuda
    image: nvcr.io/nvidia/cuda:12.6.0-base-ubuntu24.04
    command: ["bash", "-c", "nvidia-smi && sleep 3600"]
    resources:
      limits:
        nvidia.com/gpu: 1
        nvidia.com/gpumem: 4096
        nvidia.com/gpucores: 50
"#;

fn pod_yaml(name: &str, limits: &str, privileged: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers:\n  - name: cuda\n    image: registry.invalid/none\n    securityContext: {{privileged: {privileged}}}\n    resources:\n      limits: {{{limits}}}\n"
    )
}

/// A webhook replica listening on `listen`, registering the URL on port `url_port`, serving
/// metrics on `metrics`.
fn start_webhook_with(
    plane: &ControlPlane,
    name: &str,
    listen: u16,
    url_port: u16,
    metrics: u16,
    extra: &[String],
) -> anyhow::Result<ManagedProcess> {
    let mut flags = vec![format!("--metrics-address=127.0.0.1:{metrics}")];
    flags.extend(extra.iter().cloned());
    webhook::spawn(plane, name, (listen, url_port), WEBHOOK_NAMESPACE, &flags)
}

#[test]
fn hami_pods_run_unchanged_through_the_webhook() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn templates(plane: &ControlPlane) -> anyhow::Result<usize> {
    let list = plane.kubectl().get_json(&["resourceclaimtemplates", "-n", "default"])?;
    Ok(list["items"].as_array().map_or(0, Vec::len))
}

/// The claims in `default` owned by pod `name`.
fn claims_of(plane: &ControlPlane, name: &str) -> anyhow::Result<Vec<Value>> {
    let list = plane.kubectl().get_json(&["resourceclaims", "-n", "default"])?;
    Ok(list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c["metadata"]["ownerReferences"].as_array().is_some_and(|o| o.iter().any(|r| r["kind"] == "Pod" && r["name"] == name))
        })
        .collect())
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    kubectl.apply(DEVICE_CLASS)?;
    kubectl.run(&["create", "namespace", WEBHOOK_NAMESPACE])?;
    let dirs = Dirs::new(plane.dir());
    let mut drv = driver(plane, &dirs, "driver");
    let mut kubelet = kubelet(&dirs);
    eventually("the node's slices", Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceslices"])?;
        Ok(list["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
    })?;

    // Two replicas starting together race to create the certificate Secret.
    // On the plane's webhook port, where the API server presents its client certificate.
    let (port, metrics_port) = (plane.webhook_port(), free_port()?);
    let mut webhook = start_webhook_with(plane, "webhook", port, port, metrics_port, &[])?;
    let mut replica = start_webhook_with(plane, "webhook-replica", free_port()?, port, free_port()?, &[])?;
    // The API server picks the registration up a moment after it is made: a server-side dry run
    // of the pod shows when it calls the webhook (and, dry, creates no template).
    let dry = webhook::wait_called(plane, &mut webhook, SMOKE_POD)?;
    assert_eq!(templates(plane)?, 0, "a dry run created a template: {dry}");
    let config = kubectl.get_json(&["mutatingwebhookconfiguration", "vgpu-dra-webhook"])?;
    assert_eq!(config["webhooks"][0]["failurePolicy"], "Fail");
    let secret = kubectl.get_json(&["secret", "vgpu-dra-webhook-tls", "-n", WEBHOOK_NAMESPACE])?;
    assert_eq!(config["webhooks"][0]["clientConfig"]["caBundle"], secret["data"]["ca.crt"], "one CA for both replicas");
    eventually("the replica registered", Duration::from_secs(30), || {
        replica.check_running()?;
        Ok(std::fs::read_to_string(replica.log())?.contains("admission webhook serving").then_some(()))
    })?;
    let again = kubectl.get_json(&["mutatingwebhookconfiguration", "vgpu-dra-webhook"])?;
    assert_eq!(again["webhooks"][0]["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    replica.stop();

    // 1. The pod of 003 section 3.1, applied unchanged.
    kubectl.run_with_input(&["apply", "-n", "default", "-f", "-"], Some(SMOKE_POD))?;
    let pod = kubectl.get_json(&["pod", "hami-compatible-smoke", "-n", "default"])?;
    let template = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].as_str().unwrap_or_default().to_owned();
    assert!(template.starts_with(vgpu_scheduling::compat::TEMPLATE_PREFIX), "{pod:#}");
    // Its limits were all HAMi's: none are left, not even an empty `limits: {}`.
    assert!(pod["spec"]["containers"][0]["resources"].get("limits").is_none(), "{pod:#}");
    assert_eq!(pod["spec"]["containers"][0]["resources"]["claims"][0]["name"], pod["spec"]["resourceClaims"][0]["name"]);
    kubectl.get_json(&["resourceclaimtemplate", &template, "-n", "default"])?;

    let claim = eventually("the pod's claim", Duration::from_secs(30), || Ok(claims_of(plane, "hami-compatible-smoke")?.pop()))?;
    let claim_name = claim["metadata"]["name"].as_str().unwrap().to_owned();
    let requests = &claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"];
    assert_eq!(requests["cores"], "50", "{claim:#}");
    assert_eq!(requests["memory"], "4294967296", "{claim:#}");
    let result = plane.wait_allocated("default", &claim_name, Duration::from_secs(30))?;
    assert_eq!(result["consumedCapacity"]["cores"], "50", "{result}");
    assert!(matches!(result["consumedCapacity"]["memory"].as_str(), Some("4Gi" | "4294967296")), "{result}");
    let uid = kubectl.run(&["get", "resourceclaim", &claim_name, "-n", "default", "-o", "jsonpath={.metadata.uid}"])?;
    let reply = kubelet.prepare(&[("default", &claim_name, &uid)])?;
    let r = claim_response(&reply, &uid);
    anyhow::ensure!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    let id = r["devices"][0]["cdi_device_ids"][0].as_str().unwrap().to_owned();
    let report = cdi_check(&dirs.cdi, &[&id]);
    let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for want in ["CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT=50"] {
        assert!(env.contains(&want), "{want} missing from {env:?}");
    }

    // 1b. Volcano's names in the same default install (source document 001's pod form): the
    // webhook converts both sets, each with its own names.
    let volcano_pod = SMOKE_POD.replace("hami-compatible-smoke", "volcano-names").replace(
        "nvidia.com/gpu: 1\n        nvidia.com/gpumem: 4096\n        nvidia.com/gpucores: 50",
        "volcano.sh/vgpu-number: 1\n        volcano.sh/vgpu-memory: 1024",
    );
    anyhow::ensure!(volcano_pod.contains("volcano.sh/vgpu-memory"), "{volcano_pod}");
    kubectl.run_with_input(&["apply", "-n", "default", "-f", "-"], Some(&volcano_pod))?;
    let claim = eventually("the Volcano pod's claim", Duration::from_secs(30), || Ok(claims_of(plane, "volcano-names")?.pop()))?;
    let volcano_claim = claim["metadata"]["name"].as_str().unwrap().to_owned();
    plane.wait_allocated("default", &volcano_claim, Duration::from_secs(30))?;
    let volcano_uid =
        kubectl.run(&["get", "resourceclaim", &volcano_claim, "-n", "default", "-o", "jsonpath={.metadata.uid}"])?;
    let reply = kubelet.prepare(&[("default", &volcano_claim, &volcano_uid)])?;
    let r = claim_response(&reply, &volcano_uid);
    anyhow::ensure!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    let report = cdi_check(&dirs.cdi, &[r["devices"][0]["cdi_device_ids"][0].as_str().unwrap()]);
    let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=1024m"), "{env:?}");

    // 2. Bad pods are denied by container and resource, with nothing created.
    for (name, limits, privileged, want) in [
        ("too-much", "nvidia.com/gpumem-percentage: 150", false, "container \"cuda\": nvidia.com/gpumem-percentage: 150"),
        ("privileged", "nvidia.com/gpu: 1", true, "container \"cuda\" is privileged and asks for nvidia.com/gpu"),
    ] {
        let err = kubectl.apply(&pod_yaml(name, limits, privileged)).expect_err(name).to_string();
        assert!(err.contains("denied the request") && err.contains(want), "{err}");
        assert!(kubectl.run(&["get", "pod", name, "-n", "default", "-o", "name"]).is_err());
    }
    assert_eq!(templates(plane)?, 2, "one for each converted shape");
    // A pod without GPUs, with an init container, is never sent (matchConditions): no admission
    // of any outcome besides the three conversions and two denials above is counted.
    let plain = pod_yaml("no-gpu", "cpu: 100m", false).replace(
        "spec:\n",
        "spec:\n  initContainers:\n  - {name: init, image: registry.invalid/none, resources: {limits: {memory: 64Mi}}}\n",
    );
    kubectl.apply(&plain)?;
    let text = webhook::metrics(metrics_port)?;
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with("vgpu_dra_webhook_admissions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 5.0, "{text}");
    for want in [
        // The dry-run probe, the HAMi pod and the Volcano one (the probe converts once: it stops
        // at the first success).
        "vgpu_dra_webhook_admissions_total{outcome=\"converted\"} 3",
        "vgpu_dra_webhook_denials_total{reason=\"privileged\"} 1",
        "vgpu_dra_webhook_denials_total{reason=\"out_of_range\"} 1",
    ] {
        assert!(text.contains(want), "{want} missing from {text}");
    }

    // 4. Deleting the pod deletes its claim (the claim controller owns it to the pod).
    kubelet.unprepare(&[("default", &claim_name, &uid)])?;
    kubectl.run(&["delete", "pod", "hami-compatible-smoke", "-n", "default", "--grace-period=0", "--force"])?;
    eventually("the claim deleted with its pod", Duration::from_secs(60), || {
        Ok(kubectl.run(&["get", "resourceclaim", &claim_name, "-n", "default", "-o", "name"]).is_err().then_some(()))
    })?;

    // 3. With the webhook stopped, pods without GPUs are admitted (matchConditions keep them
    // away); a HAMi pod is refused rather than let through unconverted.
    webhook.stop();
    kubectl.apply(&pod_yaml("plain", "cpu: 100m", false))?;
    let err = kubectl.apply(&pod_yaml("gpu-while-down", "nvidia.com/gpu: 1", false)).expect_err("webhook down").to_string();
    assert!(err.contains("failed calling webhook"), "{err}");
    drv.check_running()?;
    Ok(())
}

/// Volcano's Job CRD, from the Volcano release the test bed pins.
fn install_volcano_job_crd(plane: &ControlPlane) {
    let crd = plane.components().volcano_crds.join("batch.volcano.sh_jobs.yaml");
    plane.kubectl().run(&["apply", "--server-side", "-f", crd.to_str().unwrap()]).unwrap();
    plane.kubectl().wait_crds_established(Duration::from_secs(60)).unwrap();
}

/// Source document 001's device configuration, unchanged, makes the webhook convert Volcano's
/// `volcano.sh/vgpu-*` resources with HAMi's meaning; pods of one shape share one template; a
/// Volcano Job's task templates are converted at the Job's admission, so the pods Volcano makes
/// from them never carry Volcano's vGPU resources.
#[test]
fn volcano_pods_convert_with_the_volcano_device_config() {
    let plane = ControlPlane::start().expect("control plane");
    let kubectl = plane.kubectl().clone();
    plane.create_node(NODE).unwrap();
    kubectl.apply(DEVICE_CLASS).unwrap();
    install_volcano_job_crd(&plane);
    for ns in [WEBHOOK_NAMESPACE, "volcano-demo"] {
        kubectl.run(&["create", "namespace", ns]).unwrap();
    }
    let dirs = Dirs::new(plane.dir());
    let _drv = driver(&plane, &dirs, "driver");
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduling/testdata/volcano-device-config.yaml");
    let port = plane.webhook_port();
    let mut webhook =
        start_webhook_with(&plane, "webhook", port, port, free_port().unwrap(), &[format!("--config={}", config.display())])
            .unwrap();
    webhook::wait_called(&plane, &mut webhook, seed_000::SINGLE).unwrap();
    kubectl.run_with_input(&["apply", "-f", "-"], Some(seed_000::SINGLE)).unwrap();
    let pod = kubectl.get_json(&["pod", "volcano-vgpu-single", "-n", "volcano-demo"]).unwrap();
    let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
    assert!(limits.get("volcano.sh/vgpu-memory").is_none(), "{pod:#}");
    // Volcano's pod requests nothing else: it keeps a cpu request, so Volcano does not take it
    // for a best-effort task (docs/volcano.md).
    assert_eq!(pod["spec"]["containers"][0]["resources"]["requests"], serde_json::json!({"cpu": "1m"}), "{pod:#}");
    let claim = eventually("the pod's claim", Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceclaims", "-n", "volcano-demo"])?;
        Ok(list["items"].get(0).cloned())
    })
    .unwrap();
    let requests = &claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"];
    // 2000 MiB (gpuMemoryFactor 1) and 30 % of the card's cores, as HAMi-core gets them in 000.
    // The API server stores the bytes in its canonical form (`2097152k`): compare amounts.
    let memory = vgpu_scheduling::Quantity::parse(requests["memory"].as_str().unwrap()).unwrap();
    assert_eq!(memory.as_u64_exact(), Some(2000u64 << 20), "{claim:#}");
    assert_eq!(requests["cores"], "30", "{claim:#}");
    // 50 pods of one shape: one template.
    let many: String = (0..50)
        .map(|i| seed_000::SINGLE.replace("name: volcano-vgpu-single", &format!("name: same-shape-{i}")) + "---\n")
        .collect();
    kubectl.run_with_input(&["apply", "-f", "-"], Some(&many)).unwrap();
    let list = kubectl.get_json(&["resourceclaimtemplates", "-n", "volcano-demo"]).unwrap();
    assert_eq!(list["items"].as_array().map_or(0, Vec::len), 1, "{list:#}");

    // The gang Job of 000: its task template references a template of 3000 MiB / 30 cores.
    kubectl.run_with_input(&["apply", "-f", "-"], Some(seed_000::GANG)).unwrap();
    let job = kubectl.get_json(&["jobs.batch.volcano.sh", "vcjob-vgpu-gang", "-n", "volcano-demo"]).unwrap();
    let spec = &job["spec"]["tasks"][0]["template"]["spec"];
    let container = &spec["containers"][0]["resources"];
    assert!(container["limits"].get("volcano.sh/vgpu-memory").is_none(), "{job:#}");
    assert_eq!(container["requests"], serde_json::json!({"cpu": "1m"}), "{job:#}");
    assert_eq!(container["claims"][0]["name"], spec["resourceClaims"][0]["name"], "{job:#}");
    let template_name = spec["resourceClaims"][0]["resourceClaimTemplateName"].as_str().unwrap();
    let template = kubectl.get_json(&["resourceclaimtemplate", template_name, "-n", "volcano-demo"]).unwrap();
    let requests = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"];
    let memory = vgpu_scheduling::Quantity::parse(requests["memory"].as_str().unwrap()).unwrap();
    assert_eq!(memory.as_u64_exact(), Some(3000u64 << 20), "{template:#}");
    assert_eq!(requests["cores"], "30", "{template:#}");
    // Everything else of the Job is as written.
    assert_eq!(job["spec"]["minAvailable"], 2);
    assert_eq!(job["spec"]["tasks"][0]["replicas"], 2);

    // Cores above one card are one card's 100, as HAMi clamps them: every core of the card,
    // asked as the policy's default (no cores amount), so the share has the card alone.
    let many = seed_000::GANG.replace("vcjob-vgpu-gang", "vcjob-many-cores").replace("vgpu-cores: 30", "vgpu-cores: 130");
    kubectl.run_with_input(&["apply", "-f", "-"], Some(&many)).unwrap();
    let job = kubectl.get_json(&["jobs.batch.volcano.sh", "vcjob-many-cores", "-n", "volcano-demo"]).unwrap();
    let template_name =
        job["spec"]["tasks"][0]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].as_str().unwrap();
    let template = kubectl.get_json(&["resourceclaimtemplate", template_name, "-n", "volcano-demo"]).unwrap();
    let requests = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"];
    assert!(requests.get("cores").is_none() && requests.get("memory").is_some(), "{template:#}");

    // A Job that HAMi would refuse is refused naming the task, the container and the resource,
    // and nothing of it is stored.
    let bad = seed_000::GANG.replace("vcjob-vgpu-gang", "vcjob-part-of-a-core").replace("vgpu-cores: 30", "vgpu-cores: 30.5");
    let err = kubectl.run_with_input(&["apply", "-f", "-"], Some(&bad)).expect_err("a fraction of a core").to_string();
    assert!(err.contains("task \"vgpu-worker\": container \"cuda\": volcano.sh/vgpu-cores: 30.5"), "{err}");
    assert!(kubectl.run(&["get", "jobs.batch.volcano.sh", "vcjob-part-of-a-core", "-n", "volcano-demo"]).is_err());
    let text = std::fs::read_to_string(webhook.log()).unwrap();
    assert!(text.contains("Volcano Job"), "{text}");
}
