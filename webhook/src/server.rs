//! HTTPS serving of the admission endpoint (tokio-rustls + hyper, HTTP/1.1) and plain-HTTP
//! metrics, health and readiness; both stop accepting on cancellation and drain connections in
//! flight. A client refused in the handshake for its certificate is counted and logged.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};

use std::time::{Duration, Instant};
use vgpu_dra_runtime::net::no_delay;
use vgpu_dra_runtime::sync::{lock, read, write};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::admit::{Admitter, Cluster};
use crate::claims::ClaimAdmitter;
use crate::client_auth;
use crate::metrics::Metrics;
use crate::quota::QuotaStore;
use crate::registration::{CLAIMS_PATH, JOBS_PATH, PODS_PATH};

/// How long a client has for its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections in flight get to finish after cancellation.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// A refused client is logged at warn once per address in this long; the metric counts all.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(600);
/// Addresses remembered for [`REFUSAL_LOG_EVERY`]; past this many, the memory starts over.
const REFUSAL_LOG_PEERS: usize = 1024;

/// Whether the webhook can answer reviews, and why not: `/readyz` of the metrics server, the
/// readiness probe (the HTTPS port wants a client certificate the kubelet does not have).
#[derive(Debug, Clone)]
pub struct Readiness(Arc<RwLock<Option<String>>>);

impl Readiness {
    /// Not ready, for `reason`.
    pub fn not_ready(reason: impl Into<String>) -> Self {
        Self(Arc::new(RwLock::new(Some(reason.into()))))
    }

    /// Ready from now on.
    pub fn set_ready(&self) {
        *write(&self.0) = None;
    }

    /// Not ready from now on, for `reason`.
    pub fn set_not_ready(&self, reason: impl Into<String>) {
        *write(&self.0) = Some(reason.into());
    }

    /// Why it is not ready; `None` when it is.
    pub fn reason(&self) -> Option<String> {
        read(&self.0).clone()
    }
}

/// Counts and logs the clients refused in the TLS handshake for their certificate: every one
/// in the metric, each address at warn at most once per `REFUSAL_LOG_EVERY` (a pod retrying
/// in a loop does not flood the log).
#[derive(Debug, Clone)]
pub struct Refusals {
    metrics: Metrics,
    logged: Arc<Mutex<HashMap<IpAddr, Instant>>>,
}

impl Refusals {
    /// Refusals counted in `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics, logged: Arc::default() }
    }

    /// Counts and logs a failed handshake of `peer` when it was about the client certificate;
    /// other failures (a port scan, a probe without TLS) stay at debug.
    fn handshake_failed(&self, peer: std::net::SocketAddr, error: &io::Error) {
        let Some(refusal) = client_auth::refusal(error) else {
            return tracing::debug!(%peer, error = %error, "TLS handshake failed");
        };
        self.metrics.refused_client(refusal.label());
        let now = Instant::now();
        let first = {
            let mut logged = lock(&self.logged);
            if logged.len() >= REFUSAL_LOG_PEERS {
                logged.retain(|_, at| now.duration_since(*at) < REFUSAL_LOG_EVERY);
                if logged.len() >= REFUSAL_LOG_PEERS {
                    logged.clear();
                }
            }
            let due = logged.get(&peer.ip()).is_none_or(|at| now.duration_since(*at) >= REFUSAL_LOG_EVERY);
            if due {
                logged.insert(peer.ip(), now);
            }
            due
        };
        if first {
            tracing::warn!(%peer, reason = refusal.label(), error = %error,
                "refused a client that is not the API server (further refusals of this address are counted, not logged, for {REFUSAL_LOG_EVERY:?})");
        } else {
            tracing::debug!(%peer, reason = refusal.label(), "refused a client");
        }
    }
}

/// The admission routes: `POST /mutate-pods`, `POST /mutate-volcano-jobs` and `GET /healthz`.
pub fn admission_router<C: Cluster + QuotaStore>(admitter: Arc<Admitter<C>>, claims: Option<Arc<ClaimAdmitter<C>>>) -> Router {
    let router = Router::new()
        .route(PODS_PATH, post(mutate_pod::<C>))
        .route(JOBS_PATH, post(mutate_job::<C>))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(admitter);
    match claims {
        Some(claims) => router.merge(Router::new().route(CLAIMS_PATH, post(mutate_claim::<C>)).with_state(claims)),
        None => router,
    }
}

async fn mutate_claim<C: Cluster + QuotaStore>(
    State(claims): State<Arc<ClaimAdmitter<C>>>,
    body: Bytes,
) -> axum::response::Response {
    reply(&claims.review(&body).await)
}

async fn mutate_pod<C: Cluster>(State(admitter): State<Arc<Admitter<C>>>, body: Bytes) -> axum::response::Response {
    reply(&admitter.review(&body).await)
}

async fn mutate_job<C: Cluster>(State(admitter): State<Arc<Admitter<C>>>, body: Bytes) -> axum::response::Response {
    reply(&admitter.review_job(&body).await)
}

fn reply(review: &kube::core::admission::AdmissionReview<kube::core::DynamicObject>) -> axum::response::Response {
    // axum's json feature is off in the workspace; the body is small and serialized once.
    match serde_json::to_vec(&review) {
        Ok(bytes) => ([(http::header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The metrics routes: `GET /metrics` (OpenMetrics text), `GET /healthz` (alive) and
/// `GET /readyz` (200 when `readiness` says so, else 503 with the reason).
pub fn metrics_router(registry: Arc<Registry>, readiness: Readiness) -> Router {
    let ready = move || {
        let readiness = readiness.clone();
        async move {
            match readiness.reason() {
                None => (http::StatusCode::OK, "ok".to_owned()),
                Some(reason) => (http::StatusCode::SERVICE_UNAVAILABLE, reason),
            }
        }
    };
    Router::new()
        .route(
            "/metrics",
            get(|State(registry): State<Arc<Registry>>| async move {
                let mut text = String::new();
                match prometheus_client::encoding::text::encode(&mut text, &registry) {
                    Ok(()) => {
                        ([(http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
                            .into_response()
                    }
                    Err(e) => (http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(registry)
}

/// Serves `router` over TLS on `listener` until `cancel`, then drains connections in flight;
/// clients refused for their certificate go to `refusals`.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    refusals: Refusals,
    cancel: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
        let (tcp, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        no_delay(&tcp);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let cancel = cancel.clone();
        let refusals = refusals.clone();
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return refusals.handshake_failed(peer, &e),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            serve_connection(TokioIo::new(stream), router, cancel).await;
        });
    }
    drain(connections).await;
}

/// Serves `router` over plain HTTP on `listener` until `cancel`.
///
/// # Errors
/// When the server fails.
pub async fn serve_plain(listener: TcpListener, router: Router, cancel: CancellationToken) -> io::Result<()> {
    use axum::serve::ListenerExt;
    axum::serve(listener.tap_io(|tcp| no_delay(tcp)), router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}

async fn serve_connection<I>(io: I, router: Router, cancel: CancellationToken)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(router);
    let connection = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        r = connection.as_mut() => r,
        () = cancel.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

async fn drain(mut connections: JoinSet<()>) {
    let all = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, all).await.is_err() {
        tracing::warn!(left = connections.len(), "connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}
