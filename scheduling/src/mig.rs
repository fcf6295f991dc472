//! The MIG profile catalogue: which GPU-instance profiles a card model offers, where each may be
//! placed, and the counters that let kube-scheduler alone keep placements apart.
//!
//! Dynamic MIG publishes every (profile, placement) of a card as its own device and creates the
//! instance only at prepare. The scheduler never sees NVML, so the rules NVIDIA enforces when an
//! instance is created (no two instances share a memory slice, at most 7 compute slices, one
//! media-extension instance) are expressed as counters: the card offers them, each placement
//! consumes its share, the whole card consumes all of them. `mig_tests.rs` checks exhaustively
//! that a set of placements fits the counters exactly when NVIDIA allows it.
//!
//! Pure data and arithmetic; creating instances is the driver's (`driver/src/mig`).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use crate::{DeviceName, MigModels};

/// Memory slices of every catalogued card; placements index them `0..8`.
pub const MEMORY_SLICES: u8 = 8;
/// Compute slices of every catalogued card.
pub const COMPUTE_SLICES: u8 = 7;
/// Counter of compute slices (the card offers [`COMPUTE_SLICES`]).
pub const COMPUTE_COUNTER: &str = "compute-slices";
/// Counter of media extensions: a card has one set (its OFA and JPEG engines), which only one
/// `+me` instance may hold.
pub const MEDIA_COUNTER: &str = "media-extensions";

/// The counter of memory slice `slice` (`memory-slice-0` ... `memory-slice-7`), as NVIDIA's DRA
/// driver names them.
pub fn memory_slice_counter(slice: u8) -> String {
    format!("memory-slice-{slice}")
}

/// One GPU-instance profile of a card model.
#[derive(Debug, PartialEq, Eq)]
pub struct MigProfile {
    id: u32,
    name: &'static str,
    compute_slices: u8,
    memory_slices: u8,
    memory_mib: u64,
    starts: &'static [u8],
    media_extension: bool,
}

impl MigProfile {
    /// NVML's GPU-instance profile id (`NVML_GPU_INSTANCE_PROFILE_*`, 19 for `1g.10gb`).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// NVIDIA's name, such as `1g.10gb` or `1g.10gb+me`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Compute slices (the `1` of `1g`).
    pub fn compute_slices(&self) -> u8 {
        self.compute_slices
    }

    /// Memory slices a placement occupies.
    pub fn memory_slices(&self) -> u8 {
        self.memory_slices
    }

    /// Memory of one instance in MiB (the smallest the catalogue's sources report for it).
    pub fn memory_mib(&self) -> u64 {
        self.memory_mib
    }

    /// The memory slices a placement may start at.
    pub fn starts(&self) -> &'static [u8] {
        self.starts
    }

    /// Whether this is a `+me` profile (the media extensions of the card).
    pub fn media_extension(&self) -> bool {
        self.media_extension
    }

    /// The name as a DNS-label fragment: `1g.10gb+me` becomes `1g-10gb-me`.
    pub fn dns_name(&self) -> String {
        self.name.replace(['.', '+'], "-")
    }

    /// `(compute slices, gigabytes, +me)` parsed from a name such as `7g.79gb` or `1g.10gb+me`.
    fn parse_name(name: &str) -> Option<(u8, u64, bool)> {
        let lower = name.to_ascii_lowercase();
        let (base, me) = match lower.strip_suffix("+me") {
            Some(base) => (base, true),
            None => (lower.as_str(), false),
        };
        let (compute, rest) = base.split_once("g.")?;
        let gb = rest.strip_suffix("gb")?;
        Some((compute.parse().ok()?, gb.parse().ok()?, me))
    }
}

/// The geometry every catalogued card shares (NVIDIA MIG user guide, "Supported MIG Profiles",
/// A100 and H100/H200 tables; placements from `nvidia-smi mig -lgipp`, where a placement's start
/// and size count memory slices, as `nvmlGpuInstancePlacement_t` documents):
/// `(GI profile id, compute slices, memory slices, starts, +me)`, in the order of the names and
/// memory figures of each model below.
const GEOMETRY: [(u32, u8, u8, &[u8], bool); 7] = [
    (19, 1, 1, &[0, 1, 2, 3, 4, 5, 6], false),
    (20, 1, 1, &[0, 1, 2, 3, 4, 5, 6], true),
    (15, 1, 2, &[0, 2, 4, 6], false),
    (14, 2, 2, &[0, 2, 4], false),
    (9, 3, 4, &[0, 4], false),
    (5, 4, 4, &[0], false),
    (0, 7, 8, &[0], false),
];

