//! MIG instances for pods written for HAMi or Volcano, as claims on the driver's dynamic-MIG
//! devices (one device per profile and placement, `type: hami-mig`, see `driver/src/mig`):
//!
//! - the pod annotation `nvidia.com/vgpu-mode` (Volcano's `volcano.sh/vgpu-mode`) chooses the
//!   kind of device: `mig` asks MIG instances for the container's `nvidia.com/gpu` and
//!   `gpumem`, `hami-core` shares of whole cards (what a pod without it gets too);
//! - `nvidia.com/mig-<profile>: N`, the resource of NVIDIA's device plugin (mixed strategy) that
//!   HAMi and volcano-vgpu-device-plugin leave to it, asks N instances of that profile.
//!
//! A memory asked in `mig` mode becomes a prioritized list of GPU-instance profiles, smallest
//! first, each subrequest also requiring the device's memory to cover the ask: the profiles'
//! memory differs between card models (1g.10gb, 1g.18gb, 1g.5gb are all profile 19), and one
//! claim may land on any of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceConstraint, DeviceRequest, DeviceSelector, DeviceSubRequest, ExactDeviceRequest,
    ResourceClaimSpec, ResourceClaimTemplateSpec,
};

use super::claim::{REQUEST_NAME, claim_spec};
use super::container::{CardRequest, MemoryRequest};
use super::error::CompatError;
use super::mig_names::{MIG_DEVICE_TYPE, MigInstances};
use super::selectors::{Selection, cel_string};
use super::settings::CompatSettings;
use crate::device::CAPACITY_MEMORY;
use crate::mig::{MigProfile, models};

/// HAMi's annotation choosing the kind of device a pod's cards are: `hami-core` or `mig`.
pub const ANNOTATION_VGPU_MODE: &str = "nvidia.com/vgpu-mode";
/// volcano-vgpu-device-plugin's name for the same annotation.
pub const ANNOTATION_VOLCANO_VGPU_MODE: &str = "volcano.sh/vgpu-mode";
/// The mode value asking shares of whole cards under HAMi-core's limits.
pub const MODE_HAMI_CORE: &str = "hami-core";
/// The mode value asking MIG instances.
pub const MODE_MIG: &str = "mig";
/// The attribute naming a MIG device's card, in place of the card's `uuid`.
const PARENT_UUID: &str = "parentUUID";

const MIB: u64 = 1 << 20;

/// The kind of device a pod's `nvidia.com/gpu` cards are, from its `vgpu-mode` annotation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VgpuMode {
    /// No annotation. HAMi then takes a share or a MIG instance, whichever node fits; here the
    /// request asks shares of whole cards only (see docs/compatibility.md, "MIG").
    #[default]
    Unset,
    /// `hami-core`: shares of whole cards under HAMi-core's limits.
    HamiCore,
    /// `mig`: MIG instances, the smallest profile that holds the memory asked.
    Mig,
}

/// The mode `annotations` ask: HAMi's annotation, Volcano's, or both when they agree. Values are
/// taken as written (HAMi compares them case-sensitively), surrounding blanks aside.
///
/// # Errors
/// [`CompatError::VgpuMode`] naming the annotation for a value other than `hami-core` or `mig`
/// (HAMi's `mps` included: vgpu-dra serves no MPS); [`CompatError::VgpuModeConflict`] when the
/// two annotations ask different modes.
pub fn vgpu_mode(annotations: &BTreeMap<String, String>) -> Result<VgpuMode, CompatError> {
    let mut found: Option<(&str, &str, VgpuMode)> = None;
    for key in [ANNOTATION_VGPU_MODE, ANNOTATION_VOLCANO_VGPU_MODE] {
        let Some(raw) = annotations.get(key) else { continue };
        let mode = match raw.trim() {
            MODE_HAMI_CORE => VgpuMode::HamiCore,
            MODE_MIG => VgpuMode::Mig,
            _ => return Err(CompatError::VgpuMode { annotation: key.into(), value: raw.clone() }),
        };
        match found {
            Some((first, first_value, other)) if other != mode => {
                return Err(CompatError::VgpuModeConflict {
                    first: first.into(),
                    first_value: first_value.into(),
                    second: key.into(),
                    second_value: raw.clone(),
                });
            }
            _ => found = Some((key, raw.as_str(), mode)),
        }
    }
    Ok(found.map_or(VgpuMode::Unset, |(_, _, mode)| mode))
}

