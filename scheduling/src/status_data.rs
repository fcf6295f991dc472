//! The `data` the node driver writes in each entry of a prepared claim's `status.devices`
//! (KEP-4817): the wire form shared by the driver, which writes it, and `kubectl vgpu`, which
//! reads it back. Field names are part of the product's interface (users read them with
//! `kubectl get resourceclaim -o yaml`): add fields, never rename one.

use serde::{Deserialize, Serialize};

/// What one allocated share got on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatusData {
    /// The card's UUID (what `nvidia-smi -L` shows).
    pub uuid: String,
    /// The card's index among the claim's cards inside the container (the `_<i>` suffix of
    /// HAMi-core's variables, CUDA's device order).
    pub cuda_index: usize,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>` as written (`4096m`); absent without a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
    /// `CUDA_DEVICE_SM_LIMIT_<i>` (else the unsuffixed one) as written, percent of the SMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_limit: Option<String>,
    /// Allocated with admin access: the whole card, no HAMi-core.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

/// The HAMi-core environment the entries `data` describe, as the spec gives it to a container
/// (`CUDA_DEVICE_MEMORY_LIMIT_<i>`, `CUDA_DEVICE_SM_LIMIT_<i>`, `NVIDIA_VISIBLE_DEVICES` in CUDA
/// order); entries of one card (several shares) count once.
pub fn status_env(data: &[DeviceStatusData]) -> Vec<(String, String)> {
    let mut cards: Vec<&DeviceStatusData> = Vec::new();
    for d in data {
        if !cards.iter().any(|c| c.cuda_index == d.cuda_index) {
            cards.push(d);
        }
    }
    cards.sort_by_key(|c| c.cuda_index);
    let mut env = Vec::new();
    for c in &cards {
        if let Some(m) = &c.memory_limit {
            env.push((format!("CUDA_DEVICE_MEMORY_LIMIT_{}", c.cuda_index), m.clone()));
        }
        if let Some(s) = &c.sm_limit {
            env.push((format!("CUDA_DEVICE_SM_LIMIT_{}", c.cuda_index), s.clone()));
        }
    }
    let uuids: Vec<&str> = cards.iter().map(|c| c.uuid.as_str()).collect();
    env.push(("NVIDIA_VISIBLE_DEVICES".into(), uuids.join(",")));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(index: usize, uuid: &str, memory: Option<&str>) -> DeviceStatusData {
        DeviceStatusData {
            uuid: uuid.into(),
            cuda_index: index,
            memory_limit: memory.map(str::to_owned),
            sm_limit: memory.map(|_| "50".to_owned()),
            admin_access: memory.is_none(),
        }
    }

    #[test]
    fn the_environment_is_in_cuda_order_with_one_limit_per_card() {
        let env =
            status_env(&[data(1, "GPU-b", Some("1024m")), data(0, "GPU-a", Some("4096m")), data(1, "GPU-b", Some("1024m"))]);
        let keys: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            keys,
            [
                "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
                "CUDA_DEVICE_SM_LIMIT_0=50",
                "CUDA_DEVICE_MEMORY_LIMIT_1=1024m",
                "CUDA_DEVICE_SM_LIMIT_1=50",
                "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"
            ]
        );
    }

    #[test]
    fn a_monitoring_claim_has_its_cards_and_no_limits() {
        let env = status_env(&[data(0, "GPU-a", None)]);
        assert_eq!(env, [("NVIDIA_VISIBLE_DEVICES".to_owned(), "GPU-a".to_owned())]);
    }

    #[test]
    fn the_wire_names_stay_as_documented() {
        let json = serde_json::to_value(data(0, "GPU-a", Some("4096m"))).unwrap();
        assert_eq!(json, serde_json::json!({"uuid": "GPU-a", "cudaIndex": 0, "memoryLimit": "4096m", "smLimit": "50"}));
        let old: DeviceStatusData = serde_json::from_value(serde_json::json!({"uuid": "GPU-a", "cudaIndex": 2})).unwrap();
        assert_eq!((old.memory_limit, old.admin_access), (None, false));
    }
}
