//! Prepare and unprepare: the ledger, the checkpoint and the CDI spec files move together. Order
//! of writes makes a crash at any point safe: prepare makes the checkpoint entry durable before
//! the spec is visible (a spec never exists without its entry), unprepare drops the entry before
//! the spec (a left-over spec is an orphan, removed at start).
//!
//! Nothing slow happens under the lock: claims and pods are read from the [`ClaimSource`] before
//! it is taken, the inventory is a snapshot, the NVIDIA toolkit's specs are scanned while the
//! claim is read, and the entry and the spec are written beside their names while the pod is
//! read (the entry fsynced there when other prepares are in flight, so the fsyncs overlap).
//! Under the lock a prepare only admits the claim's shares in the ledger and marks it
//! committing; then, without the lock, it renames its entry into place (fsyncing it after the
//! rename when it was alone: one journal commit instead of two), waits for the checkpoint
//! directory's fsync, which the prepares in flight share (group commit), and renames its spec;
//! under the lock again the claim becomes prepared, or its shares are given back. A
//! claim being committed is waited for by a second prepare or an unprepare of it and left alone
//! by the sweeps. The spec is not fsynced: start-up rebuilds any spec a power loss took from its
//! entry. An unprepare is the mirror image: the claim is marked committing under the lock, its
//! entry removed and the directory's fsync shared with the others in flight, its spec and
//! directory removed, and under the lock again its shares released. Start-up and the periodic
//! checks live in `recovery`.
//!
//! The one exception is dynamic MIG (`mig_steps`): a claim on a device that stands for a MIG
//! instance has its instance made (or destroyed, at its last unprepare) under the lock, so
//! that the card and the records move together; only such claims drive the card.

mod admission;
mod mig_steps;
mod prepare;
mod recovery;
mod staging;
mod unprepare;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdi_spec::SpecDir;
use tokio::sync::Mutex;
use vgpu_scheduling::{DeviceName, Ledger, PublishedDevice, SharingConfig, Uid, publish};

use super::api::ClaimSource;
use super::api::status::StatusWriter;
use super::cdi::{CdiOptions, claim_dir, is_admin, region_file};
use super::claim::{ClaimRef, consumer};
use super::containers::Consumer;
use super::device_status::device_statuses;
use super::error::chain;
use super::mig::{MigPrepare, MigTarget};
use super::storage::blocking;
use super::storage::checkpoint::{Checkpoint, CheckpointError, PreparedClaim};
use super::storage::host::ensure_claim_dir;
use super::storage::spares::Spares;
use super::storage::toolkit::ToolkitIndex;
use crate::coalesce::Coalesced;
use crate::discovery::DeviceSource;

pub use super::error::PrepareError;
pub use super::failpoint::FailPoint;
pub use super::report::{ShareUsage, StateSnapshot};

/// One device of a prepare answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's request.
    pub request: String,
    /// The pool (node name).
    pub pool: String,
    /// The device.
    pub device: String,
    /// CDI IDs for the runtime.
    pub cdi_ids: Vec<String>,
    /// Share ID.
    pub share_id: Option<String>,
    /// What the share consumes, for the log line: `memory=4Gi,cores=50,shares=1`.
    pub consumed: String,
}

/// Where the state keeps what it writes: the checkpoint, the CDI specs and the host side.
#[derive(Debug, Clone)]
pub struct Storage {
    /// The checkpoint directory.
    pub checkpoint: Checkpoint,
    /// What goes into specs and where HAMi-core's host files live.
    pub cdi: CdiOptions,
    /// The CDI spec directory.
    pub specs: SpecDir,
}

/// Settings of the state beyond its parts.
#[derive(Debug, Clone)]
pub struct StateOptions {
    /// Create the claims' host directories (off for `prepare-preview`, which touches nothing).
    pub host_dirs: bool,
    /// How long a prepared claim must be gone from the API before its share is released.
    pub deleted_claim_grace: Duration,
    /// Temp files for this many claims' records and specs made ahead, between prepares: a new
    /// file can take a millisecond on a disk with many recent deletes (ext4 without a journal),
    /// and a prepare whose claim was read ahead has no API read to make them beside. 0: each
    /// prepare makes its own while it reads its claim.
    pub spare_files: usize,
    /// Dynamic MIG: how instances are made for the devices that stand for them (none: no card
    /// offers dynamic MIG).
    pub mig: Option<MigPrepare>,
}

