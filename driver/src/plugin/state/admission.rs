//! Admission: a claim's shares taken in the ledger against the cards published now, all or
//! none, under the state's lock; given back when a later step fails; and the cards a claim whose
//! record was lost holds whole until the API says what it takes.

use std::collections::BTreeMap;

use vgpu_scheduling::{DeviceName, Ledger, PublishedDevice, Uid};

use super::{Inner, Pending, State};
use crate::plugin::error::PrepareError;
use crate::plugin::storage::checkpoint::PreparedClaim;

/// The request name of a pending claim's placeholder share in the ledger.
const PENDING_REQUEST: &str = "(pending adoption)";

impl State {
    /// The lock, once no prepare or unprepare is committing `entry`'s claim, with its shares
    /// admitted against `published`, or the claim as prepared already. An admission refused
    /// while unprepares are under way outside the lock waits for them and is tried again: their
    /// shares go back only once their records are durably gone, and capacity being given back
    /// is no reason to refuse a claim.
    pub(super) async fn admit_settled(
        &self,
        entry: &PreparedClaim,
        published: &[PublishedDevice],
    ) -> (tokio::sync::MutexGuard<'_, Inner>, Result<Admission, PrepareError>) {
        loop {
            let mut inner = self.settled(&entry.claim.uid).await;
            if let Some(existing) = inner.prepared.get(&entry.claim.uid) {
                let existing = existing.clone();
                return (inner, Ok(Admission::Prepared(existing)));
            }
            let Inner { ledger, pending, .. } = &mut *inner;
            let refused = match admit(ledger, pending, published, entry) {
                Ok((keys, was_pending)) => return (inner, Ok(Admission::Admitted { keys, was_pending })),
                Err(e) => e,
            };
            // Prepared claims being committed are being unprepared.
            let leaving = inner.committing.iter().filter(|uid| inner.prepared.contains_key(*uid)).count();
            if leaving == 0 {
                return (inner, Err(refused));
            }
            tracing::debug!(claim = %entry.claim, leaving, refused = %refused.chain(), "admission waits for the unprepares in flight");
            self.until_a_commit_ends(inner).await;
        }
    }
}

/// What [`State::admit_settled`] found.
pub(super) enum Admission {
    /// The claim was prepared already (a concurrent prepare of it got there first).
    Prepared(PreparedClaim),
    /// Its shares were admitted.
    Admitted {
        /// The keys admitted.
        keys: Vec<vgpu_scheduling::ShareKey>,
        /// The pending placeholder the claim had, to put back if a later step fails.
        was_pending: Option<Pending>,
    },
}

/// Admits every share of `entry` against `published`, or none: a refused share releases those
/// admitted before it and puts a pending placeholder back. The keys admitted, and the pending
/// placeholder the claim had (to put back if a later step fails).
fn admit(
    ledger: &mut Ledger,
    pending: &mut BTreeMap<Uid, Pending>,
    published: &[PublishedDevice],
    entry: &PreparedClaim,
) -> Result<(Vec<vgpu_scheduling::ShareKey>, Option<Pending>), PrepareError> {
    let uid = &entry.claim.uid;
    ledger.set_capacity(capacities(published));
    // A claim held whole since start-up is being prepared with its real shares now.
    let was_pending = pending.remove(uid);
    if was_pending.is_some() {
        ledger.release_claim(uid);
    }
    let mut admitted = Vec::new();
    for d in &entry.devices {
        if let Err(e) = ledger.admit(d.key(uid), d.consumption.clone()) {
            unadmit(ledger, pending, published, &admitted, was_pending);
            return Err(e.into());
        }
        admitted.push(d.key(uid));
    }
    Ok((admitted, was_pending))
}

/// Undoes [`admit`] after a later step failed.
pub(super) fn unadmit(
    ledger: &mut Ledger,
    pending: &mut BTreeMap<Uid, Pending>,
    published: &[PublishedDevice],
    admitted: &[vgpu_scheduling::ShareKey],
    was_pending: Option<Pending>,
) {
    for key in admitted {
        ledger.release(key);
    }
    restore_pending(ledger, pending, published, was_pending);
}

/// Puts a pending claim's placeholder back after a failed prepare.
fn restore_pending(
    ledger: &mut Ledger,
    pending: &mut BTreeMap<Uid, Pending>,
    published: &[PublishedDevice],
    was: Option<Pending>,
) {
    if let Some(p) = was {
        hold_whole(ledger, &p, published);
        pending.insert(p.claim.uid.clone(), p);
    }
}

/// Holds every card a pending claim names, whole: until the API tells what the claim takes, no
/// new share may be admitted beside it.
pub(super) fn hold_whole(ledger: &mut Ledger, pending: &Pending, published: &[PublishedDevice]) {
    for device in &pending.devices {
        if let Some(card) = published.iter().find(|p| &p.name == device) {
            let key = vgpu_scheduling::ShareKey {
                claim: pending.claim.uid.clone(),
                request: PENDING_REQUEST.into(),
                device: device.clone(),
                share: None,
            };
            let _ = ledger.restore(key, card.capacity_values());
        }
    }
}

pub(super) fn capacities(published: &[PublishedDevice]) -> BTreeMap<DeviceName, vgpu_scheduling::Consumption> {
    published.iter().map(|d| (d.name.clone(), d.capacity_values())).collect()
}
