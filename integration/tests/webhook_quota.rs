//! Namespace GPU quotas in HAMi's keys, on the real API server, scheduler and resource claim
//! controller, through the webhook:
//! - `limits.nvidia.com/gpumem: 2000` runs one 1500 MiB HAMi pod; a second waits with the quota
//!   reason (the claim controller's event) and runs once the first is gone; the same for a pod
//!   of a native ResourceClaimTemplate, and a ResourceClaim created directly is refused;
//! - `requests.nvidia.com/gpucores: 50` refuses 2 cards x 30 cores and admits 2 x 25;
//! - 20 claims reviewed at once by two replicas against a quota that fits 5: exactly 5 admitted.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use common::webhook;
use serde_json::{Value, json};
use vgpu_dra_integration::{ControlPlane, Kubectl, WEBHOOK_CLIENT_NAME, eventually, free_port};

const WEBHOOK_NAMESPACE: &str = "vgpu-dra";
const CLASS: &str = "hami-core-gpu.project-hami.io";

fn hami_pod(name: &str, namespace: &str, mib: u64) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  containers:\n  - name: cuda\n    image: registry.invalid/none\n    resources:\n      limits: {{nvidia.com/gpu: 1, nvidia.com/gpumem: {mib}, nvidia.com/gpucores: 10}}\n"
    )
}

fn claim(name: &str, namespace: &str, count: u32, memory: &str, cores: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": count,
            "capacity": {"requests": {"memory": memory, "cores": cores.to_string()}}}}]}}
    })
}

fn quota(namespace: &str, hard: &str) -> String {
    format!("apiVersion: v1\nkind: ResourceQuota\nmetadata: {{name: gpu, namespace: {namespace}}}\nspec:\n  hard: {{{hard}}}\n")
}

fn scheduled(kubectl: &Kubectl, ns: &str, name: &str) -> anyhow::Result<bool> {
    Ok(kubectl.get_json(&["pod", name, "-n", ns])?["spec"]["nodeName"].is_string())
}

/// The message of the claim controller's latest FailedResourceClaimCreation event on pod `name`.
fn claim_failure(kubectl: &Kubectl, ns: &str, name: &str) -> anyhow::Result<Option<String>> {
    let events = kubectl.get_json(&["events", "-n", ns, &format!("--field-selector=involvedObject.name={name}")])?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "FailedResourceClaimCreation")
        .filter_map(|e| e["message"].as_str().map(str::to_owned))
        .next_back())
}

/// POSTs the creation review of `object` to the webhook on `port`, as the API server (`identity`:
/// its client certificate and key); whether it was allowed.
fn review(port: u16, identity: (&Path, &Path), namespace: &str, object: &Value, uid: usize) -> anyhow::Result<bool> {
    let gvk = json!({"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"});
    let gvr = json!({"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"});
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("0f6a6a5e-0000-4000-8000-{uid:012}"), "kind": gvk, "resource": gvr, "requestKind": gvk,
            "requestResource": gvr, "name": object["metadata"]["name"], "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "tenant"}, "object": object, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    });
    let out = Command::new("curl")
        .args(["-sS", "-k", "--max-time", "20", "-X", "POST", "-H", "Content-Type: application/json", "--data-binary"])
        .arg(body.to_string())
        .arg("--cert")
        .arg(identity.0)
        .arg("--key")
        .arg(identity.1)
        .arg(format!("https://127.0.0.1:{port}/mutate-resourceclaims"))
        .output()?;
    ensure!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).with_context(|| String::from_utf8_lossy(&out.stdout).into_owned())?;
    let allowed = answer["response"]["allowed"].as_bool().context("no verdict")?;
    if !allowed {
        let message = answer["response"]["status"]["message"].as_str().unwrap_or_default();
        ensure!(message.starts_with("exceeded quota: gpu, requested: nvidia.com/gpu=1"), "{message}");
    }
    Ok(allowed)
}

