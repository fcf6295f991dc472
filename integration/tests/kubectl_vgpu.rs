//! `kubectl vgpu usage` and `kubectl vgpu why` (also `vgpu-dra usage|why`) against the real API
//! server and scheduler: the figures of source documents 000 and 003 as printed, the reason a
//! pod waits with the amount missing, and, on generated claims and slices, agreement with what
//! the scheduler did: an allocated claim is never reported blocked, a pending one always has a
//! reason on every card.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::claim_on;
use serde_json::Value;
use vgpu_dra::discovery::DeviceSource;
use vgpu_dra::discovery::mock::{MockSource, parse_spec};
use vgpu_dra::slices::{PoolIdentity, build_slices};
use vgpu_dra_integration::{ControlPlane, driver_binary, eventually, plugin_dir, start_driver};
use vgpu_scheduling::{SharingConfig, publish};

/// `vgpu-dra <args> --kubeconfig <plane's>`.
fn vgpu(plane: &ControlPlane, args: &[&str]) -> Output {
    Command::new(driver_binary().unwrap())
        .args(args)
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .output()
        .unwrap()
}

fn stdout_ok(out: &Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{what} failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    eprintln!("--- {what} ---\n{text}");
    text
}

/// Waits until pod `name` is marked unschedulable, and returns the scheduler's message.
fn wait_unschedulable(plane: &ControlPlane, name: &str) -> String {
    eventually(&format!("pod {name} unschedulable"), Duration::from_secs(60), || {
        let pod = plane.kubectl().get_json(&["pod", name, "-n", "default"])?;
        Ok(scheduled_false(&pod))
    })
    .unwrap()
}

fn scheduled_false(pod: &Value) -> Option<String> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
        .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
}

/// The cells of the table row that starts with `node` and `device`.
fn row(text: &str, node: &str, device: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some(node) && w.next() == Some(device)
        })
        .unwrap_or_else(|| panic!("no row {node} {device} in\n{text}"));
    line.split("   ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned).collect()
}

