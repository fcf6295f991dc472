#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use serde_json::json;
use vgpu_scheduling::compat::{CardModel, FlavourOptions, flavours};
use vgpu_scheduling::quota::quota_keys;

use super::*;

const CLASS: &str = "hami-core-gpu.project-hami.io";

/// An API server in memory: quotas, claims, and a ledger written only at the version read.
#[derive(Default)]
struct Memory {
    quotas: Vec<ResourceQuota>,
    state: Mutex<(Vec<ResourceClaim>, Ledger, u64)>,
}

impl QuotaStore for Arc<Memory> {
    async fn quotas(&self, _: &str) -> Result<Vec<ResourceQuota>, AdmitError> {
        tokio::task::yield_now().await;
        Ok(self.quotas.clone())
    }
    async fn claims(&self, _: &str) -> Result<Vec<ResourceClaim>, AdmitError> {
        tokio::task::yield_now().await;
        Ok(self.state.lock().unwrap().0.clone())
    }
    async fn ledger(&self, _: &str) -> Result<Ledger, AdmitError> {
        tokio::task::yield_now().await;
        Ok(self.state.lock().unwrap().1.clone())
    }
    async fn write_ledger(&self, _: &str, ledger: &Ledger) -> Result<bool, AdmitError> {
        tokio::task::yield_now().await;
        let mut state = self.state.lock().unwrap();
        if state.1.version != ledger.version {
            return Ok(false);
        }
        state.2 += 1;
        state.1 = Ledger { version: Some(state.2.to_string()), reservations: ledger.reservations.clone() };
        Ok(true)
    }
}

fn claim(mib: u64, reservation: Option<&str>) -> ResourceClaim {
    let annotations = reservation.map(|id| json!({RESERVATION_ANNOTATION: id})).unwrap_or(json!({}));
    serde_json::from_value(json!({
        "metadata": {"name": "c", "annotations": annotations},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS,
            "capacity": {"requests": {"memory": (mib << 20).to_string(), "cores": "10"}}}}]}},
    }))
    .unwrap()
}

fn memory_with(hard: serde_json::Value) -> Arc<Memory> {
    let quota = serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"hard": hard}})).unwrap();
    Arc::new(Memory { quotas: vec![quota], ..Default::default() })
}

fn inputs() -> (BTreeMap<String, Dimension>, Vec<String>, ClassFacts) {
    let facts = ClassFacts::new([CardModel { product_name: "Tesla T4".into(), memory_bytes: 15 << 30 }], 1);
    (quota_keys(&flavours(None, &FlavourOptions::default())), vec![CLASS.to_owned()], facts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_admissions_never_pass_a_limit_together() {
    for _ in 0..20 {
        let store = memory_with(json!({"limits.nvidia.com/gpumem": "5000"}));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let (keys, classes, facts) = inputs();
                    let c = claim(1000, None);
                    let outcome = check_claim(&store, "ns", &c, (&keys, &classes, &facts), false, 100).await.unwrap().outcome;
                    if let QuotaOutcome::Reserved(id) = &outcome {
                        // The API server stores the admitted claim, with its reservation.
                        store.state.lock().unwrap().0.push(claim(1000, Some(id)));
                    }
                    matches!(outcome, QuotaOutcome::Reserved(_))
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += usize::from(t.await.unwrap());
        }
        assert_eq!(admitted, 5);
    }
}

#[tokio::test]
async fn stored_claims_count_once_deleted_ones_and_lapsed_reservations_not_at_all() {
    let store = memory_with(json!({"limits.nvidia.com/gpumem": "2000"}));
    let (keys, classes, facts) = inputs();
    let check = |c: ResourceClaim, now| {
        let (store, keys, classes, facts) = (store.clone(), keys.clone(), classes.clone(), facts.clone());
        async move { check_claim(&store, "ns", &c, (&keys, &classes, &facts), false, now).await.unwrap().outcome }
    };
    let QuotaOutcome::Reserved(first) = check(claim(1500, None), 100).await else { panic!() };
    // Not stored yet: its reservation counts.
    let QuotaOutcome::Exceeded(e) = check(claim(1500, None), 101).await else { panic!() };
    assert!(
        e.to_string()
            .starts_with("exceeded quota: gpu, requested: limits.nvidia.com/gpumem=1500, used: limits.nvidia.com/gpumem=1500"),
        "{e}"
    );
    // Stored: counted once, as the claim (its reservation is dropped).
    store.state.lock().unwrap().0.push(claim(1500, Some(&first)));
    assert!(matches!(check(claim(1500, None), 102).await, QuotaOutcome::Exceeded(_)));
    assert!(matches!(check(claim(500, None), 103).await, QuotaOutcome::Reserved(_)));
    assert!(!store.state.lock().unwrap().1.reservations.contains_key(&first));
    // Deleted, and the 500's reservation lapsed (its claim never stored): room for 2000.
    store.state.lock().unwrap().0.clear();
    assert!(matches!(check(claim(2000, None), 103 + RESERVATION_TTL.as_secs()).await, QuotaOutcome::Reserved(_)));
    // A dry run reserves nothing; a claim on another class, or a namespace without GPU quota,
    // is not charged.
    let before = store.state.lock().unwrap().1.clone();
    let dry = check_claim(&store, "ns", &claim(1, None), (&keys, &classes, &facts), true, 200).await.unwrap().outcome;
    assert!(matches!(dry, QuotaOutcome::Reserved(_)));
    assert_eq!(store.state.lock().unwrap().1, before);
    let (big, others) = (claim(99999, None), [String::from("other")]);
    let other = check_claim(&store, "ns", &big, (&keys, &others, &facts), false, 200).await.unwrap().outcome;
    assert!(matches!(other, QuotaOutcome::Unlimited));
    let free = memory_with(json!({"cpu": "4"}));
    assert!(matches!(
        check_claim(&free, "ns", &claim(99999, None), (&keys, &classes, &facts), false, 200).await.unwrap().outcome,
        QuotaOutcome::Unlimited
    ));
}

#[test]
fn the_ledger_round_trips_through_configmap_data_and_skips_foreign_entries() {
    let mut reservations = BTreeMap::new();
    reservations.insert("a1".to_owned(), Reservation { charge: Charge { cards: 1, memory_mib: 10, cores: 5 }, at: 7 });
    let mut data = ledger_data(&Ledger { version: None, reservations: reservations.clone() });
    data.insert("junk".into(), "{not json".into());
    assert_eq!(ledger_from_data(&data), reservations);
    assert_eq!(new_id().unwrap().len(), 32);
    assert_ne!(new_id().unwrap(), new_id().unwrap());
}
