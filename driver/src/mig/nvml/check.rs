//! The round trip `vgpu-dra mig-check` runs on a card in MIG mode: list, create one instance at
//! the first free placement of a profile, read its nvidia-caps minors, destroy it, list again.
//! Written against [`MigControl`], so the simulator runs it in unit tests and NVML on hardware.

use std::fmt;
use std::io::Write;

use vgpu_scheduling::mig::{MigModel, MigProfile};

use crate::mig::control::{MigControl, MigError, MigInstance};

/// Why the check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The catalogue's model of the card has no such profile.
    #[error("the catalogue's {model} has no MIG profile with id {profile}")]
    UnknownProfile {
        /// The catalogue's model name.
        model: &'static str,
        /// The GPU-instance profile id asked for.
        profile: u32,
    },
    /// Every placement of the profile overlaps an instance already on the card.
    #[error("every placement of MIG profile {0} overlaps an instance already on the card")]
    NoFreePlacement(&'static str),
    /// A MIG operation failed.
    #[error("{0} failed")]
    Mig(&'static str, #[source] MigError),
    /// What NVML did differs from what the driver expects.
    #[error("{} mismatch(es): {}", .0.len(), .0.join("; "))]
    Mismatch(Vec<String>),
    /// The report could not be written.
    #[error("writing the report")]
    Write(#[source] std::io::Error),
}

/// Reads the nvidia-caps minor of GPU instance `gi` (or of its compute instance `ci`).
pub type CapsReader<'a> = &'a dyn Fn(u32, Option<u32>) -> std::io::Result<u32>;

/// Writes report lines, keeping the first write error for the end, so a broken pipe never
/// stops the check between create and destroy.
struct Report<'a> {
    out: &'a mut dyn Write,
    failed: Option<std::io::Error>,
}

impl Report<'_> {
    fn line(&mut self, args: fmt::Arguments<'_>) {
        if self.failed.is_none()
            && let Err(e) = writeln!(self.out, "{args}")
        {
            self.failed = Some(e);
        }
    }

    fn instances(&mut self, when: &str, list: &[MigInstance]) {
        self.line(format_args!("{when}: {} instance(s)", list.len()));
        for i in list {
            self.line(format_args!("  {}", describe(i)));
        }
    }
}

fn describe(i: &MigInstance) -> String {
    format!("gi {} ci {} profile {} start {} uuid {}", i.gi_id, i.ci_id, i.gi_profile_id, i.start, i.uuid)
}

/// Whether NVML's placements of `profile` (`(start, size)`, from
/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`) are the catalogue's; `None` when they are.
pub fn placements_differ(profile: &MigProfile, nvml: &[(u32, u32)]) -> Option<String> {
    let ours: Vec<(u32, u32)> = profile.starts().iter().map(|&s| (u32::from(s), u32::from(profile.memory_slices()))).collect();
    let mut theirs = nvml.to_vec();
    theirs.sort_unstable();
    (ours != theirs).then(|| format!("NVML places {} at (start, size) {theirs:?}, the catalogue at {ours:?}", profile.name()))
}

/// The round trip on `card` with profile id `profile_id`; `nvml_placements` are NVML's placements
/// of the profile, compared with the catalogue's.
///
/// # Errors
/// [`CheckError`]; after a create, the instance is destroyed before any mismatch is reported.
pub fn round_trip(
    ctl: &dyn MigControl,
    card: &str,
    model: &MigModel,
    profile_id: u32,
    nvml_placements: &[(u32, u32)],
    caps: CapsReader<'_>,
    out: &mut dyn Write,
) -> Result<(), CheckError> {
    let profile = model.profile(profile_id).ok_or(CheckError::UnknownProfile { model: model.name(), profile: profile_id })?;
    let mut report = Report { out, failed: None };
    let mut mismatches: Vec<String> = placements_differ(profile, nvml_placements).into_iter().collect();
    let before = ctl.instances(card).map_err(|e| CheckError::Mig("listing the instances", e))?;
    report.instances("before", &before);
    let occupied: Vec<_> = before.iter().filter_map(|i| model.placement(model.profile(i.gi_profile_id)?, i.start)).collect();
    let free = model
        .placements()
        .into_iter()
        .find(|p| p.profile().id() == profile_id && occupied.iter().all(|o| !o.overlaps(p)))
        .ok_or(CheckError::NoFreePlacement(profile.name()))?;
    let created = ctl.create(card, profile_id, free.start()).map_err(|e| CheckError::Mig("creating the instance", e))?;
    report.line(format_args!("created {} ({})", describe(&created), profile.name()));
    // Between create and destroy nothing returns early: every finding is a mismatch.
    if (created.gi_profile_id, created.start) != (profile_id, free.start()) || !created.uuid.starts_with("MIG-") {
        mismatches.push(format!("asked for profile {profile_id} at {}, got {}", free.start(), describe(&created)));
    }
    let mut expected = before.clone();
    expected.push(created.clone());
    expected.sort_by_key(|i| (i.gi_id, i.ci_id));
    match ctl.instances(card) {
        Ok(during) if during == expected => {}
        Ok(during) => mismatches.push(format!("the list after the create is not the first plus the new instance: {during:?}")),
        Err(e) => mismatches.push(format!("listing after the create: {e}")),
    }
    for (what, ci) in [("GPU instance", None), ("compute instance", Some(created.ci_id))] {
        match caps(created.gi_id, ci) {
            Ok(minor) => report.line(format_args!("{what} nvidia-caps minor {minor} (/dev/nvidia-caps/nvidia-cap{minor})")),
            Err(e) => mismatches.push(format!("{what} nvidia-caps minor: {e}")),
        }
    }
    ctl.destroy(card, created.gi_id, created.ci_id).map_err(|e| CheckError::Mig("destroying the instance", e))?;
    report.line(format_args!("destroyed gi {} ci {}", created.gi_id, created.ci_id));
    let after = ctl.instances(card).map_err(|e| CheckError::Mig("listing the instances again", e))?;
    report.instances("after", &after);
    if after != before {
        mismatches.push("the list after the destroy differs from the first".to_owned());
    }
    if let Some(e) = report.failed {
        return Err(CheckError::Write(e));
    }
    if mismatches.is_empty() { Ok(()) } else { Err(CheckError::Mismatch(mismatches)) }
}
