use super::*;
use crate::{DeviceConfig, MigGeometry, MigGeometryGroup};

const VOLCANO: &str = include_str!("../testdata/volcano-device-config.yaml");
const HAMI: &str = include_str!("../testdata/hami-device-config.yaml");

fn model(product: &str, mib: u64) -> &'static MigModel {
    model_for(product, mib << 20).unwrap_or_else(|| panic!("{product} with {mib} MiB has no model"))
}

fn a800() -> &'static MigModel {
    model("NVIDIA A800-SXM4-80GB", 81920)
}

fn at(model: &'static MigModel, name: &str, start: u8) -> Placement {
    model.placement(model.profile_named(name).unwrap(), start).unwrap()
}

/// Whether the placements' consumption fits the card's counters.
fn fits(model: &MigModel, set: &[Placement]) -> bool {
    let mut left = model.counters();
    for (counter, used) in set.iter().flat_map(Placement::consumes) {
        match left.get_mut(&counter) {
            Some(l) if *l >= used => *l -= used,
            _ => return false,
        }
    }
    true
}

/// NVIDIA's rules, in their own arithmetic (not the counters, not `Placement::overlaps`): no
/// memory slice taken twice, at most 7 compute slices, at most one `+me` instance.
fn nvidia_allows(set: &[Placement]) -> bool {
    let mut taken = [false; MEMORY_SLICES as usize];
    for p in set {
        for s in p.start()..p.start() + p.profile().memory_slices() {
            if std::mem::replace(&mut taken[usize::from(s)], true) {
                return false;
            }
        }
    }
    let compute: u32 = set.iter().map(|p| u32::from(p.profile().compute_slices())).sum();
    compute <= u32::from(COMPUTE_SLICES) && set.iter().filter(|p| p.profile().media_extension()).count() <= 1
}

/// Every set of placements (as sorted indexes into `all`) that `ok` accepts. `ok` must hold for
/// every subset of a set it holds for (both predicates above do), so growing stops at the first
/// refusal and the search stays small.
fn sets(all: &[Placement], ok: &dyn Fn(&[Placement]) -> bool) -> BTreeSet<Vec<usize>> {
    fn grow(
        all: &[Placement],
        ok: &dyn Fn(&[Placement]) -> bool,
        from: usize,
        cur: &mut Vec<usize>,
        out: &mut BTreeSet<Vec<usize>>,
    ) {
        out.insert(cur.clone());
        for next in from..all.len() {
            cur.push(next);
            let set: Vec<Placement> = cur.iter().map(|&i| all[i]).collect();
            if ok(&set) {
                grow(all, ok, next + 1, cur, out);
            }
            cur.pop();
        }
    }
    let mut out = BTreeSet::new();
    grow(all, ok, 0, &mut Vec::new(), &mut out);
    out
}

#[test]
fn nvml_product_names_find_their_model() {
    let cases: &[(&str, u64, Option<&str>)] = &[
        ("NVIDIA A100-SXM4-40GB", 40536, Some("A100-40GB")),
        ("A100-SXM4-40GB", 40537, Some("A100-40GB")),
        ("NVIDIA A100-PCIE-40GB", 40960, Some("A100-40GB")),
        ("NVIDIA A100-SXM4-80GB", 81920, Some("A100-80GB")),
        ("NVIDIA A100 80GB PCIe", 81920, Some("A100-80GB")),
        ("NVIDIA A800-SXM4-80GB", 81920, Some("A100-80GB")),
        ("nvidia a800-sxm4-80gb", 81920, Some("A100-80GB")),
        ("NVIDIA H100 80GB HBM3", 81559, Some("H100-80GB")),
        ("NVIDIA H100 PCIe", 81559, Some("H100-80GB")),
        ("NVIDIA H200", 143771, Some("H200-141GB")),
        ("NVIDIA H200 NVL", 143771, Some("H200-141GB")),
        // Other profiles (1g.12gb ...), or no MIG at all.
        ("NVIDIA H100 NVL", 95830, None),
        ("NVIDIA H20", 97871, None),
        ("Tesla T4", 15360, None),
        // A token, not a substring: an RTX A1000 is no A100, whatever its memory.
        ("NVIDIA RTX A1000", 81920, None),
    ];
    for &(product, mib, want) in cases {
        assert_eq!(model_for(product, mib << 20).map(MigModel::name), want, "{product}");
    }
}

