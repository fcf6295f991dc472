//! One container's HAMi resources read with HAMi's meaning: how many cards, how much memory and
//! compute on each, and its task priority.

use k8s_openapi::api::core::v1::Container;

use super::error::CompatError;
use super::mig_names::{MigInstances, profiles_named};
use super::settings::{ClassFacts, CompatSettings};
use crate::Quantity;

/// The most devices one claim can be allocated (`AllocationResultsMaxSize` in resource.k8s.io).
pub const MAX_COUNT: u64 = 32;

const MIB: u64 = 1 << 20;

/// Memory on each card.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryRequest {
    /// All of it: no memory request, so the device's policy default (the whole card) applies.
    WholeCard,
    /// This many bytes.
    Bytes(u64),
    /// This percentage (1 to 99) of the card the scheduler picks.
    Percent(u32),
}

/// What a container asks for, in HAMi's meaning.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CardRequest {
    /// Distinct cards.
    pub count: u32,
    /// Memory on each card.
    pub memory: MemoryRequest,
    /// Compute on each card, percent.
    pub cores: u32,
    /// HAMi-core task priority, when asked.
    pub priority: Option<i64>,
}

/// The outcome for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// No HAMi resource: the container is left alone.
    Nothing,
    /// HAMi resources that ask for no device (a count of 0, or no count with `defaultGPUNum` 0,
    /// or a priority alone, or MIG resources of 0): they are removed and nothing is requested, as
    /// HAMi gives no card.
    NoDevice,
    /// Cards to request.
    Cards(CardRequest),
    /// MIG instances by profile (`nvidia.com/mig-<profile>`), one entry per resource.
    Instances(Vec<MigInstances>),
}

/// A resource value as read from a container: the limit, else the request.
struct Value {
    text: String,
    quantity: Quantity,
}

/// Reads `container`'s HAMi resources. `warnings` gets a line for every value HAMi accepts but
/// that does something a user may not expect (a zero treated as absent, a request of no card).
///
/// # Errors
/// [`CompatError`] naming the container and resource for a privileged container, a MIG
/// resource of an unknown profile or beside other GPU resources, unparseable or fractional values, values out of range, limits and requests that differ,
/// memory with a percentage, a count past what one claim can hold; and, only under
/// [`CompatSettings::strict_fit`], memory larger than the largest card or a count larger than
/// any node has now (otherwise these are warnings: the pod waits for such a node).
pub fn container_ask(
    container: &Container,
    settings: &CompatSettings,
    facts: &ClassFacts,
    warnings: &mut Vec<String>,
) -> Result<Ask, CompatError> {
    let name = container.name.as_str();
    let Some(first) = own_resources(container, settings).next() else { return Ok(Ask::Nothing) };
    if container.security_context.as_ref().and_then(|s| s.privileged) == Some(true) {
        return Err(CompatError::Privileged { container: name.into(), resource: first.into() });
    }
    if let Some(mig) = own_resources(container, settings).find(|r| settings.is_mig(r)) {
        if let Some(other) = own_resources(container, settings).find(|r| !settings.is_mig(r)) {
            return Err(CompatError::MigAndCards { container: name.into(), mig: mig.into(), other: other.into() });
        }
        return instances(container, settings, warnings);
    }
    let read = |resource: &str| value(container, resource);
    let count = read(&settings.count_resource)?;
    let memory = read(&settings.memory_resource)?;
    let percentage = read(&settings.memory_percentage_resource)?;
    let cores = read(&settings.cores_resource)?;
    let priority = match &settings.priority_resource {
        Some(resource) => read(resource)?.map(|v| whole(name, resource, &v, i64::from(i32::MAX))).transpose()?,
        None => None,
    };
    let wants_card = memory.is_some() || percentage.is_some() || cores.is_some();

    let count = match &count {
        Some(v) => {
            whole(name, &settings.count_resource, v, i64::MAX).map_err(|e| fractional_gpu_hint(e, settings))?.unsigned_abs()
        }
        None if wants_card => u64::from(settings.default_gpu_num),
        None => 0,
    };
    if count == 0 {
        warnings.push(match (wants_card, priority.is_some()) {
            (true, _) | (false, false) => {
                format!("container {name:?} asks for 0 GPUs: its HAMi resources are removed and it gets no GPU")
            }
            (false, true) => format!("container {name:?}: the priority has no effect without a GPU and is removed"),
        });
        return Ok(Ask::NoDevice);
    }
    let too_many = |max: u64| CompatError::TooManyCards {
        container: name.into(),
        resource: settings.count_resource.clone(),
        count,
        max: u32::try_from(max).unwrap_or(u32::MAX),
    };
    if count > MAX_COUNT {
        return Err(too_many(MAX_COUNT));
    }
    let largest_node = u64::from(facts.max_cards_per_node);
    if largest_node > 0 && count > largest_node {
        if settings.strict_fit {
            return Err(too_many(largest_node));
        }
        warnings.push(format!(
            "container {name:?}: {}: {count} cards is more than any node has now ({largest_node}): the pod waits until a node with {count} cards joins",
            settings.count_resource
        ));
    }

    let (memory_request, percent) = memory_of(name, memory.as_ref(), percentage.as_ref(), settings, facts, warnings)?;

    let cores = match &cores {
        Some(v) => cores_of(name, &settings.cores_resource, v, warnings)?,
        // HAMi gives a card exclusively when the memory asked is the whole card: no memory
        // resource at all, or a percentage of exactly 100 (even with a non-zero defaultMemory).
        None if percent.map_or(memory.is_none(), |p| p == 100) => 100,
        None => u64::from(settings.default_cores),
    };
    Ok(Ask::Cards(CardRequest {
        count: u32::try_from(count).unwrap_or(u32::MAX),
        memory: memory_request,
        cores: u32::try_from(cores).unwrap_or(100),
        priority,
    }))
}

