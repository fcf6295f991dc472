use super::*;
use crate::config::{DeviceFilter, Ratio};
use crate::model::MigDevice;

fn gpu(minor: u32, product: &str, memory_bytes: u64) -> Gpu {
    Gpu {
        uuid: format!("GPU-{minor}"),
        minor,
        index: minor,
        product_name: product.into(),
        brand: "Tesla".into(),
        memory_bytes,
        architecture: "Hopper".into(),
        compute_capability: (9, 0),
        pci_bus_id: format!("0000:{minor:02x}:00.0"),
        pcie_root: Some("pci0000:00".into()),
        multiprocessors: 132,
        mig: None,
        health: Health::Healthy,
    }
}

fn inventory(gpus: Vec<Gpu>) -> Inventory {
    Inventory { driver_version: "535.104.05".into(), cuda_driver_version: (12, 2), gpus }
}

fn cap(d: &PublishedDevice, name: &str) -> String {
    d.capacity[name].value.to_string()
}

#[test]
fn one_device_per_card_with_hami_capacities_and_policies() {
    // An H200 reports 143771 MiB; nothing here is tuned to 15Gi cards.
    let inv = inventory(vec![gpu(1, "NVIDIA H200", 143_771 << 20), gpu(0, "NVIDIA H200", 143_771 << 20)]);
    let devices = publish(&inv, &SharingConfig::default());
    assert_eq!(devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["hami-gpu-0", "hami-gpu-1"]);
    let d = &devices[0];
    assert_eq!(cap(d, CAPACITY_MEMORY), "143771Mi");
    assert_eq!(cap(d, CAPACITY_CORES), "100");
    assert_eq!(cap(d, CAPACITY_SHARES), "10");
    // A claim without requests gets the whole card but only one share.
    assert_eq!(d.capacity[CAPACITY_MEMORY].consumed_by(None).unwrap().to_string(), "143771Mi");
    assert_eq!(d.capacity[CAPACITY_CORES].consumed_by(None).unwrap().to_string(), "100");
    assert_eq!(d.capacity[CAPACITY_SHARES].consumed_by(None).unwrap().to_string(), "1");
    assert_eq!(d.attributes["type"], Attribute::String("hami-gpu".into()));
    assert_eq!(d.attributes["uuid"], Attribute::String("GPU-0".into()));
    assert_eq!(d.attributes["minor"], Attribute::Int(0));
    assert_eq!(d.attributes["driverVersion"], Attribute::Version("535.104.5".into()));
    assert_eq!(d.attributes["cudaDriverVersion"], Attribute::Version("12.2.0".into()));
    assert_eq!(d.attributes["cudaComputeCapability"], Attribute::Version("9.0.0".into()));
    assert_eq!(d.attributes[ATTR_PCIE_ROOT], Attribute::String("pci0000:00".into()));
    // API limit: 32 attributes and capacities together.
    assert!(d.attributes.len() + d.capacity.len() <= 32);
}

#[test]
fn memory_is_floored_to_whole_mebibytes_so_the_step_grid_fits() {
    let devices = publish(&inventory(vec![gpu(0, "odd", (12 << 30) + 12345)]), &SharingConfig::default());
    assert_eq!(cap(&devices[0], CAPACITY_MEMORY), "12Gi");
}

#[test]
fn scaling_multiplies_the_published_values_and_split_count_bounds_shares() {
    let config = SharingConfig {
        device_split_count: 4,
        memory_scaling: Ratio::parse("deviceMemoryScaling", "1.5").unwrap(),
        core_scaling: Ratio::parse("deviceCoreScaling", "2").unwrap(),
        ..SharingConfig::default()
    };
    let devices = publish(&inventory(vec![gpu(0, "RTX 3060", 12 << 30)]), &config);
    assert_eq!(cap(&devices[0], CAPACITY_MEMORY), "18Gi");
    assert_eq!(cap(&devices[0], CAPACITY_CORES), "200");
    assert_eq!(cap(&devices[0], CAPACITY_SHARES), "4");
    assert!(Ratio::parse("deviceMemoryScaling", "0.5").unwrap_err().to_string().starts_with("deviceMemoryScaling: "));
    assert!(Ratio::parse("deviceCoreScaling", "lots").is_err());
}

#[test]
fn filtered_cards_are_left_out() {
    let config =
        SharingConfig { filter: DeviceFilter { uuids: vec!["GPU-1".into()], indices: vec![2] }, ..SharingConfig::default() };
    let devices = publish(&inventory(vec![gpu(0, "a", 1 << 30), gpu(1, "a", 1 << 30), gpu(2, "a", 1 << 30)]), &config);
    assert_eq!(devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["hami-gpu-0"]);
}

#[test]
fn cards_in_mig_mode_publish_their_instances_instead() {
    let mut card = gpu(3, "NVIDIA H200", 143_771 << 20);
    card.mig = Some(vec![
        MigDevice {
            uuid: "MIG-a".into(),
            profile: "1g.18gb".into(),
            gpu_instance: 7,
            compute_instance: 0,
            memory_bytes: 16_384 << 20,
            multiprocessors: 16,
            placement: None,
        },
        MigDevice {
            uuid: "MIG-b".into(),
            profile: "3g.71gb".into(),
            gpu_instance: 2,
            compute_instance: 0,
            memory_bytes: 69_888 << 20,
            multiprocessors: 60,
            placement: None,
        },
    ]);
    let devices = publish(&inventory(vec![card]), &SharingConfig::default());
    let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["hami-gpu-3-mig-7-0", "hami-gpu-3-mig-2-0"]);
    assert_eq!(cap(&devices[0], CAPACITY_MEMORY), "16Gi");
    assert_eq!(devices[1].uuid, "MIG-b");
    assert_eq!(devices[1].attributes["parentUUID"], Attribute::String("GPU-3".into()));
    assert_eq!(devices[1].attributes["migProfile"], Attribute::String("3g.71gb".into()));
}

#[test]
fn driver_versions_become_semantic_versions() {
    assert_eq!(semver("550.54.15").as_deref(), Some("550.54.15"));
    assert_eq!(semver("535.104.05").as_deref(), Some("535.104.5"));
    assert_eq!(semver("560.28").as_deref(), Some("560.28.0"));
    assert_eq!(semver("beta"), None);
    assert_eq!(semver("1.2.3.4"), None);
}
