//! HAMi's resource names (`nvidia.com/gpu`, `gpumem`, `gpumem-percentage`, `gpucores`) as a DRA
//! device request, for a webhook that lets HAMi pod specs run unchanged on this driver.

use std::collections::BTreeMap;

use crate::device::{CAPACITY_CORES, CAPACITY_MEMORY};
use crate::{Format, Quantity};

/// Number of cards.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// Memory per card: a plain number is MiB, a quantity with suffix is taken as written.
pub const RESOURCE_GPUMEM: &str = "nvidia.com/gpumem";
/// Memory per card in percent of the card.
pub const RESOURCE_GPUMEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
/// Compute per card in percent.
pub const RESOURCE_GPUCORES: &str = "nvidia.com/gpucores";

/// A ResourceClaim device request: `count` devices, each with these capacity requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// `exactly.count`.
    pub count: u32,
    /// `exactly.capacity.requests`.
    pub capacity: BTreeMap<String, Quantity>,
}

/// A HAMi limit that has no DRA equivalent; the message names the resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{resource}: {reason}")]
pub struct CompatError {
    /// The resource name.
    pub resource: &'static str,
    /// What is wrong.
    pub reason: String,
}

fn err(resource: &'static str, reason: impl Into<String>) -> CompatError {
    CompatError { resource, reason: reason.into() }
}

