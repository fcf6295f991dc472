//! Fixtures shared by the kubelet plugin tests: directories, the driver process, claims.

#![allow(dead_code, clippy::unwrap_used)]

pub mod chart;
pub mod pod_report;
pub mod quickstart;
pub mod seed_000;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, ManagedProcess, components, start_driver};

pub const DRIVER: &str = "hami-core-gpu.project-hami.io";
pub const NODE: &str = "gpu-node";

pub struct Dirs {
    pub kubelet: PathBuf,
    pub cdi: PathBuf,
    pub vgpu: PathBuf,
    pub lock: PathBuf,
}

impl Dirs {
    pub fn new(root: &Path) -> Self {
        Self { kubelet: root.join("kubelet"), cdi: root.join("cdi"), vgpu: root.join("vgpu"), lock: root.join("vgpulock") }
    }

    pub fn args(&self) -> Vec<String> {
        vec![
            "--mock-gpus=1xTesla T4:15Gi".into(),
            format!("--kubelet-dir={}", self.kubelet.display()),
            format!("--cdi-dir={}", self.cdi.display()),
            format!("--hami-core-dir={}", self.vgpu.display()),
            format!("--lock-dir={}", self.lock.display()),
        ]
    }

    /// The checkpoint directory: one `<claim uid>.json` record per prepared claim.
    pub fn checkpoint(&self) -> PathBuf {
        self.kubelet.join("plugins").join(DRIVER).join("checkpoint")
    }

    /// How many CDI spec files name claim `uid`.
    pub fn specs_for(&self, uid: &str) -> usize {
        std::fs::read_dir(&self.cdi)
            .map_or(0, |d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().contains(uid)).count())
    }

    /// Temp files with something written in them: a record or spec staged and not yet renamed.
    /// (The driver keeps empty ones made ahead for the next prepares.)
    pub fn written_temp_files(&self) -> Vec<String> {
        [self.cdi.clone(), self.checkpoint()]
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flat_map(|d| d.filter_map(Result::ok))
            .filter(|e| e.file_name().to_string_lossy().starts_with('.') && e.metadata().is_ok_and(|m| m.len() > 0))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Hidden files (the temp files of a write not yet renamed, and empty ones the driver made
    /// ahead) in the CDI and checkpoint dirs.
    pub fn temp_files(&self) -> Vec<String> {
        [self.cdi.clone(), self.checkpoint()]
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flat_map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| n.starts_with('.'))
            .collect()
    }

    /// The UIDs with a checkpoint record.
    pub fn checkpointed(&self) -> Vec<String> {
        let mut uids: Vec<String> = std::fs::read_dir(self.checkpoint())
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".json")).map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        uids.sort();
        uids
    }
}

/// The driver's `--fail-point`s inside a prepare, in the order a prepare passes them.
pub const PREPARE_FAIL_POINTS: [&str; 4] = ["prepare-staged", "prepare-admitted", "prepare-checkpointed", "prepare-spec-written"];

/// Waits for a driver started with `--fail-point` to have killed itself there.
pub fn wait_dead(p: &mut ManagedProcess) {
    for _ in 0..100 {
        if p.check_running().is_err() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the driver did not die at its fail point");
}

pub fn driver(plane: &ControlPlane, dirs: &Dirs, name: &str) -> ManagedProcess {
    driver_with(plane, dirs, name, &[])
}

pub fn driver_with(plane: &ControlPlane, dirs: &Dirs, name: &str, extra: &[&str]) -> ManagedProcess {
    let mut args = dirs.args();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    start_driver(plane, name, NODE, &refs).unwrap()
}

pub fn claim_and_pod(name: &str) -> String {
    claim_with(name, "4Gi", "50")
}

pub fn claim_with(name: &str, memory: &str, cores: &str) -> String {
    claim_on(name, NODE, memory, cores)
}

/// A claim asking `memory` and `cores` of one card, a pod on `node` using it, and HAMi's
/// DeviceClass.
pub fn claim_on(name: &str, node: &str, memory: &str, cores: &str) -> String {
    format!(
        r#"{}---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: {DRIVER}}}
spec:
  selectors:
  - cel:
      expression: device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "hami-gpu"
"#,
        claim_and_pod_on(name, node, memory, cores)
    )
}

/// A claim `name` in `default` asking `memory` and `cores` of one card through HAMi's
/// DeviceClass, as one YAML document.
pub fn claim_yaml(name: &str, memory: &str, cores: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: default}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {DRIVER}
        capacity:
          requests: {{memory: "{memory}", cores: "{cores}"}}
"#
    )
}

/// The UUID the node's ResourceSlice publishes for `device`, once there is one.
pub fn card_uuid(kubectl: &vgpu_dra_integration::Kubectl, device: &str) -> anyhow::Result<Option<String>> {
    let slices = kubectl.get_json(&["resourceslices", &format!("--field-selector=spec.nodeName={NODE}")])?;
    Ok(slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .find(|d| d["name"] == device)
        .and_then(|d| d["attributes"]["uuid"]["string"].as_str())
        .map(str::to_owned))
}

