use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as resource;
use vgpu_scheduling::mig::{allowed_profiles, model_for};
use vgpu_scheduling::{SharingConfig, publish};

use super::*;
use crate::discovery::DeviceSource;
use crate::discovery::mock::{MockSource, parse_spec};
use crate::slices::MAX_DEVICES_PER_SLICE;

fn pool() -> PoolIdentity {
    PoolIdentity { driver: SharingConfig::default().driver_name, node_name: "n1".into(), node_uid: None, generation: 3 }
}

fn cards(spec: &str) -> Vec<PublishedDevice> {
    let inv = MockSource::new("n1", parse_spec(spec).unwrap()).inventory().unwrap();
    publish(&inv, &SharingConfig::default())
}

fn mig_cards<'a>(devices: &'a [PublishedDevice], allowed: Option<Vec<&'static str>>) -> Vec<MigCard<'a>> {
    devices
        .iter()
        .map(|card| {
            let product = match card.attributes.get("productName") {
                Some(vgpu_scheduling::Attribute::String(s)) => s.clone(),
                other => panic!("productName {other:?}"),
            };
            let memory = card.capacity["memory"].value.to_string().trim_end_matches("Gi").parse::<u64>().unwrap() << 30;
            MigCard {
                card,
                model: model_for(&product, memory).unwrap(),
                allowed: allowed.clone(),
                occupied: Vec::new(),
                shares: None,
            }
        })
        .collect()
}

fn counters(c: &resource::DeviceCounterConsumption) -> BTreeMap<String, String> {
    c.counters.iter().map(|(k, v)| (k.clone(), v.value.0.clone())).collect()
}

/// Source document 001's groups for the A800-SXM4-80GB: 1g.10gb, 2g.20gb, 3g.40gb, 7g.79gb.
const GROUPS_001: &str = "nvidia:\n  knownMigGeometries:\n  - models: [\"A800-SXM4-80GB\"]\n    allowedGeometries:\n    - group: group1\n      geometries:\n      - {name: 1g.10gb, memory: 10240, count: 7}\n    - group: group2\n      geometries:\n      - {name: 2g.20gb, memory: 20480, count: 3}\n      - {name: 1g.10gb, memory: 10240, count: 1}\n    - group: group3\n      geometries:\n      - {name: 3g.40gb, memory: 40960, count: 2}\n    - group: group4\n      geometries:\n      - {name: 7g.79gb, memory: 80896, count: 1}\n";

#[test]
fn a_card_offers_its_allowed_placements_and_its_whole_self_consumes_every_counter() {
    let devices = cards("1xNVIDIA A800-SXM4-80GB:80Gi");
    let config = vgpu_scheduling::DeviceConfig::parse("device-config.yaml", GROUPS_001).unwrap();
    let model = model_for("NVIDIA A800-SXM4-80GB", 80 << 30).unwrap();
    let allowed = allowed_profiles(model, "NVIDIA A800-SXM4-80GB", &config.mig).unwrap();
    let mig = mig_cards(&devices, allowed);
    let slices = build_slices_with_mig(&pool(), &devices, &mig);

    // The counter set first, in a slice of its own, then the devices; each slice counts both.
    assert_eq!(slices.len(), 2);
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2 && s.spec.pool.generation == 3));
    let sets = slices[0].spec.shared_counters.as_ref().unwrap();
    assert!(slices[0].spec.devices.is_none());
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].name, "gpu-0-counters");
    let offered: BTreeMap<String, String> = sets[0].counters.iter().map(|(k, v)| (k.clone(), v.value.0.clone())).collect();
    assert_eq!(offered.len(), 10, "{offered:?}");
    assert_eq!(offered["compute-slices"], "7");

    let devices = slices[1].spec.devices.as_ref().unwrap();
    let whole = devices.iter().find(|d| d.name == "hami-gpu-0").unwrap();
    assert_eq!(whole.allow_multiple_allocations, Some(true));
    assert_eq!(counters(&whole.consumes_counters.as_ref().unwrap()[0]), offered, "the whole card takes every counter");

    // 7 x 1g.10gb, 3 x 2g.20gb, 2 x 3g.40gb, 1 x 7g: the groups' profiles, every placement.
    let mut profiles: BTreeMap<String, usize> = BTreeMap::new();
    for d in devices.iter().filter(|d| d.name != "hami-gpu-0") {
        let attrs = d.attributes.as_ref().unwrap();
        *profiles.entry(attrs["profile"].string.clone().unwrap()).or_default() += 1;
        assert_eq!(attrs["parentUUID"].string, whole.attributes.as_ref().unwrap()["uuid"].string);
        assert!(d.allow_multiple_allocations.is_none(), "{} is one pod's instance", d.name);
        let used = counters(&d.consumes_counters.as_ref().unwrap()[0]);
        assert!(used.keys().all(|k| offered.contains_key(k)), "{}: {used:?}", d.name);
        assert!(attrs.len() + d.capacity.as_ref().map_or(0, BTreeMap::len) <= 32, "{}: over the API's 32", d.name);
    }
    let want: BTreeMap<String, usize> =
        [("1g.10gb", 7), ("2g.20gb", 3), ("3g.40gb", 2), ("7g.80gb", 1)].into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    assert_eq!(profiles, want);
}