#[test]
fn namespace_gpu_quotas_hold_for_converted_native_and_direct_claims() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let (_dirs, mut drv) = webhook::node_with_class(plane, WEBHOOK_NAMESPACE)?;
    for ns in ["team", "cores", "race"] {
        kubectl.run(&["create", "namespace", ns])?;
    }
    let port = plane.webhook_port();
    let metrics_port = free_port()?;
    let flags = [format!("--metrics-address=127.0.0.1:{metrics_port}")];
    let mut hook = webhook::spawn(plane, "webhook", (port, port), WEBHOOK_NAMESPACE, &flags)?;
    webhook::wait_called(plane, &mut hook, &hami_pod("probe", "default", 1000))?;

    // 1. HAMi pods against limits.nvidia.com/gpumem: 2000.
    kubectl.apply(&quota("team", "limits.nvidia.com/gpumem: \"2000\""))?;
    kubectl.apply(&hami_pod("first", "team", 1500))?;
    eventually("first scheduled", Duration::from_secs(60), || Ok(scheduled(&kubectl, "team", "first")?.then_some(())))?;
    kubectl.apply(&hami_pod("second", "team", 1500))?;
    let reason = eventually("second's claim refused", Duration::from_secs(60), || claim_failure(&kubectl, "team", "second"))?;
    ensure!(
        reason.contains(
            "exceeded quota: gpu, requested: limits.nvidia.com/gpumem=1500, used: limits.nvidia.com/gpumem=1500, limited: limits.nvidia.com/gpumem=2000"
        ),
        "{reason}"
    );
    ensure!(!scheduled(&kubectl, "team", "second")?, "second ran past the quota");
    let why = webhook::vgpu(plane, &["why", "second", "-n", "team"])?;
    ensure!(why.contains("the resource claim controller cannot create it") && why.contains("exceeded quota: gpu"), "{why}");
    // A claim written directly is refused at once, in the same words.
    let direct = serde_json::to_string(&claim("direct", "team", 1, "1500Mi", 10))?;
    let err = kubectl.run_with_input(&["create", "-f", "-"], Some(&direct)).expect_err("past the quota").to_string();
    ensure!(err.contains("exceeded quota: gpu"), "{err}");
    // The first leaves: its claim goes with it, and the second's claim is made and runs.
    kubectl.run(&["delete", "pod", "first", "-n", "team", "--grace-period=0", "--force"])?;
    eventually("second scheduled once first is gone", Duration::from_secs(120), || {
        Ok(scheduled(&kubectl, "team", "second")?.then_some(()))
    })?;
    // A native template's pod waits the same way while second holds 1500.
    let native = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {{name: half, namespace: team}}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly: {{deviceClassName: {CLASS}, capacity: {{requests: {{memory: 1500Mi, cores: \"10\"}}}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: native, namespace: team}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: half}}]\n  containers:\n  - name: main\n    image: registry.invalid/none\n    resources: {{claims: [{{name: gpu}}]}}\n"
    );
    kubectl.apply(&native)?;
    let reason = eventually("native's claim refused", Duration::from_secs(60), || claim_failure(&kubectl, "team", "native"))?;
    ensure!(reason.contains("exceeded quota: gpu"), "{reason}");
    kubectl.run(&["delete", "pod", "second", "-n", "team", "--grace-period=0", "--force"])?;
    eventually("native scheduled once second is gone", Duration::from_secs(120), || {
        Ok(scheduled(&kubectl, "team", "native")?.then_some(()))
    })?;

    // What the namespace holds, as kubectl vgpu usage and the webhook's metrics show it.
    let usage = webhook::vgpu(plane, &["usage", "-n", "team"])?;
    let row = usage.lines().find(|l| l.contains("limits.nvidia.com/gpumem")).unwrap_or_default();
    ensure!(row.split_whitespace().collect::<Vec<_>>() == ["gpu", "limits.nvidia.com/gpumem", "1500", "2000"], "{usage}");
    let text = webhook::metrics(metrics_port)?;
    let want = r#"vgpu_dra_webhook_quota_used{namespace="team",quota="gpu",key="limits.nvidia.com/gpumem"} 1500"#;
    ensure!(text.contains(want), "{want} missing from {text}");

    // 2. Cores over all the cards of a claim.
    kubectl.apply(&quota("cores", "requests.nvidia.com/gpucores: \"50\""))?;
    let sixty = serde_json::to_string(&claim("sixty", "cores", 2, "1Gi", 30))?;
    let err = kubectl.run_with_input(&["create", "-f", "-"], Some(&sixty)).expect_err("60 of 50").to_string();
    ensure!(
        err.contains("requested: requests.nvidia.com/gpucores=60") && err.contains("limited: requests.nvidia.com/gpucores=50"),
        "{err}"
    );
    let fifty = serde_json::to_string(&claim("fifty", "cores", 2, "1Gi", 25))?;
    kubectl.run_with_input(&["create", "-f", "-"], Some(&fifty))?;

    // 3. 20 at once through two more replicas against room for 5: exactly 5.
    kubectl.apply(&quota("race", "nvidia.com/gpu: \"5\""))?;
    let ports = [free_port()?, free_port()?];
    let mut replicas = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let flags = [format!("--metrics-address=127.0.0.1:{}", free_port()?)];
        let mut replica = webhook::spawn(plane, &format!("replica-{i}"), (*p, port), WEBHOOK_NAMESPACE, &flags)?;
        eventually("the replica serving", Duration::from_secs(30), || {
            replica.check_running()?;
            Ok(std::fs::read_to_string(replica.log())?.contains("admission webhook serving").then_some(()))
        })?;
        replicas.push(replica);
    }
    // Each replica answers only the API server's certificate, as the one the API server calls.
    let (cert, key) = plane.issue_webhook_client_certificate(WEBHOOK_CLIENT_NAME)?;
    let admitted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let (p, identity) = (ports[i % 2], (cert.as_path(), key.as_path()));
                s.spawn(move || review(p, identity, "race", &claim(&format!("c{i}"), "race", 1, "1Gi", 10), i))
            })
            .collect();
        handles.into_iter().map(|h| usize::from(h.join().unwrap().unwrap())).sum()
    });
    ensure!(admitted == 5, "{admitted} of 20 admitted against room for 5");
    drv.check_running()?;
    hook.check_running()?;
    for r in &mut replicas {
        r.check_running()?;
    }
    Ok(())
}
