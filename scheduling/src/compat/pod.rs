//! Whole pods (and Volcano task templates): every container and init container with HAMi
//! resources gets a claim from a shared template, as a mutated spec and as the JSON patch that
//! makes it, plus the webhook's `matchConditions` expression.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceClaimTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::claim::{TEMPLATE_PREFIX, claim_spec, template_name};
use super::container::own_resources;
use super::container::{Ask, CardRequest, container_ask};
use super::error::CompatError;
use super::mig::{VgpuMode, either_claim_spec, instances_claim_spec, mig_claim_spec, vgpu_mode};
use super::selectors::cel_list;
use super::selectors::{Selection, annotation_warnings, cel_string};
use super::settings::{ClassFacts, CompatSettings};
use super::volcano::{Claimed, Kept, keep_requesting};

/// Prefix of the pod's resource claim entries this conversion adds (`vgpu-<container>`).
pub const CLAIM_ENTRY_PREFIX: &str = "vgpu-";

/// Label on the templates this conversion makes.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "vgpu-dra");

/// A converted pod spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecConversion {
    /// The spec after conversion (equal to the input when nothing was converted).
    pub spec: PodSpec,
    /// Templates the spec references, one per distinct request shape, sorted by name; the
    /// webhook creates those that do not exist yet (same name = same content).
    pub templates: Vec<ResourceClaimTemplate>,
    /// RFC 6902 operations turning the input into `spec`, paths under the given prefix; empty
    /// when nothing changes.
    pub patch: Vec<Value>,
    /// Admission warnings.
    pub warnings: Vec<String>,
}

/// A converted pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodConversion {
    /// The pod after conversion.
    pub pod: Pod,
    /// Templates to create, as in [`SpecConversion::templates`].
    pub templates: Vec<ResourceClaimTemplate>,
    /// RFC 6902 operations on the pod; empty when it is left alone.
    pub patch: Vec<Value>,
    /// Admission warnings.
    pub warnings: Vec<String>,
}

impl PodConversion {
    /// Whether the pod changes.
    pub fn changed(&self) -> bool {
        !self.patch.is_empty()
    }
}

/// Converts a pod; a pod without HAMi resources, or converted before, is returned unchanged.
///
/// # Errors
/// [`CompatError`] for the first container (init containers first) whose resources are denied;
/// nothing is converted then.
pub fn convert_pod(pod: &Pod, settings: &CompatSettings, facts: &ClassFacts) -> Result<PodConversion, CompatError> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let c = convert_pod_spec(&annotations, &spec, spec.scheduler_name.as_deref(), "/spec", settings, facts)?;
    let mut out = pod.clone();
    if !c.patch.is_empty() {
        out.spec = Some(c.spec);
    }
    Ok(PodConversion { pod: out, templates: c.templates, patch: c.patch, warnings: c.warnings })
}

/// What decides the claim of a container's cards: the pod's mode and selection, the settings.
struct ClaimKind<'a> {
    mode: VgpuMode,
    selection: &'a Selection,
    settings: &'a CompatSettings,
    facts: &'a ClassFacts,
}

impl ClaimKind<'_> {
    /// The claim of `request`, the cards `container` asks: MIG instances in `mig` mode (with
    /// warnings for what does not apply there), a share or an instance by fit without the
    /// annotation under [`CompatSettings::unannotated_mig`], else shares.
    fn cards(
        &self,
        container: &Container,
        request: &CardRequest,
        warnings: &mut Vec<String>,
    ) -> Result<ResourceClaimTemplateSpec, CompatError> {
        let (name, memory, selection, settings, facts) =
            (&container.name, &self.settings.memory_resource, self.selection, self.settings, self.facts);
        match self.mode {
            VgpuMode::Mig => {
                warnings.extend(mig_mode_warnings(container, settings));
                mig_claim_spec(name, memory, request, selection, settings)
            }
            VgpuMode::Unset if settings.unannotated_mig => either_claim_spec(name, memory, request, selection, settings, facts),
            VgpuMode::HamiCore | VgpuMode::Unset => claim_spec(name, request, selection, settings, facts),
        }
    }
}

