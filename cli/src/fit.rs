//! Whether one request of a claim fits one card, and if not, every reason why: the checks
//! kube-scheduler's allocator makes for a shareable device (class and request selectors, taints,
//! capacity policy, room left after what allocated claims consume), with the amounts.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector, DeviceTaint, DeviceToleration};
use serde::Serialize;
use vgpu_scheduling::device::CAPACITY_SHARES;
use vgpu_scheduling::{Consumption, PolicyError, Quantity, Rounding};

use crate::cards::{Card, show, taint_text};
use crate::cel::{CelError, eval_selector};

/// One request (or one `firstAvailable` subrequest) as the allocator reads it.
#[derive(Debug, Clone)]
pub struct Ask {
    /// `request` or `request/subrequest`.
    pub name: String,
    /// The DeviceClass it names.
    pub class: String,
    /// Its own CEL selectors.
    pub selectors: Vec<String>,
    /// `capacity.requests`, parsed.
    pub capacity: BTreeMap<String, Quantity>,
    /// How many devices (`ExactCount`); `None` for `allocationMode: All`.
    pub count: Option<u64>,
    /// Its tolerations of device taints.
    pub tolerations: Vec<DeviceToleration>,
}

/// Why a card cannot serve a request; the message gives the amounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Reason {
    /// The pod's `nodeSelector` (`kubernetes.io/hostname`) or `nodeName` excludes the card's node.
    NodeNotSelected {
        /// The node the pod is bound or restricted to.
        pod_node: String,
    },
    /// The request's DeviceClass does not exist.
    ClassMissing {
        /// The class name.
        class: String,
    },
    /// A selector of the DeviceClass is false for this card.
    ClassSelector {
        /// The class name.
        class: String,
        /// The expression.
        expression: String,
    },
    /// A selector of the request is false for this card.
    RequestSelector {
        /// The expression.
        expression: String,
    },
    /// A selector fails on this card (the scheduler reports the same CEL error).
    SelectorError {
        /// The expression.
        expression: String,
        /// The CEL error.
        error: String,
    },
    /// A selector this tool cannot evaluate; the card may or may not match.
    SelectorNotEvaluated {
        /// The expression.
        expression: String,
        /// What is outside the evaluated subset.
        detail: String,
    },
    /// The card has a taint the request does not tolerate.
    Tainted {
        /// `key=value:effect`.
        taint: String,
    },
    /// The request asks a capacity the card does not have.
    UnknownCapacity {
        /// The capacity.
        capacity: String,
    },
    /// The request, rounded by the card's policy, is above what one card allows.
    AboveMaximum {
        /// The capacity.
        capacity: String,
        /// The rounded request.
        consumes: String,
        /// The policy's maximum.
        max: String,
    },
    /// The request is not an amount the card's policy allows.
    NotAllowed {
        /// The capacity.
        capacity: String,
        /// The rounded request.
        consumes: String,
    },
    /// Not enough of a capacity is left.
    Short {
        /// The capacity.
        capacity: String,
        /// How much is missing.
        short_by: String,
        /// What the request consumes after rounding.
        consumes: String,
        /// What is left.
        free: String,
        /// The card's total.
        total: String,
    },
    /// The card holds as many shares as it allows.
    SharesExhausted {
        /// Shares used.
        used: String,
        /// The split count.
        total: String,
    },
    /// The card is not shareable and already allocated.
    Exclusive,
    /// The request needs more distinct cards than have room.
    TooFewCards {
        /// Cards needed.
        needed: u64,
        /// Cards that could serve it.
        available: u64,
    },
}

impl Reason {
    /// Whether the reason certainly stops the card (a selector not evaluated may not).
    pub fn blocks(&self) -> bool {
        !matches!(self, Self::SelectorNotEvaluated { .. })
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeNotSelected { pod_node } => write!(f, "the pod can only run on node {pod_node}"),
            Self::ClassMissing { class } => write!(f, "DeviceClass {class} does not exist"),
            Self::ClassSelector { class, expression } => write!(f, "DeviceClass {class} selector does not match: {expression}"),
            Self::RequestSelector { expression } => write!(f, "request selector does not match: {expression}"),
            Self::SelectorError { expression, error } => write!(f, "CEL error ({error}) in selector: {expression}"),
            Self::SelectorNotEvaluated { expression, .. } => write!(f, "selector not evaluated: {expression}"),
            Self::Tainted { taint } => write!(f, "device tainted {taint}"),
            Self::UnknownCapacity { capacity } => write!(f, "the card has no capacity {capacity}"),
            Self::AboveMaximum { capacity, consumes, max } => {
                write!(f, "{capacity} {consumes} is above the card's maximum {max}")
            }
            Self::NotAllowed { capacity, consumes } => write!(f, "{capacity} {consumes} is not an amount the card allows"),
            Self::Short { capacity, short_by, consumes, free, total } => {
                write!(f, "{capacity} short by {short_by} (asks {consumes}, {free} of {total} free)")
            }
            Self::SharesExhausted { used, total } => write!(f, "shares exhausted ({used} of {total} used)"),
            Self::Exclusive => write!(f, "the card is not shared and already allocated"),
            Self::TooFewCards { needed, available } => {
                write!(f, "needs {needed} distinct cards, only {available} have room")
            }
        }
    }
}

