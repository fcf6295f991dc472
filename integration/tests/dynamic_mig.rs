//! Dynamic MIG (issue #36's publishing) through the driver, on the real kube-scheduler: the
//! daemon runs with two mock A800-SXM4-80GB cards in MIG mode, `--dynamic-mig listed` and source
//! document 001's groups (1g.10gb, 2g.20gb, 3g.40gb, 7g.79gb), and publishes the layout of
//! `vgpu_dra::mig::PoolLayout`: counter sets in a slice of their own, a device per allowed
//! placement, and each card's whole-card device (the full instance, as shares). The counters
//! alone keep MIG placements from overlapping and keep a card's shares and its MIG instances
//! apart:
//!
//! - seven 1g.10gb claims fill card 0 and an eighth waits; a software share of card 0 waits too;
//! - two software shares of card 1 fit (the whole card's counters are charged once) and keep a
//!   MIG claim on card 1 waiting until both go;
//! - a `firstAvailable` list made from the catalogue (`vgpu_scheduling::mig::covering`, smallest
//!   first) gives 9000 MiB a 1g.10gb and 15000 MiB a 2g.20gb.
//!
//! Making the instances at prepare, through the kubelet's plugin code, is `mig_prepare.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use vgpu_dra::discovery::DeviceSource;
use vgpu_dra::discovery::mock::{MockSource, parse_spec};
use vgpu_dra::mig::{DynamicMig, MigSettings, PoolLayout};
use vgpu_dra::slices::PoolIdentity;
use vgpu_dra_integration::{ControlPlane, Kubectl, eventually, start_driver};
use vgpu_scheduling::mig::{allowed_profiles, covering, model_for};
use vgpu_scheduling::{DeviceConfig, SharingConfig};

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
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    let spec = format!("2x{PRODUCT}:80Gi:mig");
    let config_file = plane.dir().join("device-config.yaml");
    std::fs::write(&config_file, GROUPS_001)?;
    let args = [format!("--mock-gpus={spec}"), "--dynamic-mig=listed".into(), format!("--config={}", config_file.display())];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut driver = start_driver(plane, "driver", NODE, &args)?;

    // What the driver publishes is the layout, counter sets included.
    let groups = DeviceConfig::parse("device-config.yaml", GROUPS_001)?;
    let inventory = MockSource::new(NODE, parse_spec(&spec)?).inventory()?;
    let mig = MigSettings { mode: DynamicMig::Listed, config: groups.mig.clone(), ..Default::default() };
    let pool =
        PoolIdentity { driver: SharingConfig::default().driver_name, node_name: NODE.into(), node_uid: None, generation: 1 };
    let want: Vec<Value> = PoolLayout::new(&inventory, &SharingConfig::default(), &mig)
        .slices(&pool)
        .iter()
        .map(|s| Ok(without_pool(serde_json::to_value(&s.spec)?)))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(want.len() == 2 && want[0]["sharedCounters"].as_array().map(Vec::len) == Some(2), "layout: {want:?}");
    eventually("the driver's slices", Duration::from_secs(60), || {
        let list = kubectl.get_json(&["resourceslices", &format!("--field-selector=spec.nodeName={NODE}")])?;
        let mut got: Vec<(String, Value)> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| (s["metadata"]["name"].as_str().unwrap_or_default().to_owned(), without_pool(s["spec"].clone())))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let got: Vec<Value> = got.into_iter().map(|(_, spec)| spec).collect();
        Ok((got == want).then_some(()))
    })?;
    // A restart finds the counter sets and devices in place: nothing written, same generation.
    let generation = |k: &Kubectl| -> anyhow::Result<Vec<Value>> {
        let list = k.get_json(&["resourceslices", &format!("--field-selector=spec.nodeName={NODE}")])?;
        Ok(list["items"].as_array().into_iter().flatten().map(|s| s["spec"]["pool"]["generation"].clone()).collect())
    };
    let before = generation(&kubectl)?;
    driver.stop();
    let restarted = start_driver(plane, "driver-restarted", NODE, &args)?;
    eventually("the restarted driver's first pass", Duration::from_secs(30), || {
        Ok(std::fs::read_to_string(restarted.log())?.contains("ResourceSlices already up to date").then_some(()))
    })?;
    anyhow::ensure!(generation(&kubectl)? == before, "a restart changed the pool generation: {before:?}");
    let model = model_for(PRODUCT, 80 << 30).expect("the catalogue knows the A800");
    let allowed = allowed_profiles(model, PRODUCT, &groups.mig)?;

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

    // A pod without vgpu-mode under the webhook's --unannotated-mig: its claim asks a share
    // first, then the smallest instance. Both cards are in MIG use, so no share fits: it gets an
    // instance on card 1, the only one with room.
    for (class, kind) in [("vgpu-cards", "hami-gpu"), ("vgpu-mig", "hami-mig")] {
        kubectl.apply(&format!(
            "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: {class}}}\nspec:\n  selectors:\n  - cel: {{expression: 'device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].type == \"{kind}\"'}}\n"
        ))?;
    }
    kubectl.apply(&either_pod("either-mig")?)?;
    let result = plane.wait_allocated("default", "either-mig", Duration::from_secs(60))?;
    anyhow::ensure!(result["device"].as_str().unwrap_or_default().starts_with("hami-gpu-1-mig-1g-10gb-"), "{result}");
    // Card 0 freed, the same claim takes a share of it.
    for i in 0..8 {
        delete_pod_and_claim(&kubectl, &format!("small-{i}"))?;
    }
    delete_pod_and_claim(&kubectl, "share-0")?;
    // Only once every claim on card 0 is gone: a share must fit the whole card's counters.
    eventually("card 0's claims gone", Duration::from_secs(60), || {
        let left = kubectl.run(&["get", "resourceclaims", "-n", "default", "-o", "name"])?;
        Ok((!left.lines().any(|l| l.contains("/small-") || l.ends_with("/share-0"))).then_some(()))
    })?;
    kubectl.apply(&either_pod("either-share")?)?;
    let result = plane.wait_allocated("default", "either-share", Duration::from_secs(90))?;
    anyhow::ensure!(result["device"] == "hami-gpu-0", "{result}");
    Ok(())
}

