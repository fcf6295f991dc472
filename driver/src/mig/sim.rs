//! A simulator of MIG-capable cards, faithful to the rules NVML enforces when instances are
//! created, for tests and for nodes without such a card.
//!
//! Its cards come from the catalogue (`vgpu_scheduling::mig`), but it checks NVIDIA's rules in
//! their own terms (slices held, compute left, one media-extension instance) rather than through
//! the catalogue's counters, so a test can hold the counters against it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use sha2::{Digest, Sha256};
use vgpu_scheduling::mig::{COMPUTE_SLICES, MEMORY_SLICES, MigModel, MigProfile, Placement};

use super::control::{MigControl, MigError, MigInstance};

/// Simulated cards, by GPU UUID, each with its instances.
#[derive(Debug, Default)]
pub struct MigSim {
    cards: Mutex<BTreeMap<String, Card>>,
    /// Where the instances are kept across processes ([`MigSim::persistent`]).
    file: Option<PathBuf>,
    /// What that file held when opened, taken by [`MigSim::with_card`] card by card.
    saved: Mutex<BTreeMap<String, SavedCard>>,
}

/// A card's instances as the state file keeps them.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SavedCard {
    /// Instances created on the card so far.
    pub created: u64,
    /// The instances on it.
    pub instances: Vec<MigInstance>,
}

#[derive(Debug)]
struct Card {
    model: &'static MigModel,
    mig_mode: bool,
    /// Instances created so far, so a recreated instance gets a new UUID as on a real card.
    created: u64,
    instances: Vec<Live>,
}

#[derive(Debug)]
struct Live {
    placement: Placement,
    instance: MigInstance,
}

impl MigSim {
    /// A simulator with no cards.
    pub fn new() -> Self {
        Self::default()
    }

    /// A simulator whose instances outlive the process, as a card's do: kept in `file` (JSON,
    /// rewritten atomically after each change), so a test can kill the driver at any step and
    /// see what is left on the "card". A missing file is an empty card.
    ///
    /// # Errors
    /// When the file exists and cannot be read or parsed.
    pub fn persistent(file: impl Into<PathBuf>) -> std::io::Result<Self> {
        let file = file.into();
        let saved = Self::read_state(&file)?;
        Ok(Self { file: Some(file), saved: Mutex::new(saved), ..Self::default() })
    }

    /// The instances a state file holds, by card UUID (for tests that look at the "card").
    ///
    /// # Errors
    /// When the file cannot be read or parsed; a missing file holds none.
    pub fn read_state(file: &Path) -> std::io::Result<BTreeMap<String, SavedCard>> {
        match std::fs::read(file) {
            Ok(body) => serde_json::from_slice(&body).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(e),
        }
    }

    /// Adds the card `uuid` of `model`, in MIG mode or not; the simulator never switches it. A
    /// persistent simulator gives it the instances its file holds for that UUID (those whose
    /// placement the model has).
    #[must_use]
    pub fn with_card(self, uuid: impl Into<String>, model: &'static MigModel, mig_mode: bool) -> Self {
        let uuid = uuid.into();
        let saved = self.saved.lock().unwrap_or_else(PoisonError::into_inner).remove(&uuid).unwrap_or_default();
        let instances = saved
            .instances
            .into_iter()
            .filter_map(|instance| {
                let placement = model.placement(model.profile(instance.gi_profile_id)?, instance.start)?;
                Some(Live { placement, instance })
            })
            .collect();
        let card = Card { model, mig_mode, created: saved.created, instances };
        self.lock().insert(uuid, card);
        self
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Card>> {
        // A panic under the lock leaves whole instances behind (each change is one push or
        // remove), so the state stays usable.
        self.cards.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the cards' instances to the state file, if there is one, with the lock held so
    /// that writes land in the order of the changes.
    fn save(&self, cards: &BTreeMap<String, Card>) {
        let Some(file) = &self.file else { return };
        let state: BTreeMap<&String, SavedCard> = cards
            .iter()
            .map(|(uuid, c)| {
                (uuid, SavedCard { created: c.created, instances: c.instances.iter().map(|l| l.instance.clone()).collect() })
            })
            .collect();
        let written = serde_json::to_vec_pretty(&state)
            .map_err(std::io::Error::other)
            .and_then(|body| crate::fsutil::write_atomically(file, &body, 0o644));
        if let Err(e) = written {
            // A simulator's file only; the change itself stands, as it would on a card.
            tracing::error!(path = %file.display(), error = %e, "MIG simulator state not saved");
        }
    }
}

/// The card in MIG mode, or why not.
fn mig_card<'a>(cards: &'a mut BTreeMap<String, Card>, uuid: &str) -> Result<&'a mut Card, MigError> {
    let card = cards.get_mut(uuid).ok_or_else(|| MigError::UnknownCard { card: uuid.to_owned() })?;
    if card.mig_mode { Ok(card) } else { Err(MigError::NotInMigMode { card: uuid.to_owned() }) }
}

