//! The admission webhook of vgpu-dra's HAMi compatibility path, served as `vgpu-dra webhook`.
//!
//! Pods written for HAMi's device plugin (`nvidia.com/gpu`, `gpumem`, `gpucores`, ...) reach this
//! webhook through the API server; [`vgpu_scheduling::compat`] converts them into DRA claims on a
//! content-hashed ResourceClaimTemplate, which this crate creates before answering with the JSON
//! patch. The resource claim controller then makes one claim per pod, owned by the pod.
//!
//! What it does: AdmissionReview in and out ([`review`]), the cluster side of an admission
//! ([`admit`]), its serving certificate kept in a Secret, self-signed with finite validity and
//! renewed before expiry or written by cert-manager ([`tls`]), reloaded without a restart
//! ([`certs`]), the MutatingWebhookConfiguration with `matchConditions` so only such pods are
//! sent ([`registration`]), HTTPS serving that admits only the API server's client certificate
//! ([`client_auth`], [`server`]) and metrics ([`metrics`]).
//! What it does not do: the conversion rules (they live in the scheduling crate, shared with the
//! node daemon).

pub mod admit;
pub mod args;
pub mod certs;
pub mod claims;
pub mod client_auth;
pub mod kube_cluster;
pub mod metrics;
pub mod quota;
pub mod registration;
pub mod review;
mod run;
pub mod server;
pub mod tls;

pub use args::WebhookArgs;
pub use run::{RunError, run};

/// An error and its causes on one line, for logs and admission messages.
pub(crate) use vgpu_dra_runtime::error_chain;
pub use vgpu_dra_runtime::install_crypto_provider;
