//! The kubelet plugin end to end: the kubelet's own plugin manager registers it, claims
//! allocated by the real scheduler are prepared into CDI specs that the reference CDI library
//! injects with HAMi-core's limits, each claim's `status.devices` says those limits until it is
//! unprepared, and the plugin survives lost specs, a corrupt checkpoint and restarts.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, KubeletSim, KubeletSimOptions, eventually};

mod common;

use common::{DRIVER, Dirs, NODE, cdi_check, claim_and_pod, claim_response, driver, status_devices};

#[test]
fn kubelet_plugin_prepares_claims_into_hami_core_cdi_specs() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    let dirs = Dirs::new(plane.dir());
    // The NVIDIA Container Toolkit's own spec for card 0, as `nvidia-ctk cdi generate` writes it.
    std::fs::create_dir_all(&dirs.cdi)?;
    std::fs::write(
        dirs.cdi.join("nvidia.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    env: [NVIDIA_TOOLKIT_DEVICE=0]\n",
    )?;
    let mut drv = driver(plane, &dirs, "driver");
    let registry = dirs.kubelet.join("plugins_registry");
    std::fs::create_dir_all(&registry)?;
    // With a kubeconfig kubelet-sim wipes the node's slices at start, as a starting kubelet does.
    let opts =
        KubeletSimOptions { kubeconfig: Some(plane.kubeconfig().to_path_buf()), node_name: NODE.into(), ..Default::default() };
    let mut kubelet = KubeletSim::start(&registry, DRIVER, &opts)?;
    let reg = kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER)?;
    anyhow::ensure!(reg.get("error").is_none(), "registration failed: {reg}");
    drv.check_running()?;

    for name in ["c1", "c2"] {
        kubectl.apply(&claim_and_pod(name))?;
    }
    let mut uids = Vec::new();
    for name in ["c1", "c2"] {
        plane.wait_allocated("default", name, Duration::from_secs(30))?;
        uids.push(kubectl.run(&["get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}"])?);
    }
    let reply = kubelet.prepare(&[("default", "c1", &uids[0]), ("default", "c2", &uids[1])])?;
    let mut ids = Vec::new();
    for uid in &uids {
        let r = claim_response(&reply, uid);
        anyhow::ensure!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
        let dev = &r["devices"][0];
        assert_eq!(dev["device_name"], "hami-gpu-0");
        assert_eq!(dev["pool_name"], NODE);
        assert!(dev["share_id"].as_str().is_some_and(|s| !s.is_empty()), "{reply}");
        ids.push(dev["cdi_device_ids"][0].as_str().unwrap().to_owned());
    }
    assert!(ids[0].starts_with(&format!("k8s.{DRIVER}/claim={}-hami-gpu-0-", uids[0])), "{}", ids[0]);
    assert_eq!(claim_response(&reply, &uids[0])["devices"][0]["cdi_device_ids"][1], "nvidia.com/gpu=0", "{reply}");
    // Each claim's status says, per share, the card and the limits its spec gives (KEP-4817).
    for (name, uid) in [("c1", &uids[0]), ("c2", &uids[1])] {
        let entries = eventually(&format!("{name}'s status.devices"), Duration::from_secs(30), || {
            drv.check_running()?;
            Ok(Some(status_devices(&kubectl, "default", name)?).filter(|e| !e.is_empty()))
        })?;
        anyhow::ensure!(entries.len() == 1, "{name}: {entries:?}");
        let data = &entries[0]["data"];
        anyhow::ensure!(data["memoryLimit"] == "4096m" && data["smLimit"] == "50", "{name} ({uid}): {data}");
        anyhow::ensure!(data["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")), "{name}: {data}");
    }
    // The toolkit's spec is not ours: listing and cleanup leave it alone.
    assert!(dirs.cdi.join("nvidia.yaml").exists());

    // What the runtime would inject, through the reference CDI library.
    let report = cdi_check(&dirs.cdi, &[&ids[0]]);
    let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for want in ["CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT=50", "CUDA_DEVICE_SM_LIMIT_0=50"] {
        assert!(env.contains(&want), "{want} missing from {env:?}");
    }
    let cache = format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={}/claims/{}/GPU-", dirs.vgpu.display(), uids[0]);
    assert!(env.iter().any(|e| e.starts_with(&cache)), "{env:?}");
    let mounts = report["mounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["destination"] == "/etc/ld.so.preload"), "{mounts:?}");
    assert!(mounts.iter().any(|m| m["destination"] == format!("{}/libvgpu.so", dirs.vgpu.display())), "{mounts:?}");
    let nodes = report["deviceNodes"].as_array().unwrap();
    assert!(nodes.iter().any(|n| n["path"] == "/dev/nvidia0"), "{nodes:?}");
    assert_eq!(std::fs::read_to_string(dirs.vgpu.join("ld.so.preload"))?.trim(), format!("{}/libvgpu.so", dirs.vgpu.display()));

    // A repeated prepare gives the same answer; a wiped CDI dir is restored by it.
    for f in std::fs::read_dir(&dirs.cdi)? {
        let path = f?.path();
        if !path.ends_with("nvidia.yaml") {
            std::fs::remove_file(path)?;
        }
    }
    let again = kubelet.prepare(&[("default", "c1", &uids[0])])?;
    assert_eq!(claim_response(&again, &uids[0])["devices"], claim_response(&reply, &uids[0])["devices"]);
    cdi_check(&dirs.cdi, &[&ids[0]]);

    // A wrong UID is that claim's error, not the batch's.
    let mixed = kubelet.prepare(&[("default", "c2", "00000000-0000-0000-0000-000000000000"), ("default", "c2", &uids[1])])?;
    let err = claim_response(&mixed, "00000000-0000-0000-0000-000000000000")["error"].as_str().unwrap_or_default().to_owned();
    assert!(err.contains("has UID") && err.contains("the kubelet asked for"), "{mixed}");
    assert!(claim_response(&mixed, &uids[1])["devices"][0]["device_name"] == "hami-gpu-0", "{mixed}");

    // The slices wiped by kubelet-sim at its start came back.
    eventually("slices republished", Duration::from_secs(10), || {
        let list = kubectl.get_json(&["resourceslices"])?;
        Ok(list["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
    })?;

    // A truncated checkpoint does not stop the plugin; it rebuilds from specs and the API.
    drop(kubelet);
    drv.stop();
    let record = dirs.checkpoint().join(format!("{}.json", uids[0]));
    let text = std::fs::read_to_string(&record)?;
    std::fs::write(&record, &text[..text.len() / 3])?;
    let mut drv = driver(plane, &dirs, "driver-after-corruption");
    let mut kubelet = KubeletSim::start(&registry, DRIVER, &KubeletSimOptions { node_name: NODE.into(), ..Default::default() })?;
    kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER)?;
    drv.check_running()?;
    let log = std::fs::read_to_string(drv.log())?;
    assert!(log.contains("checkpoint corrupt"), "{log}");
    let after = kubelet.prepare(&[("default", "c1", &uids[0])])?;
    assert_eq!(claim_response(&after, &uids[0])["devices"], claim_response(&reply, &uids[0])["devices"]);

    // Unprepare removes the spec; unknown claims succeed.
    let un = kubelet.unprepare(&[("default", "c1", &uids[0]), ("default", "gone", "11111111-2222-3333-4444-555555555555")])?;
    for uid in [uids[0].as_str(), "11111111-2222-3333-4444-555555555555"] {
        assert!(claim_response(&un, uid).get("error").is_none_or(|e| e.as_str() == Some("")), "{un}");
    }
    let left: Vec<_> =
        std::fs::read_dir(&dirs.cdi)?.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(left.iter().all(|f| !f.contains(&uids[0])), "{left:?}");
    assert!(!dirs.vgpu.join("claims").join(&uids[0]).exists());
    // The claim is still allocated and reserved (its pod stands), yet no longer prepared here:
    // the driver's entries leave its status.
    eventually("c1's status.devices cleared at unprepare", Duration::from_secs(30), || {
        drv.check_running()?;
        anyhow::ensure!(kubectl.get_json(&["resourceclaim", "c1"])?["status"]["allocation"].is_object(), "c1 deallocated");
        Ok(status_devices(&kubectl, "default", "c1")?.is_empty().then_some(()))
    })?;

    // An old kubelet speaking v1beta1 gets the same devices without share IDs.
    drop(kubelet);
    let mut old = KubeletSim::start(
        &registry,
        DRIVER,
        &KubeletSimOptions { node_name: NODE.into(), services: Some("v1beta1.DRAPlugin".into()), ..Default::default() },
    )?;
    old.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER)?;
    let beta = old.prepare(&[("default", "c2", &uids[1])])?;
    let dev = &claim_response(&beta, &uids[1])["devices"][0];
    assert_eq!(dev["device_name"], "hami-gpu-0", "{beta}");
    assert!(dev.get("share_id").is_none(), "{beta}");
    drv.check_running()?;
    Ok(())
}
