//! The requests of a ResourceClaim as the allocator reads them: each `exactly` request is one
//! [`Ask`], each `firstAvailable` request a list of them (its subrequests, in order), and which
//! requests a `distinctAttribute` constraint keeps on different cards.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequirements, DeviceSelector, DeviceToleration, ResourceClaim};
use vgpu_scheduling::Quantity;

use crate::fit::{Ask, cel_expressions};

/// One request of a claim with its alternatives (one for `exactly`).
#[derive(Debug, Clone)]
pub struct Request {
    /// The request name.
    pub name: String,
    /// What it may be served by, in the allocator's order of preference.
    pub alternatives: Vec<Ask>,
    /// Whether a `distinctAttribute` constraint applies to it.
    pub distinct: bool,
}

/// A request that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request {request}: capacity {capacity}: {reason}")]
pub struct RequestError {
    /// The request.
    pub request: String,
    /// The capacity.
    pub capacity: String,
    /// Why its amount does not parse.
    pub reason: String,
}

/// The requests of `claim`.
///
/// # Errors
/// [`RequestError`] for a capacity request that does not parse.
pub fn requests(claim: &ResourceClaim) -> Result<Vec<Request>, RequestError> {
    let Some(devices) = &claim.spec.devices else { return Ok(Vec::new()) };
    let all_names: Vec<String> = devices.requests.iter().flatten().map(|r| r.name.clone()).collect();
    let distinct: Vec<String> = devices
        .constraints
        .iter()
        .flatten()
        .filter(|c| c.distinct_attribute.is_some())
        .flat_map(|c| c.requests.clone().filter(|r| !r.is_empty()).unwrap_or_else(|| all_names.clone()))
        .collect();
    let mut out = Vec::new();
    for r in devices.requests.iter().flatten() {
        let mut alternatives = Vec::new();
        if let Some(e) = &r.exactly {
            alternatives.push(ask(
                r.name.clone(),
                &e.device_class_name,
                e.selectors.as_deref(),
                e.capacity.as_ref(),
                e.allocation_mode.as_deref(),
                e.count,
                e.tolerations.as_deref(),
            )?);
        }
        for s in r.first_available.iter().flatten() {
            alternatives.push(ask(
                format!("{}/{}", r.name, s.name),
                &s.device_class_name,
                s.selectors.as_deref(),
                s.capacity.as_ref(),
                s.allocation_mode.as_deref(),
                s.count,
                s.tolerations.as_deref(),
            )?);
        }
        out.push(Request { name: r.name.clone(), alternatives, distinct: distinct.contains(&r.name) });
    }
    Ok(out)
}

fn ask(
    name: String,
    class: &str,
    selectors: Option<&[DeviceSelector]>,
    capacity: Option<&CapacityRequirements>,
    mode: Option<&str>,
    count: Option<i64>,
    tolerations: Option<&[DeviceToleration]>,
) -> Result<Ask, RequestError> {
    let mut parsed = BTreeMap::new();
    for (capacity, q) in capacity.and_then(|c| c.requests.as_ref()).into_iter().flatten() {
        let amount = Quantity::parse(&q.0).map_err(|e| RequestError {
            request: name.clone(),
            capacity: capacity.clone(),
            reason: e.to_string(),
        })?;
        parsed.insert(capacity.clone(), amount);
    }
    let count = match mode {
        Some("All") => None,
        _ => Some(count.and_then(|c| u64::try_from(c).ok()).unwrap_or(1)),
    };
    Ok(Ask {
        name,
        class: class.to_owned(),
        selectors: cel_expressions(selectors),
        capacity: parsed,
        count,
        tolerations: tolerations.map(<[_]>::to_vec).unwrap_or_default(),
    })
}
