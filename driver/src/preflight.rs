//! What the driver needs of the API server, checked once at start: a cluster without it gets one
//! error that names the missing piece, instead of slices that quietly lose their sharing.
//!
//! - `resource.k8s.io/v1` with ResourceSlices and ResourceClaims (DRA GA, Kubernetes 1.34+).
//! - Consumable capacity (`DRAConsumableCapacity`: alpha and off in 1.34 and 1.35, beta and on
//!   from 1.36): an API server without it drops `allowMultipleAllocations` and the capacities'
//!   request policies from a slice without an error, and every card would then be handed out
//!   whole. It is seen by a server-side dry run of the first slice the node will publish, which
//!   stores nothing.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PostParams};

/// How long each check may take. An API server that does not answer is no reason to stay down:
/// the driver serves its prepared claims without it, and the publisher retries.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The API group and version the driver speaks.
const GROUP_VERSION: &str = "resource.k8s.io/v1";

/// Why the API server cannot serve this driver.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// No `resource.k8s.io/v1` with the resources the driver uses.
    #[error(
        "the API server serves no resource.k8s.io/v1 ResourceSlices and ResourceClaims ({found}): vgpu-dra needs Kubernetes 1.34 or newer (1.36 or newer without feature gates), see docs/quickstart.md#supported-kubernetes-versions"
    )]
    NoDra {
        /// What it serves of the group.
        found: String,
    },
    /// Consumable capacity is off.
    #[error(
        "the API server dropped allowMultipleAllocations and the capacities' request policies from a ResourceSlice (a dry run): consumable capacity is off. Turn on the DRAConsumableCapacity feature gate on kube-apiserver, kube-scheduler, kube-controller-manager and the kubelets (on by default from Kubernetes 1.36), see docs/quickstart.md#supported-kubernetes-versions"
    )]
    NoConsumableCapacity,
    /// The API server did not answer the check.
    #[error("checking what the API server serves: {0}")]
    Api(#[source] kube::Error),
    /// The API server did not answer in time.
    #[error("checking what the API server serves: no answer within {0:?}")]
    Timeout(Duration),
}

impl PreflightError {
    /// Whether the API server said it lacks something (stop), rather than not answering (go on
    /// and let the publisher retry).
    pub fn is_definite(&self) -> bool {
        matches!(self, Self::NoDra { .. } | Self::NoConsumableCapacity)
    }
}

async fn within<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<Result<T, kube::Error>, PreflightError> {
    tokio::time::timeout(TIMEOUT, call).await.map_err(|_| PreflightError::Timeout(TIMEOUT))
}

/// Checks the API server for what the driver needs; `sample` is the first slice this node will
/// publish (none for a node without cards: only the group is checked then).
///
/// # Errors
/// [`PreflightError`] naming what is missing, or that the server did not answer.
pub async fn check(client: &kube::Client, sample: Option<&ResourceSlice>) -> Result<(), PreflightError> {
    match within(client.list_api_group_resources(GROUP_VERSION)).await? {
        Ok(list) => {
            let served: Vec<&str> = list.resources.iter().map(|r| r.name.as_str()).collect();
            if !["resourceslices", "resourceclaims"].iter().all(|r| served.contains(r)) {
                return Err(PreflightError::NoDra { found: format!("{GROUP_VERSION} serves {}", served.join(", ")) });
            }
        }
        Err(kube::Error::Api(e)) if e.code == 404 => return Err(PreflightError::NoDra { found: served_versions(client).await }),
        Err(e) => return Err(PreflightError::Api(e)),
    }
    let Some(sample) = sample else { return Ok(()) };
    let mut probe = sample.clone();
    probe.metadata.name = None;
    probe.metadata.generate_name = Some("vgpu-dra-preflight-".into());
    probe.metadata.resource_version = None;
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = PostParams { dry_run: true, field_manager: None };
    match within(api.create(&params, &probe)).await? {
        Ok(stored) if dropped_sharing(&probe, &stored) => Err(PreflightError::NoConsumableCapacity),
        Ok(_) => Ok(()),
        // A role without `create` (publishing would fail anyway, and say why) or a policy that
        // refuses the probe: nothing is learnt about the gate, and start-up goes on.
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {
            tracing::warn!(error = %e, "could not check consumable capacity with a dry run; going on");
            Ok(())
        }
        Err(e) => Err(PreflightError::Api(e)),
    }
}

