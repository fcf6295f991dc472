//! Dynamic MIG prepare (issue #36) through the driver, the real scheduler and the kubelet's
//! plugin code, with the MIG simulator standing for an A800's card: its instances are kept in
//! a file (`--mock-mig-state`), so they outlive a driver killed with SIGKILL as a card's do.
//!
//! - a claim on a placement device gets an instance made at prepare, at that placement, and the
//!   container sees it (`NVIDIA_VISIBLE_DEVICES` is the instance's UUID); unprepare destroys it;
//! - a kill at every step of prepare and unprepare, and the kubelet's retry against the
//!   restarted driver, leave exactly the instances the kubelet last asked for;
//! - two software shares of the card share one full-size instance, each with its own
//!   HAMi-core limits, which goes with the last of them.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{DRIVER, Dirs, NODE, claim_response, kubelet, pod_using, wait_dead};
use serde_json::Value;
use vgpu_dra::mig::MigSim;
use vgpu_dra_integration::{ControlPlane, Kubectl, ManagedProcess, start_driver};

const PRODUCT: &str = "NVIDIA A800-SXM4-80GB";

/// A DeviceClass `class` of the driver's devices of `type` `kind`, a claim `name` of one device
/// of it with `selector` (a CEL expression) and `capacity` (YAML lines under `exactly`), and a
/// pod on the node using it.
fn claim(name: &str, class: &str, kind: &str, selector: &str, capacity: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: {class}}}
spec:
  selectors:
  - cel:
      expression: device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{kind}"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: default}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {class}
        selectors: [{{cel: {{expression: '{selector}'}}}}]
{capacity}---
{}"#,
        pod_using(name, NODE)
    )
}

/// A control plane with the node, the kubelet's directories, and where the simulator keeps
/// the card's instances.
fn test_bed() -> (ControlPlane, Kubectl, Dirs, PathBuf) {
    let plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let kubectl = plane.kubectl().clone();
    let dirs = Dirs::new(plane.dir());
    std::fs::create_dir_all(dirs.kubelet.join("plugins_registry")).unwrap();
    let state = plane.dir().join("mig-sim.json");
    (plane, kubectl, dirs, state)
}

/// The driver on one mock A800 in MIG mode, its simulator's state in `state`.
fn mig_driver(plane: &ControlPlane, dirs: &Dirs, state: &Path, name: &str, extra: &[&str]) -> ManagedProcess {
    let mut args: Vec<String> = dirs.args().into_iter().filter(|a| !a.starts_with("--mock-gpus")).collect();
    args.push(format!("--mock-gpus={PRODUCT}:80Gi:mig"));
    args.push("--dynamic-mig=all".into());
    args.push(format!("--mock-mig-state={}", state.display()));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    start_driver(plane, name, NODE, &refs).unwrap()
}

/// The instances on the simulated card: (GPU-instance profile id, start, UUID).
fn instances(state: &Path) -> Vec<(u32, u8, String)> {
    MigSim::read_state(state)
        .unwrap()
        .values()
        .flat_map(|c| c.instances.iter().map(|i| (i.gi_profile_id, i.start, i.uuid.clone())))
        .collect()
}

fn ok(reply: &Value, uid: &str) -> bool {
    reply.get("error").is_none() && claim_response(reply, uid).get("error").is_none_or(|e| e.as_str() == Some(""))
}

/// The environment of the spec written for claim `uid`.
fn spec_env(dirs: &Dirs, uid: &str) -> Vec<String> {
    let file: PathBuf = std::fs::read_dir(&dirs.cdi)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().contains(uid) && !n.to_string_lossy().starts_with('.')))
        .unwrap_or_else(|| panic!("no spec for {uid}"));
    let spec: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    spec["containerEdits"]["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
}

fn uid_of(kubectl: &Kubectl, name: &str) -> String {
    kubectl.run(&["get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}"]).unwrap()
}

