//! Prepare and unprepare under one lock: the ledger, the checkpoint and the CDI spec files move
//! together. Order of writes makes a crash at any point safe:
//! prepare makes the checkpoint entry visible before the spec (a spec never exists without its
//! entry), unprepare drops the entry before the spec (a left-over spec is an orphan, removed at
//! start).
//!
//! Nothing slow happens under the lock: claims and pods are read from the [`ClaimSource`] before
//! it is taken, the inventory is a snapshot, the NVIDIA toolkit's specs are scanned while the
//! claim is read, and the entry (fsynced) and the spec are written beside their names while the
//! pod is read; under the lock they are only renamed into place. The spec is not fsynced: start-up
//! rebuilds any spec a power loss took from its entry. Start-up and the periodic checks live in
//! [`super::recovery`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdi_spec::{Kind, QualifiedDeviceId, SpecDir, StagedSpec};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::Mutex;
use vgpu_scheduling::{DeviceName, Ledger, ObjectName, PublishedDevice, SharingConfig, Uid, publish};

use super::cdi::{BuildError, CdiOptions, build_spec, cdi_device_names, claim_dir};
use super::checkpoint::{Checkpoint, CheckpointError, PreparedClaim, StagedRecord};
use super::claim::{ClaimDevice, ClaimError, ClaimRef, claim_env, consumer, devices_of};
use super::containers::{top_level_requests, uses_of};
use super::host::{CLAIM_DIR_MODE, HostError, ensure_dir};
use super::source::{ClaimSource, SourceError};
use super::toolkit::ToolkitIndex;
use super::trash::Trash;
use crate::discovery::{DeviceSource, DiscoveryError};

/// An error with its causes, each once (shared with the other roles).
pub(super) use vgpu_scheduling::error_chain as chain;

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

/// Why one claim failed; the kubelet gets the whole chain of causes in that claim's `error`.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The claim breaks a rule (boxed: it names everything involved).
    #[error(transparent)]
    Claim(Box<ClaimError>),
    /// The claim does not exist (any more).
    #[error("claim {0} not found")]
    NotFound(String),
    /// Reading the claim or its pod failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The node-side capacity check refused a share (boxed: it carries every number).
    #[error(transparent)]
    Admit(Box<vgpu_scheduling::AdmitError>),
    /// Discovery has no inventory.
    #[error("discovering GPUs")]
    Discovery(#[source] DiscoveryError),
    /// The claim's spec cannot be expressed.
    #[error("building the CDI spec of claim {claim}")]
    Spec {
        /// The claim.
        claim: String,
        /// Why.
        #[source]
        source: BuildError,
    },
    /// Writing the checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing or removing a CDI spec failed.
    #[error(transparent)]
    SpecFile(#[from] cdi_spec::SpecDirError),
    /// A host directory of the claim could not be made or removed.
    #[error(transparent)]
    Host(#[from] HostError),
}

impl PrepareError {
    /// A short reason for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Claim(_) => "invalid_claim",
            Self::NotFound(_) => "not_found",
            Self::Source(SourceError::Timeout { .. }) => "api_timeout",
            Self::Source(_) => "api",
            Self::Admit(_) => "over_capacity",
            Self::Discovery(_) => "discovery",
            Self::Spec { .. } => "spec",
            Self::Checkpoint(_) | Self::SpecFile(_) | Self::Host(_) => "storage",
        }
    }

    /// The message with every cause, for the kubelet and the log: `writing CDI spec /x: Read-only
    /// file system (os error 30)`.
    pub fn chain(&self) -> String {
        chain(self)
    }
}

impl From<ClaimError> for PrepareError {
    fn from(e: ClaimError) -> Self {
        Self::Claim(Box::new(e))
    }
}

impl From<vgpu_scheduling::AdmitError> for PrepareError {
    fn from(e: vgpu_scheduling::AdmitError) -> Self {
        Self::Admit(Box::new(e))
    }
}