impl Default for StateOptions {
    fn default() -> Self {
        Self { host_dirs: true, deleted_claim_grace: Duration::from_secs(300), spare_files: 0, mig: None }
    }
}

/// The plugin's state.
pub struct State {
    inner: Mutex<Inner>,
    claims: ClaimSource,
    source: Arc<dyn DeviceSource>,
    config: SharingConfig,
    node: String,
    fail_at: Option<FailPoint>,
    toolkit: Arc<ToolkitIndex>,
    options: StateOptions,
    /// Where files go. Fixed paths, so read without the lock (to stage files and scan the
    /// toolkit's specs); what is visible there changes only while the lock is held.
    storage: Storage,
    /// Temp files made ahead ([`StateOptions::spare_files`]); invisible to the kubelet and the
    /// runtime, removed when dropped, and by start-up after a crash.
    spares: Arc<std::sync::Mutex<Spares>>,
    /// Whether a blocking thread is emptying the claim directories' trash now.
    emptying: Arc<std::sync::atomic::AtomicBool>,
    /// Where prepared claims' `status.devices` are written (none: not written).
    status: Option<StatusWriter>,
    /// Woken whenever a claim leaves [`Inner::committing`].
    committed: tokio::sync::Notify,
    /// The checkpoint directory's fsync, shared by the prepares and unprepares in flight (group
    /// commit).
    record_sync: Coalesced<Result<(), Arc<CheckpointError>>>,
    /// Counts the claims prepared and unprepared, for whoever acts after a burst of them.
    changes: tokio::sync::watch::Sender<u64>,
    /// Prepares of new claims under way: how a prepare orders its record's fsync
    /// ([`crate::plugin::storage::checkpoint::RecordSync::for_prepare`]).
    preparing: std::sync::atomic::AtomicUsize,
}

/// A claim whose spec was found at start without a record while the API could not say whether
/// it still stands: its cards are held whole until it is adopted or known gone.
#[derive(Debug, Clone)]
struct Pending {
    /// The claim, from the spec's annotation.
    pub claim: ClaimRef,
    /// The cards its spec names.
    pub devices: Vec<DeviceName>,
}

struct Inner {
    pub ledger: Ledger,
    pub prepared: BTreeMap<Uid, PreparedClaim>,
    pub pending: BTreeMap<Uid, Pending>,
    /// Prepared claims the API says are gone, since when.
    pub gone: BTreeMap<Uid, Instant>,
    pub overcommitted: Vec<(DeviceName, String)>,
    /// Claims whose files are being made visible (a prepare, admitted) or removed (an
    /// unprepare, still prepared) outside the lock: not to be prepared, unprepared, repaired or
    /// swept by anyone else until they leave.
    pub committing: BTreeSet<Uid>,
}

impl Storage {
    /// Makes a prepared claim's spec on disk equal to its record, and its directory exist: the
    /// spec is rewritten when missing, unreadable or changed (whatever sits under its name makes
    /// way). `None` when it was right; after a rewrite, what was wrong.
    ///
    /// Called with the state's lock held.
    ///
    /// # Errors
    /// When the directory or the spec cannot be written.
    fn restore_spec(&self, entry: &PreparedClaim, host_dirs: bool) -> Result<Option<String>, PrepareError> {
        let uid = entry.claim.uid.as_str();
        let was = match blocking(|| self.specs.read(uid)) {
            Ok(Some(spec)) if entry.spec.is(&spec) => return Ok(None),
            Ok(Some(_)) => "changed on disk".to_owned(),
            Ok(None) => "missing".to_owned(),
            Err(e) => chain(&e),
        };
        blocking(|| {
            if host_dirs {
                self.make_claim_dir(entry)?;
            }
            if let Ok(path) = self.specs.file_for(uid)
                && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            {
                let _ = std::fs::remove_dir_all(&path);
            }
            // The whole spec is in the claim's record; it is written back only if it is the
            // spec the claim was prepared with.
            let spec = self.checkpoint.spec_of(entry)?;
            self.specs.write(uid, &spec).map(|_| ()).map_err(PrepareError::from)
        })?;
        Ok(Some(was))
    }
}

