//! What a benchmark needs from the test bed: an identity for the plugin, a DeviceClass, claims
//! allocated by the real scheduler, slice counts, and request counts from the audit log.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use serde::Serialize;
use vgpu_dra_integration::{ControlPlane, write_kubeconfig};

use crate::client::ClaimId;

/// The namespace benchmark objects live in.
pub const NAMESPACE: &str = "bench";
/// The DeviceClass the benchmark's claims name.
pub const CLASS: &str = "bench-device";
/// The label naming the set a claim and its pod were made in (their names' prefix).
const SET_LABEL: &str = "bench.vgpu-dra.io/set";
const SERVICE_ACCOUNT: &str = "plugin";

/// The identity plugins run as, so the audit log can tell their requests from everyone else's.
pub struct Identity {
    /// A kubeconfig with the service account's token.
    pub kubeconfig: PathBuf,
    /// The user name the API server sees.
    pub user: String,
}

/// Creates the namespace, the plugins' service account (cluster-admin, so that any driver's
/// needs are met), and the DeviceClass selecting `driver`'s devices.
pub fn prepare(plane: &ControlPlane, driver: &str) -> anyhow::Result<Identity> {
    let kubectl = plane.kubectl();
    let objects = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "bench-plugin"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
         "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]}},
    ]});
    kubectl.apply(&objects.to_string())?;
    let token = kubectl.run(&["create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=24h"])?;
    let kubeconfig = plane.dir().join("bench-plugin.kubeconfig");
    write_kubeconfig(&kubeconfig, plane.server(), token.trim())?;
    Ok(Identity { kubeconfig, user: format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}") })
}

/// Lets `node` hold `pods` pods: every claim here has a pod, and one node holds them all.
pub fn allow_pods(plane: &ControlPlane, node: &str, pods: usize) -> anyhow::Result<()> {
    let patch =
        serde_json::json!({"status": {"capacity": {"pods": pods.to_string()}, "allocatable": {"pods": pods.to_string()}}});
    plane.kubectl().run(&["patch", "node", node, "--subresource=status", "--type=merge", "-p", &patch.to_string()])?;
    Ok(())
}

