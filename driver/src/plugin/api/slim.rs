//! What is kept of the objects read: only the fields a prepare, a check or the metrics read. A
//! parsed object takes kilobytes even when nearly empty, and a node keeps one per claim and per
//! pod read ahead; environment values and images are never kept.

use k8s_openapi::api::core::v1::{
    Container, Pod, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

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
    list.iter().map(|c| claim_user(c.name.clone(), c.resources.as_ref().and_then(|r| r.claims.clone()))).collect()
}

/// A container as kept: its name and the claims it uses, nothing else.
fn claim_user(name: String, claims: Option<Vec<k8s_openapi::api::core::v1::ResourceClaim>>) -> Container {
    Container {
        name,
        resources: claims.map(|claims| ResourceRequirements { claims: Some(claims), ..Default::default() }),
        ..Default::default()
    }
}

/// A pod read from the API as [`pod`] keeps it, parsed without the rest: the whole `Pod`'s
/// parser takes about 130 KiB of stack (its spec's and volumes' visitors) on whichever thread
/// reads it, and that stack stays with the thread; it also allocates all that [`pod`] then
/// drops.
#[derive(Clone, Debug, Deserialize)]
pub struct PodRead {
    #[serde(deserialize_with = "identity_only", default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<SpecRead>,
    #[serde(default)]
    status: Option<StatusRead>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecRead {
    #[serde(deserialize_with = "null_as_default", default)]
    containers: Vec<ContainerRead>,
    #[serde(default)]
    init_containers: Option<Vec<ContainerRead>>,
    #[serde(default)]
    resource_claims: Option<Vec<PodResourceClaim>>,
}

#[derive(Clone, Debug, Deserialize)]
struct ContainerRead {
    #[serde(deserialize_with = "null_as_default", default)]
    name: String,
    #[serde(default)]
    resources: Option<ResourcesRead>,
}

#[derive(Clone, Debug, Deserialize)]
struct ResourcesRead {
    #[serde(default)]
    claims: Option<Vec<k8s_openapi::api::core::v1::ResourceClaim>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusRead {
    #[serde(default)]
    resource_claim_statuses: Option<Vec<PodResourceClaimStatus>>,
}

/// A required field left out or null is taken as empty, as the whole parser (k8s-openapi)
/// takes it: the two parsers must agree on every pod.
fn null_as_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The three fields of `metadata` kept; labels, annotations and managed fields are skipped
/// unparsed.
fn identity_only<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    struct Identity {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
    }
    let Some(Identity { name, namespace, uid }) = Option::<Identity>::deserialize(d)? else { return Ok(ObjectMeta::default()) };
    Ok(ObjectMeta { name, namespace, uid, ..Default::default() })
}

impl From<PodRead> for Pod {
    fn from(read: PodRead) -> Self {
        let users = |list: Vec<ContainerRead>| -> Vec<Container> {
            list.into_iter().map(|c| claim_user(c.name, c.resources.and_then(|r| r.claims))).collect()
        };
        Pod {
            metadata: read.metadata,
            spec: read.spec.map(|s| PodSpec {
                containers: users(s.containers),
                init_containers: s.init_containers.map(users),
                resource_claims: s.resource_claims,
                ..Default::default()
            }),
            status: read.status.map(|s| PodStatus { resource_claim_statuses: s.resource_claim_statuses, ..Default::default() }),
        }
    }
}

/// Read at a pod's URL: the same resource as `Pod`, so kube's `Api` can fetch it.
impl k8s_openapi::Resource for PodRead {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for PodRead {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
#[path = "slim_tests.rs"]
mod tests;
