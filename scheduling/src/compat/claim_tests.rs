use serde_json::json;

use super::*;
use crate::compat::fixtures::*;
use crate::compat::{ANNOTATION_NOUSE_TYPE, ANNOTATION_USE_TYPE, ANNOTATION_USE_UUID};

const MIB: u64 = 1 << 20;

fn spec(request: &CardRequest, selection: &Selection, facts: &ClassFacts) -> Result<serde_json::Value, CompatError> {
    let s = claim_spec("cuda", request, selection, &CompatSettings::hami(), facts)?;
    Ok(serde_json::to_value(s).unwrap())
}

fn req(count: u32, memory: MemoryRequest, cores: u32) -> CardRequest {
    CardRequest { count, memory, cores, priority: None }
}

#[test]
fn seed_pod_becomes_the_seed_claim_request() {
    // Source document 003: nvidia.com/gpu 1, gpumem 4096, gpucores 50.
    let got = spec(&req(1, MemoryRequest::Bytes(4096 * MIB), 50), &Selection::default(), &t4_facts()).unwrap();
    let want = json!({"spec": {"devices": {"requests": [{
        "name": "gpu",
        "exactly": {
            "allocationMode": "ExactCount",
            "count": 1,
            "deviceClassName": "hami-core-gpu.project-hami.io",
            "capacity": {"requests": {"cores": "50", "memory": "4294967296"}},
        },
    }]}}});
    assert_eq!(got, want);
}

#[test]
fn whole_cards_ask_no_memory_and_several_cards_are_distinct() {
    let got = spec(&req(2, MemoryRequest::WholeCard, 100), &Selection::default(), &t4_facts()).unwrap();
    let devices = &got["spec"]["devices"];
    // No memory and no cores request: the device's policy defaults (the whole card, every
    // core) are consumed, which keeps the card to this claim alone.
    assert!(devices["requests"][0]["exactly"].get("capacity").is_none(), "{devices}");
    assert_eq!(devices["requests"][0]["exactly"]["count"], 2);
    assert_eq!(devices["constraints"], json!([{"distinctAttribute": "hami-core-gpu.project-hami.io/uuid", "requests": ["gpu"]}]));
    let one = spec(&req(1, MemoryRequest::WholeCard, 100), &Selection::default(), &t4_facts()).unwrap();
    assert!(one["spec"]["devices"].get("constraints").is_none());
}