/// An admin client for the plane.
pub async fn client(plane: &ControlPlane) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(plane.kubeconfig())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Creates `count` claims named `<prefix>-<i>` asking `requests` (`memory=128Mi,cores=0`) of
/// one device, each with a pod that uses it (pinned to `node` when given), so the scheduler
/// allocates them.
pub fn create_claims(plane: &ControlPlane, prefix: &str, count: usize, requests: &str, node: Option<&str>) -> anyhow::Result<()> {
    let mut capacity = serde_json::Map::new();
    for kv in requests.split(',').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').context("--claim-requests wants NAME=QUANTITY,...")?;
        capacity.insert(k.to_owned(), v.into());
    }
    let mut exactly = serde_json::json!({"deviceClassName": CLASS});
    if !capacity.is_empty() {
        exactly["capacity"] = serde_json::json!({"requests": capacity});
    }
    let items: Vec<serde_json::Value> = (0..count)
        .flat_map(|i| {
            let name = format!("{prefix}-{i}");
            let mut pod_spec = serde_json::json!({
                "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
                "containers": [{"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "dev"}]}}],
            });
            if let Some(n) = node {
                pod_spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": n});
            }
            [
                serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": {SET_LABEL: prefix}},
                    "spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}}),
                serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": {SET_LABEL: prefix}}, "spec": pod_spec}),
            ]
        })
        .collect();
    for chunk in items.chunks(500) {
        plane.kubectl().apply(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": chunk}).to_string())?;
    }
    Ok(())
}

/// Waits until the `count` claims of `prefix` are allocated and their pods bound; returns them
/// with their nodes, in name order, and how long the scheduler took.
pub async fn wait_allocated(
    client: &Client,
    prefix: &str,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<(Vec<ClaimId>, Duration)> {
    let started = Instant::now();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let set = set_of(prefix);
    loop {
        let bound: HashMap<String, String> =
            pods.list(&set).await?.items.into_iter().filter_map(|p| Some((p.metadata.name?, p.spec?.node_name?))).collect();
        let mut ready: Vec<(usize, ClaimId)> = claims
            .list(&set)
            .await?
            .items
            .into_iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
            .filter_map(|c| {
                let name = c.metadata.name?;
                let index: usize = name.strip_prefix(prefix)?.strip_prefix('-')?.parse().ok()?;
                let node = bound.get(&name)?.clone();
                Some((index, ClaimId { namespace: NAMESPACE.into(), name, uid: c.metadata.uid?, node }))
            })
            .collect();
        if ready.len() >= count {
            ready.sort_by_key(|(i, _)| *i);
            return Ok((ready.into_iter().map(|(_, c)| c).collect(), started.elapsed()));
        }
        if started.elapsed() > timeout {
            bail!("only {} of {count} claims allocated after {timeout:?}", ready.len());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Selects the claims made with `prefix`, and their pods.
fn set_of(prefix: &str) -> ListParams {
    ListParams::default().labels(&format!("{SET_LABEL}={prefix}"))
}

/// Deletes the claims made with `prefix` and their pods. The pods go at once: no kubelet here
/// would end them gracefully.
pub async fn delete_claims(client: &Client, prefix: &str) -> anyhow::Result<()> {
    let set = set_of(prefix);
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete_collection(&now, &set)
        .await
        .with_context(|| format!("deleting the pods of set {prefix}"))?;
    Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
        .delete_collection(&DeleteParams::default(), &set)
        .await
        .with_context(|| format!("deleting the claims of set {prefix}"))?;
    Ok(())
}

/// The ResourceSlices of `driver` on `node`.
pub async fn slice_count(client: &Client, driver: &str, node: &str) -> anyhow::Result<usize> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={driver}"));
    Ok(api.list(&params).await?.items.len())
}

/// All ResourceSlices of `driver`, and the distinct nodes they are on.
pub async fn slices_of_driver(client: &Client, driver: &str) -> anyhow::Result<(usize, usize)> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let items = api.list(&ListParams::default().fields(&format!("spec.driver={driver}"))).await?.items;
    let nodes: std::collections::BTreeSet<_> = items.iter().filter_map(|s| s.spec.node_name.clone()).collect();
    Ok((items.len(), nodes.len()))
}

/// The nodes that have a ResourceSlice of `driver`.
pub async fn nodes_with_slices(client: &Client, driver: &str) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let items = api.list(&ListParams::default().fields(&format!("spec.driver={driver}"))).await?.items;
    Ok(items.into_iter().filter_map(|s| s.spec.node_name).collect())
}

/// Polls every 5 ms until `check` holds, returning how long that took.
pub async fn time_until<F, Fut>(timeout: Duration, mut check: F) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let started = Instant::now();
    loop {
        if check().await.unwrap_or(false) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!("not reached within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Deletes `driver`'s slices on `node` the way the kubelet does when a plugin goes away.
pub async fn wipe(client: &Client, driver: &str, node: &str) -> anyhow::Result<()> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={driver}"));
    api.delete_collection(&DeleteParams::default(), &params).await?;
    Ok(())
}

/// Requests one user made, from the API server's audit log.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Requests {
    /// Every request.
    pub total: u64,
    /// create, update, patch, delete and deletecollection.
    pub writes: u64,
    /// By `verb resource`.
    pub by_kind: BTreeMap<String, u64>,
}

/// Reads the audit log from a point on.
pub struct AuditWindow {
    path: PathBuf,
    offset: u64,
}

impl AuditWindow {
    /// A window starting now.
    pub fn start(path: &Path) -> anyhow::Result<Self> {
        let offset = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(Self { path: path.to_owned(), offset })
    }

    /// The requests `user` made since the window started.
    pub fn requests_of(&self, user: &str) -> anyhow::Result<Requests> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(&self.path).with_context(|| format!("{}", self.path.display()))?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let mut out = Requests::default();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            if event["user"]["username"] != user {
                continue;
            }
            let verb = event["verb"].as_str().unwrap_or("?");
            let resource = event["objectRef"]["resource"].as_str().unwrap_or("-");
            out.total += 1;
            if matches!(verb, "create" | "update" | "patch" | "delete" | "deletecollection") {
                out.writes += 1;
            }
            *out.by_kind.entry(format!("{verb} {resource}")).or_default() += 1;
        }
        Ok(out)
    }
}
