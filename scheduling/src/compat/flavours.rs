//! The sets of resource names converted (HAMi's, Volcano's), each with its own defaults, and
//! which one an object is written in: the webhook and `vgpu-dra convert` convert each pod or
//! Volcano Job with the one set it uses.

use k8s_openapi::api::core::v1::Pod;

use super::mig_names::default_mig_device_class;
use super::settings::CompatSettings;
use super::volcano::VolcanoSettings;
use crate::config::DEFAULT_DRIVER_NAME;
use crate::device_config::{ConfigForm, DeviceConfig};

/// What the name sets share besides the device configuration: flags of the webhook and of
/// `vgpu-dra convert`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlavourOptions {
    /// The driver name, over the configuration's; the default driver when neither names one.
    pub driver: Option<String>,
    /// The DeviceClass of converted requests; the driver name when absent.
    pub device_class: Option<String>,
    /// The DeviceClass of converted MIG requests; [`default_mig_device_class`] of the class
    /// when absent.
    pub mig_device_class: Option<String>,
    /// How converted pods of Volcano's scheduler keep a request Volcano counts.
    pub volcano: VolcanoSettings,
    /// [`CompatSettings::strict_fit`].
    pub strict_fit: bool,
    /// [`CompatSettings::unannotated_mig`].
    pub unannotated_mig: bool,
}

/// HAMi's and Volcano's name sets, both converted in one install. `config`, when given, renames
/// and sets the defaults of the one set its form writes (HAMi's `device-config.yaml` HAMi's,
/// volcano-vgpu-device-plugin's the Volcano one); the other keeps its names and HAMi's
/// defaults. Sets that end up with the same names are one.
pub fn flavours(config: Option<&DeviceConfig>, options: &FlavourOptions) -> Vec<CompatSettings> {
    let (mut hami, mut volcano) = (CompatSettings::hami(), CompatSettings::volcano());
    if let Some(config) = config {
        match config.form {
            ConfigForm::Volcano => volcano = volcano.with_device_config(&config.compat),
            ConfigForm::Own | ConfigForm::Hami => hami = hami.with_device_config(&config.compat),
        }
    }
    let from_config = config.and_then(|c| c.driver_name.as_ref()).map(|d| d.as_str().to_owned());
    let driver = options.driver.clone().or(from_config).unwrap_or_else(|| DEFAULT_DRIVER_NAME.to_owned());
    let device_class = options.device_class.clone().unwrap_or_else(|| driver.clone());
    let mig_device_class = options.mig_device_class.clone().unwrap_or_else(|| default_mig_device_class(&device_class));
    let mut sets: Vec<CompatSettings> = Vec::new();
    for flavour in [hami, volcano] {
        let flavour = CompatSettings {
            driver: driver.clone(),
            mig_device_class: mig_device_class.clone(),
            device_class: device_class.clone(),
            volcano: options.volcano.clone(),
            strict_fit: options.strict_fit,
            unannotated_mig: options.unannotated_mig,
            ..flavour
        };
        if !sets.iter().any(|f| f.resource_names() == flavour.resource_names()) {
            sets.push(flavour);
        }
    }
    sets
}

/// The DeviceClasses `sets` convert into, each once: each set's class and its MIG class (what
/// the webhook charges to quotas, and `kubectl vgpu usage` counts).
pub fn device_classes(sets: &[CompatSettings]) -> Vec<String> {
    let mut classes: Vec<String> = Vec::new();
    for class in sets.iter().flat_map(|f| [&f.device_class, &f.mig_device_class]) {
        if !classes.contains(class) {
            classes.push(class.clone());
        }
    }
    classes
}

