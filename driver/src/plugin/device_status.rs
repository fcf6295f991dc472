//! What the driver tells about a prepared claim in its `status.devices` (KEP-4817): for each
//! allocated share, the card's UUID and the HAMi-core limits its CDI spec gives the containers,
//! read back from the spec itself, so the status can never say something the containers do not
//! get. Pure: no I/O.

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use vgpu_scheduling::DeviceStatusData;

use super::cdi::spec_env;
use super::storage::checkpoint::PreparedClaim;

/// The `status.devices` entries of a prepared claim, one per allocation result (driver, pool,
/// device and share ID are the allocation's key), in the claim's order.
pub fn device_statuses(record: &PreparedClaim, driver: &str, pool: &str) -> Vec<AllocatedDeviceStatus> {
    // Only a bug makes the held spec unreadable; then the status says no limits, which the
    // containers' own environment still sets.
    let env = record.spec.env().unwrap_or_default();
    let visible: Vec<&str> = spec_env(&env, "NVIDIA_VISIBLE_DEVICES").map(|v| v.split(',').collect()).unwrap_or_default();
    // The spec numbers the claim's distinct cards in the order they first appear.
    let mut cards: Vec<&vgpu_scheduling::DeviceName> = Vec::new();
    record
        .devices
        .iter()
        .map(|d| {
            let index = cards.iter().position(|c| **c == d.device).unwrap_or_else(|| {
                cards.push(&d.device);
                cards.len() - 1
            });
            let indexed = |key: &str| spec_env(&env, &format!("{key}_{index}")).map(str::to_owned);
            let data = DeviceStatusData {
                uuid: visible.get(index).map_or_else(|| d.device.to_string(), |u| (*u).to_owned()),
                cuda_index: index,
                memory_limit: if d.admin { None } else { indexed("CUDA_DEVICE_MEMORY_LIMIT") },
                sm_limit: if d.admin {
                    None
                } else {
                    indexed("CUDA_DEVICE_SM_LIMIT").or_else(|| spec_env(&env, "CUDA_DEVICE_SM_LIMIT").map(str::to_owned))
                },
                admin_access: d.admin,
            };
            AllocatedDeviceStatus {
                driver: driver.to_owned(),
                pool: pool.to_owned(),
                device: d.device.to_string(),
                share_id: d.share_id.as_ref().map(ToString::to_string),
                data: serde_json::to_value(&data).ok().map(RawExtension),
                ..Default::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use cdi_spec::{Kind, Spec};
    use vgpu_scheduling::{Consumption, DeviceName, Quantity, Uid};

    use super::*;
    use crate::plugin::claim::{ClaimDevice, ClaimRef};
    use crate::plugin::storage::held_spec::HeldSpec;

    fn device(name: &str, share: Option<&str>, admin: bool) -> ClaimDevice {
        let mut consumption = Consumption::new();
        consumption.insert("memory".into(), Quantity::parse("1Gi").unwrap());
        ClaimDevice {
            request: "gpu".into(),
            device: DeviceName::new(name).unwrap(),
            share_id: share.map(|s| Uid::new(s).unwrap()),
            consumption: consumption.into(),
            admin,
        }
    }

    fn record(devices: Vec<ClaimDevice>, env: &[&str]) -> PreparedClaim {
        let mut spec = Spec::new(&Kind::new("k8s.gpu.example.com", "claim").unwrap(), Vec::new()).unwrap();
        spec.container_edits.env = env.iter().map(|e| (*e).to_owned()).collect();
        PreparedClaim {
            claim: ClaimRef::new("ns", "c", "u-1").unwrap(),
            devices,
            spec: HeldSpec::new(&spec),
            mig: Vec::new(),
            consumer: None,
        }
    }

    fn data(entry: &AllocatedDeviceStatus) -> DeviceStatusData {
        serde_json::from_value(entry.data.as_ref().unwrap().0.clone()).unwrap()
    }

    #[test]
    fn each_share_gets_its_cards_uuid_and_the_limits_its_spec_gives() {
        let r = record(
            vec![device("gpu-a", Some("s1"), false), device("gpu-b", Some("s2"), false), device("gpu-a", Some("s3"), false)],
            &[
                "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
                "CUDA_DEVICE_SM_LIMIT_0=50",
                "CUDA_DEVICE_MEMORY_LIMIT_1=1024m",
                "CUDA_DEVICE_SM_LIMIT_1=10",
                "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b",
            ],
        );
        let entries = device_statuses(&r, "gpu.example.com", "node-1");
        assert_eq!(entries.len(), 3, "one entry per allocation result");
        let keys: Vec<_> = entries.iter().map(|e| (e.device.as_str(), e.share_id.as_deref(), e.pool.as_str())).collect();
        assert_eq!(keys, [("gpu-a", Some("s1"), "node-1"), ("gpu-b", Some("s2"), "node-1"), ("gpu-a", Some("s3"), "node-1")]);
        assert!(entries.iter().all(|e| e.driver == "gpu.example.com" && e.conditions.is_none()));
        let got: Vec<_> = entries.iter().map(data).collect();
        assert_eq!((got[0].uuid.as_str(), got[0].cuda_index, got[0].memory_limit.as_deref()), ("GPU-a", 0, Some("4096m")));
        assert_eq!((got[1].uuid.as_str(), got[1].cuda_index, got[1].sm_limit.as_deref()), ("GPU-b", 1, Some("10")));
        // A second share of a card has that card's one limit.
        assert_eq!(got[2], got[0]);
    }

    #[test]
    fn the_unsuffixed_sm_limit_stands_for_a_card_without_its_own() {
        let r = record(vec![device("gpu-a", None, false)], &["CUDA_DEVICE_SM_LIMIT=30", "NVIDIA_VISIBLE_DEVICES=GPU-a"]);
        let d = data(&device_statuses(&r, "d", "n")[0]);
        assert_eq!((d.sm_limit.as_deref(), d.memory_limit), (Some("30"), None));
    }

    #[test]
    fn a_monitoring_claim_says_it_has_the_whole_card_and_no_limits() {
        let r = record(vec![device("gpu-a", Some("s1"), true)], &["NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_DEVICE_SM_LIMIT=30"]);
        let d = data(&device_statuses(&r, "d", "n")[0]);
        assert!(d.admin_access);
        assert_eq!((d.memory_limit.as_deref(), d.sm_limit.as_deref(), d.uuid.as_str()), (None, None, "GPU-a"));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json, serde_json::json!({"uuid": "GPU-a", "cudaIndex": 0, "adminAccess": true}));
    }

    #[test]
    fn a_spec_without_the_uuids_names_the_device_instead() {
        let r = record(vec![device("gpu-a", None, false)], &[]);
        assert_eq!(data(&device_statuses(&r, "d", "n")[0]).uuid, "gpu-a");
    }
}
