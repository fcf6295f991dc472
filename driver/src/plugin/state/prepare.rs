//! Prepare: read the claim, work out its shares and spec, check its pod's containers, stage the
//! files, then admit and commit under the lock; and the answer to the kubelet.

use std::sync::atomic::{AtomicUsize, Ordering};

use cdi_spec::{Kind, QualifiedDeviceId};
use k8s_openapi::api::resource::v1::ResourceClaim;
use vgpu_scheduling::{ObjectName, PublishedDevice};

use super::admission::{Admission, unadmit};
use super::staging::StagedClaim;
use super::{Inner, PreparedDevice, State, Storage};
use crate::plugin::cdi::{build_spec, cdi_device_names, is_admin};
use crate::plugin::claim::{ClaimDevice, ClaimError, ClaimRef, claim_env, consumer, devices_of};
use crate::plugin::containers::{Consumer, top_level_requests, uses_of};
use crate::plugin::error::PrepareError;
use crate::plugin::failpoint::{FailPoint, fail_point};
use crate::plugin::mig::MigTarget;
use crate::plugin::storage::checkpoint::{PreparedClaim, RecordSync};
use crate::plugin::storage::held_spec::HeldSpec;
use crate::plugin::storage::toolkit::toolkit_id;
use crate::plugin::storage::{blocking, off_runtime};

/// One prepare of a new claim counted in [`State::preparing`] while it lives.
struct Preparing<'a>(&'a AtomicUsize);

impl<'a> Preparing<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Preparing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A claim read and worked out, not yet admitted.
struct Built {
    /// Its record as it would be written.
    entry: PreparedClaim,
    /// Its spec, parsed (the record holds it as text).
    spec: cdi_spec::Spec,
    /// The claim as read.
    object: ResourceClaim,
    /// The devices it was worked out against.
    published: Vec<PublishedDevice>,
    /// Its devices that stand for a MIG instance.
    targets: Vec<MigTarget>,
    /// Its HAMi-core settings.
    env: Vec<(String, String)>,
}

