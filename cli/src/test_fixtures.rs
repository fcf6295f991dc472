//! Hand-made API objects for the unit tests, shaped as the driver and the scheduler write them.

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

pub const DRIVER: &str = "hami-core-gpu.project-hami.io";

/// A small deterministic generator (64-bit LCG), so property tests repeat exactly.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// A card as the driver publishes it: memory (whole MiB) with a 1Mi grid defaulting to all of
/// it, cores 0..100 defaulting to 100, shares 1..split defaulting to 1.
pub fn device(name: &str, product: &str, memory_mib: u64, split: u32) -> Value {
    let memory = format!("{memory_mib}Mi");
    json!({
        "name": name,
        "allowMultipleAllocations": true,
        "attributes": {
            "type": {"string": "hami-gpu"},
            "productName": {"string": product},
            "uuid": {"string": format!("GPU-{name}-{product}").replace(' ', "-")},
            "index": {"int": 0},
            "cudaComputeCapability": {"version": "8.6.0"},
        },
        "capacity": {
            "memory": {"value": memory, "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}},
            "cores": {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1m", "max": "100", "step": "1m"}}},
            "shares": {"value": split.to_string(), "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": split.to_string(), "step": "1"}}},
        },
    })
}

pub fn slice(node: &str, devices: Vec<Value>) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-{DRIVER}-0")},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    }))
    .unwrap()
}

/// A claim of one request `gpu` on the chart's class with these capacity requests.
pub fn claim(name: &str, capacity: &[(&str, &str)]) -> Value {
    let requests: serde_json::Map<String, Value> = capacity.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": requests},
        }}]}},
    })
}

/// `claim` allocated on `node`/`device`, reserved for pod `pod`, consuming `consumed`.
pub fn allocated(mut claim: Value, node: &str, device: &str, consumed: &[(&str, &str)], pod: &str) -> Value {
    let consumed: serde_json::Map<String, Value> = consumed.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    claim["status"] = json!({
        "allocation": {"devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": node, "device": device,
            "shareID": "00000000-0000-0000-0000-000000000001", "consumedCapacity": consumed,
        }]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("uid-{pod}")}],
    });
    claim
}

pub fn typed(claims: Vec<Value>) -> Vec<ResourceClaim> {
    claims.into_iter().map(|c| serde_json::from_value(c).unwrap()).collect()
}

/// The chart's DeviceClass.
pub fn class() -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression":
            format!("device.driver == \"{DRIVER}\" &&\n  device.attributes[\"{DRIVER}\"].type == \"hami-gpu\"")}}]},
    }))
    .unwrap()
}

/// A pending pod using claim `claim` under the pod claim name `gpu`.
pub fn pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}], "containers": [{"name": "main"}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 cannot allocate all claims."}]},
    }))
    .unwrap()
}
