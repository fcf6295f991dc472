use serde_json::json;

use super::*;
use crate::compat::{CardModel, FlavourOptions, flavours};

const CLASS: &str = "hami-core-gpu.project-hami.io";

fn spec(requests: serde_json::Value) -> ResourceClaimSpec {
    serde_json::from_value(json!({"devices": {"requests": requests}})).unwrap()
}

fn t4() -> ClassFacts {
    ClassFacts::new([CardModel { product_name: "Tesla T4".into(), memory_bytes: 15 << 30 }], 2)
}

fn classes() -> Vec<String> {
    vec![CLASS.to_owned()]
}

fn quota(name: &str, hard: serde_json::Value) -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"hard": hard}})).unwrap()
}

fn keys() -> BTreeMap<String, Dimension> {
    quota_keys(&flavours(None, &FlavourOptions::default()))
}

#[test]
fn a_claim_is_charged_its_cards_times_their_memory_and_cores() {
    let two = spec(json!([{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": 2,
        "capacity": {"requests": {"memory": (1500u64 << 20).to_string(), "cores": "30"}}}}]));
    assert_eq!(charge(&two, &classes(), &t4()), Some(Charge { cards: 2, memory_mib: 3000, cores: 60 }));
    // No memory: a whole card of the largest model; no cores: a whole card's 100.
    let whole = spec(json!([{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]));
    assert_eq!(charge(&whole, &classes(), &t4()), Some(Charge { cards: 1, memory_mib: 15360, cores: 100 }));
    assert_eq!(charge(&whole, &classes(), &ClassFacts::default()).unwrap().memory_mib, u64::MAX, "unknown: the most");
    // A prioritized list charges its largest choice; two requests add up.
    let listed = spec(json!([
        {"name": "a", "firstAvailable": [
            {"name": "x", "deviceClassName": CLASS, "capacity": {"requests": {"memory": "1Gi", "cores": "50"}}},
            {"name": "y", "deviceClassName": CLASS, "count": 2, "capacity": {"requests": {"memory": "2Gi", "cores": "10"}}}]},
        {"name": "b", "exactly": {"deviceClassName": CLASS, "capacity": {"requests": {"memory": "1Mi", "cores": "0"}}}},
    ]));
    assert_eq!(charge(&listed, &classes(), &t4()), Some(Charge { cards: 3, memory_mib: 4097, cores: 50 }));
    // All the node's cards; other classes are not ours.
    let all = spec(json!([{"name": "gpu", "exactly": {"deviceClassName": CLASS, "allocationMode": "All",
        "capacity": {"requests": {"memory": "1Gi", "cores": "10"}}}}]));
    assert_eq!(charge(&all, &classes(), &t4()), Some(Charge { cards: 2, memory_mib: 2048, cores: 20 }));
    let theirs = spec(json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]));
    assert_eq!(charge(&theirs, &classes(), &t4()), None);
}

#[test]
fn hamis_keys_in_both_forms_and_both_name_sets_are_limits_others_are_not() {
    let quotas = [
        quota("b-gpu", json!({"requests.nvidia.com/gpucores": "50", "cpu": "4", "limits.volcano.sh/vgpu-memory": "2k"})),
        quota("a-gpu", json!({"limits.nvidia.com/gpumem": "2000", "nvidia.com/gpu": "2", "requests.nvidia.com/gpu": "bad"})),
    ];
    let limits = Limits::from_quotas(&quotas, &keys());
    let got: Vec<(&str, &str, Dimension, u64)> =
        limits.0.iter().map(|l| (l.quota.as_str(), l.key.as_str(), l.dimension, l.hard)).collect();
    assert_eq!(
        got,
        [
            ("a-gpu", "limits.nvidia.com/gpumem", Dimension::MemoryMib, 2000),
            ("a-gpu", "nvidia.com/gpu", Dimension::Cards, 2),
            ("b-gpu", "limits.volcano.sh/vgpu-memory", Dimension::MemoryMib, 2000),
            ("b-gpu", "requests.nvidia.com/gpucores", Dimension::Cores, 50),
        ]
    );
    assert!(Limits::from_quotas(&[quota("cpu", json!({"cpu": "4"}))], &keys()).is_empty());
}

#[test]
fn a_claim_past_a_limit_is_refused_in_the_api_servers_words() {
    let limits = Limits::from_quotas(&[quota("gpu", json!({"limits.nvidia.com/gpumem": "2000"}))], &keys());
    let c = |mib| Charge { cards: 1, memory_mib: mib, cores: 0 };
    assert!(limits.check(Charge::default(), c(1500)).is_ok());
    assert!(limits.check(c(500), c(1500)).is_ok(), "exactly at the limit fits");
    let e = limits.check(c(1500), c(1500)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "exceeded quota: gpu, requested: limits.nvidia.com/gpumem=1500, used: limits.nvidia.com/gpumem=1500, limited: limits.nvidia.com/gpumem=2000"
    );
    // 2 cards x 30 cores against 50.
    let cores = Limits::from_quotas(&[quota("c", json!({"requests.nvidia.com/gpucores": "50"}))], &keys());
    assert!(cores.check(Charge::default(), Charge { cards: 2, memory_mib: 2, cores: 60 }).is_err());
    assert!(cores.check(Charge::default(), Charge { cards: 2, memory_mib: 2, cores: 50 }).is_ok());
    // A limit lowered below what runs: nothing more in that dimension, other dimensions still.
    let both = Limits::from_quotas(&[quota("q", json!({"nvidia.com/gpu": "1", "limits.nvidia.com/gpumem": "100"}))], &keys());
    let e =
        both.check(Charge { cards: 3, memory_mib: 4000, cores: 0 }, Charge { cards: 1, memory_mib: 200, cores: 0 }).unwrap_err();
    assert_eq!(e.keys.len(), 2, "{e}");
}