/// Converts a pod spec whose pod carries `annotations` and is scheduled by `scheduler` (a Pod's
/// `schedulerName`; for a Volcano Job's task, [`super::VolcanoSettings::job_pod_scheduler`]);
/// `path` is the JSON pointer of the spec in the admitted object (`/spec` for a Pod,
/// `/spec/tasks/<i>/template/spec` for a Volcano Job). A converted spec of Volcano's scheduler
/// that requests nothing else gets a cpu request ([`super::VolcanoSettings`]).
///
/// # Errors
/// As [`convert_pod`].
pub fn convert_pod_spec(
    annotations: &BTreeMap<String, String>,
    spec: &PodSpec,
    scheduler: Option<&str>,
    path: &str,
    settings: &CompatSettings,
    facts: &ClassFacts,
) -> Result<SpecConversion, CompatError> {
    let selection = Selection::from_annotations(annotations);
    // A bad mode is refused only for a pod that asks for cards: others never reach the webhook.
    let mode = vgpu_mode(annotations);
    let mut out = spec.clone();
    let mut warnings = Vec::new();
    let mut templates = BTreeMap::new();
    let mut removals = Vec::new();
    let mut additions = Vec::new();
    let mut entries = Vec::new();
    let mut claimed = Claimed::default();
    let existing: Vec<PodResourceClaim> = spec.resource_claims.clone().unwrap_or_default();
    // Containers are visited init first, as the kubelet starts them; each list is mutated in
    // place in `out` and patched at its own index.
    let mut init = out.init_containers.take().unwrap_or_default();
    let had_init = spec.init_containers.is_some();
    for (field, list) in [("initContainers", &mut init), ("containers", &mut out.containers)] {
        for (index, container) in list.iter_mut().enumerate() {
            let ask = container_ask(container, settings, facts, &mut warnings)?;
            if ask == Ask::Nothing {
                continue;
            }
            let at = format!("{path}/{field}/{index}");
            let entry = claim_entry_name(&container.name);
            check_entry(container, &entry, &existing, settings)?;
            let spec = match &ask {
                Ask::Cards(request) => {
                    let kind = ClaimKind { mode: mode.clone()?, selection: &selection, settings, facts };
                    Some(kind.cards(container, request, &mut warnings)?)
                }
                Ask::Instances(instances) => Some(instances_claim_spec(instances, &selection, settings)),
                Ask::Nothing | Ask::NoDevice => None,
            };
            let removed = strip(container, settings);
            removals.extend(removed.iter().map(|p| json!({"op": "remove", "path": format!("{at}/resources/{p}")})));
            let Some(spec) = spec else { continue };
            let name = template_name(&spec);
            templates.entry(name.clone()).or_insert_with(|| template(&name, spec));
            additions.push(use_claim(container, &at, ContainerClaim { name: entry.clone(), request: None }));
            entries.push(PodResourceClaim { name: entry, resource_claim_template_name: Some(name), ..Default::default() });
            if field == "containers" { &mut claimed.containers } else { &mut claimed.init }.push(index);
        }
    }
    out.init_containers = (had_init || !init.is_empty()).then_some(init);
    additions.extend(add_entries(&mut out, path, entries));
    match keep_requesting(&mut out, &claimed, scheduler, &settings.volcano, path) {
        Kept::Untouched => {}
        Kept::Added(op) => additions.push(op),
        Kept::NoRoom(warning) => warnings.push(warning),
    }
    let mut patch = removals;
    patch.extend(additions);
    if !patch.is_empty() {
        // Annotation warnings only for pods that are converted: others never reach the webhook.
        warnings.splice(0..0, annotation_warnings(annotations));
    }
    Ok(SpecConversion { spec: out, templates: templates.into_values().collect(), patch, warnings })
}

/// Makes `container` (at JSON pointer `at`) use `claim`; the patch operation that does the same.
fn use_claim(container: &mut Container, at: &str, claim: ContainerClaim) -> Value {
    let resources = container.resources.get_or_insert_with(Default::default);
    match resources.claims.as_mut() {
        Some(claims) => {
            let op = json!({"op": "add", "path": format!("{at}/resources/claims/-"), "value": claim});
            claims.push(claim);
            op
        }
        None => {
            let op = json!({"op": "add", "path": format!("{at}/resources/claims"), "value": [claim]});
            resources.claims = Some(vec![claim]);
            op
        }
    }
}

/// Adds `entries` to the spec's resource claims (the spec at JSON pointer `path`); the patch
/// operations that do the same.
fn add_entries(out: &mut PodSpec, path: &str, entries: Vec<PodResourceClaim>) -> Vec<Value> {
    if entries.is_empty() {
        return Vec::new();
    }
    match out.resource_claims.as_mut() {
        Some(list) => {
            let ops =
                entries.iter().map(|e| json!({"op": "add", "path": format!("{path}/resourceClaims/-"), "value": e})).collect();
            list.extend(entries);
            ops
        }
        None => {
            let op = json!({"op": "add", "path": format!("{path}/resourceClaims"), "value": entries});
            out.resource_claims = Some(entries);
            vec![op]
        }
    }
}

