//! What of NVML MIG control can be shown without a GPU: the code mapping, the profile-index
//! lookup, the pre-create checks (held against the simulator), UUID and buffer handling, the
//! nvidia-caps files, and the mig-check round trip on the simulator.
//!
//! Only a card in MIG mode shows the rest: that NVML answers the raw calls as `nvml.h` documents
//! (the codes below are its documented ones), that its profile ids, placements and slice counts
//! are the catalogue's, and that a MIG device appears with its UUID right after the create
//! (`vgpu-dra mig-check`, `scripts/mig-hardware-check.sh`).

use std::sync::atomic::{AtomicBool, Ordering};

use vgpu_scheduling::mig::{MigModel, model_for};

use super::check::{CheckError, placements_differ, round_trip};
use super::raw::from_buffer;
use super::*;
use crate::mig::MigSim;

const CARD: &str = "GPU-a800";
const IN_USE: u32 = 19;
const NO_PERMISSION: u32 = 4;

fn a800() -> &'static MigModel {
    model_for("NVIDIA A800-SXM4-80GB", 81920 << 20).unwrap()
}

fn call_error(code: u32) -> CallError {
    CallError { call: "nvmlX", code, reason: "text".into() }
}

#[test]
fn return_codes_mean_what_nvml_h_documents() {
    assert_eq!(meaning(NOT_FOUND), Meaning::Missing);
    assert_eq!(meaning(INVALID_ARGUMENT), Meaning::Missing);
    assert_eq!(meaning(NOT_SUPPORTED), Meaning::NotInMigMode);
    assert_eq!(meaning(INSUFFICIENT_RESOURCES), Meaning::NoRoom);
    assert_eq!(meaning(IN_USE), Meaning::Other);
    assert_eq!(meaning(NO_PERMISSION), Meaning::Other);
}

#[test]
fn a_failed_call_becomes_the_error_of_its_step() {
    let unknown = || MigError::UnknownInstance { card: CARD.into(), gi_id: 3, ci_id: 0 };
    assert_eq!(call_error(NOT_FOUND).or_missing(CARD, unknown), unknown());
    assert_eq!(call_error(NOT_SUPPORTED).or_missing(CARD, unknown), MigError::NotInMigMode { card: CARD.into() });
    let busy = call_error(IN_USE).or_missing(CARD, unknown);
    assert_eq!(busy, MigError::Nvml { card: CARD.into(), call: "nvmlX", code: IN_USE, reason: "text".into() });
    assert_eq!(busy.to_string(), "GPU GPU-a800: nvmlX failed: text (NVML return code 19)");
}

/// An A100's profiles as `nvidia-smi mig -lgip` lists them: `(index, id, compute slices,
/// instances)`. The ids are not the indices (7g is index 4, id 0), which is the mistake
/// [`by_id`] exists to avoid.
fn a100_rows() -> Vec<ProfileRow> {
    [(0, 19, 1, 7), (1, 14, 2, 3), (2, 9, 3, 2), (3, 5, 4, 1), (4, 0, 7, 1), (7, 20, 1, 1), (9, 15, 1, 4)]
        .into_iter()
        .map(|(index, id, slices, instances)| ProfileRow { index, id, slices, instances })
        .collect()
}

#[test]
fn profiles_are_found_by_id_not_by_index() {
    let rows = a100_rows();
    assert_eq!(by_id(&rows, 0).map(|r| r.index), Some(4));
    assert_eq!(by_id(&rows, 19).map(|r| r.index), Some(0));
    assert_eq!(by_id(&rows, 20).map(|r| (r.index, r.slices)), Some((7, 1)));
    assert_eq!(by_id(&rows, 15).map(|r| r.instances), Some(4));
    assert_eq!(by_id(&rows, 4), None);
}

#[test]
fn the_full_compute_profile_has_the_gpu_instance_slices() {
    let indices: Vec<Option<u32>> = [1, 2, 3, 4, 5, 6, 7, 8].into_iter().map(full_ci_profile_index).collect();
    assert_eq!(indices, [Some(0), Some(1), Some(2), Some(3), None, Some(6), Some(4), Some(5)]);
}

#[test]
fn only_gpu_uuids_name_cards() {
    assert_eq!(card_uuid("GPU-1234").unwrap().as_bytes(), b"GPU-1234");
    for bad in ["MIG-1234", "1234", "", "GPU-12\x0034"] {
        assert_eq!(card_uuid(bad), Err(MigError::UnknownCard { card: bad.into() }), "{bad:?}");
    }
}

#[test]
fn text_buffers_end_at_the_first_nul() {
    assert_eq!(from_buffer(b"MIG-ab\0\0junk").as_deref(), Some("MIG-ab"));
    assert_eq!(from_buffer(b"\0"), Some(String::new()));
    assert_eq!(from_buffer(b"no terminator"), None);
    assert_eq!(from_buffer(b"\xff\xfe\0"), None);
}

