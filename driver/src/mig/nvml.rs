//! [`MigControl`] on real cards, through NVML.
//!
//! nvml-wrapper 0.13 cannot create or destroy GPU and compute instances, so this module calls
//! nvml-wrapper-sys's raw functions on the library nvml-wrapper loaded ([`Nvml::lib`]). Its child
//! `raw` is the workspace's only module with `unsafe` code: each of its methods makes one FFI
//! call with pointers to its own locals and turns the return code into a [`CallError`]. This
//! file is safe code, and its decisions (which profile index, which error, whether a placement is
//! free) are pure functions with unit tests.
//!
//! Facts about NVML come from its API reference (`nvml.h`), cited by function name. What only a
//! card in MIG mode proves: that NVML's profile ids, placements and slice counts are those of the
//! catalogue, that a compute instance's MIG device and UUID appear as soon as it is created, and
//! which return code each refusal really gets. `vgpu-dra mig-check`
//! (`scripts/mig-hardware-check.sh`) runs one create/destroy round trip on such a card.

pub mod check;
mod raw;

pub use super::caps::caps_minor;

use std::ffi::CString;
use std::sync::{Mutex, PoisonError};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use vgpu_scheduling::MigPlacement;
use vgpu_scheduling::mig::{COMPUTE_SLICES, MigModel, Placement, model_for};

use super::control::{MigControl, MigError, MigInstance};
pub use raw::CallError;
use raw::{Ci, Dev, Gi, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, Raw};

/// Why NVML could not be opened for MIG control.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// NVML did not load or initialise (no driver, no permission).
    #[error("NVML could not be initialised")]
    Init(#[source] NvmlError),
    /// The loaded `libnvidia-ml.so` lacks a function this module calls.
    #[error("libnvidia-ml.so has no {0}: the driver is too old to place MIG instances")]
    MissingFunction(&'static str),
}

impl CallError {
    /// The failure as a [`MigError`] naming no more than the card.
    fn on(self, card: &str) -> MigError {
        MigError::Nvml { card: card.to_owned(), call: self.call, code: self.code, reason: self.reason }
    }

    /// The failure of a call whose "not found" answer means `missing`.
    fn or_missing(self, card: &str, missing: impl FnOnce() -> MigError) -> MigError {
        match meaning(self.code) {
            Meaning::Missing => missing(),
            Meaning::NotInMigMode => MigError::NotInMigMode { card: card.to_owned() },
            Meaning::NoRoom | Meaning::Other => self.on(card),
        }
    }
}

/// What a return code says, across the MIG calls made here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meaning {
    /// `NOT_FOUND`, or `INVALID_ARGUMENT` for a UUID, id, profile or placement NVML does not
    /// know (`nvmlDeviceGetHandleByUUID`, `nvmlDeviceGetGpuInstanceById`,
    /// `nvmlGpuInstanceGetComputeInstanceById`, `nvmlDeviceCreateGpuInstanceWithPlacement`).
    Missing,
    /// `NOT_SUPPORTED`: "device doesn't have MIG mode enabled" (`nvmlDeviceCreateGpuInstance*`,
    /// `nvmlDeviceGetGpuInstanceById`).
    NotInMigMode,
    /// `INSUFFICIENT_RESOURCES`: "the requested GPU instance could not be created".
    NoRoom,
    /// Anything else (`NO_PERMISSION`, `IN_USE`, `GPU_IS_LOST`, ...).
    Other,
}

fn meaning(code: u32) -> Meaning {
    match code {
        NOT_FOUND | INVALID_ARGUMENT => Meaning::Missing,
        NOT_SUPPORTED => Meaning::NotInMigMode,
        INSUFFICIENT_RESOURCES => Meaning::NoRoom,
        _ => Meaning::Other,
    }
}

/// The C string of a card's UUID: a GPU UUID (`GPU-...`). NVML also finds MIG devices by their
/// `MIG-...` UUID, whose handles MIG control must not be given.
fn card_uuid(card: &str) -> Result<CString, MigError> {
    let unknown = || MigError::UnknownCard { card: card.to_owned() };
    if !card.starts_with("GPU-") {
        return Err(unknown());
    }
    CString::new(card).map_err(|_| unknown())
}

