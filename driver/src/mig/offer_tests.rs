use vgpu_scheduling::mig::model_for;
use vgpu_scheduling::{DeviceConfig, MigDevice, MigPlacement};

use super::*;
use crate::discovery::DeviceSource;
use crate::discovery::mock::{MockSource, parse_spec};

/// Source document 001's groups for the A800-SXM4-80GB: 1g.10gb, 2g.20gb, 3g.40gb, 7g.79gb.
const GROUPS_001: &str = "nvidia:\n  knownMigGeometries:\n  - models: [\"A800-SXM4-80GB\"]\n    allowedGeometries:\n    - group: group1\n      geometries:\n      - {name: 1g.10gb, memory: 10240, count: 7}\n    - group: group2\n      geometries:\n      - {name: 2g.20gb, memory: 20480, count: 3}\n      - {name: 1g.10gb, memory: 10240, count: 1}\n    - group: group3\n      geometries:\n      - {name: 3g.40gb, memory: 40960, count: 2}\n    - group: group4\n      geometries:\n      - {name: 7g.79gb, memory: 80896, count: 1}\n";

const A800: &str = "NVIDIA A800-SXM4-80GB";

fn inventory(spec: &str) -> Inventory {
    MockSource::new("n1", parse_spec(spec).unwrap()).inventory().unwrap()
}

fn settings(mode: DynamicMig) -> MigSettings {
    MigSettings { mode, config: DeviceConfig::parse("device-config.yaml", GROUPS_001).unwrap().mig, ..Default::default() }
}

fn names(devices: &[PublishedDevice]) -> Vec<&str> {
    devices.iter().map(|d| d.name.as_str()).collect()
}

fn instance(uuid: &str, placement: Option<(u32, u8)>) -> MigDevice {
    MigDevice {
        uuid: uuid.into(),
        profile: "3g.40gb".into(),
        gpu_instance: 1,
        compute_instance: 0,
        memory_bytes: 40_192 << 20,
        multiprocessors: 42,
        placement: placement.map(|(profile_id, start)| MigPlacement { profile_id, start }),
    }
}

/// The device names of every slice, counter-set slices giving none.
fn slice_devices(layout: &PoolLayout) -> Vec<String> {
    let pool =
        PoolIdentity { driver: SharingConfig::default().driver_name, node_name: "n1".into(), node_uid: None, generation: 1 };
    layout.slices(&pool).iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect()
}

#[test]
fn off_publishes_what_the_inventory_has() {
    let inv = inventory(&format!("{A800}:80Gi:mig,Tesla T4:15Gi"));
    let layout = PoolLayout::new(&inv, &SharingConfig::default(), &settings(DynamicMig::Off));
    assert_eq!(layout.devices, publish(&inv, &SharingConfig::default()));
    // The card in MIG mode has no instance, so it publishes nothing, as before dynamic MIG.
    assert_eq!(names(&layout.devices), ["hami-gpu-1"]);
    assert!(layout.offers.is_empty() && layout.refusals.is_empty());
}

