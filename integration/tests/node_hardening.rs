//! The node daemon tried as an attacker, a crashing node and an unlucky operator would: hostile
//! allocations written past the scheduler, several requests and claims per container, a
//! restart with a smaller configuration, garbage in its directories, a hung API server, a lost
//! record while the API is down, and claims deleted behind the kubelet's back. Claims come from
//! the real API server (and the real scheduler where it matters), prepares go through the
//! kubelet's own plugin code, specs are read back by the CDI library.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{DRIVER, Dirs, NODE, cdi_check, claim_response, claim_with, driver_with, kubelet};
use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, Kubectl, eventually};

fn error_of(reply: &Value, uid: &str) -> String {
    if let Some(e) = reply.get("error") {
        return e.to_string();
    }
    claim_response(reply, uid)["error"].as_str().unwrap_or_default().to_owned()
}

fn uid_of(kubectl: &Kubectl, name: &str) -> String {
    kubectl.run(&["get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}"]).unwrap()
}

/// A claim with a hand-written allocation of `results` (flow mappings without driver and pool),
/// as a buggy or hostile writer of the status subresource could leave it.
fn hand_allocated(kubectl: &Kubectl, name: &str, results: &[String]) -> String {
    let spec = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {{deviceClassName: {DRIVER}}}\n"
    );
    kubectl.run_with_input(&["create", "-f", "-"], Some(&spec)).unwrap();
    let results: String = results.iter().map(|r| format!("      - {{driver: {DRIVER}, pool: {NODE}, {r}}}\n")).collect();
    let holder = common::claim_holder(kubectl, "default");
    let status = format!(
        "{spec}status:\n  reservedFor:\n  - {{resource: pods, name: claim-holder, uid: {holder}}}\n  allocation:\n    devices:\n      results:\n{results}"
    );
    kubectl.run_with_input(&["replace", "--subresource=status", "-f", "-"], Some(&status)).unwrap();
    uid_of(kubectl, name)
}

fn result(request: &str, share: u32, memory: &str, cores: &str, shares: &str) -> String {
    format!(
        "device: hami-gpu-0, request: {request}, shareID: {share:08x}-0000-4000-8000-000000000000, consumedCapacity: {{memory: \"{memory}\", cores: \"{cores}\", shares: \"{shares}\"}}"
    )
}

fn plane_with_class() -> (ControlPlane, Kubectl, Dirs) {
    let plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let kubectl = plane.kubectl().clone();
    // The DeviceClass (and an unused claim) from the shared template.
    kubectl.apply(&claim_with("unused", "1Gi", "1")).unwrap();
    let dirs = Dirs::new(plane.dir());
    (plane, kubectl, dirs)
}

#[test]
fn hostile_allocations_and_names_are_refused_with_their_cause() {
    let (plane, kubectl, dirs) = plane_with_class();
    let zero_memory = hand_allocated(&kubectl, "zero-memory", &[result("gpu", 1, "0", "10", "1")]);
    let zero_share = hand_allocated(&kubectl, "zero-share", &[result("gpu", 2, "1Gi", "10", "0")]);
    let twice = hand_allocated(&kubectl, "twice", &[result("gpu", 3, "1Gi", "10", "1"), result("gpu", 3, "1Gi", "10", "1")]);
    let _drv = driver_with(&plane, &dirs, "driver", &[]);
    let mut k = kubelet(&dirs);
    let reply = k
        .prepare(&[
            ("default", "zero-memory", &zero_memory),
            ("default", "zero-share", &zero_share),
            ("default", "twice", &twice),
        ])
        .unwrap();
    let e = error_of(&reply, &zero_memory);
    assert!(e.contains("consumedCapacity memory = 0") && e.contains("below the minimum 1Mi"), "{e}");
    let e = error_of(&reply, &zero_share);
    assert!(e.contains("consumedCapacity shares = 0") && e.contains("below the minimum 1"), "{e}");
    let e = error_of(&reply, &twice);
    assert!(e.contains("two results on hami-gpu-0 with the same share ID"), "{e}");
    // A name that would address the status subresource of another claim never reaches the API.
    let reply = k.prepare(&[("default", "zero-memory/status", &zero_memory)]).unwrap();
    let e = error_of(&reply, &zero_memory);
    assert!(e.contains("object name \"zero-memory/status\" is invalid"), "{e}");
    assert!(dirs.checkpointed().is_empty(), "nothing was prepared");
    assert_eq!(
        std::fs::read_dir(&dirs.cdi)
            .map_or(0, |d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().ends_with(".json")).count()),
        0
    );
}

