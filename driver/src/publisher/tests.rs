//! The publisher against a fake API server (a tower service behind a real `kube::Client`): no
//! test bed, and each kind of call can be made to hang.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::time::Instant;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::watch;
use vgpu_scheduling::Health;

use super::*;
use crate::discovery::mock::{MockSource, parse_spec};

const NODE: &str = "n1";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// The calls the publisher makes, as the fake names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    GetNode,
    List,
    Watch,
    Patch,
    Delete,
}

/// Slices kept in memory; calls of the kinds in `hang` never answer.
#[derive(Default)]
struct FakeApi {
    slices: Mutex<BTreeMap<String, Value>>,
    hang: Mutex<Vec<Call>>,
    calls: Mutex<Vec<Call>>,
}

impl FakeApi {
    fn hang(&self, calls: &[Call]) {
        *self.hang.lock().unwrap() = calls.to_vec();
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn client(self: &Arc<Self>) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.answer(request).await) }
        });
        kube::Client::new(service, "default")
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let watching = request.uri().query().is_some_and(|q| q.contains("watch=true"));
        let name = path.strip_prefix(SLICES).and_then(|p| p.strip_prefix('/')).map(str::to_owned);
        let call = match (&method, name.is_some()) {
            (&Method::GET, _) if path == format!("/api/v1/nodes/{NODE}") => Call::GetNode,
            (&Method::GET, false) if path == SLICES && watching => Call::Watch,
            (&Method::GET, false) if path == SLICES => Call::List,
            (&Method::PATCH, true) => Call::Patch,
            (&Method::DELETE, true) => Call::Delete,
            _ => return reply(StatusCode::NOT_FOUND, &json!({"kind": "Status", "code": 404})),
        };
        self.calls.lock().unwrap().push(call);
        // A watch that never sends an event, like a quiet one.
        if call == Call::Watch || self.hang.lock().unwrap().contains(&call) {
            std::future::pending::<()>().await;
        }
        match call {
            Call::GetNode => {
                reply(StatusCode::OK, &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid"}}))
            }
            Call::List => {
                let items: Vec<Value> = self.slices.lock().unwrap().values().cloned().collect();
                reply(
                    StatusCode::OK,
                    &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            Call::Patch => {
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let mut slice: Value = serde_json::from_slice(&bytes).unwrap();
                slice["metadata"]["resourceVersion"] = json!("1");
                self.slices.lock().unwrap().insert(name.unwrap_or_default(), slice.clone());
                reply(StatusCode::OK, &slice)
            }
            Call::Delete => match self.slices.lock().unwrap().remove(&name.unwrap_or_default()) {
                Some(slice) => reply(StatusCode::OK, &slice),
                None => reply(StatusCode::NOT_FOUND, &json!({"kind": "Status", "code": 404})),
            },
            Call::Watch => unreachable!("never answered"),
        }
    }
}

fn reply(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap()
}

fn inventory() -> Inventory {
    MockSource::new(NODE, parse_spec("2xTesla T4:15Gi").unwrap()).inventory().unwrap()
}

const TIMEOUT: Duration = Duration::from_millis(200);

fn publisher(api: &Arc<FakeApi>, snapshots: watch::Receiver<Option<Inventory>>) -> Publisher {
    let options = PublisherOptions {
        api_timeout: TIMEOUT,
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        ..Default::default()
    };
    Publisher::new(api.client(), NODE.into(), SnapshotSource::new(snapshots), SharingConfig::default(), options)
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ready(flag: &AtomicBool) -> bool {
    flag.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_failed_publish_clears_readiness_and_the_next_success_sets_it() {
    let api = Arc::new(FakeApi::default());
    let (tx, rx) = watch::channel(Some(inventory()));
    let publisher = publisher(&api, rx);
    let flag = publisher.ready_flag();
    assert!(!ready(&flag), "not ready before the first publish");
    let cancel = CancellationToken::new();
    let task = tokio::spawn(publisher.run(cancel.clone()));
    until("the first publish", || ready(&flag)).await;
    let published = api.slices.lock().unwrap().values().next().cloned().unwrap();
    assert!(!published.to_string().contains("taints"), "{published}");

    // The API server hangs, then a card fails: the pass for the new snapshot times out.
    api.hang(&[Call::GetNode]);
    let mut sick = inventory();
    sick.gpus[1].health = Health::Unhealthy;
    tx.send_replace(Some(sick));
    until("readiness cleared by the failed publish", || !ready(&flag)).await;
    assert!(api.slices.lock().unwrap().values().all(|s| !s.to_string().contains("taints")), "nothing written meanwhile");

    api.hang(&[]);
    until("readiness back after a successful publish", || ready(&flag)).await;
    let published = api.slices.lock().unwrap().values().next().cloned().unwrap();
    assert!(published.to_string().contains("taints"), "the sick card is published tainted: {published}");

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

#[tokio::test]
async fn every_api_call_has_a_deadline_and_the_error_names_its_step() {
    let api = Arc::new(FakeApi::default());
    let (tx, rx) = watch::channel(Some(inventory()));
    let mut publisher = publisher(&api, rx);
    let outcome = publisher.reconcile().await.unwrap();
    assert_eq!(outcome.applied, 1);
    // A foreign slice to delete, and a changed card so the slice must be written again.
    api.slices.lock().unwrap().insert("stale".into(), json!({"metadata": {"name": "stale"}, "spec": {"driver": "x", "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "nodeName": NODE}}));
    let mut sick = inventory();
    sick.gpus[0].health = Health::Unhealthy;
    tx.send_replace(Some(sick));

    for (hung, step) in [
        (Call::GetNode, "reading Node n1"),
        (Call::List, "listing ResourceSlices"),
        (Call::Patch, "applying ResourceSlice"),
        (Call::Delete, "deleting ResourceSlice stale"),
    ] {
        api.hang(&[hung]);
        let started = Instant::now();
        let err = publisher.reconcile().await.unwrap_err();
        let took = started.elapsed();
        assert!(took >= TIMEOUT && took < TIMEOUT * 5, "{hung:?}: gave up after {took:?}");
        let message = format!("{:#}", anyhow::Error::from(err));
        assert!(message.starts_with(step) && message.ends_with("no answer within 200ms"), "{hung:?}: {message}");
    }
    api.hang(&[]);
    let outcome = publisher.reconcile().await.unwrap();
    assert_eq!(outcome.deleted, 1);
    assert!(!api.slices.lock().unwrap().contains_key("stale"));
}

#[tokio::test]
async fn no_snapshot_yet_fails_without_calling_the_api() {
    let api = Arc::new(FakeApi::default());
    let (_tx, rx) = watch::channel(None);
    let err = publisher(&api, rx).reconcile().await.unwrap_err();
    assert!(matches!(err, PublishError::Discovery(DiscoveryError::NoSnapshot)), "{err:?}");
    assert!(api.calls().is_empty());
}

/// Finding 7 of the tenant-safety issue, for the other watch: a slice watch that keeps failing is
/// retried after growing, jittered pauses, and each failure is logged at warn with its cause.
#[tokio::test(start_paused = true)]
async fn a_slice_watch_that_keeps_failing_is_retried_ever_more_slowly_and_says_why() {
    let (warnings, _guard) = crate::testlog::Warnings::capture();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let times = asked.clone();
    let service = tower::service_fn(move |_request: Request<Body>| {
        times.lock().unwrap().push(tokio::time::Instant::now());
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd is down", "code": 500});
        async move { Ok::<_, Infallible>(reply(StatusCode::INTERNAL_SERVER_ERROR, &status)) }
    });
    let api: Api<ResourceSlice> = Api::all(kube::Client::new(service, "default"));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(watch_slices(api, format!("spec.nodeName={NODE}"), Arc::new(Notify::new()), None, cancel.clone()));
    tokio::time::sleep(Duration::from_secs(120)).await;
    cancel.cancel();
    task.await.unwrap();

    let times = asked.lock().unwrap().clone();
    crate::testlog::assert_backed_off(&times, &warnings, &["etcd is down"]);
}
