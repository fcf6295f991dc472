//! `why POD`: for each claim of the pod, where it went and its limits (once the node's driver has
//! prepared it, the ones it wrote, from the claim's `status.devices`; before, the ones it will
//! write), or, while it is pending, what stops each card from serving each of its requests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::Serialize;
use vgpu_scheduling::device::{CAPACITY_CORES, CAPACITY_MEMORY};
use vgpu_scheduling::{DeviceShare, DeviceStatusData, LimitOptions, Quantity, container_env, status_env};

use crate::allocations::{AllocationError, is_allocated, results, share, shares_by_card, used};
use crate::cards::{Card, CardError, cards, show};
use crate::fit::{Ask, CardFit, Reason, check, require_cards};
use crate::requests::{Request, requests};

/// The annotation the resource claim controller puts on claims it makes from a template.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// The node label a pod's `nodeSelector` names one node by.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Everything `why` reads, fetched once.
#[derive(Debug, Clone, Copy)]
pub struct WhyInputs<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The claims to resolve the pod's claims in and to count allocations from.
    pub claims: &'a [ResourceClaim],
    /// All ResourceSlices.
    pub slices: &'a [ResourceSlice],
    /// All DeviceClasses.
    pub classes: &'a [DeviceClass],
    /// Our driver's name.
    pub driver: &'a str,
    /// How the cluster's scheduler rounds requests (its release's).
    pub rounding: vgpu_scheduling::Rounding,
}

/// The answer for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhyReport {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// The node the pod is bound to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The scheduler's own word (`PodScheduled=False` message), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    /// One entry per `spec.resourceClaims` item.
    pub claims: Vec<ClaimWhy>,
}

/// Where a claim stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ClaimState {
    /// The scheduler allocated it.
    Allocated,
    /// It exists and waits for an allocation.
    Pending,
    /// It does not exist (yet): the claim controller has not made it from its template, or
    /// the named claim was never created.
    Missing,
}

/// Gives each claim still missing the reason of the resource claim controller's latest failure
/// to make it (its `FailedResourceClaimCreation` event on the pod: a quota refusal, a denial by
/// an admission webhook), when there is one.
pub fn explain_missing(report: &mut WhyReport, events: &[k8s_openapi::api::core::v1::Event]) {
    for claim in report.claims.iter_mut().filter(|c| c.state == ClaimState::Missing && c.error.is_none()) {
        let prefix = format!("PodResourceClaim {}: ", claim.pod_claim);
        let latest = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("FailedResourceClaimCreation"))
            .filter_map(|e| e.message.as_deref()?.strip_prefix(&prefix))
            .next_back();
        if let Some(message) = latest {
            claim.error = Some(format!("the resource claim controller cannot create it: {message}"));
        }
    }
}

/// One claim of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimWhy {
    /// The entry's name in `spec.resourceClaims`.
    pub pod_claim: String,
    /// The ResourceClaim's name, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// Allocated, pending or missing.
    pub state: ClaimState,
    /// Allocated: one entry per allocation result.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<Placement>,
    /// Allocated: the HAMi-core environment the driver writes for a container using the claim.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<(String, String)>,
    /// The node's driver has prepared the claim and said so in its `status.devices`: `limits`
    /// are what it wrote, not what it would write.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub prepared: bool,
    /// Pending: each request (or subrequest) and what each card says to it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<RequestWhy>,
    /// Something that kept the claim from being analysed (an unparsable request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One allocation result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// `request` or `request/subrequest`.
    pub request: String,
    /// The driver.
    pub driver: String,
    /// The node (the pool, for a device not in any slice).
    pub node: String,
    /// The device.
    pub device: String,
    /// The consumed capacity the scheduler wrote.
    pub consumed: BTreeMap<String, String>,
    /// The card's UUID, as the driver wrote it in the claim's status once it prepared it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// One request (or subrequest) of a pending claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestWhy {
    /// `request` or `request/subrequest`.
    pub request: String,
    /// The DeviceClass.
    pub class: String,
    /// The capacity asked, before rounding.
    pub asks: BTreeMap<String, String>,
    /// How many cards (`None`: all matching).
    pub count: Option<u64>,
    /// Every card of the driver, with what stops it.
    pub cards: Vec<CardFit>,
}