impl Storage {
    /// Makes a prepared claim's host directory with the empty region file its containers
    /// initialise; a monitoring claim (admin access) has no HAMi-core, so none.
    ///
    /// # Errors
    /// [`PrepareError::Host`] naming the path.
    fn make_claim_dir(&self, entry: &PreparedClaim) -> Result<(), PrepareError> {
        self.claim_dir_of(entry)?.map_or(Ok(()), ClaimDir::make)
    }

    /// Where [`Storage::make_claim_dir`] makes `entry`'s directory, and its region file; none
    /// for a monitoring claim.
    ///
    /// # Errors
    /// [`PrepareError::HeldSpec`] when the held env does not read back (a bug).
    fn claim_dir_of(&self, entry: &PreparedClaim) -> Result<Option<ClaimDir>, PrepareError> {
        if is_admin(&entry.devices) {
            return Ok(None);
        }
        let region = region_file(&entry.spec.env()?);
        Ok(Some(ClaimDir { path: claim_dir(&self.cdi, &entry.claim), region }))
    }
}

/// A prepared claim's host directory and the region file in it, to be made.
struct ClaimDir {
    path: std::path::PathBuf,
    region: Option<String>,
}

impl ClaimDir {
    /// Makes the directory and its empty region file.
    ///
    /// # Errors
    /// [`PrepareError::Host`] naming the path.
    fn make(self) -> Result<(), PrepareError> {
        Ok(ensure_claim_dir(&self.path, self.region.as_deref())?)
    }
}

impl State {
    /// Makes the process abort at `point` (tests of crash recovery).
    #[must_use]
    pub fn with_fail_point(mut self, point: Option<FailPoint>) -> Self {
        self.fail_at = point;
        self
    }

    /// Writes each prepared claim's `status.devices` through `writer` (none: not at all) from now
    /// on, starting with every claim prepared now: a crash between a prepare and its write leaves
    /// nothing unsaid.
    #[must_use]
    pub fn with_claim_status(mut self, writer: Option<StatusWriter>) -> Self {
        if let Some(writer) = &writer {
            for entry in self.inner.get_mut().prepared.values() {
                writer.set(&entry.claim, device_statuses(entry, self.config.driver_name.as_str(), &self.node));
            }
        }
        self.status = writer;
        self
    }

    /// Asks for a claim just prepared (or re-adopted) to say in its status what its spec gives.
    fn tell_prepared(&self, entry: &PreparedClaim) {
        if let Some(writer) = &self.status {
            writer.set(&entry.claim, device_statuses(entry, self.config.driver_name.as_str(), &self.node));
        }
    }

    /// Asks for an unprepared claim's entries to leave its status.
    fn tell_unprepared(&self, claim: &ClaimRef) {
        if let Some(writer) = &self.status {
            writer.clear(claim);
        }
    }

    /// The devices this node publishes now (the inventory snapshot; no I/O for the daemon).
    ///
    /// # Errors
    /// When discovery has no inventory.
    pub fn published(&self) -> Result<Vec<PublishedDevice>, PrepareError> {
        Ok(self.layout()?.0)
    }

    /// The devices this node publishes now, dynamic MIG's placement devices included, and those
    /// that stand for a MIG instance, from one inventory snapshot.
    ///
    /// # Errors
    /// When discovery has no inventory.
    pub(super) fn layout(&self) -> Result<(Vec<PublishedDevice>, Vec<MigTarget>), PrepareError> {
        let inventory = self.source.inventory().map_err(PrepareError::Discovery)?;
        Ok(match &self.options.mig {
            Some(mig) => blocking(|| mig.layout(&inventory, &self.config)),
            None => (publish(&inventory, &self.config), Vec::new()),
        })
    }

