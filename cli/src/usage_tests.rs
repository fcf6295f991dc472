#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::test_fixtures::{DRIVER, Lcg, allocated, claim, device, slice, typed};

const MIB: u64 = 1 << 20;

fn slices() -> Vec<ResourceSlice> {
    vec![
        slice(
            "node-a",
            vec![device("hami-gpu-0", "NVIDIA GeForce RTX 3060", 12288, 10), device("hami-gpu-1", "Tesla T4", 15360, 4)],
        ),
        slice("node-b", vec![device("hami-gpu-0", "NVIDIA A100", 40960, 10)]),
    ]
}

#[test]
fn source_document_000_shows_6000mi_of_12gi_and_the_pods() {
    let claims = typed(vec![
        allocated(claim("c1", &[]), "node-a", "hami-gpu-0", &[("memory", "3000Mi"), ("cores", "30"), ("shares", "1")], "p1"),
        allocated(claim("c2", &[]), "node-a", "hami-gpu-0", &[("memory", "3000Mi"), ("cores", "30"), ("shares", "1")], "p2"),
        claim("c3", &[("memory", "9000Mi"), ("cores", "30")]),
    ]);
    let report = usage_report(&slices(), &claims, DRIVER, Some("node-a")).unwrap();
    assert_eq!(report.cards.len(), 2, "--node leaves out node-b");
    let mut out = Vec::new();
    write_table(&report, true, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NODE", "DEVICE", "PRODUCT", "MEMORY", "CORES", "SHARES", "HEALTH", "PODS"]
    );
    let row: Vec<&str> = lines[1].split("   ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        row,
        ["node-a", "hami-gpu-0", "NVIDIA GeForce RTX 3060", "6000Mi/12Gi", "60/100", "2/10", "healthy", "default/p1,default/p2"]
    );
    // Aligned: every column starts at the header's offset.
    let at = |line: &str, cell: &str| line.find(cell).unwrap();
    assert_eq!(at(lines[0], "MEMORY"), at(lines[1], "6000Mi/12Gi"));
    assert_eq!(at(lines[0], "MEMORY"), at(lines[2], "0/15Gi"));
    assert!(lines.iter().any(|l| l.starts_with("node-a") && l.contains("(total)") && l.contains("6000Mi/27Gi")), "{text}");
    assert!(lines.last().unwrap().starts_with("(cluster)"), "{text}");
}

