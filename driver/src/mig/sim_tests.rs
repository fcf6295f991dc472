use std::collections::BTreeMap;

use proptest::prelude::*;
use vgpu_scheduling::mig::{MigModel, model_for};

use super::*;

const CARD: &str = "GPU-a800";

fn a800() -> &'static MigModel {
    model_for("NVIDIA A800-SXM4-80GB", 81920 << 20).unwrap()
}

fn sim() -> MigSim {
    MigSim::new().with_card(CARD, a800(), true)
}

/// GPU-instance profile ids of the A800's catalogue.
const P_1G: u32 = 19;
const P_1G_ME: u32 = 20;
const P_1G_20GB: u32 = 15;
const P_2G: u32 = 14;
const P_3G: u32 = 9;
const P_7G: u32 = 0;

#[test]
fn seven_1g_10gb_are_created_and_an_eighth_is_refused() {
    let sim = sim();
    let created: Vec<MigInstance> = (0..7).map(|s| sim.create(CARD, P_1G, s).unwrap()).collect();
    let gi_ids: Vec<u32> = created.iter().map(|i| i.gi_id).collect();
    assert_eq!(gi_ids, [1, 2, 3, 4, 5, 6, 7]);
    assert!(created.iter().all(|i| i.ci_id == 0 && i.uuid.starts_with("MIG-") && i.uuid.len() == 40));
    assert_eq!(sim.instances(CARD).unwrap(), created);
    for start in 0..7 {
        assert!(matches!(sim.create(CARD, P_1G, start), Err(MigError::Occupied { .. })), "start {start}");
    }
    // Slice 7 is free, but no profile that fits in it alone may start there.
    assert_eq!(sim.create(CARD, P_1G, 7), Err(MigError::InvalidPlacement { card: CARD.into(), profile: "1g.10gb", start: 7 }));
    assert!(matches!(sim.create(CARD, P_1G_20GB, 6), Err(MigError::Occupied { holder: 7, .. })));
}

#[test]
fn an_overlap_is_refused_naming_the_holder() {
    let sim = sim();
    let big = sim.create(CARD, P_3G, 4).unwrap();
    let err = sim.create(CARD, P_1G_20GB, 6).unwrap_err();
    assert_eq!(err, MigError::Occupied { card: CARD.into(), profile: "1g.20gb", start: 6, holder: big.gi_id });
    assert_eq!(err.to_string(), "GPU GPU-a800: MIG profile 1g.20gb at memory slice 6 overlaps GPU instance 1");
    // Next to it is free.
    sim.create(CARD, P_2G, 2).unwrap();
}

#[test]
fn destroy_frees_the_slices_and_an_unknown_instance_is_an_error() {
    let sim = sim();
    let whole = sim.create(CARD, P_7G, 0).unwrap();
    assert_eq!(whole.gi_id, 0);
    assert!(matches!(sim.create(CARD, P_1G, 0), Err(MigError::Occupied { holder: 0, .. })));
    sim.destroy(CARD, whole.gi_id, whole.ci_id).unwrap();
    assert_eq!(sim.instances(CARD).unwrap(), []);
    sim.create(CARD, P_1G, 0).unwrap();
    assert_eq!(
        sim.destroy(CARD, whole.gi_id, whole.ci_id),
        Err(MigError::UnknownInstance { card: CARD.into(), gi_id: 0, ci_id: 0 })
    );
}

#[test]
fn a_card_not_in_mig_mode_is_refused_and_stays_so() {
    let sim = MigSim::new().with_card("GPU-off", a800(), false);
    assert_eq!(sim.mig_mode("GPU-off"), Ok(false));
    let off = MigError::NotInMigMode { card: "GPU-off".into() };
    assert_eq!(sim.create("GPU-off", P_1G, 0), Err(off.clone()));
    assert_eq!(sim.instances("GPU-off"), Err(off.clone()));
    assert_eq!(sim.destroy("GPU-off", 1, 0), Err(off));
    assert_eq!(sim.mig_mode("GPU-off"), Ok(false));
    assert_eq!(sim.mig_mode("GPU-none"), Err(MigError::UnknownCard { card: "GPU-none".into() }));
}

