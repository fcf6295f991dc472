//! The dynamic-MIG steps of prepare, unprepare and start-up. The durable order (see
//! `plugin::mig`): prepare records its intent (placements, no instances) before it makes an
//! instance and the instance before the spec; unprepare destroys a claim's last instance before
//! its record goes; start-up destroys what sits at the placement of an intent never completed.
//!
//! The card is driven under the state's lock: an instance made or destroyed and the records
//! that say so move together, like shares and the ledger. Only prepares of claims on MIG
//! devices and unprepares of claims holding an instance drive the card.

use std::collections::{BTreeMap, BTreeSet};

use cdi_spec::Spec;
use vgpu_scheduling::{PublishedDevice, Uid};

use super::admission::{Admission, unadmit};
use super::{Inner, State};
use crate::mig::MigError;
use crate::plugin::cdi::{add_mig_nodes, build_spec, is_admin};
use crate::plugin::error::{PrepareError, chain};
use crate::plugin::failpoint::{FailPoint, fail_point};
use crate::plugin::mig::{MigHold, MigPrepare, MigTarget};
use crate::plugin::storage::blocking;
use crate::plugin::storage::checkpoint::PreparedClaim;
use crate::plugin::storage::held_spec::HeldSpec;

impl State {
    fn mig(&self) -> Result<&MigPrepare, PrepareError> {
        self.options.mig.as_ref().ok_or_else(|| PrepareError::MigNodes {
            claim: String::new(),
            device: String::new(),
            reason: "dynamic MIG is off on this node".into(),
        })
    }

    /// Admits a claim with devices standing for instances, makes the instances no other claim
    /// made yet, and writes its record, directory and spec, under the lock. `card_spec` is the
    /// spec `entry` holds, built on the cards: the intent record holds it until the instances
    /// are made.
    pub(super) async fn commit_mig(
        &self,
        mut entry: PreparedClaim,
        card_spec: &Spec,
        targets: &[MigTarget],
        published: &[PublishedDevice],
        env: &[(String, String)],
    ) -> Result<PreparedClaim, PrepareError> {
        let mig = self.mig()?;
        let (mut inner, admission) = self.admit_settled(&entry, published).await;
        let (admitted, was_pending) = match admission? {
            Admission::Prepared(existing) => return Ok(existing),
            Admission::Admitted { keys, was_pending } => (keys, was_pending),
        };
        let Inner { ledger, prepared, pending, .. } = &mut *inner;
        fail_point(self.fail_at, FailPoint::PrepareAdmitted);
        entry.mig = targets.iter().map(|t| MigHold::new(t, live_instance(prepared, t))).collect();
        let made = match self.make_instances(mig, &mut entry, card_spec) {
            Ok(made) => made,
            Err(e) => {
                unadmit(ledger, pending, published, &admitted, was_pending);
                return Err(e);
            }
        };
        if let Err(e) = self.write_mig_entry(&mut entry, published, env) {
            // Nothing of it may stay: the instances made for it first, then its record.
            self.undo_instances(mig, &entry, &made);
            let uid = entry.claim.uid.clone();
            blocking(|| {
                let _ = self.storage.checkpoint.forget(&uid);
                let _ = self.storage.specs.remove(uid.as_str());
            });
            let keep_dir = was_pending.is_some();
            unadmit(ledger, pending, published, &admitted, was_pending);
            if self.options.host_dirs && !keep_dir {
                self.discard_dir(&uid);
            }
            return Err(e);
        }
        prepared.insert(entry.claim.uid.clone(), entry.clone());
        self.tell_prepared(&entry);
        Ok(entry)
    }

    /// Makes the instances of `entry`'s holds that have none, after recording the intent (with
    /// `spec`, the spec `entry` holds); the indices of those made. On failure nothing made stays
    /// and the intent is gone.
    fn make_instances(&self, mig: &MigPrepare, entry: &mut PreparedClaim, spec: &Spec) -> Result<Vec<usize>, PrepareError> {
        let missing: Vec<usize> = (0..entry.mig.len()).filter(|i| entry.mig[*i].instance.is_none()).collect();
        if missing.is_empty() {
            return Ok(missing);
        }
        // Ours from now on: no layout may take an instance there for one already on the card.
        for i in &missing {
            mig.settings.owned.insert(entry.mig[*i].key());
        }
        if let Err(e) = blocking(|| self.storage.checkpoint.record(entry, spec)) {
            self.drop_intent(mig, entry, &missing, &[]);
            return Err(e.into());
        }
        fail_point(self.fail_at, FailPoint::PrepareMigIntent);
        let mut made = Vec::new();
        for i in missing.iter().copied() {
            let hold = &entry.mig[i];
            match blocking(|| mig.control.create(&hold.card, hold.profile_id, hold.start)) {
                Ok(instance) => {
                    tracing::info!(claim = %entry.claim, device = %hold.device, gi = instance.gi_id, ci = instance.ci_id, uuid = %instance.uuid, "made MIG instance");
                    entry.mig[i].instance = Some(instance);
                    made.push(i);
                }
                Err(source) => {
                    let device = hold.device.to_string();
                    self.drop_intent(mig, entry, &missing, &made);
                    return Err(PrepareError::Mig { claim: entry.claim.to_string(), device, source });
                }
            }
        }
        fail_point(self.fail_at, FailPoint::PrepareMigCreated);
        Ok(made)
    }