impl State {
    /// Prepares one claim; repeating it returns the same answer and restores a lost spec.
    ///
    /// # Errors
    /// [`PrepareError`] for this claim only.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        if let Some(entry) = self.prepared_entry(claim).await? {
            let toolkit = self.toolkit_devices().await;
            return Ok(self.answer(entry, &toolkit, &self.published().unwrap_or_default()));
        }
        let _preparing = Preparing::enter(&self.preparing);
        // The files are made while the claim is read (a create can take a millisecond); a
        // claim refused before staging has them removed unused.
        let stager = self.stager();
        let Built { entry, spec, object, published, targets, env } = match self.entry_for(claim).await {
            Ok(built) => built,
            Err(e) => {
                stager.discard().await;
                return Err(e);
            }
        };
        if !targets.is_empty() {
            // Its spec names instances that do not exist yet: nothing to stage.
            let (checked, toolkit) = tokio::join!(self.check_containers(claim, &object, &entry.devices), stager.discard());
            let entry = PreparedClaim { consumer: checked?, ..entry };
            let entry = self.commit_mig(entry, &spec, &targets, &published, &env).await?;
            self.claims.prepared(claim);
            self.changed();
            return Ok(self.answer(entry, &toolkit, &published));
        }
        // The pod is read while the entry is written (and fsynced, among other prepares); a
        // refused claim's files are removed unseen.
        let sync = RecordSync::for_prepare(self.preparing.load(Ordering::Relaxed).saturating_sub(1));
        let (checked, (toolkit, staged)) =
            tokio::join!(self.check_containers(claim, &object, &entry.devices), stager.stage(&entry, spec, sync));
        let (consumer, staged) = match (checked, staged) {
            (Ok(consumer), Ok(staged)) => (consumer, staged),
            (Err(e), staged) => {
                blocking(|| drop(staged));
                return Err(e);
            }
            (Ok(_), Err(e)) => return Err(e),
        };
        let entry = PreparedClaim { consumer, ..entry };
        fail_point(self.fail_at, FailPoint::PrepareStaged);
        let entry = self.commit(entry, staged, &published).await?;
        self.claims.prepared(claim);
        self.changed();
        Ok(self.answer(entry, &toolkit, &published))
    }

    /// Reads `claim` and works out its shares and spec, with the claim and the devices they
    /// were worked out from.
    async fn entry_for(&self, claim: &ClaimRef) -> Result<Built, PrepareError> {
        let object = self.claims.claim_to_prepare(claim).await?.ok_or_else(|| PrepareError::NotFound(claim.key()))?;
        // The kubelet prepares a claim only for a pod it is reserved for; reserved for no one in
        // a fresh read, its pod is gone and its allocation may be given to another next.
        if self.claims.is_api() && consumer(&object).is_none() && object.metadata.uid.as_deref() == Some(claim.uid.as_str()) {
            return Err(ClaimError::NotReserved(claim.key()).into());
        }
        let (published, targets) = self.layout()?;
        let devices = devices_of(&object, claim, &self.config.driver_name, &self.node, &published)?;
        let env = claim_env(&object, &self.config.driver_name, &claim.key())?;
        let spec = build_spec(&self.storage.cdi, claim, &devices, &published, &env)
            .map_err(|source| PrepareError::Spec { claim: claim.to_string(), source })?;
        // The devices of the claim that stand for an instance, in the claim's order.
        let targets = devices.iter().filter_map(|d| targets.iter().find(|t| t.device == d.device).cloned()).collect();
        let entry = PreparedClaim { claim: claim.clone(), devices, spec: HeldSpec::new(&spec), mig: Vec::new(), consumer: None };
        Ok(Built { entry, spec, object, published, targets, env })
    }

    /// Admits a checked claim under the lock, then makes its staged files visible outside it:
    /// prepares in flight rename their records side by side and share one directory fsync
    /// ([`State::sync_records`]). The claim is marked committing meanwhile, so a second prepare
    /// or an unprepare of it waits, and no sweep takes its directory.
    async fn commit(
        &self,
        entry: PreparedClaim,
        staged: StagedClaim,
        published: &[PublishedDevice],
    ) -> Result<PreparedClaim, PrepareError> {
        let claim = entry.claim.clone();
        let (mut inner, admission) = self.admit_settled(&entry, published).await;
        let (admitted, was_pending) = match admission {
            Ok(Admission::Admitted { keys, was_pending }) => {
                inner.committing.insert(claim.uid.clone());
                drop(inner);
                (keys, was_pending)
            }
            Ok(Admission::Prepared(existing)) => {
                // A concurrent prepare of the same claim got here first.
                drop(inner);
                off_runtime(move || drop(staged)).await;
                return Ok(existing);
            }
            Err(e) => {
                drop(inner);
                off_runtime(move || drop(staged)).await;
                return Err(e);
            }
        };
        fail_point(self.fail_at, FailPoint::PrepareAdmitted);
        // A monitoring claim (admin access) has no HAMi-core, so no directory to discard either.
        let host_dirs = self.options.host_dirs && !is_admin(&entry.devices);
        let written = self.make_visible(&entry, staged, host_dirs).await;
        let mut inner = self.inner.lock().await;
        self.settle(&claim.uid, &mut inner);
        let Inner { ledger, prepared, pending, .. } = &mut *inner;
        if let Err(e) = written {
            let keep_dir = was_pending.is_some();
            unadmit(ledger, pending, published, &admitted, was_pending);
            let Storage { checkpoint, specs, .. } = &self.storage;
            blocking(|| {
                let _ = checkpoint.forget(&claim.uid);
                let _ = specs.remove(claim.uid.as_str());
            });
            // A refused prepare leaves nothing behind, unless a container already uses it.
            if host_dirs && !keep_dir {
                self.discard_dir(&claim.uid);
            }
            return Err(e);
        }
        prepared.insert(claim.uid.clone(), entry.clone());
        self.tell_prepared(&entry);
        Ok(entry)
    }

    /// The record renamed into place and made durable (its fsync if it was not fsynced before
    /// the rename, then the directory fsync shared with the prepares in flight), then the
    /// claim's directory and its spec: a spec is never visible before its record is durable.
    /// Runs without the lock; the claim is marked committing.
    ///
    /// The file work runs on blocking threads ([`off_runtime`]); a prepare runs in its own task,
    /// so it is never dropped between them.
    async fn make_visible(&self, entry: &PreparedClaim, staged: StagedClaim, host_dirs: bool) -> Result<(), PrepareError> {
        let StagedClaim { record, spec } = staged;
        let dir = if host_dirs { self.storage.claim_dir_of(entry) } else { Ok(None) };
        let dir = match dir {
            Ok(dir) => dir,
            Err(e) => {
                off_runtime(move || drop((record, spec))).await;
                return Err(e);
            }
        };
        if let Err(e) = off_runtime(move || record.publish()).await {
            off_runtime(move || drop(spec)).await;
            return Err(e.into());
        }
        if let Err(e) = self.sync_records().await {
            off_runtime(move || drop(spec)).await;
            return Err(e);
        }
        fail_point(self.fail_at, FailPoint::PrepareCheckpointed);
        let fail_at = self.fail_at;
        off_runtime(move || {
            if let Some(dir) = dir {
                dir.make()?;
            }
            spec.commit()?;
            fail_point(fail_at, FailPoint::PrepareSpecWritten);
            Ok(())
        })
        .await
    }

    /// Makes every record renamed or removed so far durable: one fsync of the checkpoint
    /// directory started after the caller arrived, shared by every caller waiting for it (group
    /// commit), on a blocking thread that finishes even if its caller is dropped.
    pub(super) async fn sync_records(&self) -> Result<(), PrepareError> {
        let checkpoint = self.storage.checkpoint.clone();
        let synced = self
            .record_sync
            .get(|| async move { off_runtime(move || checkpoint.sync()).await.map_err(std::sync::Arc::new) })
            .await;
        synced.map_err(|e| {
            PrepareError::Checkpoint(crate::plugin::storage::checkpoint::CheckpointError::Io {
                path: self.storage.checkpoint.dir().to_owned(),
                source: std::io::Error::other(e),
            })
        })
    }

    /// Refuses a claim whose limits would be wrong in one of its pod's containers: HAMi-core's
    /// limits are indexed by the CUDA devices a container sees, the spec is per claim. A container
    /// using two claims of this driver would get index 0 twice (the runtime keeps the last); one
    /// using some of the claim's requests would get the limits of all of them. The pod and its
    /// containers that use the claim, when it is reserved for one.
    async fn check_containers(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
        devices: &[ClaimDevice],
    ) -> Result<Option<Consumer>, PrepareError> {
        let Some((pod_name, pod)) = self.reserved_pod(claim, object).await? else { return Ok(None) };
        let requests = top_level_requests(devices.iter().map(|d| d.request.as_str()));
        let uses = uses_of(&pod, claim.name.as_str());
        for usage in &uses {
            if let Some(named) = &usage.requests
                && requests.len() > 1
                && !requests.iter().all(|r| named.contains(r))
            {
                return Err(ClaimError::PartialClaim {
                    claim: claim.key(),
                    pod: pod_name.to_string(),
                    container: usage.container.clone(),
                    requests: named.iter().cloned().collect(),
                }
                .into());
            }
            for other in &usage.other_claims {
                let Ok(other_name) = ObjectName::new(other.clone()) else { continue };
                let Some(o) = self.claims.claim_by_name(&claim.namespace, &other_name).await? else { continue };
                let ours = o
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .and_then(|a| a.devices.as_ref())
                    .is_some_and(|d| d.results.iter().flatten().any(|r| r.driver == self.config.driver_name.as_str()));
                if ours {
                    return Err(ClaimError::SharedContainer {
                        claim: claim.key(),
                        other: other.clone(),
                        pod: pod_name.to_string(),
                        container: usage.container.clone(),
                    }
                    .into());
                }
            }
        }
        Ok(Some(Consumer::new(pod_name.to_string(), &uses)))
    }

    /// The entry of an already prepared claim, with its spec restored when missing, unreadable
    /// or changed on disk.
    async fn prepared_entry(&self, claim: &ClaimRef) -> Result<Option<PreparedClaim>, PrepareError> {
        // An unprepare of it may be under way without the lock: its outcome is what counts.
        let inner = self.settled(&claim.uid).await;
        let Some(entry) = inner.prepared.get(&claim.uid) else { return Ok(None) };
        if let Some(was) = self.storage.restore_spec(entry, self.options.host_dirs)? {
            tracing::info!(claim = %claim, %was, "rewrote CDI spec of prepared claim (the CDI directory is tmpfs on most hosts)");
        }
        Ok(Some(entry.clone()))
    }

    /// The lookup of the NVIDIA toolkit's device names, to run off the runtime and the lock;
    /// `None` when no toolkit directory is configured.
    pub(super) fn toolkit_lookup(&self) -> Option<impl FnOnce() -> Vec<String> + Send + 'static> {
        let dirs = self.storage.cdi.toolkit_dirs.clone();
        if dirs.is_empty() {
            return None;
        }
        let own = format!("{}_", self.storage.cdi.kind.file_stem());
        let index = self.toolkit.clone();
        Some(move || index.devices(&dirs, &own))
    }

    /// The NVIDIA toolkit's device names, looked up on a blocking thread.
    async fn toolkit_devices(&self) -> Vec<String> {
        match self.toolkit_lookup() {
            // A lookup that failed leaves the toolkit's IDs out, as a node without them.
            Some(lookup) => tokio::task::spawn_blocking(lookup).await.unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// The answer for a prepared entry, with the toolkit's device names `toolkit` and the cards
    /// as `published`.
    fn answer(&self, entry: PreparedClaim, toolkit: &[String], published: &[PublishedDevice]) -> Vec<PreparedDevice> {
        let kind: &Kind = &self.storage.cdi.kind;
        let names = cdi_device_names(&entry.claim, &entry.devices);
        entry
            .devices
            .iter()
            .zip(names)
            .map(|(d, name)| {
                let id = cdi_spec::DeviceName::new(name).map(|name| QualifiedDeviceId { kind: kind.clone(), name }.to_string());
                let card = published.iter().find(|p| p.name == d.device);
                let toolkit_id = card.and_then(|c| toolkit_id(toolkit, &c.uuid, c.index()));
                PreparedDevice {
                    request: d.request.clone(),
                    pool: self.node.clone(),
                    device: d.device.to_string(),
                    cdi_ids: id.into_iter().chain(toolkit_id).collect(),
                    consumed: d.consumption.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
                    share_id: d.share_id.as_ref().map(ToString::to_string),
                }
            })
            .collect()
    }
}
