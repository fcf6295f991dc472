//! What every vgpu-dra process shares, in one place: logging set-up, the TLS crypto provider,
//! error chains for logs and answers, locks that a panic elsewhere cannot wedge, and the
//! settings of the sockets we serve on.

mod error_chain;
pub mod logging;
pub mod net;
pub mod sync;

pub use error_chain::error_chain;

/// Installs ring as rustls' process-wide provider. When another crate of the same build enables
/// rustls' aws-lc-rs as well (the CDI library's test dependency does, under `cargo test
/// --workspace`), rustls can no longer pick one by itself and the first TLS client panics.
/// Idempotent: a provider already installed stays.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
