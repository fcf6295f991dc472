use std::convert::Infallible;
use std::sync::Mutex;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

/// One request the fake API server got: method, path and query, body.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    content_type: String,
    body: Value,
}

/// An API server answering each status write with the next code of `codes` (200 once they run
/// out), noting every request.
fn api(codes: &[u16]) -> (kube::Client, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let codes = Arc::new(Mutex::new(codes.to_vec()));
    let log = seen.clone();
    let service = tower::service_fn(move |request: Request<Body>| {
        let (log, codes) = (log.clone(), codes.clone());
        async move {
            let method = request.method().to_string();
            let uri = request.uri().to_string();
            let content_type = request.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            log.lock().unwrap().push(Seen { method, uri, content_type, body: body.clone() });
            let code = {
                let mut codes = codes.lock().unwrap();
                if codes.is_empty() { 200 } else { codes.remove(0) }
            };
            let reply = if code == 200 {
                body
            } else {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": format!("answer {code}"), "code": code})
            };
            let response = Response::builder()
                .status(StatusCode::from_u16(code).unwrap())
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    });
    (kube::Client::new(service, "default"), seen)
}

fn claim(n: u32) -> ClaimRef {
    ClaimRef::new("team-a", &format!("claim-{n}"), &format!("00000000-0000-0000-0000-{n:012}")).unwrap()
}

fn entry(device: &str) -> AllocatedDeviceStatus {
    AllocatedDeviceStatus {
        driver: "gpu.example.com".into(),
        pool: "node-a".into(),
        device: device.into(),
        share_id: Some("s-1".into()),
        data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(json!({"uuid": "GPU-1", "memoryLimit": "4096m"}))),
        ..Default::default()
    }
}

/// Runs the writer until it has nothing left to do (or `limit` of paused time passed).
async fn drain(writer: &StatusWriter, limit: Duration) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(writer.clone().run(cancel.clone()));
    let start = tokio::time::Instant::now();
    while writer.queued() > 0 && start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The write in flight, if any, ends first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    cancel.cancel();
    task.await.unwrap();
}

fn new_writer(client: kube::Client) -> (StatusWriter, StatusMetrics) {
    let metrics = StatusMetrics::default();
    (StatusWriter::new(client, "gpu.example.com", Duration::from_secs(3), metrics.clone()), metrics)
}

fn count(metrics: &StatusMetrics, result: &str) -> u64 {
    metrics.0.get_or_create(&labels(&[("result", result)])).get()
}