/// The container's `nvidia.com/mig-<profile>` resources, each a whole count of instances of a
/// catalogued profile; a count of 0 asks for nothing, with a warning, as `nvidia.com/gpu: 0`.
fn instances(container: &Container, settings: &CompatSettings, warnings: &mut Vec<String>) -> Result<Ask, CompatError> {
    let name = container.name.as_str();
    let mut resources: Vec<&str> = own_resources(container, settings).collect();
    resources.sort_unstable();
    resources.dedup();
    let mut out = Vec::new();
    for resource in resources {
        let suffix = resource.strip_prefix(settings.mig_resource_prefix.as_str()).unwrap_or(resource);
        let profiles = profiles_named(suffix);
        if profiles.is_empty() {
            return Err(CompatError::UnknownMigProfile {
                container: name.into(),
                resource: resource.into(),
                profile: suffix.into(),
            });
        }
        let Some(v) = value(container, resource)? else { continue };
        let count = whole(name, resource, &v, i64::MAX)?.unsigned_abs();
        if count > MAX_COUNT {
            return Err(CompatError::TooManyCards {
                container: name.into(),
                resource: resource.into(),
                count,
                max: u32::try_from(MAX_COUNT).unwrap_or(u32::MAX),
            });
        }
        if count == 0 {
            warnings.push(format!("container {name:?} asks for 0 of {resource}: it is removed and gives no MIG instance"));
            continue;
        }
        out.push(MigInstances { resource: resource.into(), profiles, count: u32::try_from(count).unwrap_or(u32::MAX) });
    }
    Ok(if out.is_empty() { Ask::NoDevice } else { Ask::Instances(out) })
}

/// The memory a container's cards ask for, from its memory or percentage resource (at most one)
/// or the default; with the percentage as given, which decides the default cores.
fn memory_of(
    name: &str,
    memory: Option<&Value>,
    percentage: Option<&Value>,
    settings: &CompatSettings,
    facts: &ClassFacts,
    warnings: &mut Vec<String>,
) -> Result<(MemoryRequest, Option<i64>), CompatError> {
    if memory.is_some() && percentage.is_some() {
        return Err(CompatError::MemoryAndPercentage {
            container: name.into(),
            memory: settings.memory_resource.clone(),
            percentage: settings.memory_percentage_resource.clone(),
        });
    }
    let percent = percentage.map(|v| whole(name, &settings.memory_percentage_resource, v, 100)).transpose()?;
    let bytes = memory.map(|v| memory_bytes(name, &settings.memory_resource, v, settings, facts, warnings)).transpose()?;
    if percent == Some(0) || bytes == Some(0) {
        let resource = if percent.is_some() { &settings.memory_percentage_resource } else { &settings.memory_resource };
        warnings.push(format!("container {name:?}: {resource} 0 is taken as not set (as HAMi does): the default memory applies"));
    }
    let memory_request = match (bytes, percent) {
        (Some(b), _) if b > 0 => MemoryRequest::Bytes(b),
        (_, Some(p)) if (1..100).contains(&p) => MemoryRequest::Percent(u32::try_from(p).unwrap_or(100)),
        (_, Some(100)) => MemoryRequest::WholeCard,
        _ if settings.default_memory_mib > 0 => MemoryRequest::Bytes(settings.default_memory_mib.saturating_mul(MIB)),
        _ => MemoryRequest::WholeCard,
    };
    Ok((memory_request, percent))
}

/// Names of the container's limits and requests that this flavour converts or denies.
pub(super) fn own_resources<'a>(container: &'a Container, settings: &'a CompatSettings) -> impl Iterator<Item = &'a str> + 'a {
    let resources = container.resources.as_ref();
    let limits = resources.and_then(|r| r.limits.as_ref()).into_iter().flat_map(|m| m.keys());
    let requests = resources.and_then(|r| r.requests.as_ref()).into_iter().flat_map(|m| m.keys());
    limits.chain(requests).map(String::as_str).filter(|k| settings.is_own_resource(k))
}

