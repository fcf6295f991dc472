//! A container's [`CardRequest`] as the spec of a ResourceClaimTemplate, named from a hash of its
//! content, and the opaque configuration that carries HAMi-core settings to the node driver.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, DeviceClaim, DeviceClaimConfiguration, DeviceConstraint, DeviceRequest,
    DeviceSelector, DeviceSubRequest, ExactDeviceRequest, OpaqueDeviceConfiguration, ResourceClaimSpec,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use sha2::{Digest, Sha256};

use super::container::{CardRequest, MemoryRequest};
use super::error::CompatError;
use super::selectors::Selection;
use super::selectors::cel_string;
use super::settings::{CardModel, ClassFacts, CompatSettings, CorePolicy};
use crate::device::{CAPACITY_CORES, CAPACITY_MEMORY};

/// The name of the request in converted claims (HAMi-DRA's name); `gpu-<i>` when a percentage
/// of several cards needs one request per card.
pub const REQUEST_NAME: &str = "gpu";
/// Prefix of the templates this conversion names; how converted pods are recognised.
pub const TEMPLATE_PREFIX: &str = "hami-vgpu-";
/// `firstAvailable` holds at most this many subrequests (resource.k8s.io).
pub const MAX_SUBREQUESTS: usize = 8;
/// `apiVersion` of [`HamiCoreConfig`] in a claim's opaque configuration.
pub const CONFIG_API_VERSION: &str = "hami-core-gpu.project-hami.io/v1alpha1";
/// `kind` of [`HamiCoreConfig`].
pub const CONFIG_KIND: &str = "HamiCoreConfig";

const MIB: u64 = 1 << 20;

/// HAMi-core settings that are not capacities, passed from the claim to the node driver as
/// opaque configuration of the driver (`spec.devices.config[].opaque.parameters`):
///
/// ```json
/// {"apiVersion": "hami-core-gpu.project-hami.io/v1alpha1", "kind": "HamiCoreConfig",
///  "taskPriority": 0, "coreUtilizationPolicy": "force"}
/// ```
///
/// The node driver reads it back with [`HamiCoreConfig::from_parameters`] and puts
/// [`HamiCoreConfig::env`] into the CDI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HamiCoreConfig {
    /// `CUDA_TASK_PRIORITY` (HAMi's `nvidia.com/priority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_priority: Option<i64>,
    /// `GPU_CORE_UTILIZATION_POLICY` (HAMi's `gpuCorePolicy`).
    #[serde(default, skip_serializing_if = "is_default_policy")]
    pub core_utilization_policy: CorePolicy,
}

fn is_default_policy(p: &CorePolicy) -> bool {
    *p == CorePolicy::Default
}

/// Opaque parameters that are not a [`HamiCoreConfig`] this version understands.
#[derive(Debug, thiserror::Error)]
pub enum HamiCoreConfigError {
    /// `apiVersion`/`kind` name another type.
    #[error("opaque configuration is {api_version}/{kind}, not {CONFIG_API_VERSION}/{CONFIG_KIND}")]
    OtherType {
        /// The `apiVersion` found.
        api_version: String,
        /// The `kind` found.
        kind: String,
    },
    /// The fields do not parse.
    #[error("opaque configuration {CONFIG_KIND} is invalid: {0}")]
    Invalid(#[source] serde_json::Error),
}

impl HamiCoreConfig {
    /// Whether there is nothing to pass (no configuration entry is added then).
    pub fn is_empty(&self) -> bool {
        self.task_priority.is_none() && self.core_utilization_policy == CorePolicy::Default
    }

    /// The parameters object, with `apiVersion` and `kind`.
    pub fn to_parameters(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_else(|_| serde_json::json!({}));
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".into(), CONFIG_API_VERSION.into());
            map.insert("kind".into(), CONFIG_KIND.into());
        }
        value
    }

    /// Reads parameters written by [`Self::to_parameters`].
    ///
    /// # Errors
    /// [`HamiCoreConfigError`] when they name another type or do not parse.
    pub fn from_parameters(parameters: &serde_json::Value) -> Result<Self, HamiCoreConfigError> {
        let field = |k: &str| parameters.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        if api_version != CONFIG_API_VERSION || kind != CONFIG_KIND {
            return Err(HamiCoreConfigError::OtherType { api_version, kind });
        }
        let mut rest = parameters.clone();
        if let Some(map) = rest.as_object_mut() {
            map.remove("apiVersion");
            map.remove("kind");
        }
        serde_json::from_value(rest).map_err(HamiCoreConfigError::Invalid)
    }