/// A pod asking one card with 9000 MiB and 30 cores, converted as the webhook converts it
/// without a `vgpu-mode` annotation under `--unannotated-mig=true`, and its claim.
fn either_pod(name: &str) -> anyhow::Result<String> {
    use vgpu_scheduling::compat::{CardRequest, ClassFacts, CompatSettings, MemoryRequest, Selection, either_claim_spec};
    let settings = CompatSettings {
        device_class: "vgpu-cards".into(),
        mig_device_class: "vgpu-mig".into(),
        unannotated_mig: true,
        ..CompatSettings::hami()
    };
    let request = CardRequest { count: 1, memory: MemoryRequest::Bytes(9000 << 20), cores: 30, priority: None };
    let spec =
        either_claim_spec("main", "nvidia.com/gpumem", &request, &Selection::default(), &settings, &ClassFacts::default())?;
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec.spec,
    });
    Ok(format!(
        "{claim}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]\n  containers:\n  - name: main\n    image: registry.invalid/none\n    resources: {{claims: [{{name: gpu}}]}}\n"
    ))
}

fn delete_pod_and_claim(kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
    kubectl.run(&["delete", "pod", name, "-n", "default", "--force", "--grace-period=0"])?;
    kubectl.run(&["delete", "resourceclaim", name, "-n", "default", "--wait=false"])?;
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

/// A slice's spec without its pool generation, which the driver bumps as it sees fit.
fn without_pool(mut spec: Value) -> Value {
    if let Some(pool) = spec.get_mut("pool").and_then(Value::as_object_mut) {
        pool.remove("generation");
    }
    spec
}
