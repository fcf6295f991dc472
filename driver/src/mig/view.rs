//! The node's inventory as dynamic MIG sees it: the instances this driver made for claims are
//! not "instances already on the card" but its placement devices in use, so
//! [`OwnedPlacements::strip`] takes them out of every card's instance list before a layout is
//! made of it; and on a mock node the simulator's instances are the cards' instances, as NVML
//! would list them ([`MigView`]).
//!
//! Without the first rule an instance made for a claim would be published as a static MIG
//! device of its own (that a second claim could be given) and its placement device withdrawn.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError, RwLock};

use vgpu_scheduling::mig::model_for;
use vgpu_scheduling::{Gpu, Inventory, MigDevice, MigPlacement};

use super::control::{MigControl, MigInstance};
use super::sim::MigSim;
use crate::discovery::{CardList, DeviceSource, DiscoveryError};

/// A placement on a card: the card's UUID, the GPU-instance profile id and the first slice.
pub type PlacementKey = (String, u32, u8);

/// The placements where this driver has (or is about to have) an instance for a claim; shared
/// between the plugin's state, which keeps it, and every layout of the pool, which leaves those
/// instances out.
#[derive(Debug, Clone, Default)]
pub struct OwnedPlacements(Arc<RwLock<BTreeSet<PlacementKey>>>);

impl PartialEq for OwnedPlacements {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || *self.0.read().unwrap_or_else(PoisonError::into_inner) == *other.0.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Eq for OwnedPlacements {}

impl OwnedPlacements {
    /// `inventory` without the instances at these placements.
    pub fn strip(&self, inventory: &Inventory) -> Inventory {
        let owned = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut out = inventory.clone();
        if owned.is_empty() {
            return out;
        }
        for gpu in &mut out.gpus {
            let uuid = gpu.uuid.clone();
            if let Some(instances) = &mut gpu.mig {
                instances.retain(|m| m.placement.is_none_or(|p| !owned.contains(&(uuid.clone(), p.profile_id, p.start))));
            }
        }
        out
    }

    /// Makes the set exactly `keys`.
    pub fn replace(&self, keys: BTreeSet<PlacementKey>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = keys;
    }

    /// Adds one placement.
    pub fn insert(&self, key: PlacementKey) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).insert(key);
    }

    /// Removes one placement.
    pub fn remove(&self, key: &PlacementKey) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).remove(key);
    }

    /// Whether the placement is ours.
    pub fn contains(&self, key: &PlacementKey) -> bool {
        self.0.read().unwrap_or_else(PoisonError::into_inner).contains(key)
    }
}

/// A mock device source whose cards in MIG mode list the simulator's instances.
pub struct MigView {
    inner: Arc<dyn DeviceSource>,
    sim: Arc<MigSim>,
}

impl MigView {
    /// `inner`'s cards with `sim`'s instances.
    pub fn new(inner: Arc<dyn DeviceSource>, sim: Arc<MigSim>) -> Self {
        Self { inner, sim }
    }

    fn adjust(&self, mut gpu: Gpu) -> Gpu {
        list_instances(&mut gpu, &*self.sim);
        gpu
    }
}

/// Sets the instances of `gpu`, a card in MIG mode whose model the catalogue knows, to those
/// `control` lists now, as discovery reports them; another card, or a listing that fails,
/// keeps what it had.
pub fn list_instances(gpu: &mut Gpu, control: &dyn MigControl) {
    if gpu.mig.is_none() {
        return;
    }
    let (Some(model), Ok(now)) = (model_for(&gpu.product_name, gpu.memory_bytes), control.instances(&gpu.uuid)) else {
        return;
    };
    gpu.mig = Some(now.iter().filter_map(|i| mig_device(model, i)).collect());
}

impl DeviceSource for MigView {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        let mut inventory = self.inner.inventory()?;
        inventory.gpus = inventory.gpus.into_iter().map(|g| self.adjust(g)).collect();
        Ok(inventory)
    }

    fn cards(&self) -> Result<CardList, DiscoveryError> {
        self.inner.cards()
    }

    fn card(&self, index: u32) -> Result<Gpu, DiscoveryError> {
        self.inner.card(index).map(|g| self.adjust(g))
    }
}