/// Joins [`GEOMETRY`] with one model's names and memory figures.
const fn profiles(names: [&'static str; 7], memory_mib: [u64; 7]) -> [MigProfile; 7] {
    const UNSET: MigProfile =
        MigProfile { id: 0, name: "", compute_slices: 0, memory_slices: 0, memory_mib: 0, starts: &[], media_extension: false };
    let mut out = [UNSET; 7];
    let mut i = 0;
    while i < 7 {
        let (id, compute_slices, memory_slices, starts, media_extension) = GEOMETRY[i];
        out[i] =
            MigProfile { id, name: names[i], compute_slices, memory_slices, memory_mib: memory_mib[i], starts, media_extension };
        i += 1;
    }
    out
}

// Memory figures. NVIDIA's guide gives each profile's memory only as a fraction of the card
// (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html), so the
// MiB below are `nvidia-smi mig -lgip` readings: GiB with two decimals, each a multiple of 1/8
// GiB once `.62`/`.38` are read as `.625`/`.375` (exact MiB readings agree: an H100 1g.10gb
// instance shows 9984 MiB = 9.75 GiB; an A100-40GB 3g.20gb instance 20096 MiB = 19.625 GiB),
// times 1024. The memory of an instance also varies with its placement (the same A100 showed
// 20224 MiB at slice 4 and 20096 MiB at slice 0, github.com/seansiddens/mps-test README, driver
// 450.80.02); `-lgip` reports the smaller, and so does the catalogue: a published capacity must
// never promise more than the instance has. Where the driver can ask NVML
// (`nvmlDeviceGetGpuInstanceProfileInfo`), NVML's figure for the node's own driver wins.

/// A100 40GB (SXM4 and PCIe): `-lgip` 4.75 / 9.75 / 19.62 / 39.38 GiB, captured on an
/// A100-SXM4-40GB (public capture of a MIG walkthrough, driver branch not shown; 3g.20gb agrees
/// with seansiddens/mps-test on R450).
static A100_40GB: [MigProfile; 7] = profiles(
    ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    [4864, 4864, 9984, 9984, 20096, 20096, 40320],
);

/// A100 80GB (SXM4 and PCIe) and A800 80GB, same geometry: `-lgip` 9.50 / 19.50 / 39.25 / 79.00
/// GiB (two independent public captures agree, A100-SXM4-80GB, 98 SMs; driver branch not shown).
/// 79.00 GiB = 80896 MiB is also the figure Volcano's sample config (source document 001) gives
/// its `7g.79gb`, the name HAMi and Volcano use for this card's full profile.
static A100_80GB: [MigProfile; 7] = profiles(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    [9728, 9728, 19968, 19968, 40192, 40192, 80896],
);

/// H100 80GB (SXM5 HBM3 and PCIe): `-lgip` 9.75 / 19.62 / 39.50 / 79.25 GiB
/// (https://jbarrow.ai/field_notes/nvidia-mig/, H100 SXM, 132 SMs; the same figures on an H100
/// PCIe with driver 570.169, whose 1g.10gb instances show 9984 MiB).
static H100_80GB: [MigProfile; 7] = profiles(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    [9984, 9984, 20096, 20096, 40448, 40448, 81152],
);

/// H200 141GB (SXM and NVL). [unconfirmed] No reading of a real H200 was found; the names come
/// from NVIDIA's guide and the MiB are derived as (name's gigabytes - 1) GiB, a rule that is a
/// lower bound of every reading above (A100-40GB, A100-80GB, H100: 12 of 12 figures). One
/// public parser test carries an H200 `-lgip` block with 16.00 / 32.50 / 140.00 GiB, origin
/// unknown; if real, 1g.18gb and 1g.35gb/2g.35gb here are too high. Replace with readings from
/// an H200.
static H200_141GB: [MigProfile; 7] = profiles(
    ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    [17408, 17408, 34816, 34816, 71680, 71680, 143360],
);

/// A card model with MIG and its profiles.
#[derive(Debug, PartialEq, Eq)]
pub struct MigModel {
    name: &'static str,
    families: &'static [&'static str],
    memory_gib: Range<u64>,
    profiles: &'static [MigProfile],
}

