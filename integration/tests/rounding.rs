//! kube-scheduler and the scheduling crate agree, to the printed byte, on what odd capacity
//! requests consume; the slice under test is the one the driver itself builds. The crate rounds
//! as the release under test does: on whole values up to 1.37, in thousandths on a grid of
//! thousandths from 1.38.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use vgpu_dra::discovery::DeviceSource;
use vgpu_dra::discovery::mock::{MockSource, parse_spec};
use vgpu_dra::slices::{PoolIdentity, build_slices};
use vgpu_dra_integration::{ControlPlane, eventually};
use vgpu_scheduling::device::{CAPACITY_CORES, CAPACITY_MEMORY};
use vgpu_scheduling::{Quantity, Rounding, SharingConfig, publish};

const NODE: &str = "node-r";

/// (memory request, cores request); `None` leaves the capacity unrequested.
const CASES: &[(Option<&str>, Option<&str>)] = &[
    (Some("1000Mi"), Some("0")),
    (Some("1"), Some("3")),
    (Some("4095Mi"), Some("101")),
    (Some("1.5Mi"), Some("500m")),
    (Some("1G"), Some("99.1")),
    (Some("1Ki"), Some("1")),
    (Some("100M"), Some("50")),
    (Some("3Gi"), None),
    (Some("2.5Gi"), Some("7")),
    (Some("123456789"), Some("100")),
    (Some("1Mi"), Some("33")),
    (Some("23Gi"), Some("2")),
    (None, Some("10")),
    (Some("25Gi"), Some("1")),
    (Some("0.5Gi"), Some("1500m")),
    (Some("7e8"), Some("64")),
    (Some("1048577"), Some("0.1")),
    (Some("20000Mi"), Some("8")),
    (Some("23.9Gi"), Some("99")),
    (None, None),
    (Some("512Ki"), Some("12")),
    (Some("3M"), Some("2e1")),
];

fn claim_and_pod(i: usize, memory: Option<&str>, cores: Option<&str>) -> String {
    let mut requests = Vec::new();
    if let Some(m) = memory {
        requests.push(format!("memory: \"{m}\""));
    }
    if let Some(c) = cores {
        requests.push(format!("cores: \"{c}\""));
    }
    let capacity = if requests.is_empty() {
        String::new()
    } else {
        format!("        capacity:\n          requests: {{{}}}\n", requests.join(", "))
    };
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: r{i}, namespace: default}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: vgpu
        selectors:
        - cel:
            expression: device.attributes["hami-core-gpu.project-hami.io"].index == {i}
{capacity}---
apiVersion: v1
kind: Pod
metadata: {{name: r{i}, namespace: default}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimName: r{i}}}]
  containers:
  - name: main
    image: registry.invalid/none
    resources: {{claims: [{{name: gpu}}]}}
"#
    )
}

#[test]
fn scheduler_and_crate_agree_on_rounding() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let node_uid = plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    let config = SharingConfig::default();
    let inventory = MockSource::new(NODE, parse_spec(&format!("{}xNVIDIA L4:24Gi", CASES.len()))?).inventory()?;
    let devices = publish(&inventory, &config);
    let pool =
        PoolIdentity { driver: config.driver_name.clone(), node_name: NODE.into(), node_uid: Some(node_uid), generation: 1 };
    for slice in build_slices(&pool, &devices) {
        let mut v = serde_json::to_value(&slice)?;
        v["apiVersion"] = "resource.k8s.io/v1".into();
        v["kind"] = "ResourceSlice".into();
        kubectl.apply(&v.to_string())?;
    }
    kubectl.apply(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: vgpu}\nspec:\n  selectors:\n  - cel: {expression: 'device.driver == \"hami-core-gpu.project-hami.io\"'}\n",
    )?;
    let mut yaml = String::new();
    for (i, (memory, cores)) in CASES.iter().enumerate() {
        yaml.push_str(&claim_and_pod(i, *memory, *cores));
        yaml.push_str("---\n");
    }
    kubectl.apply(&yaml)?;

    // 1.38 rounds requests on a grid of thousandths in thousandths (DRAFractionalCapacityRange).
    let rounding = Rounding::of_release(vgpu_dra_integration::kubernetes_minor());
    eprintln!("rounding as Kubernetes {}: {rounding:?}", vgpu_dra_integration::kubernetes_version());
    let mut agreed = 0;
    for (i, (memory, cores)) in CASES.iter().enumerate() {
        let device = &devices[i];
        let predict = |name: &str, req: Option<&str>| {
            device.capacity[name]
                .consumed_by_in(req.map(|r| Quantity::parse(r).expect("valid request")), rounding)
                .map(|q| q.to_string())
        };
        let (mem, cor) = (predict(CAPACITY_MEMORY, *memory), predict(CAPACITY_CORES, *cores));
        if let (Ok(mem), Ok(cor)) = (&mem, &cor) {
            let result = plane.wait_allocated("default", &format!("r{i}"), Duration::from_secs(60))?;
            eprintln!(
                "case {i}: {memory:?}/{cores:?} -> {} / {}",
                result["consumedCapacity"]["memory"], result["consumedCapacity"]["cores"]
            );
            assert_eq!(result["device"], device.name.as_str());
            assert_eq!(result["consumedCapacity"]["memory"], mem.as_str(), "case {i}: memory {memory:?}");
            assert_eq!(result["consumedCapacity"]["cores"], cor.as_str(), "case {i}: cores {cores:?}");
            agreed += 1;
        } else {
            // The crate says it does not fit: the scheduler must leave the pod unschedulable.
            let reason = eventually(&format!("pod r{i} unschedulable"), Duration::from_secs(60), || {
                let pod = kubectl.get_json(&["pod", &format!("r{i}"), "-n", "default"])?;
                Ok(pod["status"]["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == "PodScheduled" && c["status"] == "False").cloned()))
            })?;
            let claim = kubectl.get_json(&["resourceclaim", &format!("r{i}"), "-n", "default"])?;
            assert!(claim["status"]["allocation"].is_null(), "case {i} was allocated: {claim}");
            assert_eq!(reason["reason"], "Unschedulable", "case {i}");
            agreed += 1;
        }
    }
    assert!(agreed >= 20);
    Ok(())
}
