use super::*;
use crate::compat::fixtures::*;

const MIB: u64 = 1 << 20;

/// Limits, the denial's metrics reason, and a part of its message.
type Denial<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);

fn ask_with(limits: &[(&str, &str)], settings: &CompatSettings, facts: &ClassFacts) -> (Result<Ask, CompatError>, Vec<String>) {
    let mut warnings = Vec::new();
    let r = container_ask(&container("cuda", limits), settings, facts, &mut warnings);
    (r, warnings)
}

fn cards(limits: &[(&str, &str)]) -> CardRequest {
    match ask_with(limits, &CompatSettings::hami(), &t4_facts()).0 {
        Ok(Ask::Cards(r)) => r,
        other => panic!("{limits:?}: {other:?}"),
    }
}

fn req(count: u32, memory: MemoryRequest, cores: u32) -> CardRequest {
    CardRequest { count, memory, cores, priority: None }
}

#[test]
fn hami_meaning_of_each_resource_combination() {
    use MemoryRequest::*;
    let cases: &[(&[(&str, &str)], CardRequest)] = &[
        // Source document 003, section 3.1.
        (&[(GPU, "1"), (MEM, "4096"), (CORES, "50")], req(1, Bytes(4096 * MIB), 50)),
        // A count alone is whole, exclusive cards.
        (&[(GPU, "2")], req(2, WholeCard, 100)),
        // No count: defaultGPUNum (1); cores default to defaultCores (0).
        (&[(MEM, "2000")], req(1, Bytes(2000 * MIB), 0)),
        (&[(CORES, "30")], req(1, WholeCard, 30)),
        (&[(PCT, "50")], req(1, Percent(50), 0)),
        // The whole card by percentage is exclusive too, unless cores are given.
        (&[(GPU, "1"), (PCT, "100")], req(1, WholeCard, 100)),
        (&[(GPU, "1"), (PCT, "100"), (CORES, "30")], req(1, WholeCard, 30)),
        // A quantity with a suffix is taken as written.
        (&[(GPU, "1"), (MEM, "8Gi")], req(1, Bytes(8 << 30), 0)),
        (&[(GPU, "1"), (MEM, "4e3")], req(1, Bytes(4000 * MIB), 0)),
        (&[(GPU, "1"), (CORES, "0")], req(1, WholeCard, 0)),
    ];
    for (limits, want) in cases {
        assert_eq!(&cards(limits), want, "{limits:?}");
    }
}

#[test]
fn requests_count_like_limits_and_must_agree_with_them() {
    let mut w = Vec::new();
    let c = with_requests("cuda", &[], &[(GPU, "1"), (MEM, "1024")]);
    let got = container_ask(&c, &CompatSettings::hami(), &t4_facts(), &mut w).unwrap();
    assert_eq!(got, Ask::Cards(req(1, MemoryRequest::Bytes(1024 * MIB), 0)));
    // Compared as quantities, as the API server compares them: 1024 and 1Gi differ.
    let c = with_requests("cuda", &[(GPU, "1"), (MEM, "1024")], &[(MEM, "1Gi")]);
    assert_eq!(container_ask(&c, &CompatSettings::hami(), &t4_facts(), &mut w).unwrap_err().reason(), "limit_request_differ");
    let c = with_requests("cuda", &[(GPU, "1"), (MEM, "1024")], &[(GPU, "1"), (MEM, "1024")]);
    assert!(container_ask(&c, &CompatSettings::hami(), &t4_facts(), &mut w).is_ok());
    let c = with_requests("cuda", &[(GPU, "1")], &[(GPU, "2")]);
    let e = container_ask(&c, &CompatSettings::hami(), &t4_facts(), &mut w).unwrap_err();
    assert_eq!(e.to_string(), "container \"cuda\": nvidia.com/gpu: the limit 1 and the request 2 differ");
}