/// The inputs do not make a report.
#[derive(Debug, thiserror::Error)]
pub enum WhyError {
    /// A slice holds a value the API would not store.
    #[error(transparent)]
    Slice(#[from] CardError),
    /// A claim holds a value the API would not store.
    #[error(transparent)]
    Claim(#[from] AllocationError),
}

/// The report for `inputs.pod`.
///
/// # Errors
/// [`WhyError`] for values that do not parse.
pub fn why_report(inputs: &WhyInputs<'_>) -> Result<WhyReport, WhyError> {
    let pod = inputs.pod;
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let cards = cards(inputs.slices, inputs.driver)?;
    let shares = shares_by_card(inputs.claims, inputs.driver)?;
    let used_by_card: Vec<_> = cards
        .iter()
        .map(|c| used(c, shares.get(&(c.pool.clone(), c.device.clone())).map(Vec::as_slice).unwrap_or_default()))
        .collect();
    let spec = pod.spec.as_ref();
    let pod_node = spec
        .and_then(|s| s.node_name.clone())
        .or_else(|| spec.and_then(|s| s.node_selector.as_ref()).and_then(|n| n.get(HOSTNAME_LABEL).cloned()));
    let mut claims = Vec::new();
    for entry in spec.and_then(|s| s.resource_claims.as_ref()).into_iter().flatten() {
        let claim = resolve(pod, &entry.name, entry.resource_claim_name.as_deref(), inputs.claims);
        let mut why = ClaimWhy {
            pod_claim: entry.name.clone(),
            claim: claim.and_then(|c| c.metadata.name.clone()),
            state: ClaimState::Missing,
            placements: Vec::new(),
            limits: Vec::new(),
            prepared: false,
            requests: Vec::new(),
            error: None,
        };
        match claim {
            None => {}
            Some(claim) if is_allocated(claim) => {
                why.state = ClaimState::Allocated;
                allocated(&mut why, claim, &cards, inputs.driver)?;
            }
            Some(claim) => {
                why.state = ClaimState::Pending;
                match requests(claim) {
                    Err(e) => why.error = Some(e.to_string()),
                    Ok(list) => why.requests = pending(&list, inputs, &cards, &used_by_card, pod_node.as_deref()),
                }
            }
        }
        claims.push(why);
    }
    let scheduler = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"))
        .and_then(|c| c.message.clone());
    Ok(WhyReport {
        namespace,
        pod: pod.metadata.name.clone().unwrap_or_default(),
        node: spec.and_then(|s| s.node_name.clone()),
        scheduler,
        claims,
    })
}

/// A request with, per alternative, each card's verdict.
type RequestFits<'a> = (&'a Request, Vec<(&'a Ask, Vec<CardFit>)>);

/// What stops each card from serving each request (each subrequest on its own) of a pending
/// claim; `pod_node` is the one node the pod may run on, if it names one.
fn pending(
    list: &[Request],
    inputs: &WhyInputs<'_>,
    cards: &[Card],
    used_by_card: &[vgpu_scheduling::Consumption],
    pod_node: Option<&str>,
) -> Vec<RequestWhy> {
    let mut per_request: Vec<RequestFits<'_>> = Vec::new();
    for request in list {
        let mut alternatives = Vec::new();
        for ask in &request.alternatives {
            let class = inputs.classes.iter().find(|c| c.metadata.name.as_deref() == Some(&ask.class));
            let mut fits: Vec<CardFit> = cards
                .iter()
                .zip(used_by_card)
                .map(|(card, used)| {
                    let mut fit = check(ask, class, card, used, inputs.driver, inputs.rounding);
                    if let Some(node) = pod_node.filter(|n| *n != card.node) {
                        fit.reasons.insert(0, Reason::NodeNotSelected { pod_node: node.to_owned() });
                    }
                    fit
                })
                .collect();
            // A count of N is N different cards, each with room for one.
            if let Some(n) = ask.count.filter(|n| *n > 1) {
                require_cards(&mut fits, n);
            }
            alternatives.push((ask, fits));
        }
        per_request.push((request, alternatives));
    }
    require_distinct_across_requests(&mut per_request);
    per_request.into_iter().flat_map(|(_, alternatives)| alternatives).map(|(ask, fits)| request_why(ask, fits)).collect()
}

/// Requests under one `distinctAttribute` constraint (the webhook's one request per card) need
/// as many different cards as they ask together; when fewer cards have room for any of them,
/// every card that would otherwise fit says so.
fn require_distinct_across_requests(per_request: &mut [RequestFits<'_>]) {
    let distinct: Vec<usize> = (0..per_request.len()).filter(|&i| per_request[i].0.distinct).collect();
    if distinct.len() < 2 {
        return;
    }
    let needed: u64 =
        distinct.iter().map(|&i| per_request[i].0.alternatives.iter().filter_map(|a| a.count).min().unwrap_or(1)).sum();
    let mut with_room: Vec<(&str, &str)> = distinct
        .iter()
        .flat_map(|&i| per_request[i].1.iter().flat_map(|(_, fits)| fits.iter()))
        .filter(|f| f.fits())
        .map(|f| (f.node.as_str(), f.device.as_str()))
        .collect();
    with_room.sort_unstable();
    with_room.dedup();
    let available = u64::try_from(with_room.len()).unwrap_or(u64::MAX);
    if available >= needed {
        return;
    }
    for &i in &distinct {
        for (_, fits) in &mut per_request[i].1 {
            for f in fits.iter_mut().filter(|f| f.fits()) {
                f.reasons.push(Reason::TooFewCards { needed, available });
            }
        }
    }
}

fn request_why(ask: &Ask, cards: Vec<CardFit>) -> RequestWhy {
    RequestWhy {
        request: ask.name.clone(),
        class: ask.class.clone(),
        asks: ask.capacity.iter().map(|(n, q)| (n.clone(), show(n, *q))).collect(),
        count: ask.count,
        cards,
    }
}

/// The claim of pod entry `name`: the named claim, the one the pod's status names, or the one
/// the claim controller made for the pod (owner and annotation) before the status says so.
fn resolve<'a>(pod: &Pod, name: &str, claim_name: Option<&str>, claims: &'a [ResourceClaim]) -> Option<&'a ResourceClaim> {
    let namespace = pod.metadata.namespace.as_deref();
    let in_namespace = || claims.iter().filter(move |c| c.metadata.namespace.as_deref() == namespace);
    if let Some(claim_name) = claim_name {
        return in_namespace().find(|c| c.metadata.name.as_deref() == Some(claim_name));
    }
    let from_status = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|s| s.iter().find(|s| s.name == name))
        .and_then(|s| s.resource_claim_name.clone());
    if let Some(claim_name) = from_status {
        return in_namespace().find(|c| c.metadata.name.as_deref() == Some(&claim_name));
    }
    let uid = pod.metadata.uid.as_deref()?;
    in_namespace().find(|c| {
        c.metadata.owner_references.iter().flatten().any(|o| o.uid == uid)
            && c.metadata.annotations.as_ref().and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION)).map(String::as_str) == Some(name)
    })
}

