//! HAMi's `device-config.yaml`, unchanged, through `--config` as a user runs `vgpu-dra inventory`
//! with it: Volcano's file (source document 001) and HAMi's chart default are accepted, a wrong
//! type stops it with one line naming file, line and key, and unknown keys do not stop it.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduling/testdata").join(name)
}

fn inventory(config: &Path, gpus: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-dra"))
        .args(["inventory", "--node-name", "n1", "--mock-gpus", gpus, "-o", "json"])
        .arg("--config")
        .arg(config)
        .env_remove("NODE_NAME")
        .env_remove("VGPU_DRA_DEVICE_MEMORY_SCALING")
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

fn capacity(stdout: &str, name: &str) -> String {
    let list: serde_json::Value = serde_json::from_str(stdout).unwrap();
    list["items"][0]["spec"]["devices"][0]["capacity"][name]["value"].as_str().unwrap().to_owned()
}

#[test]
fn volcanos_device_config_is_accepted_unchanged() {
    let (code, stdout, stderr) = inventory(&testdata("volcano-device-config.yaml"), "1xNVIDIA GeForce RTX 3060:12Gi");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(capacity(&stdout, "shares"), "10");
    // Its deviceMemoryScaling: 256 is not applied (volcano-vgpu-device-plugin never applies it).
    assert_eq!(capacity(&stdout, "memory"), "12Gi");
}

#[test]
fn hamis_default_device_config_is_accepted_unchanged() {
    let (code, stdout, stderr) = inventory(&testdata("hami-device-config.yaml"), "1xTesla T4:15Gi");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!((capacity(&stdout, "shares"), capacity(&stdout, "memory")), ("10".into(), "15Gi".into()));
}

#[test]
fn a_wrong_type_names_file_line_and_key_and_an_unknown_key_does_not_stop_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("device-config.yaml");
    let text = std::fs::read_to_string(testdata("volcano-device-config.yaml")).unwrap();
    std::fs::write(&bad, text.replace("deviceSplitCount: 10 ", "deviceSplitCount: ten ")).unwrap();
    let (code, stdout, stderr) = inventory(&bad, "1xTesla T4:15Gi");
    assert_eq!(code, 2);
    assert!(stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let want = format!("{} line 11: nvidia.deviceSplitCount: expected an integer, got \"ten\"", bad.display());
    assert!(stderr.contains(&want), "{stderr}");

    std::fs::write(&bad, "nvidia:\n  deviceSplitCount: 4\n  someFutureKey: {a: 1}\nascend: []\n").unwrap();
    let (code, stdout, stderr) = inventory(&bad, "1xTesla T4:15Gi");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(capacity(&stdout, "shares"), "4");
}