#[test]
fn configured_defaults_and_factor_apply() {
    let s = CompatSettings {
        default_memory_mib: 2048,
        default_cores: 20,
        default_gpu_num: 3,
        memory_factor: 2,
        ..CompatSettings::hami()
    };
    let f = t4_facts();
    let get = |limits: &[(&str, &str)]| match ask_with(limits, &s, &ClassFacts { max_cards_per_node: 4, ..f.clone() }).0 {
        Ok(Ask::Cards(r)) => r,
        other => panic!("{other:?}"),
    };
    // defaultGPUNum when no count; the factor multiplies plain numbers only.
    assert_eq!(get(&[(MEM, "1024")]), req(3, MemoryRequest::Bytes(2048 * MIB), 20));
    assert_eq!(get(&[(GPU, "1"), (MEM, "1Gi")]), req(1, MemoryRequest::Bytes(1 << 30), 20));
    // The API server stores 2000 as "2k" and 3000 as "3e3"-like canonical forms: still MiB.
    let no_factor = CompatSettings { memory_factor: 1, ..s.clone() };
    let plain = |limits: &[(&str, &str)]| match ask_with(limits, &no_factor, &ClassFacts { max_cards_per_node: 4, ..f.clone() }).0
    {
        Ok(Ask::Cards(r)) => r.memory,
        other => panic!("{other:?}"),
    };
    for (written, mib) in [("2k", 2000), ("2000", 2000), ("3e3", 3000), ("4500", 4500)] {
        assert_eq!(plain(&[(GPU, "1"), (MEM, written)]), MemoryRequest::Bytes(mib * MIB), "{written}");
    }
    // defaultMemory when no memory; HAMi still makes the card exclusive then.
    assert_eq!(get(&[(GPU, "1")]), req(1, MemoryRequest::Bytes(2048 * MIB), 100));
    assert_eq!(get(&[(GPU, "1"), (PCT, "30")]), req(1, MemoryRequest::Percent(30), 20));
}

#[test]
fn zero_values_follow_hami_and_warn() {
    let s = CompatSettings::hami();
    let (r, w) = ask_with(&[(GPU, "0"), (MEM, "1024")], &s, &t4_facts());
    assert_eq!(r.unwrap(), Ask::NoDevice);
    assert!(w[0].contains("asks for 0 GPUs"), "{w:?}");
    let (r, w) = ask_with(&[(MEM, "1024")], &CompatSettings { default_gpu_num: 0, ..s.clone() }, &t4_facts());
    assert_eq!(r.unwrap(), Ask::NoDevice);
    assert_eq!(w.len(), 1);
    let (r, w) = ask_with(&[(PRIO, "1")], &s, &t4_facts());
    assert_eq!(r.unwrap(), Ask::NoDevice);
    assert!(w[0].contains("priority has no effect"), "{w:?}");
    // gpumem 0 and percentage 0 are "not set" in HAMi: default memory, but not exclusive.
    for limits in [&[(GPU, "1"), (MEM, "0")], &[(GPU, "1"), (PCT, "0")]] {
        let (r, w) = ask_with(limits, &s, &t4_facts());
        assert_eq!(r.unwrap(), Ask::Cards(req(1, MemoryRequest::WholeCard, 0)), "{limits:?}");
        assert!(w[0].contains("0 is taken as not set"), "{w:?}");
    }
    assert_eq!(ask_with(&[("cpu", "1")], &s, &t4_facts()).0.unwrap(), Ask::Nothing);
}

#[test]
fn priority_is_carried() {
    assert_eq!(cards(&[(GPU, "1"), (PRIO, "0")]).priority, Some(0));
    assert_eq!(cards(&[(GPU, "1"), (MEM, "1000"), (PRIO, "1")]).priority, Some(1));
}

