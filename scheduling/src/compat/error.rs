//! Why a pod is denied.

use super::selectors::ANNOTATION_USE_TYPE;

/// Why a pod is denied; every message names the container and the resource, or the annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompatError {
    /// The value is not a Kubernetes quantity.
    #[error("container {container:?}: {resource}: {value:?} is not a quantity")]
    BadQuantity {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The value as written.
        value: String,
    },
    /// The value must be a whole number (fractional GPUs, percentages, cores).
    #[error("container {container:?}: {resource}: {value} is not a whole number{hint}")]
    NotWhole {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The value as written.
        value: String,
        /// What to write instead, with a leading separator, or empty.
        hint: &'static str,
    },
    /// The value is outside its range.
    #[error("container {container:?}: {resource}: {value} is out of range, it must be {range}")]
    OutOfRange {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The value as written.
        value: String,
        /// The accepted range, in words.
        range: String,
    },
    /// Limits and requests give different values.
    #[error("container {container:?}: {resource}: the limit {limit} and the request {request} differ")]
    LimitRequestDiffer {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The limit.
        limit: String,
        /// The request.
        request: String,
    },
    /// Memory and memory percentage together.
    #[error("container {container:?}: {memory} and {percentage} are both set; set one of them")]
    MemoryAndPercentage {
        /// Container name.
        container: String,
        /// The memory resource name.
        memory: String,
        /// The percentage resource name.
        percentage: String,
    },
    /// More memory than any card of the class has.
    #[error(
        "container {container:?}: {resource}: {bytes} bytes is more than the largest card of the class has ({largest} bytes)"
    )]
    MemoryTooLarge {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The memory asked.
        bytes: u64,
        /// The largest card's memory.
        largest: u64,
    },
    /// A suffixed memory quantity below 1Mi, most likely a unit mistake.
    #[error(
        "container {container:?}: {resource}: {value} is less than 1Mi; write a plain number for MiB or a quantity such as 4Gi"
    )]
    MemoryTooSmall {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The value as written.
        value: String,
    },
    /// More cards than any node has.
    #[error("container {container:?}: {resource}: {count} cards is more than any node of the class has ({max})")]
    TooManyCards {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Cards asked.
        count: u64,
        /// The most cards of one node.
        max: u32,
    },
    /// A privileged container sees every card and escapes HAMi-core's limits.
    #[error(
        "container {container:?} is privileged and asks for {resource}: a privileged container sees every GPU and escapes the limits"
    )]
    Privileged {
        /// Container name.
        container: String,
        /// One of the resources it asks for.
        resource: String,
    },
    /// A `vgpu-mode` annotation with a value other than `hami-core` or `mig`.
    #[error(
        "annotation {annotation}: {value:?} is not a mode vgpu-dra serves; write \"hami-core\" (shares of whole cards under HAMi-core's limits) or \"mig\" (MIG instances)"
    )]
    VgpuMode {
        /// The annotation (`nvidia.com/vgpu-mode` or `volcano.sh/vgpu-mode`).
        annotation: String,
        /// Its value as written.
        value: String,
    },
    /// HAMi's and Volcano's `vgpu-mode` annotations ask different modes.
    #[error("annotations {first}: {first_value:?} and {second}: {second_value:?} ask different modes; keep one")]
    VgpuModeConflict {
        /// The first annotation.
        first: String,
        /// Its value.
        first_value: String,
        /// The second annotation.
        second: String,
        /// Its value.
        second_value: String,
    },
    /// `nvidia.com/mig-<profile>` naming a profile no catalogued card has.
    #[error(
        "container {container:?}: {resource}: no card vgpu-dra knows (A100 40/80GB, A800 80GB, H100 80GB, H200 141GB) has MIG profile {profile:?}; name one such as 1g.10gb, 2g.20gb or 3g.40gb"
    )]
    UnknownMigProfile {
        /// Container name.
        container: String,
        /// The MIG resource name.
        resource: String,
        /// The profile part of the name.
        profile: String,
    },
    /// In `mig` mode, more memory than any MIG instance of a catalogued card holds.
    #[error(
        "container {container:?}: {resource}: {bytes} bytes is more than any MIG instance holds (the largest, of an H200, holds {largest} bytes); drop the vgpu-mode annotation to ask a share of a whole card"
    )]
    MigMemoryTooLarge {
        /// Container name.
        container: String,
        /// The memory resource name.
        resource: String,
        /// The memory asked.
        bytes: u64,
        /// The largest instance's memory.
        largest: u64,
    },
    /// A container asking MIG instances by profile and shares of cards together.
    #[error(
        "container {container:?} asks for {mig} and {other}: a container gets MIG instances by profile or cards by count and memory, not both; put them in separate containers"
    )]
    MigAndCards {
        /// Container name.
        container: String,
        /// The MIG resource name.
        mig: String,
        /// One of the other resources it asks for.
        other: String,
    },
    /// A percentage needs the card models of the class, and none is known or selectable.
    #[error(
        "container {container:?}: {resource}: no card of the class {reason}, so a percentage of its memory cannot be expressed"
    )]
    NoCardModel {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Why, in words (`is published yet nor named by ...`, `matches the pod's GPU type annotations`).
        reason: &'static str,
    },
    /// A percentage over more card models than a prioritized list holds.
    #[error(
        "container {container:?}: {resource}: the class offers {models} card models, more than the {max} a request can list; use a memory amount or narrow the models with {ANNOTATION_USE_TYPE}"
    )]
    TooManyCardModels {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Models that would be listed.
        models: usize,
        /// The API's limit.
        max: usize,
    },
    /// The pod already has a resource claim entry under the name this conversion needs.
    #[error("container {container:?}: the pod already has a resource claim named {name:?} that vgpu-dra did not make")]
    ClaimNameTaken {
        /// Container name.
        container: String,
        /// The entry name.
        name: String,
    },
    /// A container converted before still asks for HAMi resources.
    #[error("container {container:?}: {resource}: the container already has a vgpu-dra claim and asks for HAMi resources again")]
    AlreadyConverted {
        /// Container name.
        container: String,
        /// One of the resources it asks for.
        resource: String,
    },
}

impl CompatError {
    /// A short, fixed label for metrics (`denials_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadQuantity { .. } => "bad_quantity",
            Self::NotWhole { .. } => "not_whole",
            Self::OutOfRange { .. } => "out_of_range",
            Self::LimitRequestDiffer { .. } => "limit_request_differ",
            Self::MemoryAndPercentage { .. } => "memory_and_percentage",
            Self::MemoryTooLarge { .. } => "memory_too_large",
            Self::MemoryTooSmall { .. } => "memory_too_small",
            Self::TooManyCards { .. } => "too_many_cards",
            Self::Privileged { .. } => "privileged",
            Self::VgpuMode { .. } => "vgpu_mode",
            Self::VgpuModeConflict { .. } => "vgpu_mode_conflict",
            Self::UnknownMigProfile { .. } => "unknown_mig_profile",
            Self::MigMemoryTooLarge { .. } => "mig_memory_too_large",
            Self::MigAndCards { .. } => "mig_and_cards",
            Self::NoCardModel { .. } => "no_card_model",
            Self::TooManyCardModels { .. } => "too_many_card_models",
            Self::ClaimNameTaken { .. } => "claim_name_taken",
            Self::AlreadyConverted { .. } => "already_converted",
        }
    }
}
