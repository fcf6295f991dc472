//! HAMi compatibility: pods written for HAMi's device plugin (`nvidia.com/gpu`, `gpumem`,
//! `gpumem-percentage`, `gpucores`, `priority`, or Volcano's `volcano.sh/vgpu-*`) converted into
//! DRA device requests with HAMi's own meaning, for the admission webhook, the node daemon and the
//! CLI alike.
//!
//! The rules follow HAMi's device-plugin admission (`MutateAdmission`, `GenerateResourceRequests`,
//! `CheckType`/`CheckUUID`), not HAMi-DRA's webhook:
//! - a container's count is N **distinct** cards (`distinctAttribute` on `<driver>/uuid`);
//! - memory, cores or a percentage without a count ask for `defaultGPUNum` cards;
//! - memory numbers are MiB (times the memory factor), decimal forms such as `2k` included (the
//!   API server stores 2000 as `2k`); binary-suffixed quantities (`16Gi`) are bytes;
//! - no memory is `defaultMemory`, 0 being the whole card (no memory request: the device's
//!   request policy defaults to the whole card);
//! - no cores is `defaultCores`, or 100 (an exclusive card) when the memory is the whole card;
//! - a percentage is of the card the scheduler picks: one `firstAvailable` subrequest per card
//!   model the class offers;
//! - priority and `gpuCorePolicy` travel as opaque claim configuration ([`HamiCoreConfig`]) that
//!   the node driver turns into HAMi-core's environment;
//! - a converted pod of Volcano's scheduler that requests nothing else gets a minimal cpu
//!   request, so that Volcano, which counted the HAMi resources it no longer has, does not
//!   schedule it as a best-effort task ([`VolcanoSettings`]).
//!
//! Pure functions over k8s-openapi types: no I/O, no client. The webhook creates the returned
//! [`ResourceClaimTemplate`](k8s_openapi::api::resource::v1::ResourceClaimTemplate)s and applies
//! the returned JSON patch.

mod claim;
mod container;
mod job;
mod pod;
mod selectors;
mod settings;
mod volcano;

pub use claim::{
    CONFIG_API_VERSION, CONFIG_KIND, HamiCoreConfig, HamiCoreConfigError, MAX_SUBREQUESTS, REQUEST_NAME, TEMPLATE_PREFIX,
    claim_spec, template_name,
};
pub use container::{Ask, CardRequest, MAX_COUNT, MemoryRequest, container_ask};
pub use job::{JobConversion, JobError, convert_volcano_job};
pub use pod::{
    CLAIM_ENTRY_PREFIX, PodConversion, SpecConversion, claim_entry_name, convert_pod, convert_pod_spec, job_match_condition,
    pod_match_condition,
};
pub use selectors::{
    ANNOTATION_NOUSE_TYPE, ANNOTATION_NOUSE_UUID, ANNOTATION_USE_TYPE, ANNOTATION_USE_UUID, IGNORED_ANNOTATIONS, Selection,
    annotation_warnings, cel_string,
};
pub use settings::{CardModel, ClassFacts, CompatSettings, CorePolicy};
pub use volcano::{DEFAULT_CPU_REQUEST, VOLCANO_SCHEDULER, VolcanoSettings, requests_something};

/// Why a pod is denied; every message names the container and the resource or annotation.
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
    /// MIG resources are not served yet.
    #[error("container {container:?}: {resource}: MIG devices are not supported by vgpu-dra yet")]
    Mig {
        /// Container name.
        container: String,
        /// The MIG resource name.
        resource: String,
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
        /// Why, in words (`is published yet`, `matches the pod's GPU type annotations`).
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
            Self::Mig { .. } => "mig",
            Self::NoCardModel { .. } => "no_card_model",
            Self::TooManyCardModels { .. } => "too_many_card_models",
            Self::ClaimNameTaken { .. } => "claim_name_taken",
            Self::AlreadyConverted { .. } => "already_converted",
        }
    }
}

#[cfg(test)]
mod fixtures;
