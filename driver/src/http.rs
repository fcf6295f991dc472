//! The HTTP endpoints: `/metrics`, `/healthz` (the kubelet plugin's sockets answer a real gRPC
//! call each, within a deadline) and `/readyz` (the same calls, and also registered with the
//! kubelet and the last attempt to publish the slices succeeded).
//!
//! The port is open to whoever reaches the node, so each endpoint's work is bounded whatever
//! the request rate ([`Coalesced`]): one socket check at a time, shared by the probes that
//! arrived before it started, and one render of the metrics at a time, likewise.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State as AxumState;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::coalesce::Coalesced;
use crate::metrics::Metrics;
use crate::plugin::kubelet::probe::PluginSockets;
use crate::plugin::report::DeviceReport;
use crate::plugin::state::State;

/// What the probes look at.
#[derive(Clone)]
pub struct Probes {
    /// The kubelet accepted the registration.
    pub registered: Arc<AtomicBool>,
    /// The last attempt to publish the pool succeeded ([`crate::publisher::Publisher::ready_flag`]).
    pub published: Arc<AtomicBool>,
    /// The kubelet plugin's sockets, each asked a call that changes nothing.
    pub sockets: PluginSockets,
    /// How long each socket may take to answer
    /// ([`crate::plugin::kubelet::probe::CALL_TIMEOUT`]).
    pub call_timeout: Duration,
    /// The last check of the sockets, shared by both probes.
    pub checks: Arc<Coalesced<Result<(), Vec<String>>>>,
}

/// What a scrape reads: the registry, with the device figures set from the state just before.
#[derive(Clone)]
pub struct Scrape {
    /// The registry.
    pub metrics: Arc<Metrics>,
    /// The device figures in it.
    pub report: Arc<DeviceReport>,
    /// Where they come from.
    pub state: Arc<State>,
    /// The last rendering, shared by the scrapes that arrived before it started.
    pub renders: Arc<Coalesced<String>>,
}

impl Scrape {
    /// A scrape of `metrics` with the device figures of `report`, read from `state`.
    pub fn new(metrics: Arc<Metrics>, report: Arc<DeviceReport>, state: Arc<State>) -> Self {
        Self { metrics, report, state, renders: Arc::default() }
    }

    /// The text exposition, with the device figures as the state has them now (or as a
    /// rendering that started after the call did has them).
    pub async fn render(&self) -> String {
        self.renders
            .get(|| async {
                self.report.update(&self.state.snapshot().await);
                self.metrics.encode()
            })
            .await
    }
}

#[derive(Clone)]
struct Shared {
    probes: Probes,
    scrape: Scrape,
}

/// Each socket that failed its call, one line each.
async fn sockets_answer(probes: &Probes) -> Result<(), Vec<String>> {
    probes
        .checks
        .get(|| async {
            probes.sockets.check(probes.call_timeout).await.map_err(|failed| failed.iter().map(ToString::to_string).collect())
        })
        .await
}

/// `/healthz`: 200 when both sockets answer their call; else 503 naming each that did not.
async fn health(probes: &Probes) -> (StatusCode, String) {
    match sockets_answer(probes).await {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(failed) => {
            // Three of these in a row and the kubelet restarts the container.
            tracing::warn!(error = %failed.join("; "), "liveness check failed");
            (StatusCode::SERVICE_UNAVAILABLE, failed.join("\n") + "\n")
        }
    }
}

/// `/readyz`: the same calls (cheap: a few local round trips every probe period), and the
/// registration and publishing flags.
async fn readiness(probes: &Probes) -> (StatusCode, String) {
    let mut missing = sockets_answer(probes).await.err().unwrap_or_default();
    if !probes.registered.load(Ordering::SeqCst) {
        missing.push("not registered with the kubelet".into());
    }
    if !probes.published.load(Ordering::SeqCst) {
        missing.push("ResourceSlices not published (not yet, or the last attempt failed)".into());
    }
    if missing.is_empty() {
        (StatusCode::OK, "ok\n".into())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, missing.join("\n") + "\n")
    }
}

async fn healthz(AxumState(s): AxumState<Shared>) -> (StatusCode, String) {
    health(&s.probes).await
}

async fn readyz(AxumState(s): AxumState<Shared>) -> (StatusCode, String) {
    readiness(&s.probes).await
}

async fn metrics(AxumState(s): AxumState<Shared>) -> ([(&'static str, &'static str); 1], String) {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.scrape.render().await)
}

/// Serves the endpoints on `address` until `cancel`.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(address: SocketAddr, probes: Probes, scrape: Scrape, cancel: CancellationToken) -> anyhow::Result<()> {
    let shared = Shared { probes, scrape };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| anyhow::anyhow!("binding {address}: {e}"))?;
    // The bound address: with port 0 (tests, the benchmark) the log is how the port is found.
    let bound = listener.local_addr().unwrap_or(address);
    tracing::info!(address = %bound, "metrics and probes listening");
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| vgpu_dra_runtime::net::no_delay(tcp));
    axum::serve(listener, app).with_graceful_shutdown(cancel.cancelled_owned()).await?;
    Ok(())
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