/// The pod that claims allocated by hand in `namespace` are reserved for, made once; returns its
/// UID. The kubelet prepares only claims reserved for a pod, and the resource claim controller
/// drops a reservation for a pod that does not exist. No scheduler takes it (no kubelet runs it).
pub fn claim_holder(kubectl: &vgpu_dra_integration::Kubectl, namespace: &str) -> String {
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: claim-holder, namespace: {namespace}}}\nspec:\n  schedulerName: none\n  containers:\n  - {{name: c, image: registry.invalid/none}}\n"
    );
    kubectl.apply(&pod).unwrap();
    kubectl.run(&["get", "pod", "claim-holder", "-n", namespace, "-o", "jsonpath={.metadata.uid}"]).unwrap()
}

/// A claim `namespace/name` allocated by hand, as a buggy or racing scheduler might write it (no
/// scheduler involved): `hami-gpu-0` of `NODE`, share ID number `share`, `memory` and 10 cores,
/// reserved for the pod [`claim_holder`] made (its UID `holder`). The claim to create and, as a
/// second document, the same with its status (for `kubectl replace --subresource=status`).
pub fn hand_allocated_claim(namespace: &str, name: &str, share: u32, memory: &str, holder: &str) -> (String, String) {
    let claim = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {{deviceClassName: {DRIVER}}}\n"
    );
    let status = format!(
        "{claim}status:\n  reservedFor:\n  - {{resource: pods, name: claim-holder, uid: {holder}}}\n  allocation:\n    devices:\n      results:\n      - {{driver: {DRIVER}, pool: {NODE}, device: hami-gpu-0, request: gpu, shareID: {share:08x}-0000-4000-8000-000000000000, consumedCapacity: {{memory: {memory}, cores: \"10\", shares: \"1\"}}}}\n"
    );
    (claim, status)
}

/// A claim asking `memory` and `cores` of one card through HAMi's DeviceClass, and a pod on
/// `node` using it; for tests where the DeviceClass comes from elsewhere (the chart).
pub fn claim_and_pod_on(name: &str, node: &str, memory: &str, cores: &str) -> String {
    format!("{}---\n{}", claim_yaml(name, memory, cores), pod_using(name, node))
}

/// A pod `default/name` on `node` whose one container uses the claim of the same name.
pub fn pod_using(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers:
  - name: main
    image: registry.invalid/none
    resources: {{claims: [{{name: gpu}}]}}
"#
    )
}

/// The kubelet's own plugin manager (kubelet-sim) for `dirs`, once it has registered the driver.
/// It starts once the driver's registration socket answers: a socket that appears while the
/// plugin watcher starts up (a killed driver's stale one is there but refuses connections) is
/// seen twice, and the second registration closes the connection of the first, cancelling calls
/// in flight on it.
pub fn kubelet(dirs: &Dirs) -> vgpu_dra_integration::KubeletSim {
    std::fs::create_dir_all(dirs.kubelet.join("plugins_registry")).unwrap();
    let socket = dirs.kubelet.join("plugins_registry").join(format!("{DRIVER}-reg.sock"));
    vgpu_dra_integration::eventually("the driver's registration socket", std::time::Duration::from_secs(30), || {
        Ok(std::os::unix::net::UnixStream::connect(&socket).is_ok().then_some(()))
    })
    .unwrap();
    let options = vgpu_dra_integration::KubeletSimOptions { node_name: NODE.into(), ..Default::default() };
    let mut k = vgpu_dra_integration::KubeletSim::start(&dirs.kubelet.join("plugins_registry"), DRIVER, &options).unwrap();
    k.wait_event("registered", std::time::Duration::from_secs(30), |e| e["driver"] == DRIVER && e.get("error").is_none())
        .unwrap();
    k
}

pub fn cdi_check(dir: &Path, ids: &[&str]) -> Value {
    let out = Command::new(&components().unwrap().cdi_check)
        .arg(format!("--spec-dir={}", dir.display()))
        .arg(format!("--inject={}", ids.join(",")))
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("cdi-check: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "cdi-check rejected the specs: {report:#}");
    report
}

pub fn claim_response<'a>(reply: &'a Value, uid: &str) -> &'a Value {
    &reply["response"]["claims"][uid]
}

/// This driver's entries of claim `name`'s `status.devices` (KEP-4817), each checked against
/// the claim's allocation: same pool, device and share ID as one of its results.
pub fn status_devices(kubectl: &vgpu_dra_integration::Kubectl, namespace: &str, name: &str) -> anyhow::Result<Vec<Value>> {
    let claim = kubectl.get_json(&["resourceclaim", name, "-n", namespace])?;
    let results = claim["status"]["allocation"]["devices"]["results"].as_array().cloned().unwrap_or_default();
    let ours: Vec<Value> =
        claim["status"]["devices"].as_array().into_iter().flatten().filter(|d| d["driver"] == DRIVER).cloned().collect();
    for entry in &ours {
        let allocated = results.iter().any(|r| {
            r["driver"] == entry["driver"]
                && r["pool"] == entry["pool"]
                && r["device"] == entry["device"]
                && r["shareID"] == entry["shareID"]
        });
        anyhow::ensure!(allocated, "status entry {entry} is no allocation result of {namespace}/{name}: {results:?}");
    }
    Ok(ours)
}

/// The `resource.k8s.io` version that serves DeviceTaintRules on this API server: v1 from 1.37,
/// v1beta2 where 1.36 has it switched on; `None` where none does.
pub fn taint_rule_version(kubectl: &vgpu_dra_integration::Kubectl) -> Option<&'static str> {
    ["v1", "v1beta2"]
        .into_iter()
        .find(|v| kubectl.run(&["get", "--raw", &format!("/apis/resource.k8s.io/{v}/devicetaintrules")]).is_ok())
}
