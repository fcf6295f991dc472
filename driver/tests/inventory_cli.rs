//! `vgpu-dra inventory` as a user runs it: the printed List, and one-line errors with exit 2.

#![allow(clippy::unwrap_used)]

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-dra")).args(args).env_remove("NODE_NAME").output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn prints_one_slice_for_a_t4_as_a_v1_list() {
    let (code, stdout, stderr) = run(&["inventory", "--node-name", "n1", "--mock-gpus", "1xTesla T4:15Gi", "-o", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    let slice = &items[0];
    assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(slice["kind"], "ResourceSlice");
    assert_eq!(slice["spec"]["nodeName"], "n1");
    assert_eq!(slice["spec"]["pool"]["name"], "n1");
    assert_eq!(slice["spec"]["driver"], "hami-core-gpu.project-hami.io");
    let device = &slice["spec"]["devices"][0];
    assert_eq!(device["name"], "hami-gpu-0");
    assert_eq!(device["allowMultipleAllocations"], true);
    assert_eq!(device["capacity"]["memory"]["value"], "15Gi");
    assert_eq!(device["capacity"]["cores"]["value"], "100");
    assert_eq!(device["capacity"]["shares"]["value"], "10");
    assert_eq!(device["attributes"]["type"]["string"], "hami-gpu");
    assert_eq!(device["attributes"]["productName"]["string"], "Tesla T4");
}

#[test]
fn dynamic_mig_prints_counter_sets_first_and_warns_for_a_card_it_cannot_offer() {
    let spec = "NVIDIA A800-SXM4-80GB:80Gi:mig,NVIDIA A30:24Gi:mig,Tesla T4:15Gi";
    let (code, stdout, stderr) =
        run(&["inventory", "--node-name", "n1", "--mock-gpus", spec, "--dynamic-mig", "all", "-o", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["spec"]["sharedCounters"][0]["name"], "gpu-0-counters");
    let devices = items[1]["spec"]["devices"].as_array().unwrap();
    let names: Vec<&str> = devices.iter().map(|d| d["name"].as_str().unwrap()).collect();
    // The A800's whole card (its full instance), the T4, then the A800's 25 placements; the A30
    // (not in the catalogue) has no instance, so it publishes nothing.
    assert_eq!(names[..2], ["hami-gpu-0", "hami-gpu-2"]);
    assert_eq!(names.len(), 2 + 25);
    assert_eq!(devices[0]["capacity"]["memory"]["value"], "79Gi");
    assert!(stderr.contains("NVIDIA A30") && stderr.contains("does not know this model"), "{stderr}");

    let (code, stdout, _) = run(&["inventory", "--node-name", "n1", "--mock-gpus", spec, "-o", "json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "off by default: no counter set");
    let (code, _, stderr) = run(&["inventory", "--node-name", "n1", "--mock-gpus", spec, "--dynamic-mig", "some"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--dynamic-mig"), "{stderr}");
}

#[test]
fn yaml_output_is_the_same_list() {
    let (code, yaml, _) = run(&["inventory", "--node-name", "n1", "--mock-gpus", "2xNVIDIA H200:141Gi,RTX 3060:12Gi"]);
    assert_eq!(code, 0);
    assert!(yaml.starts_with("apiVersion: v1\nkind: List\n"), "{yaml}");
    assert_eq!(yaml.matches("kind: ResourceSlice").count(), 1);
    for name in ["hami-gpu-0", "hami-gpu-1", "hami-gpu-2"] {
        assert!(yaml.contains(&format!("name: {name}")), "{name} missing");
    }
    assert!(yaml.contains("value: 141Gi") && yaml.contains("value: 12Gi"));
}

#[test]
fn bad_specs_fail_with_one_line_naming_the_item_and_exit_2() {
    for (spec, item) in [("1xTesla T4:15Gi,H100", "\"H100\""), ("T4:lots", "\"T4:lots\""), ("0xT4:1Gi", "\"0xT4:1Gi\"")] {
        let (code, stdout, stderr) = run(&["inventory", "--node-name", "n1", "--mock-gpus", spec]);
        assert_eq!(code, 2, "{spec}");
        assert!(stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(item), "{spec}: {stderr}");
    }
    let (code, _, stderr) = run(&["inventory", "--node-name", "n1", "--mock-gpus", "T4:1Gi", "--driver-name", "Bad_Name"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--driver-name"), "{stderr}");
}

#[test]
fn without_the_nvidia_library_nvml_discovery_fails_in_one_line() {
    // These test machines have no NVIDIA driver; on a GPU node this test is not meaningful.
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let (code, stdout, stderr) = run(&["inventory", "--node-name", "n1"]);
    assert_ne!(code, 0);
    assert!(stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("NVML unavailable") && stderr.contains("--mock-gpus"), "{stderr}");
}
