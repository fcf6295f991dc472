//! Which containers of a pod use a claim, and how: HAMi-core's limits are per container and
//! indexed by the CUDA devices the container sees, while a CDI spec is per claim. A claim's spec
//! is only right for a container that uses the whole claim and no other claim of this driver;
//! anything else gets a refusal naming the pod and the container. Pure: no I/O.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

/// The pod a claim was prepared for and the names of its containers that use it: what the
/// metrics and the node monitor say of a prepared claim, kept so that neither reads the pod again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// The pod's name.
    pub pod: String,
    /// Its containers (init containers included) that use the claim.
    pub containers: Vec<String>,
}

impl Consumer {
    /// The pod `pod` whose containers use the claim as `uses` (what [`uses_of`] found).
    pub fn new(pod: impl Into<String>, uses: &[ContainerUse]) -> Self {
        Self { pod: pod.into(), containers: uses.iter().map(|u| u.container.clone()).collect() }
    }
}

/// How one container uses the claim being prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerUse {
    /// The container (init containers included).
    pub container: String,
    /// The claim's requests it names; `None` when it uses the whole claim.
    pub requests: Option<BTreeSet<String>>,
    /// The names of the other claims the same container uses.
    pub other_claims: Vec<String>,
}

/// The containers of `pod` that use the claim named `claim`, each with what else it uses.
/// Template-generated claims are matched through the pod's `resourceClaimStatuses`.
pub fn uses_of(pod: &Pod, claim: &str) -> Vec<ContainerUse> {
    let Some(spec) = &pod.spec else { return Vec::new() };
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    // Pod-level entry name -> the claim it resolves to.
    let resolve = |entry: &str| -> Option<String> {
        let e = spec.resource_claims.iter().flatten().find(|e| e.name == entry)?;
        if let Some(name) = &e.resource_claim_name {
            return Some(name.clone());
        }
        statuses?.iter().find(|s| s.name == entry).and_then(|s| s.resource_claim_name.clone())
    };
    let containers = spec.init_containers.iter().flatten().chain(spec.containers.iter());
    let mut out = Vec::new();
    for c in containers {
        let refs = c.resources.as_ref().and_then(|r| r.claims.as_ref());
        let Some(refs) = refs else { continue };
        let mine: Vec<_> = refs.iter().filter(|r| resolve(&r.name).as_deref() == Some(claim)).collect();
        if mine.is_empty() {
            continue;
        }
        let requests = if mine.iter().any(|r| r.request.as_deref().is_none_or(str::is_empty)) {
            None
        } else {
            Some(mine.iter().filter_map(|r| r.request.clone()).collect())
        };
        let mut other_claims: Vec<String> = refs.iter().filter_map(|r| resolve(&r.name)).filter(|name| name != claim).collect();
        other_claims.sort();
        other_claims.dedup();
        out.push(ContainerUse { container: c.name.clone(), requests, other_claims });
    }
    out
}

/// The requests (top level, without a subrequest) of a claim's results on this node.
pub fn top_level_requests<'a>(requests: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    requests.into_iter().map(|r| r.split('/').next().unwrap_or(r).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const POD: &str = r#"
metadata: {name: p, namespace: ns}
spec:
  resourceClaims:
  - {name: a, resourceClaimName: claim-a}
  - {name: b, resourceClaimTemplateName: tmpl}
  - {name: c, resourceClaimName: claim-c}
  initContainers:
  - name: init
    image: x
    resources: {claims: [{name: a, request: r1}]}
  containers:
  - name: main
    image: x
    resources: {claims: [{name: a}, {name: b}]}
  - name: side
    image: x
    resources: {claims: [{name: a, request: r1}, {name: a, request: r2}]}
  - name: plain
    image: x
status:
  resourceClaimStatuses:
  - {name: b, resourceClaimName: p-b-x7k2}
"#;

    #[test]
    fn finds_every_container_with_its_requests_and_other_claims() {
        let uses = uses_of(&pod(POD), "claim-a");
        let names: Vec<&str> = uses.iter().map(|u| u.container.as_str()).collect();
        assert_eq!(names, ["init", "main", "side"]);
        assert_eq!(uses[0].requests, Some(BTreeSet::from(["r1".to_owned()])));
        assert_eq!(uses[1].requests, None, "no request named: the whole claim");
        assert_eq!(uses[1].other_claims, ["p-b-x7k2"], "template claims resolve through the pod status");
        assert_eq!(uses[2].requests, Some(BTreeSet::from(["r1".to_owned(), "r2".to_owned()])));
        let generated = uses_of(&pod(POD), "p-b-x7k2");
        assert_eq!(generated.len(), 1);
        assert_eq!(generated[0].other_claims, ["claim-a"]);
        assert!(uses_of(&pod(POD), "claim-c").is_empty(), "declared but used by no container");
        assert!(uses_of(&pod(POD), "other").is_empty());
    }

    #[test]
    fn subrequests_count_as_their_request() {
        assert_eq!(top_level_requests(["gpu/t4", "gpu/a10", "x"]), BTreeSet::from(["gpu".to_owned(), "x".to_owned()]));
    }
}