/// What the driver wrote in `claim`'s `status.devices` for `result` (the entry with the same
/// driver, pool, device and share), when it wrote something readable.
fn written(
    claim: &ResourceClaim,
    result: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
) -> Option<DeviceStatusData> {
    let entry = claim.status.as_ref()?.devices.as_ref()?.iter().find(|d| {
        d.driver == result.driver && d.pool == result.pool && d.device == result.device && d.share_id == result.share_id
    })?;
    serde_json::from_value(entry.data.as_ref()?.0.clone()).ok()
}

/// Placements and limits of an allocated claim.
fn allocated(why: &mut ClaimWhy, claim: &ResourceClaim, cards: &[Card], driver: &str) -> Result<(), WhyError> {
    let mut device_shares = Vec::new();
    let mut statuses = Vec::new();
    for result in results(claim) {
        let consumed = share(claim, result)?.consumed;
        let card = cards.iter().find(|c| c.pool == result.pool && c.device == result.device);
        let ours = result.driver == driver;
        let status = if ours { written(claim, result) } else { None };
        why.placements.push(Placement {
            request: result.request.clone(),
            driver: result.driver.clone(),
            node: card.map_or_else(|| result.pool.clone(), |c| c.node.clone()),
            device: result.device.clone(),
            consumed: consumed.iter().map(|(n, q)| (n.clone(), show(n, *q))).collect(),
            uuid: status.as_ref().map(|s| s.uuid.clone()),
        });
        if ours {
            statuses.push(status);
            let amount = |name: &str| consumed.get(name).copied().unwrap_or(Quantity::ZERO);
            device_shares.push(DeviceShare {
                uuid: card.map(|c| c.uuid(driver)).unwrap_or_default(),
                memory: amount(CAPACITY_MEMORY),
                cores: amount(CAPACITY_CORES),
            });
        }
    }
    if device_shares.is_empty() {
        return Ok(());
    }
    // Prepared: the driver's own word for every share, else what it would write.
    if let Some(data) = statuses.into_iter().collect::<Option<Vec<_>>>() {
        why.limits = status_env(&data);
        why.prepared = true;
        return Ok(());
    }
    // The cache directory is the node's; only the limits matter here.
    match container_env(&device_shares, "", &LimitOptions::default()) {
        Ok(env) => {
            why.limits = env
                .into_iter()
                .filter(|(k, _)| {
                    k.starts_with("CUDA_DEVICE_MEMORY_LIMIT")
                        || k.starts_with("CUDA_DEVICE_SM_LIMIT")
                        || k == "NVIDIA_VISIBLE_DEVICES"
                })
                .collect();
        }
        Err(e) => why.error = Some(format!("the driver would refuse this claim: {e}")),
    }
    Ok(())
}

#[cfg(test)]
#[path = "why_tests.rs"]
mod tests;
