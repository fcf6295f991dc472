#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use vgpu_scheduling::compat::Selection;

use super::*;
use crate::cards::cards;
use crate::test_fixtures::{DRIVER, device, slice};

fn t4() -> Value {
    cards(&[slice("n1", vec![device("hami-gpu-0", "Tesla T4", 15360, 10)])], DRIVER).unwrap()[0].cel_device(DRIVER)
}

fn eval(expr: &str) -> Result<bool, CelError> {
    eval_selector(expr, &t4())
}

#[test]
fn the_charts_class_selector_matches_our_cards_only() {
    let expr = format!("device.driver == \"{DRIVER}\" &&\n device.attributes[\"{DRIVER}\"].type == \"hami-gpu\"");
    assert_eq!(eval(&expr), Ok(true));
    let other = "device.driver == \"gpu.nvidia.com\"";
    assert_eq!(eval(other), Ok(false));
}

#[test]
fn the_webhooks_type_and_uuid_selectors_are_evaluated_like_hami() {
    let select = |key: &str, value: &str| {
        let annotations = BTreeMap::from([(key.to_owned(), value.to_owned())]);
        let selectors = Selection::from_annotations(&annotations).selectors(DRIVER);
        selectors.iter().map(|s| eval(s)).collect::<Result<Vec<bool>, _>>().unwrap().into_iter().all(|b| b)
    };
    // HAMi matches a case-insensitive substring of `NVIDIA-<model>`.
    assert!(select("nvidia.com/use-gputype", "nvidia-tesla"));
    assert!(select("nvidia.com/use-gputype", "A100,T4"));
    assert!(!select("nvidia.com/use-gputype", "A100"));
    assert!(!select("nvidia.com/nouse-gputype", "t4"));
    assert!(select("nvidia.com/nouse-gputype", "a100"));
    let uuid = "GPU-hami-gpu-0-Tesla-T4";
    assert!(select("nvidia.com/use-gpuuuid", &format!("GPU-x,{uuid}")));
    assert!(!select("nvidia.com/use-gpuuuid", "GPU-x"));
    assert!(!select("nvidia.com/nouse-gpuuuid", uuid));
}

#[test]
fn quantity_and_version_comparisons_follow_their_values() {
    let memory = format!("device.capacity[\"{DRIVER}\"].memory");
    assert_eq!(eval(&format!("{memory}.compareTo(quantity(\"15Gi\")) == 0")), Ok(true));
    assert_eq!(eval(&format!("{memory}.compareTo(quantity(\"16106127360\")) == 0")), Ok(true));
    assert_eq!(eval(&format!("{memory}.compareTo(quantity(\"16Gi\")) >= 0")), Ok(false));
    assert_eq!(eval(&format!("{memory}.isGreaterThan(quantity(\"8Gi\"))")), Ok(true));
    let cc = format!("device.attributes[\"{DRIVER}\"].cudaComputeCapability");
    assert_eq!(eval(&format!("{cc}.compareTo(semver(\"8.0.0\")) >= 0")), Ok(true));
    assert_eq!(eval(&format!("{cc}.compareTo(semver(\"8.10.0\")) >= 0")), Ok(false), "numeric, not text order");
    // The prioritized-list model selector the webhook writes.
    let model = format!(
        "device.attributes[\"{DRIVER}\"].productName == \"Tesla T4\" && device.capacity[\"{DRIVER}\"].memory.compareTo(quantity(\"16106127360\")) == 0"
    );
    assert_eq!(eval(&model), Ok(true));
}

#[test]
fn missing_attributes_and_type_mismatches_are_cel_errors() {
    let missing = format!("device.attributes[\"{DRIVER}\"].migProfile == \"1g.10gb\"");
    assert!(matches!(eval(&missing), Err(CelError::Runtime(m)) if m.contains("migProfile")));
    assert!(matches!(eval(&format!("device.attributes[\"{DRIVER}\"].index == \"0\"")), Err(CelError::Runtime(_))));
    // has() guards the access, as in the webhook's selectors; && is not short-circuit-only.
    assert_eq!(eval(&format!("has(device.attributes[\"{DRIVER}\"].migProfile) && {missing}")), Ok(false));
    assert_eq!(eval(&format!("{missing} && false")), Ok(false));
    assert_eq!(eval(&format!("{missing} || true")), Ok(true));
}

#[test]
fn cel_outside_the_subset_is_not_guessed() {
    for expr in
        ["device.attributes[\"x\"].name.matches(\"^a\")", "true ? true : false", "device.attributes.map(k, k)", "1.5 == 1.5"]
    {
        assert!(matches!(eval(expr), Err(CelError::Unsupported(_))), "{expr}: {:?}", eval(expr));
    }
}

#[test]
fn escapes_in_string_literals_round_trip_the_webhooks_quoting() {
    let nasty = "T4 \"quoted\" \\ é \u{202e}";
    let literal = vgpu_scheduling::compat::cel_string(nasty);
    let device = Value::Map(BTreeMap::from([("s".to_owned(), Value::Str(nasty.to_owned()))]));
    assert_eq!(eval_selector(&format!("device.s == {literal}"), &device), Ok(true));
}
