//! Namespace GPU quotas in HAMi's keys, on what claims really ask.
//!
//! HAMi users cap a namespace with a `ResourceQuota` naming `nvidia.com/gpu`, `gpumem` and
//! `gpucores` (bare, `requests.` or `limits.`; HAMi's units: cards, MiB, percent per card). Once
//! the webhook has turned those resources into claims, neither the API server's quota admission
//! nor HAMi's scheduler counts them any more, and a claim written directly never named them. So
//! every claim on the driver's classes is charged what it asks ([`charge`]), and a new one is
//! refused when it would take a namespace past a limit ([`Limits::check`]), with the API
//! server's own message shape. Pure: the webhook reads the quotas and the claims and keeps the
//! ledger that makes concurrent admissions exact.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::{CapacityRequirements, ResourceClaimSpec};

use crate::Quantity;
use crate::compat::{ClassFacts, CompatSettings, MAX_COUNT};
use crate::device::{CAPACITY_CORES, CAPACITY_MEMORY};

const MIB: u64 = 1 << 20;

/// What a quota key counts, in HAMi's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    /// Cards.
    Cards,
    /// Memory in MiB, summed over the cards.
    MemoryMib,
    /// Cores in percent of a card, summed over the cards.
    Cores,
}

/// What a claim takes of a namespace's quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Charge {
    /// Cards.
    pub cards: u64,
    /// MiB over all its cards.
    pub memory_mib: u64,
    /// Percent of a card over all its cards.
    pub cores: u64,
}

impl Charge {
    /// The amount in `dimension`.
    pub fn get(&self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Cards => self.cards,
            Dimension::MemoryMib => self.memory_mib,
            Dimension::Cores => self.cores,
        }
    }

    /// Both charges together (saturating: an unknown card size is charged as the most there is).
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            cards: self.cards.saturating_add(other.cards),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            cores: self.cores.saturating_add(other.cores),
        }
    }

    /// `count` cards of this charge each.
    fn times(self, count: u64) -> Self {
        Self {
            cards: self.cards.saturating_mul(count),
            memory_mib: self.memory_mib.saturating_mul(count),
            cores: self.cores.saturating_mul(count),
        }
    }

    /// The larger amount of each dimension: a prioritized list charges its largest choice.
    fn max(self, other: Self) -> Self {
        Self {
            cards: self.cards.max(other.cards),
            memory_mib: self.memory_mib.max(other.memory_mib),
            cores: self.cores.max(other.cores),
        }
    }
}

/// The quota keys enforced for `flavours`' resource names: each count, memory and cores name
/// bare, with `requests.` and with `limits.` (HAMi's users write both forms).
pub fn quota_keys(flavours: &[CompatSettings]) -> BTreeMap<String, Dimension> {
    let mut keys = BTreeMap::new();
    for f in flavours {
        for (name, dimension) in [
            (&f.count_resource, Dimension::Cards),
            (&f.memory_resource, Dimension::MemoryMib),
            (&f.cores_resource, Dimension::Cores),
        ] {
            for prefix in ["", "requests.", "limits."] {
                keys.insert(format!("{prefix}{name}"), dimension);
            }
        }
    }
    keys
}

/// What `spec` charges: every request on one of `classes` (a prioritized list at its largest
/// choice), its cards times their memory and cores. A request that names no memory takes a whole
/// card, charged as the largest card `facts` knows (all of it while none is known, so such a
/// claim waits until one is); no cores is a whole card's 100. `None` when no request is on
/// `classes`: the claim is not the driver's.
pub fn charge(spec: &ResourceClaimSpec, classes: &[String], facts: &ClassFacts) -> Option<Charge> {
    let ours = |class: &str| classes.iter().any(|c| c == class);
    let whole_card_mib = facts.largest_memory().map_or(u64::MAX, |b| b.div_ceil(MIB));
    let all_cards = if facts.max_cards_per_node > 0 { u64::from(facts.max_cards_per_node) } else { MAX_COUNT };
    let one = |mode: Option<&str>, count: Option<i64>, capacity: Option<&CapacityRequirements>| {
        let cards = match mode {
            Some("All") => all_cards,
            _ => count.map_or(1, |c| c.max(0).unsigned_abs()),
        };
        let asked = |name: &str| {
            capacity.and_then(|c| c.requests.as_ref()).and_then(|r| r.get(name)).and_then(|q| Quantity::parse(&q.0).ok())
        };
        let memory_mib = asked(CAPACITY_MEMORY)
            .map_or(whole_card_mib, |q| q.value_ceil().map_or(u64::MAX, |b| b.max(0).unsigned_abs().div_ceil(MIB)));
        let cores = asked(CAPACITY_CORES).map_or(100, |q| q.value_ceil().map_or(100, |c| c.clamp(0, 100).unsigned_abs()));
        Charge { cards: 1, memory_mib, cores }.times(cards)
    };
    let mut total: Option<Charge> = None;
    for request in spec.devices.as_ref().and_then(|d| d.requests.as_ref()).into_iter().flatten() {
        let this = if let Some(e) = request.exactly.as_ref().filter(|e| ours(&e.device_class_name)) {
            Some(one(e.allocation_mode.as_deref(), e.count, e.capacity.as_ref()))
        } else {
            request
                .first_available
                .iter()
                .flatten()
                .filter(|s| ours(&s.device_class_name))
                .map(|s| one(s.allocation_mode.as_deref(), s.count, s.capacity.as_ref()))
                .reduce(Charge::max)
        };
        if let Some(this) = this {
            total = Some(total.unwrap_or_default().plus(this));
        }
    }
    total
}

