//! From an allocated ResourceClaim to what this node must do for it: checks that the claim is
//! ours to prepare, and the shares it takes of which devices. Pure: no I/O.

use k8s_openapi::api::resource::v1::ResourceClaim;
use vgpu_scheduling::{Consumption, DeviceName, DriverName, PublishedDevice, Quantity, ShareKey, Uid};

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: Uid,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One allocated device of a claim, in the claim's order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClaimDevice {
    /// The claim's request that got this device.
    pub request: String,
    /// The device.
    pub device: DeviceName,
    /// The scheduler's share ID.
    pub share_id: Option<Uid>,
    /// What the share consumes.
    pub consumption: Consumption,
}

impl ClaimDevice {
    /// The ledger key of this share.
    pub fn key(&self, claim: &Uid) -> ShareKey {
        ShareKey { claim: claim.clone(), device: self.device.clone(), share: self.share_id.clone() }
    }
}

/// Why a claim cannot be prepared here; the message names the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The claim in the API has another UID (it was deleted and recreated).
    #[error("claim {namespace}/{name} has UID {actual}, the kubelet asked for {expected}")]
    UidMismatch {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// UID the kubelet sent.
        expected: String,
        /// UID in the API.
        actual: String,
    },
    /// No allocation yet.
    #[error("claim {0} is not allocated")]
    NotAllocated(String),
    /// Allocated for another node.
    #[error("claim {claim} is allocated to {other}, not to this node {node}")]
    OtherNode {
        /// The claim.
        claim: String,
        /// Where it was allocated.
        other: String,
        /// This node.
        node: String,
    },
    /// No result for this driver and pool.
    #[error("claim {0} has no devices of this driver on this node")]
    NoDevices(String),
    /// A device this node does not publish.
    #[error("claim {claim}: device {device} does not exist on this node")]
    UnknownDevice {
        /// The claim.
        claim: String,
        /// The device name.
        device: String,
    },
    /// A consumed amount that does not parse.
    #[error("claim {claim}: consumedCapacity {capacity} = {value:?} is invalid")]
    BadConsumption {
        /// The claim.
        claim: String,
        /// The capacity.
        capacity: String,
        /// The value.
        value: String,
    },
    /// HAMi-core counts one share per claim per process set: a claim used by several pods would
    /// share one limit between them, so it is refused, as HAMi does.
    #[error("claim {claim} is reserved for {count} consumers; a vGPU claim can serve one pod only")]
    SharedAcrossPods {
        /// The claim.
        claim: String,
        /// How many consumers.
        count: usize,
    },
    /// A result names an invalid share ID.
    #[error("claim {claim}: shareID {value:?} is invalid")]
    BadShareId {
        /// The claim.
        claim: String,
        /// The value.
        value: String,
    },
}

/// Checks `claim` and lists its shares on this node's devices.
///
/// # Errors
/// [`ClaimError`] naming the cause.
pub fn devices_of(
    claim: &ResourceClaim,
    want: &ClaimRef,
    driver: &DriverName,
    node: &str,
    published: &[PublishedDevice],
) -> Result<Vec<ClaimDevice>, ClaimError> {
    let label = format!("{}/{}", want.namespace, want.name);
    let actual = claim.metadata.uid.clone().unwrap_or_default();
    if actual != want.uid.as_str() {
        return Err(ClaimError::UidMismatch {
            namespace: want.namespace.clone(),
            name: want.name.clone(),
            expected: want.uid.to_string(),
            actual,
        });
    }
    let status = claim.status.as_ref();
    let allocation = status.and_then(|s| s.allocation.as_ref()).ok_or_else(|| ClaimError::NotAllocated(label.clone()))?;
    let consumers = status.and_then(|s| s.reserved_for.as_ref()).map_or(0, Vec::len);
    if consumers > 1 {
        return Err(ClaimError::SharedAcrossPods { claim: label, count: consumers });
    }
    if let Some(selector) = &allocation.node_selector {
        let names: Vec<&str> = selector
            .node_selector_terms
            .iter()
            .flat_map(|t| t.match_fields.iter().flatten().chain(t.match_expressions.iter().flatten()))
            .filter(|r| r.key == "metadata.name" || r.key == "kubernetes.io/hostname")
            .flat_map(|r| r.values.iter().flatten().map(String::as_str))
            .collect();
        if !names.is_empty() && !names.contains(&node) {
            return Err(ClaimError::OtherNode { claim: label, other: names.join(","), node: node.to_owned() });
        }
    }
    let results = allocation.devices.as_ref().and_then(|d| d.results.as_deref()).unwrap_or_default();
    let ours: Vec<_> = results.iter().filter(|r| r.driver == driver.as_str()).collect();
    if let Some(other) = ours.iter().find(|r| r.pool != node) {
        return Err(ClaimError::OtherNode { claim: label, other: other.pool.clone(), node: node.to_owned() });
    }
    if ours.is_empty() {
        return Err(ClaimError::NoDevices(label));
    }
    let mut out = Vec::new();
    for r in ours {
        let dev = published
            .iter()
            .find(|d| d.name.as_str() == r.device)
            .ok_or_else(|| ClaimError::UnknownDevice { claim: label.clone(), device: r.device.clone() })?;
        // Without consumedCapacity (no consumable capacity on the scheduler side) the share is
        // what an empty request consumes under the device's policies: the scheduler's default.
        let mut consumption = Consumption::new();
        for (name, capacity) in &dev.capacity {
            let amount = match r.consumed_capacity.as_ref().and_then(|c| c.get(name)) {
                Some(q) => Quantity::parse(&q.0).map_err(|_| ClaimError::BadConsumption {
                    claim: label.clone(),
                    capacity: name.clone(),
                    value: q.0.clone(),
                })?,
                None => capacity.consumed_by(None).unwrap_or(capacity.value),
            };
            consumption.insert(name.clone(), amount);
        }
        if let Some(extra) = r.consumed_capacity.as_ref().and_then(|c| c.keys().find(|k| !dev.capacity.contains_key(*k))) {
            return Err(ClaimError::BadConsumption {
                claim: label.clone(),
                capacity: extra.clone(),
                value: "unknown capacity".into(),
            });
        }
        let share_id = r
            .share_id
            .as_ref()
            .map(|s| Uid::new(s.clone()).map_err(|_| ClaimError::BadShareId { claim: label.clone(), value: s.clone() }))
            .transpose()?;
        out.push(ClaimDevice { request: r.request.clone(), device: dev.name.clone(), share_id, consumption });
    }
    Ok(out)
}
