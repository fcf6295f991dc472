//! HAMi's fit rules and "wait, don't refuse" on the real scheduler, through the webhook:
//! - `gpucores: 100` gets a card no one else holds and keeps it alone, whichever arrives first;
//! - a pod asking 0 cores waits while its only card's cores are all held, runs once they free,
//!   and still gets no SM limit from HAMi-core;
//! - `gpucores: 150` runs as 100, with a warning;
//! - pods that no node of the moment can hold (two cards on a one-card node, more memory than
//!   the largest card, a percentage of a model no node publishes yet but `--card-model` names)
//!   are admitted with a warning, wait with a reason `vgpu-dra why` shows, and run once a node
//!   that fits joins.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use anyhow::{Context, ensure};
use common::webhook;
use common::{Dirs, NODE, cdi_check, claim_response, kubelet};
use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, Kubectl, eventually, free_port, node_host_dir, start_driver};

const WEBHOOK_NAMESPACE: &str = "vgpu-dra";
/// The node that joins later, with larger cards and more of them.
const BIG_NODE: &str = "big-node";
const A100: &str = "NVIDIA A100-PCIE-40GB";

/// A pod in `default` with one container `cuda` whose limits are `limits`, with `annotations`.
fn pod(name: &str, annotations: &str, limits: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}\nspec:\n  containers:\n  - name: cuda\n    image: registry.invalid/none\n    resources:\n      limits: {{{limits}}}\n"
    )
}

/// The node pod `name` is bound to, once it is.
fn wait_scheduled(kubectl: &Kubectl, name: &str) -> anyhow::Result<String> {
    eventually(&format!("pod {name} scheduled"), Duration::from_secs(60), || {
        let pod = kubectl.get_json(&["pod", name, "-n", "default"])?;
        Ok(pod["spec"]["nodeName"].as_str().map(str::to_owned))
    })
}

/// Waits until the scheduler has marked pod `name` unschedulable, then checks it stays unbound
/// for a moment longer (a retry after the condition could still bind it).
fn wait_unschedulable(kubectl: &Kubectl, name: &str) -> anyhow::Result<String> {
    let message = eventually(&format!("pod {name} unschedulable"), Duration::from_secs(60), || {
        let pod = kubectl.get_json(&["pod", name, "-n", "default"])?;
        let conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        Ok(conditions
            .iter()
            .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned()))
    })?;
    std::thread::sleep(Duration::from_secs(2));
    let pod = kubectl.get_json(&["pod", name, "-n", "default"])?;
    ensure!(pod["spec"]["nodeName"].is_null(), "pod {name} was bound after all: {pod:#}");
    Ok(message)
}