#[test]
fn every_model_has_the_geometry_of_nvidias_table() {
    let want: [(u32, &str, u8, u8, &[u8]); 7] = [
        (19, "1g.10gb", 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
        (20, "1g.10gb+me", 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
        (15, "1g.20gb", 1, 2, &[0, 2, 4, 6]),
        (14, "2g.20gb", 2, 2, &[0, 2, 4]),
        (9, "3g.40gb", 3, 4, &[0, 4]),
        (5, "4g.40gb", 4, 4, &[0]),
        (0, "7g.80gb", 7, 8, &[0]),
    ];
    let got: Vec<_> =
        a800().profiles().iter().map(|p| (p.id(), p.name(), p.compute_slices(), p.memory_slices(), p.starts())).collect();
    assert_eq!(got, want);
    for m in models() {
        let ids: Vec<u32> = m.profiles().iter().map(MigProfile::id).collect();
        assert_eq!(ids, [19, 20, 15, 14, 9, 5, 0], "{}", m.name());
        let me: Vec<&str> = m.profiles().iter().filter(|p| p.media_extension()).map(MigProfile::name).collect();
        assert!(me.len() == 1 && me[0].ends_with("+me"), "{}: {me:?}", m.name());
        for p in m.profiles() {
            assert!(p.starts().iter().all(|s| s + p.memory_slices() <= MEMORY_SLICES), "{} {}", m.name(), p.name());
        }
    }
}

#[test]
fn memory_figures_sit_just_under_the_profile_name_and_grow_with_slices() {
    for m in models() {
        let one_slice = m.profiles()[0].memory_mib();
        for p in m.profiles() {
            let (_, gb, _) = MigProfile::parse_name(p.name()).unwrap();
            // Names round the instance's GiB up: a figure above its name or 1.5 GiB under it is a typo.
            assert!(p.memory_mib() <= gb * 1024 && p.memory_mib() * 2 > (gb * 2 - 3) * 1024, "{} {}", m.name(), p.name());
            assert!(p.memory_mib() >= u64::from(p.memory_slices()) * one_slice, "{} {}", m.name(), p.name());
            let same_slices = m.profiles().iter().filter(|q| q.memory_slices() == p.memory_slices());
            assert!(same_slices.clone().all(|q| q.memory_mib() == p.memory_mib()), "{} {}", m.name(), p.name());
        }
    }
    assert_eq!(a800().profile_named("1g.10gb").unwrap().memory_mib(), 9728);
}

#[test]
fn volcanos_7g_79gb_is_the_80gb_cards_full_profile_with_the_same_memory() {
    let config = DeviceConfig::parse("device-config.yaml", VOLCANO).unwrap();
    let geometry = &config.mig[0].groups[3].geometries[0];
    let full = a800().profile_named(&geometry.name).unwrap();
    assert_eq!((full.name(), full.memory_mib()), ("7g.80gb", geometry.memory_mib));
    // Tolerance is one gigabyte, same compute, same +me: nothing else slips through.
    for name in ["1g.5gb", "1g.10gb+me+me", "8g.80gb", "7g.82gb", "big"] {
        assert_eq!(a800().profile_named(name), None, "{name}");
    }
    assert_eq!(a800().profile_named("1G.10GB+ME").map(MigProfile::name), Some("1g.10gb+me"));
}

#[test]
fn placements_are_every_valid_start_and_nothing_else() {
    let m = a800();
    assert_eq!(m.placements().len(), 7 + 7 + 4 + 3 + 2 + 1 + 1);
    let p = |name| m.profile_named(name).unwrap();
    assert_eq!(m.placement(p("2g.20gb"), 6), None);
    assert_eq!(m.placement(p("3g.40gb"), 2), None);
    assert_eq!(m.placement(p("1g.10gb"), 7), None);
    let h100 = model("NVIDIA H100 80GB HBM3", 81559);
    assert_eq!(m.placement(h100.profile_named("1g.10gb").unwrap(), 0), None, "another model's profile");
    assert_eq!(at(m, "3g.40gb", 4).slots(), 4..8);
}

#[test]
fn overlaps_means_a_shared_memory_slice() {
    let m = a800();
    assert!(at(m, "1g.20gb", 6).overlaps(&at(m, "1g.10gb", 6)));
    assert!(at(m, "3g.40gb", 4).overlaps(&at(m, "1g.20gb", 6)));
    assert!(at(m, "7g.80gb", 0).overlaps(&at(m, "1g.10gb", 5)));
    assert!(!at(m, "2g.20gb", 0).overlaps(&at(m, "2g.20gb", 2)));
    assert!(!at(m, "4g.40gb", 0).overlaps(&at(m, "3g.40gb", 4)));
}

#[test]
fn consumption_names_slices_compute_and_media() {
    let m = a800();
    let want = |pairs: &[(&str, u64)]| pairs.iter().map(|&(k, v)| (k.to_owned(), v)).collect::<BTreeMap<_, _>>();
    assert_eq!(
        at(m, "3g.40gb", 4).consumes(),
        want(&[
            ("compute-slices", 3),
            ("memory-slice-4", 1),
            ("memory-slice-5", 1),
            ("memory-slice-6", 1),
            ("memory-slice-7", 1)
        ])
    );
    assert_eq!(at(m, "1g.10gb+me", 2).consumes(), want(&[("compute-slices", 1), ("media-extensions", 1), ("memory-slice-2", 1)]));
    let counters = m.counters();
    assert_eq!(counters.len(), 10);
    assert_eq!((counters["compute-slices"], counters["memory-slice-7"], counters["media-extensions"]), (7, 1, 1));
}

#[test]
fn sets_fit_the_counters_exactly_when_nvidia_allows_them() {
    for m in models() {
        let all = m.placements();
        let by_counters = sets(&all, &|set| fits(m, set));
        let by_nvidia = sets(&all, &nvidia_allows);
        assert_eq!(by_counters, by_nvidia, "{}", m.name());
        // Every single placement, every pair NVIDIA allows, and the full layouts are among them.
        assert!(by_nvidia.len() > 500, "{}: only {} layouts", m.name(), by_nvidia.len());
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                let both_me = a.profile().media_extension() && b.profile().media_extension();
                assert_eq!(fits(m, &[*a, *b]), !a.overlaps(b) && !both_me);
            }
        }
    }
}

