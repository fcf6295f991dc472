//! Dynamic MIG's slices (`vgpu_dra::mig::slices`, issue #36's publishing) on the real
//! kube-scheduler: the counters alone keep MIG placements from overlapping and keep a card's
//! software shares and its MIG instances apart. Two mock A800-SXM4-80GB cards offer source
//! document 001's groups (1g.10gb, 2g.20gb, 3g.40gb, 7g.79gb):
//!
//! - seven 1g.10gb claims fill card 0 and an eighth waits; a software share of card 0 waits too;
//! - two software shares of card 1 fit (the whole card's counters are charged once) and keep a
//!   MIG claim on card 1 waiting until both go;
//! - a `firstAvailable` list made from the catalogue (`vgpu_scheduling::mig::covering`, smallest
//!   first) gives 9000 MiB a 1g.10gb and 15000 MiB a 2g.20gb.
//!
//! The test publishes the slices the driver's layout builds; the daemon does not publish them
//! yet, and prepare does not create instances yet (see issue #36).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use vgpu_dra::discovery::DeviceSource;
use vgpu_dra::discovery::mock::{MockSource, parse_spec};
use vgpu_dra::mig::slices::{MigCard, build_slices_with_mig};
use vgpu_dra::slices::PoolIdentity;
use vgpu_dra_integration::{ControlPlane, Kubectl, eventually};
use vgpu_scheduling::mig::{allowed_profiles, covering, model_for};
use vgpu_scheduling::{DeviceConfig, SharingConfig, publish};

const NODE: &str = "node-mig";
const DRIVER: &str = "hami-core-gpu.project-hami.io";
const PRODUCT: &str = "NVIDIA A800-SXM4-80GB";

/// Source document 001's `knownMigGeometries` for the A800-SXM4-80GB.
const GROUPS_001: &str = "nvidia:\n  knownMigGeometries:\n  - models: [\"A800-SXM4-80GB\"]\n    allowedGeometries:\n    - group: group1\n      geometries:\n      - {name: 1g.10gb, memory: 10240, count: 7}\n    - group: group2\n      geometries:\n      - {name: 2g.20gb, memory: 20480, count: 3}\n      - {name: 1g.10gb, memory: 10240, count: 1}\n    - group: group3\n      geometries:\n      - {name: 3g.40gb, memory: 40960, count: 2}\n    - group: group4\n      geometries:\n      - {name: 7g.79gb, memory: 80896, count: 1}\n";