#[test]
fn a_listed_card_in_mig_mode_offers_its_allowed_placements_and_the_full_instance_as_shares() {
    let inv = inventory(&format!("{A800}:80Gi:mig,{A800}:80Gi,Tesla T4:15Gi"));
    let layout = PoolLayout::new(&inv, &SharingConfig::default(), &settings(DynamicMig::Listed));
    // Card 1 is out of MIG mode: software shares only, its memory unchanged.
    assert_eq!(names(&layout.devices), ["hami-gpu-0", "hami-gpu-1", "hami-gpu-2"]);
    assert_eq!(layout.devices[0].capacity["memory"].value.to_string(), "79Gi");
    assert_eq!(layout.devices[1].capacity["memory"].value.to_string(), "80Gi");
    assert_eq!(layout.offers.len(), 1);
    let offer = &layout.offers[0].1;
    assert_eq!(offer.allowed, Some(vec!["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]));
    // The listed card out of MIG mode is said to offer none, and why; the T4 (no MIG) is not.
    let whys: Vec<(&str, &NoOffer)> = layout.refusals.iter().map(|r| (r.uuid.as_str(), &r.why)).collect();
    assert_eq!(whys, [(inv.gpus[1].uuid.as_str(), &NoOffer::NotInMigMode)]);
    assert!(layout.refusals[0].to_string().contains("not in MIG mode, and the driver never switches"), "{}", layout.refusals[0]);
    let published = slice_devices(&layout);
    // 7 + 3 + 2 + 1 placements of the four allowed profiles, after the three cards.
    assert_eq!(published.len(), 3 + 13);
    assert!(published.contains(&"hami-gpu-0-mig-2g-20gb-4".to_owned()));
    assert!(!published.iter().any(|n| n.contains("1g-20gb") || n.contains("4g-40gb") || n.contains("-me-")));
}

#[test]
fn listed_leaves_unlisted_models_static_and_all_takes_every_catalogued_one() {
    let inv = inventory("NVIDIA H100 80GB HBM3:80Gi:mig,NVIDIA A30:24Gi:mig");
    let listed = PoolLayout::new(&inv, &SharingConfig::default(), &settings(DynamicMig::Listed));
    let whys: Vec<&NoOffer> = listed.refusals.iter().map(|r| &r.why).collect();
    assert_eq!(whys, [&NoOffer::NotListed, &NoOffer::NotListed]);
    assert!(listed.offers.is_empty() && listed.devices.is_empty());

    let all = PoolLayout::new(&inv, &SharingConfig::default(), &settings(DynamicMig::All));
    assert_eq!(all.offers.len(), 1);
    assert_eq!(all.offers[0].1.allowed, None, "no entry names the H100: every profile");
    assert_eq!(all.refusals.len(), 1);
    assert_eq!(all.refusals[0].why, NoOffer::UnknownModel);
    assert_eq!(all.refusals[0].product, "NVIDIA A30");
    // 7 + 7 + 4 + 3 + 2 + 1 + 1 placements and the whole card.
    assert_eq!(slice_devices(&all).len(), 26);
}

#[test]
fn an_instance_already_on_the_card_blocks_its_slices_and_the_whole_card() {
    let model = model_for(A800, 80 << 30).unwrap();
    // Every placement of the model as the one instance already there.
    for taken in model.placements() {
        let mut inv = inventory(&format!("{A800}:80Gi:mig"));
        inv.gpus[0].mig = Some(vec![instance("MIG-x", Some((taken.profile().id(), taken.start())))]);
        // No config entry: every profile of the model is allowed.
        let mig = MigSettings { mode: DynamicMig::All, config: Vec::new(), ..Default::default() };
        let layout = PoolLayout::new(&inv, &SharingConfig::default(), &mig);
        assert!(layout.refusals.is_empty());
        assert_eq!(names(&layout.devices), ["hami-gpu-0-mig-1-0"], "the instance stays published, the whole card does not");
        let offered = slice_devices(&layout);
        let want: Vec<String> =
            model.placements().iter().filter(|p| !p.overlaps(&taken)).map(|p| p.device_name(0).to_string()).collect();
        assert_eq!(offered[1..], want[..], "{} at {}", taken.profile().name(), taken.start());
    }
}

#[test]
fn a_card_whose_instances_cannot_be_placed_stays_static() {
    for placement in [None, Some((19, 7)), Some((42, 0))] {
        let mut inv = inventory(&format!("{A800}:80Gi:mig"));
        inv.gpus[0].mig = Some(vec![instance("MIG-y", placement)]);
        let layout = PoolLayout::new(&inv, &SharingConfig::default(), &settings(DynamicMig::Listed));
        assert!(layout.offers.is_empty(), "{placement:?}");
        assert_eq!(layout.refusals[0].why, NoOffer::UnknownPlacement { instance: "MIG-y".into() });
        assert_eq!(names(&layout.devices), ["hami-gpu-0-mig-1-0"]);
        assert!(layout.refusals[0].why.to_string().contains("MIG-y"));
    }
}

#[test]
fn a_profile_the_model_lacks_refuses_the_card_with_the_entry_named() {
    let config = "nvidia:\n  migProfileAllowlist:\n  - models: [A800]\n    profiles: [1g.5gb]\n";
    let mig = MigSettings {
        mode: DynamicMig::Listed,
        config: DeviceConfig::parse("c.yaml", config).unwrap().mig,
        ..Default::default()
    };
    let layout = PoolLayout::new(&inventory(&format!("{A800}:80Gi:mig")), &SharingConfig::default(), &mig);
    assert!(layout.offers.is_empty());
    let why = layout.refusals[0].why.to_string();
    assert!(why.contains("1g.5gb") && why.contains("A800"), "{why}");
}

#[test]
fn filtered_cards_offer_nothing() {
    let inv = inventory(&format!("2x{A800}:80Gi:mig"));
    let mut config = SharingConfig::default();
    config.filter.indices = vec![0];
    let layout = PoolLayout::new(&inv, &config, &settings(DynamicMig::All));
    assert_eq!(names(&layout.devices), ["hami-gpu-1"]);
    assert_eq!(layout.offers.len(), 1);
    assert!(slice_devices(&layout).iter().all(|n| n.starts_with("hami-gpu-1")));
}