static MODELS: [MigModel; 4] = [
    MigModel { name: "A100-40GB", families: &["A100"], memory_gib: 36..45, profiles: &A100_40GB },
    MigModel { name: "A100-80GB", families: &["A100", "A800"], memory_gib: 76..85, profiles: &A100_80GB },
    MigModel { name: "H100-80GB", families: &["H100"], memory_gib: 76..85, profiles: &H100_80GB },
    MigModel { name: "H200-141GB", families: &["H200"], memory_gib: 135..151, profiles: &H200_141GB },
];

/// Every catalogued model.
pub fn models() -> &'static [MigModel] {
    &MODELS
}

/// The model of a card from NVML's product name and total memory, if the catalogue knows it.
///
/// Names vary (`NVIDIA A100-SXM4-80GB`, `NVIDIA A100 80GB PCIe`, `NVIDIA H100 PCIe`,
/// `NVIDIA H200`), so a card matches on a family token (a whole word of the name, any case:
/// `A100` but not the `A1000` of an RTX A1000) and on its memory, which also keeps the 94 GB H100
/// NVL, whose profiles differ, out of the 80 GB model.
pub fn model_for(product_name: &str, memory_bytes: u64) -> Option<&'static MigModel> {
    let upper = product_name.to_ascii_uppercase();
    let tokens: Vec<&str> = upper.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    let gib = memory_bytes >> 30;
    MODELS.iter().find(|m| m.memory_gib.contains(&gib) && m.families.iter().any(|f| tokens.contains(f)))
}

impl MigModel {
    /// The catalogue's name of the model, such as `A100-80GB`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The model's profiles.
    pub fn profiles(&self) -> &'static [MigProfile] {
        self.profiles
    }

    /// The profile with NVML's GPU-instance profile id `id`.
    pub fn profile(&self, id: u32) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// The profile a configuration names: its exact name (any case), or else the one profile
    /// with the same compute slices and `+me` whose gigabytes differ by at most one, because
    /// HAMi's and Volcano's configs call the 80 GB cards' full profile `7g.79gb`.
    pub fn profile_named(&self, name: &str) -> Option<&'static MigProfile> {
        if let Some(p) = self.profiles.iter().find(|p| p.name.eq_ignore_ascii_case(name)) {
            return Some(p);
        }
        let (compute, gb, me) = MigProfile::parse_name(name)?;
        let mut near = self
            .profiles
            .iter()
            .filter(|p| MigProfile::parse_name(p.name).is_some_and(|(c, g, m)| c == compute && m == me && g.abs_diff(gb) <= 1));
        match (near.next(), near.next()) {
            (Some(p), None) => Some(p),
            _ => None,
        }
    }

    /// The placement of `profile` (one of this model's) at memory slice `start`, if valid.
    pub fn placement(&self, profile: &'static MigProfile, start: u8) -> Option<Placement> {
        let ours = self.profiles.iter().any(|p| std::ptr::eq(p, profile));
        (ours && profile.starts.contains(&start)).then_some(Placement { profile, start })
    }

    /// Every valid (profile, start) of the model, profile by profile in catalogue order.
    pub fn placements(&self) -> Vec<Placement> {
        self.profiles.iter().flat_map(|profile| profile.starts.iter().map(move |&start| Placement { profile, start })).collect()
    }

    /// The counters a card of this model offers; the whole card consumes all of them.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        let mut counters: BTreeMap<String, u64> = (0..MEMORY_SLICES).map(|s| (memory_slice_counter(s), 1)).collect();
        counters.insert(COMPUTE_COUNTER.to_owned(), u64::from(COMPUTE_SLICES));
        counters.insert(MEDIA_COUNTER.to_owned(), 1);
        counters
    }
}

/// A profile at a valid start on its card: one device of dynamic MIG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    profile: &'static MigProfile,
    start: u8,
}