#[test]
fn two_requests_on_one_card_are_one_device_and_two_claims_in_one_container_are_refused() {
    let (mut plane, kubectl, dirs) = plane_with_class();
    // One claim, two requests; the node has one card, so the scheduler puts both on it. A
    // second pod has a container that uses two claims.
    kubectl
        .apply(&format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: pair, namespace: default}}
spec:
  devices:
    requests:
    - {{name: a, exactly: {{deviceClassName: {DRIVER}, capacity: {{requests: {{memory: 4Gi, cores: "20"}}}}}}}}
    - {{name: b, exactly: {{deviceClassName: {DRIVER}, capacity: {{requests: {{memory: 8Gi, cores: "30"}}}}}}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: o1, namespace: default}}
spec:
  devices:
    requests:
    - {{name: gpu, exactly: {{deviceClassName: {DRIVER}, capacity: {{requests: {{memory: 512Mi, cores: "10"}}}}}}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: o2, namespace: default}}
spec:
  devices:
    requests:
    - {{name: gpu, exactly: {{deviceClassName: {DRIVER}, capacity: {{requests: {{memory: 512Mi, cores: "10"}}}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: p1, namespace: default}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {NODE}}}
  resourceClaims: [{{name: pair, resourceClaimName: pair}}]
  containers:
  - {{name: whole, image: registry.invalid/none, resources: {{claims: [{{name: pair}}]}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: p2, namespace: default}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {NODE}}}
  resourceClaims: [{{name: first, resourceClaimName: o1}}, {{name: second, resourceClaimName: o2}}]
  containers:
  - {{name: plain, image: registry.invalid/none}}
  - {{name: greedy, image: registry.invalid/none, resources: {{claims: [{{name: first}}, {{name: second}}]}}}}
"#
        ))
        .unwrap();
    // The driver publishes the slice the scheduler allocates from.
    let _drv = driver_with(&plane, &dirs, "driver", &[]);
    for name in ["pair", "o1", "o2"] {
        plane.wait_allocated("default", name, Duration::from_secs(30)).unwrap();
    }
    eventually("claims reserved for their pods", Duration::from_secs(30), || {
        let c = kubectl.get_json(&["resourceclaim", "o2"])?;
        Ok(c["status"]["reservedFor"].get(0).map(|_| ()))
    })
    .unwrap();
    let (pair, o1, o2) = (uid_of(&kubectl, "pair"), uid_of(&kubectl, "o1"), uid_of(&kubectl, "o2"));
    let mut k = kubelet(&dirs);
    let reply = k.prepare(&[("default", "o1", &o1), ("default", "o2", &o2)]).unwrap();
    for uid in [&o1, &o2] {
        let e = error_of(&reply, uid);
        assert!(e.contains("container greedy of pod p2 also uses claim"), "{e}");
    }
    let reply = k.prepare(&[("default", "pair", &pair)]).unwrap();
    assert_eq!(error_of(&reply, &pair), "", "{reply}");
    let devices = claim_response(&reply, &pair)["devices"].as_array().unwrap().clone();
    assert_eq!(devices.len(), 2);
    let ids: Vec<&str> = devices.iter().filter_map(|d| d["cdi_device_ids"][0].as_str()).collect();
    assert_eq!(ids[0], ids[1], "both requests name the card's one CDI device");
    let report = cdi_check(&dirs.cdi, &ids);
    let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=12288m"), "{env:?}");
    assert!(env.contains(&"CUDA_DEVICE_SM_LIMIT=50"), "{env:?}");
    assert!(!env.iter().any(|e| e.starts_with("CUDA_DEVICE_MEMORY_LIMIT_1")), "{env:?}");
    let visible = env.iter().find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES=")).unwrap();
    assert!(!visible.contains(','), "one card: {visible}");
}

