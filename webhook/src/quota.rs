//! Namespace GPU quotas at claim creation, exact under concurrency.
//!
//! Every ResourceClaim created on the driver's classes is sent here (a converted pod's, a native
//! template's, one written directly). What it asks ([`vgpu_scheduling::quota::charge`]) is
//! checked against the namespace's ResourceQuotas on HAMi's keys beside what the namespace
//! holds: its live claims, plus the claims admitted but not yet stored. Those are reservations
//! in a per-namespace ledger (a ConfigMap in the webhook's own namespace, out of tenants'
//! reach), written conditionally on the version read: two admissions racing for the last room,
//! in one replica or two, cannot both win, since the second write fails and is retried against
//! the first's reservation. The admitted claim carries its reservation's id as an annotation;
//! once the claim is seen stored, its reservation is dropped and the claim itself is counted,
//! until it is deleted. A reservation whose claim never appears (a later admission step refused
//! it) lapses after [`RESERVATION_TTL`].
//!
//! The ledger is read before the claims are listed: a claim whose reservation a concurrent
//! admission dropped was stored before that drop, so the list that follows sees it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::ResourceClaim;
use vgpu_scheduling::ClassFacts;
use vgpu_scheduling::quota::{Charge, Dimension, Exceeded, Limits, charge};

use crate::admit::AdmitError;

/// The annotation naming a claim's reservation in its namespace's ledger.
pub const RESERVATION_ANNOTATION: &str = "vgpu-dra.io/quota-reservation";
/// How long a reservation counts while its claim is not seen stored.
pub const RESERVATION_TTL: Duration = Duration::from_secs(30);
/// Conditional ledger writes tried before the admission gives up (each lost only to another
/// admission's success).
const ATTEMPTS: usize = 16;

/// One admitted claim not yet seen stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reservation {
    /// What it charges.
    pub charge: Charge,
    /// When it was made, in seconds since the epoch.
    pub at: u64,
}

/// A namespace's reservations, with the version they were read at (`None`: no ledger yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// The ledger object's `resourceVersion`, for the conditional write.
    pub version: Option<String>,
    /// Reservations by id.
    pub reservations: BTreeMap<String, Reservation>,
}

/// What the quota check needs from the cluster. Every default answers "no quota here".
pub trait QuotaStore: Send + Sync + 'static {
    /// The ResourceQuotas of `namespace`.
    fn quotas(&self, _namespace: &str) -> impl Future<Output = Result<Vec<ResourceQuota>, AdmitError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// The ResourceClaims of `namespace`, read from the API server, not a cache.
    fn claims(&self, _namespace: &str) -> impl Future<Output = Result<Vec<ResourceClaim>, AdmitError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// The ledger of `namespace`.
    fn ledger(&self, _namespace: &str) -> impl Future<Output = Result<Ledger, AdmitError>> + Send {
        async { Ok(Ledger::default()) }
    }
    /// Writes `ledger` if the stored one is still at `ledger.version` (created if it had none);
    /// `Ok(false)` when it is not.
    fn write_ledger(&self, _namespace: &str, _ledger: &Ledger) -> impl Future<Output = Result<bool, AdmitError>> + Send {
        async { Ok(true) }
    }
}

/// The outcome of the quota check of one claim.
#[derive(Debug)]
pub enum QuotaOutcome {
    /// Not the driver's claim, or no quota on HAMi's keys in its namespace: admitted as it is.
    Unlimited,
    /// Admitted; the claim is to carry this reservation id.
    Reserved(String),
    /// Refused: it would pass a limit.
    Exceeded(Exceeded),
}

/// A quota check's outcome, with the namespace's limits and what it holds after it (for the
/// metrics): the claim's share included when it was reserved.
#[derive(Debug)]
pub struct Checked {
    /// The outcome.
    pub outcome: QuotaOutcome,
    /// The namespace's limits on GPU keys (none when unlimited).
    pub limits: Limits,
    /// What the namespace holds.
    pub used: Charge,
}

