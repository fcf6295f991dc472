//! A node's driver reads only its own claims (issue 17): two drivers, on node-a and node-b, run as
//! pods of the chart's DaemonSet (its RBAC: `get` on claims, no list or watch; `list` and `watch`
//! of pods for the watch of the node's own pods; each with its own pod-bound token, which the API
//! server's audit log tells apart). A claim allocated to node-a and prepared there through the
//! kubelet's own plugin code costs node-b's driver no request and no watch event at all; node-a's
//! driver reads that claim ahead once its pod is bound there, and the prepare then reads nothing:
//! its only requests are the writes of that claim's `status.devices`, in the background (set after
//! the prepare, cleared after the unprepare). Neither driver ever lists or watches claims, and
//! each watches only its own node's pods. Counted from the audit log and the drivers' own
//! metrics, never timed.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use common::chart::{chart_dir, helm, run_as_daemonset_pod};
use common::{DRIVER, claim_and_pod_on, claim_response};
use serde_json::Value;
use vgpu_dra_integration::{
    ControlPlane, KubeletSim, KubeletSimOptions, PlaneOptions, eventually, free_port, http_get, node_host_dir,
};

const NS: &str = "vgpu-dra";
const IMAGE: &str = "image.repository=registry.example.com/vgpu-dra";

/// One request of the audit log: who made it, and what it named.
#[derive(Debug, Clone)]
struct Request {
    /// The pod a bound service-account token names (each driver pod has its own).
    pod: Option<String>,
    verb: String,
    uri: String,
    resource: String,
    subresource: String,
    namespace: String,
    name: String,
}

/// The audit log from a point on (as the bench harness reads it, `integration/bench`).
struct AuditWindow {
    path: PathBuf,
    offset: u64,
}

impl AuditWindow {
    /// From the start of the log.
    fn all(path: &Path) -> Self {
        Self { path: path.to_owned(), offset: 0 }
    }

    /// From now on.
    fn start(path: &Path) -> Self {
        Self { path: path.to_owned(), offset: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) }
    }

    /// The requests of service account `user`, each with the pod its token is bound to.
    fn requests_of(&self, user: &str) -> anyhow::Result<Vec<Request>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(&self.path).with_context(|| format!("{}", self.path.display()))?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let text_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|e| e["user"]["username"] == user)
            .map(|e| Request {
                pod: e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0].as_str().map(str::to_owned),
                verb: text_of(&e["verb"]),
                uri: text_of(&e["requestURI"]),
                resource: text_of(&e["objectRef"]["resource"]),
                subresource: text_of(&e["objectRef"]["subresource"]),
                namespace: text_of(&e["objectRef"]["namespace"]),
                name: text_of(&e["objectRef"]["name"]),
            })
            .collect())
    }
}

