//! `usage`: how full each card is (memory, cores, shares allocated of the total), who holds its
//! shares, and the totals per node and for the cluster.

use std::collections::BTreeMap;
use std::io::Write;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::Serialize;
use vgpu_scheduling::Quantity;
use vgpu_scheduling::device::{CAPACITY_CORES, CAPACITY_MEMORY, CAPACITY_SHARES};

use crate::allocations::{AllocationError, shares_by_card, used};
use crate::cards::{CardError, cards, show};
use crate::live::{ClaimUse, Page};
use crate::table::Table;

/// Allocated of total, for one capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Amount {
    /// What allocated claims consume.
    pub allocated: Quantity,
    /// What the card (or the sum of cards) offers.
    pub total: Quantity,
}

impl Amount {
    const NONE: Self = Self { allocated: Quantity::ZERO, total: Quantity::ZERO };

    /// The sum, printed like `other` (a card's row: memory in binary units), since `self` may
    /// be the unit-less zero a total starts from.
    fn add(self, other: Self) -> Self {
        Self {
            allocated: other.allocated.checked_add(self.allocated).unwrap_or(self.allocated),
            total: other.total.checked_add(self.total).unwrap_or(self.total),
        }
    }

    fn show(&self, name: &str) -> String {
        format!("{}/{}", show(name, self.allocated), show(name, self.total))
    }
}

/// One card's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CardUsage {
    /// Node.
    pub node: String,
    /// Device name.
    pub device: String,
    /// `productName`.
    pub product: String,
    /// Memory in bytes.
    pub memory: Amount,
    /// Cores in percent of the card.
    pub cores: Amount,
    /// Shares used of the split count.
    pub shares: Amount,
    /// `healthy`, or the device's taints.
    pub health: String,
    /// Pods holding shares (`namespace/name`), or `namespace/claim` for a claim reserved for none.
    pub pods: Vec<String>,
    /// What the claims' processes use now, when asked for (`--live`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveCard>,
}

/// What the claims on one card use now, from its node's monitor.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveCard {
    /// Memory in use, summed over the claims, bytes.
    pub used: u64,
    /// Their limits, summed, bytes.
    pub limit: u64,
    /// SM utilisation, summed, percent of the card.
    pub sm_percent: f64,
    /// Each claim's figures.
    pub claims: Vec<ClaimUse>,
}

/// The sum over several cards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// The node, absent for the cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// How many cards.
    pub cards: usize,
    /// Memory.
    pub memory: Amount,
    /// Cores.
    pub cores: Amount,
    /// Shares.
    pub shares: Amount,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// One row per card, by node and device.
    pub cards: Vec<CardUsage>,
    /// Totals per node.
    pub nodes: Vec<Totals>,
    /// Totals of the cluster (or of the node asked for).
    pub cluster: Totals,
}