    /// Undoes [`State::make_instances`]: the instances `made` destroyed, the placements
    /// `missing` no longer ours, the intent record gone (else start-up removes it).
    fn drop_intent(&self, mig: &MigPrepare, entry: &PreparedClaim, missing: &[usize], made: &[usize]) {
        self.undo_instances(mig, entry, made);
        for hold in missing.iter().filter_map(|i| entry.mig.get(*i)) {
            mig.settings.owned.remove(&hold.key());
        }
        if let Err(e) = blocking(|| self.storage.checkpoint.forget(&entry.claim.uid)) {
            tracing::error!(claim = %entry.claim, error = %chain(&e), "intent of a failed MIG prepare not removed; start-up removes it");
        }
    }

    /// Destroys the instances at `made` of `entry`'s holds (a prepare that failed after making
    /// them); failures are logged, and start-up finds what is left through the intent record.
    fn undo_instances(&self, mig: &MigPrepare, entry: &PreparedClaim, made: &[usize]) {
        for hold in made.iter().filter_map(|i| entry.mig.get(*i)) {
            let Some(instance) = &hold.instance else { continue };
            match blocking(|| mig.control.destroy(&hold.card, instance.gi_id, instance.ci_id)) {
                Ok(()) => {
                    tracing::info!(claim = %entry.claim, device = %hold.device, uuid = %instance.uuid, "destroyed MIG instance of a failed prepare")
                }
                Err(e) => {
                    tracing::error!(claim = %entry.claim, device = %hold.device, error = %chain(&e), "MIG instance of a failed prepare not destroyed")
                }
            }
            mig.settings.owned.remove(&hold.key());
        }
    }

    /// Builds `entry`'s spec on its instances and writes its record, directory and spec.
    fn write_mig_entry(
        &self,
        entry: &mut PreparedClaim,
        published: &[PublishedDevice],
        env: &[(String, String)],
    ) -> Result<(), PrepareError> {
        let claim = entry.claim.clone();
        // The container sees the instance, not the card: its UUID wherever the card's would be.
        let mut shown = published.to_vec();
        for hold in &entry.mig {
            if let (Some(instance), Some(device)) = (&hold.instance, shown.iter_mut().find(|d| d.name == hold.device)) {
                device.uuid.clone_from(&instance.uuid);
            }
        }
        let cdi = &self.storage.cdi;
        let mut spec = build_spec(cdi, &claim, &entry.devices, &shown, env)
            .map_err(|source| PrepareError::Spec { claim: claim.to_string(), source })?;
        add_mig_nodes(&mut spec, cdi, &claim, &entry.devices, &entry.mig).map_err(|(device, reason)| PrepareError::MigNodes {
            claim: claim.to_string(),
            device,
            reason,
        })?;
        entry.spec = HeldSpec::new(&spec);
        let host_dirs = self.options.host_dirs && !is_admin(&entry.devices);
        let entry = &*entry;
        blocking(|| {
            self.storage.checkpoint.record(entry, &spec)?;
            fail_point(self.fail_at, FailPoint::PrepareCheckpointed);
            if host_dirs {
                self.storage.make_claim_dir(entry)?;
            }
            self.storage.specs.write(claim.uid.as_str(), &spec)?;
            fail_point(self.fail_at, FailPoint::PrepareSpecWritten);
            Ok(())
        })
    }

