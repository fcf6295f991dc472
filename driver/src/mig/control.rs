//! What creating and destroying MIG instances on a card means, and how it fails.

/// One MIG instance: a GPU instance at a placement and the compute instance that fills it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// NVML's GPU-instance profile id (19 for `1g.10gb`).
    pub gi_profile_id: u32,
    /// The first memory slice of its placement.
    pub start: u8,
    /// The GPU instance id NVML gave it. Opaque: NVML does not number instances by placement or
    /// in creation order (an A100 gave its first 3g.20gb id 2, the second id 1), so keep the id
    /// [`MigControl::create`] or [`MigControl::instances`] returns and never derive one.
    pub gi_id: u32,
    /// The compute instance id within the GPU instance.
    pub ci_id: u32,
    /// The MIG device UUID, `MIG-...`, that `NVIDIA_VISIBLE_DEVICES` names.
    pub uuid: String,
}

/// Creates and destroys MIG instances on the cards of a node; cards are named by GPU UUID.
///
/// Blocking: NVML calls take the driver's locks and may wait on the card.
pub trait MigControl: Send + Sync {
    /// Whether the card is in MIG mode now. The driver never switches it: on A100 that needs a
    /// GPU reset, so a card not in MIG mode offers no MIG devices.
    ///
    /// # Errors
    /// [`MigError::UnknownCard`], or a failed query.
    fn mig_mode(&self, card: &str) -> Result<bool, MigError>;

    /// The instances on the card, each a GPU instance with its compute instance.
    ///
    /// # Errors
    /// [`MigError::UnknownCard`], [`MigError::NotInMigMode`].
    fn instances(&self, card: &str) -> Result<Vec<MigInstance>, MigError>;

    /// Creates a GPU instance of profile `gi_profile_id` at memory slice `start`, then the
    /// compute instance that takes all of it.
    ///
    /// # Errors
    /// [`MigError`] naming the card, profile and placement: a placement the profile does not
    /// have, slices another instance holds, no compute or media extensions left, or a card not
    /// in MIG mode.
    fn create(&self, card: &str, gi_profile_id: u32, start: u8) -> Result<MigInstance, MigError>;

    /// Destroys the compute instance `ci_id` of GPU instance `gi_id`, then the GPU instance.
    ///
    /// # Errors
    /// [`MigError::UnknownInstance`] when there is no such instance; card errors as above.
    fn destroy(&self, card: &str, gi_id: u32, ci_id: u32) -> Result<(), MigError>;
}

/// Why a MIG operation on a card failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// No card has this UUID.
    #[error("no GPU {card}")]
    UnknownCard {
        /// The card's UUID as asked.
        card: String,
    },
    /// The card is not in MIG mode (and the driver does not switch it).
    #[error("GPU {card} is not in MIG mode")]
    NotInMigMode {
        /// The card.
        card: String,
    },
    /// The card's model has no GPU-instance profile with this id.
    #[error("GPU {card} has no MIG profile with id {profile}")]
    UnknownProfile {
        /// The card.
        card: String,
        /// The GPU-instance profile id asked for.
        profile: u32,
    },
    /// The profile cannot start at this memory slice.
    #[error("GPU {card}: MIG profile {profile} cannot be placed at memory slice {start}")]
    InvalidPlacement {
        /// The card.
        card: String,
        /// The profile's name.
        profile: &'static str,
        /// The start asked for.
        start: u8,
    },
    /// Another instance holds some of the placement's memory slices.
    #[error("GPU {card}: MIG profile {profile} at memory slice {start} overlaps GPU instance {holder}")]
    Occupied {
        /// The card.
        card: String,
        /// The profile's name.
        profile: &'static str,
        /// The start asked for.
        start: u8,
        /// The GPU instance holding a slice of it.
        holder: u32,
    },
    /// Too few compute slices are left.
    #[error("GPU {card}: MIG profile {profile} at memory slice {start} needs more compute slices than the {free} left")]
    NoCompute {
        /// The card.
        card: String,
        /// The profile's name.
        profile: &'static str,
        /// The start asked for.
        start: u8,
        /// Compute slices still free.
        free: u8,
    },
    /// Another `+me` instance holds the card's media extensions.
    #[error("GPU {card}: MIG profile {profile} at memory slice {start} needs the media extensions GPU instance {holder} holds")]
    MediaExtensionsTaken {
        /// The card.
        card: String,
        /// The profile's name.
        profile: &'static str,
        /// The start asked for.
        start: u8,
        /// The GPU instance holding them.
        holder: u32,
    },
    /// No instance has these ids.
    #[error("GPU {card} has no MIG instance with GPU instance {gi_id} and compute instance {ci_id}")]
    UnknownInstance {
        /// The card.
        card: String,
        /// The GPU instance id.
        gi_id: u32,
        /// The compute instance id.
        ci_id: u32,
    },
    /// An NVML call failed for a reason no variant above names (no permission, instance in use
    /// by a process, GPU lost, ...).
    #[error("GPU {card}: {call} failed: {reason} (NVML return code {code})")]
    Nvml {
        /// The card.
        card: String,
        /// The NVML function, such as `nvmlGpuInstanceDestroy`.
        call: &'static str,
        /// NVML's return code (`nvmlReturn_t`), such as 19 for `NVML_ERROR_IN_USE`.
        code: u32,
        /// NVML's text for it (`nvmlErrorString`), or what was wrong with what it returned.
        reason: String,
    },
}
