//! The Helm chart on the test bed: lint and schema with the test bed's helm, the rendered objects
//! accepted by the real API server, the driver running with exactly the DaemonSet's arguments and
//! the chart's RBAC, its DeviceClass selecting our slices in a real allocation, and the
//! ValidatingAdmissionPolicy refusing writes to another node's slices in the API server's own
//! admission.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::chart::{chart_dir, helm, run_as_daemonset_pod};
use common::{DRIVER, claim_and_pod_on};
use vgpu_dra_integration::{ControlPlane, Kubectl, eventually};

const NS: &str = "vgpu-dra";

fn slice_yaml(name: &str, node: &str, driver: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: {name}}}\n\
spec: {{driver: {driver}, nodeName: {node}, pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}, devices: []}}\n"
    )
}

fn refused(result: anyhow::Result<String>, wants: &[&str]) {
    let err = format!("{:#}", result.expect_err("the API server accepted a write the policy forbids"));
    for want in wants {
        assert!(err.contains(want), "refusal lacks {want:?}: {err}");
    }
}

/// The image every install names: the one the user built and pushed.
const IMAGE: &str = "image.repository=registry.example.com/vgpu-dra";

#[test]
fn chart_lints_and_refuses_bad_values() {
    let plane = ControlPlane::start().expect("control plane");
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let all = format!("{chart}/ci/all-values.yaml");
    // No image is published, so every install names one (README); without it the install fails
    // with a message that says what to do.
    helm(&plane, &["lint", "--strict", chart, "--set", IMAGE]).unwrap();
    helm(&plane, &["lint", "--strict", chart, "-f", &all]).unwrap();
    let err = helm(&plane, &["template", "x", chart]).expect_err("an install without an image");
    assert!(format!("{err:#}").contains("image.repository is empty: build the image"), "{err:#}");
    // A wrong value fails at install time with the value's path in the message.
    for (set, wants) in [
        ("deviceSplitCount=0", "/deviceSplitCount"),
        ("logLevel=loud", "/logLevel"),
        ("driverName=Not_A_Name", "/driverName"),
        ("metrics.port=70000", "/metrics/port"),
        ("deviceMemoryScaling=-1", "/deviceMemoryScaling"),
        ("hamiCore.hostPath=relative/dir", "/hamiCore/hostPath"),
        ("devicesplitcount=4", "devicesplitcount"),
    ] {
        let err = helm(&plane, &["template", "x", chart, "--set", IMAGE, "--set", set]).expect_err(set);
        assert!(format!("{err:#}").contains(wants), "--set {set}: {err:#}");
    }
    // dra.enabled=false installs nothing (HAMi's device-plugin mode is not ours to run).
    let off = helm(&plane, &["template", "x", chart, "--set", IMAGE, "--set", "dra.enabled=false"]).unwrap();
    assert!(!off.contains("kind:"), "{off}");
}

