//! Capacity request policies and the rounding kube-scheduler applies to a request
//! (`k8s.io/dynamic-resource-allocation/structured`, consumable capacity): the consumed amount of
//! a capacity follows from the request and the policy alone, so the driver can check an allocation
//! byte for byte.

use crate::{Format, Quantity};

/// One consumable capacity of a device: its total and the policy for requests against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// The total amount the device offers.
    pub value: Quantity,
    /// How requests are defaulted and rounded; `None` means a request consumes what it names
    /// and an absent request consumes everything.
    pub policy: Option<RequestPolicy>,
}

/// A request policy, as `resource.k8s.io/v1` `CapacityRequestPolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPolicy {
    /// What an absent request consumes.
    pub default: Option<Quantity>,
    /// Which amounts may be consumed.
    pub valid: ValidRequests,
}

/// The allowed consumed amounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidRequests {
    /// Any amount.
    Any,
    /// `min + k * step` (any amount >= min without a step), up to `max`.
    Range {
        /// Smallest amount; smaller requests are raised to it.
        min: Quantity,
        /// Largest amount; larger requests do not fit.
        max: Option<Quantity>,
        /// Granularity; requests are rounded up to it.
        step: Option<Quantity>,
    },
    /// One of these amounts, ascending (at most 10 in the API).
    Values(Vec<Quantity>),
}

/// Why a request cannot be served by a capacity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The rounded amount is above the policy's maximum.
    #[error("{consumed} is above the maximum {max}")]
    AboveMax {
        /// The amount after rounding.
        consumed: Quantity,
        /// The policy's maximum.
        max: Quantity,
    },
    /// The amount is not one of the policy's values (or not on its step grid).
    #[error("{0} is not an amount the policy allows")]
    NotAllowed(Quantity),
}

impl Capacity {
    /// The amount a request consumes, as kube-scheduler computes it: an absent request takes
    /// the default (or everything); below `min` takes `min`; otherwise rounded up to the step
    /// (via the integer value rounded up, as the scheduler does) or to the next valid value.
    ///
    /// # Errors
    /// [`PolicyError`] when the rounded amount violates the policy (then the device does not fit).
    pub fn consumed_by(&self, request: Option<Quantity>) -> Result<Quantity, PolicyError> {
        let Some(policy) = &self.policy else {
            return Ok(request.unwrap_or(self.value));
        };
        let Some(request) = request else {
            let consumed = policy.default.unwrap_or(self.value);
            return policy.check(consumed).map(|()| consumed);
        };
        let consumed = match &policy.valid {
            ValidRequests::Range { min, step, .. } => {
                if request < *min {
                    *min
                } else if let Some(step) = step {
                    round_up_to_step(request, *min, *step)
                } else {
                    request
                }
            }
            ValidRequests::Values(values) => values.iter().copied().find(|v| request <= *v).unwrap_or(request),
            ValidRequests::Any => request,
        };
        policy.check(consumed).map(|()| consumed)
    }
}

/// `min + ceil((req - min) / step) * step` on integer values rounded up, printed as BinarySI.
fn round_up_to_step(request: Quantity, min: Quantity, step: Quantity) -> Quantity {
    let (Some(r), Some(m), Some(s)) = (request.value_ceil(), min.value_ceil(), step.value_ceil()) else {
        return request;
    };
    if s <= 0 {
        return request;
    }
    let added = i128::from(r) - i128::from(m);
    let n = added / i128::from(s) + i128::from(added % i128::from(s) != 0);
    let value = i128::from(m) + i128::from(s) * n;
    i64::try_from(value).map_or(request, |v| Quantity::from_int(v, Format::BinarySI))
}

impl RequestPolicy {
    /// The least any allocation can consume under this policy (`None`: no lower bound but zero):
    /// what the scheduler raises smaller requests to. A share below it was not written by the
    /// scheduler, and for memory it would read as "no limit" to HAMi-core.
    pub fn minimum(&self) -> Option<Quantity> {
        match &self.valid {
            ValidRequests::Range { min, .. } => Some(*min),
            ValidRequests::Values(values) => values.first().copied(),
            ValidRequests::Any => None,
        }
    }

    /// The scheduler's `violatesPolicy` on a consumed amount.
    fn check(&self, consumed: Quantity) -> Result<(), PolicyError> {
        if self.default == Some(consumed) {
            return Ok(());
        }
        match &self.valid {
            ValidRequests::Any => Ok(()),
            ValidRequests::Range { min, max, step } => {
                if let Some(max) = max
                    && consumed > *max
                {
                    return Err(PolicyError::AboveMax { consumed, max: *max });
                }
                if let Some(step) = step {
                    let (c, m, s) = (consumed.value_ceil(), min.value_ceil(), step.value_ceil());
                    if let (Some(c), Some(m), Some(s)) = (c, m, s)
                        && s > 0
                        && (i128::from(c) - i128::from(m)) % i128::from(s) != 0
                    {
                        return Err(PolicyError::NotAllowed(consumed));
                    }
                }
                Ok(())
            }
            ValidRequests::Values(values) if values.contains(&consumed) => Ok(()),
            ValidRequests::Values(_) => Err(PolicyError::NotAllowed(consumed)),
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