#[test]
fn the_scheduler_keeps_mig_placements_and_software_shares_apart() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        let k = plane.kubectl();
        let pods = k.run(&[
            "get",
            "pods",
            "-n",
            "default",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}: {.status.conditions}{\"\\n\"}{end}",
        ]);
        let slices = k.run(&["get", "resourceslices", "-o", "json"]).map(|s| s.chars().take(3000).collect::<String>());
        panic!("{e:#}\npods: {pods:?}\nslices: {slices:?}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let node_uid = plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    let config = SharingConfig::default();
    let inventory = MockSource::new(NODE, parse_spec(&format!("2x{PRODUCT}:80Gi"))?).inventory()?;
    let devices = publish(&inventory, &config);
    let model = model_for(PRODUCT, 80 << 30).expect("the catalogue knows the A800");
    let groups = DeviceConfig::parse("device-config.yaml", GROUPS_001)?;
    let allowed = allowed_profiles(model, PRODUCT, &groups.mig)?;
    let mig: Vec<MigCard<'_>> = devices.iter().map(|card| MigCard { card, model, allowed: allowed.clone() }).collect();
    let pool =
        PoolIdentity { driver: config.driver_name.clone(), node_name: NODE.into(), node_uid: Some(node_uid), generation: 1 };
    for slice in build_slices_with_mig(&pool, &devices, &mig) {
        let mut v = serde_json::to_value(&slice)?;
        v["apiVersion"] = "resource.k8s.io/v1".into();
        v["kind"] = "ResourceSlice".into();
        kubectl.apply(&v.to_string())?;
    }
    kubectl.apply(&format!(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: vgpu}}\nspec:\n  selectors:\n  - cel: {{expression: 'device.driver == \"{DRIVER}\"'}}\n"
    ))?;

    // Seven 1g.10gb fill card 0, each on a placement of its own; an eighth waits.
    for i in 0..7 {
        kubectl.apply(&mig_pod(&format!("small-{i}"), 0, &["1g.10gb"]))?;
    }
    let mut placements = std::collections::BTreeSet::new();
    for i in 0..7 {
        let result = plane.wait_allocated("default", &format!("small-{i}"), Duration::from_secs(60))?;
        let device = result["device"].as_str().unwrap_or_default().to_owned();
        anyhow::ensure!(device.starts_with("hami-gpu-0-mig-1g-10gb-"), "small-{i} got {device}");
        placements.insert(device);
    }
    anyhow::ensure!(placements.len() == 7, "two claims share a placement: {placements:?}");
    kubectl.apply(&mig_pod("small-7", 0, &["1g.10gb"]))?;
    wait_unschedulable(&kubectl, "small-7")?;
    // The card's counters are all taken: no software share of it either.
    kubectl.apply(&share_pod("share-0", 0))?;
    wait_unschedulable(&kubectl, "share-0")?;

    // A software share of card 1 first: its whole-card device takes every counter of card 1.
    // A second share of it fits: the counters were charged once, at the first allocation.
    kubectl.apply(&share_pod("share-1", 1))?;
    plane.wait_allocated("default", "share-1", Duration::from_secs(60))?;
    kubectl.apply(&share_pod("share-1b", 1))?;
    plane.wait_allocated("default", "share-1b", Duration::from_secs(60))?;
    kubectl.apply(&mig_pod("after-share", 1, &["1g.10gb"]))?;
    wait_unschedulable(&kubectl, "after-share")?;
    // The shares go (no kubelet runs their pods: they go at once): the MIG claim gets its
    // instance.
    for share in ["share-1", "share-1b"] {
        kubectl.run(&["delete", "pod", share, "-n", "default", "--force", "--grace-period=0"])?;
        kubectl.run(&["delete", "resourceclaim", share, "-n", "default", "--wait=false"])?;
    }
    let result = plane.wait_allocated("default", "after-share", Duration::from_secs(90))?;
    anyhow::ensure!(result["device"].as_str().unwrap_or_default().starts_with("hami-gpu-1-mig-1g-10gb-"), "{result}");

    // The smallest free profile that covers the memory asked, in 001's groups.
    let allowed: Option<Vec<&str>> = allowed.clone();
    for (name, memory_mib, want) in [("mem-9000", 9000, "1g-10gb"), ("mem-15000", 15000, "2g-20gb")] {
        let profiles: Vec<&str> = covering(model, memory_mib, allowed.as_deref()).iter().map(|p| p.name()).collect();
        kubectl.apply(&mig_pod(name, 1, &profiles))?;
        let result = plane.wait_allocated("default", name, Duration::from_secs(60))?;
        let device = result["device"].as_str().unwrap_or_default();
        anyhow::ensure!(device.contains(&format!("-mig-{want}-")), "{name} ({profiles:?}) got {device}");
    }
    Ok(())
}

/// A pod and its claim for one MIG instance on card `index`: the first free placement of the
/// first of `profiles` that has one (a `firstAvailable` list, one subrequest per profile).
fn mig_pod(name: &str, index: u32, profiles: &[&str]) -> String {
    let subrequests: Vec<String> = profiles
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "      - name: p{i}\n        deviceClassName: vgpu\n        selectors:\n        - cel:\n            expression: device.attributes[\"{DRIVER}\"].type == \"hami-mig\" && device.attributes[\"{DRIVER}\"].profile == \"{p}\" && device.attributes[\"{DRIVER}\"].index == {index}\n"
            )
        })
        .collect();
    claim_and_pod(name, &format!("    - name: gpu\n      firstAvailable:\n{}", subrequests.concat()))
}

/// A pod and its claim for a software share (4 GiB, 10 cores) of card `index`'s whole-card device.
fn share_pod(name: &str, index: u32) -> String {
    claim_and_pod(
        name,
        &format!(
            "    - name: gpu\n      exactly:\n        deviceClassName: vgpu\n        selectors:\n        - cel:\n            expression: device.attributes[\"{DRIVER}\"].type == \"hami-gpu\" && device.attributes[\"{DRIVER}\"].index == {index}\n        capacity:\n          requests: {{memory: 4Gi, cores: \"10\"}}\n"
        ),
    )
}

fn claim_and_pod(name: &str, requests: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  devices:\n    requests:\n{requests}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]\n  containers:\n  - name: main\n    image: registry.invalid/none\n    resources: {{claims: [{{name: gpu}}]}}\n"
    )
}

/// Waits until the scheduler has said pod `name` does not fit, and checks its claim is not
/// allocated.
fn wait_unschedulable(kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
    eventually(&format!("pod {name} unschedulable"), Duration::from_secs(60), || {
        let pod = kubectl.get_json(&["pod", name, "-n", "default"])?;
        let stuck = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c: &Value| c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable");
        Ok(stuck.then_some(()))
    })?;
    let claim = kubectl.get_json(&["resourceclaim", name, "-n", "default"])?;
    anyhow::ensure!(claim["status"]["allocation"].is_null(), "{name}'s claim was allocated: {}", claim["status"]);
    Ok(())
}
