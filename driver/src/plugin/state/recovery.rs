//! Start-up and the periodic checks of the plugin's state: what is on disk is made to agree with
//! the checkpoint and, where the checkpoint lost something, with the API.
//!
//! Rules, whatever the disk or the API does:
//! - start-up never fails for one claim: an unreadable record, a garbled spec, a read-only CDI
//!   directory or a FIFO in a directory is reported and retried, never a reason to exit;
//! - state is deleted only when it is known to be dead: a spec without a record after an
//!   interrupted unprepare, or a claim the API says is gone (or has a new UID) for longer than
//!   the grace period; an API error deletes nothing;
//! - a prepared claim always counts in the ledger, even past its card's capacity after a restart
//!   with a smaller configuration; such a card admits nothing new and is reported.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdi_spec::Durability;
use tokio_util::sync::CancellationToken;
use vgpu_scheduling::{DeviceName, Ledger, PublishedDevice, SharingConfig, Uid};

use super::admission::{capacities, hold_whole};
use super::{Inner, Pending, State, StateOptions, Storage};
use crate::discovery::DeviceSource;
use crate::plugin::api::ClaimSource;
use crate::plugin::cdi::ANNOTATION_CLAIM;
use crate::plugin::claim::{ClaimRef, devices_of};
use crate::plugin::error::chain;
use crate::plugin::storage::blocking;
use crate::plugin::storage::checkpoint::Recorded;
use crate::plugin::storage::toolkit::ToolkitIndex;

/// How long start-up waits for the first inventory before going on without one.
const FIRST_INVENTORY_WAIT: Duration = Duration::from_secs(30);

/// What the API says of a claim found on disk.
enum Verdict {
    /// It stands, allocated here: these are its shares.
    Alive(Box<Recorded>),
    /// The API says it is gone, has a new UID, or is no longer allocated here.
    Gone(String),
    /// No answer: keep everything and ask again later.
    Unknown(String),
}

impl State {
    /// Loads the checkpoint, re-adopts claims whose record was lost, removes specs of claims
    /// that are not prepared, rewrites missing or garbled specs and rebuilds the ledger.
    ///
    /// # Errors
    /// Never for one claim; only when the checkpoint directory exists and cannot be listed.
    pub async fn recover(
        claims: ClaimSource,
        source: Arc<dyn DeviceSource>,
        config: SharingConfig,
        node: String,
        storage: Storage,
        options: StateOptions,
    ) -> anyhow::Result<Self> {
        // Start-up rewrites every missing or garbled spec from its record (below, and each
        // repeated prepare does too), so a spec needs no fsync of its own: the record's is enough.
        let storage = Storage { specs: storage.specs.with_durability(Durability::Rebuildable), ..storage };
        let loaded = blocking(|| storage.checkpoint.load())?;
        for (e, aside) in &loaded.corrupt {
            tracing::error!(error = %chain(e), moved_to = ?aside, "checkpoint corrupt: record moved aside; the claim is re-adopted from its CDI spec and the API");
        }
        for path in &loaded.cut_short {
            tracing::warn!(path = %path.display(), "empty checkpoint record removed: a prepare cut short by a power loss before it was answered; the kubelet prepares the claim again");
        }
        for (path, why) in &loaded.ignored {
            tracing::warn!(path = %path.display(), reason = %why, "checkpoint directory entry skipped");
        }
        let state = Self {
            inner: tokio::sync::Mutex::new(Inner {
                ledger: Ledger::default(),
                prepared: loaded.claims.clone(),
                pending: BTreeMap::new(),
                gone: BTreeMap::new(),
                overcommitted: Vec::new(),
                committing: std::collections::BTreeSet::new(),
            }),
            claims,
            source,
            config,
            node,
            fail_at: None,
            toolkit: Arc::new(ToolkitIndex::default()),
            spares: Arc::default(),
            emptying: Arc::default(),
            status: None,
            committed: tokio::sync::Notify::new(),
            record_sync: crate::coalesce::Coalesced::default(),
            preparing: std::sync::atomic::AtomicUsize::new(0),
            changes: tokio::sync::watch::Sender::new(0),
            options,
            storage,
        };
        state.reconcile_mig().await;
        let published = state.first_inventory().await;
        // Capacities first: re-adopted claims are checked against them as they come back.
        state.inner.lock().await.ledger.set_capacity(capacities(&published));
        state.sweep_specs(&loaded, &published).await;
        state.rebuild_ledger(&published).await;
        state.report_overcommitted().await;
        state.repair_specs().await;
        state.make_spares();
        Ok(state)
    }