/// Places in prepare and unprepare where a test can make the process die at once, as `kill -9`
/// would, to prove that every interruption recovers (`--fail-point`, hidden; tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailPoint {
    /// Prepare: entry and spec written beside their names, nothing admitted or visible.
    PrepareStaged,
    /// Prepare: shares admitted, nothing persisted.
    PrepareAdmitted,
    /// Prepare: checkpoint written, spec not yet.
    PrepareCheckpointed,
    /// Prepare: spec written, answer not sent.
    PrepareSpecWritten,
    /// Unprepare: checkpoint entry dropped, spec still there.
    UnprepareCheckpointed,
    /// Unprepare: spec removed, claim directory still there.
    UnprepareSpecRemoved,
}

fn fail_point(configured: Option<FailPoint>, here: FailPoint) {
    if configured == Some(here) {
        tracing::error!(?here, "fail point reached; killing this process with SIGKILL");
        // The real thing, not an emulation: no destructor, flush or unwinding runs.
        let _ = std::process::Command::new("kill").arg("-KILL").arg(std::process::id().to_string()).status();
        std::process::abort();
    }
}

/// One prepared share, as the metrics see it.
#[derive(Debug, Clone)]
pub struct ShareUsage {
    /// The claim.
    pub claim: ClaimRef,
    /// The pod (in the claim's namespace) the claim is reserved for, when known.
    pub pod: Option<String>,
    /// The device the share is on.
    pub device: DeviceName,
    /// What the share consumes.
    pub consumption: vgpu_scheduling::Consumption,
}

/// Everything the metrics report, read at once: metrics depend on this, not on the state.
#[derive(Debug, Clone, Default)]
pub struct StateSnapshot {
    /// Devices published now.
    pub published: Vec<PublishedDevice>,
    /// Device -> capacity -> used by prepared claims.
    pub usage: BTreeMap<DeviceName, vgpu_scheduling::Consumption>,
    /// Every prepared share.
    pub shares: Vec<ShareUsage>,
    /// How many claims are prepared.
    pub prepared: usize,
    /// Devices whose prepared shares take more than they have, with the capacity.
    pub overcommitted: Vec<(DeviceName, String)>,
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
}

impl Default for StateOptions {
    fn default() -> Self {
        Self { host_dirs: true, deleted_claim_grace: Duration::from_secs(300), spare_files: 0 }
    }
}

/// Temp files made ahead for the next prepares, and how many are being made.
#[derive(Default)]
pub(super) struct Spares {
    files: Vec<(crate::fsutil::Reserved, cdi_spec::ReservedSpec)>,
    making: usize,
}

/// The plugin's state.
pub struct State {
    pub(super) inner: Mutex<Inner>,
    pub(super) claims: ClaimSource,
    pub(super) source: Arc<dyn DeviceSource>,
    pub(super) config: SharingConfig,
    pub(super) node: String,
    pub(super) fail_at: Option<FailPoint>,
    pub(super) toolkit: Arc<ToolkitIndex>,
    pub(super) options: StateOptions,
    /// Where files go. Fixed paths, so read without the lock (to stage files and scan the
    /// toolkit's specs); what is visible there changes only while the lock is held.
    pub(super) storage: Storage,
    /// Temp files made ahead ([`StateOptions::spare_files`]); invisible to the kubelet and the
    /// runtime, removed when dropped, and by start-up after a crash.
    pub(super) spares: Arc<std::sync::Mutex<Spares>>,
    /// Whether a blocking thread is emptying the claim directories' trash now.
    pub(super) emptying: Arc<std::sync::atomic::AtomicBool>,
}

/// A claim whose spec was found at start without a record while the API could not say whether
/// it still stands: its cards are held whole until it is adopted or known gone.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// The claim, from the spec's annotation.
    pub claim: ClaimRef,
    /// The cards its spec names.
    pub devices: Vec<DeviceName>,
}

pub(super) struct Inner {
    pub ledger: Ledger,
    pub prepared: BTreeMap<Uid, PreparedClaim>,
    pub pending: BTreeMap<Uid, Pending>,
    /// Prepared claims the API says are gone, since when.
    pub gone: BTreeMap<Uid, Instant>,
    pub overcommitted: Vec<(DeviceName, String)>,
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
    pub(super) fn restore_spec(&self, entry: &PreparedClaim, host_dirs: bool) -> Result<Option<String>, PrepareError> {
        let uid = entry.claim.uid.as_str();
        let was = match blocking(|| self.specs.read(uid)) {
            Ok(Some(spec)) if spec == entry.spec => return Ok(None),
            Ok(Some(_)) => "changed on disk".to_owned(),
            Ok(None) => "missing".to_owned(),
            Err(e) => chain(&e),
        };
        let dir = claim_dir(&self.cdi, &entry.claim);
        blocking(|| {
            if host_dirs {
                ensure_dir(&dir, CLAIM_DIR_MODE)?;
            }
            if let Ok(path) = self.specs.file_for(uid)
                && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            {
                let _ = std::fs::remove_dir_all(&path);
            }
            self.specs.write(uid, &entry.spec).map(|_| ()).map_err(PrepareError::from)
        })?;
        Ok(Some(was))
    }
}