    /// The lock, once no prepare or unprepare is committing claim `uid`: what a prepare or an
    /// unprepare of it must see before acting on it.
    async fn settled(&self, uid: &Uid) -> tokio::sync::MutexGuard<'_, Inner> {
        loop {
            let inner = self.inner.lock().await;
            if !inner.committing.contains(uid) {
                return inner;
            }
            self.until_a_commit_ends(inner).await;
        }
    }

    /// Lets the lock go and waits until a claim leaves [`Inner::committing`].
    async fn until_a_commit_ends(&self, inner: tokio::sync::MutexGuard<'_, Inner>) {
        // Registered before the lock is let go, so the wake-up cannot be missed.
        let woken = self.committed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        drop(inner);
        woken.await;
    }

    /// Told of every claim prepared or unprepared from now on (a count).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Counts one claim prepared or unprepared.
    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Everything the metrics report, read at once.
    pub async fn snapshot(&self) -> StateSnapshot {
        let (usage, prepared, overcommitted) = {
            let inner = self.inner.lock().await;
            let devices: std::collections::BTreeSet<DeviceName> = inner.ledger.share_keys().map(|k| k.device.clone()).collect();
            let usage = devices.into_iter().map(|d| (d.clone(), inner.ledger.used(&d))).collect();
            (usage, inner.prepared.values().cloned().collect::<Vec<_>>(), inner.overcommitted.clone())
        };
        let shares = prepared
            .iter()
            .flat_map(|p| {
                // The pod as read at prepare: metrics never call the API.
                let pod = p.consumer.as_ref().map(|c| c.pod.clone());
                p.devices.iter().map(move |d| ShareUsage {
                    claim: p.claim.clone(),
                    pod: pod.clone(),
                    device: d.device.clone(),
                    consumption: d.consumption.clone(),
                })
            })
            .collect();
        StateSnapshot { published: self.published().unwrap_or_default(), usage, shares, prepared: prepared.len(), overcommitted }
    }

    /// `f` of every prepared claim's record, under the lock: the node monitor takes only what it
    /// needs instead of a copy of every record.
    pub async fn each_prepared<T>(&self, f: impl FnMut(&PreparedClaim) -> Option<T>) -> Vec<T> {
        self.inner.lock().await.prepared.values().filter_map(f).collect()
    }

    /// The pod a claim is reserved for and the names of its containers that use it: as read at
    /// its prepare, else (a claim prepared before a restart) the claim and its pod read now and
    /// kept in its record for the metrics. `None` when the claim has no pod or the pod is not
    /// the one it names.
    ///
    /// # Errors
    /// When the API does not answer in time.
    pub async fn consumer_of(&self, claim: &ClaimRef) -> Result<Option<(String, Vec<String>)>, PrepareError> {
        let known = self.inner.lock().await.prepared.get(&claim.uid).and_then(|p| p.consumer.clone());
        if let Some(c) = known {
            return Ok(Some((c.pod, c.containers)));
        }
        let Some(object) = self.claims.claim(claim).await? else { return Ok(None) };
        let Some((pod_name, pod)) = self.reserved_pod(claim, &object).await? else { return Ok(None) };
        let found = Consumer::new(pod_name.to_string(), &super::containers::uses_of(&pod, claim.name.as_str()));
        if let Some(entry) = self.inner.lock().await.prepared.get_mut(&claim.uid) {
            entry.consumer = Some(found.clone());
        }
        Ok(Some((found.pod, found.containers)))
    }

    /// The pod `object` (the claim `claim`) is reserved for, with its name, when it still is that
    /// pod (same UID); read ahead, else from the API server's cache.
    ///
    /// # Errors
    /// When the API does not answer in time.
    async fn reserved_pod(
        &self,
        claim: &ClaimRef,
        object: &k8s_openapi::api::resource::v1::ResourceClaim,
    ) -> Result<Option<(vgpu_scheduling::ObjectName, k8s_openapi::api::core::v1::Pod)>, PrepareError> {
        let Some((pod_name, pod_uid)) = consumer(object) else { return Ok(None) };
        let Ok(name) = vgpu_scheduling::ObjectName::new(pod_name) else { return Ok(None) };
        let Some(pod) = self.claims.pod(&claim.namespace, &name, &pod_uid).await? else { return Ok(None) };
        Ok((pod.metadata.uid.as_deref() == Some(pod_uid.as_str())).then_some((name, pod)))
    }

    /// How many claims are prepared.
    pub async fn prepared_count(&self) -> usize {
        self.inner.lock().await.prepared.len()
    }
}

#[cfg(test)]
mod tests;
