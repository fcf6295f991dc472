//! The node-local device loop on the test bed: with the API server frozen and one card's reads
//! hanging, the kubelet's own health client hears that card is unhealthy, a claim prepared on the
//! other card is answered at once, and readiness follows the failed and the next good publish.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{DRIVER, Dirs, NODE, claim_response, claim_with};
use serde_json::{Value, json};
use vgpu_dra_integration::{ControlPlane, KubeletSim, KubeletSimOptions, eventually, free_port, patience, start_driver};

/// Card 0 has room for the test's 12 GiB claim; card 1 does not, so the claim lands on card 0.
fn inventory(card1_hangs: bool) -> String {
    let mut card1 = json!({"uuid": "GPU-loop-1", "minor": 1, "index": 1, "productName": "Tesla T4", "memoryBytes": 8u64 << 30});
    if card1_hangs {
        card1["simulate"] = json!("hang");
    }
    json!({"driverVersion": "550.54.15", "cudaDriverVersion": [12, 4], "gpus": [
        {"uuid": "GPU-loop-0", "minor": 0, "index": 0, "productName": "Tesla T4", "memoryBytes": 16u64 << 30},
        card1,
    ]})
    .to_string()
}

/// Replaces the file in one step, so the driver never reads half of it.
fn write_inventory(path: &Path, card1_hangs: bool) {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, inventory(card1_hangs)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn http_status(port: u16, path: &str) -> u16 {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return 0 };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// Whether a health event says `device` has `health` (1 healthy, 2 unhealthy).
fn reports(event: &Value, device: &str, health: u64) -> bool {
    event["devices"].as_array().is_some_and(|d| d.iter().any(|d| d["device"]["device_name"] == device && d["health"] == health))
}

fn ok(reply: &Value, uid: &str) -> bool {
    reply.get("error").is_none() && claim_response(reply, uid).get("error").is_none_or(|e| e.as_str() == Some(""))
}

#[test]
fn a_hung_card_is_reported_and_other_prepares_answer_while_the_api_server_is_frozen() {
    let mut plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let kubectl = plane.kubectl().clone();
    let dirs = Dirs::new(plane.dir());
    std::fs::create_dir_all(dirs.kubelet.join("plugins_registry")).unwrap();
    let inv = plane.dir().join("inventory.json");
    write_inventory(&inv, false);
    let port = free_port().unwrap();
    let mut args = dirs.args();
    args.retain(|a| !a.starts_with("--mock-gpus"));
    args.push(format!("--mock-inventory={}", inv.display()));
    args.push(format!("--metrics-address=127.0.0.1:{port}"));
    let extra: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut drv = start_driver(&plane, "driver-loop", NODE, &extra).unwrap();
    let opts = KubeletSimOptions { node_name: NODE.into(), health: true, ..Default::default() };
    let mut kubelet = KubeletSim::start(&dirs.kubelet.join("plugins_registry"), DRIVER, &opts).unwrap();
    kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER).unwrap();
    kubelet
        .wait_event("health", Duration::from_secs(20), |e| reports(e, "hami-gpu-0", 1) && reports(e, "hami-gpu-1", 1))
        .unwrap();
    eventually("/readyz ok", Duration::from_secs(20), || {
        drv.check_running()?;
        Ok((http_status(port, "/readyz") == 200).then_some(()))
    })
    .unwrap();

    kubectl.apply(&claim_with("c0", "12Gi", "50")).unwrap();
    let allocated = plane.wait_allocated("default", "c0", Duration::from_secs(30)).unwrap();
    assert_eq!(allocated["device"], "hami-gpu-0", "{allocated}");
    let uid = kubectl.run(&["get", "resourceclaim", "c0", "-o", "jsonpath={.metadata.uid}"]).unwrap();
    let claim = [("default", "c0", uid.as_str())];
    let first = kubelet.prepare(&claim).unwrap();
    assert!(ok(&first, &uid), "{first}");

    let frozen = plane.freeze_apiserver().unwrap();
    write_inventory(&inv, true);
    let hung_at = Instant::now();

    // Card 1's reads hang; a repeat prepare of the claim on card 0 needs neither the API nor
    // card 1, and is answered well within the kubelet's deadline.
    let started = Instant::now();
    let again = kubelet.prepare(&claim).unwrap();
    let took = started.elapsed();
    assert!(ok(&again, &uid), "{again}");
    assert_eq!(claim_response(&again, &uid)["devices"], claim_response(&first, &uid)["devices"], "{again}");
    assert!(took < Duration::from_secs(5), "a prepared claim took {took:?} with the API frozen and card 1 hung");

    // The kubelet's health client hears card 1 is unhealthy, card 0 still healthy.
    let event = kubelet
        .wait_event("health", Duration::from_secs(10), |e| reports(e, "hami-gpu-1", 2) && reports(e, "hami-gpu-0", 1))
        .unwrap();
    let reported = hung_at.elapsed();
    assert!(reported < Duration::from_secs(10).mul_f64(patience()), "reported after {reported:?}: {event}");
    eprintln!("with the API frozen: repeat prepare {took:?}, card 1 reported unhealthy after {reported:?}");

    // The publish of the unhealthy card fails against the frozen API server: not ready.
    eventually("/readyz 503 after the failed publish", Duration::from_secs(20), || {
        drv.check_running()?;
        Ok((http_status(port, "/readyz") == 503).then_some(()))
    })
    .unwrap();

    frozen.thaw();
    eventually("/readyz ok after the next publish", Duration::from_secs(30), || {
        drv.check_running()?;
        Ok((http_status(port, "/readyz") == 200).then_some(()))
    })
    .unwrap();
    let slices = kubectl.get_json(&["resourceslices"]).unwrap();
    let tainted: Vec<&Value> = slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .filter(|d| d["taints"].as_array().is_some_and(|t| !t.is_empty()))
        .collect();
    assert_eq!(tainted.len(), 1, "{slices}");
    assert_eq!(tainted[0]["name"], "hami-gpu-1", "{slices}");

    // The hung read returns: card 1 is read again and healthy.
    write_inventory(&inv, false);
    kubelet.events.clear();
    kubelet
        .wait_event("health", Duration::from_secs(20), |e| reports(e, "hami-gpu-1", 1) && reports(e, "hami-gpu-0", 1))
        .unwrap();
}