/// Checks `claim` in `namespace` against its quotas on `keys`, reserving its share when it fits.
/// On a dry run nothing is written (the id returned is not recorded).
///
/// # Errors
/// [`AdmitError`] when the cluster fails or the ledger keeps changing under every attempt.
pub async fn check_claim<S: QuotaStore>(
    store: &S,
    namespace: &str,
    claim: &ResourceClaim,
    (keys, classes, facts): (&BTreeMap<String, Dimension>, &[String], &ClassFacts),
    dry_run: bool,
    now: u64,
) -> Result<Checked, AdmitError> {
    let unlimited = || Checked { outcome: QuotaOutcome::Unlimited, limits: Limits::default(), used: Charge::default() };
    let Some(asked) = charge(&claim.spec, classes, facts) else { return Ok(unlimited()) };
    let limits = Limits::from_quotas(&store.quotas(namespace).await?, keys);
    if limits.is_empty() {
        return Ok(unlimited());
    }
    let id = new_id()?;
    for _ in 0..ATTEMPTS {
        let mut ledger = store.ledger(namespace).await?;
        let claims = store.claims(namespace).await?;
        let used = usage(&mut ledger, &claims, classes, facts, now);
        if let Err(exceeded) = limits.check(used, asked) {
            return Ok(Checked { outcome: QuotaOutcome::Exceeded(exceeded), limits, used });
        }
        if dry_run {
            return Ok(Checked { outcome: QuotaOutcome::Reserved(id), limits, used });
        }
        ledger.reservations.insert(id.clone(), Reservation { charge: asked, at: now });
        if store.write_ledger(namespace, &ledger).await? {
            return Ok(Checked { outcome: QuotaOutcome::Reserved(id), limits, used: used.plus(asked) });
        }
    }
    Err(AdmitError::Contended { namespace: namespace.to_owned(), attempts: ATTEMPTS })
}

/// What `claims` and the live reservations of `ledger` charge together; reservations whose
/// claim is stored, or that lapsed, are dropped from `ledger` (written with the next
/// reservation).
pub fn usage(ledger: &mut Ledger, claims: &[ResourceClaim], classes: &[String], facts: &ClassFacts, now: u64) -> Charge {
    let mut used = Charge::default();
    for claim in claims {
        if let Some(c) = charge(&claim.spec, classes, facts) {
            used = used.plus(c);
        }
        if let Some(id) = claim.metadata.annotations.as_ref().and_then(|a| a.get(RESERVATION_ANNOTATION)) {
            ledger.reservations.remove(id);
        }
    }
    ledger.reservations.retain(|_, r| now.saturating_sub(r.at) < RESERVATION_TTL.as_secs());
    ledger.reservations.values().fold(used, |total, r| total.plus(r.charge))
}

/// 128 random bits from the OS, hex: not guessable by a tenant who would cancel another's
/// reservation.
fn new_id() -> Result<String, AdmitError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| AdmitError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The ConfigMap data of `ledger`: one JSON entry per reservation.
pub fn ledger_data(ledger: &Ledger) -> BTreeMap<String, String> {
    ledger.reservations.iter().filter_map(|(id, r)| serde_json::to_string(r).ok().map(|v| (id.clone(), v))).collect()
}

/// The reservations in ConfigMap `data`; an entry that does not parse is left out (it can only
/// have been written by someone else, and lapses with the next write).
pub fn ledger_from_data(data: &BTreeMap<String, String>) -> BTreeMap<String, Reservation> {
    data.iter().filter_map(|(id, v)| serde_json::from_str(v).ok().map(|r| (id.clone(), r))).collect()
}

/// The ledger's name for `namespace`.
pub fn ledger_name(namespace: &str) -> String {
    format!("vgpu-dra-quota-{namespace}")
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
