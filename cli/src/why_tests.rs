#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;
use crate::test_fixtures::{DRIVER, allocated, claim, class, device, pod, slice, typed};
use crate::why_text::write_text;

fn report(pod: &Pod, claims: &[ResourceClaim], slices: &[ResourceSlice]) -> WhyReport {
    why_report(&WhyInputs {
        pod,
        claims,
        slices,
        classes: &[class()],
        driver: DRIVER,
        rounding: vgpu_scheduling::Rounding::Whole,
    })
    .unwrap()
}

fn text(r: &WhyReport) -> String {
    let mut out = Vec::new();
    write_text(r, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn doc_000() -> (Vec<ResourceSlice>, Vec<ResourceClaim>) {
    let taken = [("memory", "3000Mi"), ("cores", "30"), ("shares", "1")];
    (
        vec![slice("n1", vec![device("hami-gpu-0", "NVIDIA GeForce RTX 3060", 12288, 10)])],
        typed(vec![
            allocated(claim("c1", &[("memory", "3000Mi"), ("cores", "30")]), "n1", "hami-gpu-0", &taken, "p1"),
            allocated(claim("c2", &[("memory", "3000Mi"), ("cores", "30")]), "n1", "hami-gpu-0", &taken, "p2"),
            claim("c3", &[("memory", "9000Mi"), ("cores", "30")]),
        ]),
    )
}

#[test]
fn a_pending_claim_of_source_document_000_is_short_of_memory() {
    let (slices, claims) = doc_000();
    let r = report(&pod("p3", "c3"), &claims, &slices);
    assert_eq!(r.scheduler.as_deref(), Some("0/1 nodes are available: 1 cannot allocate all claims."));
    let c = &r.claims[0];
    assert_eq!((c.state, c.claim.as_deref()), (ClaimState::Pending, Some("c3")));
    let card = &c.requests[0].cards[0];
    assert_eq!(card.reasons.len(), 1, "{card:?}");
    assert!(matches!(&card.reasons[0], Reason::Short { capacity, short_by, .. } if capacity == "memory" && short_by == "2712Mi"));
    let out = text(&r);
    assert!(out.contains("Claim c3 (pod claim gpu): pending"), "{out}");
    assert!(out.contains("memory short by 2712Mi (asks 9000Mi, 6288Mi of 12Gi free)"), "{out}");
}

#[test]
fn an_allocated_claim_says_where_it_went_and_its_limits() {
    let (slices, claims) = doc_000();
    let r = report(&pod("p1", "c1"), &claims, &slices);
    let c = &r.claims[0];
    assert_eq!(c.state, ClaimState::Allocated);
    assert!(c.requests.is_empty(), "an allocated claim is never reported as blocked");
    assert_eq!(c.placements[0].node, "n1");
    assert_eq!(c.placements[0].consumed["memory"], "3000Mi");
    let env: Vec<String> = c.limits.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for want in ["CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "CUDA_DEVICE_SM_LIMIT_0=30", "CUDA_DEVICE_SM_LIMIT=30"] {
        assert!(env.contains(&want.to_owned()), "{want} missing from {env:?}");
    }
    assert!(!c.prepared);
    assert!(text(&r).contains("Limits (what the driver will write): CUDA_DEVICE_MEMORY_LIMIT_0=3000m"), "{}", text(&r));
}

#[test]
fn a_prepared_claim_shows_the_limits_its_driver_wrote_in_its_status() {
    let (slices, claims) = doc_000();
    let mut c1 = serde_json::to_value(&claims[0]).unwrap();
    let entry = |driver: &str, share: &str, memory: &str| {
        json!({"driver": driver, "pool": "n1", "device": "hami-gpu-0", "shareID": share,
            "data": {"uuid": "GPU-real", "cudaIndex": 0, "memoryLimit": memory, "smLimit": "30"}})
    };
    // Another driver's entry and one of another share are not this result's.
    c1["status"]["devices"] = json!([
        entry("other.example.com", "00000000-0000-0000-0000-000000000001", "1m"),
        entry(DRIVER, "00000000-0000-0000-0000-000000000009", "2m"),
    ]);
    let mut claims = claims.clone();
    claims[0] = serde_json::from_value(c1.clone()).unwrap();
    let r = report(&pod("p1", "c1"), &claims, &slices);
    assert!(!r.claims[0].prepared, "no entry of this share: still derived");
    assert!(r.claims[0].limits.contains(&("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "3000m".into())));

    // The driver's own entry: its figures win, shown as written.
    c1["status"]["devices"] = json!([entry(DRIVER, "00000000-0000-0000-0000-000000000001", "2999m")]);
    claims[0] = serde_json::from_value(c1).unwrap();
    let r = report(&pod("p1", "c1"), &claims, &slices);
    let c = &r.claims[0];
    assert!(c.prepared);
    assert_eq!(c.placements[0].uuid.as_deref(), Some("GPU-real"));
    assert!(c.limits.contains(&("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "2999m".into())), "{:?}", c.limits);
    assert!(c.limits.contains(&("NVIDIA_VISIBLE_DEVICES".into(), "GPU-real".into())), "{:?}", c.limits);
    let out = text(&r);
    assert!(out.contains("Limits (prepared, as the driver wrote them): CUDA_DEVICE_MEMORY_LIMIT_0=2999m"), "{out}");
    assert!(out.contains("GPU-real"), "{out}");
}

#[test]
fn a_third_claim_on_source_document_003s_t4_is_short_of_cores() {
    let taken = [("memory", "4Gi"), ("cores", "50"), ("shares", "1")];
    let slices = vec![slice("n1", vec![device("hami-gpu-0", "Tesla T4", 15360, 10)])];
    let claims = typed(vec![
        allocated(claim("a", &[]), "n1", "hami-gpu-0", &taken, "pa"),
        allocated(claim("b", &[]), "n1", "hami-gpu-0", &taken, "pb"),
        claim("c", &[("memory", "4Gi"), ("cores", "50")]),
    ]);
    let r = report(&pod("pc", "c"), &claims, &slices);
    let reasons: Vec<String> = r.claims[0].requests[0].cards[0].reasons.iter().map(ToString::to_string).collect();
    assert_eq!(reasons, ["cores short by 50 (asks 50, 0 of 100 free)"]);
}

#[test]
fn template_claims_are_found_by_status_or_by_owner_and_annotation() {
    let (slices, mut claims) = doc_000();
    let mut p: Pod = pod("p9", "unused");
    p.spec.as_mut().unwrap().resource_claims =
        serde_json::from_value(json!([{"name": "gpu", "resourceClaimTemplateName": "t"}])).unwrap();
    assert_eq!(report(&p, &claims, &slices).claims[0].state, ClaimState::Missing);
    let mut made = claim("p9-gpu-x7k2p", &[("memory", "1Gi"), ("cores", "10")]);
    made["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod", "name": "p9", "uid": "uid-p9"}]);
    made["metadata"]["annotations"] = json!({POD_CLAIM_NAME_ANNOTATION: "gpu"});
    claims.extend(typed(vec![made]));
    let r = report(&p, &claims, &slices);
    assert_eq!((r.claims[0].claim.as_deref(), r.claims[0].state), (Some("p9-gpu-x7k2p"), ClaimState::Pending));
    assert!(r.claims[0].requests[0].cards[0].fits(), "1Gi/10 fits beside 6000Mi/60");
    p.status.as_mut().unwrap().resource_claim_statuses =
        serde_json::from_value(json!([{"name": "gpu", "resourceClaimName": "c1"}])).unwrap();
    assert_eq!(report(&p, &claims, &slices).claims[0].state, ClaimState::Allocated, "the status wins");
}

#[test]
fn first_available_is_reported_per_subrequest_and_counts_need_distinct_cards() {
    let slices = vec![
        slice("n1", vec![device("hami-gpu-0", "Tesla T4", 15360, 10)]),
        slice("n2", vec![device("hami-gpu-0", "NVIDIA A100", 40960, 10)]),
    ];
    let model = |product: &str| format!("device.attributes[\"{DRIVER}\"].productName == \"{product}\"");
    let mut c = claim("c", &[]);
    c["spec"]["devices"] = json!({
        "requests": [{"name": "gpu", "firstAvailable": [
            {"name": "0-a100", "deviceClassName": DRIVER, "count": 2, "selectors": [{"cel": {"expression": model("NVIDIA A100")}}],
             "capacity": {"requests": {"memory": "20Gi", "cores": "50"}}},
            {"name": "1-t4", "deviceClassName": DRIVER, "selectors": [{"cel": {"expression": model("Tesla T4")}}],
             "capacity": {"requests": {"memory": "16Gi", "cores": "50"}}},
        ]}],
        "constraints": [{"requests": ["gpu"], "distinctAttribute": format!("{DRIVER}/uuid")}],
    });
    let mut p = pod("p", "c");
    p.spec.as_mut().unwrap().node_selector = Some([("kubernetes.io/hostname".to_owned(), "n2".to_owned())].into());
    let r = report(&p, &typed(vec![c]), &slices);
    let requests = &r.claims[0].requests;
    assert_eq!(requests.iter().map(|r| r.request.as_str()).collect::<Vec<_>>(), ["gpu/0-a100", "gpu/1-t4"]);
    let reasons = |i: usize, node: &str| -> Vec<String> {
        requests[i].cards.iter().find(|c| c.node == node).unwrap().reasons.iter().map(ToString::to_string).collect()
    };
    assert_eq!(reasons(0, "n2"), ["needs 2 distinct cards, only 1 have room"]);
    assert_eq!(reasons(0, "n1")[0], "the pod can only run on node n2");
    assert!(reasons(0, "n1")[1].starts_with("request selector does not match"));
    assert!(reasons(1, "n1").iter().any(|r| r == "memory 16Gi is above the card's maximum 15Gi"), "{:?}", reasons(1, "n1"));
    // Every card of a pending claim has a reason under every subrequest.
    assert!(requests.iter().all(|r| r.cards.iter().all(|c| !c.fits())));
}

#[test]
fn json_output_names_reasons_by_kind_with_amounts() {
    let (slices, claims) = doc_000();
    let value = serde_json::to_value(report(&pod("p3", "c3"), &claims, &slices)).unwrap();
    assert_eq!(
        value["claims"][0]["requests"][0]["cards"][0]["reasons"][0],
        json!({"reason": "short", "capacity": "memory", "shortBy": "2712Mi", "consumes": "9000Mi", "free": "6288Mi", "total": "12Gi"})
    );
    assert_eq!(value["claims"][0]["state"], "pending");
}

#[test]
fn requests_kept_apart_by_distinct_attribute_need_that_many_cards() {
    // The webhook's claim for two cards of a percentage: one request per card, kept on
    // different cards by distinctAttribute; only one card has room.
    let slices =
        vec![slice("n1", vec![device("hami-gpu-0", "Tesla T4", 15360, 10), device("hami-gpu-1", "Tesla T4", 15360, 10)])];
    let per_card = |name: &str| {
        json!({"name": name, "firstAvailable": [{"name": "0-tesla-t4", "deviceClassName": DRIVER,
            "capacity": {"requests": {"memory": "8Gi", "cores": "50"}}}]})
    };
    let mut c = claim("two", &[]);
    c["spec"]["devices"] = json!({
        "requests": [per_card("gpu-0"), per_card("gpu-1")],
        "constraints": [{"requests": ["gpu-0", "gpu-1"], "distinctAttribute": format!("{DRIVER}/uuid")}],
    });
    let mut claims = vec![c];
    claims.push(allocated(claim("big", &[]), "n1", "hami-gpu-1", &[("memory", "10Gi"), ("cores", "10"), ("shares", "1")], "pb"));
    let r = report(&pod("p", "two"), &typed(claims), &slices);
    let requests = &r.claims[0].requests;
    assert_eq!(requests.len(), 2);
    for request in requests {
        let free = request.cards.iter().find(|c| c.device == "hami-gpu-0").unwrap();
        assert_eq!(free.reasons, vec![Reason::TooFewCards { needed: 2, available: 1 }], "{request:?}");
        let full = request.cards.iter().find(|c| c.device == "hami-gpu-1").unwrap();
        assert!(matches!(&full.reasons[..], [Reason::Short { capacity, .. }] if capacity == "memory"));
    }
}

#[test]
fn a_missing_claim_gets_the_claim_controllers_latest_failure_for_it() {
    let missing = |pod_claim: &str| ClaimWhy {
        pod_claim: pod_claim.into(),
        claim: None,
        state: ClaimState::Missing,
        placements: Vec::new(),
        limits: Vec::new(),
        prepared: false,
        requests: Vec::new(),
        error: None,
    };
    let mut report = WhyReport {
        namespace: "ns".into(),
        pod: "p".into(),
        node: None,
        scheduler: None,
        claims: vec![missing("gpu"), missing("other")],
    };
    let event = |reason: &str, message: &str| k8s_openapi::api::core::v1::Event {
        reason: Some(reason.into()),
        message: Some(message.into()),
        ..Default::default()
    };
    let events = [
        event("FailedResourceClaimCreation", "PodResourceClaim gpu: old"),
        event("Scheduled", "PodResourceClaim gpu: not this one"),
        event("FailedResourceClaimCreation", "PodResourceClaim gpu: exceeded quota: gpu, requested: nvidia.com/gpu=1"),
        event("FailedResourceClaimCreation", "PodResourceClaim gpus: not this claim"),
    ];
    explain_missing(&mut report, &events);
    assert_eq!(
        report.claims[0].error.as_deref(),
        Some("the resource claim controller cannot create it: exceeded quota: gpu, requested: nvidia.com/gpu=1")
    );
    assert_eq!(report.claims[1].error, None);
}
