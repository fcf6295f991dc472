//! Admission latency of `vgpu-dra webhook`: AdmissionReviews of HAMi pods posted straight to its
//! HTTPS endpoint on loopback (what the API server's call costs the webhook), and the same pods
//! created as dry runs through the real API server beside pods the webhook never sees (what a
//! user's `kubectl apply` pays for it).
//!
//! The webhook runs as its own process against the test bed, with the node driver publishing
//! mock cards, so every admission reads real ResourceSlices and creates real templates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, stream};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use vgpu_dra_integration::{ControlPlane, ManagedProcess, free_port};

use crate::cluster;
use crate::stats::Summary;
use crate::target::Target;

/// Namespace of the webhook's Secret (excluded from admission).
const WEBHOOK_NAMESPACE: &str = "vgpu-dra-bench";
/// Namespace of the admitted pods.
const PODS_NAMESPACE: &str = "bench";
/// The request shapes the pods cycle through: a few shapes, as a real cluster's Deployments give.
const SHAPES: [(u32, u32, u32); 4] = [(1, 4096, 50), (1, 2000, 30), (2, 8192, 25), (1, 1024, 10)];

/// The webhook's figures.
#[derive(Debug, Serialize)]
pub struct WebhookRun {
    /// Pods per run.
    pub pods: usize,
    /// Distinct request shapes among them (one template each).
    pub shapes: usize,
    /// Reviews posted to the webhook, one at a time on one connection.
    pub direct_sequential: Summary,
    /// Reviews posted `concurrency` at a time, one connection each.
    pub direct_concurrent: Summary,
    /// Calls in flight in the concurrent run.
    pub concurrency: usize,
    /// Dry-run creates of HAMi pods through the API server (which calls the webhook).
    pub api_server_converted: Summary,
    /// Dry-run creates of pods without GPUs (which the webhook never sees).
    pub api_server_plain: Summary,
    /// The webhook's resident memory after the runs, in MiB.
    pub rss_mib: f64,
}

/// Runs the webhook benchmark with `pods` pods per run.
pub async fn run(vgpu_dra: &std::path::Path, target: &Target, pods: usize, concurrency: usize) -> anyhow::Result<WebhookRun> {
    let plane = ControlPlane::start()?;
    let node = "bench-node-0";
    plane.create_node(node)?;
    let identity = cluster::prepare(&plane, &target.driver)?;
    plane.kubectl().run(&["create", "namespace", WEBHOOK_NAMESPACE])?;
    let client = cluster::client(&plane).await?;
    let mut driver = target.start(&plane, &identity.kubeconfig, node)?;
    cluster::time_until(Duration::from_secs(60), || async { Ok(cluster::slice_count(&client, &target.driver, node).await? > 0) })
        .await
        .with_context(|| format!("first slice\n{}", driver.process.tail(20)))?;

    let port = free_port()?;
    let args: Vec<String> = vec![
        "webhook".into(),
        format!("--url=https://127.0.0.1:{port}/mutate-pods"),
        format!("--listen=127.0.0.1:{port}"),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--namespace={WEBHOOK_NAMESPACE}"),
        format!("--device-class={}", cluster::CLASS),
        format!("--driver-name={}", target.driver),
    ];
    let mut webhook = ManagedProcess::spawn("webhook", vgpu_dra, &args, plane.dir())?;
    let log = webhook.log().to_path_buf();
    cluster::time_until(Duration::from_secs(60), || {
        let log = log.clone();
        async move { Ok(std::fs::read_to_string(&log)?.contains("admission webhook serving")) }
    })
    .await
    .with_context(|| format!("the webhook serving\n{}", webhook.tail(20)))?;
    webhook.check_running()?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), WEBHOOK_NAMESPACE);
    let secret = secrets.get("vgpu-dra-webhook-tls").await?;
    let ca = secret.data.as_ref().and_then(|d| d.get("ca.crt")).context("no ca.crt in the webhook's Secret")?.0.clone();
    let connector = connector(&ca)?;
    let address = format!("127.0.0.1:{port}");

    // Warm up: the first admission of each shape lists slices and creates its template.
    let bodies: Vec<Vec<u8>> = (0..pods).map(review).collect();
    post_all(&connector, &address, &bodies[..SHAPES.len().min(pods)], 1).await?;
    let direct_sequential = post_all(&connector, &address, &bodies, 1).await?;
    let direct_concurrent = post_all(&connector, &address, &bodies, concurrency).await?;

    // Through the API server: the webhook's share is the difference between the two. The API
    // server picks the registration up a moment after it is made.
    let api: Api<Pod> = Api::namespaced(client.clone(), PODS_NAMESPACE);
    let dry = PostParams { dry_run: true, field_manager: None };
    cluster::time_until(Duration::from_secs(60), || async {
        let created = api.create(&dry, &pod(0, true)).await?;
        Ok(created.spec.and_then(|s| s.resource_claims).is_some_and(|c| !c.is_empty()))
    })
    .await
    .context("the API server calling the webhook")?;
    let through = pods.min(200);
    let api_server_converted = dry_runs(&api, (0..through).map(|i| pod(i, true)).collect()).await?;
    let api_server_plain = dry_runs(&api, (0..through).map(|i| pod(i, false)).collect()).await?;

    let pid = webhook.pid().context("webhook not running")?;
    let rss_mib = crate::procfs::sample(pid)?.rss_mib;
    webhook.check_running()?;
    driver.process.check_running()?;
    Ok(WebhookRun {
        pods,
        shapes: SHAPES.len(),
        direct_sequential,
        direct_concurrent,
        concurrency,
        api_server_converted,
        api_server_plain,
        rss_mib,
    })
}