/// A claim's checkpoint record (durable) and spec, written beside their names, not yet visible.
struct StagedClaim {
    record: StagedRecord,
    spec: StagedSpec,
}

/// A new claim's first file work, on the blocking thread that looks up the toolkit's device
/// names: the temp files of the claim's record and spec are made while the claim is read.
struct Stager {
    work: tokio::task::JoinHandle<(Vec<String>, ReservedFiles)>,
    storage: (Checkpoint, SpecDir),
}

/// The temp files of a claim's record and spec.
type ReservedFiles = (Result<crate::fsutil::Reserved, CheckpointError>, Result<cdi_spec::ReservedSpec, cdi_spec::SpecDirError>);

impl Stager {
    /// Writes `entry`'s checkpoint record (fsynced) and spec into the files made for them, off
    /// the runtime; with the toolkit's device names.
    async fn stage(self, entry: &PreparedClaim) -> (Vec<String>, Result<StagedClaim, PrepareError>) {
        let (toolkit, (record, spec)) = joined(self.work.await);
        let (checkpoint, specs) = self.storage;
        let entry = entry.clone();
        let staging = tokio::task::spawn_blocking(move || {
            // A failed reservation drops the other one here, off the runtime.
            let (record, spec) = (record?, spec?);
            let record = checkpoint.stage_in(record, &entry)?;
            let spec = specs.stage_in(spec, entry.claim.uid.as_str(), &entry.spec)?;
            Ok(StagedClaim { record, spec })
        });
        (toolkit, joined(staging.await))
    }

    /// Waits for the files and removes them unused.
    async fn discard(self) {
        let work = joined(self.work.await);
        blocking(|| drop(work));
    }
}

/// The spare files; a panic while they were held cannot leave them half-updated (one push, pop
/// or counter change at a time).
fn lock_spares(spares: &std::sync::Mutex<Spares>) -> std::sync::MutexGuard<'_, Spares> {
    spares.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The output of a finished blocking task; its panic goes on in the caller.
