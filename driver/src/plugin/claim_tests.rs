use vgpu_scheduling::{Inventory, SharingConfig, publish};

use super::*;
use crate::discovery::DeviceSource;
use crate::discovery::mock::{MockSource, parse_spec};

const UID: &str = "6f1c0a9e-1b2c-4d5e-8f90-0123456789ab";

fn claim(extra_status: &str, result: &str) -> ResourceClaim {
    let yaml = format!(
        "metadata: {{name: c, namespace: ns, uid: {UID}}}\nspec: {{}}\nstatus:\n{extra_status}  allocation:\n    devices:\n      results:\n      - {result}\n"
    );
    serde_saphyr::from_str(&yaml).unwrap()
}

fn published() -> Vec<PublishedDevice> {
    let inv: Inventory = MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()).inventory().unwrap();
    publish(&inv, &SharingConfig::default())
}

fn check(c: &ResourceClaim) -> Result<Vec<ClaimDevice>, ClaimError> {
    let want = ClaimRef::new("ns", "c", UID).unwrap();
    devices_of(c, &want, &SharingConfig::default().driver_name, "n1", &published())
}

const OURS: &str = "{driver: hami-core-gpu.project-hami.io, pool: n1, device: hami-gpu-1, request: gpu, shareID: s-1, consumedCapacity: {memory: 4Gi, cores: \"50\", shares: \"1\"}}";

#[test]
fn takes_device_share_and_consumption() {
    let devices = check(&claim("", OURS)).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device.as_str(), "hami-gpu-1");
    assert_eq!(devices[0].share_id.as_ref().map(Uid::as_str), Some("s-1"));
    assert_eq!(devices[0].consumption["memory"].to_string(), "4Gi");
}

#[test]
fn missing_consumed_capacity_means_what_an_empty_request_takes() {
    let devices =
        check(&claim("", "{driver: hami-core-gpu.project-hami.io, pool: n1, device: hami-gpu-0, request: gpu}")).unwrap();
    let c = &devices[0].consumption;
    assert_eq!(
        (c["memory"].to_string(), c["cores"].to_string(), c["shares"].to_string()),
        ("15Gi".into(), "100".into(), "1".into())
    );
}

#[test]
fn each_refusal_names_its_cause() {
    let other_uid = claim("", OURS);
    let mut other_uid = other_uid;
    other_uid.metadata.uid = Some("x".into());
    assert!(check(&other_uid).unwrap_err().to_string().contains("has UID x"));
    let two = claim("  reservedFor:\n  - {resource: pods, name: a, uid: a}\n  - {resource: pods, name: b, uid: b}\n", OURS);
    assert!(matches!(check(&two), Err(ClaimError::SharedAcrossPods { count: 2, .. })));
    let elsewhere = claim("", &OURS.replace("pool: n1", "pool: n2"));
    assert_eq!(check(&elsewhere).unwrap_err().to_string(), "claim ns/c is allocated to n2, not to this node n1");
    let foreign = claim("", &OURS.replace("hami-core-gpu.project-hami.io", "gpu.nvidia.com"));
    assert!(matches!(check(&foreign), Err(ClaimError::NoDevices(_))));
    let unknown = claim("", &OURS.replace("hami-gpu-1", "hami-gpu-9"));
    assert!(check(&unknown).unwrap_err().to_string().contains("device hami-gpu-9 does not exist"));
    let bad = claim("", &OURS.replace("4Gi", "lots"));
    assert!(check(&bad).unwrap_err().to_string().contains("consumedCapacity memory"));
    let mut unallocated = claim("", OURS);
    unallocated.status = None;
    assert_eq!(check(&unallocated).unwrap_err().to_string(), "claim ns/c is not allocated");
}

#[test]
fn every_share_takes_at_least_each_policy_minimum() {
    for (capacity, zero) in [("memory", "0"), ("memory", "512Ki"), ("shares", "0"), ("memory", "-1Gi")] {
        let result = OURS.replace(
            &format!("{capacity}: {}", if capacity == "memory" { "4Gi" } else { "\"1\"" }),
            &format!("{capacity}: \"{zero}\""),
        );
        assert_ne!(result, OURS, "{capacity}");
        let err = check(&claim("", &result)).unwrap_err();
        assert!(matches!(err, ClaimError::BelowMinimum { .. }), "{capacity}={zero}: {err}");
        assert!(err.to_string().contains(&format!("consumedCapacity {capacity}")), "{err}");
    }
    // Zero cores, as releases before the 1m cores minimum allocated it, is no core limit,
    // as the minimum is: it stands. Negative cores do not.
    assert!(check(&claim("", &OURS.replace("cores: \"50\"", "cores: \"0\""))).is_ok());
    assert!(check(&claim("", &OURS.replace("cores: \"50\"", "cores: \"1m\""))).is_ok());
    let negative = check(&claim("", &OURS.replace("cores: \"50\"", "cores: \"-1\""))).unwrap_err();
    assert!(matches!(negative, ClaimError::BelowMinimum { .. }), "{negative}");
}

