use serde_json::json;

use super::*;
use crate::compat::fixtures::*;
use crate::compat::mig_names::{default_mig_device_class, profiles_named};
use crate::compat::{ANNOTATION_NOUSE_UUID, ANNOTATION_USE_TYPE, ANNOTATION_USE_UUID};
use crate::mig::covering;

const D: &str = r#"device.attributes["hami-core-gpu.project-hami.io"]"#;
const C: &str = r#"device.capacity["hami-core-gpu.project-hami.io"]"#;
const MIG_CLASS: &str = "mig.hami-core-gpu.project-hami.io";

fn req(count: u32, memory: MemoryRequest) -> CardRequest {
    CardRequest { count, memory, cores: 0, priority: None }
}

fn spec_of(request: &CardRequest, selection: &Selection) -> serde_json::Value {
    let s = mig_claim_spec("cuda", "nvidia.com/gpumem", request, selection, &CompatSettings::hami()).unwrap();
    serde_json::to_value(s).unwrap()["spec"]["devices"].clone()
}

fn subrequest_ids(devices: &serde_json::Value) -> Vec<u32> {
    devices["requests"][0]["firstAvailable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().strip_prefix("mig-profile-").unwrap().parse().unwrap())
        .collect()
}

#[test]
fn the_mode_annotations_are_read_and_checked() {
    let mode = |pairs: &[(&str, &str)]| vgpu_mode(&annotations(pairs));
    assert_eq!(mode(&[]), Ok(VgpuMode::Unset));
    assert_eq!(mode(&[(ANNOTATION_VGPU_MODE, "mig")]), Ok(VgpuMode::Mig));
    assert_eq!(mode(&[(ANNOTATION_VGPU_MODE, " hami-core ")]), Ok(VgpuMode::HamiCore));
    assert_eq!(mode(&[(ANNOTATION_VOLCANO_VGPU_MODE, "mig")]), Ok(VgpuMode::Mig));
    assert_eq!(mode(&[(ANNOTATION_VGPU_MODE, "mig"), (ANNOTATION_VOLCANO_VGPU_MODE, "mig")]), Ok(VgpuMode::Mig));
    // HAMi compares the value as written, and serves MPS, which vgpu-dra does not: each is
    // refused naming the annotation, the value and the two accepted.
    for (key, value) in [
        (ANNOTATION_VGPU_MODE, "mps"),
        (ANNOTATION_VGPU_MODE, "MIG"),
        (ANNOTATION_VGPU_MODE, ""),
        (ANNOTATION_VGPU_MODE, "hami-core,mig"),
        (ANNOTATION_VOLCANO_VGPU_MODE, "mig\" || true"),
    ] {
        let e = mode(&[(key, value)]).unwrap_err();
        assert_eq!(e.reason(), "vgpu_mode", "{value}");
        let text = e.to_string();
        assert!(text.starts_with(&format!("annotation {key}: {value:?} is not a mode")), "{text}");
        assert!(text.contains(r#""hami-core""#) && text.contains(r#""mig""#), "{text}");
    }
    let e = mode(&[(ANNOTATION_VGPU_MODE, "mig"), (ANNOTATION_VOLCANO_VGPU_MODE, "hami-core")]).unwrap_err();
    assert_eq!(e.reason(), "vgpu_mode_conflict");
    assert_eq!(
        e.to_string(),
        r#"annotations nvidia.com/vgpu-mode: "mig" and volcano.sh/vgpu-mode: "hami-core" ask different modes; keep one"#
    );
}

#[test]
fn memory_becomes_profiles_smallest_first_each_holding_it() {
    let devices = spec_of(&req(1, MemoryRequest::Bytes(9000 * MIB)), &Selection::default());
    let subrequests: Vec<serde_json::Value> = [19, 15, 14, 9, 5, 0]
        .iter()
        .map(|id| {
            json!({
                "name": format!("mig-profile-{id}"),
                "allocationMode": "ExactCount",
                "count": 1,
                "deviceClassName": MIG_CLASS,
                "selectors": [{"cel": {"expression": format!(
                    r#"{D}.type == "hami-mig" && {D}.migProfileId == {id} && {C}.memory.compareTo(quantity("9000Mi")) >= 0"#
                )}}],
            })
        })
        .collect();
    assert_eq!(devices, json!({"requests": [{"name": "gpu", "firstAvailable": subrequests}]}));
    // Only profiles that hold the memory on some card are listed; a memory that is not whole
    // MiB is compared in bytes.
    assert_eq!(subrequest_ids(&spec_of(&req(1, MemoryRequest::Bytes(40_000 * MIB)), &Selection::default())), [9, 5, 0]);
    assert_eq!(subrequest_ids(&spec_of(&req(1, MemoryRequest::Bytes(100_000 * MIB)), &Selection::default())), [0]);
    let odd = spec_of(&req(1, MemoryRequest::Bytes(9000 * MIB + 1)), &Selection::default());
    let cel = odd["requests"][0]["firstAvailable"][0]["selectors"][0]["cel"]["expression"].as_str().unwrap();
    assert!(cel.ends_with(r#"memory.compareTo(quantity("9437184001")) >= 0"#), "{cel}");
}

/// On every catalogued model, the first subrequest a card of that model can serve is the
/// smallest profile of the model that holds the memory (ignoring `+me`), as `covering` orders
/// them: the order is right on each model even though the list is one for all.
#[test]
fn the_first_profile_each_model_can_serve_is_its_smallest_covering() {
    for model in crate::mig::models() {
        for mib in (0..=150_000).step_by(250) {
            let memory = if mib == 0 { MemoryRequest::WholeCard } else { MemoryRequest::Bytes(mib * MIB) };
            let listed = match mig_claim_spec("c", "m", &req(1, memory), &Selection::default(), &CompatSettings::hami()) {
                Ok(s) => subrequest_ids(&serde_json::to_value(s).unwrap()["spec"]["devices"]),
                Err(e) => {
                    assert_eq!(e.reason(), "mig_memory_too_large");
                    Vec::new()
                }
            };
            let serves = |id: u32| model.profile(id).is_some_and(|p| p.memory_mib() >= mib);
            let first = listed.into_iter().find(|id| serves(*id));
            let want = covering(model, mib, None).into_iter().find(|p| !p.media_extension()).map(|p| p.id());
            assert_eq!(first, want, "{} at {mib} MiB", model.name());
        }
    }
}

#[test]
fn no_memory_or_a_percentage_takes_the_smallest_profile_free() {
    for memory in [MemoryRequest::WholeCard, MemoryRequest::Percent(50)] {
        let devices = spec_of(&req(1, memory), &Selection::default());
        assert_eq!(subrequest_ids(&devices), [19, 15, 14, 9, 5, 0]);
        let cel = devices["requests"][0]["firstAvailable"][0]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert_eq!(cel, format!(r#"{D}.type == "hami-mig" && {D}.migProfileId == 19"#));
    }
}

#[test]
fn several_instances_are_on_distinct_cards() {
    let devices = spec_of(&req(2, MemoryRequest::Bytes(8000 * MIB)), &Selection::default());
    assert_eq!(
        devices["constraints"],
        json!([{"distinctAttribute": "hami-core-gpu.project-hami.io/parentUUID", "requests": ["gpu"]}])
    );
    assert!(devices["requests"][0]["firstAvailable"].as_array().unwrap().iter().all(|s| s["count"] == 2));
    assert!(spec_of(&req(1, MemoryRequest::Bytes(8000 * MIB)), &Selection::default()).get("constraints").is_none());
    assert!(devices.get("config").is_none(), "no HAMi-core configuration in a MIG instance");
}

#[test]
fn card_annotations_select_the_instances_card() {
    let selection = Selection::from_annotations(&annotations(&[
        (ANNOTATION_USE_TYPE, "A100"),
        (ANNOTATION_USE_UUID, r#"GPU-1"] || true || [""#),
        (ANNOTATION_NOUSE_UUID, "GPU-2"),
    ]));
    let devices = spec_of(&req(1, MemoryRequest::Bytes(8000 * MIB)), &selection);
    let expected = selection.selectors_on("hami-core-gpu.project-hami.io", "parentUUID");
    for sub in devices["requests"][0]["firstAvailable"].as_array().unwrap() {
        let cel: Vec<&str> =
            sub["selectors"].as_array().unwrap().iter().map(|s| s["cel"]["expression"].as_str().unwrap()).collect();
        assert_eq!(cel[1..], expected.iter().map(String::as_str).collect::<Vec<_>>()[..]);
    }
    assert!(expected[1].contains(&format!("{D}.parentUUID in ")) && !expected[1].contains(".uuid"), "{expected:?}");
    // A hostile UUID stays one literal: the selector keeps the shape of a harmless one.
    let hostile = Selection::from_annotations(&annotations(&[(ANNOTATION_USE_UUID, r#"GPU-1"] || true || [""#)]));
    let plain = Selection::from_annotations(&annotations(&[(ANNOTATION_USE_UUID, "x")]));
    let shape = |s: &Selection| cel_skeleton(&s.selectors_on("d", "parentUUID")[0]);
    assert_eq!(shape(&hostile).0, shape(&plain).0);
    assert_eq!(shape(&hostile).1.last().map(String::as_str), Some(r#"GPU-1"] || true || [""#));
}

#[test]
fn more_memory_than_any_instance_is_refused_naming_the_resource() {
    let e = mig_claim_spec(
        "cuda",
        "nvidia.com/gpumem",
        &req(1, MemoryRequest::Bytes(200_000 * MIB)),
        &Selection::default(),
        &CompatSettings::hami(),
    )
    .unwrap_err();
    assert_eq!(e.reason(), "mig_memory_too_large");
    let text = e.to_string();
    assert!(
        text.starts_with(r#"container "cuda": nvidia.com/gpumem: 209715200000 bytes is more than any MIG instance holds"#),
        "{text}"
    );
    assert!(text.contains(&(143_360 * MIB).to_string()), "{text}");
}

#[test]
fn profile_resources_name_catalogued_profiles() {
    assert_eq!(profiles_named("3g.20gb"), ["3g.20gb"]);
    assert_eq!(profiles_named("1g.10gb"), ["1g.10gb"]);
    assert_eq!(profiles_named("1g.18gb"), ["1g.18gb"]);
    // The 80 GB cards' full profile, as NVIDIA's device plugin rounds its memory.
    assert_eq!(profiles_named("7g.79gb"), ["7g.80gb"]);
    assert_eq!(profiles_named("1g.10gb.me"), ["1g.10gb+me"]);
    for unknown in ["1c.3g.20gb", "9g.99gb", "3g.20", "", "3g.20gb\" || true"] {
        assert!(profiles_named(unknown).is_empty(), "{unknown}");
    }
}

#[test]
fn profile_resources_become_one_request_each() {
    let instances = [
        MigInstances { resource: "nvidia.com/mig-3g.20gb".into(), profiles: vec!["3g.20gb"], count: 2 },
        MigInstances { resource: "nvidia.com/mig-7g.79gb".into(), profiles: vec!["7g.80gb"], count: 1 },
        MigInstances { resource: "nvidia.com/mig-7g.80gb".into(), profiles: vec!["7g.80gb"], count: 1 },
        MigInstances { resource: "nvidia.com/mig-1g.19gb".into(), profiles: vec!["1g.20gb", "1g.18gb"], count: 1 },
    ];
    let spec = instances_claim_spec(&instances, &Selection::default(), &CompatSettings::hami());
    let devices = serde_json::to_value(spec).unwrap()["spec"]["devices"].clone();
    let exactly = |name: &str, count: u32, cel: String| {
        json!({"name": name, "exactly": {
            "allocationMode": "ExactCount", "count": count, "deviceClassName": MIG_CLASS,
            "selectors": [{"cel": {"expression": cel}}],
        }})
    };
    assert_eq!(
        devices,
        json!({"requests": [
            exactly("mig-3g-20gb", 2, format!(r#"{D}.type == "hami-mig" && {D}.profile == "3g.20gb""#)),
            exactly("mig-7g-80gb", 1, format!(r#"{D}.type == "hami-mig" && {D}.profile == "7g.80gb""#)),
            exactly("mig-7g-80gb-2", 1, format!(r#"{D}.type == "hami-mig" && {D}.profile == "7g.80gb""#)),
            exactly("mig-1g-20gb", 1, format!(r#"{D}.type == "hami-mig" && {D}.profile in ["1g.20gb", "1g.18gb"]"#)),
        ]}),
    );
}

#[test]
fn the_mig_class_follows_the_class() {
    assert_eq!(default_mig_device_class("hami-core-gpu.project-hami.io"), MIG_CLASS);
    assert_eq!(CompatSettings::hami().mig_device_class, MIG_CLASS);
}

/// The `devices` of the claim an unannotated container gets with `unannotated_mig` on.
fn either_of(request: &CardRequest) -> serde_json::Value {
    let settings = CompatSettings { unannotated_mig: true, ..CompatSettings::hami() };
    let facts = crate::compat::ClassFacts::default();
    let s = either_claim_spec("cuda", "nvidia.com/gpumem", request, &Selection::default(), &settings, &facts).unwrap();
    serde_json::to_value(s).unwrap()["spec"]["devices"].clone()
}

fn shares_of(request: &CardRequest) -> serde_json::Value {
    let facts = crate::compat::ClassFacts::default();
    let s = crate::compat::claim::claim_spec("cuda", request, &Selection::default(), &CompatSettings::hami(), &facts).unwrap();
    serde_json::to_value(s).unwrap()["spec"]["devices"].clone()
}

#[test]
fn without_the_annotation_a_memory_asks_a_share_first_then_the_smallest_instance() {
    let request = CardRequest { count: 1, memory: MemoryRequest::Bytes(9000 << 20), cores: 30, priority: Some(1) };
    let either = either_of(&request);
    let shares = shares_of(&request);
    let options = either["requests"][0]["firstAvailable"].as_array().unwrap().clone();
    // The share is exactly what a shares-only claim asks, as the first alternative.
    let mut share = options[0].clone();
    assert_eq!(share["name"], "share");
    share.as_object_mut().unwrap().remove("name");
    assert_eq!(share, shares["requests"][0]["exactly"]);
    assert!(either["requests"][0].get("exactly").is_none());
    // Then the mig-mode list, unchanged, and the HAMi-core configuration of the request.
    let mig = spec_of(&request, &Selection::default());
    assert_eq!(options[1..], mig["requests"][0]["firstAvailable"].as_array().unwrap()[..]);
    assert_eq!(either["config"], shares["config"]);
    assert!(options.len() <= 8, "the API's limit of subrequests");
}

#[test]
fn without_the_annotation_what_an_instance_cannot_be_asks_shares_only() {
    for request in [
        // No memory: the whole card, which an instance is not.
        CardRequest { count: 1, memory: MemoryRequest::WholeCard, cores: 0, priority: None },
        // Two cards are kept apart by the card uuid, which instances do not carry.
        CardRequest { count: 2, memory: MemoryRequest::Bytes(4096 << 20), cores: 0, priority: None },
        // More than any instance holds.
        CardRequest { count: 1, memory: MemoryRequest::Bytes(200_000 << 20), cores: 0, priority: None },
    ] {
        assert_eq!(either_of(&request), shares_of(&request), "{request:?}");
    }
}
