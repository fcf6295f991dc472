//! What allocated ResourceClaims take of each card: the sum of their `consumedCapacity` (the
//! scheduler's own figures, already rounded by the request policy) and who holds the shares.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use vgpu_scheduling::device::CAPACITY_SHARES;
use vgpu_scheduling::{Consumption, Quantity};

use crate::cards::{Card, zero_like};

/// The key of a card: pool (the node for our driver) and device name.
pub type CardKey = (String, String);

/// One allocation result of a claim on a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub claim: String,
    /// The request (`req` or `req/sub`) the result answers.
    pub request: String,
    /// What it consumes, by capacity.
    pub consumed: Consumption,
    /// The pods the claim is reserved for (`namespace/name`).
    pub pods: Vec<String>,
}

/// A consumedCapacity the API would not have stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ResourceClaim {namespace}/{claim}: consumedCapacity {capacity}: {reason}")]
pub struct AllocationError {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub claim: String,
    /// The capacity.
    pub capacity: String,
    /// Why it does not parse.
    pub reason: String,
}

/// The shares of `driver`'s devices in `claims`, by card.
///
/// # Errors
/// [`AllocationError`] for an unparsable consumed amount.
pub fn shares_by_card(claims: &[ResourceClaim], driver: &str) -> Result<BTreeMap<CardKey, Vec<Share>>, AllocationError> {
    let mut out: BTreeMap<CardKey, Vec<Share>> = BTreeMap::new();
    for claim in claims {
        for result in results(claim).filter(|r| r.driver == driver) {
            let share = share(claim, result)?;
            out.entry((result.pool.clone(), result.device.clone())).or_default().push(share);
        }
    }
    Ok(out)
}

/// The allocation results of `claim` (none when it is not allocated).
pub fn results(claim: &ResourceClaim) -> impl Iterator<Item = &DeviceRequestAllocationResult> {
    claim
        .status
        .iter()
        .filter_map(|s| s.allocation.as_ref())
        .filter_map(|a| a.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
}

/// Whether the scheduler has allocated `claim`.
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

/// The pods `claim` is reserved for, as `namespace/name`.
pub fn reserved_pods(claim: &ResourceClaim) -> Vec<String> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| format!("{namespace}/{}", r.name))
        .collect()
}

/// One result as a [`Share`].
///
/// # Errors
/// [`AllocationError`] for an unparsable consumed amount.
pub fn share(claim: &ResourceClaim, result: &DeviceRequestAllocationResult) -> Result<Share, AllocationError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let mut consumed = Consumption::new();
    for (capacity, q) in result.consumed_capacity.iter().flatten() {
        let amount = Quantity::parse(&q.0).map_err(|e| AllocationError {
            namespace: namespace.clone(),
            claim: name.clone(),
            capacity: capacity.clone(),
            reason: e.to_string(),
        })?;
        consumed.insert(capacity.clone(), amount);
    }
    Ok(Share { namespace, claim: name, request: result.request.clone(), consumed, pods: reserved_pods(claim) })
}

/// What `shares` take of `card`, per capacity of the card. A result without consumed capacity
/// (a device that is not shared) takes the whole card.
pub fn used(card: &Card, shares: &[Share]) -> Consumption {
    let mut used: Consumption = card.capacity.iter().map(|(n, c)| (n.clone(), zero_like(c.value))).collect();
    for share in shares {
        for (name, total) in used.iter_mut() {
            let amount = if share.consumed.is_empty() {
                card.total(name).unwrap_or(Quantity::ZERO)
            } else {
                share.consumed.get(name).copied().unwrap_or(Quantity::ZERO)
            };
            *total = total.checked_add(amount).unwrap_or(*total);
        }
    }
    // Without a shares capacity, each result is one share all the same.
    if !card.capacity.contains_key(CAPACITY_SHARES) {
        used.insert(
            CAPACITY_SHARES.to_owned(),
            Quantity::from_int(i64::try_from(shares.len()).unwrap_or(i64::MAX), vgpu_scheduling::Format::DecimalSI),
        );
    }
    used
}