/// The rule on random loads: each card's allocated figure is the exact sum of the consumed
/// capacity of the allocated claims of our driver on it (other drivers and pending claims add
/// nothing), and node and cluster totals are the sums of their rows.
#[test]
fn figures_are_exact_sums_and_totals_add_up() {
    let mut rng = Lcg(42);
    let cards = [("node-a", "hami-gpu-0"), ("node-a", "hami-gpu-1"), ("node-b", "hami-gpu-0")];
    for round in 0..50 {
        let mut expected: BTreeMap<(&str, &str), (u64, u64, u64)> = BTreeMap::new();
        let mut claims = Vec::new();
        for i in 0..rng.below(30) {
            let (node, dev) = cards[usize::try_from(rng.below(3)).unwrap()];
            let bytes = (1 + rng.below(4096)) * MIB + rng.below(2) * 512;
            let cores = rng.below(101);
            let c = allocated(
                claim(&format!("c{round}-{i}"), &[]),
                node,
                dev,
                &[("memory", &bytes.to_string()), ("cores", &cores.to_string()), ("shares", "1")],
                &format!("p{i}"),
            );
            match rng.below(5) {
                0 => {
                    let mut other = c;
                    other["status"]["allocation"]["devices"]["results"][0]["driver"] = json!("gpu.nvidia.com");
                    claims.push(other);
                }
                1 => claims.push(claim(&format!("pending-{i}"), &[("memory", "1Gi")])),
                _ => {
                    let e = expected.entry((node, dev)).or_default();
                    *e = (e.0 + bytes, e.1 + cores, e.2 + 1);
                    claims.push(c);
                }
            }
        }
        let report = usage_report(&slices(), &typed(claims), DRIVER, None).unwrap();
        for row in &report.cards {
            let (bytes, cores, shares) = expected.get(&(row.node.as_str(), row.device.as_str())).copied().unwrap_or_default();
            assert_eq!(row.memory.allocated, Quantity::from_bytes(bytes), "{row:?}");
            assert_eq!(
                row.cores.allocated,
                Quantity::from_int(i64::try_from(cores).unwrap(), vgpu_scheduling::Format::DecimalSI)
            );
            assert_eq!(row.shares.allocated.as_u64_exact(), Some(shares));
        }
        for totals in report.nodes.iter().chain([&report.cluster]) {
            let rows: Vec<&CardUsage> =
                report.cards.iter().filter(|c| totals.node.as_ref().is_none_or(|n| *n == c.node)).collect();
            assert_eq!(totals.cards, rows.len());
            let sum = |f: fn(&CardUsage) -> Amount| {
                rows.iter().fold((0i128, 0i128), |(a, t), r| (a + f(r).allocated.nanos(), t + f(r).total.nanos()))
            };
            assert_eq!(sum(|r| r.memory), (totals.memory.allocated.nanos(), totals.memory.total.nanos()));
            assert_eq!(sum(|r| r.cores), (totals.cores.allocated.nanos(), totals.cores.total.nanos()));
            assert_eq!(sum(|r| r.shares), (totals.shares.allocated.nanos(), totals.shares.total.nanos()));
        }
        assert_eq!(report.cluster.memory.total, Quantity::parse("67Gi").unwrap());
    }
}

#[test]
fn health_shows_taints_and_json_keeps_exact_quantities() {
    let mut tainted = device("hami-gpu-0", "Tesla T4", 15360, 10);
    tainted["taints"] = json!([{"key": format!("{DRIVER}/unhealthy"), "value": "xid-79", "effect": "NoSchedule"}]);
    let claims = typed(vec![allocated(claim("c1", &[]), "n1", "hami-gpu-0", &[("memory", "4294967296"), ("cores", "50")], "p1")]);
    let report = usage_report(&[slice("n1", vec![tainted])], &claims, DRIVER, None).unwrap();
    assert_eq!(report.cards[0].health, format!("{DRIVER}/unhealthy=xid-79:NoSchedule"));
    let value = serde_json::to_value(&report).unwrap();
    assert_eq!(value["cards"][0]["memory"], json!({"allocated": "4Gi", "total": "15Gi"}));
    assert_eq!(value["cluster"]["cards"], 1);
    assert_eq!(value["cluster"]["memory"], json!({"allocated": "4Gi", "total": "15Gi"}), "totals print like the rows");
    let mut out = Vec::new();
    write_table(&report, false, &mut out).unwrap();
    assert!(String::from_utf8(out).unwrap().contains("4Gi/15Gi"), "bytes are shown in binary units");
}

/// An administrator's DeviceTaintRule shows on exactly the cards it selects, named, after the
/// driver's own taints.
#[test]
fn taint_rules_show_on_the_cards_they_select_with_their_name() {
    let mut tainted = device("hami-gpu-1", "Tesla T4", 15360, 4);
    tainted["taints"] = json!([{"key": format!("{DRIVER}/unhealthy"), "effect": "NoSchedule"}]);
    let slices = vec![
        slice("node-a", vec![device("hami-gpu-0", "NVIDIA GeForce RTX 3060", 12288, 10), tainted]),
        slice("node-b", vec![device("hami-gpu-0", "NVIDIA A100", 40960, 10)]),
    ];
    let rule = |name: &str, selector: serde_json::Value| {
        crate::taint_rules::TaintRule::parse(&json!({"metadata": {"name": name},
            "spec": {"deviceSelector": selector, "taint": {"key": "drain", "effect": "NoExecute"}}}))
        .unwrap()
    };
    let rules = [
        rule("one-card", json!({"driver": DRIVER, "pool": "node-a", "device": "hami-gpu-0"})),
        rule("node-a", json!({"pool": "node-a"})),
        rule("other-driver", json!({"driver": "gpu.nvidia.com"})),
    ];
    let mut report = usage_report(&slices, &[], DRIVER, None).unwrap();
    add_taint_rules(&mut report, &slices, DRIVER, &rules).unwrap();
    let health: Vec<(&str, &str, &str)> =
        report.cards.iter().map(|c| (c.node.as_str(), c.device.as_str(), c.health.as_str())).collect();
    let unhealthy = format!("{DRIVER}/unhealthy:NoSchedule,drain:NoExecute (rule node-a)");
    assert_eq!(
        health,
        [
            ("node-a", "hami-gpu-0", "drain:NoExecute (rule one-card),drain:NoExecute (rule node-a)"),
            ("node-a", "hami-gpu-1", unhealthy.as_str()),
            ("node-b", "hami-gpu-0", "healthy"),
        ]
    );
}