fn joined<T>(result: Result<T, tokio::task::JoinError>) -> T {
    result.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// The request name of a pending claim's placeholder share in the ledger.
pub(super) const PENDING_REQUEST: &str = "(pending adoption)";

impl State {
    /// Makes the process abort at `point` (tests of crash recovery).
    #[must_use]
    pub fn with_fail_point(mut self, point: Option<FailPoint>) -> Self {
        self.fail_at = point;
        self
    }

    /// The devices this node publishes now (the inventory snapshot; no I/O for the daemon).
    ///
    /// # Errors
    /// When discovery has no inventory.
    pub fn published(&self) -> Result<Vec<PublishedDevice>, PrepareError> {
        let inventory = self.source.inventory().map_err(PrepareError::Discovery)?;
        Ok(publish(&inventory, &self.config))
    }

    /// Prepares one claim; repeating it returns the same answer and restores a lost spec.
    ///
    /// # Errors
    /// [`PrepareError`] for this claim only.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        if let Some(entry) = self.prepared_entry(claim).await? {
            let toolkit = self.toolkit_devices().await;
            return Ok(self.answer(entry, &toolkit, &self.published().unwrap_or_default()));
        }
        // The files are made while the claim is read (a create can take a millisecond); a
        // claim refused before staging has them removed unused.
        let stager = self.stager();
        let (entry, object, published) = match self.entry_for(claim).await {
            Ok(built) => built,
            Err(e) => {
                stager.discard().await;
                return Err(e);
            }
        };
        // The pod is read while the entry is written and fsynced (each about a millisecond); a
        // refused claim's files are removed unseen.
        let (checked, (toolkit, staged)) =
            tokio::join!(self.check_containers(claim, &object, &entry.devices), stager.stage(&entry));
        let staged = match (checked, staged) {
            (Ok(()), Ok(staged)) => staged,
            (Err(e), staged) => {
                blocking(|| drop(staged));
                return Err(e);
            }
            (Ok(()), Err(e)) => return Err(e),
        };
        fail_point(self.fail_at, FailPoint::PrepareStaged);
        let entry = self.commit(entry, staged, &published).await?;
        Ok(self.answer(entry, &toolkit, &published))
    }

    /// Reads `claim` and works out its shares and spec, with the claim and the devices they
    /// were worked out from.
    async fn entry_for(&self, claim: &ClaimRef) -> Result<(PreparedClaim, ResourceClaim, Vec<PublishedDevice>), PrepareError> {
        let object = self.claims.claim_to_prepare(claim).await?.ok_or_else(|| PrepareError::NotFound(claim.key()))?;
        // The kubelet prepares a claim only for a pod it is reserved for; reserved for no one in
        // a fresh read, its pod is gone and its allocation may be given to another next.
        if self.claims.is_api() && consumer(&object).is_none() && object.metadata.uid.as_deref() == Some(claim.uid.as_str()) {
            return Err(ClaimError::NotReserved(claim.key()).into());
        }
        let published = self.published()?;
        let devices = devices_of(&object, claim, &self.config.driver_name, &self.node, &published)?;
        let env = claim_env(&object, &self.config.driver_name, &claim.key())?;
        let spec = build_spec(&self.storage.cdi, claim, &devices, &published, &env)
            .map_err(|source| PrepareError::Spec { claim: claim.to_string(), source })?;
        Ok((PreparedClaim { claim: claim.clone(), devices, spec }, object, published))
    }

    /// Starts a new claim's [`Stager`], with spare files when there are some.
    fn stager(&self) -> Stager {
        let storage = (self.storage.checkpoint.clone(), self.storage.specs.clone());
        let (checkpoint, specs) = storage.clone();
        let toolkit = self.toolkit_lookup();
        let spare = lock_spares(&self.spares).files.pop();
        let work = tokio::task::spawn_blocking(move || {
            let toolkit = toolkit.map(|lookup| lookup()).unwrap_or_default();
            let files = match spare {
                Some((record, spec)) if record.still_there() && spec.still_there() => (Ok(record), Ok(spec)),
                // None, or a spare whose directory was emptied (dropped: what is left is removed).
                _ => (checkpoint.reserve(), specs.reserve()),
            };
            (toolkit, files)
        });
        self.make_spares();
        Stager { work, storage }
    }

    /// Makes temp files for the next prepares on blocking threads, up to
    /// [`StateOptions::spare_files`]; no prepare waits for them.
    pub(super) fn make_spares(&self) {
        let mut spares = lock_spares(&self.spares);
        let missing = self.options.spare_files.saturating_sub(spares.files.len() + spares.making);
        spares.making += missing;
        drop(spares);
        for _ in 0..missing {
            let (checkpoint, specs, pool) = (self.storage.checkpoint.clone(), self.storage.specs.clone(), self.spares.clone());
            tokio::task::spawn_blocking(move || {
                let made = (checkpoint.reserve(), specs.reserve());
                let mut spares = lock_spares(&pool);
                spares.making -= 1;
                match made {
                    (Ok(record), Ok(spec)) => spares.files.push((record, spec)),
                    (record, spec) => {
                        drop(spares);
                        if let Err(e) = &record {
                            tracing::debug!(error = %chain(e), "no spare record file; prepares make their own");
                        }
                        if let Err(e) = &spec {
                            tracing::debug!(error = %chain(e), "no spare spec file; prepares make their own");
                        }
                    }
                }
            });
        }
    }

    /// Admits a checked claim and makes its staged files visible, under the lock.
    async fn commit(
        &self,
        entry: PreparedClaim,
        staged: StagedClaim,
        published: &[PublishedDevice],
    ) -> Result<PreparedClaim, PrepareError> {
        let mut inner = self.inner.lock().await;
        let Inner { ledger, prepared, pending, .. } = &mut *inner;
        let Storage { checkpoint, specs, cdi } = &self.storage;
        let claim = &entry.claim;
        if let Some(existing) = prepared.get(&claim.uid) {
            // A concurrent prepare of the same claim got here first.
            let existing = existing.clone();
            blocking(|| drop(staged));
            return Ok(existing);
        }
        ledger.set_capacity(capacities(published));
        // A claim held whole since start-up is being prepared with its real shares now.
        let was_pending = pending.remove(&claim.uid);
        if was_pending.is_some() {
            ledger.release_claim(&claim.uid);
        }
        let mut admitted = Vec::new();
        for d in &entry.devices {
            if let Err(e) = ledger.admit(d.key(&claim.uid), d.consumption.clone()) {
                admitted.iter().for_each(|k| {
                    ledger.release(k);
                });
                restore_pending(ledger, pending, published, was_pending);
                blocking(|| drop(staged));
                return Err(e.into());
            }
            admitted.push(d.key(&claim.uid));
        }
        fail_point(self.fail_at, FailPoint::PrepareAdmitted);
        let dir = claim_dir(cdi, claim);
        let host_dirs = self.options.host_dirs;
        let written = blocking(|| {
            let StagedClaim { record, spec } = staged;
            record.commit()?;
            fail_point(self.fail_at, FailPoint::PrepareCheckpointed);
            if host_dirs {
                ensure_dir(&dir, CLAIM_DIR_MODE)?;
            }
            spec.commit()?;
            fail_point(self.fail_at, FailPoint::PrepareSpecWritten);
            Ok::<_, PrepareError>(())
        });
        if let Err(e) = written {
            admitted.iter().for_each(|k| {
                ledger.release(k);
            });
            let keep_dir = was_pending.is_some();
            restore_pending(ledger, pending, published, was_pending);
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
        Ok(entry)
    }

    /// Refuses a claim whose limits would be wrong in one of its pod's containers: HAMi-core's
    /// limits are indexed by the CUDA devices a container sees, the spec is per claim. A container
    /// using two claims of this driver would get index 0 twice (the runtime keeps the last); one
    /// using some of the claim's requests would get the limits of all of them.
    async fn check_containers(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
        devices: &[ClaimDevice],
    ) -> Result<(), PrepareError> {
        let Some((pod_name, pod_uid)) = consumer(object) else { return Ok(()) };
        let Ok(pod_name) = ObjectName::new(pod_name) else { return Ok(()) };
        let Some(pod) = self.claims.pod(&claim.namespace, &pod_name, pod_uid.as_str()).await? else { return Ok(()) };
        if pod.metadata.uid.as_deref() != Some(pod_uid.as_str()) {
            return Ok(());
        }
        let requests = top_level_requests(devices.iter().map(|d| d.request.as_str()));
        for usage in uses_of(&pod, claim.name.as_str()) {
            if let Some(named) = &usage.requests
                && requests.len() > 1
                && !requests.iter().all(|r| named.contains(r))
            {
                return Err(ClaimError::PartialClaim {
                    claim: claim.key(),
                    pod: pod_name.to_string(),
                    container: usage.container,
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
                        container: usage.container,
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// The entry of an already prepared claim, with its spec restored when missing, unreadable
    /// or changed on disk.
    async fn prepared_entry(&self, claim: &ClaimRef) -> Result<Option<PreparedClaim>, PrepareError> {
        let inner = self.inner.lock().await;
        let Some(entry) = inner.prepared.get(&claim.uid) else { return Ok(None) };
        if let Some(was) = self.storage.restore_spec(entry, self.options.host_dirs)? {
            tracing::info!(claim = %claim, %was, "rewrote CDI spec of prepared claim (the CDI directory is tmpfs on most hosts)");
        }
        Ok(Some(entry.clone()))
    }

    /// The lookup of the NVIDIA toolkit's device names, to run off the runtime and the lock;
    /// `None` when no toolkit directory is configured.
    fn toolkit_lookup(&self) -> Option<impl FnOnce() -> Vec<String> + Send + 'static> {
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
                let toolkit_id = card.and_then(|c| {
                    let index = match c.attributes.get("index") {
                        Some(vgpu_scheduling::Attribute::Int(i)) => u32::try_from(*i).unwrap_or(c.minor),
                        _ => c.minor,
                    };
                    super::toolkit::toolkit_id(toolkit, &c.uuid, index)
                });
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

    /// Unprepares one claim; unknown claims succeed.
    ///
    /// # Errors
    /// When the checkpoint or spec cannot be written (the kubelet retries).
    pub async fn unprepare(&self, uid: &Uid) -> Result<(), PrepareError> {
        let mut inner = self.inner.lock().await;
        let Inner { ledger, prepared, pending, gone, .. } = &mut *inner;
        let Storage { checkpoint, specs, .. } = &self.storage;
        if let Some(entry) = prepared.remove(uid) {
            if let Err(e) = blocking(|| checkpoint.forget(uid)) {
                prepared.insert(uid.clone(), entry);
                return Err(e.into());
            }
            ledger.release_claim(uid);
            fail_point(self.fail_at, FailPoint::UnprepareCheckpointed);
        }
        if pending.remove(uid).is_some() {
            ledger.release_claim(uid);
        }
        gone.remove(uid);
        self.claims.forget(uid);
        if blocking(|| specs.remove(uid.as_str()))? {
            fail_point(self.fail_at, FailPoint::UnprepareSpecRemoved);
        }
        // Under the lock: a prepare of the same claim right after makes its directory anew.
        self.discard_dir(uid);
        drop(inner);
        Ok(())
    }

    /// Moves the directory of claim `uid` into the trash (one rename, whatever a container left
    /// in it) and has the trash emptied in the background: an unprepare never waits on what a
    /// tenant wrote. A directory that cannot be moved is logged and left to the periodic sweep.
    /// Called with the lock held, so that it never takes the directory of a prepare after it.
    pub(super) fn discard_dir(&self, uid: &Uid) {
        let dir = self.storage.cdi.claims_root.join(uid.as_str());
        match blocking(|| self.trash().discard(&dir)) {
            Ok(true) => self.empty_trash(),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(claim = %uid, path = %dir.display(), error = %e, "claim directory not moved to the trash; the periodic check retries");
            }
        }
    }

    /// The trash of the claim directories.
    pub(super) fn trash(&self) -> Trash {
        Trash::new(&self.storage.cdi.claims_root)
    }

    /// Empties the trash on a blocking thread, unless one is at it already; what cannot be
    /// removed now is logged and tried again by the periodic check.
    pub(super) fn empty_trash(&self) {
        use std::sync::atomic::Ordering;
        if self.emptying.swap(true, Ordering::AcqRel) {
            return;
        }
        let (trash, emptying) = (self.trash(), self.emptying.clone());
        let work = move || {
            // Reset even if the walk panics, so the next check tries again.
            struct Done(Arc<std::sync::atomic::AtomicBool>);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                }
            }
            let _done = Done(emptying);
            let emptied = trash.empty(super::trash::DEFAULT_BUDGET);
            if emptied.left > 0 {
                tracing::warn!(trash = %trash.dir().display(), left = emptied.left, error = emptied.error.as_deref().unwrap_or("a budget of file operations spent"), "claim directories not all removed yet; retried by the next check");
            } else if emptied.removed > 0 {
                tracing::debug!(removed = emptied.removed, "claim directories removed");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(work)),
            Err(_) => work(),
        }
    }

    /// Everything the metrics report, read at once.
    pub async fn snapshot(&self) -> StateSnapshot {
        let (usage, prepared, overcommitted) = {
            let inner = self.inner.lock().await;
            let devices: std::collections::BTreeSet<DeviceName> = inner.ledger.shares().map(|(k, _)| k.device.clone()).collect();
            let usage = devices.into_iter().map(|d| (d.clone(), inner.ledger.used(&d))).collect();
            (usage, inner.prepared.values().cloned().collect::<Vec<_>>(), inner.overcommitted.clone())
        };
        let shares = prepared
            .iter()
            .flat_map(|p| {
                // The pod from the claims last read only: metrics never call the API.
                let pod = self.claims.cached(&p.claim).as_deref().and_then(consumer).map(|(name, _)| name);
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

    /// How many claims are prepared.
    pub async fn prepared_count(&self) -> usize {
        self.inner.lock().await.prepared.len()
    }
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

/// Runs small synchronous file work (fsync included) without stalling the runtime's other tasks.
pub(super) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