/// The flavour to convert an object naming `names` with: the one whose names it uses, or
/// whose MIG names it uses (both use NVIDIA's `nvidia.com/mig-<profile>`). `Ok(None)`: none of ours. A denial message when
/// it names resources of two flavours: one object is converted with one set of names.
pub fn pick<'a>(
    flavours: &'a [CompatSettings],
    kind: &str,
    names: &[(String, String)],
) -> Result<Option<&'a CompatSettings>, String> {
    let named = |f: &CompatSettings| names.iter().find(|(_, n)| f.resource_names().contains(&n.as_str())).cloned();
    let users: Vec<(&CompatSettings, (String, String))> =
        flavours.iter().filter_map(|f| named(f).map(|first| (f, first))).collect();
    match users.as_slice() {
        [] => Ok(flavours.iter().find(|f| names.iter().any(|(_, n)| f.is_mig(n)))),
        [(one, _)] => Ok(Some(one)),
        [(_, (c1, n1)), (_, (c2, n2)), ..] => Err(format!(
            "vgpu-dra webhook: the {kind} mixes two sets of GPU resource names: container {c1:?} asks for {n1} and container {c2:?} for {n2}; write all its GPU resources with one set (HAMi's nvidia.com/* or Volcano's volcano.sh/vgpu-*)"
        )),
    }
}

/// The resource names in the limits and requests of every task's pod template, each with its
/// container's name.
pub fn job_resource_names(job: &serde_json::Value) -> Vec<(String, String)> {
    let tasks = job.pointer("/spec/tasks").and_then(serde_json::Value::as_array);
    let containers = tasks.into_iter().flatten().filter_map(|t| t.pointer("/template/spec")).flat_map(|spec| {
        ["initContainers", "containers"]
            .into_iter()
            .filter_map(|field| spec.get(field).and_then(serde_json::Value::as_array))
            .flatten()
    });
    let mut names = Vec::new();
    for c in containers {
        let name = c.get("name").and_then(serde_json::Value::as_str).unwrap_or_default();
        let maps =
            c.get("resources").into_iter().flat_map(|r| ["limits", "requests"].into_iter().filter_map(|f| r.get(f)?.as_object()));
        names.extend(maps.flat_map(|m| m.keys()).map(|k| (name.to_owned(), k.clone())));
    }
    names
}

/// The resource names in the limits and requests of every container, each with its container's
/// name.
pub fn pod_resource_names(pod: &Pod) -> Vec<(String, String)> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let mut names = Vec::new();
    for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let maps = c.resources.iter().flat_map(|r| [&r.limits, &r.requests].into_iter().flatten());
        names.extend(maps.flat_map(|m| m.keys()).map(|k| (c.name.clone(), k.clone())));
    }
    names
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(c, n)| ((*c).to_owned(), (*n).to_owned())).collect()
    }

    #[test]
    fn an_object_is_converted_with_the_one_set_it_names() {
        let both = [CompatSettings::hami(), CompatSettings::volcano()];
        let pick_for = |pairs: &[(&str, &str)]| pick(&both, "pod", &names(pairs)).map(|f| f.map(|f| f.count_resource.clone()));
        assert_eq!(pick_for(&[("a", "volcano.sh/vgpu-memory"), ("a", "cpu")]), Ok(Some("volcano.sh/vgpu-number".into())));
        assert_eq!(pick_for(&[("a", "nvidia.com/gpucores")]), Ok(Some("nvidia.com/gpu".into())));
        assert_eq!(pick_for(&[("a", "cpu")]), Ok(None));
        assert_eq!(pick_for(&[("a", "nvidia.com/mig-1g.10gb")]), Ok(Some("nvidia.com/gpu".into())), "MIG names");
        let mixed = pick_for(&[("a", "nvidia.com/gpu"), ("b", "volcano.sh/vgpu-number")]).unwrap_err();
        assert!(
            mixed.contains("container \"a\" asks for nvidia.com/gpu and container \"b\" for volcano.sh/vgpu-number"),
            "{mixed}"
        );
    }

    #[test]
    fn a_jobs_names_come_from_every_task_and_container() {
        let job = json!({"spec": {"tasks": [
            {"template": {"spec": {"containers": [{"name": "a", "resources": {"limits": {"volcano.sh/vgpu-number": 1}}}]}}},
            {"template": {"spec": {"initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1"}}}]}}},
        ]}});
        assert_eq!(job_resource_names(&job), names(&[("a", "volcano.sh/vgpu-number"), ("i", "cpu")]));
    }
}
