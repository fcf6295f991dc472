//! What is kept of the objects read: only the fields a prepare, a check or the metrics read. A
//! parsed object takes kilobytes even when nearly empty, and a node keeps one per claim and per
//! pod read ahead; environment values and images are never kept.

use k8s_openapi::api::core::v1::{
    Container, Pod, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `claim` with only what a prepare reads: identity, requests and configuration, allocation and
/// reservations; field managers, labels and the devices' status never.
pub fn claim(claim: &ResourceClaim) -> ResourceClaim {
    ResourceClaim {
        metadata: identity(&claim.metadata),
        spec: claim.spec.clone(),
        status: claim.status.as_ref().map(|s| ResourceClaimStatus {
            allocation: s.allocation.clone(),
            reserved_for: s.reserved_for.clone(),
            ..Default::default()
        }),
    }
}

/// What the container check reads of a pod: its identity, its claims and which containers use
/// them. Images, environments and the rest are not kept.
pub fn pod(pod: &Pod) -> Pod {
    let spec = pod.spec.as_ref();
    Pod {
        metadata: identity(&pod.metadata),
        spec: spec.map(|s| PodSpec {
            containers: claim_users(&s.containers),
            init_containers: s.init_containers.as_deref().map(claim_users),
            resource_claims: s.resource_claims.as_ref().map(|c| c.iter().map(PodResourceClaim::clone).collect()),
            ..Default::default()
        }),
        status: pod.status.as_ref().map(|s| PodStatus {
            resource_claim_statuses: s
                .resource_claim_statuses
                .as_ref()
                .map(|c| c.iter().map(PodResourceClaimStatus::clone).collect()),
            ..Default::default()
        }),
    }
}

/// Name, namespace and UID.
fn identity(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta { name: meta.name.clone(), namespace: meta.namespace.clone(), uid: meta.uid.clone(), ..Default::default() }
}

/// Each container's name and the claims it uses.
fn claim_users(list: &[Container]) -> Vec<Container> {
    list.iter()
        .map(|c| Container {
            name: c.name.clone(),
            resources: c
                .resources
                .as_ref()
                .and_then(|r| r.claims.clone())
                .map(|claims| ResourceRequirements { claims: Some(claims), ..Default::default() }),
            ..Default::default()
        })
        .collect()
}
