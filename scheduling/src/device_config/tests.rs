use super::*;
use crate::{Gpu, Health, Inventory};

const VOLCANO: &str = include_str!("../../testdata/volcano-device-config.yaml");
const HAMI: &str = include_str!("../../testdata/hami-device-config.yaml");

fn parse(text: &str) -> Result<DeviceConfig, DeviceConfigError> {
    DeviceConfig::parse("device-config.yaml", text)
}

fn ignored(c: &DeviceConfig) -> Vec<&str> {
    c.ignored.iter().map(|i| i.key.as_str()).collect()
}

fn gpu(product: &str) -> Gpu {
    Gpu {
        uuid: "GPU-1".into(),
        minor: 0,
        index: 0,
        product_name: product.into(),
        brand: "Tesla".into(),
        memory_bytes: 1 << 30,
        architecture: String::new(),
        compute_capability: (8, 0),
        pci_bus_id: String::new(),
        pcie_root: None,
        multiprocessors: 0,
        mig: None,
        health: Health::Healthy,
    }
}

#[test]
fn volcanos_file_converts_volcano_names_and_keeps_its_mig_geometries() {
    let c = parse(VOLCANO).unwrap();
    assert_eq!(c.form, ConfigForm::Volcano);
    let want = HamiRequestSettings {
        count_resource: "volcano.sh/vgpu-number".into(),
        memory_resource: "volcano.sh/vgpu-memory".into(),
        memory_percentage_resource: "volcano.sh/vgpu-memory-percentage".into(),
        cores_resource: "volcano.sh/vgpu-cores".into(),
        priority_resource: None,
        ..HamiRequestSettings::default()
    };
    assert_eq!(c.compat, want);
    assert_eq!((c.device_split_count, c.core_scaling.map(|r| r.to_string())), (Some(10), Some("1".into())));
    // volcano-vgpu-device-plugin never applies its deviceMemoryScaling; 256 must not publish 256x memory.
    assert_eq!(c.memory_scaling, None);
    assert_eq!(ignored(&c), ["nvidia.overwriteEnv", "nvidia.deviceMemoryScaling"]);
    assert_eq!(c.mig.len(), 1);
    assert_eq!(c.mig[0].models, ["A800-SXM4-80GB"]);
    let groups: Vec<(&str, usize)> = c.mig[0].groups.iter().map(|g| (g.group.as_str(), g.geometries.len())).collect();
    assert_eq!(groups, [("group1", 1), ("group2", 2), ("group3", 1), ("group4", 1)]);
    assert_eq!(c.mig[0].groups[3].geometries[0], MigGeometry { name: "7g.79gb".into(), memory_mib: 80896, count: 1 });
}

#[test]
fn hamis_default_file_is_accepted_with_other_vendors_ignored() {
    let c = parse(HAMI).unwrap();
    assert_eq!(c.form, ConfigForm::Hami);
    assert_eq!(c.compat, HamiRequestSettings { core_policy: Some("default".into()), ..Default::default() });
    assert_eq!(c.memory_scaling.map(|r| r.to_string()), Some("1".into()));
    assert_eq!(
        ignored(&c),
        [
            "nvidia.overwriteEnv",
            "nvidia.preConfiguredDeviceMemory",
            "nvidia.disablecorelimit",
            "nvidia.migstrategy",
            "nvidia.libCudaLogLevel",
            "nvidia.runtimeClassName",
            "nvidia.knownMigGeometries[1].allowedGeometries[0].geometries[0].core",
            "nvidia.knownMigGeometries[1].allowedGeometries[1].geometries[0].core",
            "cambricon",
            "hygon",
            "metax",
            "mthreads",
            "iluvatars",
        ]
    );
    assert_eq!(c.mig.len(), 3);
    assert_eq!(c.mig[0].groups[1].group, "geometry-1");
    assert_eq!(c.mig[2].profiles.len(), 4);
    let inventory = Inventory {
        driver_version: String::new(),
        cuda_driver_version: (12, 4),
        gpus: vec![gpu("NVIDIA A30"), gpu("NVIDIA H100-SXM5-80GB"), gpu("Tesla T4")],
    };
    assert_eq!(c.mig_models_present(&inventory), ["A30", "H100-SXM5-80GB"]);
}

#[test]
fn hami_values_take_effect_and_the_memory_scaling_over_subscribes() {
    let c = parse(
        "nvidia:\n  resourceMemoryName: example.com/mem\n  defaultMem: 2048\n  defaultCores: 30\n  defaultGPUNum: 2\n  \
         gpuMemoryFactor: 1024\n  deviceMemoryScaling: 1.5\nnodeConfig:\n- name: n1\n  deviceSplitCount: 3\n  operatingmode: hami-core\n",
    )
    .unwrap();
    assert_eq!(
        (c.compat.memory_resource.as_str(), c.compat.default_memory_mib, c.compat.default_cores, c.compat.default_gpu_num),
        ("example.com/mem", 2048, 30, 2)
    );
    assert_eq!(c.compat.memory_factor, 1024);
    assert_eq!(c.memory_scaling.map(|r| r.to_string()), Some("1500m".into()));
    assert_eq!(c.node_overrides[0].device_split_count, Some(3));
    // In HAMi's form an unknown key is only listed, wherever it is.
    assert_eq!(ignored(&c), ["nodeConfig[0].operatingmode"]);
}

