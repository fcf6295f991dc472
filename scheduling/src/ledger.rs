//! The per-device ledger of prepared shares: the node-side guard that the sum of what prepared
//! claims consume never exceeds a device's capacity, whatever the API says.

use std::collections::BTreeMap;

use crate::{Amounts, DeviceName, Quantity, Uid};

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

/// What a device has or its shares take together, by capacity name.
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
///
/// Every operation costs the same however many shares are admitted (a node may hold thousands):
/// what each device's shares take together is kept as they come and go, and shares are filed by
/// claim. A share's amounts are kept as [`Amounts`], not a map.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    capacity: BTreeMap<DeviceName, Consumption>,
    /// Each claim's shares (usually one), with their amounts.
    claims: BTreeMap<Uid, Vec<(ShareKey, Amounts)>>,
    /// What the admitted shares of each device take together.
    used: BTreeMap<DeviceName, Consumption>,
}

impl Ledger {
    /// A ledger for devices with these capacity totals.
    pub fn new(capacity: BTreeMap<DeviceName, Consumption>) -> Self {
        Self { capacity, ..Self::default() }
    }

    /// Replaces the device set (after rediscovery); admitted shares are kept, even on devices
    /// that vanished, so they can still be released.
    pub fn set_capacity(&mut self, capacity: BTreeMap<DeviceName, Consumption>) {
        self.capacity = capacity;
    }

    /// Sum of what admitted shares consume of `device`.
    pub fn used(&self, device: &DeviceName) -> Consumption {
        self.used.get(device).cloned().unwrap_or_default()
    }

    /// The amounts admitted for `key`, if it is.
    fn get(&self, key: &ShareKey) -> Option<&Amounts> {
        self.claims.get(&key.claim)?.iter().find(|(k, _)| k == key).map(|(_, a)| a)
    }

    /// Admits a share. Admitting the same share with the same consumption again is a no-op.
    ///
    /// # Errors
    /// [`AdmitError`] naming device, capacity, requested and free amounts; nothing changes.
    // The error carries every number the operator needs; admission is rare, so size is no concern.
    #[allow(clippy::result_large_err)]
    pub fn admit(&mut self, key: ShareKey, consumption: impl Into<Amounts>) -> Result<(), AdmitError> {
        let consumption = consumption.into();
        if let Some(existing) = self.get(&key) {
            return if *existing == consumption {
                Ok(())
            } else {
                Err(AdmitError::Conflict { claim: key.claim, device: key.device })
            };
        }
        self.fits(&key, &consumption)?;
        self.insert(key, consumption);
        Ok(())
    }

    /// Files a share not admitted yet and adds it to its device's total.
    fn insert(&mut self, key: ShareKey, consumption: Amounts) {
        let used = self.used.entry(key.device.clone()).or_default();
        for (name, amount) in consumption.iter() {
            let entry = used.entry(name.to_owned()).or_insert(Quantity::ZERO.with_format(amount.format()));
            *entry = entry.checked_add(*amount).unwrap_or(*entry);
        }
        // Sized for one: most claims have one share, and a Vec's first growth makes room for four.
        let shares = self.claims.entry(key.claim.clone()).or_insert_with(|| Vec::with_capacity(1));
        shares.push((key, consumption));
    }

    /// Takes a released share's amounts off its device's total.
    fn subtract(&mut self, key: &ShareKey, amounts: &Amounts) {
        let Some(used) = self.used.get_mut(&key.device) else { return };
        for (name, amount) in amounts.iter() {
            if let Some(entry) = used.get_mut(name) {
                *entry = entry.checked_sub(*amount).unwrap_or(*entry);
            }
        }
    }

    /// Whether a new share `key` taking `consumption` fits beside the admitted ones.
    #[allow(clippy::result_large_err)]
    fn fits(&self, key: &ShareKey, consumption: &Amounts) -> Result<(), AdmitError> {
        match self.get(key) {
            // Already counted: checking it against a total that includes it would count it twice.
            Some(existing) if existing == consumption => return Ok(()),
            Some(_) => return Err(AdmitError::Conflict { claim: key.claim.clone(), device: key.device.clone() }),
            None => {}
        }
        let totals = self.capacity.get(&key.device).ok_or_else(|| AdmitError::UnknownDevice(key.device.clone()))?;
        let used = self.used.get(&key.device);
        for (name, requested) in consumption.iter() {
            let device = || key.device.clone();
            if requested.is_negative() {
                return Err(AdmitError::Negative { device: device(), capacity: name.to_owned(), amount: *requested });
            }
            let total =
                *totals.get(name).ok_or_else(|| AdmitError::UnknownCapacity { device: device(), capacity: name.to_owned() })?;
            let taken = used.and_then(|u| u.get(name)).copied().unwrap_or(Quantity::ZERO);
            // Saturates at zero: a device that is already over (restored shares) has nothing free.
            let free = total.checked_sub(taken).ok().filter(|f| !f.is_negative()).unwrap_or(Quantity::ZERO);
            if *requested > free {
                return Err(AdmitError::OverCapacity {
                    device: device(),
                    capacity: name.to_owned(),
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
    pub fn restore(&mut self, key: ShareKey, consumption: impl Into<Amounts>) -> Option<AdmitError> {
        let consumption = consumption.into();
        let over = match self.fits(&key, &consumption) {
            Ok(()) if self.get(&key).is_some() => return None,
            Ok(()) => None,
            Err(e @ AdmitError::Conflict { .. }) => return Some(e),
            Err(e) => Some(e),
        };
        self.insert(key, consumption);
        over
    }

    /// Devices whose admitted shares take more than the device has of some capacity (after a
    /// restart with a smaller configuration, or a device that shrank), with that capacity.
    pub fn overcommitted(&self) -> Vec<(DeviceName, String)> {
        let mut out = Vec::new();
        for (device, used) in &self.used {
            let Some(totals) = self.capacity.get(device) else { continue };
            for (name, amount) in used {
                if totals.get(name).is_some_and(|total| amount > total) {
                    out.push((device.clone(), name.clone()));
                }
            }
        }
        out
    }

    /// Releases a share; unknown shares are ignored. Returns whether one was released.
    pub fn release(&mut self, key: &ShareKey) -> bool {
        let Some(shares) = self.claims.get_mut(&key.claim) else { return false };
        let Some(at) = shares.iter().position(|(k, _)| k == key) else { return false };
        let (key, amounts) = shares.swap_remove(at);
        if shares.is_empty() {
            self.claims.remove(&key.claim);
        }
        self.subtract(&key, &amounts);
        true
    }

    /// Releases every share of a claim; returns how many.
    pub fn release_claim(&mut self, claim: &Uid) -> usize {
        let shares = self.claims.remove(claim).unwrap_or_default();
        for (key, amounts) in &shares {
            self.subtract(key, amounts);
        }
        shares.len()
    }

    /// The admitted shares.
    pub fn share_keys(&self) -> impl Iterator<Item = &ShareKey> {
        self.claims.values().flatten().map(|(k, _)| k)
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
