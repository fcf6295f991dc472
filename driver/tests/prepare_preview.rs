//! `vgpu-dra prepare-preview`: the spec an allocated claim would get, or its error with exit 2.

#![allow(clippy::unwrap_used)]

use std::process::Command;

const CLAIM: &str = r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c1, namespace: team-a, uid: 6f1c0a9e-1b2c-4d5e-8f90-0123456789ab}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: hami-core-gpu.project-hami.io}
status:
  allocation:
    devices:
      results:
      - {driver: hami-core-gpu.project-hami.io, pool: n1, device: hami-gpu-1, request: gpu, shareID: 8d2f0c1e-0000-4000-8000-000000000001,
         consumedCapacity: {memory: 6Gi, cores: "30", shares: "1"}}
"#;

fn preview(claim: &str, node: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claim.yaml");
    std::fs::write(&path, claim).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-dra"))
        .args(["prepare-preview", "--claim", path.to_str().unwrap(), "--node-name", node, "--mock-gpus", "2xNVIDIA L4:24Gi"])
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn prints_the_spec_with_limits_for_the_allocated_share() {
    let (code, stdout, stderr) = preview(CLAIM, "n1");
    assert_eq!(code, 0, "{stderr}");
    let spec: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(spec["kind"], "k8s.hami-core-gpu.project-hami.io/claim");
    assert_eq!(
        spec["devices"][0]["name"],
        "6f1c0a9e-1b2c-4d5e-8f90-0123456789ab-hami-gpu-1-8d2f0c1e-0000-4000-8000-000000000001"
    );
    assert_eq!(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia1");
    let env: Vec<&str> = spec["containerEdits"]["env"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=6144m"), "{env:?}");
    assert!(env.contains(&"CUDA_DEVICE_SM_LIMIT=30"), "{env:?}");
    assert_eq!(spec["annotations"]["vgpu-dra.io/claim"], "team-a/c1");
}

#[test]
fn a_claim_for_another_node_or_device_is_refused_with_exit_2() {
    let (code, _, stderr) = preview(CLAIM, "n2");
    assert_eq!(code, 2);
    assert!(stderr.contains("not to this node n2"), "{stderr}");
    let (code, _, stderr) = preview(&CLAIM.replace("hami-gpu-1", "hami-gpu-7"), "n1");
    assert_eq!(code, 2);
    assert!(stderr.contains("device hami-gpu-7 does not exist"), "{stderr}");
    let (code, _, stderr) = preview(&CLAIM.replace("status:", "statusx:"), "n1");
    assert_eq!(code, 2, "{stderr}");
}

/// The preview runs the daemon's own prepare against an empty ledger: what the daemon refuses,
/// it refuses, with the daemon's message.
#[test]
fn a_share_the_node_would_refuse_is_refused_with_the_daemons_reason() {
    // 30Gi of a 24Gi card: the scheduler never writes it, the ledger refuses it.
    let (code, stdout, stderr) = preview(&CLAIM.replace("memory: 6Gi", "memory: 30Gi"), "n1");
    assert_eq!(code, 2, "{stdout}");
    assert!(stderr.contains("device hami-gpu-1: memory requested 30Gi, only 24Gi of 24Gi free"), "{stderr}");
    // A zero memory share would read as "unlimited" to HAMi-core.
    let (code, _, stderr) = preview(&CLAIM.replace("memory: 6Gi", "memory: \"0\""), "n1");
    assert_eq!(code, 2);
    assert!(stderr.contains("below the minimum"), "{stderr}");
    // A name that could address another object is refused before anything else.
    let (code, _, stderr) = preview(&CLAIM.replace("name: c1,", "name: c1/status,"), "n1");
    assert_eq!(code, 2);
    assert!(stderr.contains("object name \"c1/status\" is invalid"), "{stderr}");
}

/// HAMi's task priority and core policy, carried by the webhook as this driver's opaque claim
/// configuration, reach the container as the variables HAMi-core reads.
#[test]
fn the_claims_hami_core_settings_reach_the_spec() {
    let with_config = CLAIM.replace(
        "    devices:\n      results:",
        "    devices:\n      config:\n      - source: FromClaim\n        opaque: {driver: hami-core-gpu.project-hami.io, parameters: {apiVersion: hami-core-gpu.project-hami.io/v1alpha1, kind: HamiCoreConfig, taskPriority: 1, coreUtilizationPolicy: force}}\n      results:",
    );
    let (code, stdout, stderr) = preview(&with_config, "n1");
    assert_eq!(code, 0, "{stderr}");
    let spec: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let env: Vec<&str> = spec["containerEdits"]["env"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(env.contains(&"CUDA_TASK_PRIORITY=1") && env.contains(&"GPU_CORE_UTILIZATION_POLICY=force"), "{env:?}");
    let (code, _, stderr) = preview(&with_config.replace("kind: HamiCoreConfig", "kind: Other"), "n1");
    assert_eq!(code, 2);
    assert!(stderr.contains("opaque configuration for this driver"), "{stderr}");
}
