//! Which of the node's cards offer dynamic MIG, and the pool that results: decided from the
//! inventory, the device config's MIG entries and `--dynamic-mig`. A card in MIG mode that
//! offers none keeps publishing the instances it has (static MIG), and the reason is logged.
//!
//! A card in MIG mode runs no CUDA on the whole card, so its whole-card device (HAMi-core
//! shares) stands for the full-size instance (`7g.*`), with that instance's memory; it consumes
//! every counter of the card, so shares and smaller instances exclude each other.

use vgpu_scheduling::mig::{MEMORY_SLICES, MigModel, Placement, UnknownProfile, allowed_profiles, model_for};
use vgpu_scheduling::{Gpu, Inventory, MigModels, PublishedDevice, SharingConfig, publish};

use super::slices::{MigCard, build_slices_with_mig};
use crate::slices::PoolIdentity;

/// Which cards in MIG mode offer dynamic MIG (`--dynamic-mig`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DynamicMig {
    /// None: cards in MIG mode publish the instances they have.
    #[default]
    Off,
    /// Those whose model the device config lists under `knownMigGeometries` or
    /// `migProfileAllowlist`, as HAMi reads those lists.
    Listed,
    /// Every card whose model the MIG catalogue knows.
    All,
}

/// What decides dynamic MIG on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigSettings {
    /// Which cards offer it.
    pub mode: DynamicMig,
    /// The device config's MIG entries: which models are listed, which profiles they allow.
    pub config: Vec<MigModels>,
    /// Where the instances made for claims sit (kept by the plugin's state): they are the
    /// placement devices in use, not instances already on the card.
    pub owned: super::OwnedPlacements,
    /// Placement devices allow several claims, each a HAMi-core share inside the one instance
    /// (`--mig-instance-sharing`).
    pub shared_instances: bool,
}

/// A card that offers dynamic MIG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The card's UUID.
    pub uuid: String,
    /// Its catalogue model.
    pub model: &'static MigModel,
    /// The profiles the config allows on it (all when `None`).
    pub allowed: Option<Vec<&'static str>>,
    /// Where the instances it already has sit: no placement overlapping one is offered, nor
    /// the whole card.
    pub occupied: Vec<Placement>,
}

/// Why a card offers no dynamic MIG.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoOffer {
    /// A MIG-capable card (its model is catalogued, and listed under `listed`) that is not in
    /// MIG mode: the driver never switches the mode, so it is shared whole.
    #[error("it is not in MIG mode, and the driver never switches MIG mode (nvidia-smi -i <index> -mig 1 does, on an idle card)")]
    NotInMigMode,
    /// `--dynamic-mig listed` and no config entry names the card's model.
    #[error("no knownMigGeometries or migProfileAllowlist entry names its model")]
    NotListed,
    /// The catalogue has no such model.
    #[error("the MIG catalogue does not know this model (A100 40/80GB, A800 80GB, H100 80GB, H200 141GB)")]
    UnknownModel,
    /// The config allows a profile the model does not have.
    #[error(transparent)]
    UnknownProfile(#[from] UnknownProfile),
    /// An instance whose placement discovery could not read, or that does not fit the model.
    #[error("MIG instance {instance} has no known placement, so no free memory slice is known")]
    UnknownPlacement {
        /// The instance's UUID.
        instance: String,
    },
}

/// A card in MIG mode that offers no dynamic MIG, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The card's UUID.
    pub uuid: String,
    /// Its product name.
    pub product: String,
    /// Why.
    pub why: NoOffer,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.why {
            NoOffer::NotInMigMode => write!(f, "GPU {} ({}) offers no dynamic MIG: {}", self.uuid, self.product, self.why),
            _ => write!(f, "GPU {} ({}) is in MIG mode but offers no dynamic MIG: {}", self.uuid, self.product, self.why),
        }
    }
}

impl Refusal {
    /// Logs it for `node`: a warning for a card in MIG mode (its instances stay as they are),
    /// a note for one out of it (shared whole, as without dynamic MIG).
    pub fn log(&self, node: &str) {
        if self.why == NoOffer::NotInMigMode {
            tracing::info!(%node, card = %self.uuid, product = %self.product, reason = %self.why, "MIG-capable card offers no dynamic MIG; it is shared whole");
        } else {
            tracing::warn!(%node, card = %self.uuid, product = %self.product, reason = %self.why, "card in MIG mode offers no dynamic MIG; its existing instances are published as they are");
        }
    }
}

/// The node's pool: its devices, and the cards offering dynamic MIG with their whole-card
/// devices (published among `devices` unless an instance occupies the card).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolLayout {
    /// The devices: whole cards, static MIG instances, and the whole cards of MIG offers.
    pub devices: Vec<PublishedDevice>,
    /// Each offering card's whole-card device and offer.
    pub offers: Vec<(PublishedDevice, Offer)>,
    /// The cards in MIG mode that offer nothing, and why.
    pub refusals: Vec<Refusal>,
    /// How placement instances are shared (`None`: one claim each).
    pub shares: Option<SharingConfig>,
}