#[test]
fn chart_installs_and_confines_the_driver_to_its_node() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    for node in ["node-a", "node-b"] {
        plane.create_node(node)?;
    }

    // Every option set: the objects are valid to the real API server.
    kubectl.run(&["create", "namespace", "vgpu-dra-full"])?;
    let full = helm(plane, &["template", "full", chart, "-n", "vgpu-dra-full", "-f", &format!("{chart}/ci/all-values.yaml")])?;
    kubectl.apply(&full)?;
    let ds = kubectl.get_json(&["daemonset", "full-vgpu-dra", "-n", "vgpu-dra-full"])?;
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for want in ["--hami-core-dir=/opt/hami/vgpu", "--kubelet-dir=/var/lib/k0s/kubelet", "--mock-gpus=2xTesla T4:15Gi"] {
        anyhow::ensure!(args.contains(want), "DaemonSet args lack {want}: {args}");
    }

    // The defaults, the way the issue and the docs install it.
    kubectl.run(&["create", "namespace", NS])?;
    let rendered = helm(plane, &["template", "vgpu-dra", chart, "-n", NS, "--set", IMAGE])?;
    kubectl.apply(&rendered)?;
    let class = kubectl.get_json(&["deviceclass", DRIVER])?;
    anyhow::ensure!(class["spec"]["selectors"][0]["cel"]["expression"].as_str().is_some_and(|e| e.contains("hami-gpu")));

    // The driver as the DaemonSet runs it on node-a, with the service account's RBAC only.
    let mut pod = run_as_daemonset_pod(plane, NS, "vgpu-dra", "node-a", &["--mock-gpus=1xTesla T4:15Gi"])?;
    let as_driver = kubectl.with_kubeconfig(pod.kubeconfig.clone());
    eventually("node-a's slice published with the chart's RBAC", Duration::from_secs(30), || {
        pod.process.check_running()?;
        let list = kubectl.get_json(&["resourceslices", "--field-selector=spec.nodeName=node-a"])?;
        Ok(list["items"].as_array().and_then(|i| i.first().cloned()))
    })?;

    // The chart's DeviceClass selects the slice in a real allocation by the scheduler.
    kubectl.apply(&claim_and_pod_on("share", "node-a", "4Gi", "50"))?;
    let result = plane.wait_allocated("default", "share", Duration::from_secs(30))?;
    assert_eq!(result["device"], "hami-gpu-0");
    assert_eq!(result["pool"], "node-a");
    assert_eq!(result["consumedCapacity"]["memory"], "4Gi");
    assert_eq!(result["consumedCapacity"]["cores"], "50");

    // Least privilege: nothing beyond the verbs the driver calls (`can-i -q` exits 1 for no).
    let may = |verb: &str, resource: &str| as_driver.run(&["auth", "can-i", "-q", verb, resource]).is_ok();
    anyhow::ensure!(
        may("patch", "resourceslices") && may("watch", "resourceclaims") && may("get", "pods"),
        "the driver lacks its own verbs"
    );
    for (verb, resource) in
        [("update", "resourceslices"), ("get", "secrets"), ("patch", "nodes"), ("create", "resourceclaims"), ("list", "pods")]
    {
        anyhow::ensure!(!may(verb, resource), "the driver may {verb} {resource}");
    }

    // The policy, in the API server's admission: node-a's token cannot touch node-b's slices.
    refused(as_driver.apply(&slice_yaml("intruder", "node-b", DRIVER)), &["may not write ResourceSlice intruder of node node-b"]);
    kubectl.apply(&slice_yaml("node-b-own", "node-b", DRIVER))?;
    refused(as_driver.run(&["delete", "resourceslice", "node-b-own"]), &["node-a may not write", "of node node-b"]);
    refused(
        as_driver.apply(
            &slice_yaml("node-b-own", "node-b", DRIVER)
                .replace("{name: node-b-own}", "{name: node-b-own, labels: {taken: 'yes'}}"),
        ),
        &["may not write ResourceSlice node-b-own of node node-b"],
    );
    // Nor write another driver's slices on its own node.
    refused(
        as_driver.apply(&slice_yaml("foreign", "node-a", "gpu.nvidia.com")),
        &["only ResourceSlices of driver", "gpu.nvidia.com"],
    );
    // A token not bound to a pod on a node names no node, and may write nothing.
    let unbound = kubectl.run(&["create", "token", "vgpu-dra", "-n", NS])?;
    let unbound_cfg = plane.dir().join("unbound.kubeconfig");
    vgpu_dra_integration::write_kubeconfig(&unbound_cfg, plane.server(), unbound.trim())?;
    refused(kubectl.with_kubeconfig(unbound_cfg).apply(&slice_yaml("unbound-write", "node-a", DRIVER)), &["names no node"]);
    // The admin is not the driver: the policy leaves everyone else alone.
    kubectl.run(&["delete", "resourceslice", "node-b-own"])?;

    // After all that, node-a's own slices are still the driver's to keep.
    pod.process.check_running()?;
    assert_only_driver_slices(&kubectl)?;
    let log = std::fs::read_to_string(pod.process.log())?;
    anyhow::ensure!(!log.to_lowercase().contains("forbidden"), "the driver hit RBAC limits:\n{log}");
    Ok(())
}

fn assert_only_driver_slices(kubectl: &Kubectl) -> anyhow::Result<()> {
    let list = kubectl.get_json(&["resourceslices"])?;
    let nodes: Vec<&str> =
        list["items"].as_array().into_iter().flatten().filter_map(|s| s["spec"]["nodeName"].as_str()).collect();
    anyhow::ensure!(!nodes.is_empty() && nodes.iter().all(|n| *n == "node-a"), "slices on {nodes:?}");
    Ok(())
}