#[test]
fn percentage_is_a_prioritized_list_over_the_class_models() {
    let got = spec(&req(1, MemoryRequest::Percent(50), 0), &Selection::default(), &mixed_facts()).unwrap();
    let request = &got["spec"]["devices"]["requests"][0];
    assert!(request.get("exactly").is_none());
    let subs = request["firstAvailable"].as_array().unwrap();
    assert_eq!(subs.len(), 2);
    let a = r#"device.attributes["hami-core-gpu.project-hami.io"]"#;
    let c = r#"device.capacity["hami-core-gpu.project-hami.io"]"#;
    // Sorted by model, whatever the order of the slices.
    assert_eq!(
        subs[0],
        json!({
            "name": "card0-nvidia-a100-sxm4-80gb",
            "allocationMode": "ExactCount",
            "count": 1,
            "deviceClassName": "hami-core-gpu.project-hami.io",
            "capacity": {"requests": {"cores": "0", "memory": (40u64 << 30).to_string()}},
            "selectors": [{"cel": {"expression":
                format!(r#"{a}.productName == "NVIDIA A100-SXM4-80GB" && {c}.memory.compareTo(quantity("85899345920")) == 0"#)}}],
        })
    );
    assert_eq!(subs[1]["name"], "card1-tesla-t4");
    assert_eq!(subs[1]["capacity"]["requests"]["memory"], (7680 * MIB).to_string());
    assert!(got["spec"]["devices"].get("constraints").is_none());
}

#[test]
fn several_cards_at_a_percentage_each_choose_their_own_model() {
    // HAMi takes each card's share of that card's memory: two cards may be an A100 and a T4.
    let got = spec(&req(3, MemoryRequest::Percent(50), 0), &Selection::default(), &mixed_facts()).unwrap();
    let requests = got["spec"]["devices"]["requests"].as_array().unwrap();
    let names: Vec<&str> = requests.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2"]);
    for r in requests {
        let subs = r["firstAvailable"].as_array().unwrap();
        assert_eq!(subs.len(), 2, "{r}");
        assert!(subs.iter().all(|s| s["count"] == 1), "{r}");
        assert_eq!(subs[1]["capacity"]["requests"]["memory"], (7680 * MIB).to_string());
    }
    // The cards stay distinct across the requests, whichever model each picks.
    assert_eq!(
        got["spec"]["devices"]["constraints"],
        json!([{"distinctAttribute": "hami-core-gpu.project-hami.io/uuid", "requests": ["gpu-0", "gpu-1", "gpu-2"]}])
    );
    // One model: one request of N, as for plain memory.
    let one_model = spec(&req(2, MemoryRequest::Percent(50), 0), &Selection::default(), &t4_facts()).unwrap();
    let request = &one_model["spec"]["devices"]["requests"];
    assert_eq!(request.as_array().unwrap().len(), 1);
    assert_eq!(request[0]["name"], "gpu");
    assert_eq!(request[0]["firstAvailable"][0]["count"], 2);
    assert_eq!(one_model["spec"]["devices"]["constraints"][0]["requests"], json!(["gpu"]));
}

#[test]
fn percentage_rounds_down_to_whole_mib_of_the_picked_card() {
    let odd = ClassFacts::new([CardModel { product_name: "NVIDIA H200".into(), memory_bytes: 143_771 * MIB }], 8);
    let got = spec(&req(1, MemoryRequest::Percent(33), 0), &Selection::default(), &odd).unwrap();
    let memory = &got["spec"]["devices"]["requests"][0]["firstAvailable"][0]["capacity"]["requests"]["memory"];
    assert_eq!(memory, &json!((143_771 * 33 / 100 * MIB).to_string()));
}

#[test]
fn annotations_add_selectors_and_narrow_the_models() {
    let sel = Selection::from_annotations(&annotations(&[(ANNOTATION_USE_TYPE, "t4"), (ANNOTATION_USE_UUID, "GPU-1")]));
    let got = spec(&req(1, MemoryRequest::Percent(50), 0), &sel, &mixed_facts()).unwrap();
    let subs = got["spec"]["devices"]["requests"][0]["firstAvailable"].as_array().unwrap();
    assert_eq!(subs.len(), 1, "the A100 is not selectable");
    assert_eq!(subs[0]["selectors"].as_array().unwrap().len(), 3);
    let got = spec(&req(1, MemoryRequest::Bytes(MIB), 10), &sel, &mixed_facts()).unwrap();
    assert_eq!(got["spec"]["devices"]["requests"][0]["exactly"]["selectors"].as_array().unwrap().len(), 2);
}

#[test]
fn percentages_that_cannot_be_expressed_are_denied() {
    let pct = req(1, MemoryRequest::Percent(50), 0);
    let e = spec(&pct, &Selection::default(), &ClassFacts::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "container \"cuda\": nvidia.com/gpumem-percentage: no card of the class is published yet nor named by the webhook's --card-model, so a percentage of its memory cannot be expressed"
    );
    let no_t4 = Selection::from_annotations(&annotations(&[(ANNOTATION_NOUSE_TYPE, "T4")]));
    assert_eq!(spec(&pct, &no_t4, &t4_facts()).unwrap_err().reason(), "no_card_model");
    let nine = ClassFacts::new((0..9).map(|i| CardModel { product_name: format!("Model {i}"), memory_bytes: 16 << 30 }), 8);
    let e = spec(&pct, &Selection::default(), &nine).unwrap_err();
    assert_eq!(e.reason(), "too_many_card_models");
    assert!(e.to_string().contains("9 card models, more than the 8"), "{e}");
    let one = Selection::from_annotations(&annotations(&[(ANNOTATION_USE_TYPE, "model 3")]));
    assert!(spec(&pct, &one, &nine).is_ok());
    // 100 % is the whole card and needs no model.
    assert!(spec(&req(1, MemoryRequest::WholeCard, 100), &Selection::default(), &ClassFacts::default()).is_ok());
}

#[test]
fn priority_and_core_policy_travel_as_opaque_config() {
    let mut r = req(1, MemoryRequest::Bytes(MIB), 10);
    r.priority = Some(0);
    let settings = CompatSettings { core_policy: CorePolicy::Force, ..CompatSettings::hami() };
    let got = serde_json::to_value(claim_spec("cuda", &r, &Selection::default(), &settings, &t4_facts()).unwrap()).unwrap();
    assert_eq!(
        got["spec"]["devices"]["config"],
        json!([{"requests": ["gpu"], "opaque": {"driver": "hami-core-gpu.project-hami.io", "parameters": {
            "apiVersion": "hami-core-gpu.project-hami.io/v1alpha1", "kind": "HamiCoreConfig",
            "taskPriority": 0, "coreUtilizationPolicy": "force"}}}])
    );
    let plain = spec(&req(1, MemoryRequest::Bytes(MIB), 10), &Selection::default(), &t4_facts()).unwrap();
    assert!(plain["spec"]["devices"].get("config").is_none());
}

#[test]
fn hami_core_config_round_trips_and_names_the_env() {
    let c = HamiCoreConfig { task_priority: Some(1), core_utilization_policy: CorePolicy::Disable };
    let back = HamiCoreConfig::from_parameters(&c.to_parameters()).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.env(), [("CUDA_TASK_PRIORITY", "1".to_owned()), ("GPU_CORE_UTILIZATION_POLICY", "disable".to_owned())]);
    assert!(HamiCoreConfig::default().env().is_empty());
    let other = json!({"apiVersion": "gpu.nvidia.com/v1beta1", "kind": "GpuConfig"});
    assert!(matches!(HamiCoreConfig::from_parameters(&other), Err(HamiCoreConfigError::OtherType { .. })));
    let bad = json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "taskPriority": "high"});
    assert!(matches!(HamiCoreConfig::from_parameters(&bad), Err(HamiCoreConfigError::Invalid(_))));
}

#[test]
fn template_names_are_stable_content_hashes() {
    let s = |cores| {
        claim_spec(
            "a",
            &req(1, MemoryRequest::Bytes(4096 * MIB), cores),
            &Selection::default(),
            &CompatSettings::hami(),
            &t4_facts(),
        )
    };
    let name = template_name(&s(50).unwrap());
    // Pinned: a change here orphans every template made by earlier releases.
    assert_eq!(name, "hami-vgpu-f0729609fe2abd5a");
    // The container name does not take part; the content does.
    let other = claim_spec(
        "b",
        &req(1, MemoryRequest::Bytes(4096 * MIB), 50),
        &Selection::default(),
        &CompatSettings::hami(),
        &t4_facts(),
    );
    assert_eq!(template_name(&other.unwrap()), name);
    assert_ne!(template_name(&s(51).unwrap()), name);
    assert_eq!(name.len(), TEMPLATE_PREFIX.len() + 16);
    assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
}

#[test]
fn subrequest_names_are_dns_labels() {
    let long = "NVIDIA  Graphics Device (rev a1) / with a very long marketing name that keeps going on";
    for (i, model) in [(0, "Tesla T4"), (7, "--weird--"), (3, long), (1, "")] {
        let n = subrequest_name(i, model);
        assert!(n.len() <= 63 && !n.ends_with('-') && n.starts_with("card"), "{n}");
        assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'), "{n}");
    }
}

#[test]
fn class_facts_come_from_the_drivers_slices() {
    let device = |name: &str, product: &str, memory: &str| {
        json!({"name": name, "attributes": {"productName": {"string": product}, "type": {"string": "hami-gpu"}},
               "capacity": {"memory": {"value": memory}, "cores": {"value": "100"}}})
    };
    let slice = |driver: &str, pool: &str, devices: Vec<serde_json::Value>| {
        serde_json::from_value::<k8s_openapi::api::resource::v1::ResourceSlice>(json!({
            "metadata": {"name": format!("{pool}-{driver}")},
            "spec": {"driver": driver, "nodeName": pool, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap()
    };
    let driver = "hami-core-gpu.project-hami.io";
    let slices = [
        slice(driver, "node-a", vec![device("hami-gpu-0", "Tesla T4", "15Gi"), device("hami-gpu-1", "Tesla T4", "15Gi")]),
        // A dynamic-MIG device is neither a card nor a model (its card is hami-gpu-0).
        slice(
            driver,
            "node-b",
            vec![device("hami-gpu-0", "NVIDIA A100-SXM4-80GB", "80Gi"), {
                let mut mig = device("hami-gpu-0-mig-1g-10gb-0", "NVIDIA A100-SXM4-80GB", "9728Mi");
                mig["attributes"]["type"] = json!({"string": "hami-mig"});
                mig
            }],
        ),
        slice(
            driver,
            "node-b",
            vec![device("hami-gpu-1", "NVIDIA A100-SXM4-80GB", "80Gi"), device("hami-gpu-2", "NVIDIA A100-SXM4-80GB", "80Gi")],
        ),
        slice("gpu.nvidia.com", "node-c", (0..8).map(|i| device(&format!("gpu-{i}"), "H100", "80Gi")).collect()),
    ];
    let facts = ClassFacts::from_slices(&slices, driver);
    assert_eq!(facts, mixed_facts_with(3));
    assert_eq!(facts.largest_memory(), Some(A100_BYTES));
}

fn mixed_facts_with(max_cards_per_node: u32) -> ClassFacts {
    ClassFacts { max_cards_per_node, ..mixed_facts() }
}

/// HAMi's fit rules, as the scheduler applies the published policies to converted claims: one
/// card, claims arriving and leaving in any order, each placed when every capacity it consumes
/// still fits (the scheduler's check, with [`crate::Capacity::consumed_by`]'s rounding).
mod fit_rules {
    use proptest::prelude::*;

    use super::*;
    use crate::config::{Ratio, SharingConfig};
    use crate::device::{CAPACITY_SHARES, PublishedDevice};
    use crate::model::{Gpu, Health, Inventory};
    use crate::{Quantity, publish};

    fn card(split: u32, core_scaling: &str) -> PublishedDevice {
        let gpu = Gpu {
            uuid: "GPU-0".into(),
            minor: 0,
            index: 0,
            product_name: "Tesla T4".into(),
            brand: "Tesla".into(),
            memory_bytes: T4_BYTES,
            architecture: String::new(),
            compute_capability: (7, 5),
            pci_bus_id: String::new(),
            pcie_root: None,
            multiprocessors: 40,
            mig: None,
            health: Health::Healthy,
        };
        let config = SharingConfig {
            device_split_count: split,
            core_scaling: Ratio::parse("deviceCoreScaling", core_scaling).unwrap(),
            ..SharingConfig::default()
        };
        let inventory = Inventory { driver_version: "550.54.15".into(), cuda_driver_version: (12, 4), gpus: vec![gpu] };
        publish(&inventory, &config).remove(0)
    }

    /// What a converted container of `cores` and `mib` consumes of `card`, or `None` when a
    /// policy refuses it outright.
    fn consumption(card: &PublishedDevice, cores: u32, mib: u64) -> Option<Vec<(String, Quantity)>> {
        let memory = if mib == 0 { MemoryRequest::WholeCard } else { MemoryRequest::Bytes(mib * MIB) };
        let spec = claim_spec("c", &req(1, memory, cores), &Selection::default(), &CompatSettings::hami(), &t4_facts()).unwrap();
        let request = spec.spec.devices.unwrap().requests.unwrap().remove(0).exactly.unwrap();
        let asked = request.capacity.and_then(|c| c.requests).unwrap_or_default();
        card.capacity
            .iter()
            .map(|(name, capacity)| {
                let q = asked.get(name).map(|q| Quantity::parse(&q.0).unwrap());
                capacity.consumed_by(q).ok().map(|c| (name.clone(), c))
            })
            .collect()
    }

    fn fits(card: &PublishedDevice, held: &[Vec<(String, Quantity)>], new: &[(String, Quantity)]) -> bool {
        new.iter().all(|(name, amount)| {
            let used =
                held.iter().flatten().filter(|(n, _)| n == name).fold(Quantity::ZERO, |a, (_, q)| a.checked_add(*q).unwrap());
            used.checked_add(*amount).unwrap() <= card.capacity[name].value
        })
    }

    #[derive(Debug, Clone)]
    enum Step {
        Arrive { cores: u32, mib: u64 },
        Leave(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (prop_oneof![Just(0u32), Just(100u32), 1u32..100], prop_oneof![Just(0u64), 1u64..8000])
                .prop_map(|(cores, mib)| Step::Arrive { cores, mib }),
            (0usize..16).prop_map(Step::Leave),
        ]
    }

    proptest! {
        #[test]
        fn cores_100_is_alone_and_cores_0_never_joins_a_card_whose_cores_are_all_held(
            split in 1u32..12,
            scaling in prop_oneof![Just("1"), Just("2"), Just("1.5")],
            steps in proptest::collection::vec(step(), 1..40),
        ) {
            let card = card(split, scaling);
            let mut held: Vec<(u32, Vec<(String, Quantity)>)> = Vec::new();
            for step in steps {
                match step {
                    Step::Leave(i) => if !held.is_empty() { held.remove(i % held.len()); },
                    Step::Arrive { cores, mib } => {
                        let Some(new) = consumption(&card, cores, mib) else { continue };
                        let shares: Vec<_> = held.iter().map(|(_, c)| c.clone()).collect();
                        let cores_used = shares.iter().flatten().filter(|(n, _)| n == CAPACITY_CORES)
                            .fold(Quantity::ZERO, |a, (_, q)| a.checked_add(*q).unwrap());
                        let placed = fits(&card, &shares, &new);
                        if cores == 100 {
                            prop_assert_eq!(placed, held.is_empty() && mib * MIB <= T4_BYTES, "cores 100 takes only an unheld card");
                        }
                        if cores == 0 && cores_used >= card.capacity[CAPACITY_CORES].value {
                            prop_assert!(!placed, "cores 0 joined a card whose cores are all held");
                        }
                        if placed {
                            held.push((cores, new));
                        }
                    }
                }
                if held.iter().any(|(cores, _)| *cores == 100) {
                    prop_assert_eq!(held.len(), 1, "a cores-100 share has company");
                }
                prop_assert!(held.len() <= split as usize);
                let shares_used: usize = held.len();
                prop_assert!(shares_used <= card.capacity[CAPACITY_SHARES].value.value_ceil().unwrap() as usize);
            }
        }
    }

    #[test]
    fn the_minimal_cores_charge_is_no_sm_limit_and_cores_100_the_whole_card() {
        let card = card(10, "1");
        let zero = consumption(&card, 0, 1000).unwrap();
        let cores = |c: &[(String, Quantity)]| c.iter().find(|(n, _)| n == CAPACITY_CORES).unwrap().1;
        assert_eq!(cores(&zero), crate::device::MIN_CORES);
        assert_eq!(crate::limits::sm_limit(cores(&zero)), "0");
        assert_eq!(cores(&consumption(&card, 30, 1000).unwrap()).to_string(), "30");
        let scaled = card_scaled();
        assert_eq!(cores(&consumption(&scaled, 100, 1000).unwrap()).to_string(), "200", "every core, scaled or not");
        assert_eq!(crate::limits::sm_limit(cores(&consumption(&scaled, 100, 1000).unwrap())), "100");
    }

    fn card_scaled() -> PublishedDevice {
        card(10, "2")
    }
}

#[test]
fn card_models_from_flags_parse_and_make_a_percentage_expressible_before_any_node() {
    let a100 = CardModel::parse("NVIDIA A100-SXM4-80GB=81920Mi").unwrap();
    assert_eq!((a100.product_name.as_str(), a100.memory_bytes), ("NVIDIA A100-SXM4-80GB", 81920 * MIB));
    for bad in ["Tesla T4", "=15Gi", "Tesla T4=lots", "Tesla T4=0", "Tesla T4=-1Gi", "Tesla T4=1.5"] {
        let e = CardModel::parse(bad).unwrap_err();
        assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
    }
    let request = req(1, MemoryRequest::Percent(50), 30);
    assert!(spec(&request, &Selection::default(), &ClassFacts::default()).is_err());
    let known = ClassFacts::default().with_models([a100]);
    let got = spec(&request, &Selection::default(), &known).unwrap();
    let memory = &got["spec"]["devices"]["requests"][0]["firstAvailable"][0]["capacity"]["requests"]["memory"];
    assert_eq!(memory, &json!((40960 * MIB).to_string()));
}