#[test]
fn a_claim_on_node_a_costs_node_b_nothing() {
    let mut plane = ControlPlane::start_with(&PlaneOptions { audit: true, ..Default::default() }).expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let audit = plane.audit_log().context("no audit log")?;
    for node in ["node-a", "node-b"] {
        plane.create_node(node)?;
    }
    kubectl.run(&["create", "namespace", NS])?;
    let chart = chart_dir();
    // The read ahead is what this test measures: the chart's podWatch (off by default) on.
    let rendered = helm(
        plane,
        &[
            "template",
            "vgpu-dra",
            chart.to_str().context("chart path")?,
            "-n",
            NS,
            "--set",
            IMAGE,
            "--set",
            "podWatch=true",
            // The webhook is not run here: no client CA for it.
            "--set",
            "webhook.clientAuth.enabled=false",
        ],
    )?;
    kubectl.apply(&rendered)?;
    let user = format!("system:serviceaccount:{NS}:vgpu-dra");

    // Both drivers with the chart's RBAC only, each under its own pod's token.
    let (port_a, port_b) = (free_port()?, free_port()?);
    let (metrics_a, metrics_b) =
        (format!("--metrics-address=127.0.0.1:{port_a}"), format!("--metrics-address=127.0.0.1:{port_b}"));
    let mut a = run_as_daemonset_pod(plane, NS, "vgpu-dra", "node-a", &["--mock-gpus=1xTesla T4:15Gi", &metrics_a])?;
    let mut b = run_as_daemonset_pod(plane, NS, "vgpu-dra", "node-b", &["--mock-gpus=1xTesla T4:15Gi", &metrics_b])?;
    anyhow::ensure!(a.args.iter().any(|x| x == "--pod-watch=true"), "podWatch=true runs the pod watch: {:?}", a.args);
    let (pod_a, pod_b) = ("vgpu-dra-node-a", "vgpu-dra-node-b");
    eventually("both nodes' slices published", Duration::from_secs(30), || {
        a.process.check_running()?;
        b.process.check_running()?;
        let list = kubectl.get_json(&["resourceslices"])?;
        let nodes: Vec<&str> =
            list["items"].as_array().into_iter().flatten().filter_map(|s| s["spec"]["nodeName"].as_str()).collect();
        Ok((nodes.contains(&"node-a") && nodes.contains(&"node-b")).then_some(()))
    })?;
    let registry = node_host_dir(plane, "node-a").join("kubelet/plugins_registry");
    std::fs::create_dir_all(&registry)?;
    let mut kubelet =
        KubeletSim::start(&registry, DRIVER, &KubeletSimOptions { node_name: "node-a".into(), ..Default::default() })?;
    kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER && e.get("error").is_none())?;
    // Settled: the start-up requests (slices, the Node) are behind us.
    std::thread::sleep(Duration::from_secs(2));

    let window = AuditWindow::start(&audit);
    let events_b = counter(port_b, "vgpu_dra_pod_events_total")?;
    kubectl.apply(&claim_and_pod_on("share", "node-a", "4Gi", "50"))?;
    let result = plane.wait_allocated("default", "share", Duration::from_secs(30))?;
    anyhow::ensure!(result["pool"] == "node-a", "allocated elsewhere: {result}");
    let uid = kubectl.run(&["get", "resourceclaim", "share", "-o", "jsonpath={.metadata.uid}"])?;
    // Once the pod is bound, node-a's driver reads its claim ahead; a prepare asked for while that
    // read is under way waits for it, so the prepare below makes no API call either way.
    eventually("node-a's driver reads the claim of the pod bound there", Duration::from_secs(30), || {
        a.process.check_running()?;
        let reads = window.requests_of(&user)?;
        Ok(reads.iter().any(|r| r.pod.as_deref() == Some(pod_a) && r.resource == "resourceclaims").then_some(()))
    })?;
    let before_prepare = window.requests_of(&user)?.len();
    let reply = kubelet.prepare(&[("default", "share", &uid)])?;
    let answer = claim_response(&reply, &uid);
    anyhow::ensure!(answer.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    anyhow::ensure!(answer["devices"].as_array().is_some_and(|d| !d.is_empty()), "no device: {reply}");
    let reply = kubelet.unprepare(&[("default", "share", &uid)])?;
    anyhow::ensure!(claim_response(&reply, &uid).get("error").is_none_or(|e| e.as_str() == Some("")), "{reply}");
    // Past a request the audit log may still be writing.
    std::thread::sleep(Duration::from_secs(1));
    a.process.check_running()?;
    b.process.check_running()?;

    let during = window.requests_of(&user)?;
    anyhow::ensure!(during.iter().all(|r| r.pod.is_some()), "a driver request without a pod-bound token: {during:?}");
    let of = |pod: &str| during.iter().filter(|r| r.pod.as_deref() == Some(pod)).cloned().collect::<Vec<_>>();
    let (by_a, by_b) = (of(pod_a), of(pod_b));
    anyhow::ensure!(by_b.is_empty(), "node-b's driver made requests for node-a's claim: {by_b:?}");
    let events_b_after = counter(port_b, "vgpu_dra_pod_events_total")?;
    anyhow::ensure!(events_b_after == events_b, "node-b's pod watch got {} events for node-a's pod", events_b_after - events_b);
    anyhow::ensure!(counter(port_a, "vgpu_dra_pod_events_total")? > 0.0, "node-a's pod watch saw nothing");
    // The claim only (one read, or two when the API server's watch cache lagged), its status
    // written, or a restart of its own node's pod watch.
    let is_share = |r: &Request| r.namespace == "default" && r.name == "share" && r.resource == "resourceclaims";
    let status_write = |r: &Request| is_share(r) && r.verb == "patch" && r.subresource == "status";
    let expected = |r: &Request| {
        (r.verb == "get" && is_share(r) && r.subresource.is_empty()) || status_write(r) || own_pod_stream(r, "node-a")
    };
    anyhow::ensure!(by_a.iter().all(expected), "node-a's driver made other requests: {by_a:?}");
    let claim_reads = by_a.iter().filter(|r| r.resource == "resourceclaims" && r.verb == "get").count();
    anyhow::ensure!((1..=2).contains(&claim_reads), "node-a read the claim {claim_reads} times: {by_a:?}");
    // The prepare and unprepare themselves read nothing: the claim and pod were here. What
    // follows them is the claim's status, set then cleared (two writes, or one when the clear
    // came before the set went out).
    let after_prepare: Vec<Request> =
        during[before_prepare..].iter().filter(|r| !own_pod_stream(r, "node-a") && !status_write(r)).cloned().collect();
    anyhow::ensure!(after_prepare.is_empty(), "the prepare read the API: {after_prepare:?}");
    let writes = during[before_prepare..].iter().filter(|r| status_write(r)).count();
    anyhow::ensure!((1..=2).contains(&writes), "{writes} writes of the claim's status: {by_a:?}");
    let used = counter(port_a, "vgpu_dra_claim_prefetch_total{result=\"used\"}")?;
    anyhow::ensure!(used == 1.0, "the prepare did not take the claim read ahead (used {used})");

    // Over the whole run, neither driver lists or watches claims.
    let claim_streams: Vec<Request> = AuditWindow::all(&audit)
        .requests_of(&user)?
        .into_iter()
        .filter(|r| r.resource == "resourceclaims" && matches!(r.verb.as_str(), "list" | "watch"))
        .collect();
    anyhow::ensure!(claim_streams.is_empty(), "a driver lists or watches claims: {claim_streams:?}");
    // And each lists and watches only its own node's pods.
    let everything = AuditWindow::all(&audit).requests_of(&user)?;
    let pod_streams: Vec<&Request> =
        everything.iter().filter(|r| r.resource == "pods" && matches!(r.verb.as_str(), "list" | "watch")).collect();
    anyhow::ensure!(!pod_streams.is_empty(), "no driver watched its pods");
    for r in pod_streams {
        let node = r.pod.as_deref().and_then(|p| p.strip_prefix("vgpu-dra-")).unwrap_or_default();
        anyhow::ensure!(own_pod_stream(r, node), "a pod list or watch beyond the driver's node: {r:?}");
    }
    Ok(())
}

/// A list or watch of the pods of `node` only, in all namespaces.
fn own_pod_stream(r: &Request, node: &str) -> bool {
    r.resource == "pods"
        && matches!(r.verb.as_str(), "list" | "watch")
        && r.namespace.is_empty()
        && r.uri.contains(&format!("fieldSelector=spec.nodeName%3D{node}"))
        && !r.uri.contains("labelSelector")
}

/// A counter or gauge of the driver's `/metrics` on `port` (`name` with its labels as printed);
/// 0 when it has no sample yet.
fn counter(port: u16, name: &str) -> anyhow::Result<f64> {
    let text = http_get(port, "/metrics")?;
    let prefix = format!("{name} ");
    Ok(text.lines().find_map(|l| l.strip_prefix(&prefix)).map(str::trim).map(str::parse).transpose()?.unwrap_or(0.0))
}
