//! The allocation core of vgpu-dra: what a share of a GPU is, in numbers.
//!
//! This crate holds the GPU model, Kubernetes quantity arithmetic, capacity request policies
//! (rounded exactly as kube-scheduler rounds them), the devices a node publishes, the ledger of
//! prepared shares, the HAMi-core limits derived from consumed capacity and the conversion of HAMi's
//! resource names into capacity requests. It is pure logic: no I/O, no async, no Kubernetes client,
//! no NVML, so the publisher, the kubelet plugin and a webhook or scheduler extender can share it.

pub mod quantity;

pub use quantity::{Format, Quantity, QuantityError};
pub mod names;
pub mod policy;

pub use names::{DeviceName, DriverName, NameError, Namespace, ObjectName, Uid};
pub use policy::{Capacity, PolicyError, RequestPolicy, Rounding, ValidRequests};
pub mod config;
pub mod device;
pub mod model;

pub use config::{ConfigError, DeviceFilter, NodeOverride, Ratio, SharingConfig};
pub mod device_config;
mod yaml_tree;

pub use device::{Attribute, PublishedDevice, publish};
pub use device_config::{
    ConfigForm, DeviceConfig, DeviceConfigError, HamiRequestSettings, IgnoredKey, MigGeometry, MigGeometryGroup, MigModels,
};
pub use model::{Gpu, Health, Inventory, MigDevice, MigPlacement};
pub mod amounts;
pub mod ledger;

pub use amounts::Amounts;
pub use ledger::{AdmitError, Consumption, Ledger, ShareKey};
pub mod compat;
pub mod limits;
pub mod mig;
pub mod mock;
pub mod quota;
pub mod status_data;

pub use compat::{CardRequest, ClassFacts, CompatError, CompatSettings, PodConversion, convert_pod};
pub use limits::{DeviceShare, LimitError, LimitOptions, container_env, per_card};
pub use status_data::{DeviceStatusData, status_env};
