//! The node's pool as `resource.k8s.io/v1` ResourceSlices: pool = node name, `spec.nodeName`
//! set, devices split into slices within the API's per-slice limit.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as resource;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use vgpu_scheduling::policy::ValidRequests;
use vgpu_scheduling::{Attribute, Capacity, DriverName, Health, PublishedDevice};

/// The API's limit on devices per slice when devices carry taints.
pub const MAX_DEVICES_PER_SLICE: usize = 64;

/// Label on every slice this driver writes, so it can find its own.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// What identifies the pool being published.
#[derive(Debug, Clone)]
pub struct PoolIdentity {
    /// The driver name.
    pub driver: DriverName,
    /// The node name, also the pool name.
    pub node_name: String,
    /// The Node's UID, for the owner reference that garbage-collects slices with the node.
    pub node_uid: Option<String>,
    /// The pool generation; bumped whenever the device set changes.
    pub generation: i64,
}

/// Builds the slices of the pool; the slice names are stable: `<node>-<driver>-<n>`.
pub fn build_slices(pool: &PoolIdentity, devices: &[PublishedDevice]) -> Vec<resource::ResourceSlice> {
    lay_out(pool, Vec::new(), devices.iter().map(|d| api_device(&pool.driver, d)).collect())
}

/// The API's limit on counter sets in one slice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;

/// The pool's slices, as the API wants them since 1.35: `counter_sets` in slices of their own
/// (at most [`MAX_COUNTER_SETS_PER_SLICE`] each), then `devices`, at most
/// [`MAX_DEVICES_PER_SLICE`] per slice (one empty slice when there are none); every slice counts
/// the whole pool.
pub(crate) fn lay_out(
    pool: &PoolIdentity,
    counter_sets: Vec<resource::CounterSet>,
    devices: Vec<resource::Device>,
) -> Vec<resource::ResourceSlice> {
    let set_chunks: Vec<&[resource::CounterSet]> = counter_sets.chunks(MAX_COUNTER_SETS_PER_SLICE).collect();
    let device_chunks: Vec<&[resource::Device]> =
        if devices.is_empty() { vec![&[]] } else { devices.chunks(MAX_DEVICES_PER_SLICE).collect() };
    let count = set_chunks.len() + device_chunks.len();
    let mut slices = Vec::with_capacity(count);
    for chunk in set_chunks {
        let mut slice = slice_with(pool, slices.len(), count);
        slice.spec.shared_counters = Some(chunk.to_vec());
        slices.push(slice);
    }
    for chunk in device_chunks {
        let mut slice = slice_with(pool, slices.len(), count);
        slice.spec.devices = Some(chunk.to_vec());
        slices.push(slice);
    }
    slices
}

/// The `index`th of `count` slices of the pool, with nothing in it yet.
fn slice_with(pool: &PoolIdentity, index: usize, count: usize) -> resource::ResourceSlice {
    resource::ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(pool, index)),
            labels: Some(BTreeMap::from([(LABEL_MANAGED_BY.to_owned(), "vgpu-dra".to_owned())])),
            owner_references: pool.node_uid.as_ref().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: pool.node_name.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: resource::ResourceSliceSpec {
            driver: pool.driver.to_string(),
            node_name: Some(pool.node_name.clone()),
            pool: resource::ResourcePool {
                name: pool.node_name.clone(),
                generation: pool.generation,
                resource_slice_count: i64::try_from(count).unwrap_or(i64::MAX),
            },
            ..Default::default()
        },
    }
}

/// The name of the `index`th slice of the pool.
pub fn slice_name(pool: &PoolIdentity, index: usize) -> String {
    format!("{}-{}-{index}", pool.node_name, pool.driver)
}

/// One published device as the API has it.
pub(crate) fn api_device(driver: &DriverName, d: &PublishedDevice) -> resource::Device {
    let taints = (d.health == Health::Unhealthy).then(|| {
        vec![resource::DeviceTaint {
            key: format!("{driver}/unhealthy"),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]
    });
    resource::Device {
        name: d.name.to_string(),
        allow_multiple_allocations: Some(true),
        attributes: Some(d.attributes.iter().map(|(k, v)| (k.clone(), api_attribute(v))).collect()),
        capacity: Some(d.capacity.iter().map(|(k, c)| (k.clone(), api_capacity(c))).collect()),
        taints,
        ..Default::default()
    }
}

fn api_attribute(a: &Attribute) -> resource::DeviceAttribute {
    match a {
        Attribute::Int(i) => resource::DeviceAttribute { int: Some(*i), ..Default::default() },
        Attribute::Bool(b) => resource::DeviceAttribute { bool: Some(*b), ..Default::default() },
        Attribute::String(s) => resource::DeviceAttribute { string: Some(s.clone()), ..Default::default() },
        Attribute::Version(v) => resource::DeviceAttribute { version: Some(v.clone()), ..Default::default() },
    }
}

fn q(v: vgpu_scheduling::Quantity) -> ApiQuantity {
    ApiQuantity(v.to_string())
}

fn api_capacity(c: &Capacity) -> resource::DeviceCapacity {
    let request_policy = c.policy.as_ref().map(|p| {
        let mut policy = resource::CapacityRequestPolicy { default: p.default.map(q), ..Default::default() };
        match &p.valid {
            ValidRequests::Any => {}
            ValidRequests::Range { min, max, step } => {
                policy.valid_range =
                    Some(resource::CapacityRequestPolicyRange { min: q(*min), max: max.map(q), step: step.map(q) });
            }
            ValidRequests::Values(values) => policy.valid_values = Some(values.iter().copied().map(q).collect()),
        }
        policy
    });
    resource::DeviceCapacity { value: q(c.value), request_policy }
}

#[cfg(test)]
mod tests {
    use vgpu_scheduling::{SharingConfig, publish};

    use super::*;
    use crate::discovery::DeviceSource;
    use crate::discovery::mock::{MockSource, parse_spec};

    fn pool() -> PoolIdentity {
        PoolIdentity { driver: SharingConfig::default().driver_name, node_name: "n1".into(), node_uid: None, generation: 1 }
    }

    #[test]
    fn many_devices_are_split_and_every_slice_counts_the_pool() {
        let inv = MockSource::new("n1", parse_spec("100xNVIDIA H200:141Gi").unwrap()).inventory().unwrap();
        let slices = build_slices(&pool(), &publish(&inv, &SharingConfig::default()));
        assert_eq!(slices.len(), 2);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2));
        assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 64);
        assert_eq!(slices[1].metadata.name.as_deref(), Some("n1-hami-core-gpu.project-hami.io-1"));
    }

    #[test]
    fn unhealthy_devices_carry_a_no_schedule_taint() {
        let mut inv = MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()).inventory().unwrap();
        inv.gpus[1].health = Health::Unhealthy;
        let slices = build_slices(&pool(), &publish(&inv, &SharingConfig::default()));
        let devices = slices[0].spec.devices.as_ref().unwrap();
        assert!(devices[0].taints.is_none());
        let taint = &devices[1].taints.as_ref().unwrap()[0];
        assert_eq!((taint.key.as_str(), taint.effect.as_str()), ("hami-core-gpu.project-hami.io/unhealthy", "NoSchedule"));
    }

    #[test]
    fn an_empty_inventory_still_publishes_an_empty_pool() {
        let slices = build_slices(&pool(), &[]);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].spec.devices.as_deref(), Some(&[][..]));
    }
}
