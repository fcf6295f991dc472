//! A node's driver reads only its own claims (issue 17): two drivers, on node-a and node-b, run as
//! pods of the chart's DaemonSet (its RBAC: `get` on claims, no list or watch; each with its own
//! pod-bound token, which the API server's audit log tells apart). A claim allocated to node-a and
//! prepared there through the kubelet's own plugin code costs node-b's driver no request at all,
//! node-a's driver only requests naming that claim (and the pod it is reserved for), and neither
//! ever lists or watches claims. Counted from the audit log, never timed.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use common::chart::{chart_dir, helm, run_as_daemonset_pod};
use common::{DRIVER, claim_and_pod_on, claim_response};
use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, KubeletSim, KubeletSimOptions, PlaneOptions, eventually, node_host_dir};

const NS: &str = "vgpu-dra";
const IMAGE: &str = "image.repository=registry.example.com/vgpu-dra";

/// One request of the audit log: who made it, and what it named.
#[derive(Debug, Clone)]
struct Request {
    /// The pod a bound service-account token names (each driver pod has its own).
    pod: Option<String>,
    verb: String,
    resource: String,
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
                resource: text_of(&e["objectRef"]["resource"]),
                namespace: text_of(&e["objectRef"]["namespace"]),
                name: text_of(&e["objectRef"]["name"]),
            })
            .collect())
    }
}

#[test]
fn a_claim_on_node_a_costs_node_b_nothing() {
    let mut plane = ControlPlane::start_with(&PlaneOptions { audit: true }).expect("control plane");
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
    let rendered = helm(plane, &["template", "vgpu-dra", chart.to_str().context("chart path")?, "-n", NS, "--set", IMAGE])?;
    kubectl.apply(&rendered)?;
    let user = format!("system:serviceaccount:{NS}:vgpu-dra");

    // Both drivers with the chart's RBAC only, each under its own pod's token.
    let mut a = run_as_daemonset_pod(plane, NS, "vgpu-dra", "node-a", &["--mock-gpus=1xTesla T4:15Gi"])?;
    let mut b = run_as_daemonset_pod(plane, NS, "vgpu-dra", "node-b", &["--mock-gpus=1xTesla T4:15Gi"])?;
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
    kubectl.apply(&claim_and_pod_on("share", "node-a", "4Gi", "50"))?;
    let result = plane.wait_allocated("default", "share", Duration::from_secs(30))?;
    anyhow::ensure!(result["pool"] == "node-a", "allocated elsewhere: {result}");
    let uid = kubectl.run(&["get", "resourceclaim", "share", "-o", "jsonpath={.metadata.uid}"])?;
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
    anyhow::ensure!(by_a.iter().any(|r| r.resource == "resourceclaims"), "node-a's driver never read the claim: {by_a:?}");
    // The claim, and the pod it is reserved for (the pod's containers decide which limits apply).
    let names_the_claim = |r: &Request| {
        r.verb == "get"
            && r.namespace == "default"
            && r.name == "share"
            && matches!(r.resource.as_str(), "resourceclaims" | "pods")
    };
    anyhow::ensure!(by_a.iter().all(names_the_claim), "node-a's driver made other requests: {by_a:?}");

    // Over the whole run, neither driver lists or watches claims.
    let claim_streams: Vec<Request> = AuditWindow::all(&audit)
        .requests_of(&user)?
        .into_iter()
        .filter(|r| r.resource == "resourceclaims" && matches!(r.verb.as_str(), "list" | "watch"))
        .collect();
    anyhow::ensure!(claim_streams.is_empty(), "a driver lists or watches claims: {claim_streams:?}");
    Ok(())
}