#[test]
fn the_same_share_twice_is_refused_two_requests_on_one_card_are_two_shares() {
    let no_share = "{driver: hami-core-gpu.project-hami.io, pool: n1, device: hami-gpu-0, request: gpu, consumedCapacity: {memory: 4Gi, cores: \"10\", shares: \"1\"}}";
    let twice = claim("", &format!("{no_share}\n      - {no_share}"));
    assert!(matches!(check(&twice), Err(ClaimError::DuplicateResult { .. })));
    let two_requests = claim("", &format!("{no_share}\n      - {}", no_share.replace("request: gpu", "request: gpu2")));
    let devices = check(&two_requests).unwrap();
    let uid = Uid::new(UID).unwrap();
    assert_ne!(devices[0].key(&uid), devices[1].key(&uid));
}

#[test]
fn hami_core_settings_come_from_the_drivers_opaque_config_claim_over_class() {
    let config = |entries: &str| {
        let yaml = format!(
            "metadata: {{name: c, namespace: ns, uid: {UID}}}\nspec: {{}}\nstatus:\n  allocation:\n    devices:\n      results: []\n      config:\n{entries}"
        );
        let c: ResourceClaim = serde_saphyr::from_str(&yaml).unwrap();
        claim_env(&c, &SharingConfig::default().driver_name, "ns/c")
    };
    let entry = |source: &str, driver: &str, params: &str| {
        format!("      - source: {source}\n        opaque: {{driver: {driver}, parameters: {params}}}\n")
    };
    let ours = "hami-core-gpu.project-hami.io";
    let params = |priority: i64, policy: &str| {
        format!(
            "{{apiVersion: hami-core-gpu.project-hami.io/v1alpha1, kind: HamiCoreConfig, taskPriority: {priority}, coreUtilizationPolicy: {policy}}}"
        )
    };
    let env =
        config(&format!("{}{}", entry("FromClaim", ours, &params(1, "force")), entry("FromClass", ours, &params(0, "disable"))))
            .unwrap();
    assert_eq!(
        env,
        [("CUDA_TASK_PRIORITY".to_owned(), "1".to_owned()), ("GPU_CORE_UTILIZATION_POLICY".to_owned(), "force".to_owned())]
    );
    // Another driver's configuration is not ours to read; ours in an unknown shape is refused.
    assert!(config(&entry("FromClaim", "gpu.nvidia.com", "{kind: Other}")).unwrap().is_empty());
    let err = config(&entry("FromClaim", ours, "{apiVersion: x/v1, kind: Other}")).unwrap_err();
    assert!(matches!(err, ClaimError::BadConfig { .. }), "{err}");
}

#[test]
fn claim_refs_are_validated() {
    assert!(ClaimRef::new("ns", "c", UID).is_ok());
    for (ns, name, uid) in [("ns", "c/status", UID), ("a/b", "c", UID), ("ns", "c", "../x"), ("ns", "", UID)] {
        assert!(ClaimRef::new(ns, name, uid).is_err(), "{ns} {name} {uid}");
    }
}

#[test]
fn only_claims_on_this_nodes_devices_are_ours() {
    let driver = "hami-core-gpu.project-hami.io";
    assert!(allocated_here(&claim("", OURS), driver, "n1"));
    assert!(!allocated_here(&claim("", OURS), driver, "n2"));
    assert!(!allocated_here(&claim("", &OURS.replace(driver, "gpu.nvidia.com")), driver, "n1"));
    let mut unallocated = claim("", OURS);
    unallocated.status = None;
    assert!(!allocated_here(&unallocated, driver, "n1"));
}

/// Admin access is a monitoring view: it is charged what the scheduler charged, and its spec has
/// the card but none of HAMi-core; a claim that mixes it with a share is refused by name.
#[test]
fn admin_access_takes_nothing_and_gets_no_limits() {
    let admin = OURS.replace("request: gpu,", "request: gpu, adminAccess: true,");
    let devices = check(&claim("", &admin)).unwrap();
    assert!(devices[0].admin && devices[0].consumption["memory"].to_string() == "4Gi", "{devices:?}");
    let options = crate::plugin::cdi::CdiOptions {
        synthesize_nodes: true,
        ..crate::plugin::cdi::CdiOptions::for_driver(
            &SharingConfig::default().driver_name,
            std::path::Path::new("/usr/local/vgpu"),
        )
        .unwrap()
    };
    let want = ClaimRef::new("ns", "c", UID).unwrap();
    let spec =
        crate::plugin::cdi::build_spec(&options, &want, &devices, &published(), &[("CUDA_TASK_PRIORITY".into(), "0".into())])
            .unwrap();
    let uuid = published().into_iter().find(|p| p.name.as_str() == "hami-gpu-1").unwrap().uuid;
    assert_eq!(spec.container_edits.env, vec![format!("NVIDIA_VISIBLE_DEVICES={uuid}")]);
    assert!(spec.container_edits.mounts.is_empty(), "no preload, no claim directory: {:?}", spec.container_edits.mounts);
    assert_eq!(spec.devices[0].container_edits.device_nodes[0].path, "/dev/nvidia1");
    assert!(crate::plugin::cdi::region_file(&spec.container_edits.env).is_none(), "the monitor has nothing to watch");
    let mixed = format!("{admin}\n      - {}", OURS.replace("request: gpu", "request: other"));
    assert!(matches!(check(&claim("", &mixed)), Err(ClaimError::MixedAdminAccess(_))));
}
