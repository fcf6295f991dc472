//! Dynamic MIG on the prepare side: which published devices stand for an instance to be made
//! on a card (each placement device, and the whole-card device of a card in MIG mode, which is
//! the full-size instance shared through HAMi-core), and what a claim's record keeps of it.
//!
//! An instance is made when the first claim on its device is prepared and destroyed when the
//! last one is unprepared; every claim on it records it, so the records alone say which
//! instances are the kubelet's. The order of durable steps (in `state::mig_steps`) makes a
//! crash at any point leave no instance that no record names:
//! prepare records the intent (placement, no instance) before the create, and the instance
//! after; unprepare destroys the instance before the record that names it goes.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vgpu_scheduling::mig::{MEMORY_SLICES, Placement};
use vgpu_scheduling::{DeviceName, Inventory, PublishedDevice, SharingConfig};

use crate::mig::view::list_instances;
use crate::mig::{MigControl, MigInstance, MigSettings, PlacementKey, PoolLayout};

/// What the plugin needs to make and destroy instances.
#[derive(Clone)]
pub struct MigPrepare {
    /// The cards' MIG control (NVML, or the simulator on a mock node).
    pub control: Arc<dyn MigControl>,
    /// Which cards offer dynamic MIG, and the placements whose instances are the claims'
    /// (`settings.owned`, shared with the publisher).
    pub settings: MigSettings,
}

impl std::fmt::Debug for MigPrepare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigPrepare").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// A published device that stands for an instance: where the instance goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigTarget {
    /// The device.
    pub device: DeviceName,
    /// The card's UUID.
    pub card: String,
    /// The card's minor (its `/dev/nvidia<minor>` and capability directory).
    pub minor: u32,
    /// The GPU-instance profile id.
    pub profile_id: u32,
    /// The first memory slice.
    pub start: u8,
}

/// One claim's use of an instance, as its checkpoint record keeps it. `instance` is `None`
/// while the instance is being made: a record found so at start-up is an interrupted prepare,
/// and whatever sits at its placement is that prepare's orphan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigHold {
    /// The device the claim was allocated.
    pub device: DeviceName,
    /// The card's UUID.
    pub card: String,
    /// The card's minor.
    pub minor: u32,
    /// The GPU-instance profile id.
    pub profile_id: u32,
    /// The first memory slice.
    pub start: u8,
    /// The instance, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<MigInstance>,
}

impl MigHold {
    /// A hold on `target`'s instance, `None` while it is being made.
    pub fn new(target: &MigTarget, instance: Option<MigInstance>) -> Self {
        Self {
            device: target.device.clone(),
            card: target.card.clone(),
            minor: target.minor,
            profile_id: target.profile_id,
            start: target.start,
            instance,
        }
    }

    /// Its placement.
    pub fn key(&self) -> PlacementKey {
        (self.card.clone(), self.profile_id, self.start)
    }
}

impl MigTarget {
    /// Its placement.
    pub fn key(&self) -> PlacementKey {
        (self.card.clone(), self.profile_id, self.start)
    }
}

impl MigPrepare {
    /// The devices of `inventory` (dynamic MIG's placement devices included) and those that
    /// stand for an instance. The instances on cards in MIG mode are asked of the card now, not
    /// taken from the inventory snapshot: a prepare never decides on instances that may have
    /// changed since (one destroyed at start-up a moment ago, one made by hand). Blocking.
    pub fn layout(&self, inventory: &Inventory, config: &SharingConfig) -> (Vec<PublishedDevice>, Vec<MigTarget>) {
        let mut inventory = inventory.clone();
        for gpu in &mut inventory.gpus {
            list_instances(gpu, &*self.control);
        }
        let layout = PoolLayout::new(&inventory, config, &self.settings);
        let mut devices = layout.devices.clone();
        let mut targets = Vec::new();
        for card in layout.mig_cards() {
            let placements = card.model.placements();
            if let Some(full) = placements.iter().find(|p| p.profile().memory_slices() == MEMORY_SLICES) {
                targets.push(target(card.card, full, card.card.name.clone()));
            }
            for placement in card.placements() {
                let device = card.device(&placement);
                targets.push(target(card.card, &placement, device.name.clone()));
                devices.push(device);
            }
        }
        (devices, targets)
    }
}

fn target(card: &PublishedDevice, placement: &Placement, device: DeviceName) -> MigTarget {
    MigTarget {
        device,
        card: card.uuid.clone(),
        minor: card.minor,
        profile_id: placement.profile().id(),
        start: placement.start(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::DeviceSource;
    use crate::discovery::mock::{MockSource, parse_spec};
    use crate::mig::{DynamicMig, MigSim};

    #[test]
    fn every_offered_placement_and_the_whole_card_stand_for_an_instance() {
        let inventory =
            MockSource::new("n1", parse_spec("NVIDIA A800-SXM4-80GB:80Gi:mig,Tesla T4:15Gi").unwrap()).inventory().unwrap();
        let settings = MigSettings { mode: DynamicMig::All, config: Vec::new(), ..Default::default() };
        let mig = MigPrepare { control: Arc::new(MigSim::new()), settings: settings.clone() };
        let config = SharingConfig::default();
        let (devices, targets) = mig.layout(&inventory, &config);
        let layout = PoolLayout::new(&inventory, &config, &settings);
        // The layout's devices plus one per placement, and every placement device is a target.
        let placements = targets.len() - 1;
        assert_eq!(devices.len(), layout.devices.len() + placements);
        let whole = &targets[0];
        assert_eq!((whole.device.as_str(), whole.profile_id, whole.start), ("hami-gpu-0", 0, 0));
        let small = targets.iter().find(|t| t.device.as_str() == "hami-gpu-0-mig-1g-10gb-3").unwrap();
        assert_eq!((small.profile_id, small.start, small.minor), (19, 3, 0));
        let device = devices.iter().find(|d| d.name == small.device).unwrap();
        assert_eq!(device.capacity["memory"].value, vgpu_scheduling::Quantity::from_bytes(9728 << 20), "the catalogue's 1g.10gb");
        // The T4 (out of MIG mode) stands for no instance.
        assert!(targets.iter().all(|t| t.card == inventory.gpus[0].uuid));
    }
}