#[test]
fn instances_follow_what_the_kubelet_last_asked_through_a_kill_at_every_step() {
    let (mut plane, kubectl, dirs, state) = test_bed();
    kubectl
        .apply(&claim("p1", "mig", "hami-mig", r#"device.attributes["hami-core-gpu.project-hami.io"].profile == "1g.10gb""#, ""))
        .unwrap();
    let mut publisher = mig_driver(&plane, &dirs, &state, "driver-publish", &[]);
    plane.wait_allocated("default", "p1", Duration::from_secs(60)).unwrap();
    publisher.stop();
    let uid = uid_of(&kubectl, "p1");
    let claim = [("default", "p1", uid.as_str())];
    let device =
        kubectl.run(&["get", "resourceclaim", "p1", "-o", "jsonpath={.status.allocation.devices.results[0].device}"]).unwrap();
    assert!(device.starts_with("hami-gpu-0-mig-1g-10gb-"), "{device}");
    let start: u8 = device.rsplit('-').next().unwrap().parse().unwrap();

    // After a kill before the instance is recorded, start-up destroys it; after, it stays for
    // the retry to answer with.
    for (point, left_after_restart) in [
        ("prepare-admitted", 0),
        ("prepare-mig-intent", 0),
        ("prepare-mig-created", 0),
        ("prepare-checkpointed", 1),
        ("prepare-spec-written", 1),
    ] {
        let mut dying = mig_driver(&plane, &dirs, &state, &format!("driver-{point}"), &[&format!("--fail-point={point}")]);
        let reply = kubelet(&dirs).prepare(&claim).unwrap();
        assert!(!ok(&reply, &uid), "{point}: the call should have died with the plugin: {reply}");
        wait_dead(&mut dying);
        if point == "prepare-mig-created" {
            assert_eq!(instances(&state).len(), 1, "{point}: the kill left the instance on the card");
        }
        let mut drv = mig_driver(&plane, &dirs, &state, &format!("driver-after-{point}"), &[]);
        // The plugin registers once start-up (and its clean-up) is done.
        let mut k = kubelet(&dirs);
        assert_eq!(instances(&state).len(), left_after_restart, "{point}: after the restart");
        assert!(ok(&k.prepare(&claim).unwrap(), &uid), "{point}");
        let made = instances(&state);
        assert_eq!(made.len(), 1, "{point}: exactly the claim's instance: {made:?}");
        assert_eq!((made[0].0, made[0].1), (19, start), "{point}: at the allocated placement");
        let env = spec_env(&dirs, &uid);
        assert!(env.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", made[0].2)), "{point}: {env:?}");
        assert_eq!(dirs.checkpointed(), std::slice::from_ref(&uid), "{point}");
        assert!(ok(&k.unprepare(&claim).unwrap(), &uid));
        assert_eq!(instances(&state), Vec::new(), "{point}: unprepare destroys it");
        assert_eq!(dirs.specs_for(&uid), 0, "{point}");
        drv.stop();
    }

    for point in ["unprepare-mig-destroyed", "unprepare-checkpointed", "unprepare-spec-removed"] {
        let mut drv = mig_driver(&plane, &dirs, &state, &format!("driver-before-{point}"), &[]);
        assert!(ok(&kubelet(&dirs).prepare(&claim).unwrap(), &uid));
        assert_eq!(instances(&state).len(), 1, "{point}");
        drv.stop();
        let mut dying = mig_driver(&plane, &dirs, &state, &format!("driver-{point}"), &[&format!("--fail-point={point}")]);
        let reply = kubelet(&dirs).unprepare(&claim).unwrap();
        assert!(!ok(&reply, &uid), "{point}: {reply}");
        wait_dead(&mut dying);
        assert_eq!(instances(&state), Vec::new(), "{point}: the instance goes before the record");
        let mut drv = mig_driver(&plane, &dirs, &state, &format!("driver-after-{point}"), &[]);
        let mut k = kubelet(&dirs);
        assert!(ok(&k.unprepare(&claim).unwrap(), &uid), "{point}");
        assert!(dirs.checkpointed().is_empty(), "{point}");
        assert_eq!(instances(&state), Vec::new(), "{point}");
        assert_eq!(dirs.specs_for(&uid), 0, "{point}");
        // The ledger and the card let it go: it prepares again.
        assert!(ok(&k.prepare(&claim).unwrap(), &uid), "{point}");
        assert_eq!(instances(&state).len(), 1, "{point}");
        assert!(ok(&k.unprepare(&claim).unwrap(), &uid), "{point}");
        drv.stop();
    }
}

#[test]
fn software_shares_of_a_mig_card_share_one_full_instance_with_their_own_limits() {
    let (mut plane, kubectl, dirs, state) = test_bed();
    let memory = |m: &str| format!("        capacity: {{requests: {{memory: {m}, cores: \"30\"}}}}\n");
    kubectl.apply(&claim("a", DRIVER, "hami-gpu", "true", &memory("20Gi"))).unwrap();
    kubectl.apply(&claim("b", DRIVER, "hami-gpu", "true", &memory("40Gi"))).unwrap();
    let mut drv = mig_driver(&plane, &dirs, &state, "driver", &[]);
    plane.wait_allocated("default", "a", Duration::from_secs(60)).unwrap();
    plane.wait_allocated("default", "b", Duration::from_secs(60)).unwrap();
    let (a, b) = (uid_of(&kubectl, "a"), uid_of(&kubectl, "b"));
    let mut k = kubelet(&dirs);
    assert!(ok(&k.prepare(&[("default", "a", a.as_str())]).unwrap(), &a));
    assert!(ok(&k.prepare(&[("default", "b", b.as_str())]).unwrap(), &b));
    let made = instances(&state);
    assert_eq!(made.len(), 1, "one instance for both: {made:?}");
    assert_eq!((made[0].0, made[0].1), (0, 0), "the full-size instance");
    for (uid, limit) in [(&a, "20480m"), (&b, "40960m")] {
        let env = spec_env(&dirs, uid);
        assert!(env.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", made[0].2)), "{env:?}");
        assert!(env.contains(&format!("CUDA_DEVICE_MEMORY_LIMIT_0={limit}")), "{env:?}");
        assert!(env.contains(&"CUDA_DEVICE_SM_LIMIT=30".to_owned()), "{env:?}");
    }
    // A restart keeps it: both records name it.
    drv.stop();
    let mut drv = mig_driver(&plane, &dirs, &state, "driver-again", &[]);
    let mut k = kubelet(&dirs);
    assert!(ok(&k.unprepare(&[("default", "a", a.as_str())]).unwrap(), &a));
    assert_eq!(instances(&state), made, "b still uses it");
    assert!(ok(&k.unprepare(&[("default", "b", b.as_str())]).unwrap(), &b));
    assert_eq!(instances(&state), Vec::new(), "gone with its last claim");
    drv.stop();
}
