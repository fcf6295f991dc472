//! From an allocated ResourceClaim to what this node must do for it: checks that the claim is
//! ours to prepare, and the shares it takes of which devices. Pure: no I/O.

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use vgpu_scheduling::device::CAPACITY_CORES;
use vgpu_scheduling::{
    Amounts, Consumption, DeviceName, DriverName, NameError, Namespace, ObjectName, PublishedDevice, Quantity, ShareKey, Uid,
};

/// A claim as the kubelet names it; every part validated, so none can reach an API path or a
/// file name unchecked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: Namespace,
    /// Name.
    pub name: ObjectName,
    /// UID.
    pub uid: Uid,
}

impl ClaimRef {
    /// Checks the three parts the kubelet (or a file) gave.
    ///
    /// # Errors
    /// [`NameError`] naming the part and the rule it breaks.
    pub fn new(namespace: &str, name: &str, uid: &str) -> Result<Self, NameError> {
        Ok(Self { namespace: Namespace::new(namespace)?, name: ObjectName::new(name)?, uid: Uid::new(uid)? })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
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
    pub consumption: Amounts,
    /// Allocated with admin access (a monitoring claim): it gets no HAMi-core limits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

impl ClaimDevice {
    /// The ledger key of this share.
    pub fn key(&self, claim: &Uid) -> ShareKey {
        ShareKey {
            claim: claim.clone(),
            request: self.request.clone(),
            device: self.device.clone(),
            share: self.share_id.clone(),
        }
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
    /// Reserved for no pod: the pod it was prepared for is gone, and its allocation may be
    /// another pod's next.
    #[error("claim {0} is reserved for no pod (its pod is gone); not prepared")]
    NotReserved(String),
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
    /// A share below what the device's request policy lets anyone consume: the scheduler never
    /// writes that, and a zero memory share would mean "no limit" to HAMi-core.
    #[error("claim {claim}: consumedCapacity {capacity} = {value} on {device} is below the minimum {minimum}")]
    BelowMinimum {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// The capacity.
        capacity: String,
        /// What the result says it consumes.
        value: String,
        /// The policy's minimum.
        minimum: String,
    },
    /// Two results of one claim with the same request, device and share ID: one share counted
    /// twice or once, either way wrong.
    #[error("claim {claim}: request {request} has two results on {device} with the same share ID")]
    DuplicateResult {
        /// The claim.
        claim: String,
        /// The request.
        request: String,
        /// The device.
        device: String,
    },
    /// A container of the pod uses this claim and another claim of this driver: both specs
    /// would number their cards from 0 and the runtime keeps one, so one card would get the
    /// other's limit.
    #[error(
        "claim {claim}: container {container} of pod {pod} also uses claim {other} of this driver; HAMi-core's limits are per container, so a container may use one vGPU claim (put all its GPUs in one claim)"
    )]
    SharedContainer {
        /// The claim.
        claim: String,
        /// The other claim.
        other: String,
        /// The pod.
        pod: String,
        /// The container.
        container: String,
    },
    /// A container uses only some requests of a claim with several: the claim's limits cover
    /// all of them, so the container would get more than it asked.
    #[error(
        "claim {claim}: container {container} of pod {pod} uses only request(s) {requests:?} of a claim with several; its limits are per claim, so use the whole claim or one claim per container"
    )]
    PartialClaim {
        /// The claim.
        claim: String,
        /// The pod.
        pod: String,
        /// The container.
        container: String,
        /// The requests it names.
        requests: Vec<String>,
    },
    /// The driver's opaque configuration is not one this version understands.
    #[error("claim {claim}: opaque configuration for this driver: {reason}")]
    BadConfig {
        /// The claim.
        claim: String,
        /// Why.
        reason: String,
    },
    /// Some results with admin access and some without: one spec cannot be both a monitoring
    /// view without limits and a share with them.
    #[error("claim {0} mixes requests with and without adminAccess; put the monitoring request in a claim of its own")]
    MixedAdminAccess(String),
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
    let label = want.key();
    let actual = claim.metadata.uid.clone().unwrap_or_default();
    if actual != want.uid.as_str() {
        return Err(ClaimError::UidMismatch {
            namespace: want.namespace.to_string(),
            name: want.name.to_string(),
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
    check_node_selector(allocation.node_selector.as_ref(), &label, node)?;
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
        // Admin access (KEP-5018): a monitoring view of the card. On devices with consumable
        // capacity the allocator still charges its request like any other (dynamic-resource-
        // allocation v0.36.3 and v0.37.2, allocateDevice), so the ledger charges the same.
        let admin = r.admin_access == Some(true);
        let consumption = consumption_of(r, dev, &label)?;
        let share_id = r
            .share_id
            .as_ref()
            .map(|s| Uid::new(s.clone()).map_err(|_| ClaimError::BadShareId { claim: label.clone(), value: s.clone() }))
            .transpose()?;
        if out.iter().any(|d: &ClaimDevice| d.request == r.request && d.device == dev.name && d.share_id == share_id) {
            return Err(ClaimError::DuplicateResult { claim: label, request: r.request.clone(), device: r.device.clone() });
        }
        out.push(ClaimDevice { request: r.request.clone(), device: dev.name.clone(), share_id, consumption, admin });
    }
    if out.iter().any(|d| d.admin) && !out.iter().all(|d| d.admin) {
        return Err(ClaimError::MixedAdminAccess(label));
    }
    Ok(out)
}

/// Refuses an allocation whose node selector names nodes, none of them this one.
fn check_node_selector(selector: Option<&NodeSelector>, claim: &str, node: &str) -> Result<(), ClaimError> {
    let Some(selector) = selector else { return Ok(()) };
    let names: Vec<&str> = selector
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten().chain(t.match_expressions.iter().flatten()))
        .filter(|r| r.key == "metadata.name" || r.key == "kubernetes.io/hostname")
        .flat_map(|r| r.values.iter().flatten().map(String::as_str))
        .collect();
    if !names.is_empty() && !names.contains(&node) {
        return Err(ClaimError::OtherNode { claim: claim.to_owned(), other: names.join(","), node: node.to_owned() });
    }
    Ok(())
}