/// What a `mig`-mode container asks that a MIG instance does not apply: a cores limit (the
/// instance's compute slices are the container's alone) and a priority (HAMi-core, which acts on
/// both, is not loaded in an instance).
fn mig_mode_warnings(container: &Container, settings: &CompatSettings) -> Vec<String> {
    let named: Vec<&str> = own_resources(container, settings).collect();
    let mut out = Vec::new();
    if named.contains(&settings.cores_resource.as_str()) {
        out.push(format!(
            "container {:?}: {} does not apply in MIG mode: a MIG instance's compute slices are the container's alone",
            container.name, settings.cores_resource
        ));
    }
    if let Some(priority) = settings.priority_resource.as_deref().filter(|p| named.contains(p)) {
        out.push(format!(
            "container {:?}: {priority} does not apply in MIG mode: HAMi-core is not loaded in a MIG instance",
            container.name
        ));
    }
    out
}

/// The pod's resource claim entry for a container: `vgpu-<container>`, or for container names
/// too long for a DNS label a truncated name with a hash of the full one.
pub fn claim_entry_name(container: &str) -> String {
    let name = format!("{CLAIM_ENTRY_PREFIX}{container}");
    if name.len() <= 63 {
        return name;
    }
    let digest = Sha256::digest(container.as_bytes());
    let mut short: String = name.chars().take(54).collect();
    short.push('-');
    for byte in &digest[..4] {
        let _ = write!(short, "{byte:02x}");
    }
    short
}

/// The `matchConditions` expression for Pods: true when any container or init container has one
/// of `settings`' resources (or a MIG resource, `nvidia.com/mig-<profile>`) in its limits or requests.
pub fn pod_match_condition(settings: &CompatSettings) -> String {
    format!("has(object.spec) && {}", spec_condition("object.spec", settings))
}

/// The `matchConditions` expression for Volcano Jobs (`batch.volcano.sh/v1alpha1`): true when
/// any task's pod template needs conversion.
pub fn job_match_condition(settings: &CompatSettings) -> String {
    format!(
        "has(object.spec) && has(object.spec.tasks) && object.spec.tasks.exists(t, has(t.template) && has(t.template.spec) && {})",
        spec_condition("t.template.spec", settings)
    )
}

fn spec_condition(spec: &str, settings: &CompatSettings) -> String {
    let names: Vec<String> = settings.resource_names().into_iter().map(str::to_owned).collect();
    let key = format!("k in {}", cel_list(&names));
    let key = if settings.mig_resource_prefix.is_empty() {
        key
    } else {
        format!("{key} || k.startsWith({})", cel_string(&settings.mig_resource_prefix))
    };
    let list = |field: &str| format!("(has({spec}.{field}) ? {spec}.{field} : [])");
    format!(
        "({} + {}).exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, {key})) || (has(c.resources.requests) && c.resources.requests.exists(k, {key}))))",
        list("initContainers"),
        list("containers")
    )
}

/// Denies a container that already references our claim (a converted container asking again)
/// and an entry name some other claim already uses.
fn check_entry(
    container: &Container,
    entry: &str,
    existing: &[PodResourceClaim],
    settings: &CompatSettings,
) -> Result<(), CompatError> {
    let Some(taken) = existing.iter().find(|c| c.name == entry) else { return Ok(()) };
    if taken.resource_claim_template_name.as_deref().is_some_and(|t| t.starts_with(TEMPLATE_PREFIX)) {
        let resource = own_resources(container, settings).next().unwrap_or_default().to_owned();
        return Err(CompatError::AlreadyConverted { container: container.name.clone(), resource });
    }
    Err(CompatError::ClaimNameTaken { container: container.name.clone(), name: entry.into() })
}

/// Removes the flavour's resources from limits and requests; returns what was removed as JSON
/// pointer tails: each key (`limits/nvidia.com~1gpu`), or the whole map (`limits`) when nothing
/// else was in it, so that no empty `limits: {}` is left in the stored pod.
fn strip(container: &mut Container, settings: &CompatSettings) -> Vec<String> {
    let keys: Vec<String> = own_resources(container, settings).map(str::to_owned).collect();
    let Some(resources) = container.resources.as_mut() else { return Vec::new() };
    let mut removed = Vec::new();
    for (field, map) in [("limits", &mut resources.limits), ("requests", &mut resources.requests)] {
        let Some(entries) = map.as_mut() else { continue };
        let gone: Vec<&String> = keys.iter().filter(|key| entries.remove(*key).is_some()).collect();
        if gone.is_empty() {
            continue;
        }
        if entries.is_empty() {
            *map = None;
            removed.push(field.to_owned());
        } else {
            removed.extend(gone.iter().map(|key| format!("{field}/{}", pointer_escape(key))));
        }
    }
    removed
}

/// RFC 6901: `~` and `/` in a key.
fn pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn template(name: &str, spec: k8s_openapi::api::resource::v1::ResourceClaimTemplateSpec) -> ResourceClaimTemplate {
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.into(), MANAGED_BY.1.into())])),
            ..Default::default()
        },
        spec,
    }
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
