//! The per-device ledger of prepared shares: the node-side guard that the sum of what prepared
//! claims consume never exceeds a device's capacity, whatever the API says.

use std::collections::BTreeMap;

use crate::{DeviceName, Quantity, Uid};

/// One claim's share of one device: one allocation result. Two requests of one claim on the
/// same device are two shares, never one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShareKey {
    /// The claim.
    pub claim: Uid,
    /// The claim's request (with subrequest, `req/sub`) the result answers.
    pub request: String,
    /// The device.
    pub device: DeviceName,
    /// The scheduler's share ID, for devices with multiple allocations.
    pub share: Option<Uid>,
}

/// What a share consumes, by capacity name.
pub type Consumption = BTreeMap<String, Quantity>;

/// Why a share was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The device is not (or no longer) published by this node.
    #[error("device {0} does not exist on this node")]
    UnknownDevice(DeviceName),
    /// The share names a capacity the device does not have.
    #[error("device {device} has no capacity {capacity:?}")]
    UnknownCapacity {
        /// The device.
        device: DeviceName,
        /// The capacity name.
        capacity: String,
    },
    /// The share would take a capacity past the device's total.
    #[error("device {device}: {capacity} requested {requested}, only {free} of {total} free")]
    OverCapacity {
        /// The device.
        device: DeviceName,
        /// The capacity name.
        capacity: String,
        /// What the share asks for.
        requested: Quantity,
        /// What is left.
        free: Quantity,
        /// The device's total.
        total: Quantity,
    },
    /// The same share was admitted before with other amounts.
    #[error("share of claim {claim} on {device} is already admitted with different consumption")]
    Conflict {
        /// The claim.
        claim: Uid,
        /// The device.
        device: DeviceName,
    },
    /// A negative amount.
    #[error("device {device}: {capacity} consumption {amount} is negative")]
    Negative {
        /// The device.
        device: DeviceName,
        /// The capacity name.
        capacity: String,
        /// The amount.
        amount: Quantity,
    },
}

/// Device capacities and the shares admitted against them.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    capacity: BTreeMap<DeviceName, Consumption>,
    shares: BTreeMap<ShareKey, Consumption>,
}

impl Ledger {
    /// A ledger for devices with these capacity totals.
    pub fn new(capacity: BTreeMap<DeviceName, Consumption>) -> Self {
        Self { capacity, shares: BTreeMap::new() }
    }

    /// Replaces the device set (after rediscovery); admitted shares are kept, even on devices
    /// that vanished, so they can still be released.
    pub fn set_capacity(&mut self, capacity: BTreeMap<DeviceName, Consumption>) {
        self.capacity = capacity;
    }

    /// Sum of what admitted shares consume of `device`.
    pub fn used(&self, device: &DeviceName) -> Consumption {
        let mut used = Consumption::new();
        for (key, consumption) in &self.shares {
            if &key.device == device {
                for (name, amount) in consumption {
                    let entry = used.entry(name.clone()).or_insert(Quantity::ZERO.with_format(amount.format()));
                    *entry = entry.checked_add(*amount).unwrap_or(*entry);
                }
            }
        }
        used
    }

    /// Admits a share. Admitting the same share with the same consumption again is a no-op.
    ///
    /// # Errors
    /// [`AdmitError`] naming device, capacity, requested and free amounts; nothing changes.
    // The error carries every number the operator needs; admission is rare, so size is no concern.
    #[allow(clippy::result_large_err)]
    pub fn admit(&mut self, key: ShareKey, consumption: Consumption) -> Result<(), AdmitError> {
        if let Some(existing) = self.shares.get(&key) {
            return if *existing == consumption {
                Ok(())
            } else {
                Err(AdmitError::Conflict { claim: key.claim, device: key.device })
            };
        }
        self.fits(&key, &consumption)?;
        self.shares.insert(key, consumption);
        Ok(())
    }

    /// Whether a new share `key` taking `consumption` fits beside the admitted ones.
    #[allow(clippy::result_large_err)]
    fn fits(&self, key: &ShareKey, consumption: &Consumption) -> Result<(), AdmitError> {
        match self.shares.get(key) {
            // Already counted: checking it against a total that includes it would count it twice.
            Some(existing) if existing == consumption => return Ok(()),
            Some(_) => return Err(AdmitError::Conflict { claim: key.claim.clone(), device: key.device.clone() }),
            None => {}
        }
        let totals = self.capacity.get(&key.device).ok_or_else(|| AdmitError::UnknownDevice(key.device.clone()))?;
        let used = self.used(&key.device);
        for (name, requested) in consumption {
            let device = || key.device.clone();
            if requested.is_negative() {
                return Err(AdmitError::Negative { device: device(), capacity: name.clone(), amount: *requested });
            }
            let total =
                *totals.get(name).ok_or_else(|| AdmitError::UnknownCapacity { device: device(), capacity: name.clone() })?;
            let taken = used.get(name).copied().unwrap_or(Quantity::ZERO);
            // Saturates at zero: a device that is already over (restored shares) has nothing free.
            let free = total.checked_sub(taken).ok().filter(|f| !f.is_negative()).unwrap_or(Quantity::ZERO);
            if *requested > free {
                return Err(AdmitError::OverCapacity {
                    device: device(),
                    capacity: name.clone(),
                    requested: *requested,
                    free,
                    total,
                });
            }
        }
        Ok(())
    }

    /// Records a share that is already in use (a prepared claim found at start-up) whether or
    /// not it fits: a container runs with it, so it must count. Returns the first capacity it
    /// takes past the device's total, if any; while a device is over, [`Ledger::admit`] refuses
    /// every new share of it (nothing is free).
    #[allow(clippy::result_large_err)]
    pub fn restore(&mut self, key: ShareKey, consumption: Consumption) -> Option<AdmitError> {
        let over = match self.fits(&key, &consumption) {
            Ok(()) => None,
            Err(e @ AdmitError::Conflict { .. }) => return Some(e),
            Err(e) => Some(e),
        };
        self.shares.insert(key, consumption);
        over
    }

    /// Devices whose admitted shares take more than the device has of some capacity (after a
    /// restart with a smaller configuration, or a device that shrank), with that capacity.
    pub fn overcommitted(&self) -> Vec<(DeviceName, String)> {
        let devices: std::collections::BTreeSet<&DeviceName> = self.shares.keys().map(|k| &k.device).collect();
        let mut out = Vec::new();
        for device in devices {
            let used = self.used(device);
            let Some(totals) = self.capacity.get(device) else { continue };
            for (name, amount) in &used {
                if totals.get(name).is_some_and(|total| amount > total) {
                    out.push((device.clone(), name.clone()));
                }
            }
        }
        out
    }

    /// Releases a share; unknown shares are ignored. Returns whether one was released.
    pub fn release(&mut self, key: &ShareKey) -> bool {
        self.shares.remove(key).is_some()
    }

    /// Releases every share of a claim; returns how many.
    pub fn release_claim(&mut self, claim: &Uid) -> usize {
        let before = self.shares.len();
        self.shares.retain(|k, _| &k.claim != claim);
        before - self.shares.len()
    }

    /// The admitted shares.
    pub fn shares(&self) -> impl Iterator<Item = (&ShareKey, &Consumption)> {
        self.shares.iter()
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
