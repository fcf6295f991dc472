//! What the driver needs of the API server, on a real API server that lacks it: without
//! consumable capacity (the gate off, as in Kubernetes 1.34 and 1.35 by default) the driver stops
//! at start with an error naming the gate, and publishes nothing; with it (every other test) it
//! starts. An API server without `resource.k8s.io/v1` is an older release than the test bed
//! builds (a 1.36 kube-apiserver with the group turned off never becomes ready), so that case is
//! `driver/src/preflight.rs`'s unit test against a fake server.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use vgpu_dra_integration::{ControlPlane, PlaneOptions, eventually, start_driver};

const NODE: &str = "preflight-node";

/// Starts the driver on `plane` and waits for it to exit; returns its log.
fn exits_with(plane: &ControlPlane) -> String {
    plane.create_node(NODE).unwrap();
    let mut driver = start_driver(plane, "driver", NODE, &["--mock-gpus=1xTesla T4:15Gi"]).unwrap();
    eventually("the driver to give up at start", Duration::from_secs(60), || {
        Ok(driver.check_running().err().map(|e| format!("{e:#}")))
    })
    .unwrap()
}

#[test]
fn without_consumable_capacity_the_driver_names_the_gate_and_publishes_nothing() {
    // The test bed's gates, with consumable capacity off (GA but not locked in 1.38, where the
    // fractional ranges that build on it must go off too, or the API server refuses to start).
    let mut gates =
        "DRAConsumableCapacity=false,DRADeviceTaints=true,DRAPartitionableDevices=true,DRAExtendedResource=true".to_owned();
    if vgpu_dra_integration::kubernetes_minor() >= 38 {
        gates.push_str(",DRAFractionalCapacityRange=false");
    }
    let plane = ControlPlane::start_with(&PlaneOptions { apiserver_feature_gates: Some(gates), ..Default::default() }).unwrap();
    let log = exits_with(&plane);
    assert!(log.contains("DRAConsumableCapacity") && log.contains("allowMultipleAllocations"), "{log}");
    let slices = plane.kubectl().get_json(&["resourceslices"]).unwrap();
    assert_eq!(slices["items"].as_array().map(Vec::len), Some(0), "a slice was published: {slices}");
}
