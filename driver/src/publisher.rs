//! The ResourceSlice publisher: keeps the node's pool on the API server equal to what discovery
//! and configuration say, and puts it back within moments when someone deletes or edits it (the
//! kubelet wipes a node's slices when it starts and 30 s after losing the plugin).
//!
//! One loop: a watch on our own slices and every change of the device loop's snapshot wake the
//! reconciler, which lists our slices, writes (server-side apply) only those that differ, deletes
//! extra ones and bumps the pool generation when the device set changes. A restart that finds
//! everything in place writes nothing. Every API call has a deadline, so a hung API server fails
//! a pass instead of stalling it, and readiness says whether the last pass succeeded.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use vgpu_scheduling::{Inventory, SharingConfig};

use crate::discovery::{DeviceSource, DiscoveryError, SnapshotSource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::{Labels, WatchRestarts, labels};
use crate::mig::offer::Refusal;
use crate::mig::{MigSettings, PoolLayout};
use crate::slices::{LABEL_MANAGED_BY, PoolIdentity};

/// Field manager of our server-side applies.
pub const FIELD_MANAGER: &str = "vgpu-dra";

/// The default deadline of one API call. A healthy API server answers these small reads and
/// writes in milliseconds; one that is hung (or a connection to it that died silently) would
/// otherwise hold a pass, and readiness with it, forever. Short enough that a stuck pass is
/// retried soon, long enough for a loaded server.
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why one API call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The API server answered with an error, or the request could not be sent.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Runs one API call with a deadline.
async fn within<T>(limit: Duration, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, CallError> {
    match tokio::time::timeout(limit, call).await {
        Ok(answer) => answer.map_err(CallError::Api),
        Err(_) => Err(CallError::TimedOut(limit)),
    }
}

/// Publisher failures; each says which step failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Discovery failed.
    #[error("discovering GPUs")]
    Discovery(#[from] DiscoveryError),
    /// The Node object could not be read.
    #[error("reading Node {node}")]
    Node {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: CallError,
    },
    /// Listing our slices failed.
    #[error("listing ResourceSlices")]
    List(#[source] CallError),
    /// Writing a slice failed.
    #[error("applying ResourceSlice {name}")]
    Apply {
        /// The slice.
        name: String,
        /// The API error.
        #[source]
        source: CallError,
    },
    /// Deleting a stale slice failed.
    #[error("deleting ResourceSlice {name}")]
    Delete {
        /// The slice.
        name: String,
        /// The API error.
        #[source]
        source: CallError,
    },
}

/// Timing of the publisher.
#[derive(Debug, Clone)]
pub struct PublisherOptions {
    /// Deadline of each API call ([`API_CALL_TIMEOUT`] by default).
    pub api_timeout: Duration,
    /// A full reconcile at least this often, even without events.
    pub resync: Duration,
    /// First retry delay after an error; doubles up to `max_backoff`.
    pub min_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        Self {
            api_timeout: API_CALL_TIMEOUT,
            resync: Duration::from_secs(600),
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// What one reconcile did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileOutcome {
    /// Slices written.
    pub applied: usize,
    /// Slices deleted.
    pub deleted: usize,
    /// The pool generation now published.
    pub generation: i64,
}

/// Slice writes and the slice watch's restarts, as the metrics count them.
#[derive(Clone)]
pub struct PublishMetrics {
    /// ResourceSlice writes by operation (`apply`, `delete`) and result.
    pub(crate) slice_writes: Family<Labels, Counter>,
    /// Restarts of the slice watch.
    restarts: Counter,
}

impl PublishMetrics {
    /// Registers the family; the watch's restarts go to `restarts`.
    pub fn register(registry: &mut Registry, restarts: &WatchRestarts) -> Self {
        let m = Self { slice_writes: Family::default(), restarts: restarts.of("resourceslices") };
        registry.register("vgpu_dra_slice_writes", "ResourceSlice writes by operation and result", m.slice_writes.clone());
        m
    }

    /// One slice write of `op` (`apply`, `delete`) and whether it succeeded.
    pub fn wrote(&self, op: &str, ok: bool) {
        self.slice_writes.get_or_create(&labels(&[("op", op), ("result", if ok { "ok" } else { "error" })])).inc();
    }
}

/// Publishes one node's pool.
pub struct Publisher {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    snapshots: SnapshotSource,
    config: SharingConfig,
    mig: MigSettings,
    node_name: String,
    options: PublisherOptions,
    generation: i64,
    published: Option<PoolLayout>,
    ready: Arc<AtomicBool>,
    metrics: Option<PublishMetrics>,
}

impl Publisher {
    /// A publisher for `node_name` with the devices of the device loop's `snapshots`.
    pub fn new(
        client: kube::Client,
        node_name: String,
        snapshots: SnapshotSource,
        config: SharingConfig,
        options: PublisherOptions,
    ) -> Self {
        Self {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            snapshots,
            config,
            mig: MigSettings::default(),
            node_name,
            options,
            generation: 0,
            published: None,
            ready: Arc::default(),
            metrics: None,
        }
    }

    /// Offers dynamic MIG on the cards `mig` names.
    #[must_use]
    pub fn with_mig(mut self, mig: MigSettings) -> Self {
        self.mig = mig;
        self
    }

    /// Counts slice writes and watch restarts in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: PublishMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn count_write(&self, op: &str, ok: bool) {
        if let Some(m) = &self.metrics {
            m.wrote(op, ok);
        }
    }

    /// True while the last pass published the pool, false before the first success and after
    /// any failure (for readiness).
    pub fn ready_flag(&self) -> Arc<AtomicBool> {
        self.ready.clone()
    }

    fn selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node_name, self.config.driver_name)
    }

    /// Runs until `cancel` fires: reconciles on start, on every change of our slices, on
    /// snapshot changes that change the devices, and periodically; errors are retried with
    /// capped backoff and logged once per change of state.
    pub async fn run(mut self, cancel: CancellationToken) {
        let wake = Arc::new(Notify::new());
        let watch =
            tokio::spawn(watch_slices(self.slices.clone(), self.selector(), wake.clone(), self.metrics.clone(), cancel.clone()));
        let mut backoff = self.options.min_backoff;
        let mut last_error: Option<String> = None;
        let mut first = true;
        let mut snapshots = self.snapshots.subscribe();
        let mut loop_running = true;
        loop {
            // Whatever snapshot this pass reads, later ones wake the next.
            snapshots.mark_unchanged();
            let result = self.reconcile().await;
            self.ready.store(result.is_ok(), Ordering::SeqCst);
            match result {
                Ok(outcome) => {
                    if last_error.take().is_some() {
                        tracing::info!(node = %self.node_name, "publishing ResourceSlices works again");
                    }
                    if outcome.applied + outcome.deleted == 0 && first {
                        tracing::info!(node = %self.node_name, generation = outcome.generation, "ResourceSlices already up to date");
                    }
                    first = false;
                    if outcome.applied + outcome.deleted > 0 {
                        tracing::info!(node = %self.node_name, applied = outcome.applied, deleted = outcome.deleted, generation = outcome.generation, "ResourceSlices published");
                    }
                    backoff = self.options.min_backoff;
                    let resync = tokio::time::sleep(self.options.resync);
                    tokio::pin!(resync);
                    loop {
                        tokio::select! {
                            () = cancel.cancelled() => break,
                            () = wake.notified() => break,
                            () = &mut resync => break,
                            changed = snapshots.changed(), if loop_running => match changed {
                                Ok(()) if self.devices_changed(snapshots.borrow_and_update().as_ref()) => break,
                                Ok(()) => {}
                                // The device loop is gone: the last snapshot stays published.
                                Err(_) => loop_running = false,
                            },
                        }
                    }
                    // Let a burst of watch events (a DeleteCollection) settle into one reconcile.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    let message = format!("{:#}", anyhow::Error::from(e));
                    if last_error.as_deref() != Some(message.as_str()) {
                        tracing::warn!(node = %self.node_name, error = %message, retry_in = ?backoff, "publishing ResourceSlices failed");
                        last_error = Some(message);
                    }
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(self.options.max_backoff);
                }
            }
            if cancel.is_cancelled() {
                break;
            }
        }
        watch.abort();
    }

    fn layout(&self, inventory: &Inventory) -> PoolLayout {
        PoolLayout::new(inventory, &self.config, &self.mig)
    }

    fn devices_changed(&self, inventory: Option<&Inventory>) -> bool {
        match inventory {
            Some(inventory) => self.published.as_ref() != Some(&self.layout(inventory)),
            None => self.published.is_some(),
        }
    }

    /// Logs the cards in MIG mode that offer no dynamic MIG, when that changes.
    fn log_refusals(&self, layout: &PoolLayout) {
        let before: &[Refusal] = self.published.as_ref().map_or(&[], |p| &p.refusals);
        if layout.refusals == before {
            return;
        }
        for r in &layout.refusals {
            r.log(&self.node_name);
        }
        if !layout.offers.is_empty() && self.published.as_ref().is_none_or(|p| p.offers.len() != layout.offers.len()) {
            let cards: Vec<&str> = layout.offers.iter().map(|(_, o)| o.uuid.as_str()).collect();
            tracing::info!(node = %self.node_name, cards = %cards.join(", "), "cards offering dynamic MIG");
        }
    }

    /// One pass: make the server's slices equal the desired ones.
    ///
    /// # Errors
    /// [`PublishError`] naming the step; the next pass starts over.
    pub async fn reconcile(&mut self) -> Result<ReconcileOutcome, PublishError> {
        let layout = self.layout(&self.snapshots.inventory()?);
        let limit = self.options.api_timeout;
        let node = within(limit, self.nodes.get(&self.node_name))
            .await
            .map_err(|source| PublishError::Node { node: self.node_name.clone(), source })?;
        let existing = within(limit, self.slices.list(&ListParams::default().fields(&self.selector())))
            .await
            .map_err(PublishError::List)?
            .items;
        let server_generation = existing.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
        let mut pool = PoolIdentity {
            driver: self.config.driver_name.clone(),
            node_name: self.node_name.clone(),
            node_uid: node.metadata.uid.clone(),
            generation: self.generation.max(server_generation).max(1),
        };
        let mut desired = layout.slices(&pool);
        // The generation tells the scheduler the device set changed. Compare with what we last
        // published; only a fresh start compares with the server (restoring someone's edit or a
        // wiped pool is not a change of the set).
        let changed = match &self.published {
            Some(previous) => *previous != layout,
            None => {
                existing.len() != desired.len()
                    || !desired.iter().all(|d| {
                        existing.iter().any(|e| {
                            e.metadata.name == d.metadata.name
                                && e.spec.devices == d.spec.devices
                                && e.spec.shared_counters == d.spec.shared_counters
                        })
                    })
            }
        };
        if changed && (self.published.is_some() || !existing.is_empty()) {
            pool.generation += 1;
            desired = layout.slices(&pool);
        }
        let mut outcome = ReconcileOutcome { generation: pool.generation, ..Default::default() };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for slice in &desired {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let current = existing.iter().find(|e| e.metadata.name.as_deref() == Some(name.as_str()));
            if current.is_some_and(|c| up_to_date(c, slice)) {
                continue;
            }
            let applied = within(limit, self.slices.patch(&name, &params, &Patch::Apply(slice))).await;
            self.count_write("apply", applied.is_ok());
            applied.map_err(|source| PublishError::Apply { name: name.clone(), source })?;
            outcome.applied += 1;
        }
        for stale in existing.iter().filter(|e| !desired.iter().any(|d| d.metadata.name == e.metadata.name)) {
            let name = stale.metadata.name.clone().unwrap_or_default();
            let deleted = within(limit, self.slices.delete(&name, &DeleteParams::default())).await;
            self.count_write("delete", deleted.is_ok());
            match deleted {
                Ok(_) => outcome.deleted += 1,
                Err(CallError::Api(kube::Error::Api(s))) if s.code == 404 => {}
                Err(source) => return Err(PublishError::Delete { name, source }),
            }
        }
        self.generation = pool.generation;
        self.log_refusals(&layout);
        self.published = Some(layout);
        Ok(outcome)
    }
}

/// Whether the server's slice already says what we would write.
fn up_to_date(current: &ResourceSlice, desired: &ResourceSlice) -> bool {
    let labels_ok = current.metadata.labels.as_ref().and_then(|l| l.get(LABEL_MANAGED_BY))
        == desired.metadata.labels.as_ref().and_then(|l| l.get(LABEL_MANAGED_BY));
    let owners_ok =
        desired.metadata.owner_references.is_none() || current.metadata.owner_references == desired.metadata.owner_references;
    labels_ok && owners_ok && current.spec == desired.spec
}

/// Wakes the reconciler on every change to our slices (deletions, edits by others).
async fn watch_slices(
    api: Api<ResourceSlice>,
    selector: String,
    wake: Arc<Notify>,
    metrics: Option<PublishMetrics>,
    cancel: CancellationToken,
) {
    let config = watcher::Config::default().fields(&selector);
    let mut events = std::pin::pin!(watcher(api, config));
    let mut backoff = crate::backoff::Backoff::default();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => {
                    backoff.reset();
                    wake.notify_one();
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    if let Some(m) = &metrics {
                        m.restarts.inc();
                    }
                    // The reconciler's own resync still runs meanwhile: a lost watch delays a
                    // repair, it does not stop it.
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %e, retry_in = ?pause, "ResourceSlice watch failed; resuming");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
