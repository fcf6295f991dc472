#![allow(clippy::unwrap_used)]

use k8s_openapi::api::resource::v1::DeviceToleration;
use vgpu_scheduling::{Consumption, Quantity};

use super::*;
use crate::cards::{Card, cards};
use crate::test_fixtures::{DRIVER, Lcg, class, device, slice};

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}

fn card(memory_mib: u64, split: u32) -> Card {
    cards(&[slice("n1", vec![device("hami-gpu-0", "NVIDIA GeForce RTX 3060", memory_mib, split)])], DRIVER).unwrap().remove(0)
}

fn ask(capacity: &[(&str, &str)]) -> Ask {
    Ask {
        name: "gpu".into(),
        class: DRIVER.into(),
        selectors: Vec::new(),
        capacity: capacity.iter().map(|(k, v)| ((*k).to_owned(), q(v))).collect(),
        count: Some(1),
        tolerations: Vec::new(),
    }
}

fn used(memory: &str, cores: &str, shares: &str) -> Consumption {
    Consumption::from([("memory".into(), q(memory)), ("cores".into(), q(cores)), ("shares".into(), q(shares))])
}

fn fit(a: &Ask, c: &Card, u: &Consumption) -> CardFit {
    check(a, Some(&class()), c, u, DRIVER, Rounding::Whole)
}

#[test]
fn memory_short_names_the_amount_missing_after_rounding() {
    // Source document 000: a 12 GiB card with 2 x 3000Mi taken; 9000Mi asked.
    let f = fit(&ask(&[("memory", "9000Mi"), ("cores", "30")]), &card(12288, 10), &used("6000Mi", "60", "2"));
    assert_eq!(
        f.reasons,
        vec![Reason::Short {
            capacity: "memory".into(),
            short_by: "2712Mi".into(),
            consumes: "9000Mi".into(),
            free: "6288Mi".into(),
            total: "12Gi".into()
        }]
    );
    assert_eq!(f.reasons[0].to_string(), "memory short by 2712Mi (asks 9000Mi, 6288Mi of 12Gi free)");
    // 1000Ki is rounded up to the card's 1Mi step before it is compared with what is free.
    let f = fit(&ask(&[("memory", "1000Ki"), ("cores", "0")]), &card(12288, 10), &used("12287Mi", "0", "0"));
    assert!(f.fits(), "{f:?}");
    assert_eq!(f.consumes["memory"], "1Mi");
    let f = fit(&ask(&[("memory", "1025Ki"), ("cores", "0")]), &card(12288, 10), &used("12287Mi", "0", "0"));
    assert!(matches!(&f.reasons[..], [Reason::Short { short_by, consumes, .. }] if short_by == "1Mi" && consumes == "2Mi"));
}

#[test]
fn cores_0_is_short_on_a_card_whose_cores_are_all_held_as_hami_refuses_it() {
    let f = fit(&ask(&[("memory", "1Gi"), ("cores", "0")]), &card(15360, 10), &used("4Gi", "100", "1"));
    assert_eq!(f.reasons.len(), 1, "{f:?}");
    assert_eq!(f.reasons[0].to_string(), "cores short by 1m (asks 1m, 0 of 100 free)");
    let f = fit(&ask(&[("memory", "1Gi"), ("cores", "0")]), &card(15360, 10), &used("4Gi", "99", "1"));
    assert!(f.fits(), "{f:?}");
    assert_eq!(f.consumes["cores"], "1m");
}

#[test]
fn cores_and_shares_are_checked_with_their_defaults() {
    // Source document 003: a T4 with two 4Gi/50 claims; memory has room, cores do not.
    let f = fit(&ask(&[("memory", "4Gi"), ("cores", "50")]), &card(15360, 10), &used("8Gi", "100", "2"));
    assert_eq!(f.reasons.len(), 1, "{f:?}");
    assert_eq!(f.reasons[0].to_string(), "cores short by 50 (asks 50, 0 of 100 free)");
    // A claim that names only memory takes the default of all cores.
    let f = fit(&ask(&[("memory", "1Gi")]), &card(15360, 10), &used("1Gi", "10", "1"));
    assert_eq!(f.consumes["cores"], "100");
    assert!(matches!(&f.reasons[..], [Reason::Short { capacity, short_by, .. }] if capacity == "cores" && short_by == "10"));
    let f = fit(&ask(&[("memory", "1Gi"), ("cores", "1")]), &card(15360, 2), &used("2Gi", "2", "2"));
    assert_eq!(f.reasons, vec![Reason::SharesExhausted { used: "2".into(), total: "2".into() }]);
}

#[test]
fn requests_above_a_cards_maximum_or_unknown_capacities_never_fit() {
    let f = fit(&ask(&[("memory", "13Gi"), ("cores", "10")]), &card(12288, 10), &Consumption::new());
    assert_eq!(f.reasons, vec![Reason::AboveMaximum { capacity: "memory".into(), consumes: "13Gi".into(), max: "12Gi".into() }]);
    let f = fit(&ask(&[("memory", "1Gi"), ("cores", "10"), ("bandwidth", "1")]), &card(12288, 10), &Consumption::new());
    assert_eq!(f.reasons, vec![Reason::UnknownCapacity { capacity: "bandwidth".into() }]);
}