#[tokio::test(start_paused = true)]
async fn a_set_is_a_server_side_apply_of_the_status_naming_the_claims_uid() {
    let (client, seen) = api(&[]);
    let (writer, metrics) = new_writer(client);
    writer.set(&claim(1), vec![entry("hami-gpu-0")]);
    drain(&writer, Duration::from_secs(5)).await;

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let r = &seen[0];
    assert_eq!(r.method, "PATCH");
    assert!(r.uri.starts_with("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-1/status?"), "{}", r.uri);
    assert!(r.uri.contains("fieldManager=gpu.example.com") && r.uri.contains("force=true"), "{}", r.uri);
    assert_eq!(r.content_type, "application/apply-patch+yaml");
    assert_eq!(
        r.body["metadata"],
        json!({"name": "claim-1", "namespace": "team-a", "uid": "00000000-0000-0000-0000-000000000001"})
    );
    assert_eq!(r.body["status"]["devices"][0]["device"], "hami-gpu-0");
    assert_eq!(r.body["status"]["devices"][0]["shareID"], "s-1");
    assert_eq!(r.body["status"]["devices"][0]["data"]["memoryLimit"], "4096m");
    assert_eq!(count(&metrics, "written"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_last_wish_for_a_claim_wins_and_a_clear_sends_no_entries() {
    let (client, seen) = api(&[]);
    let (writer, _) = new_writer(client);
    writer.set(&claim(1), vec![entry("hami-gpu-0")]);
    writer.clear(&claim(1));
    writer.set(&claim(2), vec![entry("hami-gpu-1")]);
    drain(&writer, Duration::from_secs(5)).await;

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "one write per claim, its latest: {seen:?}");
    let of = |name: &str| seen.iter().find(|s| s.body["metadata"]["name"] == name).unwrap().body.clone();
    assert_eq!(of("claim-1")["status"]["devices"], json!([]));
    assert_eq!(of("claim-2")["status"]["devices"][0]["device"], "hami-gpu-1");
}

#[tokio::test(start_paused = true)]
async fn a_failing_api_server_is_asked_again_after_growing_pauses_then_given_up() {
    let (client, seen) = api(&[500, 503, 429]);
    let (writer, metrics) = new_writer(client);
    writer.set(&claim(1), vec![entry("hami-gpu-0")]);
    drain(&writer, Duration::from_secs(60)).await;
    assert_eq!(seen.lock().unwrap().len(), 4, "three failures, then the write");
    assert_eq!(count(&metrics, "written"), 1);

    let (client, seen) = api(&[500; 20]);
    let (writer, metrics) = new_writer(client);
    writer.set(&claim(1), vec![entry("hami-gpu-0")]);
    drain(&writer, Duration::from_secs(600)).await;
    assert_eq!(seen.lock().unwrap().len(), MAX_TRIES as usize, "no endless retries");
    assert_eq!(count(&metrics, "failed"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_newer_wish_replaces_a_write_waiting_to_be_tried_again() {
    let (client, seen) = api(&[500]);
    let (writer, _) = new_writer(client);
    writer.set(&claim(1), vec![entry("hami-gpu-0")]);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(writer.clone().run(cancel.clone()));
    // The first try (after the quiet time) failed; before the pause ends, the claim is unprepared.
    tokio::time::sleep(QUIET + Duration::from_millis(100)).await;
    assert_eq!(seen.lock().unwrap().len(), 1, "the set was tried once");
    writer.clear(&claim(1));
    tokio::time::sleep(Duration::from_secs(5)).await;
    cancel.cancel();
    task.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].body["status"]["devices"], json!([]), "the clear went out, not the old set again");
}

#[tokio::test(start_paused = true)]
async fn refusals_and_gone_claims_are_not_retried() {
    let (warnings, _guard) = crate::testlog::Warnings::capture();
    let (client, seen) = api(&[404, 403, 403, 422]);
    let (writer, metrics) = new_writer(client);
    for n in 1..=4 {
        writer.set(&claim(n), vec![entry("hami-gpu-0")]);
    }
    drain(&writer, Duration::from_secs(60)).await;
    assert_eq!(seen.lock().unwrap().len(), 4, "one try each");
    assert_eq!((count(&metrics, "gone"), count(&metrics, "refused")), (1, 3));
    let rbac: Vec<String> = warnings.lines().into_iter().filter(|l| l.contains("associated-node:patch")).collect();
    assert_eq!(rbac.len(), 1, "a missing permission is said once, with what to grant: {rbac:?}");
}

#[tokio::test(start_paused = true)]
async fn writes_wait_for_a_burst_of_prepares_to_pass_but_not_forever() {
    let (client, seen) = api(&[]);
    let (writer, _) = new_writer(client);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(writer.clone().run(cancel.clone()));
    let written = || seen.lock().unwrap().len();
    // A burst: a prepare every 100 ms for 3 s; nothing is written while it lasts.
    for n in 0..30 {
        writer.set(&claim(n), vec![entry("hami-gpu-0")]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(written(), 0, "a write during the burst");
    tokio::time::sleep(QUIET * 2).await;
    assert_eq!(written(), 30, "all written once it is quiet");
    // Prepares that never stop: the writes go on once the oldest waited MAX_DEFER.
    let steady = MAX_DEFER.as_millis() / 100 + 20;
    for n in 0..steady {
        writer.set(&claim(1000 + u32::try_from(n).unwrap()), vec![entry("hami-gpu-0")]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(written() > 30, "no write in {steady} wishes past MAX_DEFER");
    cancel.cancel();
    task.await.unwrap();
}
