use proptest::prelude::*;

use super::*;

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}

fn dev(name: &str) -> DeviceName {
    DeviceName::new(name).unwrap()
}

fn key(claim: &str, device: &str) -> ShareKey {
    ShareKey {
        claim: Uid::new(claim).unwrap(),
        request: "gpu".into(),
        device: dev(device),
        share: Some(Uid::new(format!("s-{claim}")).unwrap()),
    }
}

fn use_of(memory: &str, cores: &str) -> Consumption {
    Consumption::from([("memory".into(), q(memory)), ("cores".into(), q(cores)), ("shares".into(), q("1"))])
}

fn ledger() -> Ledger {
    Ledger::new(BTreeMap::from([(
        dev("hami-gpu-0"),
        use_of("15Gi", "100").into_iter().map(|(k, v)| (k.clone(), if k == "shares" { q("2") } else { v })).collect(),
    )]))
}

#[test]
fn two_halves_fit_the_third_is_refused_with_the_numbers() {
    let mut l = ledger();
    l.admit(key("a", "hami-gpu-0"), use_of("4Gi", "50")).unwrap();
    l.admit(key("b", "hami-gpu-0"), use_of("4Gi", "50")).unwrap();
    let err = l.admit(key("c", "hami-gpu-0"), use_of("1Gi", "0")).unwrap_err();
    assert_eq!(err.to_string(), "device hami-gpu-0: shares requested 1, only 0 of 2 free");
    assert_eq!(l.used(&dev("hami-gpu-0"))["memory"].to_string(), "8Gi");
}

#[test]
fn over_memory_names_device_capacity_requested_and_free() {
    let mut l = ledger();
    l.admit(key("a", "hami-gpu-0"), use_of("12Gi", "10")).unwrap();
    let err = l.admit(key("b", "hami-gpu-0"), use_of("4Gi", "10")).unwrap_err();
    assert_eq!(err.to_string(), "device hami-gpu-0: memory requested 4Gi, only 3Gi of 15Gi free");
}

#[test]
fn admit_is_idempotent_and_release_of_unknown_is_a_no_op() {
    let mut l = ledger();
    l.admit(key("a", "hami-gpu-0"), use_of("15Gi", "100")).unwrap();
    l.admit(key("a", "hami-gpu-0"), use_of("15Gi", "100")).unwrap();
    assert_eq!(l.share_keys().count(), 1);
    assert!(matches!(l.admit(key("a", "hami-gpu-0"), use_of("1Gi", "1")), Err(AdmitError::Conflict { .. })));
    assert!(!l.release(&key("zzz", "hami-gpu-0")));
    assert!(l.release(&key("a", "hami-gpu-0")));
    assert_eq!(l.release_claim(&Uid::new("a").unwrap()), 0);
}

#[test]
fn unknown_devices_capacities_and_negative_amounts_are_refused() {
    let mut l = ledger();
    assert_eq!(
        l.admit(key("a", "hami-gpu-9"), use_of("1Gi", "1")).unwrap_err().to_string(),
        "device hami-gpu-9 does not exist on this node"
    );
    let mut odd = use_of("1Gi", "1");
    odd.insert("watts".into(), q("5"));
    assert!(matches!(l.admit(key("a", "hami-gpu-0"), odd), Err(AdmitError::UnknownCapacity { .. })));
    assert!(matches!(l.admit(key("a", "hami-gpu-0"), use_of("-1Gi", "1")), Err(AdmitError::Negative { .. })));
    assert_eq!(l.share_keys().count(), 0);
}

proptest! {
    #[test]
    fn whatever_is_admitted_never_exceeds_capacity(ops in prop::collection::vec((0u8..6, 1u64..8192, 0u64..60, any::<bool>()), 1..80)) {
        let total_mib = 15 * 1024;
        let mut l = Ledger::new(BTreeMap::from([(dev("g"), Consumption::from([
            ("memory".into(), Quantity::from_bytes(total_mib << 20)), ("cores".into(), q("100"))]))]));
        for (claim, mib, cores, release) in ops {
            let k = ShareKey { claim: Uid::new(format!("c{claim}")).unwrap(), request: "gpu".into(), device: dev("g"), share: None };
            if release {
                l.release(&k);
            } else {
                let _ = l.admit(k, Consumption::from([("memory".into(), Quantity::from_bytes(mib << 20)), ("cores".into(), Quantity::from_int(i64::try_from(cores).unwrap(), crate::Format::DecimalSI))]));
            }
            let used = l.used(&dev("g"));
            prop_assert!(used.get("memory").is_none_or(|m| m.as_u64_exact().unwrap() <= total_mib << 20));
            prop_assert!(used.get("cores").is_none_or(|c| c.value_ceil().unwrap() <= 100));
        }
    }
}

