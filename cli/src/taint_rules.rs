//! DeviceTaintRules (KEP-5055): an administrator's taint on devices picked by driver, pool and
//! device name, which the scheduler adds to the devices' own and the eviction controller acts on
//! (NoExecute). Served as `resource.k8s.io/v1` from Kubernetes 1.37, as `v1beta2` (off by default)
//! in 1.36; read here as JSON so either version reads the same.

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use serde::Deserialize;
use serde_json::Value;

use crate::cards::taint_text;

/// The API versions that serve DeviceTaintRules, newest first.
pub const VERSIONS: [&str; 2] = ["v1", "v1beta2"];

/// One rule, as far as `kubectl vgpu` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaintRule {
    /// The rule's name.
    pub name: String,
    /// Only devices of this driver, when set.
    pub driver: Option<String>,
    /// Only devices of this pool (our driver's pools are nodes), when set.
    pub pool: Option<String>,
    /// Only the device of this name, when set.
    pub device: Option<String>,
    /// The taint it adds.
    pub taint: DeviceTaint,
    /// The eviction controller's word on it (`EvictionInProgress` condition message), if any.
    pub eviction: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    metadata: Meta,
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize)]
struct Meta {
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    device_selector: Selector,
    taint: Taint,
}

#[derive(Deserialize, Default)]
struct Selector {
    driver: Option<String>,
    pool: Option<String>,
    device: Option<String>,
}

#[derive(Deserialize)]
struct Taint {
    key: String,
    #[serde(default)]
    value: String,
    effect: String,
}

#[derive(Deserialize, Default)]
struct Status {
    #[serde(default)]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    message: String,
}

impl TaintRule {
    /// The rule in `object` (a DeviceTaintRule as the API returns it); `None` when it is not one.
    pub fn parse(object: &Value) -> Option<Self> {
        let wire: Wire = serde_json::from_value(object.clone()).ok()?;
        let t = wire.spec.taint;
        let taint =
            DeviceTaint { key: t.key, value: Some(t.value).filter(|v| !v.is_empty()), effect: t.effect, time_added: None };
        let eviction = wire
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "EvictionInProgress" && !c.message.is_empty())
            .map(|c| c.message.clone());
        let selector = wire.spec.device_selector;
        Some(Self {
            name: wire.metadata.name,
            driver: selector.driver,
            pool: selector.pool,
            device: selector.device,
            taint,
            eviction,
        })
    }

    /// Whether the rule taints device `device` of `pool` of `driver` (an unset field selects all).
    pub fn selects(&self, driver: &str, pool: &str, device: &str) -> bool {
        let matches = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        matches(&self.driver, driver) && matches(&self.pool, pool) && matches(&self.device, device)
    }

    /// `key=value:Effect (rule NAME)`, as a card's HEALTH shows it.
    pub fn shown(&self) -> String {
        format!("{} (rule {})", taint_text(&self.taint), self.name)
    }
}

/// Adds each rule's taint to the devices it selects in `slices`, as the scheduler sees them.
pub fn apply(slices: &mut [ResourceSlice], rules: &[TaintRule]) {
    for slice in slices {
        let (driver, pool) = (slice.spec.driver.clone(), slice.spec.pool.name.clone());
        for device in slice.spec.devices.iter_mut().flatten() {
            for rule in rules.iter().filter(|r| r.selects(&driver, &pool, &device.name)) {
                device.taints.get_or_insert_with(Vec::new).push(rule.taint.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn rule(selector: Value, value: &str) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "drain-gpu-0"},
            "spec": {"deviceSelector": selector, "taint": {"key": "example.com/maintenance", "value": value, "effect": "NoExecute"}},
            "status": {"conditions": [{"type": "EvictionInProgress", "status": "True", "message": "1 pod evicted"}]}})
    }

    #[test]
    fn a_rule_selects_by_every_field_it_sets_and_no_other() {
        let one = TaintRule::parse(&rule(json!({"driver": "d", "pool": "node-a", "device": "hami-gpu-0"}), "true")).unwrap();
        assert!(one.selects("d", "node-a", "hami-gpu-0"));
        for (driver, pool, device) in
            [("e", "node-a", "hami-gpu-0"), ("d", "node-b", "hami-gpu-0"), ("d", "node-a", "hami-gpu-1")]
        {
            assert!(!one.selects(driver, pool, device), "{driver}/{pool}/{device}");
        }
        let pool = TaintRule::parse(&rule(json!({"pool": "node-a"}), "")).unwrap();
        assert!(pool.selects("any.example.com", "node-a", "hami-gpu-7"));
        assert!(!pool.selects("any.example.com", "node-b", "hami-gpu-7"));
    }

    #[test]
    fn a_rule_shows_its_taint_its_name_and_the_eviction() {
        let r = TaintRule::parse(&rule(json!({"device": "hami-gpu-0"}), "true")).unwrap();
        assert_eq!(r.shown(), "example.com/maintenance=true:NoExecute (rule drain-gpu-0)");
        assert_eq!(r.eviction.as_deref(), Some("1 pod evicted"));
        let bare = TaintRule::parse(&rule(json!({}), "")).unwrap();
        assert_eq!(taint_text(&bare.taint), "example.com/maintenance:NoExecute");
        assert!(TaintRule::parse(&json!({"metadata": {"name": "x"}})).is_none(), "no spec: not a rule");
    }

    #[test]
    fn applied_rules_taint_only_the_devices_they_select() {
        let slice = |node: &str| -> ResourceSlice {
            serde_json::from_value(json!({"metadata": {"name": node}, "spec": {"driver": "d", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "hami-gpu-0"}, {"name": "hami-gpu-1"}]}}))
            .unwrap()
        };
        let mut slices = vec![slice("node-a"), slice("node-b")];
        let rules = [TaintRule::parse(&rule(json!({"pool": "node-a", "device": "hami-gpu-1"}), "")).unwrap()];
        apply(&mut slices, &rules);
        let tainted: Vec<(String, String)> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(move |d| (s.spec.pool.name.clone(), d.clone())))
            .filter(|(_, d)| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
            .map(|(pool, d)| (pool, d.name))
            .collect();
        assert_eq!(tainted, [("node-a".to_owned(), "hami-gpu-1".to_owned())]);
    }
}