#[test]
fn our_own_form_reads_as_before() {
    let c = parse(
        "driverName: gpu.example.com\ndeviceSplitCount: 5\ndeviceMemoryScaling: 1.5\nfilterDevices:\n  index: [3]\n\
         nodeConfig:\n- name: [a, b]\n  deviceCoreScaling: 2\n  filterDevices: {uuid: [GPU-x]}\n",
    )
    .unwrap();
    assert_eq!(c.form, ConfigForm::Own);
    assert_eq!(c.driver_name.map(|d| d.to_string()), Some("gpu.example.com".into()));
    assert_eq!((c.device_split_count, c.filter.map(|f| f.indices)), (Some(5), Some(vec![3])));
    assert_eq!(c.node_overrides[0].nodes, ["a", "b"]);
    assert_eq!(c.node_overrides[0].filter.as_ref().map(|f| f.uuids.clone()), Some(vec!["GPU-x".into()]));
    assert!(c.ignored.is_empty());
    assert_eq!(parse("").unwrap(), DeviceConfig::default());
}

#[test]
fn wrong_values_name_file_line_and_key() {
    let cases = [
        (
            "nvidia:\n  deviceSplitCount: ten\n",
            "device-config.yaml line 2: nvidia.deviceSplitCount: expected an integer, got \"ten\"",
        ),
        (
            &VOLCANO.replace("deviceSplitCount: 10 ", "deviceSplitCount: ten "),
            "device-config.yaml line 11: nvidia.deviceSplitCount: expected an integer, got \"ten\"",
        ),
        ("nvidia:\n  defaultCores: 101\n", "line 2: nvidia.defaultCores: 101 is outside 0..=100"),
        ("nvidia:\n  gpuMemoryFactor: 0\n", "line 2: nvidia.gpuMemoryFactor: 0 is outside"),
        ("nvidia:\n  gpuCorePolicy: always\n", "line 2: nvidia.gpuCorePolicy: \"always\" is not one of"),
        ("nvidia:\n  deviceCoreScaling: [1]\n", "line 2: nvidia.deviceCoreScaling: expected a number, got a list"),
        ("nvidia:\n  resourceCountName: gpu\n", "line 2: nvidia.resourceCountName: \"gpu\" is not a resource name"),
        (
            "nvidia:\n  resourceCoreName: nvidia.com/gpu\n",
            "nvidia.resourceCoreName: nvidia.com/gpu is also nvidia.resourceCountName",
        ),
        (
            "deviceSplitCount: 4\nnvidia:\n  deviceSplitCount: 5\n",
            "line 3: nvidia.deviceSplitCount: also set as deviceSplitCount on line 1",
        ),
        ("nvidia:\n  memoryFactor: 1\n  gpuMemoryFactor: 2\n", "line 3: nvidia.gpuMemoryFactor: also set as nvidia.memoryFactor"),
        (
            "nvidia:\n  knownMigGeometries:\n  - models: [A30]\n    allowedGeometries:\n    - - name: big\n        memory: 1\n        count: 1\n",
            "line 5: nvidia.knownMigGeometries[0].allowedGeometries[0].geometries[0].name: \"big\" is not a MIG profile",
        ),
        (
            "nvidia:\n  knownMigGeometries:\n  - models: [A30]\n    allowedGeometries:\n    - - name: 1g.6gb\n        count: 1\n",
            "nvidia.knownMigGeometries[0].allowedGeometries[0].geometries[0].memory: missing",
        ),
        (
            "nvidia:\n  knownMigGeometries:\n  - allowedGeometries: []\n",
            "nvidia.knownMigGeometries[0].models: expected at least one",
        ),
        ("deviceMemoryScaling: 0.5\n", "line 1: deviceMemoryScaling: 0.5 is below 1"),
        ("devicesplitcount: 3\n", "line 1: devicesplitcount: unknown key; expected driverName"),
        ("nodeConfig:\n- deviceSplitCount: 2\n", "nodeConfig[0].name: every entry needs"),
        ("nodeConfig:\n- name: n1\n  deviceCoreScaling: lots\n", "line 3: nodeConfig[0].deviceCoreScaling: "),
        ("driverName: Bad_Name\n", "line 1: driverName: "),
        ("- 1\n", "line 1: the top level: expected a mapping, got a list"),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}:\n  got  {e}\n  want {want}");
    }
    let e = parse("nvidia: [\n").unwrap_err();
    assert!(matches!(e, DeviceConfigError::Syntax { .. }), "{e}");
}