/// The verdict for one card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CardFit {
    /// Node.
    pub node: String,
    /// Device.
    pub device: String,
    /// What the request would consume of this card, after the policy's rounding.
    pub consumes: BTreeMap<String, String>,
    /// Every reason it does not fit; empty when it fits.
    pub reasons: Vec<Reason>,
}

impl CardFit {
    /// Whether nothing certainly stops the card.
    pub fn fits(&self) -> bool {
        !self.reasons.iter().any(Reason::blocks)
    }
}

/// Checks `ask` against `card`, which allocated claims already take `used` of.
pub fn check(
    ask: &Ask,
    class: Option<&DeviceClass>,
    card: &Card,
    used: &Consumption,
    driver: &str,
    rounding: Rounding,
) -> CardFit {
    let mut reasons = Vec::new();
    let device = card.cel_device(driver);
    match class {
        None => reasons.push(Reason::ClassMissing { class: ask.class.clone() }),
        Some(class) => {
            for expression in cel_expressions(class.spec.selectors.as_deref()) {
                if let Some(r) =
                    selector(&expression, &device, |expression| Reason::ClassSelector { class: ask.class.clone(), expression })
                {
                    reasons.push(r);
                }
            }
        }
    }
    for expression in &ask.selectors {
        if let Some(r) = selector(expression, &device, |expression| Reason::RequestSelector { expression }) {
            reasons.push(r);
        }
    }
    for taint in card.taints.iter().filter(|t| t.effect != "None") {
        if !ask.tolerations.iter().any(|t| tolerates(t, taint)) {
            reasons.push(Reason::Tainted { taint: taint_text(taint) });
        }
    }
    let mut consumes = BTreeMap::new();
    for name in ask.capacity.keys().filter(|n| !card.capacity.contains_key(*n)) {
        reasons.push(Reason::UnknownCapacity { capacity: name.clone() });
    }
    let allocated = used.values().any(|q| !q.is_zero());
    if !card.shareable {
        if allocated {
            reasons.push(Reason::Exclusive);
        }
    } else {
        for (name, capacity) in &card.capacity {
            match capacity.consumed_by_in(ask.capacity.get(name).copied(), rounding) {
                Ok(amount) => {
                    consumes.insert(name.clone(), show(name, amount));
                    reasons.extend(room(name, amount, capacity.value, used.get(name).copied()));
                }
                Err(PolicyError::AboveMax { consumed, max }) => reasons.push(Reason::AboveMaximum {
                    capacity: name.clone(),
                    consumes: show(name, consumed),
                    max: show(name, max),
                }),
                Err(PolicyError::NotAllowed(consumed)) => {
                    reasons.push(Reason::NotAllowed { capacity: name.clone(), consumes: show(name, consumed) });
                }
            }
        }
    }
    CardFit { node: card.node.clone(), device: card.device.clone(), consumes, reasons }
}

/// The reason `amount` does not fit beside `used` of `total`, if it does not.
fn room(name: &str, amount: Quantity, total: Quantity, used: Option<Quantity>) -> Option<Reason> {
    let used = used.unwrap_or(Quantity::ZERO);
    let after = used.checked_add(amount).ok()?;
    if after <= total {
        return None;
    }
    if name == CAPACITY_SHARES {
        return Some(Reason::SharesExhausted { used: used.to_string(), total: total.to_string() });
    }
    let free = total.checked_sub(used).ok().filter(|f| !f.is_negative()).unwrap_or(Quantity::ZERO);
    let short = amount.checked_sub(free).ok()?;
    Some(Reason::Short {
        capacity: name.to_owned(),
        short_by: show(name, short),
        consumes: show(name, amount),
        free: show(name, free),
        total: show(name, total),
    })
}

/// The CEL expressions of `selectors`.
pub fn cel_expressions(selectors: Option<&[DeviceSelector]>) -> Vec<String> {
    selectors.into_iter().flatten().filter_map(|s| s.cel.as_ref()).map(|c| c.expression.clone()).collect()
}

fn selector(expression: &str, device: &crate::cel::Value, mismatch: impl FnOnce(String) -> Reason) -> Option<Reason> {
    let expression_text = expression.split_whitespace().collect::<Vec<_>>().join(" ");
    match eval_selector(expression, device) {
        Ok(true) => None,
        Ok(false) => Some(mismatch(expression_text)),
        Err(CelError::Runtime(error)) => Some(Reason::SelectorError { expression: expression_text, error }),
        Err(CelError::Unsupported(detail)) => Some(Reason::SelectorNotEvaluated { expression: expression_text, detail }),
    }
}

/// The API's toleration rule for device taints.
fn tolerates(t: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if t.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => t.key.as_deref().is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            t.key.as_deref() == Some(taint.key.as_str())
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// Adds [`Reason::TooFewCards`] to every card that would fit when fewer fit than `needed`:
/// a count of N needs N different cards with room.
pub fn require_cards(fits: &mut [CardFit], needed: u64) {
    let available = u64::try_from(fits.iter().filter(|f| f.fits()).count()).unwrap_or(u64::MAX);
    if available >= needed {
        return;
    }
    for f in fits.iter_mut().filter(|f| f.fits()) {
        f.reasons.push(Reason::TooFewCards { needed, available });
    }
}

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;