#[test]
fn seven_1g_10gb_fit_and_an_eighth_instance_does_not() {
    let m = a800();
    let seven: Vec<Placement> = (0..7).map(|s| at(m, "1g.10gb", s)).collect();
    assert!(fits(m, &seven));
    for extra in m.placements() {
        let mut eight = seven.clone();
        eight.push(extra);
        assert!(!fits(m, &eight), "{} at {}", extra.profile().name(), extra.start());
    }
}

#[test]
fn the_whole_card_consumes_every_counter_any_placement_needs() {
    // The whole-card device consumes `counters()`; each placement needs some of them, so the
    // scheduler never allocates the card and an instance of it together.
    for m in models() {
        let whole = m.counters();
        for p in m.placements() {
            let used = p.consumes();
            assert!(!used.is_empty() && used.iter().all(|(k, v)| whole.get(k).is_some_and(|total| v <= total)));
        }
    }
}

#[test]
fn device_names_are_dns_labels_for_every_placement() {
    assert_eq!(at(a800(), "1g.10gb+me", 3).device_name(0).as_str(), "hami-gpu-0-mig-1g-10gb-me-3");
    for m in models() {
        let names: BTreeSet<String> = m.placements().iter().map(|p| p.device_name(u32::MAX).to_string()).collect();
        assert_eq!(names.len(), m.placements().len(), "{}: names are unique per card", m.name());
        assert!(names.iter().all(|n| n.len() <= 36), "{names:?}");
    }
}

