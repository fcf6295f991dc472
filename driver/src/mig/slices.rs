//! Dynamic MIG as ResourceSlices: the pool's cards that offer MIG get a counter set each (the
//! catalogue's memory slices, compute slices and media extensions), one device per allowed
//! (profile, placement) consuming its share of them, and their whole-card device consuming all
//! of them. So the scheduler alone keeps a card's software shares and its MIG instances apart
//! (the whole-card device allows multiple allocations, and its counters are charged once, at its
//! first allocation), and keeps placements from overlapping.
//!
//! Layout, as the API wants it since 1.35: the counter sets in slices of their own, then the
//! devices ([`crate::slices::lay_out`]).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as resource;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use vgpu_scheduling::PublishedDevice;
use vgpu_scheduling::mig::{MigModel, Placement};

use crate::slices::{PoolIdentity, api_device, lay_out};

/// A card that offers dynamic MIG: its whole-card device, its model, the profiles it may offer
/// (all of the model's when `None`), and where instances already sit.
#[derive(Debug, Clone)]
pub struct MigCard<'a> {
    /// The card's published whole-card device.
    pub card: &'a PublishedDevice,
    /// Its catalogue model.
    pub model: &'static MigModel,
    /// The profile names the device configuration allows on it.
    pub allowed: Option<Vec<&'static str>>,
    /// Instances already on the card: placements overlapping them are not offered.
    pub occupied: Vec<Placement>,
}

impl MigCard<'_> {
    /// The name of its counter set: `gpu-<minor>-counters`.
    pub fn counter_set(&self) -> String {
        format!("gpu-{}-counters", self.card.minor)
    }

    /// The placements it offers: every placement of an allowed profile that overlaps no
    /// instance already on the card.
    pub fn placements(&self) -> Vec<Placement> {
        self.model
            .placements()
            .into_iter()
            .filter(|p| self.allowed.as_ref().is_none_or(|a| a.contains(&p.profile().name())))
            .filter(|p| !self.occupied.iter().any(|o| o.overlaps(p)))
            .collect()
    }
}

/// The pool's slices: `devices` (whole cards), those named by `mig` consuming their counter set,
/// and `mig`'s placement devices.
pub fn build_slices_with_mig(
    pool: &PoolIdentity,
    devices: &[PublishedDevice],
    mig: &[MigCard<'_>],
) -> Vec<resource::ResourceSlice> {
    let mut api_devices: Vec<resource::Device> = devices
        .iter()
        .map(|d| {
            let mut device = api_device(&pool.driver, d);
            if let Some(card) = mig.iter().find(|c| c.card.name == d.name) {
                device.consumes_counters = Some(vec![consumption(card, &card.model.counters())]);
            }
            device
        })
        .collect();
    for card in mig {
        api_devices.extend(card.placements().iter().map(|p| placement_device(pool, card, p)));
    }
    lay_out(pool, mig.iter().map(counter_set).collect(), api_devices)
}

fn counter_set(card: &MigCard<'_>) -> resource::CounterSet {
    resource::CounterSet {
        name: card.counter_set(),
        counters: card.model.counters().into_iter().map(|(k, v)| (k, resource::Counter { value: quantity(v) })).collect(),
    }
}

fn consumption(card: &MigCard<'_>, counters: &BTreeMap<String, u64>) -> resource::DeviceCounterConsumption {
    resource::DeviceCounterConsumption {
        counter_set: card.counter_set(),
        counters: counters.iter().map(|(k, v)| (k.clone(), resource::Counter { value: quantity(*v) })).collect(),
    }
}

fn quantity(v: u64) -> ApiQuantity {
    ApiQuantity(v.to_string())
}

/// One placement as a device: one allocation at a time (the instance is the pod's), the
/// card's attributes with the MIG ones added, and its memory as a capacity.
fn placement_device(pool: &PoolIdentity, card: &MigCard<'_>, placement: &Placement) -> resource::Device {
    let whole = api_device(&pool.driver, card.card);
    let mut attributes = whole.attributes.unwrap_or_default();
    let text = |s: &str| resource::DeviceAttribute { string: Some(s.to_owned()), ..Default::default() };
    let int = |i: i64| resource::DeviceAttribute { int: Some(i), ..Default::default() };
    attributes.insert("type".into(), text("hami-mig"));
    attributes.insert("mode".into(), text("mig"));
    attributes.insert("parentUUID".into(), text(&card.card.uuid));
    attributes.insert("profile".into(), text(placement.profile().name()));
    attributes.insert("migProfileId".into(), int(i64::from(placement.profile().id())));
    attributes.insert("placementStart".into(), int(i64::from(placement.start())));
    attributes.insert("computeSlices".into(), int(i64::from(placement.profile().compute_slices())));
    attributes.remove("uuid");
    let memory = placement.profile().memory_mib() * 1024 * 1024;
    resource::Device {
        name: placement.device_name(card.card.minor).to_string(),
        attributes: Some(attributes),
        capacity: Some(BTreeMap::from([(
            "memory".to_owned(),
            resource::DeviceCapacity { value: quantity(memory), request_policy: None },
        )])),
        consumes_counters: Some(vec![consumption(card, &placement.consumes())]),
        taints: whole.taints,
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "slices_tests.rs"]
mod tests;