/// Converts a container's limits. `card_memory_bytes` is the memory of the reference card
/// (percentages are taken of it, and no request may exceed it: the webhook passes the smallest
/// card of the class so the claim fits on any). `Ok(None)` when no HAMi resource is set.
///
/// # Errors
/// [`CompatError`] for fractional GPUs, percentages over 100, memory larger than the card, both
/// `gpumem` and `gpumem-percentage`, or HAMi resources without `nvidia.com/gpu`.
pub fn from_hami_limits(limits: &BTreeMap<String, String>, card_memory_bytes: u64) -> Result<Option<DeviceRequest>, CompatError> {
    let get = |k: &str| limits.get(k).map(|v| v.trim());
    let Some(gpu) = get(RESOURCE_GPU) else {
        for other in [RESOURCE_GPUMEM, RESOURCE_GPUMEM_PERCENTAGE, RESOURCE_GPUCORES] {
            if get(other).is_some() {
                return Err(err(other, format!("needs {RESOURCE_GPU} in the same container")));
            }
        }
        return Ok(None);
    };
    let count = Quantity::parse(gpu).ok().and_then(|q| q.as_u64_exact()).ok_or_else(|| {
        err(
            RESOURCE_GPU,
            format!("{gpu:?} is not a whole number of GPUs (fractional GPUs are expressed with gpumem and gpucores)"),
        )
    })?;
    let count =
        u32::try_from(count).ok().filter(|c| *c > 0).ok_or_else(|| err(RESOURCE_GPU, format!("{gpu} must be at least 1")))?;
    let card = Quantity::from_bytes(card_memory_bytes);
    let mut capacity = BTreeMap::new();
    match (get(RESOURCE_GPUMEM), get(RESOURCE_GPUMEM_PERCENTAGE)) {
        (Some(_), Some(_)) => {
            return Err(err(RESOURCE_GPUMEM, format!("set either it or {RESOURCE_GPUMEM_PERCENTAGE}, not both")));
        }
        (Some(mem), None) => {
            let bytes = if mem.bytes().all(|b| b.is_ascii_digit()) {
                let mib: u64 = mem.parse().map_err(|_| err(RESOURCE_GPUMEM, format!("{mem} is too large")))?;
                Quantity::from_bytes(mib.checked_mul(1 << 20).ok_or_else(|| err(RESOURCE_GPUMEM, format!("{mem} is too large")))?)
            } else {
                Quantity::parse(mem).map_err(|e| err(RESOURCE_GPUMEM, e.to_string()))?.with_format(Format::BinarySI)
            };
            if bytes.is_zero() || bytes.is_negative() {
                return Err(err(RESOURCE_GPUMEM, format!("{mem} must be positive")));
            }
            if bytes > card {
                return Err(err(RESOURCE_GPUMEM, format!("{bytes} is more than a card has ({card})")));
            }
            capacity.insert(CAPACITY_MEMORY.to_owned(), bytes);
        }
        (None, Some(pct)) => {
            let p: u64 =
                pct.parse().map_err(|_| err(RESOURCE_GPUMEM_PERCENTAGE, format!("{pct:?} is not a whole percentage")))?;
            if p == 0 || p > 100 {
                return Err(err(RESOURCE_GPUMEM_PERCENTAGE, format!("{p} must be 1 to 100")));
            }
            let mib = u128::from(card_memory_bytes >> 20) * u128::from(p) / 100;
            let bytes = u64::try_from(mib.max(1) << 20).unwrap_or(card_memory_bytes);
            capacity.insert(CAPACITY_MEMORY.to_owned(), Quantity::from_bytes(bytes));
        }
        (None, None) => {}
    }
    if let Some(cores) = get(RESOURCE_GPUCORES) {
        let c: i64 = cores.parse().map_err(|_| err(RESOURCE_GPUCORES, format!("{cores:?} is not a whole percentage")))?;
        if !(0..=100).contains(&c) {
            return Err(err(RESOURCE_GPUCORES, format!("{c} must be 0 to 100")));
        }
        capacity.insert(CAPACITY_CORES.to_owned(), Quantity::from_int(c, Format::DecimalSI));
    }
    Ok(Some(DeviceRequest { count, capacity }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T4: u64 = 15 << 30;

    fn convert(pairs: &[(&str, &str)], card: u64) -> Result<Option<DeviceRequest>, CompatError> {
        from_hami_limits(&pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), card)
    }

    fn caps(r: &DeviceRequest) -> Vec<(String, String)> {
        r.capacity.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
    }

    #[test]
    fn plain_gpumem_is_mib_and_suffixed_gpumem_is_a_quantity() {
        let r = convert(&[(RESOURCE_GPU, "2"), (RESOURCE_GPUMEM, "4096"), (RESOURCE_GPUCORES, "30")], T4).unwrap().unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(caps(&r), [("cores".to_owned(), "30".to_owned()), ("memory".to_owned(), "4Gi".to_owned())]);
        // HAMi-DRA misreads this form; it is 16Gi, not 16 MiB.
        let r = convert(&[(RESOURCE_GPU, "1"), (RESOURCE_GPUMEM, "16Gi")], 80 << 30).unwrap().unwrap();
        assert_eq!(caps(&r), [("memory".to_owned(), "16Gi".to_owned())]);
    }

    #[test]
    fn percentages_are_taken_of_the_reference_card() {
        let r = convert(&[(RESOURCE_GPU, "1"), (RESOURCE_GPUMEM_PERCENTAGE, "50")], 143_771 << 20).unwrap().unwrap();
        assert_eq!(caps(&r), [("memory".to_owned(), "71885Mi".to_owned())]);
    }

    #[test]
    fn gpu_alone_asks_for_whole_cards_and_no_hami_resources_means_nothing() {
        let r = convert(&[(RESOURCE_GPU, "1")], T4).unwrap().unwrap();
        assert!(r.capacity.is_empty());
        assert_eq!(convert(&[("cpu", "1")], T4).unwrap(), None);
    }

    #[test]
    fn errors_name_the_resource() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(RESOURCE_GPU, "0.5")], "nvidia.com/gpu: \"0.5\" is not a whole number"),
            (&[(RESOURCE_GPU, "0")], "nvidia.com/gpu: 0 must be at least 1"),
            (&[(RESOURCE_GPU, "1"), (RESOURCE_GPUMEM_PERCENTAGE, "150")], "nvidia.com/gpumem-percentage: 150 must be 1 to 100"),
            (&[(RESOURCE_GPU, "1"), (RESOURCE_GPUMEM, "16Gi")], "nvidia.com/gpumem: 16Gi is more than a card has (15Gi)"),
            (&[(RESOURCE_GPU, "1"), (RESOURCE_GPUMEM, "1"), (RESOURCE_GPUMEM_PERCENTAGE, "5")], "nvidia.com/gpumem: set either"),
            (&[(RESOURCE_GPU, "1"), (RESOURCE_GPUCORES, "101")], "nvidia.com/gpucores: 101 must be 0 to 100"),
            (&[(RESOURCE_GPUMEM, "1024")], "nvidia.com/gpumem: needs nvidia.com/gpu"),
        ];
        for (pairs, want) in cases {
            let e = convert(pairs, T4).unwrap_err().to_string();
            assert!(e.starts_with(want), "{pairs:?}: {e}");
        }
    }
}