    /// The environment HAMi-core reads for these settings, in a fixed order.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(p) = self.task_priority {
            env.push(("CUDA_TASK_PRIORITY", p.to_string()));
        }
        if let Some(policy) = self.core_utilization_policy.env_value() {
            env.push(("GPU_CORE_UTILIZATION_POLICY", policy.to_owned()));
        }
        env
    }
}

/// The claim spec for `request` with the pod's `selection`: one request named [`REQUEST_NAME`]
/// on the configured class; `distinctAttribute` on the card uuid when it asks for more than one
/// card; a percentage as a prioritized list over the class's card models, and for several cards
/// over several models one such request per card (`gpu-0`, `gpu-1`, ...), so each card may be of
/// another model.
///
/// # Errors
/// For a percentage: [`CompatError::NoCardModel`] when no model is known or selectable,
/// [`CompatError::TooManyCardModels`] past [`MAX_SUBREQUESTS`].
pub fn claim_spec(
    container: &str,
    request: &CardRequest,
    selection: &Selection,
    settings: &CompatSettings,
    facts: &ClassFacts,
) -> Result<ResourceClaimTemplateSpec, CompatError> {
    let base_selectors = selection.selectors(&settings.driver);
    let device_requests = match request.memory {
        MemoryRequest::WholeCard | MemoryRequest::Bytes(_) => vec![DeviceRequest {
            name: REQUEST_NAME.into(),
            exactly: Some(ExactDeviceRequest {
                allocation_mode: Some("ExactCount".into()),
                count: Some(i64::from(request.count)),
                device_class_name: settings.device_class.clone(),
                capacity: capacity(
                    request.cores,
                    match request.memory {
                        MemoryRequest::Bytes(b) => Some(b),
                        _ => None,
                    },
                ),
                selectors: selectors(&base_selectors),
                ..Default::default()
            }),
            ..Default::default()
        }],
        MemoryRequest::Percent(percent) => {
            let models = percent_models(container, settings, facts, selection)?;
            percent_requests(request, percent, &models, &base_selectors, settings)
        }
    };
    let names: Vec<String> = device_requests.iter().map(|r| r.name.clone()).collect();
    let constraints = (request.count > 1).then(|| {
        vec![DeviceConstraint {
            distinct_attribute: Some(format!("{}/uuid", settings.driver)),
            requests: Some(names.clone()),
            ..Default::default()
        }]
    });
    let core = HamiCoreConfig { task_priority: request.priority, core_utilization_policy: settings.core_policy };
    let config = (!core.is_empty()).then(|| {
        vec![DeviceClaimConfiguration {
            opaque: Some(OpaqueDeviceConfiguration {
                driver: settings.driver.clone(),
                parameters: RawExtension(core.to_parameters()),
            }),
            requests: Some(names.clone()),
        }]
    });
    Ok(ResourceClaimTemplateSpec {
        metadata: None,
        spec: ResourceClaimSpec { devices: Some(DeviceClaim { config, constraints, requests: Some(device_requests) }) },
    })
}

/// The capacity a card's share asks for: `memory` bytes when given (none: the device's policy
/// default, the whole card), and `cores`.
///
/// HAMi's fit rules follow from the device's `cores` policy ([`crate::device::MIN_CORES`]):
/// - cores 100 asks for no `cores` amount, so it takes the policy default, every core of the
///   card (under `deviceCoreScaling` too): it lands only on a card no one holds, and no later
///   share fits beside it, since every share takes at least the minimum;
/// - cores 0 asks for 0, which the scheduler raises to the minimum: it does not fit a card
///   whose cores are all held, and it is still no SM limit.
fn capacity(cores: u32, memory: Option<u64>) -> Option<CapacityRequirements> {
    let mut requests = BTreeMap::new();
    if cores < 100 {
        requests.insert(CAPACITY_CORES.to_owned(), KubeQuantity(cores.to_string()));
    }
    if let Some(bytes) = memory {
        // Plain bytes: the API server keeps `4294967296` as HAMi-DRA's claims show it.
        requests.insert(CAPACITY_MEMORY.to_owned(), KubeQuantity(bytes.to_string()));
    }
    (!requests.is_empty()).then_some(CapacityRequirements { requests: Some(requests) })
}

