//! The probes against real sockets in a temp dir: tonic servers behind the same HTTP/2 shim the
//! daemon serves through, a listener that accepts and never reads, a socket that is not there.

use std::path::Path;
use std::time::Instant;

use tonic::{Code, Request, Response, Status};
use vgpu_dra_proto::dra_v1;
use vgpu_dra_proto::dra_v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use vgpu_dra_proto::registration::registration_server::{Registration, RegistrationServer};
use vgpu_dra_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

use super::*;
use crate::plugin::kubelet::uds;

/// Shorter than the daemon's two seconds, so the tests of a silent socket stay quick, and long
/// enough that a loaded machine still answers the other calls well within it.
const TIMEOUT: Duration = Duration::from_secs(1);

/// How the fake DRA service answers `NodePrepareResources`.
#[derive(Clone, Copy)]
enum Dra {
    Answer,
    Fail(Code),
    Hang,
}

#[derive(Clone, Copy)]
struct Fake(Dra);

#[tonic::async_trait]
impl Registration for Fake {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo { name: "probe-test".into(), ..Default::default() }))
    }
    async fn notify_registration_status(
        &self,
        _: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[tonic::async_trait]
impl DraPlugin for Fake {
    async fn node_prepare_resources(
        &self,
        req: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        assert!(req.into_inner().claims.is_empty(), "the probe prepares nothing");
        match self.0 {
            Dra::Answer => Ok(Response::new(dra_v1::NodePrepareResourcesResponse::default())),
            Dra::Fail(code) => Err(Status::new(code, "state is wedged")),
            Dra::Hang => std::future::pending().await,
        }
    }
    async fn node_unprepare_resources(
        &self,
        _: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(dra_v1::NodeUnprepareResourcesResponse::default()))
    }
}

/// Both sockets under `dir`, as the daemon lays them out, served until the token is dropped.
fn serve(dir: &Path, dra: Dra) -> (PluginSockets, tokio_util::sync::DropGuard) {
    let sockets = sockets(dir);
    let cancel = CancellationToken::new();
    let (reg, dra_conns) = (uds::bind(&sockets.registration).unwrap(), uds::bind(&sockets.dra).unwrap());
    let stop = cancel.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Fake(dra)))
            .serve_with_incoming_shutdown(reg, stop.cancelled_owned()),
    );
    let stop = cancel.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DraPluginServer::new(Fake(dra)))
            .serve_with_incoming_shutdown(dra_conns, stop.cancelled_owned()),
    );
    (sockets, cancel.drop_guard())
}

fn sockets(dir: &Path) -> PluginSockets {
    PluginSockets { registration: dir.join("reg.sock"), dra: dir.join("dra.sock") }
}

/// A listener at `path` that accepts every connection and never reads from it.
fn silent(path: &Path) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    })
}

/// [`silent`], counting the connections it accepted.
fn counting(path: &Path) -> Arc<std::sync::atomic::AtomicUsize> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(conn);
        }
    });
    accepted
}

fn probes(sockets: PluginSockets, ready: bool) -> Probes {
    Probes {
        registered: Arc::new(AtomicBool::new(ready)),
        published: Arc::new(AtomicBool::new(ready)),
        sockets,
        call_timeout: TIMEOUT,
        checks: Arc::default(),
    }
}

#[tokio::test]
async fn sockets_that_answer_a_call_are_healthy_and_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (sockets, _stop) = serve(dir.path(), Dra::Answer);
    assert_eq!(health(&probes(sockets.clone(), true)).await, (StatusCode::OK, "ok\n".into()));
    assert_eq!(readiness(&probes(sockets.clone(), true)).await, (StatusCode::OK, "ok\n".into()));
    let (code, body) = readiness(&probes(sockets, false)).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("not registered with the kubelet\nResourceSlices not published"), "{body}");
}

#[tokio::test]
async fn a_listener_that_never_answers_fails_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = sockets(dir.path());
    let _listeners = (silent(&sockets.registration), silent(&sockets.dra));
    let started = Instant::now();
    let (code, body) = health(&probes(sockets.clone(), true)).await;
    let took = started.elapsed();
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    // Both sockets are asked at once: one deadline, not two.
    assert!(took >= TIMEOUT && took < TIMEOUT * 2, "took {took:?}");
    let reg = format!("registration socket {}: GetInfo: no answer within 1s", sockets.registration.display());
    let dra = format!("DRA socket {}: NodePrepareResources: no answer within 1s", sockets.dra.display());
    assert_eq!(body, format!("{reg}\n{dra}\n"));
    let (code, body) = readiness(&probes(sockets, true)).await;
    assert_eq!((code, body), (StatusCode::SERVICE_UNAVAILABLE, format!("{reg}\n{dra}\n")));
}

#[tokio::test]
async fn a_server_that_hangs_in_the_call_fails_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (sockets, _stop) = serve(dir.path(), Dra::Hang);
    let started = Instant::now();
    let (code, body) = health(&probes(sockets.clone(), true)).await;
    assert!(started.elapsed() < TIMEOUT * 2, "took {:?}", started.elapsed());
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, format!("DRA socket {}: NodePrepareResources: no answer within 1s\n", sockets.dra.display()));
}

#[tokio::test]
async fn an_error_status_is_named_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let (sockets, _stop) = serve(dir.path(), Dra::Fail(Code::Unavailable));
    let (code, body) = health(&probes(sockets.clone(), true)).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    let expected = format!("DRA socket {}: NodePrepareResources answered Unavailable: state is wedged\n", sockets.dra.display());
    assert_eq!(body, expected);
}

#[tokio::test]
async fn a_missing_socket_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (sockets, _stop) = serve(dir.path(), Dra::Answer);
    std::fs::remove_file(&sockets.dra).unwrap();
    let (code, body) = health(&probes(sockets.clone(), true)).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    // The registration socket still answers; the cause is said once.
    let expected = format!("DRA socket {}: connecting: No such file or directory (os error 2)\n", sockets.dra.display());
    assert_eq!(body, expected);
}

#[tokio::test]
async fn a_flood_of_probes_makes_a_bounded_number_of_checks() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = sockets(dir.path());
    let (registration, dra) = (counting(&sockets.registration), counting(&sockets.dra));
    let shared = probes(sockets, true);
    // Sockets that never answer: each check holds its deadline, the worst case for a flood.
    let calls: Vec<_> = (0..50)
        .map(|i| {
            let p = shared.clone();
            tokio::spawn(async move { if i % 2 == 0 { health(&p).await } else { readiness(&p).await } })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().0, StatusCode::SERVICE_UNAVAILABLE);
    }
    // The first check, and one more for the requests that arrived while it ran; not fifty.
    let (r, d) = (registration.load(Ordering::SeqCst), dra.load(Ordering::SeqCst));
    assert!((1..=2).contains(&r) && (1..=2).contains(&d), "{r} registration and {d} DRA connections");
    // A probe after them reads no result older than itself: it makes a check of its own.
    assert_eq!(readiness(&shared).await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(dra.load(Ordering::SeqCst), d + 1);
}