    /// The first inventory; a node whose discovery is not ready goes on with none (prepares
    /// fail until it is) rather than crash-looping.
    async fn first_inventory(&self) -> Vec<PublishedDevice> {
        let deadline = Instant::now() + FIRST_INVENTORY_WAIT;
        loop {
            match self.published() {
                Ok(p) => return p,
                Err(e) if Instant::now() >= deadline => {
                    tracing::error!(error = %e.chain(), "no GPU inventory yet; starting without one");
                    return Vec::new();
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Specs without a record: re-adopted through the API when the record may have been lost,
    /// else orphans of an interrupted unprepare (removed).
    async fn sweep_specs(&self, loaded: &crate::plugin::storage::checkpoint::Loaded, published: &[PublishedDevice]) {
        let scan = {
            let _held = self.inner.lock().await;
            if let Err(e) = blocking(|| self.storage.specs.remove_stale_temps()) {
                tracing::warn!(error = %chain(&e), "left-over CDI temp files not removed");
            }
            blocking(|| self.storage.specs.scan())
        };
        let scan = match scan {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %chain(&e), "CDI spec directory unreadable; orphaned specs are not removed this time");
                return;
            }
        };
        for entry in &scan.ignored {
            tracing::warn!(path = %entry.path.display(), what = entry.what, "not a regular file under a CDI spec name; skipped");
        }
        for spec in &scan.owned {
            let Ok(uid) = Uid::new(spec.id.clone()) else { continue };
            if self.inner.lock().await.prepared.contains_key(&uid) {
                continue;
            }
            if !loaded.may_have_lost(&uid) {
                tracing::info!(claim = %uid, "removing CDI spec of a claim that is not prepared");
                self.forget_on_disk(&uid).await;
                continue;
            }
            let read = {
                let _held = self.inner.lock().await;
                blocking(|| self.storage.specs.read(uid.as_str()))
            };
            let spec = read.ok().flatten();
            let Some(claim) = spec.as_ref().and_then(|s| claim_of(s, &uid)) else {
                tracing::warn!(claim = %uid, "CDI spec of a claim with a lost record names no claim; kept, and the claim's cards are not held");
                continue;
            };
            match self.verdict(&claim, published).await {
                Verdict::Alive(entry) => self.adopt(*entry).await,
                Verdict::Gone(why) => {
                    tracing::info!(claim = %claim, reason = %why, "removing CDI spec of a claim the API says is gone");
                    self.forget_on_disk(&uid).await;
                }
                Verdict::Unknown(why) => {
                    let names: Vec<String> = spec.iter().flat_map(|s| s.devices.iter().map(|d| d.name.clone())).collect();
                    let devices = spec_devices(&names, &uid, published);
                    tracing::warn!(claim = %claim, reason = %why, cards = ?devices, "claim with a lost record cannot be checked now; its spec is kept and its cards are held until the API answers");
                    self.inner.lock().await.pending.insert(uid, Pending { claim, devices });
                }
            }
        }
    }

    /// Asks the API what became of `claim`.
    async fn verdict(&self, claim: &ClaimRef, published: &[PublishedDevice]) -> Verdict {
        match self.claims.claim(claim).await {
            Ok(None) => Verdict::Gone("not found".into()),
            Ok(Some(object)) if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) => {
                Verdict::Gone("recreated with a new UID".into())
            }
            Ok(Some(object)) => match devices_of(&object, claim, &self.config.driver_name, &self.node, published) {
                Ok(devices) => {
                    let spec = {
                        let _held = self.inner.lock().await;
                        self.storage.specs.read(claim.uid.as_str()).ok().flatten()
                    };
                    match spec {
                        Some(spec) => {
                            let mig = self.holds_on_cards(&devices);
                            Verdict::Alive(Box::new(Recorded { claim: claim.clone(), devices, spec, mig }))
                        }
                        None => Verdict::Gone("its spec vanished".into()),
                    }
                }
                Err(e) => Verdict::Gone(e.to_string()),
            },
            Err(e) => Verdict::Unknown(chain(&e)),
        }
    }

    /// Takes a claim back as prepared: checkpoint record, ledger shares.
    async fn adopt(&self, recorded: Recorded) {
        let spec = recorded.spec.clone();
        let entry = recorded.held();
        let mut inner = self.settled(&entry.claim.uid).await;
        if inner.prepared.contains_key(&entry.claim.uid) && !inner.pending.contains_key(&entry.claim.uid) {
            // The kubelet prepared it again meanwhile: its own record stands.
            return;
        }
        tracing::info!(claim = %entry.claim, "re-adopted prepared claim from its CDI spec and the API");
        if let Err(e) = blocking(|| self.storage.checkpoint.record(&entry, &spec)) {
            tracing::error!(claim = %entry.claim, error = %chain(&e), "re-adopted claim not checkpointed; kept in memory");
        }
        let uid = entry.claim.uid.clone();
        blocking(|| self.storage.checkpoint.clear_quarantine(&uid));
        inner.ledger.release_claim(&uid);
        for d in &entry.devices {
            if let Some(over) = inner.ledger.restore(d.key(&uid), d.consumption.clone()) {
                tracing::error!(claim = %entry.claim, error = %over, "re-adopted claim does not fit its card; it still counts");
            }
        }
        inner.pending.remove(&uid);
        self.tell_prepared(&entry);
        inner.prepared.insert(uid, entry);
    }

    /// Removes a claim's spec and directory (its record is already gone); failures are logged.
    async fn forget_on_disk(&self, uid: &Uid) {
        let _held = self.inner.lock().await;
        if let Err(e) = blocking(|| self.storage.specs.remove(uid.as_str())) {
            tracing::warn!(claim = %uid, error = %chain(&e), "CDI spec not removed");
        }
        self.discard_dir(uid);
        blocking(|| self.storage.checkpoint.clear_quarantine(uid));
    }

    /// Every prepared share counts, fitting or not; cards past their capacity are reported.
    async fn rebuild_ledger(&self, published: &[PublishedDevice]) {
        let mut inner = self.inner.lock().await;
        let Inner { ledger, prepared, pending, overcommitted, .. } = &mut *inner;
        ledger.set_capacity(capacities(published));
        for (uid, entry) in prepared.iter() {
            for d in &entry.devices {
                if let Some(over) = ledger.restore(d.key(uid), d.consumption.clone()) {
                    tracing::error!(claim = %entry.claim, error = %over, "prepared claim no longer fits its card (smaller configuration?); it still counts, and the card admits nothing new until enough is released");
                }
            }
        }
        for p in pending.values() {
            hold_whole(ledger, p, published);
        }
        *overcommitted = if published.is_empty() { Vec::new() } else { ledger.overcommitted() };
    }

    /// Records an event on every prepared claim with a share on an over-committed card: the
    /// owners of those pods are the ones who can release enough.
    async fn report_overcommitted(&self) {
        let hit: Vec<(ClaimRef, String)> = {
            let inner = self.inner.lock().await;
            inner
                .prepared
                .values()
                .filter_map(|p| {
                    let over: Vec<String> = p
                        .devices
                        .iter()
                        .flat_map(|d| {
                            inner
                                .overcommitted
                                .iter()
                                .filter(move |(dev, _)| *dev == d.device)
                                .map(|(dev, cap)| format!("{cap} of {dev}"))
                        })
                        .collect();
                    (!over.is_empty()).then(|| (p.claim.clone(), over.join(", ")))
                })
                .collect()
        };
        for (claim, over) in hit {
            let note = format!(
                "prepared claims on node {} take more {over} than the card has now (its configuration shrank); the card admits no new claim until enough is released",
                self.node
            );
            self.claims.warn(&claim, &self.node, crate::plugin::api::ClaimEvent::OverCapacity, note).await;
        }
    }

    /// Rewrites the spec of every prepared claim that is missing, unreadable or changed on
    /// disk, and makes sure its directory is there; a failure is logged and retried later.
    pub(super) async fn repair_specs(&self) {
        let inner = self.inner.lock().await;
        // A claim being unprepared has its files removed outside the lock: none to repair.
        for entry in inner.prepared.values().filter(|e| !inner.committing.contains(&e.claim.uid)) {
            match self.storage.restore_spec(entry, self.options.host_dirs) {
                Ok(None) => {}
                Ok(Some(was)) => tracing::info!(claim = %entry.claim, %was, "rewrote CDI spec of prepared claim"),
                Err(e) => {
                    tracing::error!(claim = %entry.claim, error = %e.chain(), "CDI spec of prepared claim could not be rewritten; retrying later");
                }
            }
        }
    }

    /// Runs the periodic checks every `every` until `cancel`: pending claims are asked about
    /// again, claims gone from the API past the grace period are released, specs repaired and
    /// over-committed cards reported.
    pub async fn maintain(self: Arc<Self>, every: Duration, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.check_once().await;
        }
    }