impl Card {
    /// Refuses `placement` when its slices are held, compute is short, or it is a second `+me`.
    fn admit(&self, uuid: &str, placement: Placement) -> Result<(), MigError> {
        let profile = placement.profile();
        let (card, name, start) = (uuid.to_owned(), profile.name(), placement.start());
        if let Some(holder) = self.instances.iter().find(|l| l.placement.overlaps(&placement)) {
            return Err(MigError::Occupied { card, profile: name, start, holder: holder.instance.gi_id });
        }
        // No catalogued layout runs out of compute before its slices overlap (mig_tests shows
        // the slices alone keep every layout at 7 or fewer), but NVML checks compute on its own,
        // and so does a faithful simulator.
        let used: u8 = self.instances.iter().map(|l| l.placement.profile().compute_slices()).sum();
        let free = COMPUTE_SLICES.saturating_sub(used);
        if profile.compute_slices() > free {
            return Err(MigError::NoCompute { card, profile: name, start, free });
        }
        let media = self.instances.iter().find(|l| l.placement.profile().media_extension());
        if let (true, Some(holder)) = (profile.media_extension(), media) {
            return Err(MigError::MediaExtensionsTaken { card, profile: name, start, holder: holder.instance.gi_id });
        }
        Ok(())
    }

    /// A GPU instance id: 0 for the full-card profile (as NVML numbers it), otherwise the
    /// smallest free from 1. NVML's own choice differs (see [`MigInstance::gi_id`]); callers
    /// must not depend on either.
    fn free_gi_id(&self, profile: &MigProfile) -> u32 {
        if profile.memory_slices() == MEMORY_SLICES {
            return 0;
        }
        // Seven instances at most, so one of the ids 1..=8 is always free.
        (1..=u32::from(MEMORY_SLICES)).find(|id| self.instances.iter().all(|l| l.instance.gi_id != *id)).unwrap_or(u32::MAX)
    }
}

/// A deterministic `MIG-` UUID from the card, the ids and the card's creation count.
fn mig_uuid(card: &str, gi_id: u32, ci_id: u32, created: u64) -> String {
    let digest = Sha256::digest(format!("{card}/{gi_id}/{ci_id}/{created}"));
    let mut hex = String::with_capacity(32);
    for byte in &digest[..16] {
        let _ = write!(hex, "{byte:02x}");
    }
    format!("MIG-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

impl MigControl for MigSim {
    fn mig_mode(&self, card: &str) -> Result<bool, MigError> {
        self.lock().get(card).map(|c| c.mig_mode).ok_or_else(|| MigError::UnknownCard { card: card.to_owned() })
    }

    fn instances(&self, card: &str) -> Result<Vec<MigInstance>, MigError> {
        let mut cards = self.lock();
        let mut out: Vec<MigInstance> = mig_card(&mut cards, card)?.instances.iter().map(|l| l.instance.clone()).collect();
        out.sort_by_key(|i| (i.gi_id, i.ci_id));
        Ok(out)
    }

    fn create(&self, card: &str, gi_profile_id: u32, start: u8) -> Result<MigInstance, MigError> {
        let mut cards = self.lock();
        let state = mig_card(&mut cards, card)?;
        let profile = state
            .model
            .profile(gi_profile_id)
            .ok_or_else(|| MigError::UnknownProfile { card: card.to_owned(), profile: gi_profile_id })?;
        let placement = state.model.placement(profile, start).ok_or_else(|| MigError::InvalidPlacement {
            card: card.to_owned(),
            profile: profile.name(),
            start,
        })?;
        state.admit(card, placement)?;
        let gi_id = state.free_gi_id(profile);
        // The one compute instance filling the GPU instance: NVML numbers a GI's CIs from 0.
        let ci_id = 0;
        state.created += 1;
        let uuid = mig_uuid(card, gi_id, ci_id, state.created);
        let instance = MigInstance { gi_profile_id, start, gi_id, ci_id, uuid };
        state.instances.push(Live { placement, instance: instance.clone() });
        self.save(&cards);
        Ok(instance)
    }

    fn destroy(&self, card: &str, gi_id: u32, ci_id: u32) -> Result<(), MigError> {
        let mut cards = self.lock();
        let state = mig_card(&mut cards, card)?;
        let at = state
            .instances
            .iter()
            .position(|l| l.instance.gi_id == gi_id && l.instance.ci_id == ci_id)
            .ok_or_else(|| MigError::UnknownInstance { card: card.to_owned(), gi_id, ci_id })?;
        state.instances.remove(at);
        self.save(&cards);
        Ok(())
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
