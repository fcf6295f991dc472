//! HAMi's `nvidia:` section: the resource names and defaults a webhook converts with, the
//! sharing settings, MIG geometries, and the keys that have no meaning in vgpu-dra.

use super::model::{
    ConfigForm, DeviceConfig, HamiRequestSettings, IgnoredKey, MigGeometry, MigGeometryGroup, MigModels, Setting, Sharing,
    UNKNOWN_WHY,
};
use crate::yaml_tree::{Bad, Node, Value};

/// `nvidia:` keys that are read without effect, and why.
const IGNORED: [(&str, &str); 10] = [
    ("overwriteEnv", "HAMi's webhook rewrites NVIDIA_VISIBLE_DEVICES; DRA containers get their devices through CDI"),
    ("disablecorelimit", "use the driver's --core-utilization-policy=disable"),
    ("disableCoreLimit", "use the driver's --core-utilization-policy=disable"),
    ("migstrategy", "MIG instances are published as the card reports them; there is no device-plugin strategy"),
    ("migStrategy", "MIG instances are published as the card reports them; there is no device-plugin strategy"),
    ("preConfiguredDeviceMemory", "published memory comes from NVML"),
    ("enableNumaTopology", "DRA publishes the card's PCIe root; ask for alignment with a claim constraint"),
    ("libCudaLogLevel", "use the driver's --libcuda-log-level"),
    ("runtimeClassName", "use the chart's runtimeClassName value"),
    ("passDeviceSpecs", "DRA containers get their device nodes through CDI"),
];

/// Why Volcano's `deviceMemoryScaling` is not applied.
const VOLCANO_SCALING_WHY: &str = "volcano-vgpu-device-plugin reads but never applies it (it registers card memory / gpuMemoryFactor), so it is not applied as over-subscription; use --device-memory-scaling or nodeConfig";

/// Reads the `nvidia:` section into `config` (names, defaults, MIG) and `sharing`.
pub(crate) fn read_nvidia(section: &Node, config: &mut DeviceConfig, sharing: &mut Sharing) -> Result<(), Bad> {
    let compat = &mut config.compat;
    let mut memory_scaling = None;
    let mut memory_factor: Option<Setting<u64>> = None;
    let mut priority = None;
    let mut default_memory: Option<Setting<u64>> = None;
    for (k, v) in section.map("nvidia")? {
        let name = k.key_text();
        let key = format!("nvidia.{name}");
        match name.as_str() {
            "resourceCountName" => compat.count_resource = resource_name(v, &key)?,
            "resourceMemoryName" => compat.memory_resource = resource_name(v, &key)?,
            "resourceMemoryPercentageName" => compat.memory_percentage_resource = resource_name(v, &key)?,
            "resourceCoreName" => compat.cores_resource = resource_name(v, &key)?,
            "resourcePriorityName" => priority = Some(resource_name(v, &key)?),
            "gpuCorePolicy" => compat.core_policy = Some(core_policy(v, &key)?),
            // HAMi's docs call it defaultMem, its chart writes defaultMemory.
            "defaultMemory" | "defaultMem" => Setting::set(&mut default_memory, v, &key, v.int(&key, 0, u64::MAX)?)?,
            "defaultCores" => compat.default_cores = v.int32(&key, 0, 100)?,
            "defaultGPUNum" => compat.default_gpu_num = v.int32(&key, 0, u32::MAX)?,
            // Volcano's name and HAMi's newer one for the same unit.
            "gpuMemoryFactor" | "memoryFactor" => Setting::set(&mut memory_factor, v, &key, v.int(&key, 1, u64::MAX)?)?,
            "deviceSplitCount" => Setting::set(&mut sharing.split, v, &key, v.int32(&key, 1, u32::MAX)?)?,
            "deviceMemoryScaling" => memory_scaling = Some((v, key)),
            "deviceCoreScaling" => Setting::set(&mut sharing.cores, v, &key, v.ratio(&key)?)?,
            "knownMigGeometries" => {
                for (i, entry) in v.seq(&key)?.iter().enumerate() {
                    config.mig.push(known_geometries(entry, &format!("{key}[{i}]"), &mut config.ignored)?);
                }
            }
            "migProfileAllowlist" => {
                for (i, entry) in v.seq(&key)?.iter().enumerate() {
                    config.mig.push(profile_allowlist(entry, &format!("{key}[{i}]"), &mut config.ignored)?);
                }
            }
            _ => {
                let why = IGNORED.iter().find(|(n, _)| *n == name).map_or(UNKNOWN_WHY, |(_, why)| why);
                config.ignored.push(IgnoredKey { key, why });
            }
        }
    }
    compat.default_memory_mib = default_memory.map_or(compat.default_memory_mib, |s| s.value);
    compat.memory_factor = memory_factor.map_or(compat.memory_factor, |s| s.value);
    // The form is known only now: the resource names may follow deviceMemoryScaling.
    if [&compat.count_resource, &compat.memory_resource].iter().any(|n| n.starts_with("volcano.sh/")) {
        config.form = ConfigForm::Volcano;
    }
    compat.priority_resource = match priority {
        Some(p) => Some(p),
        None if config.form == ConfigForm::Volcano => None,
        None => compat.priority_resource.take(),
    };
    check_distinct(section, compat)?;
    if let Some((v, key)) = memory_scaling {
        if config.form == ConfigForm::Volcano {
            config.ignored.push(IgnoredKey { key, why: VOLCANO_SCALING_WHY });
        } else {
            Setting::set(&mut sharing.memory, v, &key, v.ratio(&key)?)?;
        }
    }
    Ok(())
}

