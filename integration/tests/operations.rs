//! Operations on the test bed: metrics with the 003 scenario's numbers, device health through the
//! kubelet's own health client and as a slice taint the scheduler honours, and probes that turn
//! unready when the plugin loses its sockets.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{DRIVER, Dirs, NODE, claim_with};
use serde_json::{Value, json};
use vgpu_dra_integration::{ControlPlane, KubeletSim, KubeletSimOptions, eventually, free_port};

fn http_get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return (0, String::new()) };
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
}

fn inventory(healthy: bool) -> String {
    json!({"driverVersion": "550.54.15", "cudaDriverVersion": [12, 4], "gpus": [{
        "uuid": "GPU-ops-0", "minor": 0, "index": 0, "productName": "Tesla T4", "memoryBytes": 15u64 << 30,
        "health": if healthy { "healthy" } else { "unhealthy" }}]})
    .to_string()
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(&format!("{name}{{"))).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[test]
fn metrics_health_and_probes() {
    let mut plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let kubectl = plane.kubectl().clone();
    let dirs = Dirs::new(plane.dir());
    let inv = plane.dir().join("inventory.json");
    std::fs::write(&inv, inventory(true)).unwrap();
    let port = free_port().unwrap();
    let mut args = dirs.args();
    args.retain(|a| !a.starts_with("--mock-gpus"));
    args.push(format!("--mock-inventory={}", inv.display()));
    args.push(format!("--metrics-address=127.0.0.1:{port}"));
    std::fs::create_dir_all(dirs.kubelet.join("plugins_registry")).unwrap();
    let extra: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut drv = vgpu_dra_integration::start_driver(&plane, "driver-ops", NODE, &extra).unwrap();
    let opts = KubeletSimOptions { node_name: NODE.into(), health: true, ..Default::default() };
    let mut kubelet = KubeletSim::start(&dirs.kubelet.join("plugins_registry"), DRIVER, &opts).unwrap();
    kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER).unwrap();
    eventually("/readyz ok", Duration::from_secs(20), || {
        drv.check_running()?;
        Ok((http_get(port, "/readyz").0 == 200).then_some(()))
    })
    .unwrap();

    let mut uids = Vec::new();
    for name in ["m1", "m2"] {
        kubectl.apply(&claim_with(name, "4Gi", "50")).unwrap();
        plane.wait_allocated("default", name, Duration::from_secs(30)).unwrap();
        uids.push(kubectl.run(&["get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}"]).unwrap());
    }
    let reply = kubelet.prepare(&[("default", "m1", &uids[0]), ("default", "m2", &uids[1])]).unwrap();
    assert!(reply["response"]["claims"][&uids[1]]["devices"][0]["device_name"] == "hami-gpu-0", "{reply}");
    let (code, text) = http_get(port, "/metrics");
    assert_eq!(code, 200);
    assert_eq!(metric(&text, "hami_dra_gpu_memory_allocated_bytes"), Some(8_589_934_592.0), "{text}");
    assert_eq!(metric(&text, "hami_dra_gpu_memory_limit_bytes"), Some(16_106_127_360.0), "{text}");
    assert_eq!(metric(&text, "hami_dra_gpu_core_allocated_ratio"), Some(1.0), "{text}");
    assert!(text.contains("vgpu_dra_prepared_claims 2"), "{text}");
    // Per pod: each share under the pod the scheduler reserved the claim for.
    for pod in ["m1", "m2"] {
        let line = |name: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with(name) && l.contains(&format!("pod_name=\"{pod}\"")) && l.contains("pod_namespace=\"default\"")
                })
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
        };
        assert_eq!(line("hami_dra_vgpu_memory_allocated_bytes{"), Some(4_294_967_296.0), "{text}");
        assert_eq!(line("hami_dra_vgpu_core_allocated_ratio{"), Some(0.5), "{text}");
        let native = format!("capacity=\"cores\",namespace=\"default\",claim=\"{pod}\",pod=\"{pod}\"}} 50");
        assert!(text.contains(&native), "{native} missing:\n{text}");
    }
    assert!(text.contains("vgpu_dra_prepare_duration_seconds_count{result=\"ok\"} 2"), "{text}");
    assert!(text.contains("vgpu_dra_slice_writes_total{op=\"apply\",result=\"ok\"}"), "{text}");

    // The card turns unhealthy: the kubelet's health client hears it within 5 s, the slice is
    // tainted and the scheduler places no new claim there.
    std::fs::write(&inv, inventory(false)).unwrap();
    let event = kubelet
        .wait_event("health", Duration::from_secs(5), |e| {
            e["devices"].as_array().is_some_and(|d| d.iter().any(|d| d["health"] == 2))
        })
        .unwrap();
    assert_eq!(event["devices"][0]["device"]["device_name"], "hami-gpu-0", "{event}");
    eventually("the NoSchedule taint", Duration::from_secs(10), || {
        let list = kubectl.get_json(&["resourceslices"])?;
        let tainted = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["spec"]["devices"][0]["taints"][0]["effect"] == "NoSchedule");
        Ok(tainted.then_some(()))
    })
    .unwrap();
    kubectl.apply(&claim_with("m3", "1Gi", "1")).unwrap();
    eventually("m3 unschedulable", Duration::from_secs(30), || {
        let pod: Value = kubectl.get_json(&["pod", "m3"])?;
        Ok(pod["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["reason"] == "Unschedulable")).then_some(()))
    })
    .unwrap();

    // A plugin that lost its service socket is no longer healthy nor ready.
    std::fs::remove_file(dirs.kubelet.join("plugins").join(DRIVER).join("dra.sock")).unwrap();
    assert_eq!(http_get(port, "/readyz").0, 503);
    assert_eq!(http_get(port, "/healthz").0, 503);
}