#[test]
fn volcano_names_have_the_same_meaning() {
    let s = CompatSettings::volcano();
    // Source document 000's single pod.
    let limits = [("volcano.sh/vgpu-memory", "2000"), ("volcano.sh/vgpu-cores", "30")];
    let (r, _) = ask_with(&limits, &s, &t4_facts());
    assert_eq!(r.unwrap(), Ask::Cards(req(1, MemoryRequest::Bytes(2000 * MIB), 30)));
    let (r, _) = ask_with(&[("volcano.sh/vgpu-number", "2"), ("volcano.sh/vgpu-memory-percentage", "25")], &s, &t4_facts());
    assert_eq!(r.unwrap(), Ask::Cards(req(2, MemoryRequest::Percent(25), 0)));
    // HAMi's names mean nothing to the Volcano flavour, and the reverse.
    assert_eq!(ask_with(&[(GPU, "1")], &s, &t4_facts()).0.unwrap(), Ask::Nothing);
    assert_eq!(ask_with(&limits, &CompatSettings::hami(), &t4_facts()).0.unwrap(), Ask::Nothing);
    let (e, _) = ask_with(&[("volcano.sh/vgpu-number", "0.5")], &s, &t4_facts());
    assert!(e.unwrap_err().to_string().contains("volcano.sh/vgpu-memory and volcano.sh/vgpu-cores"));
}

/// HAMi clamps cores above 100 to one whole card's 100; so does the conversion, and says so.
#[test]
fn cores_above_one_card_are_one_card_with_a_warning() {
    use MemoryRequest::*;
    for (cores, memory, expected) in
        [("101", None, req(1, WholeCard, 100)), ("150", Some("3000"), req(1, Bytes(3000 * MIB), 100))]
    {
        let mut limits = vec![(GPU, "1"), (CORES, cores)];
        limits.extend(memory.map(|m| (MEM, m)));
        let (asked, warnings) = ask_with(&limits, &CompatSettings::hami(), &t4_facts());
        assert_eq!(asked, Ok(Ask::Cards(expected)), "{limits:?}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(&format!("nvidia.com/gpucores {cores} is more than")) && warnings[0].contains("taken as 100"),
            "{warnings:?}"
        );
    }
    let (_, warnings) = ask_with(&[(GPU, "1"), (CORES, "100")], &CompatSettings::hami(), &t4_facts());
    assert!(warnings.is_empty(), "100 itself is no warning: {warnings:?}");
}

#[test]
fn bad_input_is_denied_naming_container_and_resource() {
    let cases: &[Denial] = &[
        (
            &[(GPU, "0.5")],
            "not_whole",
            "container \"cuda\": nvidia.com/gpu: 0.5 is not a whole number; a share of a card is asked with nvidia.com/gpumem and nvidia.com/gpucores",
        ),
        (&[(GPU, "1500m")], "not_whole", "nvidia.com/gpu: 1500m is not a whole number"),
        (&[(GPU, "-1")], "out_of_range", "nvidia.com/gpu: -1 is out of range, it must be 0 or more"),
        (&[(GPU, "one")], "bad_quantity", "container \"cuda\": nvidia.com/gpu: \"one\" is not a quantity"),
        (&[(PCT, "101")], "out_of_range", "nvidia.com/gpumem-percentage: 101 is out of range, it must be 0 to 100"),
        (&[(PCT, "-1")], "out_of_range", "nvidia.com/gpumem-percentage: -1 is out of range"),
        (&[(PCT, "50.5")], "not_whole", "nvidia.com/gpumem-percentage: 50.5 is not a whole number"),
        (&[(CORES, "-5")], "out_of_range", "nvidia.com/gpucores: -5 is out of range"),
        (
            &[(MEM, "1024"), (PCT, "50")],
            "memory_and_percentage",
            "container \"cuda\": nvidia.com/gpumem and nvidia.com/gpumem-percentage are both set",
        ),
        (&[(MEM, "512Ki")], "memory_too_small", "nvidia.com/gpumem: 512Ki is less than 1Mi"),
        (&[(MEM, "4096.5")], "not_whole", "nvidia.com/gpumem: 4096.5 is not a whole number"),
        (&[(MEM, "-1Gi")], "out_of_range", "nvidia.com/gpumem: -1Gi is out of range"),
        (&[(GPU, "1"), (PRIO, "-1")], "out_of_range", "nvidia.com/priority: -1 is out of range"),
        (
            &[(GPU, "1"), ("nvidia.com/mig-3g.20gb", "1")],
            "mig_and_cards",
            "container \"cuda\" asks for nvidia.com/mig-3g.20gb and nvidia.com/gpu: a container gets MIG instances by profile or cards",
        ),
        (
            &[("nvidia.com/mig-1c.3g.20gb", "1")],
            "unknown_mig_profile",
            "container \"cuda\": nvidia.com/mig-1c.3g.20gb: no card vgpu-dra knows (A100 40/80GB, A800 80GB, H100 80GB, H200 141GB) has MIG profile \"1c.3g.20gb\"",
        ),
        (&[("nvidia.com/mig-1g.10gb", "0.5")], "not_whole", "nvidia.com/mig-1g.10gb: 0.5 is not a whole number"),
        (&[("nvidia.com/mig-1g.10gb", "33")], "too_many_cards", "nvidia.com/mig-1g.10gb: 33 cards is more than"),
    ];
    for (limits, reason, want) in cases {
        let e = ask_with(limits, &CompatSettings::hami(), &t4_facts()).0.unwrap_err();
        assert!(e.to_string().contains(want), "{limits:?}: {e}");
        assert!(e.to_string().contains("\"cuda\""), "{limits:?}: {e}");
        assert_eq!(e.reason(), *reason, "{limits:?}");
    }
}