fn metric(port: u16, name: &str, label: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_restart_with_a_smaller_configuration_keeps_the_ledger_at_the_sum_of_prepared_claims() {
    let (plane, kubectl, dirs) = plane_with_class();
    let a = hand_allocated(&kubectl, "a", &[result("gpu", 1, "12Gi", "10", "1")]);
    let b = hand_allocated(&kubectl, "b", &[result("gpu", 2, "12Gi", "10", "1")]);
    let c = hand_allocated(&kubectl, "c", &[result("gpu", 3, "1Gi", "10", "1")]);
    // Memory scaling 2: the 15Gi card offers 30Gi, both 12Gi claims fit.
    let mut drv = driver_with(&plane, &dirs, "driver-scaled", &["--device-memory-scaling=2"]);
    let mut k = kubelet(&dirs);
    let reply = k.prepare(&[("default", "a", &a), ("default", "b", &b)]).unwrap();
    assert_eq!((error_of(&reply, &a), error_of(&reply, &b)), (String::new(), String::new()), "{reply}");
    drv.stop();
    drop(k);
    // Back to scaling 1: 24Gi prepared on a card of 15Gi.
    let port = vgpu_dra_integration::free_port().unwrap();
    let _drv = driver_with(&plane, &dirs, "driver-smaller", &[&format!("--metrics-address=127.0.0.1:{port}")]);
    let mut k = kubelet(&dirs);
    let allocated =
        eventually("metrics", Duration::from_secs(20), || Ok(metric(port, "vgpu_dra_device_allocated", "capacity=\"memory\"")))
            .unwrap();
    assert_eq!(allocated, (24u64 << 30) as f64, "the ledger is the sum of prepared claims");
    assert_eq!(metric(port, "vgpu_dra_device_overcommitted", "capacity=\"memory\""), Some(1.0));
    // The owners hear it too: a Warning event on each claim of the card.
    let warned = eventually("OverCapacity events", Duration::from_secs(20), || {
        let events = kubectl.get_json(&["events.events.k8s.io", "-n", "default"])?;
        let names: Vec<String> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reason"] == "OverCapacity" && e["type"] == "Warning")
            .filter_map(|e| e["regarding"]["name"].as_str().map(str::to_owned))
            .collect();
        Ok((names.len() >= 2).then_some(names))
    })
    .unwrap();
    assert!(warned.contains(&"a".to_owned()) && warned.contains(&"b".to_owned()), "{warned:?}");
    let reply = k.prepare(&[("default", "c", &c)]).unwrap();
    let e = error_of(&reply, &c);
    assert!(e.contains("device hami-gpu-0: memory requested 1Gi, only 0 of 15Gi free"), "{e}");
    // Releasing one brings the card back under; the small claim fits again.
    assert_eq!(error_of(&k.unprepare(&[("default", "b", &b)]).unwrap(), &b), "");
    let reply = k.prepare(&[("default", "c", &c)]).unwrap();
    assert_eq!(error_of(&reply, &c), "", "{reply}");
}

#[test]
fn garbage_in_every_directory_and_a_hung_api_server_delay_nothing_prepared() {
    let (plane, kubectl, dirs) = plane_with_class();
    let a = hand_allocated(&kubectl, "a", &[result("gpu", 1, "4Gi", "50", "1")]);
    let mut drv = driver_with(&plane, &dirs, "driver-first", &[]);
    let mut k = kubelet(&dirs);
    assert_eq!(error_of(&k.prepare(&[("default", "a", &a)]).unwrap(), &a), "");
    drv.stop();
    drop(k);
    let spec_file = std::fs::read_dir(&dirs.cdi)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().contains(&a))
        .unwrap()
        .path();
    let good_spec = std::fs::read_to_string(&spec_file).unwrap();
    std::fs::write(&spec_file, "{ garbled").unwrap();
    let stem = "k8s.hami-core-gpu.project-hami.io-claim";
    for dir in [dirs.checkpoint(), dirs.cdi.clone(), dirs.vgpu.join("claims")] {
        for (n, what) in ["fifo", "dir", "link"].iter().enumerate() {
            let uid = format!("0000000{n}-0000-4000-8000-000000000000");
            let path = dir.join(format!("{stem}_{uid}.json"));
            let plain = dir.join(format!("{uid}.json"));
            match *what {
                "fifo" => {
                    for p in [&path, &plain] {
                        assert!(std::process::Command::new("mkfifo").arg(p).status().unwrap().success());
                    }
                }
                "dir" => {
                    std::fs::create_dir_all(&path).unwrap();
                    std::fs::create_dir_all(&plain).unwrap();
                }
                _ => {
                    std::os::unix::fs::symlink(dir.join("nowhere"), &path).unwrap();
                    std::os::unix::fs::symlink(dir.join("nowhere"), &plain).unwrap();
                }
            }
        }
    }
    // Other vendors' specs live in the same directory: a FIFO and a 256 MiB file there must
    // neither block nor slow a prepare (they used to be read whole, under the state lock).
    assert!(std::process::Command::new("mkfifo").arg(dirs.cdi.join("vendor-fifo.json")).status().unwrap().success());
    std::fs::File::create(dirs.cdi.join("vendor-huge.json")).unwrap().set_len(256 << 20).unwrap();
    let mut drv = driver_with(&plane, &dirs, "driver-after-garbage", &[]);
    let mut k = kubelet(&dirs);
    drv.check_running().unwrap();
    assert_eq!(std::fs::read_to_string(&spec_file).unwrap(), good_spec, "the garbled spec was rewritten at start");
    // With the API server hung, a batch holding the prepared claim and one that needs the API
    // is answered within 5 s: the prepared one from the checkpoint, the other after the read
    // deadline (not the kubelet's 45 s).
    let frozen = plane.freeze_apiserver().unwrap();
    let started = std::time::Instant::now();
    let ghost = "11111111-0000-4000-8000-000000000000";
    let reply = k.prepare(&[("default", "a", &a), ("default", "ghost", ghost)]).unwrap();
    let took = started.elapsed();
    frozen.thaw();
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(error_of(&reply, &a), "", "{reply}");
    assert!(error_of(&reply, ghost).contains("no answer from the API server"), "{reply}");
    // Logs written to a file carry no terminal colour codes.
    assert!(!std::fs::read_to_string(drv.log()).unwrap().contains('\x1b'), "ANSI escapes in the log file");
}

