//! vgpu-dra: a Kubernetes DRA driver that shares NVIDIA GPUs between pods with HAMi-core limits.
//!
//! The library holds everything the `vgpu-dra` binary does, so tests can call it: discovery of
//! the node's GPUs ([`discovery`]), the ResourceSlices built from them ([`slices`]), the node
//! monitor of HAMi-core's regions ([`monitor`]) and the command-line front end ([`cli`]). The arithmetic lives in `vgpu-scheduling`, the CDI file
//! handling in `cdi-spec`, the kubelet's wire contracts in `vgpu-dra-proto`.

pub mod alloc;
pub mod backoff;
pub mod cli;
pub mod coalesce;
pub mod config;
pub mod daemon;
pub mod discovery;
pub mod fsutil;
pub mod http;
pub mod metrics;
pub mod mig;
pub mod monitor;
pub mod plugin;
pub mod preflight;
pub mod publisher;
pub mod slices;
#[cfg(test)]
mod testlog;

pub use vgpu_dra_runtime::install_crypto_provider;