/// The GPU instance NVML would list for a simulated instance.
fn held(model: &MigModel, i: &MigInstance) -> Held {
    let p = model.profile(i.gi_profile_id).unwrap();
    let (size, slices) = (u32::from(p.memory_slices()), u32::from(p.compute_slices()));
    Held { gi_id: i.gi_id, profile_id: i.gi_profile_id, start: u32::from(i.start), size, slices }
}

/// For every pair of placements, the check before a create refuses the second exactly as the
/// simulator does, holder included: the NVML path and the simulator give callers the same errors.
#[test]
fn the_check_before_a_create_agrees_with_the_simulator() {
    let model = a800();
    for first in model.placements() {
        for second in model.placements() {
            let sim = MigSim::new().with_card(CARD, model, true);
            let made = sim.create(CARD, first.profile().id(), first.start()).unwrap();
            let want = sim.create(CARD, second.profile().id(), second.start()).map(|_| ());
            let got = admit(CARD, model, second, &[held(model, &made)]);
            assert_eq!(
                got,
                want,
                "{} at {} then {} at {}",
                first.profile().name(),
                first.start(),
                second.profile().name(),
                second.start()
            );
        }
    }
}

#[test]
fn compute_is_counted_from_what_nvml_lists() {
    let model = a800();
    // Seven 1-slice GPU instances NVML lists at slices the catalogue would not place them at.
    let full: Vec<Held> = (0..7).map(|i| Held { gi_id: i + 1, profile_id: 99, start: 8, size: 0, slices: 1 }).collect();
    let p = model.placement(model.profile(19).unwrap(), 0).unwrap();
    assert_eq!(
        admit(CARD, model, p, &full),
        Err(MigError::NoCompute { card: CARD.into(), profile: "1g.10gb", start: 0, free: 0 })
    );
}

fn caps(gi: u32, ci: Option<u32>) -> std::io::Result<u32> {
    Ok(gi * 10 + ci.map_or(0, |c| c + 1))
}

/// The catalogue's placements of profile 19, as NVML would report them.
fn nvml_1g() -> Vec<(u32, u32)> {
    (0..7).map(|s| (s, 1)).collect()
}

#[test]
fn the_round_trip_uses_the_first_free_placement_and_leaves_the_card_as_it_was() {
    let sim = MigSim::new().with_card(CARD, a800(), true);
    let kept = sim.create(CARD, 19, 0).unwrap();
    let mut out = Vec::new();
    round_trip(&sim, CARD, a800(), 19, &nvml_1g(), &caps, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("created gi 2 ci 0 profile 19 start 1 "), "{text}");
    assert!(
        text.contains("GPU instance nvidia-caps minor 20") && text.contains("compute instance nvidia-caps minor 21"),
        "{text}"
    );
    assert_eq!(sim.instances(CARD).unwrap(), [kept]);
}

#[test]
fn the_round_trip_reports_a_full_card_and_catalogue_differences() {
    let sim = MigSim::new().with_card(CARD, a800(), true);
    sim.create(CARD, 0, 0).unwrap();
    let err = round_trip(&sim, CARD, a800(), 19, &nvml_1g(), &caps, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, CheckError::NoFreePlacement("1g.10gb")), "{err}");
    let profile = a800().profile(19).unwrap();
    assert_eq!(placements_differ(profile, &nvml_1g()), None);
    let shifted: Vec<(u32, u32)> = (1..8).map(|s| (s, 1)).collect();
    assert!(placements_differ(profile, &shifted).unwrap().contains("NVML places 1g.10gb"));
}

/// A card whose destroy answers success but leaves the instance, as a broken driver might.
struct LeakyDestroy(MigSim, AtomicBool);

impl MigControl for LeakyDestroy {
    fn mig_mode(&self, card: &str) -> Result<bool, MigError> {
        self.0.mig_mode(card)
    }
    fn instances(&self, card: &str) -> Result<Vec<MigInstance>, MigError> {
        self.0.instances(card)
    }
    fn create(&self, card: &str, gi_profile_id: u32, start: u8) -> Result<MigInstance, MigError> {
        self.0.create(card, gi_profile_id, start)
    }
    fn destroy(&self, _: &str, _: u32, _: u32) -> Result<(), MigError> {
        self.1.store(true, Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn the_round_trip_fails_when_the_card_is_not_as_it_was() {
    let leaky = LeakyDestroy(MigSim::new().with_card(CARD, a800(), true), AtomicBool::new(false));
    let unreadable = |_, _| Err(std::io::Error::other("no caps"));
    let err = round_trip(&leaky, CARD, a800(), 19, &nvml_1g(), &unreadable, &mut Vec::new()).unwrap_err();
    assert!(leaky.1.load(Ordering::Relaxed), "destroy is called even after a mismatch");
    let CheckError::Mismatch(found) = err else { panic!("{err}") };
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[2].contains("after the destroy"), "{found:?}");
}
