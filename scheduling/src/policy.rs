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

/// How kube-scheduler puts a request on a range's step grid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rounding {
    /// On whole values, each rounded up first: Kubernetes 1.34 to 1.37, and later releases with
    /// `DRAFractionalCapacityRange` off. A request of `500m` cores on a 1m grid consumes `1`.
    #[default]
    Whole,
    /// In thousandths, where min, max and step are whole thousandths and the step at least 1m
    /// (`DRAFractionalCapacityRange`, beta and on in 1.37 only with its compatibility version
    /// raised, GA from 1.38): `500m` cores consume `500m`.
    Milli,
}

impl Rounding {
    /// What Kubernetes 1.`minor` does by default.
    pub fn of_release(minor: u32) -> Self {
        if minor >= 38 { Self::Milli } else { Self::Whole }
    }
}

impl Capacity {
    /// [`Capacity::consumed_by_in`] with [`Rounding::Whole`], as every release up to 1.37 rounds.
    ///
    /// # Errors
    /// [`PolicyError`] when the rounded amount violates the policy (then the device does not fit).
    pub fn consumed_by(&self, request: Option<Quantity>) -> Result<Quantity, PolicyError> {
        self.consumed_by_in(request, Rounding::Whole)
    }

    /// The amount a request consumes, as kube-scheduler computes it with `rounding`: an absent
    /// request takes the default (or everything); below `min` takes `min`; otherwise rounded up
    /// to the step or to the next valid value.
    ///
    /// # Errors
    /// [`PolicyError`] when the rounded amount violates the policy (then the device does not fit).
    pub fn consumed_by_in(&self, request: Option<Quantity>, rounding: Rounding) -> Result<Quantity, PolicyError> {
        let Some(policy) = &self.policy else {
            return Ok(request.unwrap_or(self.value));
        };
        let Some(request) = request else {
            let consumed = policy.default.unwrap_or(self.value);
            return policy.check(consumed, rounding).map(|()| consumed);
        };
        let consumed = match &policy.valid {
            ValidRequests::Range { min, step, .. } => {
                if request < *min {
                    *min
                } else if let Some(step) = step {
                    match milli_grid(&policy.valid, rounding) {
                        Some((m, s)) => round_up_milli(request, m, s, step.format()).ok_or(PolicyError::NotAllowed(request))?,
                        None => round_up_to_step(request, *min, *step),
                    }
                } else {
                    request
                }
            }
            ValidRequests::Values(values) => values.iter().copied().find(|v| request <= *v).unwrap_or(request),
            ValidRequests::Any => request,
        };
        policy.check(consumed, rounding).map(|()| consumed)
    }
}

/// A quantity in whole thousandths, when it is one and fits an i64 (the scheduler's
/// `safeMilliValue`).
fn exact_milli(q: Quantity) -> Option<i64> {
    const NANOS_PER_MILLI: i128 = 1_000_000;
    (q.nanos() % NANOS_PER_MILLI == 0).then(|| i64::try_from(q.nanos() / NANOS_PER_MILLI).ok()).flatten()
}

/// With [`Rounding::Milli`], a range's min and step in thousandths when the scheduler rounds it
/// that way (its `useMilli`: min, max and step whole thousandths, the step at least 1m).
fn milli_grid(valid: &ValidRequests, rounding: Rounding) -> Option<(i64, i64)> {
    let ValidRequests::Range { min, max, step: Some(step) } = valid else { return None };
    if rounding != Rounding::Milli || max.is_some_and(|m| exact_milli(m).is_none()) {
        return None;
    }
    let (m, s) = (exact_milli(*min)?, exact_milli(*step)?);
    (s >= 1).then_some((m, s))
}

/// `min + ceil((req - min) / s) * s`, all in thousandths, printed in `format` (the step's; whole
/// values as such); `None` when the request is no whole number of thousandths or the result
/// leaves the range the scheduler can represent (it then refuses the request).
fn round_up_milli(request: Quantity, min: i64, s: i64, format: Format) -> Option<Quantity> {
    let r = exact_milli(request)?;
    let added = i128::from(r) - i128::from(min);
    let n = added / i128::from(s) + i128::from(added % i128::from(s) != 0);
    let value = i64::try_from(i128::from(min) + i128::from(s) * n).ok()?;
    Some(if value % 1000 == 0 {
        Quantity::from_int(value / 1000, format)
    } else {
        Quantity::from_milli(value).with_format(format)
    })
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

    /// The scheduler's `violatesPolicy` on a consumed amount, rounding as `rounding` does.
    fn check(&self, consumed: Quantity, rounding: Rounding) -> Result<(), PolicyError> {
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
                if let Some((m, s)) = milli_grid(&self.valid, rounding) {
                    let off_grid = exact_milli(consumed).is_none_or(|c| (i128::from(c) - i128::from(m)) % i128::from(s) != 0);
                    return if off_grid { Err(PolicyError::NotAllowed(consumed)) } else { Ok(()) };
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
