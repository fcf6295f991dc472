//! Container Device Interface (CDI) specs as the vgpu-dra driver writes them.
//!
//! This crate holds the spec's serde types ([`Spec`]), the naming rules of CDI kinds and device
//! names ([`Kind`], [`DeviceName`], [`QualifiedDeviceId`]), the lowest `cdiVersion` a spec needs
//! ([`CdiVersion::minimum_for`]) and a spec directory handle ([`SpecDir`]) that writes spec files
//! atomically and lists the ones this driver owns. It does no policy: what goes into a spec is the
//! driver's business. It sits at the end of the data path, between the driver's claim preparation
//! and the container runtime that reads the files.

mod dir;
pub mod file;
mod name;
mod spec;
mod version;

pub use dir::{Durability, IgnoredEntry, OwnedSpec, ReservedSpec, Scan, SpecDir, SpecDirError, StagedSpec, fsyncs};
pub use name::{DeviceName, Kind, NameError, QualifiedDeviceId};
pub use spec::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
pub use version::CdiVersion;