/// What the group serves, for the error: its versions, or that it is absent.
async fn served_versions(client: &kube::Client) -> String {
    match within(client.list_api_groups()).await {
        Ok(Ok(groups)) => {
            let versions: Vec<String> = groups
                .groups
                .iter()
                .filter(|g| g.name == "resource.k8s.io")
                .flat_map(|g| g.versions.iter().map(|v| v.group_version.clone()))
                .collect();
            if versions.is_empty() { "no resource.k8s.io group".to_owned() } else { format!("only {}", versions.join(", ")) }
        }
        _ => format!("no {GROUP_VERSION}"),
    }
}

/// Whether a device that asked for shared allocation, or a capacity with a request policy, came
/// back without it.
fn dropped_sharing(sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
    let sent = sent.spec.devices.iter().flatten();
    let stored: Vec<_> = stored.spec.devices.iter().flatten().collect();
    sent.into_iter().any(|d| {
        let Some(back) = stored.iter().find(|s| s.name == d.name) else { return true };
        let multiple = d.allow_multiple_allocations == Some(true) && back.allow_multiple_allocations != Some(true);
        let policies = d.capacity.iter().flatten().any(|(name, c)| {
            c.request_policy.is_some()
                && back.capacity.as_ref().and_then(|b| b.get(name)).is_none_or(|b| b.request_policy.is_none())
        });
        multiple || policies
    })
}

/// The first release whose scheduler charges the counters of a device that allows multiple
/// allocations across scheduling cycles (1.36.0 and 1.36.1 miss them, so a MIG placement and
/// the whole card's shares could both be allocated).
const COUNTERS_SAFE_FROM: (u64, u64, u64) = (1, 36, 2);

/// Whether a scheduler of `git_version` (`v1.36.3`, `v1.37.0-rc.1+abc`) keeps shared devices'
/// counters; `None` when the version does not parse.
pub fn counters_safe(git_version: &str) -> Option<bool> {
    let core = git_version.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    Some(version >= COUNTERS_SAFE_FROM)
}