/// The GPU-instance profile ids a `mig`-mode request lists, smallest first: fewest memory
/// slices, then fewest compute slices. Every catalogued model shares this geometry, so the order
/// is the same on all of them; by memory first because memory is what the pod asked, so 1g.20gb
/// (one compute slice, two memory slices) comes before 2g.20gb, which holds the same memory and
/// a second compute slice the pod did not ask for. `+me` profiles are left out: they hold the
/// card's only media extensions, which a memory request does not ask for.
///
/// With `at_least` bytes, only profiles that hold that much on some catalogued model; the
/// subrequest's memory selector then keeps each to the models where they do.
fn profile_ids(at_least: Option<u64>) -> Vec<u32> {
    let mut ids: Vec<(u8, u8, u32)> = Vec::new();
    for profile in models().iter().flat_map(|m| m.profiles()).filter(|p| !p.media_extension()) {
        let holds = at_least.is_none_or(|bytes| profile.memory_mib().saturating_mul(MIB) >= bytes);
        let key = (profile.memory_slices(), profile.compute_slices(), profile.id());
        if holds && !ids.contains(&key) {
            ids.push(key);
        }
    }
    ids.sort_unstable();
    ids.into_iter().map(|(_, _, id)| id).collect()
}

/// The largest instance memory of the catalogue, in bytes.
fn largest_instance_bytes() -> u64 {
    models().iter().flat_map(|m| m.profiles()).map(MigProfile::memory_mib).max().unwrap_or(0).saturating_mul(MIB)
}

/// The claim of a `mig`-mode container: one request `gpu` of `request.count` instances, a
/// `firstAvailable` list over [`profile_ids`] on the MIG class. A memory asks each subrequest
/// for a device of at least that memory; a percentage or no memory takes the smallest profile
/// free (a MIG device's memory is its profile's, not a share of the card). Several instances
/// are on distinct cards (`parentUUID`), as HAMi gives each of a container's N on its own
/// card. The pod's type and UUID annotations select on the card's `productName` and on
/// `parentUUID`. No HAMi-core configuration: HAMi-core is not loaded in a MIG instance.
///
/// # Errors
/// [`CompatError::MigMemoryTooLarge`] naming `container` and `resource` (the memory resource)
/// when no catalogued profile holds the memory.
pub fn mig_claim_spec(
    container: &str,
    resource: &str,
    request: &CardRequest,
    selection: &Selection,
    settings: &CompatSettings,
) -> Result<ResourceClaimTemplateSpec, CompatError> {
    let at_least = match request.memory {
        MemoryRequest::Bytes(bytes) => Some(bytes),
        MemoryRequest::WholeCard | MemoryRequest::Percent(_) => None,
    };
    let ids = profile_ids(at_least);
    if ids.is_empty() {
        return Err(CompatError::MigMemoryTooLarge {
            container: container.into(),
            resource: resource.into(),
            bytes: at_least.unwrap_or_default(),
            largest: largest_instance_bytes(),
        });
    }
    let driver = &settings.driver;
    let card_selectors = selection.selectors_on(driver, PARENT_UUID);
    let subrequests = ids
        .iter()
        .map(|id| {
            let mut cel = vec![profile_id_selector(driver, *id, at_least)];
            cel.extend(card_selectors.iter().cloned());
            DeviceSubRequest {
                name: format!("mig-profile-{id}"),
                allocation_mode: Some("ExactCount".into()),
                count: Some(i64::from(request.count)),
                device_class_name: settings.mig_device_class.clone(),
                selectors: selectors(&cel),
                ..Default::default()
            }
        })
        .collect();
    let constraints = (request.count > 1).then(|| {
        vec![DeviceConstraint {
            distinct_attribute: Some(format!("{driver}/{PARENT_UUID}")),
            requests: Some(vec![REQUEST_NAME.into()]),
            ..Default::default()
        }]
    });
    let requests = vec![DeviceRequest { name: REQUEST_NAME.into(), first_available: Some(subrequests), ..Default::default() }];
    Ok(template_spec(DeviceClaim { config: None, constraints, requests: Some(requests) }))
}

