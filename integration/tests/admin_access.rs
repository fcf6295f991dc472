//! Admin access (KEP-5018) on the real scheduler: a claim with `adminAccess: true` in a namespace
//! labelled for it, asking the least of a card, gets the card a share already holds, and its
//! prepare gives a monitoring view (the card's device nodes and `NVIDIA_VISIBLE_DEVICES`, no
//! HAMi-core preload, limits or claim directory) while the share keeps its own; in an unlabelled
//! namespace the API server refuses such a claim. The allocator charges admin access capacity
//! like any request on these devices (a monitoring claim asking nothing would take the whole
//! card), which the ledger follows.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use vgpu_dra_integration::ControlPlane;

mod common;

use common::{DRIVER, Dirs, NODE, cdi_check, claim_response, claim_with, driver, kubelet};

fn admin_claim_and_pod(namespace: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: watch, namespace: {namespace}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {DRIVER}
        adminAccess: true
        capacity: {{requests: {{memory: 1Mi, cores: "0"}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: watch, namespace: {namespace}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {NODE}}}
  resourceClaims: [{{name: gpu, resourceClaimName: watch}}]
  containers:
  - name: main
    image: registry.invalid/none
    resources: {{claims: [{{name: gpu}}]}}
"#
    )
}

#[test]
fn an_admin_claim_sees_a_held_card_without_limits_and_only_where_allowed() {
    let mut plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let kubectl = plane.kubectl().clone();
    let dirs = Dirs::new(plane.dir());
    let mut drv = driver(&plane, &dirs, "driver");
    let mut kubelet = kubelet(&dirs);

    // A share holds the card but for a sliver.
    kubectl.apply(&claim_with("busy", "14Gi", "99")).unwrap();
    plane.wait_allocated("default", "busy", Duration::from_secs(30)).unwrap();
    let busy = kubectl.run(&["get", "resourceclaim", "busy", "-o", "jsonpath={.metadata.uid}"]).unwrap();

    // Unlabelled: refused at the API server, before the scheduler sees it.
    kubectl.run(&["create", "namespace", "plain"]).unwrap();
    let refused = kubectl.apply(&admin_claim_and_pod("plain")).unwrap_err();
    assert!(format!("{refused:#}").contains("admin"), "{refused:#}");

    // Labelled: allocated on the held card.
    kubectl
        .apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: monitoring, labels: {resource.kubernetes.io/admin-access: \"true\"}}\n")
        .unwrap();
    kubectl.apply(&admin_claim_and_pod("monitoring")).unwrap();
    if let Err(e) = plane.wait_allocated("monitoring", "watch", Duration::from_secs(30)) {
        let pod = kubectl.get_json(&["pod", "watch", "-n", "monitoring"]).unwrap_or_default();
        let events = kubectl.run(&["get", "events", "-n", "monitoring", "-o", "yaml"]).unwrap_or_default();
        panic!("{e:#}\npod status: {}\nevents: {events}", pod["status"]);
    }
    let claim = kubectl.get_json(&["resourceclaim", "watch", "-n", "monitoring"]).unwrap();
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    assert_eq!((result["device"].as_str(), result["adminAccess"].as_bool()), (Some("hami-gpu-0"), Some(true)), "{claim}");
    let watch = claim["metadata"]["uid"].as_str().unwrap().to_owned();

    let reply = kubelet.prepare(&[("default", "busy", &busy), ("monitoring", "watch", &watch)]).unwrap();
    for uid in [&busy, &watch] {
        let r = claim_response(&reply, uid);
        assert!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    }
    let id = claim_response(&reply, &watch)["devices"][0]["cdi_device_ids"][0].as_str().unwrap().to_owned();
    let report = cdi_check(&dirs.cdi, &[&id]);
    let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(env.iter().any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=GPU-")), "{env:?}");
    assert!(!env.iter().any(|e| e.starts_with("CUDA_")), "a monitoring claim got HAMi-core settings: {env:?}");
    assert!(report["mounts"].as_array().is_none_or(Vec::is_empty), "no preload, no claim directory: {report}");
    assert!(report["deviceNodes"].as_array().unwrap().iter().any(|n| n["path"] == "/dev/nvidia0"), "{report}");
    assert!(!dirs.vgpu.join("claims").join(&watch).exists(), "a claim directory for a monitoring claim");
    // The share keeps its limits beside it.
    let busy_id = claim_response(&reply, &busy)["devices"][0]["cdi_device_ids"][0].as_str().unwrap().to_owned();
    let busy_env = cdi_check(&dirs.cdi, &[&busy_id])["env"].to_string();
    assert!(busy_env.contains("CUDA_DEVICE_MEMORY_LIMIT_0=14336m"), "{busy_env}");

    // Unprepared, it leaves the share as it was.
    let un = kubelet.unprepare(&[("monitoring", "watch", &watch)]).unwrap();
    assert!(claim_response(&un, &watch).get("error").is_none_or(|e| e.as_str() == Some("")), "{un}");
    assert_eq!(dirs.specs_for(&busy), 1);
    drv.check_running().unwrap();
}