/// Warns when the API server (as a stand-in for the scheduler, whose version a node cannot
/// read) is older than the first release that keeps dynamic MIG's counters; never stops.
pub async fn warn_if_counters_unsafe(client: &kube::Client) {
    let why = match tokio::time::timeout(TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(info)) => match counters_safe(&info.git_version) {
            Some(true) => return,
            Some(false) => format!("the API server is {}", info.git_version),
            None => format!("the API server's version {:?} could not be read", info.git_version),
        },
        Ok(Err(e)) => format!("the API server's version could not be read: {e}"),
        Err(_) => format!("the API server's version did not come within {TIMEOUT:?}"),
    };
    tracing::warn!(
        reason = %why,
        "dynamic MIG needs kube-scheduler 1.36.2 or later: older schedulers lose the counters of shared devices across scheduling cycles, so a card's shares and its MIG instances could both be allocated"
    );
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;
    use crate::discovery::DeviceSource;
    use crate::discovery::mock::{MockSource, parse_spec};
    use crate::slices::{PoolIdentity, build_slices};

    fn sample() -> ResourceSlice {
        let inventory = MockSource::new("n1", parse_spec("1xTesla T4:15Gi").unwrap()).inventory().unwrap();
        let config = vgpu_scheduling::SharingConfig::default();
        let pool = PoolIdentity { driver: config.driver_name.clone(), node_name: "n1".into(), node_uid: None, generation: 1 };
        build_slices(&pool, &vgpu_scheduling::publish(&inventory, &config)).remove(0)
    }

    /// An API server that serves `v1` or not, and stores slices with or without consumable
    /// capacity; it records the dry-run flag of each create.
    fn server(serves_v1: bool, consumable: bool, dry_runs: Arc<Mutex<Vec<String>>>) -> kube::Client {
        let service = tower::service_fn(move |request: Request<Body>| {
            let dry_runs = dry_runs.clone();
            async move {
                let (parts, body) = request.into_parts();
                let path = parts.uri.path().to_owned();
                let (status, value) = match (parts.method.as_str(), path.as_str()) {
                    ("GET", "/apis/resource.k8s.io/v1") if serves_v1 => (
                        StatusCode::OK,
                        json!({"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1", "resources": [
                            {"name": "resourceslices", "singularName": "", "namespaced": false, "kind": "ResourceSlice", "verbs": ["create"]},
                            {"name": "resourceclaims", "singularName": "", "namespaced": true, "kind": "ResourceClaim", "verbs": ["get"]}]}),
                    ),
                    ("GET", "/apis") => (
                        StatusCode::OK,
                        json!({"kind": "APIGroupList", "groups": [{"name": "resource.k8s.io",
                            "versions": [{"groupVersion": "resource.k8s.io/v1beta1", "version": "v1beta1"}]}]}),
                    ),
                    ("POST", "/apis/resource.k8s.io/v1/resourceslices") => {
                        dry_runs.lock().unwrap().push(parts.uri.query().unwrap_or_default().to_owned());
                        let bytes = body.collect_bytes().await.unwrap();
                        let mut slice: Value = serde_json::from_slice(&bytes).unwrap();
                        if !consumable {
                            for d in slice["spec"]["devices"].as_array_mut().unwrap() {
                                d.as_object_mut().unwrap().remove("allowMultipleAllocations");
                                for c in d["capacity"].as_object_mut().unwrap().values_mut() {
                                    c.as_object_mut().unwrap().remove("requestPolicy");
                                }
                            }
                        }
                        slice["metadata"]["name"] = json!("vgpu-dra-preflight-abcde");
                        (StatusCode::CREATED, slice)
                    }
                    _ => (
                        StatusCode::NOT_FOUND,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound", "message": "not found"}),
                    ),
                };
                let response = Response::builder().status(status).body(Body::from(serde_json::to_vec(&value).unwrap())).unwrap();
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn each_missing_piece_is_named_and_a_full_server_passes() {
        let dry_runs = Arc::default();
        check(&server(true, true, Arc::clone(&dry_runs)), Some(&sample())).await.unwrap();
        let queries = dry_runs.lock().unwrap().clone();
        assert!(
            queries.len() == 1 && queries[0].split('&').any(|q| q == "dryRun=All"),
            "the probe is a dry run, stored nowhere: {queries:?}"
        );
        let e = check(&server(true, false, Arc::default()), Some(&sample())).await.unwrap_err();
        assert!(matches!(e, PreflightError::NoConsumableCapacity) && e.to_string().contains("DRAConsumableCapacity"), "{e}");
        let e = check(&server(false, true, Arc::default()), Some(&sample())).await.unwrap_err();
        assert!(e.to_string().contains("only resource.k8s.io/v1beta1") && e.to_string().contains("1.34"), "{e}");
        // A node without cards has nothing to probe with: the group alone is checked.
        check(&server(true, false, Arc::default()), None).await.unwrap();
    }

    #[test]
    fn counters_are_safe_from_1_36_2() {
        for (version, safe) in [
            ("v1.36.2", Some(true)),
            ("v1.36.3", Some(true)),
            ("v1.37.0-rc.1+abc", Some(true)),
            ("v1.38.0-beta.0", Some(true)),
            ("v2.0.0", Some(true)),
            ("v1.36.1", Some(false)),
            ("v1.36.0", Some(false)),
            ("v1.35.9", Some(false)),
            ("1.36.1-gke.100", Some(false)),
            ("v1.36", None),
            ("", None),
            ("vX.Y.Z", None),
        ] {
            assert_eq!(counters_safe(version), safe, "{version}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_does_not_answer_is_no_reason_to_stop() {
        let silent = tower::service_fn(|_request: Request<Body>| std::future::pending::<Result<Response<Body>, Infallible>>());
        let e = check(&kube::Client::new(silent, "default"), Some(&sample())).await.unwrap_err();
        assert!(matches!(e, PreflightError::Timeout(_)) && !e.is_definite(), "{e}");
        assert!(PreflightError::NoConsumableCapacity.is_definite());
    }
}
