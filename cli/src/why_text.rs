//! The `why` report as text for people: one block per claim, a table of cards per pending
//! request with every reason, and the limits of an allocated claim.

use std::io::Write;

use crate::table::Table;
use crate::why::{ClaimState, WhyReport};

/// Writes `report` as text.
///
/// # Errors
/// When `out` fails.
pub fn write_text(report: &WhyReport, out: &mut dyn Write) -> std::io::Result<()> {
    let status = match &report.node {
        Some(node) => format!("bound to node {node}"),
        None => "not scheduled".to_owned(),
    };
    writeln!(out, "Pod {}/{}: {status}", report.namespace, report.pod)?;
    if let Some(message) = &report.scheduler {
        writeln!(out, "Scheduler: {message}")?;
    }
    if report.claims.is_empty() {
        writeln!(out, "The pod has no resource claims.")?;
    }
    for claim in &report.claims {
        let name = claim.claim.as_deref().unwrap_or("<not created>");
        let state = match claim.state {
            ClaimState::Allocated => "allocated",
            ClaimState::Pending => "pending",
            ClaimState::Missing => "missing: the claim does not exist (yet)",
        };
        writeln!(out, "\nClaim {name} (pod claim {}): {state}", claim.pod_claim)?;
        if let Some(error) = &claim.error {
            writeln!(out, "  {error}")?;
        }
        if !claim.placements.is_empty() {
            let uuids = claim.placements.iter().any(|p| p.uuid.is_some());
            let mut header = vec!["REQUEST", "NODE", "DEVICE", "CONSUMED"];
            if uuids {
                header.push("UUID");
            }
            let mut table = Table::new(&header);
            for p in &claim.placements {
                let consumed: Vec<String> = p.consumed.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let mut row = vec![p.request.clone(), p.node.clone(), p.device.clone(), consumed.join(", ")];
                if uuids {
                    row.push(p.uuid.clone().unwrap_or_else(|| "-".into()));
                }
                table.row(row);
            }
            indent(&table, out)?;
        }
        if !claim.limits.is_empty() {
            let env: Vec<String> = claim.limits.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let whose = if claim.prepared { "prepared, as the driver wrote them" } else { "what the driver will write" };
            writeln!(out, "  Limits ({whose}): {}", env.join(" "))?;
        }
        for request in &claim.requests {
            let asks: Vec<String> = request.asks.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let count = match request.count {
                Some(1) => String::new(),
                Some(n) => format!(", {n} cards"),
                None => ", all matching cards".to_owned(),
            };
            let asks = if asks.is_empty() { "the class defaults".to_owned() } else { asks.join(", ") };
            writeln!(out, "  Request {} (class {}): asks {asks}{count}", request.request, request.class)?;
            if request.cards.is_empty() {
                writeln!(out, "    no device of the driver is published")?;
                continue;
            }
            let mut table = Table::new(&["NODE", "DEVICE", "CONSUMES", "WHY NOT"]);
            for card in &request.cards {
                let consumes: Vec<String> = card.consumes.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let why = if card.reasons.is_empty() {
                    "fits".to_owned()
                } else {
                    card.reasons.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                };
                table.row(vec![card.node.clone(), card.device.clone(), consumes.join(", "), why]);
            }
            indent(&table, out)?;
        }
    }
    Ok(())
}

fn indent(table: &Table, out: &mut dyn Write) -> std::io::Result<()> {
    let mut buf = Vec::new();
    table.write(&mut buf)?;
    for line in String::from_utf8_lossy(&buf).lines() {
        writeln!(out, "    {line}")?;
    }
    Ok(())
}