#[test]
fn many_mig_cards_split_counter_sets_and_devices_within_the_api_limits() {
    let devices = cards("9xNVIDIA H100 80GB HBM3:80Gi");
    let mig = mig_cards(&devices, None);
    let slices = build_slices_with_mig(&pool(), &devices, &mig);
    let set_slices: Vec<&resource::ResourceSlice> = slices.iter().filter(|s| s.spec.shared_counters.is_some()).collect();
    assert_eq!(set_slices.iter().map(|s| s.spec.shared_counters.as_ref().unwrap().len()).collect::<Vec<_>>(), vec![8, 1]);
    let placements = mig[0].placements().len();
    let total: usize = slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
    assert_eq!(total, 9 * (placements + 1));
    assert!(slices.iter().all(|s| s.spec.devices.as_ref().is_none_or(|d| d.len() <= MAX_DEVICES_PER_SLICE)));
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == i64::try_from(slices.len()).unwrap()));
    let names: Vec<String> = slices.iter().filter_map(|s| s.metadata.name.clone()).collect();
    let unique: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "{names:?}");
}

#[test]
fn cards_without_mig_keep_their_device_as_before() {
    let devices = cards("2xTesla T4:15Gi");
    let slices = build_slices_with_mig(&pool(), &devices, &[]);
    assert_eq!(slices, crate::slices::build_slices(&pool(), &devices));
}

#[test]
fn shared_instances_publish_share_capacities_inside_the_instance_and_allow_several_claims() {
    let devices = cards("1xNVIDIA H200:141Gi");
    let mut mig = mig_cards(&devices, None);
    let config = SharingConfig { device_split_count: 4, ..SharingConfig::default() };
    mig[0].shares = Some(config.clone());
    let slices = build_slices_with_mig(&pool(), &devices, &mig);
    let all: Vec<&resource::Device> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    let small = all.iter().find(|d| d.name == "hami-gpu-0-mig-1g-18gb-2").unwrap();
    assert_eq!(small.allow_multiple_allocations, Some(true));
    let capacity = small.capacity.as_ref().unwrap();
    let profile = model_for("NVIDIA H200", 141 << 30).unwrap().profile(19).unwrap();
    // The instance's memory, not the card's, as a whole card of that size would publish it.
    assert_eq!(
        serde_json::to_value(capacity).unwrap(),
        serde_json::to_value(crate::slices::api_device(&pool().driver, &mig[0].device(&mig[0].placements()[0])).capacity)
            .unwrap()
    );
    let want = vgpu_scheduling::device::share_capacities(profile.memory_mib() << 20, &config);
    assert_eq!(capacity.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    assert_eq!(capacity["memory"].value.0, want["memory"].value.to_string());
    assert_eq!(capacity["shares"].value.0, "4");
    // Its counters are still its placement's: shared or not, it excludes what overlaps it.
    let exclusive = build_slices_with_mig(&pool(), &devices, &mig_cards(&devices, None));
    let same = exclusive.iter().flat_map(|s| s.spec.devices.iter().flatten()).find(|d| d.name == small.name).unwrap();
    assert_eq!(same.consumes_counters, small.consumes_counters);
    assert!(same.allow_multiple_allocations.is_none());
    assert_eq!(same.capacity.as_ref().unwrap().keys().collect::<Vec<_>>(), vec!["memory"]);
}