impl PoolLayout {
    /// The layout of `inventory` under `config` and `mig`.
    pub fn new(inventory: &Inventory, config: &SharingConfig, mig: &MigSettings) -> Self {
        let inventory = &mig.owned.strip(inventory);
        let (offers, refusals) = plan(inventory, mig);
        // The whole-card devices of offering cards, published as if out of MIG mode, with the
        // full-size instance's memory.
        let mut whole = inventory.clone();
        whole.gpus.retain(|g| offers.iter().any(|o| o.uuid == g.uuid));
        for gpu in &mut whole.gpus {
            if let Some(offer) = offers.iter().find(|o| o.uuid == gpu.uuid) {
                gpu.mig = None;
                gpu.memory_bytes = full_profile_mib(offer.model) << 20;
            }
        }
        let wholes = publish(&whole, config);
        let mut devices = publish(inventory, config);
        let mut paired = Vec::new();
        for offer in offers {
            let Some(card) = wholes.iter().find(|d| d.uuid == offer.uuid) else { continue };
            if offer.occupied.is_empty() {
                devices.push(card.clone());
            }
            paired.push((card.clone(), offer));
        }
        // Stable: a card's static instances keep their order.
        devices.sort_by_key(|d| d.minor);
        Self { devices, offers: paired, refusals, shares: mig.shared_instances.then(|| config.clone()) }
    }

    /// The offering cards as the slice builder and the prepare side see them.
    pub fn mig_cards(&self) -> Vec<MigCard<'_>> {
        self.offers
            .iter()
            .map(|(card, offer)| MigCard {
                card,
                model: offer.model,
                allowed: offer.allowed.clone(),
                occupied: offer.occupied.clone(),
                shares: self.shares.clone(),
            })
            .collect()
    }

    /// The pool's slices: counter sets first when any card offers dynamic MIG.
    pub fn slices(&self, pool: &PoolIdentity) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
        build_slices_with_mig(pool, &self.devices, &self.mig_cards())
    }
}

/// The memory of the model's full-size profile (all memory slices), in MiB.
fn full_profile_mib(model: &MigModel) -> u64 {
    model.profiles().iter().filter(|p| p.memory_slices() == MEMORY_SLICES).map(|p| p.memory_mib()).max().unwrap_or(0)
}

/// Which cards in MIG mode offer dynamic MIG and which do not, in inventory order. Cards out of
/// MIG mode are in neither list: the driver never switches the mode.
fn plan(inventory: &Inventory, mig: &MigSettings) -> (Vec<Offer>, Vec<Refusal>) {
    let mut offers = Vec::new();
    let mut refusals = Vec::new();
    if mig.mode == DynamicMig::Off {
        return (offers, refusals);
    }
    for gpu in &inventory.gpus {
        if gpu.mig.is_none() {
            // Said only of a card that could offer it: catalogued, and listed if that is asked.
            let listed = mig.mode == DynamicMig::All
                || mig.config.iter().any(|e| e.models.iter().any(|m| gpu.product_name.contains(m.as_str())));
            if listed && model_for(&gpu.product_name, gpu.memory_bytes).is_some() {
                refusals.push(Refusal { uuid: gpu.uuid.clone(), product: gpu.product_name.clone(), why: NoOffer::NotInMigMode });
            }
            continue;
        }
        match offer(gpu, mig) {
            Ok(offer) => offers.push(offer),
            Err(why) => refusals.push(Refusal { uuid: gpu.uuid.clone(), product: gpu.product_name.clone(), why }),
        }
    }
    (offers, refusals)
}

fn offer(gpu: &Gpu, mig: &MigSettings) -> Result<Offer, NoOffer> {
    let listed = mig.config.iter().any(|e| e.models.iter().any(|m| gpu.product_name.contains(m.as_str())));
    if mig.mode == DynamicMig::Listed && !listed {
        return Err(NoOffer::NotListed);
    }
    let model = model_for(&gpu.product_name, gpu.memory_bytes).ok_or(NoOffer::UnknownModel)?;
    let allowed = allowed_profiles(model, &gpu.product_name, &mig.config)?;
    let mut occupied = Vec::new();
    for instance in gpu.mig.iter().flatten() {
        let placement = instance
            .placement
            .and_then(|p| model.placement(model.profile(p.profile_id)?, p.start))
            .ok_or_else(|| NoOffer::UnknownPlacement { instance: instance.uuid.clone() })?;
        occupied.push(placement);
    }
    Ok(Offer { uuid: gpu.uuid.clone(), model, allowed, occupied })
}

#[cfg(test)]
#[path = "offer_tests.rs"]
mod tests;