/// The claim of a container without `vgpu-mode` under [`CompatSettings::unannotated_mig`]: one
/// request `gpu` whose `firstAvailable` list is the share [`claim_spec`] asks (subrequest
/// `share`), then the MIG profiles [`mig_claim_spec`] lists. The scheduler takes the first that
/// fits on the node it tries: a share while one fits there (a card in MIG use has its counters
/// taken, so it offers none), else the smallest free instance that holds the memory. The
/// HAMi-core configuration (priority, core policy) stays on the request; it is HAMi-core's
/// inside an instance too, which runs with no SM limit there.
///
/// Only one card with a memory amount: a percentage is of whichever card, which an instance is
/// not; several cards are kept distinct by the card `uuid`, which MIG devices do not carry. Both
/// ask shares only, as does memory no instance holds.
///
/// # Errors
/// Those of [`claim_spec`].
pub fn either_claim_spec(
    container: &str,
    resource: &str,
    request: &CardRequest,
    selection: &Selection,
    settings: &CompatSettings,
    facts: &super::settings::ClassFacts,
) -> Result<ResourceClaimTemplateSpec, CompatError> {
    let mut shares = claim_spec(container, request, selection, settings, facts)?;
    if request.count != 1 || !matches!(request.memory, MemoryRequest::Bytes(_)) {
        return Ok(shares);
    }
    let Ok(mig) = mig_claim_spec(container, resource, request, selection, settings) else { return Ok(shares) };
    let mig_options = mig.spec.devices.and_then(|d| d.requests).and_then(|mut r| r.pop()).and_then(|r| r.first_available);
    let Some(devices) = shares.spec.devices.as_mut() else { return Ok(shares) };
    let Some(only) = devices.requests.as_mut().and_then(|r| r.first_mut()) else { return Ok(shares) };
    let (Some(exact), Some(mig_options)) = (only.exactly.take(), mig_options) else { return Ok(shares) };
    let share = DeviceSubRequest {
        name: "share".into(),
        device_class_name: exact.device_class_name,
        selectors: exact.selectors,
        allocation_mode: exact.allocation_mode,
        count: exact.count,
        tolerations: exact.tolerations,
        capacity: exact.capacity,
    };
    only.first_available = Some(std::iter::once(share).chain(mig_options).collect());
    Ok(shares)
}

/// The claim of a container's `nvidia.com/mig-<profile>` resources: one request of each
/// resource's count on the MIG class, selecting its profile by name (`mig-<profile>`, with
/// an index when two resources name the same profile). Instances may share a card, as NVIDIA's
/// device plugin hands them out. The pod's type and UUID annotations apply as in
/// [`mig_claim_spec`].
pub fn instances_claim_spec(
    instances: &[MigInstances],
    selection: &Selection,
    settings: &CompatSettings,
) -> ResourceClaimTemplateSpec {
    let driver = &settings.driver;
    let card_selectors = selection.selectors_on(driver, PARENT_UUID);
    let mut requests: Vec<DeviceRequest> = Vec::new();
    for (i, wanted) in instances.iter().enumerate() {
        let dns = wanted.profiles.first().map_or_else(String::new, |p| p.replace(['.', '+'], "-"));
        let mut name = format!("mig-{dns}");
        if requests.iter().any(|r| r.name == name) {
            name = format!("{name}-{i}");
        }
        let mut cel = vec![profile_name_selector(driver, &wanted.profiles)];
        cel.extend(card_selectors.iter().cloned());
        requests.push(DeviceRequest {
            name,
            exactly: Some(ExactDeviceRequest {
                allocation_mode: Some("ExactCount".into()),
                count: Some(i64::from(wanted.count)),
                device_class_name: settings.mig_device_class.clone(),
                selectors: selectors(&cel),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    template_spec(DeviceClaim { config: None, constraints: None, requests: Some(requests) })
}

/// A MIG device of GPU-instance profile `id`, of at least `at_least` bytes when given.
fn profile_id_selector(driver: &str, id: u32, at_least: Option<u64>) -> String {
    let domain = cel_string(driver);
    let mut cel = format!(
        "device.attributes[{domain}].type == {} && device.attributes[{domain}].migProfileId == {id}",
        cel_string(MIG_DEVICE_TYPE)
    );
    if let Some(bytes) = at_least {
        let amount = if bytes % MIB == 0 { format!("{}Mi", bytes / MIB) } else { bytes.to_string() };
        let _ = write!(cel, " && device.capacity[{domain}].{CAPACITY_MEMORY}.compareTo(quantity({})) >= 0", cel_string(&amount));
    }
    cel
}

/// A MIG device of one of the profiles `names`.
fn profile_name_selector(driver: &str, names: &[&str]) -> String {
    let domain = cel_string(driver);
    let attr = format!("device.attributes[{domain}].profile");
    let profile = match names {
        [one] => format!("{attr} == {}", cel_string(one)),
        many => {
            let list: Vec<String> = many.iter().map(|n| cel_string(n)).collect();
            format!("{attr} in [{}]", list.join(", "))
        }
    };
    format!("device.attributes[{domain}].type == {} && {profile}", cel_string(MIG_DEVICE_TYPE))
}

fn selectors(expressions: &[String]) -> Option<Vec<DeviceSelector>> {
    (!expressions.is_empty())
        .then(|| expressions.iter().map(|e| DeviceSelector { cel: Some(CELDeviceSelector { expression: e.clone() }) }).collect())
}

fn template_spec(devices: DeviceClaim) -> ResourceClaimTemplateSpec {
    ResourceClaimTemplateSpec { metadata: None, spec: ResourceClaimSpec { devices: Some(devices) } }
}

#[cfg(test)]
#[path = "mig_tests.rs"]
mod tests;
