//! Dynamic MIG instances: creating and destroying them on a card behind [`MigControl`], with a
//! simulator ([`MigSim`]) for every test that has no MIG-capable GPU.
//!
//! Which profiles and placements exist, and the counters the scheduler keeps them apart with,
//! are `vgpu_scheduling::mig`'s; this room only acts on a card. The trait is blocking (NVML is),
//! so async callers run it on `spawn_blocking`.

pub mod caps;
pub mod control;
pub mod nvml;
pub mod offer;
pub mod sim;
pub mod slices;
pub mod view;

pub use control::{MigControl, MigError, MigInstance};
pub use nvml::NvmlMig;
pub use offer::{DynamicMig, MigSettings, PoolLayout};
pub use sim::MigSim;
pub use view::{MigView, OwnedPlacements, PlacementKey};
