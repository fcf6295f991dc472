//! The publisher against the real API server and scheduler: the slice HAMi users expect, the
//! 003 scenario (two 4Gi/50 shares fit a 15Gi T4, the third waits), split count, recovery from a
//! kubelet-style wipe, no writes on restart, generation bump on inventory change.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;

use common::claim_on;
use vgpu_dra_integration::{ControlPlane, Kubectl, eventually, start_driver};

const DRIVER: &str = "hami-core-gpu.project-hami.io";

fn inventory(cards: &[(&str, u64)]) -> String {
    let gpus: Vec<Value> = cards
        .iter()
        .enumerate()
        .map(|(i, (product, gib))| {
            json!({"uuid": format!("GPU-test-{i}"), "minor": i, "index": i, "productName": product,
                   "memoryBytes": gib << 30, "architecture": "Turing", "computeCapability": [7, 5],
                   "pciBusId": format!("0000:{:02x}:00.0", i + 1)})
        })
        .collect();
    json!({"driverVersion": "550.54.15", "cudaDriverVersion": [12, 4], "gpus": gpus}).to_string()
}

fn slices(kubectl: &Kubectl, node: &str) -> anyhow::Result<Vec<Value>> {
    let list = kubectl.get_json(&["resourceslices", &format!("--field-selector=spec.nodeName={node}")])?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn assert_unschedulable(kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
    eventually(&format!("pod {name} unschedulable"), Duration::from_secs(30), || {
        let pod = kubectl.get_json(&["pod", name, "-n", "default"])?;
        let unschedulable =
            pod["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["reason"] == "Unschedulable"));
        Ok(unschedulable.then_some(()))
    })?;
    let claim = kubectl.get_json(&["resourceclaim", name, "-n", "default"])?;
    anyhow::ensure!(claim["status"]["allocation"].is_null(), "claim {name} was allocated: {claim}");
    Ok(())
}

#[test]
fn publisher_keeps_the_pool_true_on_a_real_api_server() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let node = "gpu-node";
    plane.create_node(node)?;
    let kubectl = plane.kubectl().clone();
    let inv = plane.dir().join("inventory.json");
    std::fs::write(&inv, inventory(&[("Tesla T4", 15)]))?;
    let inv_arg = format!("--mock-inventory={}", inv.display());
    let mut driver = start_driver(plane, "driver", node, &[&inv_arg])?;

    // The slice appears, accepted with its sharing fields intact.
    let slice = eventually("the node's slice", Duration::from_secs(30), || {
        driver.check_running()?;
        Ok(slices(&kubectl, node)?.into_iter().next())
    })?;
    let yaml = kubectl.run(&["get", "resourceslice", "-o", "yaml"])?;
    for want in [
        "allowMultipleAllocations: true",
        "name: hami-gpu-0",
        "value: 15Gi",
        "step: 1Mi",
        "driver: hami-core-gpu.project-hami.io",
    ] {
        anyhow::ensure!(yaml.contains(want), "kubectl get resourceslice -o yaml lacks {want:?}:\n{yaml}");
    }
    assert_eq!(slice["spec"]["pool"]["name"], node);
    assert_eq!(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
    let dev = &slice["spec"]["devices"][0];
    assert_eq!(dev["capacity"]["memory"]["requestPolicy"]["validRange"]["min"], "1Mi");
    assert_eq!(dev["capacity"]["cores"]["requestPolicy"]["default"], "100");
    assert_eq!(slice["spec"]["pool"]["generation"], 1);

    // The 003 scenario: two 4Gi/50 shares fit, the third waits for cores.
    let mut shares = Vec::new();
    for name in ["w1", "w2"] {
        kubectl.apply(&claim_on(name, node, "4Gi", "50"))?;
        let result = plane.wait_allocated("default", name, Duration::from_secs(30))?;
        assert_eq!(result["device"], "hami-gpu-0");
        assert_eq!(result["consumedCapacity"]["memory"], "4Gi");
        assert_eq!(result["consumedCapacity"]["cores"], "50");
        assert_eq!(result["consumedCapacity"]["shares"], "1");
        shares.push(result["shareID"].as_str().unwrap_or_default().to_owned());
    }
    assert_ne!(shares[0], shares[1]);
    kubectl.apply(&claim_on("w3", node, "4Gi", "50"))?;
    assert_unschedulable(&kubectl, "w3")?;

    // A kubelet-style wipe: the slices are back within 5 s.
    let wiped = Instant::now();
    kubectl.run(&["delete", "resourceslices", &format!("--field-selector=spec.nodeName={node}"), "--wait=false"])?;
    eventually("the slice restored", Duration::from_secs(5), || Ok(slices(&kubectl, node)?.into_iter().next()))?;
    eprintln!("slices restored {:?} after the wipe", wiped.elapsed());

    // An edit by someone else is undone.
    let name = slices(&kubectl, node)?[0]["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    kubectl.run(&[
        "patch",
        "resourceslice",
        &name,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/devices/0/attributes/productName/string","value":"tampered"}]"#,
    ])?;
    eventually("the edit undone", Duration::from_secs(5), || {
        Ok(slices(&kubectl, node)?
            .first()
            .filter(|s| s["spec"]["devices"][0]["attributes"]["productName"]["string"] == "Tesla T4")
            .map(|_| ()))
    })?;

    // A restart with nothing changed writes nothing.
    let before = slices(&kubectl, node)?[0]["metadata"]["resourceVersion"].clone();
    driver.stop();
    let mut driver = start_driver(plane, "driver-restarted", node, &[&inv_arg])?;
    eventually("the restarted driver reconciled", Duration::from_secs(20), || {
        driver.check_running()?;
        Ok(std::fs::read_to_string(driver.log())?.contains("ResourceSlices already up to date").then_some(()))
    })?;
    let after = slices(&kubectl, node)?[0]["metadata"]["resourceVersion"].clone();
    assert_eq!(before, after, "the restart wrote to an unchanged slice");

    // A new card bumps the pool generation.
    std::fs::write(&inv, inventory(&[("Tesla T4", 15), ("Tesla T4", 15)]))?;
    let slice = eventually("generation 2 with two devices", Duration::from_secs(10), || {
        driver.check_running()?;
        Ok(slices(&kubectl, node)?.into_iter().find(|s| s["spec"]["pool"]["generation"] == 2))
    })?;
    assert_eq!(slice["spec"]["devices"].as_array().map(Vec::len), Some(2));
    assert_eq!(slice["spec"]["driver"], DRIVER);
    Ok(())
}

#[test]
fn split_count_bounds_the_shares_of_a_card() {
    let mut plane = ControlPlane::start().expect("control plane");
    let run = |plane: &mut ControlPlane| -> anyhow::Result<()> {
        let node = "split-node";
        plane.create_node(node)?;
        let kubectl = plane.kubectl().clone();
        let mut driver = start_driver(plane, "driver", node, &["--mock-gpus=1xTesla T4:15Gi", "--device-split-count=2"])?;
        eventually("the node's slice", Duration::from_secs(30), || {
            driver.check_running()?;
            Ok(slices(&kubectl, node)?.into_iter().next())
        })?;
        for name in ["s1", "s2"] {
            kubectl.apply(&claim_on(name, node, "4Gi", "20"))?;
            plane.wait_allocated("default", name, Duration::from_secs(30))?;
        }
        // Memory and cores are left, but the card holds no more than two shares.
        kubectl.apply(&claim_on("s3", node, "1Gi", "1"))?;
        assert_unschedulable(&kubectl, "s3")
    };
    if let Err(e) = run(&mut plane) {
        panic!("{e:#}");
    }
}

#[test]
fn an_unreachable_api_server_is_retried_and_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = vgpu_dra_integration::free_port().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    vgpu_dra_integration::write_kubeconfig(&kubeconfig, &format!("https://127.0.0.1:{port}"), "t").unwrap();
    let bin = vgpu_dra_integration::driver_binary().unwrap();
    let args: Vec<String> =
        ["kubelet-plugin", "--node-name=n1", "--mock-gpus=T4:15Gi", "--inventory-poll-ms=100", "--metrics-address=127.0.0.1:0"]
            .iter()
            .map(|s| (*s).to_owned())
            .chain([format!("--kubeconfig={}", kubeconfig.display())])
            .chain(
                ["kubelet", "cdi", "vgpu", "vgpulock"]
                    .iter()
                    .zip(["--kubelet-dir", "--cdi-dir", "--hami-core-dir", "--lock-dir"])
                    .map(|(d, f)| format!("{f}={}", dir.path().join(d).display())),
            )
            .collect();
    let mut driver = vgpu_dra_integration::ManagedProcess::spawn("driver", bin, &args, dir.path()).unwrap();
    // Several backoff rounds (200 ms, 400 ms, 800 ms, ...) pass in 4 s.
    std::thread::sleep(Duration::from_secs(4));
    driver.check_running().unwrap();
    let log = std::fs::read_to_string(driver.log()).unwrap();
    assert_eq!(log.matches("publishing ResourceSlices failed").count(), 1, "{log}");
}