#[test]
fn what_no_node_holds_now_waits_with_a_warning_and_is_denied_only_when_strict() {
    let cases: &[Denial] = &[
        (&[(GPU, "3")], "too_many_cards", "nvidia.com/gpu: 3 cards is more than any node of the class has (2)"),
        (
            &[(MEM, "15361")],
            "memory_too_large",
            "nvidia.com/gpumem: 16107175936 bytes is more than the largest card of the class has (16106127360 bytes)",
        ),
        (&[(MEM, "16Gi")], "memory_too_large", "nvidia.com/gpumem: 17179869184 bytes is more"),
    ];
    let strict = CompatSettings { strict_fit: true, ..CompatSettings::hami() };
    for (limits, reason, want) in cases {
        let e = ask_with(limits, &strict, &t4_facts()).0.unwrap_err();
        assert!(e.to_string().contains(want), "{limits:?}: {e}");
        assert_eq!(e.reason(), *reason, "{limits:?}");
        // By default the pod is converted as asked and told why it may wait.
        let (ask, warnings) = ask_with(limits, &CompatSettings::hami(), &t4_facts());
        assert!(matches!(ask, Ok(Ask::Cards(_))), "{limits:?}: {ask:?}");
        let resource = limits[0].0;
        assert!(
            warnings.iter().any(|w| w.contains("\"cuda\"") && w.contains(resource) && w.contains("the pod waits until")),
            "{limits:?}: {warnings:?}"
        );
    }
    // The cards asked are the cards requested, not the node's count.
    let (ask, _) = ask_with(&[(GPU, "3")], &CompatSettings::hami(), &t4_facts());
    assert!(matches!(ask, Ok(Ask::Cards(CardRequest { count: 3, .. }))), "{ask:?}");
    // What fits today warns of nothing.
    let (_, warnings) = ask_with(&[(GPU, "2"), (MEM, "15360")], &CompatSettings::hami(), &t4_facts());
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn counts_are_bounded_by_the_api_when_nodes_are_unknown() {
    let (r, _) = ask_with(&[(GPU, "32")], &CompatSettings::hami(), &ClassFacts::default());
    assert!(matches!(r, Ok(Ask::Cards(CardRequest { count: 32, .. }))));
    let (r, _) = ask_with(&[(GPU, "33")], &CompatSettings::hami(), &ClassFacts::default());
    assert_eq!(r.unwrap_err().reason(), "too_many_cards");
    // Unknown card memory: no ceiling on memory either.
    let (r, _) = ask_with(&[(MEM, "81920")], &CompatSettings::hami(), &ClassFacts::default());
    assert!(r.is_ok());
}

#[test]
fn privileged_containers_asking_for_gpus_are_denied() {
    let mut w = Vec::new();
    let c = privileged(container("tools", &[(GPU, "1")]));
    let e = container_ask(&c, &CompatSettings::hami(), &t4_facts(), &mut w).unwrap_err();
    assert_eq!(
        e.to_string(),
        "container \"tools\" is privileged and asks for nvidia.com/gpu: a privileged container sees every GPU and escapes the limits"
    );
    // A privileged container without GPU resources is none of our business.
    let c = privileged(container("tools", &[("cpu", "1")]));
    assert_eq!(container_ask(&c, &CompatSettings::hami(), &t4_facts(), &mut w).unwrap(), Ask::Nothing);
}

#[test]
fn device_config_settings_fill_names_and_defaults() {
    let parsed = crate::device_config::HamiRequestSettings {
        count_resource: "volcano.sh/vgpu-number".into(),
        memory_resource: "volcano.sh/vgpu-memory".into(),
        memory_percentage_resource: "volcano.sh/vgpu-memory-percentage".into(),
        cores_resource: "volcano.sh/vgpu-cores".into(),
        priority_resource: None,
        default_memory_mib: 1024,
        default_cores: 10,
        default_gpu_num: 2,
        memory_factor: 0,
        core_policy: Some("FORCE".into()),
    };
    let s = CompatSettings { device_class: "my-class".into(), ..CompatSettings::hami() }.with_device_config(&parsed);
    assert_eq!(
        s,
        CompatSettings {
            default_memory_mib: 1024,
            default_cores: 10,
            default_gpu_num: 2,
            core_policy: crate::compat::CorePolicy::Force,
            device_class: "my-class".into(),
            ..CompatSettings::volcano()
        }
    );
}

#[test]
fn mig_resources_ask_instances_of_their_profile() {
    let (r, warnings) = ask_with(
        &[("nvidia.com/mig-3g.20gb", "2"), ("nvidia.com/mig-7g.79gb", "1"), ("cpu", "1")],
        &CompatSettings::hami(),
        &t4_facts(),
    );
    assert_eq!(
        r.unwrap(),
        Ask::Instances(vec![
            MigInstances { resource: "nvidia.com/mig-3g.20gb".into(), profiles: vec!["3g.20gb"], count: 2 },
            MigInstances { resource: "nvidia.com/mig-7g.79gb".into(), profiles: vec!["7g.80gb"], count: 1 },
        ])
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    // Volcano's set serves the same names (its device plugin's mixed strategy is NVIDIA's).
    let (r, _) = ask_with(&[("nvidia.com/mig-1g.10gb", "1")], &CompatSettings::volcano(), &t4_facts());
    assert!(matches!(r.unwrap(), Ask::Instances(i) if i[0].profiles == ["1g.10gb"]));
    let (r, warnings) = ask_with(&[("nvidia.com/mig-1g.10gb", "0")], &CompatSettings::hami(), &t4_facts());
    assert_eq!(r.unwrap(), Ask::NoDevice);
    assert_eq!(warnings, ["container \"cuda\" asks for 0 of nvidia.com/mig-1g.10gb: it is removed and gives no MIG instance"]);
    let mut warnings = Vec::new();
    let e = container_ask(
        &privileged(container("cuda", &[("nvidia.com/mig-1g.10gb", "1")])),
        &CompatSettings::hami(),
        &t4_facts(),
        &mut warnings,
    )
    .unwrap_err();
    assert_eq!(e.reason(), "privileged");
}
