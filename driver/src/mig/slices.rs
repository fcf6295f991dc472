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
use vgpu_scheduling::device::share_capacities;
use vgpu_scheduling::mig::{MigModel, Placement};
use vgpu_scheduling::{Attribute, Capacity, PublishedDevice, Quantity, SharingConfig};

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
    /// How its instances are shared through HAMi-core (`--mig-instance-sharing`); `None`: each
    /// instance is one claim's.
    pub shares: Option<SharingConfig>,
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

    /// The device standing for `placement`: the card's attributes with the MIG ones, and the
    /// profile's memory, either as the one capacity a claim takes whole or, with `shares`, as
    /// HAMi-core's share capacities (memory, cores, split count) inside the instance. The
    /// publisher and the prepare side both read it from here.
    pub fn device(&self, placement: &Placement) -> PublishedDevice {
        let mut attributes = self.card.attributes.clone();
        let int = |i: u32| Attribute::Int(i64::from(i));
        attributes.insert("type".into(), Attribute::String("hami-mig".into()));
        attributes.insert("mode".into(), Attribute::String("mig".into()));
        attributes.insert("parentUUID".into(), Attribute::String(self.card.uuid.clone()));
        attributes.insert("profile".into(), Attribute::String(placement.profile().name().into()));
        attributes.insert("migProfileId".into(), int(placement.profile().id()));
        attributes.insert("placementStart".into(), int(u32::from(placement.start())));
        attributes.insert("computeSlices".into(), int(u32::from(placement.profile().compute_slices())));
        attributes.remove("uuid");
        let memory = placement.profile().memory_mib() << 20;
        let capacity = match &self.shares {
            Some(config) => share_capacities(memory, config),
            None => BTreeMap::from([("memory".to_owned(), Capacity { value: Quantity::from_bytes(memory), policy: None })]),
        };
        PublishedDevice {
            name: placement.device_name(self.card.minor),
            uuid: self.card.uuid.clone(),
            minor: self.card.minor,
            attributes,
            capacity,
            health: self.card.health,
        }
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

/// One placement as a device ([`MigCard::device`]) consuming its counters: one allocation at a
/// time (the instance is the pod's) unless its instance is shared, whose counters the scheduler
/// then charges once, at the first allocation.
fn placement_device(pool: &PoolIdentity, card: &MigCard<'_>, placement: &Placement) -> resource::Device {
    let mut device = api_device(&pool.driver, &card.device(placement));
    device.allow_multiple_allocations = card.shares.is_some().then_some(true);
    device.consumes_counters = Some(vec![consumption(card, &placement.consumes())]);
    device
}

#[cfg(test)]
#[path = "slices_tests.rs"]
mod tests;
