//! HTTPS serving of the admission endpoint (tokio-rustls + hyper, HTTP/1.1) and plain-HTTP
//! metrics; both stop accepting on cancellation and drain connections in flight.

use std::io;
use std::sync::Arc;
use std::time::Duration;

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
use crate::registration::{JOBS_PATH, PODS_PATH};

/// How long a client has for its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections in flight get to finish after cancellation.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The admission routes: `POST /mutate-pods`, `POST /mutate-volcano-jobs` and `GET /healthz`.
pub fn admission_router<C: Cluster>(admitter: Arc<Admitter<C>>) -> Router {
    Router::new()
        .route(PODS_PATH, post(mutate_pod::<C>))
        .route(JOBS_PATH, post(mutate_job::<C>))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(admitter)
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

/// The metrics routes: `GET /metrics` (OpenMetrics text) and `GET /healthz`.
pub fn metrics_router(registry: Arc<Registry>) -> Router {
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
        .with_state(registry)
}

/// Serves `router` over TLS on `listener` until `cancel`, then drains connections in flight.
pub async fn serve_tls(listener: TcpListener, tls: Arc<rustls::ServerConfig>, router: Router, cancel: CancellationToken) {
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
        let acceptor = acceptor.clone();
        let router = router.clone();
        let cancel = cancel.clone();
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
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
    axum::serve(listener, router).with_graceful_shutdown(async move { cancel.cancelled().await }).await
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