/// A simulator holding the catalogued cards in MIG mode of a mock inventory, their instances
/// kept in `state_file` when given (so they outlive a killed driver, as a card's do).
///
/// # Errors
/// When the state file cannot be read.
pub fn mock_sim(inventory: &Inventory, state_file: Option<&std::path::Path>) -> std::io::Result<MigSim> {
    let mut sim = match state_file {
        Some(file) => MigSim::persistent(file)?,
        None => MigSim::new(),
    };
    for gpu in inventory.gpus.iter().filter(|g| g.mig.is_some()) {
        if let Some(model) = model_for(&gpu.product_name, gpu.memory_bytes) {
            sim = sim.with_card(gpu.uuid.clone(), model, true);
        }
    }
    Ok(sim)
}

/// An instance as discovery reports it.
fn mig_device(model: &vgpu_scheduling::mig::MigModel, instance: &MigInstance) -> Option<MigDevice> {
    let profile = model.profile(instance.gi_profile_id)?;
    Some(MigDevice {
        uuid: instance.uuid.clone(),
        profile: profile.name().to_owned(),
        gpu_instance: instance.gi_id,
        compute_instance: instance.ci_id,
        memory_bytes: profile.memory_mib() << 20,
        multiprocessors: 0,
        placement: Some(MigPlacement { profile_id: instance.gi_profile_id, start: instance.start }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::mock::MockSource;
    use vgpu_scheduling::mock::parse_spec;

    fn view() -> (MigView, Arc<MigSim>, String) {
        let raw = MockSource::new("n1", parse_spec("NVIDIA A800-SXM4-80GB:80Gi:mig,Tesla T4:15Gi").unwrap());
        let inventory = raw.inventory().unwrap();
        let sim = Arc::new(mock_sim(&inventory, None).unwrap());
        let uuid = inventory.gpus[0].uuid.clone();
        (MigView::new(Arc::new(raw), sim.clone()), sim, uuid)
    }

    #[test]
    fn the_simulators_instances_are_the_cards_and_owned_ones_are_stripped() {
        let owned = OwnedPlacements::default();
        let (view, sim, card) = view();
        assert_eq!(view.inventory().unwrap().gpus[0].mig, Some(Vec::new()));
        let ours = sim.create(&card, 19, 3).unwrap();
        let foreign = sim.create(&card, 14, 0).unwrap();
        let listed = view.inventory().unwrap().gpus[0].mig.clone().unwrap();
        // In GPU-instance id order, as the simulator lists them.
        assert_eq!(listed.iter().map(|m| m.uuid.clone()).collect::<Vec<_>>(), vec![ours.uuid.clone(), foreign.uuid.clone()]);
        assert_eq!(listed[0].placement, Some(MigPlacement { profile_id: 19, start: 3 }));
        assert_eq!(view.card(0).unwrap().mig.unwrap(), listed);
        owned.insert((card.clone(), 19, 3));
        let stripped = owned.strip(&view.inventory().unwrap());
        let left = stripped.gpus[0].mig.clone().unwrap();
        assert_eq!(left.iter().map(|m| m.uuid.clone()).collect::<Vec<_>>(), vec![foreign.uuid]);
        // The same placement on another card is not ours; the card out of MIG mode is untouched.
        assert!(!owned.contains(&("GPU-other".into(), 19, 3)));
        assert_eq!(stripped.gpus[1].mig, None);
        owned.remove(&(card, 19, 3));
        assert_eq!(owned.strip(&view.inventory().unwrap()).gpus[0].mig.clone().unwrap().len(), 2);
    }

    #[test]
    fn a_persistent_simulator_gives_back_its_instances_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sim.json");
        let inventory = MockSource::new("n1", parse_spec("NVIDIA H200:141Gi:mig").unwrap()).inventory().unwrap();
        let card = inventory.gpus[0].uuid.clone();
        let made = mock_sim(&inventory, Some(&file)).unwrap().create(&card, 19, 2).unwrap();
        let again = mock_sim(&inventory, Some(&file)).unwrap();
        assert_eq!(again.instances(&card).unwrap(), vec![made.clone()]);
        assert_eq!(MigSim::read_state(&file).unwrap()[&card].instances, vec![made.clone()]);
        // A recreated instance gets a new UUID, as on a card.
        again.destroy(&card, made.gi_id, made.ci_id).unwrap();
        let next = again.create(&card, 19, 2).unwrap();
        assert_ne!(next.uuid, made.uuid);
        assert_eq!(MigSim::read_state(&file).unwrap()[&card].instances, vec![next]);
    }
}