#[test]
fn a_lost_record_while_the_api_is_down_deletes_nothing_and_deleted_claims_are_released() {
    let (plane, kubectl, dirs) = plane_with_class();
    let a = hand_allocated(&kubectl, "a", &[result("gpu", 1, "4Gi", "50", "1")]);
    let b = hand_allocated(&kubectl, "b", &[result("gpu", 2, "2Gi", "10", "1")]);
    let fast = ["--state-check-ms=300", "--deleted-claim-grace-seconds=2"];
    let mut drv = driver_with(&plane, &dirs, "driver-first", &fast);
    let mut k = kubelet(&dirs);
    let reply = k.prepare(&[("default", "a", &a), ("default", "b", &b)]).unwrap();
    assert_eq!((error_of(&reply, &a), error_of(&reply, &b)), (String::new(), String::new()), "{reply}");
    drv.stop();
    drop(k);
    // A's record is lost, and the API is down when the driver starts again.
    std::fs::write(dirs.checkpoint().join(format!("{a}.json")), "{ truncated").unwrap();
    let has_spec = |uid: &str| {
        std::fs::read_dir(&dirs.cdi).unwrap().filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().contains(uid))
    };
    let frozen = plane.freeze_apiserver().unwrap();
    let mut drv = driver_with(&plane, &dirs, "driver-api-down", &fast);
    let mut k = kubelet(&dirs);
    std::thread::sleep(Duration::from_secs(4));
    drv.check_running().unwrap();
    assert!(has_spec(&a), "the running claim's spec is kept while the API cannot say");
    assert!(dirs.vgpu.join("claims").join(&a).is_dir(), "and its directory");
    frozen.thaw();
    // Once the API answers, the claim is adopted back: its record is written again.
    eventually("claim a re-adopted", Duration::from_secs(20), || Ok(dirs.checkpointed().contains(&a).then_some(()))).unwrap();
    assert!(has_spec(&a));
    // B is deleted from the API without an unprepare: released after the grace period.
    kubectl.run(&["delete", "resourceclaim", "b", "--wait=false"]).unwrap();
    eventually("claim b released", Duration::from_secs(20), || {
        Ok((!dirs.checkpointed().contains(&b) && !has_spec(&b)).then_some(()))
    })
    .unwrap();
    assert!(dirs.checkpointed().contains(&a), "A stands");
    assert_eq!(error_of(&k.prepare(&[("default", "a", &a)]).unwrap(), &a), "");
}