#[test]
fn taints_stop_a_card_unless_tolerated() {
    let mut c = card(12288, 10);
    c.taints =
        serde_json::from_value(serde_json::json!([{"key": format!("{DRIVER}/unhealthy"), "effect": "NoSchedule"}])).unwrap();
    let mut a = ask(&[("memory", "1Gi"), ("cores", "10")]);
    assert_eq!(
        fit(&a, &c, &Consumption::new()).reasons,
        vec![Reason::Tainted { taint: format!("{DRIVER}/unhealthy:NoSchedule") }]
    );
    a.tolerations = vec![DeviceToleration { operator: Some("Exists".into()), ..Default::default() }];
    assert!(fit(&a, &c, &Consumption::new()).fits());
    a.tolerations = vec![DeviceToleration { key: Some("other".into()), operator: Some("Exists".into()), ..Default::default() }];
    assert!(!fit(&a, &c, &Consumption::new()).fits());
}

#[test]
fn selectors_that_do_not_match_or_cannot_be_evaluated_are_named() {
    let c = card(12288, 10);
    let mut a = ask(&[("memory", "1Gi"), ("cores", "10")]);
    a.selectors = vec![format!("device.attributes[\"{DRIVER}\"].productName == \"Tesla T4\"")];
    assert!(matches!(&fit(&a, &c, &Consumption::new()).reasons[..], [Reason::RequestSelector { .. }]));
    a.selectors = vec!["device.attributes[\"x\"].name.matches(\"^a\")".into()];
    let f = fit(&a, &c, &Consumption::new());
    assert!(f.fits(), "an expression that is not evaluated is no proof the card is blocked");
    assert_eq!(f.reasons[0].to_string(), "selector not evaluated: device.attributes[\"x\"].name.matches(\"^a\")");
    a.selectors.clear();
    let f = check(&a, None, &c, &Consumption::new(), DRIVER, Rounding::Whole);
    assert_eq!(f.reasons, vec![Reason::ClassMissing { class: DRIVER.into() }]);
    let mut other: k8s_openapi::api::resource::v1::DeviceClass = class();
    other.spec.selectors.as_mut().unwrap()[0].cel.as_mut().unwrap().expression = "device.driver == \"gpu.nvidia.com\"".into();
    assert!(matches!(
        &check(&a, Some(&other), &c, &Consumption::new(), DRIVER, Rounding::Whole).reasons[..],
        [Reason::ClassSelector { .. }]
    ));
}

/// The rule, on random cards, loads and requests: a card fits exactly when, for every capacity,
/// what is used plus the request rounded up to the step (memory 1Mi, defaults the whole card for
/// cores and one share) stays within the total and the maximum; and every reason names a
/// capacity that breaks it.
#[test]
fn a_card_fits_exactly_when_every_rounded_amount_has_room() {
    const MIB: u64 = 1 << 20;
    let mut rng = Lcg(7);
    for _ in 0..2000 {
        let total_mib = 1024 * (1 + rng.below(24));
        let split = 1 + u32::try_from(rng.below(10)).unwrap();
        let c = card(total_mib, split);
        let used_bytes = rng.below(total_mib + 1) * MIB;
        let used_cores = rng.below(101);
        let used_shares = rng.below(u64::from(split) + 1);
        let ask_bytes = 1 + rng.below((total_mib + 512) * MIB);
        let ask_cores = (rng.below(4) > 0).then(|| rng.below(101));
        let mut capacity = vec![("memory", ask_bytes.to_string())];
        if let Some(cores) = ask_cores {
            capacity.push(("cores", cores.to_string()));
        }
        let a = ask(&capacity.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
        let u = used(&used_bytes.to_string(), &used_cores.to_string(), &used_shares.to_string());
        let f = fit(&a, &c, &u);

        let rounded = ask_bytes.div_ceil(MIB) * MIB;
        let memory_ok = rounded <= total_mib * MIB && used_bytes + rounded <= total_mib * MIB;
        let cores_ok = used_cores + ask_cores.unwrap_or(100) <= 100;
        let shares_ok = used_shares < u64::from(split);
        assert_eq!(f.fits(), memory_ok && cores_ok && shares_ok, "{capacity:?} used {u:?} of {total_mib}Mi/{split}: {f:?}");
        for r in &f.reasons {
            let ok = match r {
                Reason::Short { capacity, .. } | Reason::AboveMaximum { capacity, .. } => {
                    (capacity == "memory" && !memory_ok) || (capacity == "cores" && !cores_ok)
                }
                Reason::SharesExhausted { .. } => !shares_ok,
                _ => false,
            };
            assert!(ok, "{r} is not a reason for {capacity:?} with {u:?}");
        }
        if let Some(Reason::Short { short_by, .. }) =
            f.reasons.iter().find(|r| matches!(r, Reason::Short { capacity, .. } if capacity == "memory"))
        {
            let short = used_bytes + rounded - total_mib * MIB;
            assert_eq!(q(short_by), Quantity::from_bytes(short), "memory short by");
        }
    }
}

#[test]
fn a_count_of_n_needs_n_cards_with_room() {
    let a = ask(&[("memory", "1Gi"), ("cores", "10")]);
    let empty = Consumption::new();
    let full = used("1Gi", "100", "1");
    let mut fits = vec![fit(&a, &card(12288, 10), &empty), fit(&a, &card(12288, 10), &full)];
    require_cards(&mut fits, 2);
    assert_eq!(fits[0].reasons, vec![Reason::TooFewCards { needed: 2, available: 1 }]);
    assert!(matches!(&fits[1].reasons[..], [Reason::Short { .. }]), "a blocked card keeps its own reason");
    let mut fits = vec![fit(&a, &card(12288, 10), &empty), fit(&a, &card(12288, 10), &empty)];
    require_cards(&mut fits, 2);
    assert!(fits.iter().all(CardFit::fits));
}