/// An extended resource name, `domain/name`, as Kubernetes accepts it in a container's limits.
fn resource_name(node: &Node, key: &str) -> Result<String, Bad> {
    let text = node.text(key)?;
    let valid = text.split_once('/').is_some_and(|(domain, name)| {
        let label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        let domain_ok = domain.len() <= 253 && domain.split('.').all(label);
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric());
        domain_ok && name_ok
    });
    if !valid {
        return Err(Bad::new(node, key, format!("{text:?} is not a resource name such as nvidia.com/gpu")));
    }
    Ok(text)
}

/// A webhook cannot tell two quantities apart when they share a resource name.
fn check_distinct(section: &Node, c: &HamiRequestSettings) -> Result<(), Bad> {
    let names = [
        ("resourceCountName", Some(&c.count_resource)),
        ("resourceMemoryName", Some(&c.memory_resource)),
        ("resourceMemoryPercentageName", Some(&c.memory_percentage_resource)),
        ("resourceCoreName", Some(&c.cores_resource)),
        ("resourcePriorityName", c.priority_resource.as_ref()),
    ];
    let names: Vec<(&str, &String)> = names.into_iter().filter_map(|(k, n)| Some((k, n?))).collect();
    for (i, (a, name)) in names.iter().enumerate() {
        if let Some((b, _)) = names[i + 1..].iter().find(|(_, other)| other == name) {
            return Err(Bad::new(section, &format!("nvidia.{b}"), format!("{name} is also nvidia.{a}")));
        }
    }
    Ok(())
}

/// HAMi-core's compute policy, as `GPU_CORE_UTILIZATION_POLICY` takes it.
fn core_policy(node: &Node, key: &str) -> Result<String, Bad> {
    let text = node.text(key)?;
    if !["default", "force", "disable"].contains(&text.as_str()) {
        return Err(Bad::new(node, key, format!("{text:?} is not one of default, force, disable")));
    }
    Ok(text)
}

/// `models: [...]`, required and non-empty in both MIG lists.
fn models(entry: &Node, key: &str) -> Result<Vec<String>, Bad> {
    let path = format!("{key}.models");
    let found = entry.map(key)?.iter().find(|(k, _)| k.key_text() == "models");
    let models = match found {
        Some((_, v)) => v.text_list(&path)?,
        None => Vec::new(),
    };
    if models.is_empty() {
        return Err(Bad::new(entry, &path, "expected at least one model name"));
    }
    Ok(models)
}

/// One `knownMigGeometries` entry, in Volcano's form (`allowedGeometries: [{group, geometries}]`)
/// or HAMi's (`allowedGeometries: [[instance, ...], ...]`).
fn known_geometries(entry: &Node, key: &str, ignored: &mut Vec<IgnoredKey>) -> Result<MigModels, Bad> {
    let mut out = MigModels { models: models(entry, key)?, groups: Vec::new(), profiles: Vec::new() };
    for (k, v) in entry.map(key)? {
        let name = k.key_text();
        let path = format!("{key}.{name}");
        match name.as_str() {
            "models" => {}
            "allowedGeometries" => {
                for (i, group) in v.seq(&path)?.iter().enumerate() {
                    out.groups.push(geometry_group(group, &format!("{path}[{i}]"), i, ignored)?);
                }
            }
            _ => ignored.push(IgnoredKey { key: path, why: UNKNOWN_WHY }),
        }
    }
    if out.groups.is_empty() {
        return Err(Bad::new(entry, &format!("{key}.allowedGeometries"), "expected at least one geometry"));
    }
    Ok(out)
}