/// A TLS connector trusting only the webhook's CA.
fn connector(ca_pem: &[u8]) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Posts every body, `concurrency` connections at a time (each body on the next free
/// connection), and times each review from send to the whole answer read.
async fn post_all(connector: &TlsConnector, address: &str, bodies: &[Vec<u8>], concurrency: usize) -> anyhow::Result<Summary> {
    let lanes = concurrency.max(1);
    let started = Instant::now();
    let chunks: Vec<Vec<Vec<u8>>> = (0..lanes).map(|lane| bodies.iter().skip(lane).step_by(lanes).cloned().collect()).collect();
    let results: Vec<anyhow::Result<Vec<Duration>>> = stream::iter(chunks)
        .map(|chunk| async move {
            let mut sender = connect(connector, address).await?;
            let mut took = Vec::with_capacity(chunk.len());
            for body in chunk {
                let request = hyper::Request::post("/mutate-pods")
                    .header(hyper::header::HOST, "127.0.0.1")
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(body)))?;
                // The previous answer is read whole, so this waits for nothing but keep-alive
                // bookkeeping; it is outside the timed span.
                sender.ready().await?;
                let at = Instant::now();
                let response = sender.send_request(request).await?;
                let status = response.status();
                let answer = response.into_body().collect().await?.to_bytes();
                took.push(at.elapsed());
                let review: Value = serde_json::from_slice(&answer)?;
                anyhow::ensure!(
                    status.is_success() && review["response"]["allowed"] == true && review["response"]["patch"].is_array(),
                    "review not converted ({status}): {review}"
                );
            }
            Ok(took)
        })
        .buffer_unordered(lanes)
        .collect()
        .await;
    let mut latencies = Vec::with_capacity(bodies.len());
    for r in results {
        latencies.extend(r?);
    }
    Ok(Summary::of(latencies, started.elapsed()))
}

async fn connect(
    connector: &TlsConnector,
    address: &str,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    let tls = connector.connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// The `i`th HAMi pod.
fn pod(i: usize, gpu: bool) -> Pod {
    let (count, memory, cores) = SHAPES[i % SHAPES.len()];
    let limits = if gpu {
        json!({"nvidia.com/gpu": count, "nvidia.com/gpumem": memory, "nvidia.com/gpucores": cores, "cpu": "1"})
    } else {
        json!({"cpu": "1"})
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("bench-{i}"), "namespace": PODS_NAMESPACE},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "cuda", "image": "registry.invalid/none", "resources": {"limits": limits}
        }]}
    }))
    .unwrap_or_default()
}

/// The AdmissionReview the API server sends for the `i`th HAMi pod.
fn review(i: usize) -> Vec<u8> {
    let gvk = json!({"group": "", "version": "v1", "kind": "Pod"});
    let gvr = json!({"group": "", "version": "v1", "resource": "pods"});
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-0000-0000-{i:012}"),
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": format!("bench-{i}"), "namespace": PODS_NAMESPACE, "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": pod(i, true),
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Creates each pod as a server-side dry run, one after another.
async fn dry_runs(api: &Api<Pod>, pods: Vec<Pod>) -> anyhow::Result<Summary> {
    let params = PostParams { dry_run: true, field_manager: None };
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(pods.len());
    for pod in pods {
        let at = Instant::now();
        tokio::time::timeout(Duration::from_secs(15), api.create(&params, &pod)).await.context("dry-run create timed out")??;
        latencies.push(at.elapsed());
    }
    Ok(Summary::of(latencies, started.elapsed()))
}
