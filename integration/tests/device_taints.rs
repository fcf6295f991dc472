//! Draining a card with a DeviceTaintRule (KEP-5055), on the real scheduler and eviction
//! controller: the driver publishes two mock T4s; an administrator's NoSchedule rule on the
//! first keeps new claims off it (two 50-core shares fill the second and a third waits, where
//! the first card had room), `kubectl vgpu usage` shows the taint with the rule's name and
//! `kubectl vgpu why` names it as what keeps the waiting pod off the card; a NoExecute rule on
//! the second card evicts the pods whose claims it holds, and leaves the others. The rule is
//! `resource.k8s.io/v1` from 1.37 and `v1beta2` in 1.36 (switched on here); docs/troubleshooting.md
//! shows the same steps.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, PlaneOptions, eventually, start_driver};

mod common;

use common::{DRIVER, Dirs, NODE, claim_with, taint_rule_version, webhook};

#[test]
fn a_taint_rule_drains_one_card_and_leaves_the_other() {
    let mut plane = ControlPlane::start_with(&PlaneOptions { device_taint_rules: true, ..Default::default() }).unwrap();
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

/// docs/troubleshooting.md's rule (drain-gpu-0, NoSchedule on the quick start node's first
/// card) for this node, in `version`, named `name`, on `device`, with `effect`.
fn rule(version: &str, name: &str, device: &str, effect: &str) -> String {
    let page = include_str!("../../docs/troubleshooting.md");
    let start = page.find("```yaml device-taint-rule\n").expect("docs/troubleshooting.md has no DeviceTaintRule block");
    let body = &page[start..].split_once('\n').unwrap().1;
    let body = &body[..body.find("```").unwrap()];
    assert!(body.contains(&format!("driver: {DRIVER}")), "the documented rule names another driver:\n{body}");
    body.replace("apiVersion: resource.k8s.io/v1\n", &format!("apiVersion: resource.k8s.io/{version}\n"))
        .replace("name: drain-gpu-0", &format!("name: {name}"))
        .replace("pool: gpu-node-1", &format!("pool: {NODE}"))
        .replace("device: hami-gpu-0", &format!("device: {device}"))
        .replace("effect: NoSchedule", &format!("effect: {effect}"))
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    let dirs = Dirs::new(plane.dir());
    let args: Vec<String> = dirs
        .args()
        .into_iter()
        .map(|a| if a.starts_with("--mock-gpus=") { "--mock-gpus=2xTesla T4:15Gi".to_owned() } else { a })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut drv = start_driver(plane, "driver", NODE, &args)?;
    eventually("both cards published", Duration::from_secs(30), || {
        drv.check_running()?;
        let slices = kubectl.get_json(&["resourceslices"])?;
        let devices = slices["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
            .count();
        Ok((devices == 2).then_some(()))
    })?;
    let version = taint_rule_version(&kubectl).context("no API version serves DeviceTaintRules")?;
    eprintln!("DeviceTaintRule served as resource.k8s.io/{version}");

    // NoSchedule on the first card: new claims go to the second, and the third waits.
    kubectl.apply(&rule(version, "drain-gpu-0", "hami-gpu-0", "NoSchedule"))?;
    std::thread::sleep(Duration::from_secs(2));
    for name in ["s1", "s2"] {
        kubectl.apply(&claim_with(name, "4Gi", "50"))?;
        let result = plane.wait_allocated("default", name, Duration::from_secs(60))?;
        ensure!(result["device"] == "hami-gpu-1", "{name} went to a drained card: {result}");
    }
    kubectl.apply(&claim_with("s3", "4Gi", "50"))?;
    std::thread::sleep(Duration::from_secs(5));
    let s3 = kubectl.get_json(&["resourceclaim", "s3"])?;
    ensure!(s3["status"]["allocation"].is_null(), "a third share was put on the drained card: {}", s3["status"]);

    let usage = webhook::vgpu(plane, &["usage"])?;
    let row = usage.lines().find(|l| l.contains("hami-gpu-0")).context("no row of hami-gpu-0")?;
    ensure!(row.contains("example.com/maintenance=true:NoSchedule (rule drain-gpu-0)"), "kubectl vgpu usage:\n{usage}");
    let other = usage.lines().find(|l| l.contains("hami-gpu-1")).context("no row of hami-gpu-1")?;
    ensure!(other.contains("healthy") && !other.contains("maintenance"), "the rule shows on the other card:\n{usage}");
    let why = webhook::vgpu(plane, &["why", "s3"])?;
    ensure!(why.contains("device tainted example.com/maintenance=true:NoSchedule"), "kubectl vgpu why s3:\n{why}");

    // NoExecute on the second card: the pods of its claims are evicted.
    kubectl.apply(&rule(version, "evict-gpu-1", "hami-gpu-1", "NoExecute"))?;
    for pod in ["s1", "s2"] {
        eventually(&format!("pod {pod} evicted"), Duration::from_secs(60), || {
            drv.check_running()?;
            let found = kubectl.get_json(&["pods", "--field-selector", &format!("metadata.name={pod}")])?;
            let item = found["items"].as_array().and_then(|i| i.first().cloned());
            Ok(item.is_none_or(|p: Value| !p["metadata"]["deletionTimestamp"].is_null()).then_some(()))
        })?;
    }
    let rule_status = kubectl.get_json(&[&format!("devicetaintrules.{version}.resource.k8s.io"), "evict-gpu-1"])?;
    eprintln!("evict-gpu-1 status: {}", rule_status["status"]);
    let pending = kubectl.get_json(&["pod", "s3"])?;
    ensure!(pending["metadata"]["deletionTimestamp"].is_null(), "the pod of the unallocated claim was evicted too");
    let usage = webhook::vgpu(plane, &["usage"])?;
    ensure!(usage.contains("example.com/maintenance=true:NoExecute (rule evict-gpu-1)"), "kubectl vgpu usage:\n{usage}");
    drv.check_running()?;
    Ok(())
}