/// The requests for `percent` of each card's memory: a prioritized list over `models`, one
/// subrequest per model with that model's share in bytes.
fn percent_requests(
    request: &CardRequest,
    percent: u32,
    models: &[CardModel],
    base_selectors: &[String],
    settings: &CompatSettings,
) -> Vec<DeviceRequest> {
    let options = |count: u32| -> Vec<DeviceSubRequest> {
        models
            .iter()
            .enumerate()
            .map(|(i, model)| {
                let mut sel = vec![model_selector(&settings.driver, model)];
                sel.extend(base_selectors.iter().cloned());
                let mib = (model.memory_bytes / MIB).saturating_mul(u64::from(percent)) / 100;
                DeviceSubRequest {
                    name: subrequest_name(i, &model.product_name),
                    allocation_mode: Some("ExactCount".into()),
                    count: Some(i64::from(count)),
                    device_class_name: settings.device_class.clone(),
                    capacity: capacity(request.cores, Some(mib.max(1).saturating_mul(MIB))),
                    selectors: selectors(&sel),
                    ..Default::default()
                }
            })
            .collect()
    };
    if request.count > 1 && models.len() > 1 {
        // HAMi takes each card's share of that card's own memory, so N cards may be of different
        // models: one request per card, each choosing its model, kept apart by the distinct
        // constraint. One request of N over a list of models would need all N of one model.
        (0..request.count)
            .map(|i| DeviceRequest {
                name: format!("{REQUEST_NAME}-{i}"),
                first_available: Some(options(1)),
                ..Default::default()
            })
            .collect()
    } else {
        vec![DeviceRequest { name: REQUEST_NAME.into(), first_available: Some(options(request.count)), ..Default::default() }]
    }
}

/// `hami-vgpu-<16 hex>`: the first 64 bits of the SHA-256 of the spec's JSON. The JSON of a
/// k8s-openapi struct has a fixed field order and sorted maps, so equal specs get equal names in
/// every process and release of this crate.
pub fn template_name(spec: &ResourceClaimTemplateSpec) -> String {
    let json = serde_json::to_vec(spec).unwrap_or_default();
    let digest = Sha256::digest(&json);
    let mut name = String::from(TEMPLATE_PREFIX);
    for byte in &digest[..8] {
        let _ = write!(name, "{byte:02x}");
    }
    name
}

/// The class's models that the pod's type annotations allow, checked against the list limit.
fn percent_models(
    container: &str,
    settings: &CompatSettings,
    facts: &ClassFacts,
    selection: &Selection,
) -> Result<Vec<CardModel>, CompatError> {
    let resource = || settings.memory_percentage_resource.clone();
    if facts.models.is_empty() {
        return Err(CompatError::NoCardModel {
            container: container.into(),
            resource: resource(),
            reason: "is published yet nor named by the webhook's --card-model",
        });
    }
    let models: Vec<CardModel> = facts.models.iter().filter(|m| selection.allows_model(&m.product_name)).cloned().collect();
    if models.is_empty() {
        return Err(CompatError::NoCardModel {
            container: container.into(),
            resource: resource(),
            reason: "matches the pod's GPU type annotations",
        });
    }
    if models.len() > MAX_SUBREQUESTS {
        return Err(CompatError::TooManyCardModels {
            container: container.into(),
            resource: resource(),
            models: models.len(),
            max: MAX_SUBREQUESTS,
        });
    }
    Ok(models)
}

/// Selects exactly one card model: its product name and its published memory, so the
/// percentage is taken of the very card that matches.
fn model_selector(driver: &str, model: &CardModel) -> String {
    let domain = cel_string(driver);
    format!(
        "device.attributes[{domain}].productName == {} && device.capacity[{domain}].{CAPACITY_MEMORY}.compareTo(quantity({})) == 0",
        cel_string(&model.product_name),
        cel_string(&model.memory_bytes.to_string())
    )
}

/// A DNS label naming the model: `<i>-<slug>`, the index keeping names unique and in order.
fn subrequest_name(index: usize, product_name: &str) -> String {
    let mut slug = String::new();
    for c in product_name.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let mut name = format!("card{index}-{}", slug.trim_matches('-'));
    name.truncate(63);
    name.trim_end_matches('-').to_owned()
}

fn selectors(expressions: &[String]) -> Option<Vec<DeviceSelector>> {
    (!expressions.is_empty())
        .then(|| expressions.iter().map(|e| DeviceSelector { cel: Some(CELDeviceSelector { expression: e.clone() }) }).collect())
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod tests;