/// The limit of `resource`, else its request; both must agree when both are set.
fn value(container: &Container, resource: &str) -> Result<Option<Value>, CompatError> {
    let resources = container.resources.as_ref();
    let parse =
        |text: &str| {
            Quantity::parse(text).map(|quantity| Value { text: text.to_owned(), quantity }).map_err(|_| {
                CompatError::BadQuantity { container: container.name.clone(), resource: resource.into(), value: text.into() }
            })
        };
    let limit = resources.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(resource)).map(|q| parse(&q.0)).transpose()?;
    let request = resources.and_then(|r| r.requests.as_ref()).and_then(|m| m.get(resource)).map(|q| parse(&q.0)).transpose()?;
    match (limit, request) {
        (Some(l), Some(r)) if l.quantity != r.quantity => Err(CompatError::LimitRequestDiffer {
            container: container.name.clone(),
            resource: resource.into(),
            limit: l.text,
            request: r.text,
        }),
        (Some(v), _) | (None, Some(v)) => Ok(Some(v)),
        (None, None) => Ok(None),
    }
}

/// A cores value: a whole number, 0 or more; above 100 it is 100 with a warning, as HAMi clamps it.
fn cores_of(container: &str, resource: &str, v: &Value, warnings: &mut Vec<String>) -> Result<u64, CompatError> {
    let cores = whole(container, resource, v, i64::MAX)?.unsigned_abs();
    if cores > 100 {
        warnings.push(format!(
            "container {container:?}: {resource} {} is more than one card's 100: taken as 100 (as HAMi does)",
            v.text
        ));
        return Ok(100);
    }
    Ok(cores)
}

/// A whole number from 0 to `max`.
fn whole(container: &str, resource: &str, v: &Value, max: i64) -> Result<i64, CompatError> {
    if v.quantity.nanos() % 1_000_000_000 != 0 {
        return Err(CompatError::NotWhole {
            container: container.into(),
            resource: resource.into(),
            value: v.text.clone(),
            hint: "",
        });
    }
    let out_of_range = || CompatError::OutOfRange {
        container: container.into(),
        resource: resource.into(),
        value: v.text.clone(),
        range: if max == i64::MAX { "0 or more".into() } else { format!("0 to {max}") },
    };
    let n = v.quantity.value_ceil().ok_or_else(out_of_range)?;
    if !(0..=max).contains(&n) {
        return Err(out_of_range());
    }
    Ok(n)
}

/// Fractional cards are HAMi's most common misunderstanding: say what to write instead.
fn fractional_gpu_hint(e: CompatError, settings: &CompatSettings) -> CompatError {
    match e {
        CompatError::NotWhole { container, resource, value, .. } => CompatError::NotWhole {
            container,
            resource,
            value,
            hint: if settings.memory_resource.starts_with("volcano.sh/") {
                "; a share of a card is asked with volcano.sh/vgpu-memory and volcano.sh/vgpu-cores"
            } else {
                "; a share of a card is asked with nvidia.com/gpumem and nvidia.com/gpucores"
            },
        },
        other => other,
    }
}

/// Memory in bytes: a number is MiB times the memory factor (HAMi's unit), a quantity with a
/// binary suffix (`16Gi`) is bytes as written. Checked against the largest card when known:
/// denied past it under [`CompatSettings::strict_fit`], else a warning that the pod waits.
///
/// A decimal suffix (`2k`) or an exponent is still a number: the API server stores
/// `volcano.sh/vgpu-memory: 2000` as `2k` before any webhook sees it, and HAMi reads the
/// quantity's value as MiB whatever its form.
fn memory_bytes(
    container: &str,
    resource: &str,
    v: &Value,
    settings: &CompatSettings,
    facts: &ClassFacts,
    warnings: &mut Vec<String>,
) -> Result<u64, CompatError> {
    let plain = !v.text.trim_end().ends_with('i');
    let out_of_range = |range: String| CompatError::OutOfRange {
        container: container.into(),
        resource: resource.into(),
        value: v.text.clone(),
        range,
    };
    let bytes = if plain {
        let mib = whole(container, resource, v, i64::MAX)?.unsigned_abs();
        mib.checked_mul(settings.memory_factor.max(1))
            .and_then(|m| m.checked_mul(MIB))
            .ok_or_else(|| out_of_range("a memory size in MiB that fits 64 bits".into()))?
    } else {
        if v.quantity.is_negative() {
            return Err(out_of_range("positive".into()));
        }
        let bytes = v.quantity.as_u64_exact().ok_or_else(|| CompatError::NotWhole {
            container: container.into(),
            resource: resource.into(),
            value: v.text.clone(),
            hint: " of bytes",
        })?;
        if bytes < MIB {
            return Err(CompatError::MemoryTooSmall {
                container: container.into(),
                resource: resource.into(),
                value: v.text.clone(),
            });
        }
        bytes
    };
    match facts.largest_memory() {
        Some(largest) if bytes > largest && settings.strict_fit => {
            Err(CompatError::MemoryTooLarge { container: container.into(), resource: resource.into(), bytes, largest })
        }
        Some(largest) if bytes > largest => {
            warnings.push(format!(
                "container {container:?}: {resource}: {bytes} bytes is more than the largest card has now ({largest} bytes): the pod waits until a card that large joins"
            ));
            Ok(bytes)
        }
        _ => Ok(bytes),
    }
}

#[cfg(test)]
#[path = "container_tests.rs"]
mod tests;