#[test]
fn smallest_covering_takes_least_memory_then_least_compute() {
    let m = a800();
    let pick = |mib, allowed: Option<&[&str]>| smallest_covering(m, mib, allowed).map(MigProfile::name);
    assert_eq!(pick(9000, None), Some("1g.10gb"));
    // Unrestricted, 15000 MiB gets 1g.20gb: as much memory as 2g.20gb, one compute slice fewer.
    assert_eq!(pick(15000, None), Some("1g.20gb"));
    assert_eq!(pick(40192, None), Some("3g.40gb"));
    assert_eq!(pick(40193, None), Some("7g.80gb"));
    assert_eq!(pick(90000, None), None);
    assert_eq!(pick(0, Some(&["2g.20gb"])), Some("2g.20gb"));
    // +me only when nothing else allowed covers the request.
    assert_eq!(pick(9000, Some(&["1g.10gb+me", "2g.20gb"])), Some("2g.20gb"));
    assert_eq!(pick(9000, Some(&["1g.10gb+me"])), Some("1g.10gb+me"));
    assert_eq!(pick(9000, Some(&[])), None);
}

#[test]
fn volcanos_a800_geometries_give_15000_mib_a_2g_20gb() {
    // Source document 001's groups offer 1g.10gb, 2g.20gb, 3g.40gb and 7g.79gb on the A800, no
    // 1g.20gb: there the smallest profile covering 15000 MiB is 2g.20gb (issue #36).
    let config = DeviceConfig::parse("device-config.yaml", VOLCANO).unwrap();
    let m = a800();
    let allowed = allowed_profiles(m, "NVIDIA A800-SXM4-80GB", &config.mig).unwrap().unwrap();
    assert_eq!(allowed, ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]);
    let pick = |mib| smallest_covering(m, mib, Some(&allowed)).map(MigProfile::name);
    assert_eq!(
        (pick(9000), pick(15000), pick(30000), pick(50000)),
        (Some("1g.10gb"), Some("2g.20gb"), Some("3g.40gb"), Some("7g.80gb"))
    );
    // A card no entry names keeps every profile.
    assert_eq!(allowed_profiles(m, "NVIDIA A100-SXM4-80GB", &config.mig), Ok(None));
}

#[test]
fn hamis_geometries_and_allowlist_resolve_on_their_cards() {
    let config = DeviceConfig::parse("device-config.yaml", HAMI).unwrap();
    let a100 = model("NVIDIA A100-PCIE-40GB", 40960);
    assert_eq!(allowed_profiles(a100, "NVIDIA A100-PCIE-40GB", &config.mig), Ok(Some(vec!["1g.5gb", "3g.20gb"])));
    let h100 = model("NVIDIA H100 80GB HBM3", 81559);
    // HAMi's spelling of the model, which its allowlist entry names ...
    let allowlisted = allowed_profiles(h100, "H100-PCIE-80GB", &config.mig).unwrap();
    assert_eq!(allowlisted, Some(vec!["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]));
    // ... is not NVML's: a model matches as part of the product name, as in HAMi, so that entry
    // reaches neither real H100.
    assert_eq!(allowed_profiles(h100, "NVIDIA H100 80GB HBM3", &config.mig), Ok(None));
    assert_eq!(allowed_profiles(h100, "NVIDIA H100 PCIe", &config.mig), Ok(None));
}

#[test]
fn a_profile_the_card_lacks_is_an_error_naming_entry_and_card() {
    let config = [MigModels {
        models: vec!["A800".into()],
        groups: vec![MigGeometryGroup {
            group: "g".into(),
            geometries: vec![MigGeometry { name: "1g.5gb".into(), memory_mib: 5120, count: 7 }],
        }],
        profiles: Vec::new(),
    }];
    let err = allowed_profiles(a800(), "NVIDIA A800-SXM4-80GB", &config).unwrap_err();
    assert_eq!(
        err.to_string(),
        "MIG profile \"1g.5gb\", listed for A800, is not a profile of the A100-80GB card \"NVIDIA A800-SXM4-80GB\""
    );
}