/// One limit of one ResourceQuota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The ResourceQuota's name.
    pub quota: String,
    /// The key as written (`limits.nvidia.com/gpumem`).
    pub key: String,
    /// What it counts.
    pub dimension: Dimension,
    /// The hard limit, in HAMi's units (a fraction rounded down).
    pub hard: u64,
}

/// The limits a namespace's quotas set on GPU keys, in quota then key order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits(pub Vec<Limit>);

impl Limits {
    /// The limits of `quotas` on `keys`; other keys (cpu, pods, ...) are the API server's.
    /// A value that is not a quantity is skipped: the API server refuses such a quota.
    pub fn from_quotas(quotas: &[ResourceQuota], keys: &BTreeMap<String, Dimension>) -> Self {
        let mut limits = Vec::new();
        let mut quotas: Vec<&ResourceQuota> = quotas.iter().collect();
        quotas.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for quota in quotas {
            let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
            for (key, value) in hard.into_iter().flatten() {
                let (Some(dimension), Ok(q)) = (keys.get(key), Quantity::parse(&value.0)) else { continue };
                let whole = q.nanos().div_euclid(1_000_000_000).clamp(0, i128::from(i64::MAX));
                limits.push(Limit {
                    quota: quota.metadata.name.clone().unwrap_or_default(),
                    key: key.clone(),
                    dimension: *dimension,
                    hard: u64::try_from(whole).unwrap_or(u64::MAX),
                });
            }
        }
        Self(limits)
    }

    /// Whether nothing is limited (then nothing needs charging).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `requested` fits beside `used` under every limit.
    ///
    /// # Errors
    /// [`Exceeded`] for the first quota (by name) with a key it would pass, naming each such key
    /// of that quota. A request of 0 in a dimension never exceeds it, even over a lowered limit.
    pub fn check(&self, used: Charge, requested: Charge) -> Result<(), Exceeded> {
        let over = |l: &&Limit| {
            let asked = requested.get(l.dimension);
            asked > 0 && used.get(l.dimension).saturating_add(asked) > l.hard
        };
        let Some(first) = self.0.iter().find(over) else { return Ok(()) };
        let keys: Vec<&Limit> = self.0.iter().filter(|l| l.quota == first.quota).filter(over).collect();
        Err(Exceeded {
            quota: first.quota.clone(),
            keys: keys.iter().map(|l| (l.key.clone(), requested.get(l.dimension), used.get(l.dimension), l.hard)).collect(),
        })
    }
}

/// A claim that would take a namespace past a quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// The ResourceQuota.
    pub quota: String,
    /// `(key, requested, used, hard)` for each key it would pass.
    pub keys: Vec<(String, u64, u64, u64)>,
}

impl fmt::Display for Exceeded {
    /// The API server's own shape: `exceeded quota: <name>, requested: <k>=<v>, used: ..., limited: ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys = self.keys.clone();
        keys.sort();
        let list = |pick: fn(&(String, u64, u64, u64)) -> u64| {
            keys.iter().map(|k| format!("{}={}", k.0, pick(k))).collect::<Vec<_>>().join(",")
        };
        write!(
            f,
            "exceeded quota: {}, requested: {}, used: {}, limited: {}",
            self.quota,
            list(|k| k.1),
            list(|k| k.2),
            list(|k| k.3)
        )
    }
}

impl std::error::Error for Exceeded {}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
