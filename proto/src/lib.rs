//! The kubelet's gRPC contracts that a DRA kubelet plugin serves, generated from `.proto` files
//! written for this project from the public Kubernetes API (`k8s.io/kubelet/pkg/apis/...`).
//!
//! This crate holds generated types and service stubs only: no I/O, no policy. The driver maps
//! them to its domain types; the field numbers are pinned by the tests below because they are the
//! wire contract with every kubelet in the field.

#![allow(missing_docs, clippy::unwrap_used)]

/// DRA plugin service `v1` (the only version with `share_id`).
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// DRA plugin service `v1beta1`, still spoken by older kubelets.
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Kubelet plugin registration (`pluginregistration`, API v1).
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// DRA device health streaming (`v1alpha1.DRAResourceHealth`).
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// DRA device health streaming (`v1.DRAResourceHealth`), the GA form of v1alpha1.
pub mod health_v1 {
    tonic::include_proto!("v1");
}

/// The service names a plugin advertises in `PluginInfo.supported_versions`: the kubelet wants
/// `<proto package>.<service>` with the package's last element only.
pub mod service_names {
    /// DRA v1.
    pub const DRA_V1: &str = "v1.DRAPlugin";
    /// DRA v1beta1.
    pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
    /// DRA health v1alpha1.
    pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
    /// DRA health v1.
    pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
    /// The plugin type string for DRA drivers.
    pub const PLUGIN_TYPE_DRA: &str = "DRAPlugin";
}

#[cfg(test)]
mod tests;