impl Placement {
    /// The profile.
    pub fn profile(&self) -> &'static MigProfile {
        self.profile
    }

    /// The first memory slice.
    pub fn start(&self) -> u8 {
        self.start
    }

    /// The memory slices it occupies.
    pub fn slots(&self) -> Range<u8> {
        self.start..self.start + self.profile.memory_slices
    }

    /// Whether the two share a memory slice (and so cannot both exist).
    pub fn overlaps(&self, other: &Placement) -> bool {
        self.start < other.slots().end && other.start < self.slots().end
    }

    /// The counters it consumes: its memory slices, its compute slices, and the media
    /// extensions for a `+me` profile.
    pub fn consumes(&self) -> BTreeMap<String, u64> {
        let mut used: BTreeMap<String, u64> = self.slots().map(|s| (memory_slice_counter(s), 1)).collect();
        used.insert(COMPUTE_COUNTER.to_owned(), u64::from(self.profile.compute_slices));
        if self.profile.media_extension {
            used.insert(MEDIA_COUNTER.to_owned(), 1);
        }
        used
    }

    /// Its device name on the card with minor `minor`: `hami-gpu-<minor>-mig-<profile>-<start>`,
    /// such as `hami-gpu-0-mig-1g-10gb-me-3` (the whole card being `hami-gpu-0`; a MIG instance
    /// made outside the driver is `hami-gpu-<minor>-mig-<gi>-<ci>`, all digits, so never the same).
    pub fn device_name(&self, minor: u32) -> DeviceName {
        let name = format!("{}-{minor}-mig-{}-{}", crate::device::DEVICE_TYPE, self.profile.dns_name(), self.start);
        // At most 36 characters of digits, lowercase letters and '-' for every catalogued
        // profile (mig_tests checks each at u32::MAX), well inside a DNS label.
        DeviceName::new(name).expect("catalogue profile names make valid device names")
    }
}

/// The smallest profile of `model` whose memory covers `memory_mib` and that `allowed` names
/// (all when `None`): the first of [`covering`].
pub fn smallest_covering(model: &MigModel, memory_mib: u64, allowed: Option<&[&str]>) -> Option<&'static MigProfile> {
    covering(model, memory_mib, allowed).into_iter().next()
}

/// Every profile of `model` whose memory covers `memory_mib` and that `allowed` names (all when
/// `None`), smallest first: least memory, then fewest compute slices; what a claim's
/// `firstAvailable` list asks for, so the scheduler takes the smallest that is free.
///
/// `+me` profiles come last: they hold the card's only media extensions, which a pod asking for
/// memory has not asked for.
pub fn covering(model: &MigModel, memory_mib: u64, allowed: Option<&[&str]>) -> Vec<&'static MigProfile> {
    let mut profiles: Vec<&'static MigProfile> = model
        .profiles
        .iter()
        .filter(|p| p.memory_mib >= memory_mib)
        .filter(|p| allowed.is_none_or(|names| names.iter().any(|n| n.eq_ignore_ascii_case(p.name))))
        .collect();
    profiles.sort_by_key(|p| (p.media_extension, p.memory_mib, p.compute_slices));
    profiles
}

/// A MIG profile a device config lists that the card's model does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MIG profile {profile:?}, listed for {entry}, is not a profile of the {model} card {product:?}")]
pub struct UnknownProfile {
    /// The profile as the config names it.
    pub profile: String,
    /// The config entry's models, comma-separated.
    pub entry: String,
    /// The catalogue model of the card.
    pub model: &'static str,
    /// The card's product name.
    pub product: String,
}

/// The profiles a device config allows on a card: every profile named by the geometries
/// (`knownMigGeometries`) or profile lists (`migProfileAllowlist`) of the entries whose models
/// the product name contains, as HAMi matches them; `None` when no entry names the card, which
/// leaves all of the model's profiles allowed.
///
/// A geometry's `count` and `memory` are not used: which instances fit together is the
/// counters' business, and an instance's memory is the catalogue's (or NVML's).
///
/// # Errors
/// [`UnknownProfile`] when an entry naming the card lists a profile its model does not have.
pub fn allowed_profiles(
    model: &MigModel,
    product_name: &str,
    config: &[MigModels],
) -> Result<Option<Vec<&'static str>>, UnknownProfile> {
    let mut allowed: Option<BTreeSet<&'static str>> = None;
    for entry in config.iter().filter(|e| e.models.iter().any(|m| product_name.contains(m.as_str()))) {
        let geometries = entry.groups.iter().flat_map(|g| &g.geometries).map(|g| g.name.as_str());
        for name in geometries.chain(entry.profiles.iter().map(String::as_str)) {
            let profile = model.profile_named(name).ok_or_else(|| UnknownProfile {
                profile: name.to_owned(),
                entry: entry.models.join(", "),
                model: model.name,
                product: product_name.to_owned(),
            })?;
            allowed.get_or_insert_default().insert(profile.name);
        }
    }
    Ok(allowed.map(|set| set.into_iter().collect()))
}

#[cfg(test)]
#[path = "mig_tests.rs"]
mod tests;
