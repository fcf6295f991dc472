//! The names dynamic MIG devices go by in the compatibility path: their `type`, their class, and
//! the profiles an `nvidia.com/mig-<profile>` resource names. Below both the container rules
//! (which read the resources) and the claims (which select the devices).

use crate::mig::models;

/// The `type` attribute of the driver's dynamic-MIG devices (the whole card is `hami-gpu`).
pub const MIG_DEVICE_TYPE: &str = "hami-mig";

/// The DeviceClass name of MIG devices when none is configured: `mig.<device class>`, as
/// NVIDIA's driver pairs `gpu.nvidia.com` with `mig.nvidia.com`.
pub fn default_mig_device_class(device_class: &str) -> String {
    format!("mig.{device_class}")
}

/// `nvidia.com/mig-<profile>: N` of one container: N instances of the profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigInstances {
    /// The resource as written (`nvidia.com/mig-3g.20gb`).
    pub resource: String,
    /// The catalogue's names the resource stands for (`3g.20gb`; `7g.79gb` is the 80 GB cards'
    /// `7g.80gb`), one in practice, several only for a name between two models' profiles.
    pub profiles: Vec<&'static str>,
    /// Instances.
    pub count: u32,
}

/// The catalogue's names of the profile `suffix` names (the part after `mig-`): the exact name
/// or the nearest of each model ([`crate::mig::MigModel::profile_named`]), `.me` read as `+me`
/// (a resource name has no `+`). Empty for a name no catalogued card has, such as the
/// compute-instance form `1c.3g.20gb`.
pub(super) fn profiles_named(suffix: &str) -> Vec<&'static str> {
    let name = match suffix.strip_suffix(".me") {
        Some(base) => format!("{base}+me"),
        None => suffix.to_owned(),
    };
    let mut out: Vec<&'static str> = Vec::new();
    for profile in models().iter().filter_map(|m| m.profile_named(&name)) {
        if !out.contains(&profile.name()) {
            out.push(profile.name());
        }
    }
    out
}
