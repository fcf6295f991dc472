//! The test bed itself: a hand-written shared device is allocated by the real kube-scheduler with
//! consumable capacity, and two claims share one device with distinct share IDs.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use vgpu_dra_integration::{ControlPlane, eventually};

const DRIVER: &str = "smoke.vgpu-dra.test";

fn slice(node: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: {node}-smoke
spec:
  driver: {DRIVER}
  nodeName: {node}
  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
  devices:
  - name: gpu-0
    allowMultipleAllocations: true
    attributes:
      type: {{string: hami-gpu}}
    capacity:
      memory:
        value: 15Gi
        requestPolicy: {{default: 15Gi, validRange: {{min: 1Mi, max: 15Gi, step: 1Mi}}}}
      cores:
        value: "100"
        requestPolicy: {{default: "100", validRange: {{min: "0", max: "100", step: "1"}}}}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: smoke-gpu
spec:
  selectors:
  - cel:
      expression: device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "hami-gpu"
"#
    )
}

fn claim_and_pod(name: &str, memory: &str, cores: u32) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: default}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: smoke-gpu
        capacity:
          requests: {{memory: {memory}, cores: "{cores}"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  resourceClaims:
  - name: gpu
    resourceClaimName: {name}
  containers:
  - name: main
    image: registry.invalid/none
    resources:
      claims:
      - name: gpu
"#
    )
}

#[test]
fn the_real_scheduler_allocates_consumable_capacity_on_a_shared_device() {
    let mut plane = ControlPlane::start().expect("control plane");
    // Panicking while the plane is alive prints the components' logs.
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    plane.create_node("node-a")?;
    let kubectl = plane.kubectl().clone();
    kubectl.apply(&slice("node-a"))?;
    kubectl.apply(&claim_and_pod("c1", "4Gi", 50))?;
    kubectl.apply(&claim_and_pod("c2", "1000Mi", 3))?;

    let mut share_ids = Vec::new();
    for (name, memory, cores) in [("c1", "4Gi", "50"), ("c2", "1000Mi", "3")] {
        let result = plane.wait_allocated("default", name, Duration::from_secs(60))?;
        assert_eq!(result["driver"], DRIVER);
        assert_eq!(result["pool"], "node-a");
        assert_eq!(result["device"], "gpu-0");
        assert_eq!(result["consumedCapacity"]["memory"], memory, "{result}");
        assert_eq!(result["consumedCapacity"]["cores"], cores, "{result}");
        share_ids.push(result["shareID"].as_str().map(str::to_owned).expect("a share ID for a shared device"));
        let node = eventually(&format!("pod {name} bound"), Duration::from_secs(30), || {
            let pod = kubectl.get_json(&["pod", name, "-n", "default"])?;
            Ok(pod["spec"]["nodeName"].as_str().map(str::to_owned))
        })?;
        assert_eq!(node, "node-a");
    }
    assert_ne!(share_ids[0], share_ids[1]);
    eprintln!("control plane bring-up took {:.1} s", plane.startup.as_secs_f64());
    Ok(())
}