/// The allocation result of the one claim of pod `name`, once allocated.
fn allocation(kubectl: &Kubectl, name: &str) -> anyhow::Result<(String, Value)> {
    eventually(&format!("the claim of {name} allocated"), Duration::from_secs(60), || {
        let claim_name =
            kubectl.get_json(&["pod", name, "-n", "default"])?["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
                .as_str()
                .map(str::to_owned);
        let Some(claim_name) = claim_name else { return Ok(None) };
        let claim = kubectl.get_json(&["resourceclaim", &claim_name, "-n", "default"])?;
        Ok(claim["status"]["allocation"]["devices"]["results"].get(0).cloned().map(|r| (claim_name.clone(), r)))
    })
}

fn delete(kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
    kubectl.run(&["delete", "pod", name, "-n", "default", "--grace-period=0", "--force", "--wait=true"])?;
    Ok(())
}

#[test]
fn hamis_fit_rules_hold_and_pods_that_fit_no_node_yet_wait_for_one() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let (dirs, mut small) = webhook::node_with_class(plane, WEBHOOK_NAMESPACE)?;
    let mut kubelet = kubelet(&dirs);
    let port = plane.webhook_port();
    let flags = [format!("--metrics-address=127.0.0.1:{}", free_port()?), format!("--card-model={A100}=40Gi")];
    let mut hook = webhook::spawn(plane, "webhook", (port, port), WEBHOOK_NAMESPACE, &flags)?;
    webhook::wait_called(plane, &mut hook, &pod("probe", "", "nvidia.com/gpu: 1"))?;

    // 1. Exclusive first: a cores-100 pod holds the T4; a memory-only pod (cores 0) waits.
    webhook::create(plane, &pod("exclusive", "", "nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 100"))?;
    let (_, result) = allocation(&kubectl, "exclusive")?;
    ensure!(result["consumedCapacity"]["cores"] == "100", "every core: {result}");
    webhook::create(plane, &pod("cores-zero", "", "nvidia.com/gpumem: 3000"))?;
    let message = wait_unschedulable(&kubectl, "cores-zero")?;
    let text = webhook::vgpu(plane, &["why", "cores-zero", "-n", "default"])?;
    ensure!(text.contains("cores short by 1m"), "why names the cores: {text}\n(scheduler: {message})");
    // ... and runs when they free; it consumes the least a share takes, and no SM limit.
    delete(&kubectl, "exclusive")?;
    ensure!(wait_scheduled(&kubectl, "cores-zero")? == NODE);
    let (claim, result) = allocation(&kubectl, "cores-zero")?;
    ensure!(result["consumedCapacity"]["cores"] == "1m", "{result}");
    let uid = kubectl.run(&["get", "resourceclaim", &claim, "-n", "default", "-o", "jsonpath={.metadata.uid}"])?;
    let reply = kubelet.prepare(&[("default", &claim, &uid)])?;
    let r = claim_response(&reply, &uid);
    ensure!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    let report = cdi_check(&dirs.cdi, &[r["devices"][0]["cdi_device_ids"][0].as_str().context("no CDI id")?]);
    let env: Vec<&str> = report["env"].as_array().context("env")?.iter().filter_map(Value::as_str).collect();
    ensure!(env.contains(&"CUDA_DEVICE_SM_LIMIT=0") && env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=3000m"), "{env:?}");

    // 2. Exclusive second, with cores above a card: clamped to 100 with a warning, and it waits
    // for the card to be free of the cores-0 pod rather than joining it.
    let stderr = webhook::create(plane, &pod("clamped", "", "nvidia.com/gpu: 1, nvidia.com/gpucores: 150"))?;
    ensure!(stderr.contains("Warning:") && stderr.contains("nvidia.com/gpucores 150") && stderr.contains("100"), "{stderr}");
    wait_unschedulable(&kubectl, "clamped")?;
    kubelet.unprepare(&[("default", &claim, &uid)])?;
    delete(&kubectl, "cores-zero")?;
    ensure!(wait_scheduled(&kubectl, "clamped")? == NODE);
    let (_, result) = allocation(&kubectl, "clamped")?;
    ensure!(result["consumedCapacity"]["cores"] == "100", "{result}");
    // Nothing joins it: neither some cores nor none.
    webhook::create(plane, &pod("joiner", "", "nvidia.com/gpumem: 1000, nvidia.com/gpucores: 10"))?;
    wait_unschedulable(&kubectl, "joiner")?;
    delete(&kubectl, "joiner")?;

    // 3. Wait, don't refuse: what no node holds now is admitted with a warning and waits.
    // (Memory is compared with the largest card known, published or named by --card-model:
    // 50000 MiB is more than either, 20000 MiB only more than the T4 and is no warning.)
    let waits = [
        ("two-cards", "", "nvidia.com/gpu: 2, nvidia.com/gpumem: 1000, nvidia.com/gpucores: 10", "nvidia.com/gpu: 2 cards"),
        ("huge-memory", "", "nvidia.com/gpumem: 50000, nvidia.com/gpucores: 10", "nvidia.com/gpumem"),
    ];
    for (name, annotations, limits, warned) in waits {
        let stderr = webhook::create(plane, &pod(name, annotations, limits))?;
        ensure!(stderr.contains("Warning:") && stderr.contains(warned) && stderr.contains("waits until"), "{name}: {stderr}");
        wait_unschedulable(&kubectl, name)?;
        let text = webhook::vgpu(plane, &["why", name, "-n", "default"])?;
        ensure!(text.contains(NODE) && text.contains("pending"), "{name}: why says nothing of the node: {text}");
    }
    let stderr = webhook::create(plane, &pod("big-memory", "", "nvidia.com/gpumem: 20000, nvidia.com/gpucores: 10"))?;
    ensure!(!stderr.contains("Warning:"), "{stderr}");
    wait_unschedulable(&kubectl, "big-memory")?;
    // A percentage of a model no node publishes yet: expressible from --card-model.
    let a100_only = format!("nvidia.com/use-gputype: \"{A100}\"");
    webhook::create(plane, &pod("a100-half", &a100_only, "nvidia.com/gpumem-percentage: 50, nvidia.com/gpucores: 10"))?;
    wait_unschedulable(&kubectl, "a100-half")?;

    // A node with two larger cards joins: all three run there.
    plane.create_node(BIG_NODE)?;
    let big_dirs = Dirs::new(&node_host_dir(plane, BIG_NODE));
    let mut args = big_dirs.args();
    args.retain(|a| !a.starts_with("--mock-gpus"));
    args.push(format!("--mock-gpus=2x{A100}:40Gi"));
    let mut big = start_driver(plane, "driver-big", BIG_NODE, &args.iter().map(String::as_str).collect::<Vec<_>>())?;
    for name in ["two-cards", "big-memory", "a100-half"] {
        ensure!(wait_scheduled(&kubectl, name)? == BIG_NODE, "{name} ran elsewhere");
    }
    let memory = |result: &Value| -> anyhow::Result<u64> {
        let text = result["consumedCapacity"]["memory"].as_str().context("no memory consumed")?;
        vgpu_scheduling::Quantity::parse(text)?.as_u64_exact().context("not whole bytes")
    };
    ensure!(memory(&allocation(&kubectl, "big-memory")?.1)? == 20000 << 20);
    ensure!(memory(&allocation(&kubectl, "a100-half")?.1)? == 20 << 30, "half of the 40Gi model --card-model named");
    ensure!(kubectl.get_json(&["pod", "huge-memory", "-n", "default"])?["spec"]["nodeName"].is_null(), "no card holds 50000 MiB");
    small.check_running()?;
    big.check_running()?;
    hook.check_running()?;
    Ok(())
}