#[test]
fn placements_and_profiles_the_card_lacks_are_refused() {
    let sim = sim();
    assert_eq!(sim.create(CARD, 99, 0), Err(MigError::UnknownProfile { card: CARD.into(), profile: 99 }));
    assert_eq!(sim.create(CARD, P_2G, 6), Err(MigError::InvalidPlacement { card: CARD.into(), profile: "2g.20gb", start: 6 }));
    assert_eq!(sim.create(CARD, P_3G, 2), Err(MigError::InvalidPlacement { card: CARD.into(), profile: "3g.40gb", start: 2 }));
    assert_eq!(sim.instances(CARD).unwrap(), []);
}

#[test]
fn only_one_instance_holds_the_media_extensions() {
    let sim = sim();
    let me = sim.create(CARD, P_1G_ME, 0).unwrap();
    assert_eq!(
        sim.create(CARD, P_1G_ME, 3),
        Err(MigError::MediaExtensionsTaken { card: CARD.into(), profile: "1g.10gb+me", start: 3, holder: me.gi_id })
    );
    sim.create(CARD, P_1G, 3).unwrap();
}

#[test]
fn ids_are_the_smallest_free_and_uuids_are_deterministic_but_never_reused() {
    let run = || {
        let sim = sim();
        let a = sim.create(CARD, P_1G, 0).unwrap();
        let b = sim.create(CARD, P_1G, 1).unwrap();
        sim.create(CARD, P_1G, 2).unwrap();
        sim.destroy(CARD, b.gi_id, b.ci_id).unwrap();
        let again = sim.create(CARD, P_1G, 1).unwrap();
        (a, b, again)
    };
    let (a, b, again) = run();
    assert_eq!((a.gi_id, b.gi_id, again.gi_id), (1, 2, 2));
    assert_ne!(b.uuid, again.uuid, "a recreated instance is a new device");
    assert_eq!(run(), (a, b, again), "the same steps give the same UUIDs");
}

/// Whether `placements` fit the card's counters, as the scheduler would judge them.
fn fits_counters(model: &MigModel, placements: &[Placement]) -> bool {
    let mut left: BTreeMap<String, u64> = model.counters();
    placements.iter().flat_map(Placement::consumes).all(|(counter, used)| match left.get_mut(&counter) {
        Some(l) if *l >= used => {
            *l -= used;
            true
        }
        _ => false,
    })
}

proptest! {
    /// Over any sequence of creates and destroys, the simulator creates an instance exactly when
    /// the scheduler's counters would allow its device next to the instances already there.
    #[test]
    fn the_simulator_agrees_with_the_counters(steps in prop::collection::vec((0usize..25, any::<bool>()), 1..40)) {
        let model = a800();
        let all = model.placements();
        let sim = sim();
        let mut live: Vec<(Placement, MigInstance)> = Vec::new();
        for (pick, destroy) in steps {
            if destroy && !live.is_empty() {
                let (_, instance) = live.remove(pick % live.len());
                prop_assert_eq!(sim.destroy(CARD, instance.gi_id, instance.ci_id), Ok(()));
                continue;
            }
            let placement = all[pick % all.len()];
            let mut next: Vec<Placement> = live.iter().map(|(p, _)| *p).collect();
            next.push(placement);
            let created = sim.create(CARD, placement.profile().id(), placement.start());
            prop_assert_eq!(created.is_ok(), fits_counters(model, &next), "{:?} after {:?}", placement, live);
            if let Ok(instance) = created {
                live.push((placement, instance));
            }
        }
        prop_assert_eq!(sim.instances(CARD).unwrap().len(), live.len());
    }
}