    /// One round of [`State::maintain`].
    pub async fn check_once(&self) {
        let published = self.published().unwrap_or_default();
        self.retry_pending(&published).await;
        self.release_deleted().await;
        self.repair_specs().await;
        self.sweep_claim_dirs().await;
        let mut inner = self.inner.lock().await;
        if !published.is_empty() {
            let ledger = &mut inner.ledger;
            ledger.set_capacity(capacities(&published));
            let over = ledger.overcommitted();
            if over != inner.overcommitted {
                for (device, capacity) in &over {
                    tracing::error!(%device, %capacity, "prepared claims take more than the card has; it admits nothing new until enough is released");
                }
                let grew = over.iter().any(|o| !inner.overcommitted.contains(o));
                inner.overcommitted = over;
                drop(inner);
                if grew {
                    self.report_overcommitted().await;
                }
            }
        }
    }

    /// Moves claim directories of claims that are neither prepared nor pending into the trash
    /// (left by a move that failed, or by an older version), and empties the trash of what an
    /// earlier pass could not remove.
    pub(super) async fn sweep_claim_dirs(&self) {
        if !self.options.host_dirs {
            return;
        }
        let inner = self.inner.lock().await;
        let root = &self.storage.cdi.claims_root;
        let names = match blocking(|| {
            std::fs::read_dir(root).and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>())
        }) {
            Ok(names) => names,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!(path = %root.display(), error = %e, "claim directories not listed; orphans are not removed this time");
                Vec::new()
            }
        };
        for name in names {
            let Some(uid) = name.to_str().and_then(|n| Uid::new(n).ok()) else { continue };
            if !inner.prepared.contains_key(&uid) && !inner.pending.contains_key(&uid) && !inner.committing.contains(&uid) {
                tracing::info!(claim = %uid, "removing the directory of a claim that is not prepared");
                self.discard_dir(&uid);
            }
        }
        drop(inner);
        self.empty_trash();
    }

    async fn retry_pending(&self, published: &[PublishedDevice]) {
        let pending: Vec<Pending> = self.inner.lock().await.pending.values().cloned().collect();
        for p in pending {
            match self.verdict(&p.claim, published).await {
                Verdict::Alive(entry) => self.adopt(*entry).await,
                Verdict::Gone(why) => {
                    tracing::info!(claim = %p.claim, reason = %why, "claim with a lost record is gone; removing its spec and releasing its cards");
                    {
                        let mut inner = self.inner.lock().await;
                        inner.pending.remove(&p.claim.uid);
                        inner.ledger.release_claim(&p.claim.uid);
                    }
                    self.forget_on_disk(&p.claim.uid).await;
                }
                Verdict::Unknown(_) => {}
            }
        }
    }

    /// Releases prepared claims the API has said are gone (not found, or a new UID) for longer
    /// than the grace period. Only the claims this node has prepared are read, one GET each (from
    /// the API server's watch cache; a "gone" is confirmed by a quorum read), and a claim read
    /// less than half a grace period ago is not read again: at steady state each prepared claim
    /// costs one request per half grace period, and a deletion is acted on within one and a half.
    async fn release_deleted(&self) {
        let claims: Vec<ClaimRef> = self.inner.lock().await.prepared.values().map(|p| p.claim.clone()).collect();
        let recheck = self.options.deleted_claim_grace / 2;
        for claim in claims {
            let alive = if self.claims.read_within(&claim, recheck) {
                Some(true)
            } else {
                match self.claims.claim(&claim).await {
                    Ok(Some(o)) => Some(o.metadata.uid.as_deref() == Some(claim.uid.as_str())),
                    Ok(None) => Some(false),
                    Err(_) => None,
                }
            };
            let since = {
                let mut inner = self.inner.lock().await;
                match alive {
                    Some(true) => {
                        inner.gone.remove(&claim.uid);
                        continue;
                    }
                    Some(false) => *inner.gone.entry(claim.uid.clone()).or_insert_with(Instant::now),
                    None => continue,
                }
            };
            if since.elapsed() >= self.options.deleted_claim_grace {
                tracing::warn!(claim = %claim, grace = ?self.options.deleted_claim_grace, "prepared claim deleted from the API and never unprepared; releasing it");
                if let Err(e) = self.unprepare(&claim.uid).await {
                    tracing::error!(claim = %claim, error = %e.chain(), "releasing a deleted claim failed; retrying later");
                }
            }
        }
    }
}

/// The claim a spec belongs to, from its annotation.
fn claim_of(spec: &cdi_spec::Spec, uid: &Uid) -> Option<ClaimRef> {
    let (namespace, name) = spec.annotations.get(ANNOTATION_CLAIM)?.split_once('/')?;
    ClaimRef::new(namespace, name, uid.as_str()).ok()
}

/// The cards a spec's device names (`<uid>-<device>[-<share>]`) name, among those published.
fn spec_devices(names: &[String], uid: &Uid, published: &[PublishedDevice]) -> Vec<DeviceName> {
    let mut out: Vec<DeviceName> = Vec::new();
    for name in names {
        let Some(rest) = name.strip_prefix(&format!("{uid}-")) else { continue };
        let card = published.iter().find(|p| rest == p.name.as_str() || rest.starts_with(&format!("{}-", p.name)));
        if let Some(card) = card
            && !out.contains(&card.name)
        {
            out.push(card.name.clone());
        }
    }
    out
}