    /// Destroys the instances of claim `uid` that no other prepared claim holds, before its
    /// record goes. An instance already gone counts as destroyed.
    ///
    /// # Errors
    /// When the card refuses: the record stays and the kubelet retries.
    pub(super) fn release_instances(&self, uid: &Uid, prepared: &BTreeMap<Uid, PreparedClaim>) -> Result<(), PrepareError> {
        let Some(entry) = prepared.get(uid).filter(|e| !e.mig.is_empty()) else { return Ok(()) };
        let Some(mig) = &self.options.mig else {
            tracing::warn!(claim = %entry.claim, "claim holds MIG instances but dynamic MIG is off now; they stay on the card");
            return Ok(());
        };
        let mut destroyed = false;
        for hold in &entry.mig {
            let Some(instance) = &hold.instance else { continue };
            let shared = prepared.values().any(|p| p.claim.uid != *uid && p.mig.iter().any(|o| o.key() == hold.key()));
            if shared {
                continue;
            }
            match blocking(|| mig.control.destroy(&hold.card, instance.gi_id, instance.ci_id)) {
                Ok(()) => {
                    tracing::info!(claim = %entry.claim, device = %hold.device, uuid = %instance.uuid, "destroyed MIG instance: its last claim is unprepared")
                }
                Err(MigError::UnknownInstance { .. }) => {
                    tracing::warn!(claim = %entry.claim, device = %hold.device, uuid = %instance.uuid, "MIG instance already gone");
                }
                Err(source) => {
                    return Err(PrepareError::Mig { claim: entry.claim.to_string(), device: hold.device.to_string(), source });
                }
            }
            mig.settings.owned.remove(&hold.key());
            destroyed = true;
        }
        if destroyed {
            fail_point(self.fail_at, FailPoint::UnprepareMigDestroyed);
        }
        Ok(())
    }

    /// At start: a record whose instances were not all made is a prepare the kubelet never
    /// heard back from; what sits at its placements (and no complete record names) is that
    /// prepare's, and is destroyed with the record. Then the owned placements are exactly the
    /// records'.
    pub(super) async fn reconcile_mig(&self) {
        let Some(mig) = &self.options.mig else { return };
        let mut inner = self.inner.lock().await;
        let interrupted: Vec<Uid> =
            inner.prepared.iter().filter(|(_, p)| p.mig.iter().any(|h| h.instance.is_none())).map(|(u, _)| u.clone()).collect();
        for uid in interrupted {
            let Some(entry) = inner.prepared.remove(&uid) else { continue };
            let recorded: BTreeSet<String> = inner
                .prepared
                .values()
                .flat_map(|p| p.mig.iter().filter_map(|h| h.instance.as_ref().map(|i| i.uuid.clone())))
                .collect();
            for hold in entry.mig.iter().filter(|h| h.instance.is_none()) {
                destroy_orphans(mig, &entry, hold, &recorded);
            }
            // The kubelet asks again; the retry starts from nothing.
            if let Err(e) = blocking(|| self.storage.checkpoint.forget(&uid)) {
                tracing::error!(claim = %entry.claim, error = %chain(&e), "record of an interrupted MIG prepare not removed");
            }
            let _ = blocking(|| self.storage.specs.remove(uid.as_str()));
        }
        let keys = inner.prepared.values().flat_map(|p| p.mig.iter().map(MigHold::key)).collect();
        mig.settings.owned.replace(keys);
    }

    /// The holds of a re-adopted claim (its record was lost): the instance at each of its
    /// devices' placements.
    pub(super) fn holds_on_cards(&self, devices: &[crate::plugin::claim::ClaimDevice]) -> Vec<MigHold> {
        let (Some(mig), Ok((_, targets))) = (&self.options.mig, self.layout()) else { return Vec::new() };
        devices
            .iter()
            .filter_map(|d| targets.iter().find(|t| t.device == d.device))
            .map(|t| {
                let found = blocking(|| mig.control.instances(&t.card))
                    .unwrap_or_default()
                    .into_iter()
                    .find(|i| i.gi_profile_id == t.profile_id && i.start == t.start);
                MigHold::new(t, found)
            })
            .collect()
    }
}

/// The instance some prepared claim already made for `target`.
fn live_instance(prepared: &BTreeMap<Uid, PreparedClaim>, target: &MigTarget) -> Option<crate::mig::MigInstance> {
    prepared.values().flat_map(|p| &p.mig).find(|h| h.key() == target.key()).and_then(|h| h.instance.clone())
}

/// Destroys the instances at `hold`'s placement that no complete record names.
fn destroy_orphans(mig: &MigPrepare, entry: &PreparedClaim, hold: &MigHold, recorded: &BTreeSet<String>) {
    let listed = match blocking(|| mig.control.instances(&hold.card)) {
        Ok(listed) => listed,
        Err(e) => {
            tracing::error!(claim = %entry.claim, card = %hold.card, error = %chain(&e), "instances of an interrupted MIG prepare not listed; any left stay on the card");
            return;
        }
    };
    for orphan in
        listed.iter().filter(|i| i.gi_profile_id == hold.profile_id && i.start == hold.start && !recorded.contains(&i.uuid))
    {
        match blocking(|| mig.control.destroy(&hold.card, orphan.gi_id, orphan.ci_id)) {
            Ok(()) => {
                tracing::info!(claim = %entry.claim, device = %hold.device, uuid = %orphan.uuid, "destroyed MIG instance of a prepare interrupted before it was recorded")
            }
            Err(e) => {
                tracing::error!(claim = %entry.claim, device = %hold.device, error = %chain(&e), "orphaned MIG instance not destroyed")
            }
        }
    }
}