/// The inputs do not make a report.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// A slice holds a value the API would not store.
    #[error(transparent)]
    Slice(#[from] CardError),
    /// A claim holds a value the API would not store.
    #[error(transparent)]
    Claim(#[from] AllocationError),
}

/// The report for `driver`'s cards in `slices` (only `node`'s when given), with what `claims`
/// take of them.
///
/// # Errors
/// [`UsageError`] for values that do not parse.
pub fn usage_report(
    slices: &[ResourceSlice],
    claims: &[ResourceClaim],
    driver: &str,
    node: Option<&str>,
) -> Result<UsageReport, UsageError> {
    let shares = shares_by_card(claims, driver)?;
    let mut rows = Vec::new();
    for card in cards(slices, driver)?.into_iter().filter(|c| node.is_none_or(|n| c.node == n)) {
        let held = shares.get(&(card.pool.clone(), card.device.clone())).map(Vec::as_slice).unwrap_or_default();
        let used = used(&card, held);
        let amount = |name: &str| Amount {
            allocated: used.get(name).copied().unwrap_or(Quantity::ZERO),
            total: card.total(name).unwrap_or(Quantity::ZERO),
        };
        let mut pods: Vec<String> = held
            .iter()
            .flat_map(|s| if s.pods.is_empty() { vec![format!("{}/{}", s.namespace, s.claim)] } else { s.pods.clone() })
            .collect();
        pods.sort();
        pods.dedup();
        rows.push(CardUsage {
            node: card.node.clone(),
            device: card.device.clone(),
            product: card.product(driver),
            memory: amount(CAPACITY_MEMORY),
            cores: amount(CAPACITY_CORES),
            shares: amount(CAPACITY_SHARES),
            health: card.health(),
            pods,
            live: None,
        });
    }
    let mut per_node: BTreeMap<String, Totals> = BTreeMap::new();
    let empty = |node| Totals { node, cards: 0, memory: Amount::NONE, cores: Amount::NONE, shares: Amount::NONE };
    let mut cluster = empty(None);
    for row in &rows {
        for t in [per_node.entry(row.node.clone()).or_insert_with(|| empty(Some(row.node.clone()))), &mut cluster] {
            t.cards += 1;
            t.memory = t.memory.add(row.memory);
            t.cores = t.cores.add(row.cores);
            t.shares = t.shares.add(row.shares);
        }
    }
    Ok(UsageReport { cards: rows, nodes: per_node.into_values().collect(), cluster })
}

/// Adds what the claims use now (from the drivers' metrics pages) to each card of the report,
/// matched by the card's uuid: every card of a node whose page was read gets a figure, zero when
/// nothing runs on it; the others stay without.
///
/// # Errors
/// [`UsageError`] for slices that do not parse.
pub fn add_live(report: &mut UsageReport, slices: &[ResourceSlice], driver: &str, page: &Page) -> Result<(), UsageError> {
    let uuids: BTreeMap<(String, String), String> =
        cards(slices, driver)?.into_iter().map(|c| ((c.node.clone(), c.device.clone()), c.uuid(driver))).collect();
    for row in report.cards.iter_mut().filter(|r| page.nodes.contains(&r.node)) {
        let Some(uuid) = uuids.get(&(row.node.clone(), row.device.clone())) else { continue };
        let claims: Vec<ClaimUse> = page.uses.iter().filter(|u| &u.device_uuid == uuid).cloned().collect();
        row.live = Some(LiveCard {
            used: claims.iter().map(|c| c.used).fold(0, u64::saturating_add),
            limit: claims.iter().map(|c| c.limit).fold(0, u64::saturating_add),
            sm_percent: claims.iter().map(|c| c.sm_percent).fold(0.0, |a, b| a + b),
            claims,
        });
    }
    Ok(())
}

/// Adds the DeviceTaintRules that select each card to its HEALTH, with the rule's name (the
/// slice's own taints are the driver's; these are an administrator's).
///
/// # Errors
/// [`UsageError`] for slices that do not parse.
pub fn add_taint_rules(
    report: &mut UsageReport,
    slices: &[ResourceSlice],
    driver: &str,
    rules: &[crate::taint_rules::TaintRule],
) -> Result<(), UsageError> {
    let pools: BTreeMap<(String, String), String> =
        cards(slices, driver)?.into_iter().map(|c| ((c.node.clone(), c.device.clone()), c.pool.clone())).collect();
    for row in &mut report.cards {
        let Some(pool) = pools.get(&(row.node.clone(), row.device.clone())) else { continue };
        let shown: Vec<String> = rules.iter().filter(|r| r.selects(driver, pool, &row.device)).map(|r| r.shown()).collect();
        if shown.is_empty() {
            continue;
        }
        let own = (row.health != "healthy").then(|| row.health.clone());
        row.health = own.into_iter().chain(shown).collect::<Vec<_>>().join(",");
    }
    Ok(())
}

fn bytes(v: u64) -> String {
    show(CAPACITY_MEMORY, Quantity::from_bytes(v))
}

/// Writes the report as kubectl's aligned columns; `wide` adds the pods, live figures add
/// `USED` (memory in use of the claims' limits) and `SM` (utilisation).
///
/// # Errors
/// When `out` fails.
pub fn write_table(report: &UsageReport, wide: bool, out: &mut dyn Write) -> std::io::Result<()> {
    let mut header = vec!["NODE", "DEVICE", "PRODUCT", "MEMORY", "CORES", "SHARES", "HEALTH"];
    let live = report.cards.iter().any(|c| c.live.is_some());
    if live {
        header.extend(["USED", "SM"]);
    }
    if wide {
        header.push("PODS");
    }
    let mut table = Table::new(&header);
    let totals_row = |table: &mut Table, t: &Totals| {
        let cards = if t.cards == 1 { "1 card".to_owned() } else { format!("{} cards", t.cards) };
        let mut row = vec![
            t.node.clone().unwrap_or_else(|| "(cluster)".into()),
            "(total)".into(),
            cards,
            t.memory.show(CAPACITY_MEMORY),
            t.cores.show(CAPACITY_CORES),
            t.shares.show(CAPACITY_SHARES),
            String::new(),
        ];
        if live {
            row.extend([String::new(), String::new()]);
        }
        if wide {
            row.push(String::new());
        }
        table.row(row);
    };
    for node in &report.nodes {
        for c in report.cards.iter().filter(|c| Some(&c.node) == node.node.as_ref()) {
            let mut row = vec![
                c.node.clone(),
                c.device.clone(),
                c.product.clone(),
                c.memory.show(CAPACITY_MEMORY),
                c.cores.show(CAPACITY_CORES),
                c.shares.show(CAPACITY_SHARES),
                c.health.clone(),
            ];
            if live {
                match &c.live {
                    Some(l) => row.extend([format!("{}/{}", bytes(l.used), bytes(l.limit)), format!("{:.0}%", l.sm_percent)]),
                    None => row.extend(["-".to_owned(), "-".to_owned()]),
                }
            }
            if wide {
                row.push(if c.pods.is_empty() { "<none>".into() } else { c.pods.join(",") });
            }
            table.row(row);
        }
        totals_row(&mut table, node);
    }
    totals_row(&mut table, &report.cluster);
    table.write(out)
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