proptest! {
    #[test]
    fn the_totals_kept_are_the_sum_of_the_shares_admitted(ops in prop::collection::vec((0u8..8, 0u8..2, 1u64..4096, 0u8..3), 1..120)) {
        let mut l = Ledger::new(BTreeMap::from([
            (dev("g0"), Consumption::from([("memory".into(), Quantity::from_bytes(16 << 30))])),
            (dev("g1"), Consumption::from([("memory".into(), Quantity::from_bytes(16 << 30))])),
        ]));
        let mut model: BTreeMap<ShareKey, u64> = BTreeMap::new();
        for (claim, card, mib, op) in ops {
            let claim = Uid::new(format!("c{claim}")).unwrap();
            let k = ShareKey { claim: claim.clone(), request: format!("r{card}"), device: dev(&format!("g{card}")), share: None };
            match op {
                0 => {
                    if l.admit(k.clone(), Consumption::from([("memory".into(), Quantity::from_bytes(mib << 20))])).is_ok() {
                        model.entry(k).or_insert(mib << 20);
                    }
                }
                1 => {
                    prop_assert_eq!(l.release(&k), model.remove(&k).is_some());
                }
                _ => {
                    let had = model.keys().filter(|m| m.claim == claim).count();
                    model.retain(|m, _| m.claim != claim);
                    prop_assert_eq!(l.release_claim(&claim), had);
                }
            }
            for card in ["g0", "g1"] {
                let want: u64 = model.iter().filter(|(m, _)| m.device.as_str() == card).map(|(_, b)| b).sum();
                let got = l.used(&dev(card)).get("memory").map_or(0, |q| q.as_u64_exact().unwrap());
                prop_assert_eq!(got, want, "card {}", card);
            }
            prop_assert_eq!(l.share_keys().count(), model.len());
        }
    }
}

#[test]
fn two_requests_of_one_claim_on_one_device_are_two_shares() {
    let mut l = ledger();
    let first = ShareKey { claim: Uid::new("a").unwrap(), request: "r1".into(), device: dev("hami-gpu-0"), share: None };
    let second = ShareKey { request: "r2".into(), ..first.clone() };
    l.admit(first, use_of("4Gi", "10")).unwrap();
    l.admit(second, use_of("4Gi", "10")).unwrap();
    let used = l.used(&dev("hami-gpu-0"));
    assert_eq!((used["memory"].to_string(), used["shares"].to_string()), ("8Gi".into(), "2".into()));
}

#[test]
fn restored_shares_count_even_past_capacity_and_block_new_ones() {
    let mut l = ledger();
    // Prepared under a larger configuration: 2 x 10Gi on what is now a 15Gi card.
    assert!(l.restore(key("a", "hami-gpu-0"), use_of("10Gi", "10")).is_none());
    let over = l.restore(key("b", "hami-gpu-0"), use_of("10Gi", "10")).unwrap();
    assert!(over.to_string().contains("memory requested 10Gi, only 5Gi of 15Gi free"), "{over}");
    assert_eq!(l.used(&dev("hami-gpu-0"))["memory"].to_string(), "20Gi");
    assert_eq!(l.overcommitted(), vec![(dev("hami-gpu-0"), "memory".to_owned())]);
    // Restoring the same share again changes nothing and is not counted twice.
    assert!(l.restore(key("a", "hami-gpu-0"), use_of("10Gi", "10")).is_none());
    assert_eq!(l.used(&dev("hami-gpu-0"))["memory"].to_string(), "20Gi");
    // Nothing is free while the device is over, not even a tiny share.
    let err = l.admit(key("c", "hami-gpu-0"), use_of("1Mi", "0")).unwrap_err();
    assert!(matches!(err, AdmitError::OverCapacity { .. }), "{err}");
    // Releasing one brings it back under; the ledger is the sum of what remains.
    l.release_claim(&Uid::new("b").unwrap());
    assert!(l.overcommitted().is_empty());
    assert_eq!(l.used(&dev("hami-gpu-0"))["memory"].to_string(), "10Gi");
}