/// Live figures: every card of a node whose driver page was read gets the sum of its claims'
/// use (zero when none runs), matched by uuid; a node without a page keeps `-`.
#[test]
fn live_use_is_summed_per_card_of_the_nodes_read() {
    let report = || usage_report(&slices(), &[], DRIVER, None).unwrap();
    let page = crate::live::parse(
        r#"vgpu_dra_device_capacity{node="node-a",device="hami-gpu-0",uuid="x",capacity="memory"} 1
hami_vgpu_memory_used_bytes{namespace="ns",pod="p1",claim_uid="u1",device_uuid="GPU-hami-gpu-0-NVIDIA-GeForce-RTX-3060"} 1073741824
hami_vgpu_memory_limit_bytes{namespace="ns",pod="p1",claim_uid="u1",device_uuid="GPU-hami-gpu-0-NVIDIA-GeForce-RTX-3060"} 4294967296
hami_container_device_utilization_ratio{namespace="ns",pod="p1",claim_uid="u1",device_uuid="GPU-hami-gpu-0-NVIDIA-GeForce-RTX-3060"} 30
hami_vgpu_memory_used_bytes{namespace="ns",pod="p2",claim_uid="u2",device_uuid="GPU-hami-gpu-0-NVIDIA-GeForce-RTX-3060"} 536870912
hami_vgpu_memory_limit_bytes{namespace="ns",pod="p2",claim_uid="u2",device_uuid="GPU-hami-gpu-0-NVIDIA-GeForce-RTX-3060"} 1073741824
hami_container_device_utilization_ratio{namespace="ns",pod="p2",claim_uid="u2",device_uuid="GPU-hami-gpu-0-NVIDIA-GeForce-RTX-3060"} 12.5
"#,
    );
    let mut live = report();
    add_live(&mut live, &slices(), DRIVER, &page).unwrap();
    let rtx = live.cards[0].live.as_ref().unwrap();
    assert_eq!((rtx.used, rtx.limit, rtx.claims.len()), (1_610_612_736, 5 << 30, 2));
    assert!((rtx.sm_percent - 42.5).abs() < 1e-9);
    assert_eq!(live.cards[1].live.as_ref().unwrap().used, 0, "node-a's idle T4 is read, and zero");
    assert!(live.cards[2].live.is_none(), "node-b's page was not read");
    let mut out = Vec::new();
    write_table(&live, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0][7..], ["USED", "SM"], "{text}");
    assert_eq!(lines[1][lines[1].len() - 2..], ["1536Mi/5Gi", "42%"], "{text}");
    assert_eq!(lines[2][lines[2].len() - 2..], ["0/0", "0%"], "{text}");
    assert!(text.lines().any(|l| l.starts_with("node-b") && l.ends_with("-")), "{text}");
    // Without live figures the table is as before.
    let mut out = Vec::new();
    write_table(&report(), false, &mut out).unwrap();
    assert!(!String::from_utf8(out).unwrap().contains("USED"));
}
