//! HAMi's and volcano-vgpu-device-plugin's `device-config.yaml`, unchanged, run the node daemon
//! against the real API server: the slice it publishes follows the file's meaningful keys, the
//! keys with no meaning here are logged once as ignored.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, eventually, start_driver};

const NODE: &str = "gpu-node";

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scheduling/testdata").join(name)
}

fn published_device(plane: &ControlPlane) -> Value {
    let kubectl = plane.kubectl().clone();
    eventually("the node's slice", Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceslices", &format!("--field-selector=spec.nodeName={NODE}")])?;
        Ok(list["items"].get(0).and_then(|s| s["spec"]["devices"].get(0)).cloned())
    })
    .unwrap()
}

#[test]
fn the_daemon_runs_on_hami_and_volcano_device_configs_unchanged() {
    let plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    for (file, gpus, memory) in [
        // Source document 001's file, for a 12 GiB RTX 3060 as in 000: its deviceMemoryScaling
        // of 256 is never applied by volcano-vgpu-device-plugin, so the card stays 12Gi.
        ("volcano-device-config.yaml", "1xNVIDIA GeForce RTX 3060:12Gi", "12Gi"),
        ("hami-device-config.yaml", "1xTesla T4:15Gi", "15Gi"),
    ] {
        let config = format!("--config={}", testdata(file).display());
        let mut drv = start_driver(&plane, &format!("driver-{file}"), NODE, &[&config, &format!("--mock-gpus={gpus}")]).unwrap();
        let device = published_device(&plane);
        drv.check_running().unwrap();
        assert_eq!(device["capacity"]["memory"]["value"], memory, "{file}: {device:#}");
        assert_eq!(device["capacity"]["shares"]["value"], "10", "{file}: deviceSplitCount 10: {device:#}");
        let log = std::fs::read_to_string(drv.log()).unwrap();
        assert_eq!(
            log.matches("device config keys with no effect in vgpu-dra").count(),
            1,
            "{file}: ignored keys are logged once: {log}"
        );
        drv.stop();
        plane.kubectl().run(&["delete", "resourceslices", "--all"]).unwrap();
    }
}
