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
//! - `nvidia.com/vgpu-mode: mig` (or Volcano's `volcano.sh/vgpu-mode`) asks MIG instances of the
//!   driver's dynamic MIG instead of shares, the smallest profile holding the memory first, and
//!   `nvidia.com/mig-<profile>: N` asks N instances of that profile (both on the MIG class);
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
mod error;
mod flavours;
mod job;
mod mig;
mod mig_names;
mod pod;
mod selectors;
mod settings;
mod volcano;

pub use claim::{
    CONFIG_API_VERSION, CONFIG_KIND, HamiCoreConfig, HamiCoreConfigError, MAX_SUBREQUESTS, REQUEST_NAME, TEMPLATE_PREFIX,
    claim_spec, template_name,
};
pub use container::{Ask, CardRequest, MAX_COUNT, MemoryRequest, container_ask};
pub use error::CompatError;
pub use flavours::{FlavourOptions, device_classes, flavours, job_resource_names, pick, pod_resource_names};
pub use job::{JobConversion, JobError, convert_volcano_job};
pub use mig::{
    ANNOTATION_VGPU_MODE, ANNOTATION_VOLCANO_VGPU_MODE, MODE_HAMI_CORE, MODE_MIG, VgpuMode, either_claim_spec,
    instances_claim_spec, mig_claim_spec, vgpu_mode,
};
pub use mig_names::{MIG_DEVICE_TYPE, MigInstances, default_mig_device_class};
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

#[cfg(test)]
mod fixtures;