#[test]
fn usage_and_why_explain_source_documents_000_and_003() {
    let mut plane = ControlPlane::start().expect("control plane");
    for node in ["rtx-node", "t4-node"] {
        plane.create_node(node).unwrap();
    }
    let _rtx = start_driver(&plane, "driver-rtx", "rtx-node", &["--mock-gpus=1xNVIDIA GeForce RTX 3060:12Gi"]).unwrap();
    let _t4 = start_driver(&plane, "driver-t4", "t4-node", &["--mock-gpus=1xTesla T4:15Gi"]).unwrap();
    let kubectl = plane.kubectl().clone();
    eventually("both nodes' slices", Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceslices"])?;
        Ok((list["items"].as_array().map_or(0, Vec::len) == 2).then_some(()))
    })
    .unwrap();

    // Source document 000: 2 x 3000Mi/30 run on a 12 GiB card, 9000Mi/30 waits.
    for name in ["d0-a", "d0-b"] {
        kubectl.apply(&claim_on(name, "rtx-node", "3000Mi", "30")).unwrap();
        plane.wait_allocated("default", name, Duration::from_secs(30)).unwrap();
    }
    kubectl.apply(&claim_on("d0-c", "rtx-node", "9000Mi", "30")).unwrap();
    // Source document 003: two 4Gi/50 run on a T4, the third waits for cores.
    for name in ["d3-a", "d3-b"] {
        kubectl.apply(&claim_on(name, "t4-node", "4Gi", "50")).unwrap();
        plane.wait_allocated("default", name, Duration::from_secs(30)).unwrap();
    }
    kubectl.apply(&claim_on("d3-c", "t4-node", "4Gi", "50")).unwrap();
    wait_unschedulable(&plane, "d0-c");
    wait_unschedulable(&plane, "d3-c");

    let wide = stdout_ok(&vgpu(&plane, &["usage", "-o", "wide"]), "usage -o wide");
    assert_eq!(
        row(&wide, "rtx-node", "hami-gpu-0"),
        [
            "rtx-node",
            "hami-gpu-0",
            "NVIDIA GeForce RTX 3060",
            "6000Mi/12Gi",
            "60/100",
            "2/10",
            "healthy",
            "default/d0-a,default/d0-b"
        ]
    );
    assert_eq!(
        row(&wide, "t4-node", "hami-gpu-0"),
        ["t4-node", "hami-gpu-0", "Tesla T4", "8Gi/15Gi", "100/100", "2/10", "healthy", "default/d3-a,default/d3-b"]
    );
    assert_eq!(row(&wide, "(cluster)", "(total)")[2..6], ["2 cards", "14192Mi/27Gi", "160/200", "4/20"]);
    let plain = stdout_ok(&vgpu(&plane, &["usage", "--node", "rtx-node"]), "usage --node rtx-node");
    assert!(!plain.contains("t4-node") && !plain.contains("default/d0-a"), "{plain}");

    let why = stdout_ok(&vgpu(&plane, &["why", "d0-c", "-n", "default"]), "why d0-c");
    assert!(why.lines().any(|l| l.starts_with("Scheduler: ") && l.contains("cannot allocate all claims")), "{why}");
    assert!(why.contains("Claim d0-c (pod claim gpu): pending"), "{why}");
    let rtx = why.lines().find(|l| l.trim_start().starts_with("rtx-node")).unwrap();
    assert!(rtx.ends_with("memory short by 2712Mi (asks 9000Mi, 6288Mi of 12Gi free)"), "{why}");
    let t4 = why.lines().find(|l| l.trim_start().starts_with("t4-node")).unwrap();
    assert!(t4.contains("the pod can only run on node rtx-node"), "{why}");

    let json: Value =
        serde_json::from_str(&stdout_ok(&vgpu(&plane, &["why", "d3-c", "-o", "json"]), "why d3-c -o json")).unwrap();
    let cards = json["claims"][0]["requests"][0]["cards"].as_array().unwrap();
    let t4 = cards.iter().find(|c| c["node"] == "t4-node").unwrap();
    assert_eq!(
        t4["reasons"],
        serde_json::json!([{"reason": "short", "capacity": "cores", "shortBy": "50", "consumes": "50", "free": "0", "total": "100"}]),
        "memory has room (8Gi of 15Gi used): cores stop it"
    );

    let allocated = stdout_ok(&vgpu(&plane, &["why", "d3-a"]), "why d3-a");
    assert!(allocated.contains("Claim d3-a (pod claim gpu): allocated"), "{allocated}");
    assert!(
        allocated.contains("CUDA_DEVICE_MEMORY_LIMIT_0=4096m") && allocated.contains("CUDA_DEVICE_SM_LIMIT=50"),
        "{allocated}"
    );
    assert!(!allocated.contains("short by"), "{allocated}");

    let missing = vgpu(&plane, &["why", "no-such-pod", "-n", "default"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("pod default/no-such-pod not found"), "{missing:?}");

    // As a kubectl plugin: kubectl finds `kubectl-vgpu` on PATH.
    let path = format!("{}:{}", plugin_dir().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(&plane.components().kubectl)
        .args(["vgpu", "usage", "-o", "json", &format!("--kubeconfig={}", plane.kubeconfig().display())])
        .env("PATH", path)
        .output()
        .unwrap();
    let report: Value = serde_json::from_str(&stdout_ok(&out, "kubectl vgpu usage -o json")).unwrap();
    assert_eq!(report["cluster"]["memory"], serde_json::json!({"allocated": "14192Mi", "total": "27Gi"}));
}

/// (memory, cores) of generated claim `i`: memory sometimes off the 1Mi grid (the scheduler
/// rounds it up), cores from 5 to 60.
fn generated_request(seed: &mut u64) -> (String, u64) {
    let mut next = |n: u64| {
        *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (*seed >> 33) % n
    };
    let mib = 256 + next(12_000);
    let memory = if next(3) == 0 { (mib * (1 << 20) - next(1 << 20)).to_string() } else { format!("{mib}Mi") };
    (memory, 5 + next(56))
}

#[test]
fn why_agrees_with_the_scheduler_on_generated_claims() {
    let plane = ControlPlane::start().expect("control plane");
    let kubectl = plane.kubectl().clone();
    // Cards of different sizes; one node allows only 3 shares per card.
    for (node, gpus, split) in
        [("gen-a", "1xTesla T4:15Gi,1xNVIDIA GeForce RTX 3060:12Gi", 10), ("gen-b", "1xNVIDIA A100:40Gi", 3)]
    {
        let uid = plane.create_node(node).unwrap();
        let config = SharingConfig { device_split_count: split, ..SharingConfig::default() };
        let inventory = MockSource::new(node, parse_spec(gpus).unwrap()).inventory().unwrap();
        let pool =
            PoolIdentity { driver: config.driver_name.clone(), node_name: node.into(), node_uid: Some(uid), generation: 1 };
        for slice in build_slices(&pool, &publish(&inventory, &config)) {
            let mut v = serde_json::to_value(&slice).unwrap();
            v["apiVersion"] = "resource.k8s.io/v1".into();
            v["kind"] = "ResourceSlice".into();
            kubectl.apply(&v.to_string()).unwrap();
        }
    }
    let mut yaml = String::new();
    let mut seed = 18;
    for i in 0..20 {
        let (memory, cores) = generated_request(&mut seed);
        // Pods on no particular node: the scheduler picks among every card.
        let one = claim_on(&format!("g{i}"), "NODE", &memory, &cores.to_string());
        yaml.push_str(&one.replace("  nodeSelector: {kubernetes.io/hostname: NODE}\n", ""));
        yaml.push_str("---\n");
    }
    kubectl.apply(&yaml).unwrap();

    // Every pod either has its claim allocated or was found unschedulable.
    eventually("every generated pod scheduled or unschedulable", Duration::from_secs(120), || {
        let pods = kubectl.get_json(&["pods", "-n", "default"])?;
        let claims = kubectl.get_json(&["resourceclaims", "-n", "default"])?;
        let allocated = |name: &str| {
            claims["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["metadata"]["name"] == name && !c["status"]["allocation"].is_null())
        };
        let settled = pods["items"].as_array().into_iter().flatten().filter(|p| {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            allocated(name) || scheduled_false(p).is_some()
        });
        Ok((settled.count() == 20).then_some(()))
    })
    .unwrap();

    let (mut allocated, mut pending) = (0, 0);
    for i in 0..20 {
        let name = format!("g{i}");
        let report: Value =
            serde_json::from_str(&stdout_ok(&vgpu(&plane, &["why", &name, "-o", "json"]), &format!("why {name}"))).unwrap();
        let claim = &report["claims"][0];
        let api = kubectl.get_json(&["resourceclaim", &name, "-n", "default"]).unwrap();
        match claim["state"].as_str() {
            Some("allocated") => {
                allocated += 1;
                assert!(claim.get("requests").is_none(), "{name}: allocated but reported blocked: {claim}");
                let result = &api["status"]["allocation"]["devices"]["results"][0];
                assert_eq!(claim["placements"][0]["device"], result["device"], "{name}");
                assert_eq!(claim["placements"][0]["node"], result["pool"], "{name}");
            }
            Some("pending") => {
                pending += 1;
                assert!(api["status"]["allocation"].is_null(), "{name}: the scheduler allocated it meanwhile: {api}");
                let cards = claim["requests"][0]["cards"].as_array().unwrap();
                assert_eq!(cards.len(), 3, "{name}: every card is considered");
                for card in cards {
                    let blocking =
                        card["reasons"].as_array().unwrap().iter().filter(|r| r["reason"] != "selectorNotEvaluated").count();
                    assert!(blocking > 0, "{name}: pending, yet {} {} has no reason: {claim}", card["node"], card["device"]);
                }
            }
            other => panic!("{name}: state {other:?}: {report}"),
        }
    }
    eprintln!("{allocated} allocated, {pending} pending");
    assert!(allocated > 0 && pending > 0, "the generated load should both fit and overflow the cards");
    stdout_ok(&vgpu(&plane, &["usage", "-o", "wide"]), "usage -o wide");
}