/// The driver as `start_driver` runs it, but in a private mount namespace where the CDI
/// directory is a read-only bind mount (root ignores permission bits, so a mode would prove
/// nothing).
fn driver_with_read_only_cdi(plane: &ControlPlane, dirs: &Dirs, name: &str) -> vgpu_dra_integration::ManagedProcess {
    let binary = vgpu_dra_integration::driver_binary().unwrap();
    let mut command = vec![
        binary.display().to_string(),
        "kubelet-plugin".into(),
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        "--inventory-poll-ms=200".into(),
        "--metrics-address=127.0.0.1:0".into(),
    ];
    command.extend(dirs.args());
    let quoted: Vec<String> = command.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    let cdi = dirs.cdi.display().to_string();
    let script = format!("mount --bind '{cdi}' '{cdi}' && mount -o remount,bind,ro '{cdi}' && exec {}", quoted.join(" "));
    let args: Vec<String> =
        ["--mount", "--propagation", "private", "sh", "-c", &script].iter().map(|s| (*s).to_owned()).collect();
    vgpu_dra_integration::ManagedProcess::spawn(name, std::path::Path::new("/usr/bin/unshare"), &args, plane.dir()).unwrap()
}

#[test]
fn a_read_only_cdi_directory_at_start_fails_prepares_not_the_daemon() {
    let (plane, kubectl, dirs) = plane_with_class();
    let a = hand_allocated(&kubectl, "a", &[result("gpu", 1, "4Gi", "50", "1")]);
    let b = hand_allocated(&kubectl, "b", &[result("gpu", 2, "2Gi", "10", "1")]);
    let mut drv = driver_with(&plane, &dirs, "driver-first", &[]);
    let mut k = kubelet(&dirs);
    assert_eq!(error_of(&k.prepare(&[("default", "a", &a)]).unwrap(), &a), "");
    drv.stop();
    drop(k);
    // A reboot wiped the (tmpfs) CDI directory, and it comes back read-only.
    for entry in std::fs::read_dir(&dirs.cdi).unwrap().filter_map(Result::ok) {
        std::fs::remove_file(entry.path()).unwrap();
    }
    std::fs::remove_file(dirs.kubelet.join("plugins_registry").join(format!("{DRIVER}-reg.sock"))).ok();
    let mut drv = driver_with_read_only_cdi(&plane, &dirs, "driver-read-only");
    let mut k = kubelet(&dirs);
    drv.check_running().expect("the daemon starts and serves with a read-only CDI directory");
    // Each claim gets its own error naming the file system; the daemon stays up.
    let reply = k.prepare(&[("default", "a", &a), ("default", "b", &b)]).unwrap();
    for uid in [&a, &b] {
        let e = error_of(&reply, uid);
        assert!(e.contains("Read-only file system"), "{e}");
    }
    drv.check_running().unwrap();
    assert!(dirs.checkpointed().contains(&a), "the prepared claim's record is kept");
    assert!(!dirs.checkpointed().contains(&b), "the refused one left no record");
    drv.stop();
    drop(k);
    // Writable again: the prepared claim's spec is rewritten at start.
    let _drv = driver_with(&plane, &dirs, "driver-writable", &[]);
    let mut k = kubelet(&dirs);
    eventually("spec of a rewritten", Duration::from_secs(20), || {
        Ok(std::fs::read_dir(&dirs.cdi)?
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().contains(&a))
            .then_some(()))
    })
    .unwrap();
    let reply = k.prepare(&[("default", "a", &a), ("default", "b", &b)]).unwrap();
    assert_eq!((error_of(&reply, &a), error_of(&reply, &b)), (String::new(), String::new()), "{reply}");
}