fn geometry_group(node: &Node, key: &str, index: usize, ignored: &mut Vec<IgnoredKey>) -> Result<MigGeometryGroup, Bad> {
    let (group, instances) = match &node.value {
        Value::Seq(items) => (format!("geometry-{index}"), items.as_slice()),
        _ => {
            let mut group = None;
            let mut instances: &[Node] = &[];
            for (k, v) in node.map(key)? {
                let name = k.key_text();
                let path = format!("{key}.{name}");
                match name.as_str() {
                    "group" => group = Some(v.text(&path)?),
                    "geometries" => instances = v.seq(&path)?,
                    _ => ignored.push(IgnoredKey { key: path, why: UNKNOWN_WHY }),
                }
            }
            (group.unwrap_or_else(|| format!("geometry-{index}")), instances)
        }
    };
    if instances.is_empty() {
        return Err(Bad::new(node, key, "expected at least one MIG instance (name, memory, count)"));
    }
    let geometries = instances
        .iter()
        .enumerate()
        .map(|(i, n)| instance(n, &format!("{key}.geometries[{i}]"), ignored))
        .collect::<Result<_, _>>()?;
    Ok(MigGeometryGroup { group, geometries })
}

fn instance(node: &Node, key: &str, ignored: &mut Vec<IgnoredKey>) -> Result<MigGeometry, Bad> {
    let (mut name, mut memory, mut count) = (None, None, None);
    for (k, v) in node.map(key)? {
        let field = k.key_text();
        let path = format!("{key}.{field}");
        match field.as_str() {
            "name" => name = Some(profile(v, &path)?),
            "memory" => memory = Some(v.int(&path, 1, u64::MAX)?),
            "count" => count = Some(v.int32(&path, 1, 7)?),
            // HAMi's compute share of the instance: NVML reports it for the real instance.
            "core" => ignored.push(IgnoredKey { key: path, why: "the instance's compute comes from NVML" }),
            _ => ignored.push(IgnoredKey { key: path, why: UNKNOWN_WHY }),
        }
    }
    let missing = |f: &str| Bad::new(node, &format!("{key}.{f}"), "missing");
    Ok(MigGeometry {
        name: name.ok_or_else(|| missing("name"))?,
        memory_mib: memory.ok_or_else(|| missing("memory"))?,
        count: count.ok_or_else(|| missing("count"))?,
    })
}

/// One `migProfileAllowlist` entry: `models` and the `profiles` allowed on them.
fn profile_allowlist(entry: &Node, key: &str, ignored: &mut Vec<IgnoredKey>) -> Result<MigModels, Bad> {
    let mut out = MigModels { models: models(entry, key)?, groups: Vec::new(), profiles: Vec::new() };
    for (k, v) in entry.map(key)? {
        let name = k.key_text();
        let path = format!("{key}.{name}");
        match name.as_str() {
            "models" => {}
            "profiles" => out.profiles = v.seq(&path)?.iter().map(|p| profile(p, &path)).collect::<Result<_, _>>()?,
            _ => ignored.push(IgnoredKey { key: path, why: UNKNOWN_WHY }),
        }
    }
    if out.profiles.is_empty() {
        return Err(Bad::new(entry, &format!("{key}.profiles"), "expected at least one profile"));
    }
    Ok(out)
}

/// A MIG profile name: `<slices>g.<memory>gb`, optionally with a `+me`-style suffix.
fn profile(node: &Node, key: &str) -> Result<String, Bad> {
    let text = node.text(key)?;
    let base = text.split_once('+').map_or(text.as_str(), |(b, _)| b);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let valid =
        base.split_once("g.").and_then(|(g, rest)| rest.strip_suffix("gb").map(|m| digits(g) && digits(m))).unwrap_or(false);
    if !valid {
        return Err(Bad::new(node, key, format!("{text:?} is not a MIG profile such as 1g.10gb")));
    }
    Ok(text)
}