/// What one allocation result takes of `dev`, each capacity at least its policy minimum.
/// Without consumedCapacity (no consumable capacity on the scheduler side) the share is what an
/// empty request consumes under the device's policies: the scheduler's default.
fn consumption_of(r: &DeviceRequestAllocationResult, dev: &PublishedDevice, label: &str) -> Result<Amounts, ClaimError> {
    let mut consumption = Consumption::new();
    for (name, capacity) in &dev.capacity {
        let amount = match r.consumed_capacity.as_ref().and_then(|c| c.get(name)) {
            Some(q) => Quantity::parse(&q.0).map_err(|_| ClaimError::BadConsumption {
                claim: label.to_owned(),
                capacity: name.clone(),
                value: q.0.clone(),
            })?,
            None => capacity.consumed_by(None).unwrap_or(capacity.value),
        };
        // Every share takes at least the policy minimum of every capacity (1Mi of memory,
        // one of the split count), whatever the claim's status says. Cores are the exception:
        // releases before the cores minimum allocated 0, which means what the minimum means
        // (no SM limit), so a claim allocated before an upgrade still prepares.
        let minimum = match capacity.policy.as_ref().and_then(vgpu_scheduling::RequestPolicy::minimum) {
            Some(_) if name == CAPACITY_CORES => Quantity::ZERO,
            Some(minimum) => minimum,
            None => Quantity::ZERO,
        };
        if amount < minimum || amount.is_negative() {
            return Err(ClaimError::BelowMinimum {
                claim: label.to_owned(),
                device: dev.name.to_string(),
                capacity: name.clone(),
                value: amount.to_string(),
                minimum: minimum.to_string(),
            });
        }
        consumption.insert(name.clone(), amount);
    }
    if let Some(extra) = r.consumed_capacity.as_ref().and_then(|c| c.keys().find(|k| !dev.capacity.contains_key(*k))) {
        return Err(ClaimError::BadConsumption {
            claim: label.to_owned(),
            capacity: extra.clone(),
            value: "unknown capacity".into(),
        });
    }
    Ok(consumption.into())
}

/// The HAMi-core settings of a claim's allocation that are not capacities (HAMi's task priority
/// and core utilization policy, written by the compatibility webhook as opaque configuration of
/// this driver), as environment for the claim's spec. Class entries come first and claim
/// entries after them, so a claim's own setting wins, as DRA orders configuration.
///
/// # Errors
/// [`ClaimError::BadConfig`] when an entry for this driver is not a configuration this version
/// understands: preparing without it would drop a setting the user asked for.
pub fn claim_env(claim: &ResourceClaim, driver: &DriverName, label: &str) -> Result<Vec<(String, String)>, ClaimError> {
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let ordered = configs.iter().filter(|c| c.source == "FromClass").chain(configs.iter().filter(|c| c.source != "FromClass"));
    let mut env: Vec<(String, String)> = Vec::new();
    for c in ordered {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == driver.as_str()) else { continue };
        let parsed = vgpu_scheduling::compat::HamiCoreConfig::from_parameters(&opaque.parameters.0)
            .map_err(|e| ClaimError::BadConfig { claim: label.to_owned(), reason: e.to_string() })?;
        for (key, value) in parsed.env() {
            env.retain(|(k, _)| k != key);
            env.push((key.to_owned(), value));
        }
    }
    Ok(env)
}

/// The pod a claim is reserved for (`reservedFor` of core `pods`), by name and UID.
pub fn consumer(claim: &ResourceClaim) -> Option<(String, String)> {
    let reserved = claim.status.as_ref()?.reserved_for.as_ref()?;
    reserved
        .iter()
        .find(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| (r.name.clone(), r.uid.clone()))
}

/// Whether `claim` is allocated, at least in part, to `driver`'s devices in `node`'s pool (this
/// driver publishes each node's devices in a pool named after the node).
pub fn allocated_here(claim: &ResourceClaim, driver: &str, node: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .is_some_and(|d| d.results.iter().flatten().any(|r| r.driver == driver && r.pool == node))
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod tests;