/// One GPU-instance profile a card supports: its `NVML_GPU_INSTANCE_PROFILE_*` index and what
/// `nvmlDeviceGetGpuInstanceProfileInfo` says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProfileRow {
    index: u32,
    /// The profile id the create and list calls take (19 for `1g.10gb`).
    id: u32,
    /// Compute slices (the `1` of `1g`).
    slices: u32,
    /// The most instances of it a card holds.
    instances: u32,
}

/// The profile with id `id`: NVML's calls to read a profile take its index, the others its id.
fn by_id(rows: &[ProfileRow], id: u32) -> Option<ProfileRow> {
    rows.iter().copied().find(|r| r.id == id)
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` index of the compute instance that fills a GPU instance
/// of `slices` compute slices (the `-C` of `nvidia-smi mig -cgi`).
fn full_ci_profile_index(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => sys::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => sys::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// A GPU instance on a card, as the checks before a create see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    gi_id: u32,
    profile_id: u32,
    /// Its placement in memory slices (`nvmlGpuInstanceGetInfo`).
    start: u32,
    size: u32,
    /// Its profile's compute slices.
    slices: u32,
}

/// Refuses `placement` as [`super::MigSim`] does, against the GPU instances NVML lists: slices
/// another holds, compute short, or a second `+me`. NVML checks again when it creates.
fn admit(card: &str, model: &MigModel, placement: Placement, held: &[Held]) -> Result<(), MigError> {
    let profile = placement.profile();
    let (card, name, start) = (card.to_owned(), profile.name(), placement.start());
    let slots = placement.slots();
    let (lo, hi) = (u32::from(slots.start), u32::from(slots.end));
    if let Some(h) = held.iter().find(|h| h.start < hi && lo < h.start.saturating_add(h.size)) {
        return Err(MigError::Occupied { card, profile: name, start, holder: h.gi_id });
    }
    let used: u32 = held.iter().map(|h| h.slices).sum();
    let free = u32::from(COMPUTE_SLICES).saturating_sub(used);
    if u32::from(profile.compute_slices()) > free {
        return Err(MigError::NoCompute { card, profile: name, start, free: u8::try_from(free).unwrap_or(u8::MAX) });
    }
    let media = held.iter().find(|h| model.profile(h.profile_id).is_some_and(|p| p.media_extension()));
    if let (true, Some(h)) = (profile.media_extension(), media) {
        return Err(MigError::MediaExtensionsTaken { card, profile: name, start, holder: h.gi_id });
    }
    Ok(())
}

/// What `vgpu-dra mig-check` and the catalogue need to know of a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardInfo {
    /// NVML's product name.
    pub name: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// The minor number of `/dev/nvidiaN`.
    pub minor: u32,
}

/// [`MigControl`] through NVML. Never switches MIG mode; operations run one at a time.
pub struct NvmlMig {
    nvml: Nvml,
    /// One operation at a time, so a listing never sees a half-made or half-destroyed instance
    /// of this process's own making.
    lock: Mutex<()>,
}

impl std::fmt::Debug for NvmlMig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlMig")
    }
}

impl NvmlMig {
    /// Loads and initialises NVML for MIG control.
    ///
    /// # Errors
    /// [`OpenError`] when NVML is unavailable or lacks a MIG function.
    pub fn new() -> Result<Self, OpenError> {
        Self::with_nvml(Nvml::init().map_err(OpenError::Init)?)
    }

    /// MIG control on an initialised NVML.
    ///
    /// # Errors
    /// [`OpenError::MissingFunction`] when the library lacks a MIG function.
    pub fn with_nvml(nvml: Nvml) -> Result<Self, OpenError> {
        match raw::first_missing(nvml.lib()) {
            Some(name) => Err(OpenError::MissingFunction(name)),
            None => Ok(Self { nvml, lock: Mutex::new(()) }),
        }
    }

    fn raw(&self) -> Raw<'_> {
        Raw::new(self.nvml.lib())
    }

    fn device(&self, card: &str) -> Result<Dev, MigError> {
        let uuid = card_uuid(card)?;
        self.raw().device_by_uuid(&uuid).map_err(|e| e.or_missing(card, || MigError::UnknownCard { card: card.to_owned() }))
    }

    /// The card's handle, refused when it is not in MIG mode.
    fn mig_device(&self, card: &str) -> Result<Dev, MigError> {
        if !self.mig_mode(card)? {
            return Err(MigError::NotInMigMode { card: card.to_owned() });
        }
        self.device(card)
    }

    /// The card's product name, memory and minor number.
    ///
    /// # Errors
    /// [`MigError::UnknownCard`], or a failed query.
    pub fn card_info(&self, card: &str) -> Result<CardInfo, MigError> {
        let (raw, dev) = (self.raw(), self.device(card)?);
        let read = || -> Result<CardInfo, CallError> {
            Ok(CardInfo { name: raw.name(dev)?, memory_bytes: raw.memory_total(dev)?, minor: raw.minor(dev)? })
        };
        read().map_err(|e| e.on(card))
    }

    /// `(start, size)` of each placement NVML allows profile id `gi_profile_id` on the card.
    ///
    /// # Errors
    /// [`MigError::UnknownCard`], [`MigError::NotInMigMode`], or a failed query.
    pub fn possible_placements(&self, card: &str, gi_profile_id: u32) -> Result<Vec<(u32, u32)>, MigError> {
        let dev = self.mig_device(card)?;
        self.raw().placements(dev, gi_profile_id).map_err(|e| e.on(card))
    }
}

/// The GPU-instance profiles the card supports. Indices the card or driver does not know answer
/// `NOT_SUPPORTED` or `INVALID_ARGUMENT` (`nvmlDeviceGetGpuInstanceProfileInfo`) and are left out.
fn profile_rows(raw: Raw<'_>, dev: Dev) -> Result<Vec<ProfileRow>, CallError> {
    let mut rows: Vec<ProfileRow> = Vec::new();
    for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        match raw.gi_profile(dev, index) {
            Ok(info) if by_id(&rows, info.id).is_none() => {
                rows.push(ProfileRow { index, id: info.id, slices: info.sliceCount, instances: info.instanceCount });
            }
            Ok(_) => {}
            Err(e) if matches!(e.code, NOT_SUPPORTED | INVALID_ARGUMENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(rows)
}

/// Every GPU instance on the card with its handle.
fn gpu_instances(raw: Raw<'_>, dev: Dev, rows: &[ProfileRow]) -> Result<Vec<(Gi, Held)>, CallError> {
    let mut out = Vec::new();
    for row in rows {
        for gi in raw.gpu_instances(dev, row.id, row.instances)? {
            let info = raw.gi_info(gi)?;
            let (start, size) = (info.placement.start, info.placement.size);
            out.push((gi, Held { gi_id: info.id, profile_id: info.profileId, start, size, slices: row.slices }));
        }
    }
    Ok(out)
}

/// The compute instances of a GPU instance, with their ids, over every compute profile.
fn compute_instances(raw: Raw<'_>, gi: Gi) -> Result<Vec<(Ci, u32)>, CallError> {
    let mut out: Vec<(Ci, u32)> = Vec::new();
    for index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        let info = match raw.ci_profile(gi, index) {
            Ok(info) => info,
            Err(e) if matches!(e.code, NOT_SUPPORTED | INVALID_ARGUMENT) => continue,
            Err(e) => return Err(e),
        };
        for ci in raw.compute_instances(gi, info.id, info.instanceCount)? {
            let id = raw.ci_id(ci)?;
            if out.iter().all(|(_, seen)| *seen != id) {
                out.push((ci, id));
            }
        }
    }
    Ok(out)
}

/// `(gi_id, ci_id, uuid)` of every MIG device of the card.
fn mig_uuids(raw: Raw<'_>, dev: Dev) -> Result<Vec<(u32, u32, String)>, CallError> {
    let mut out = Vec::new();
    for index in 0..raw.max_mig_devices(dev)? {
        if let Some(mig) = raw.mig_device(dev, index)? {
            out.push((raw.gi_id_of(mig)?, raw.ci_id_of(mig)?, raw.uuid(mig)?));
        }
    }
    Ok(out)
}

fn uuid_of(uuids: &[(u32, u32, String)], gi_id: u32, ci_id: u32) -> Result<String, CallError> {
    let found = uuids.iter().find(|(g, c, _)| (*g, *c) == (gi_id, ci_id));
    found.map(|(_, _, u)| u.clone()).ok_or_else(|| {
        CallError::odd(
            "nvmlDeviceGetMigDeviceHandleByIndex",
            format!("no MIG device for GPU instance {gi_id}, compute instance {ci_id}"),
        )
    })
}

/// Destroys every compute instance of `gi`, then `gi`.
fn remove(raw: Raw<'_>, gi: Gi) -> Result<(), CallError> {
    for (ci, _) in compute_instances(raw, gi)? {
        raw.destroy_ci(ci)?;
    }
    raw.destroy_gi(gi)
}

impl NvmlMig {
    /// The compute instance filling the new GPU instance `gi`, its ids and UUID: `(gi_id, ci_id, uuid)`.
    fn fill(raw: Raw<'_>, dev: Dev, gi: Gi, row: ProfileRow, start: u8) -> Result<(u32, u32, String), CallError> {
        let info = raw.gi_info(gi)?;
        if info.placement.start != u32::from(start) {
            return Err(CallError::odd(
                "nvmlGpuInstanceGetInfo",
                format!("placed at slice {}, not {start}", info.placement.start),
            ));
        }
        let index = full_ci_profile_index(row.slices)
            .ok_or_else(|| CallError::odd("nvmlDeviceGetGpuInstanceProfileInfo", format!("{} compute slices", row.slices)))?;
        let ci_profile = raw.ci_profile(gi, index)?;
        if ci_profile.sliceCount != row.slices {
            let why = format!("compute profile {index} has {} slices, the GPU instance {}", ci_profile.sliceCount, row.slices);
            return Err(CallError::odd("nvmlGpuInstanceGetComputeInstanceProfileInfo", why));
        }
        let ci_id = raw.ci_id(raw.create_ci(gi, ci_profile.id)?)?;
        Ok((info.id, ci_id, uuid_of(&mig_uuids(raw, dev)?, info.id, ci_id)?))
    }
}

impl MigControl for NvmlMig {
    fn mig_mode(&self, card: &str) -> Result<bool, MigError> {
        let dev = self.device(card)?;
        match self.raw().mig_mode(dev) {
            Ok((current, _)) => Ok(current == sys::NVML_DEVICE_MIG_ENABLE),
            // nvmlDeviceGetMigMode: NOT_SUPPORTED "if device doesn't support MIG mode".
            Err(e) if e.code == NOT_SUPPORTED => Ok(false),
            Err(e) => Err(e.on(card)),
        }
    }

    fn instances(&self, card: &str) -> Result<Vec<MigInstance>, MigError> {
        let _one = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let (raw, dev) = (self.raw(), self.mig_device(card)?);
        let list = || -> Result<Vec<MigInstance>, CallError> {
            let uuids = mig_uuids(raw, dev)?;
            let mut out = Vec::new();
            for (gi, held) in gpu_instances(raw, dev, &profile_rows(raw, dev)?)? {
                for (_, ci_id) in compute_instances(raw, gi)? {
                    let start = u8::try_from(held.start)
                        .map_err(|_| CallError::odd("nvmlGpuInstanceGetInfo", format!("start {}", held.start)))?;
                    let uuid = uuid_of(&uuids, held.gi_id, ci_id)?;
                    out.push(MigInstance { gi_profile_id: held.profile_id, start, gi_id: held.gi_id, ci_id, uuid });
                }
            }
            out.sort_by_key(|i| (i.gi_id, i.ci_id));
            Ok(out)
        };
        list().map_err(|e| e.on(card))
    }

    fn create(&self, card: &str, gi_profile_id: u32, start: u8) -> Result<MigInstance, MigError> {
        let _one = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let (raw, dev) = (self.raw(), self.mig_device(card)?);
        let unknown = || MigError::UnknownProfile { card: card.to_owned(), profile: gi_profile_id };
        // Profile names and the `+me` rule come from the catalogue; a card it does not know
        // offers no dynamic MIG, so it has no profile here either.
        let info = self.card_info(card)?;
        let model = model_for(&info.name, info.memory_bytes).ok_or_else(unknown)?;
        let profile = model.profile(gi_profile_id).ok_or_else(unknown)?;
        let invalid = || MigError::InvalidPlacement { card: card.to_owned(), profile: profile.name(), start };
        let placement = model.placement(profile, start).ok_or_else(invalid)?;
        let rows = profile_rows(raw, dev).map_err(|e| e.on(card))?;
        let row = by_id(&rows, gi_profile_id).ok_or_else(unknown)?;
        // NVML's placement, not the catalogue's, decides the size the create call is given.
        let placements = raw.placements(dev, gi_profile_id).map_err(|e| e.on(card))?;
        let (_, size) = placements.into_iter().find(|(s, _)| *s == u32::from(start)).ok_or_else(invalid)?;
        let held = || gpu_instances(raw, dev, &rows).map(|g| g.into_iter().map(|(_, h)| h).collect::<Vec<_>>());
        admit(card, model, placement, &held().map_err(|e| e.on(card))?)?;
        let gi = raw.create_gi(dev, row.id, u32::from(start), size).map_err(|e| match meaning(e.code) {
            Meaning::Missing => invalid(),
            Meaning::NotInMigMode => MigError::NotInMigMode { card: card.to_owned() },
            // Someone else took the room since the check: name what holds it now, if we can.
            Meaning::NoRoom => held().ok().and_then(|h| admit(card, model, placement, &h).err()).unwrap_or_else(|| e.on(card)),
            Meaning::Other => e.on(card),
        })?;
        match Self::fill(raw, dev, gi, row, start) {
            Ok((gi_id, ci_id, uuid)) => Ok(MigInstance { gi_profile_id, start, gi_id, ci_id, uuid }),
            Err(e) => {
                // No half instance: the GPU instance goes with whatever compute instance it got.
                if let Err(undo) = remove(raw, gi) {
                    tracing::error!(%card, profile = gi_profile_id, start, error = %undo, "a half-made MIG instance could not be destroyed");
                }
                Err(e.on(card))
            }
        }
    }

    fn destroy(&self, card: &str, gi_id: u32, ci_id: u32) -> Result<(), MigError> {
        let _one = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let (raw, dev) = (self.raw(), self.mig_device(card)?);
        let unknown = || MigError::UnknownInstance { card: card.to_owned(), gi_id, ci_id };
        let gi = raw.gi_by_id(dev, gi_id).map_err(|e| e.or_missing(card, unknown))?;
        match raw.ci_by_id(gi, ci_id) {
            Ok(ci) => raw.destroy_ci(ci).map_err(|e| e.on(card))?,
            Err(e) if meaning(e.code) == Meaning::Missing => {
                // A GPU instance with no compute instance left is what a crash between the two
                // steps of a create or a destroy leaves: finish it. One with others is not ours.
                if !compute_instances(raw, gi).map_err(|e| e.on(card))?.is_empty() {
                    return Err(unknown());
                }
                tracing::info!(%card, gi_id, ci_id, "MIG GPU instance without its compute instance; destroying it");
            }
            Err(e) => return Err(e.or_missing(card, unknown)),
        }
        raw.destroy_gi(gi).map_err(|e| e.on(card))
    }
}

/// A MIG device's GPU and compute instance ids (`nvmlDeviceGetGpuInstanceId`,
/// `nvmlDeviceGetComputeInstanceId`), for discovery.
///
/// # Errors
/// The failed call.
pub fn instance_ids(mig: &nvml_wrapper::Device<'_>) -> Result<(u32, u32), CallError> {
    let (raw, handle) = Raw::of_device(mig);
    Ok((raw.gi_id_of(handle)?, raw.ci_id_of(handle)?))
}

/// The profile and placement of GPU instance `gi_id` on `card` (`nvmlDeviceGetGpuInstanceById`,
/// `nvmlGpuInstanceGetInfo`), for discovery.
///
/// # Errors
/// The failed call (`nvmlDeviceGetGpuInstanceById` "requires privileged user").
pub fn gpu_instance_placement(card: &nvml_wrapper::Device<'_>, gi_id: u32) -> Result<MigPlacement, CallError> {
    let (raw, handle) = Raw::of_device(card);
    let info = raw.gi_info(raw.gi_by_id(handle, gi_id)?)?;
    let start = u8::try_from(info.placement.start)
        .map_err(|_| CallError::odd("nvmlGpuInstanceGetInfo", format!("placement start {}", info.placement.start)))?;
    Ok(MigPlacement { profile_id: info.profileId, start })
}

#[cfg(test)]
#[path = "nvml_tests.rs"]
mod tests;
