//! The pods bound to this node, and their claims read before the kubelet asks for them.
//!
//! A prepare needs the claim (its allocation) and the pod it is reserved for (which containers
//! use it). Read when the kubelet asks, that is two API reads in a row on every prepare. The
//! kubelet starts a pod only after the scheduler has bound it, and the scheduler binds a pod only
//! after its claims are allocated and reserved for it: so when a pod shows up bound to this node,
//! its claims can be read at once, and by the time the kubelet asks they are usually here.
//!
//! - One watch of the pods with `spec.nodeName=<this node>`: the API server sends each node only
//!   its own pods' events (its pod watch cache is indexed by node name, the kubelet's own watch
//!   relies on it), so a node's traffic follows its own pods. Only pending pods that name claims
//!   are kept (a pod that starts has had every claim prepared), and of them only what the
//!   container check reads (names, UIDs, which claims each container
//!   uses): pods cannot change their containers or claims once created.
//! - Each claim of a pending pod is read once, from the API server's watch cache; it is kept only
//!   when it is allocated to this node and reserved for that pod, else read again from etcd, and
//!   dropped when it is another driver's or node's.
//! - A prepare takes a claim read ahead only when it has the UID the kubelet named and the pod it
//!   is reserved for is still bound here and not on its way out; anything else is read from the
//!   API as before. A claim cannot be deallocated (nor so reallocated) while it is reserved, and
//!   its reservation for a pod ends only when that pod is deleted or has finished, which this
//!   watch sees and which drops what was read ahead for it. An unprepare drops it too, so a
//!   claim allocated anew for the next pod is read anew even if this watch lags. A retried
//!   prepare takes the same claim again.
//!
//! - What was read ahead is trusted only while this watch is known to have missed nothing: a
//!   watch error drops every claim read ahead and hands out none until a new full list of the
//!   node's pods is done (the watch is started anew, with a jittered backoff), and a claim read
//!   more than [`MAX_READ_AHEAD_AGE`] ago is read again from the API. What is left is the lag of
//!   this watch behind the kubelet's within that age: a standalone claim whose pod was deleted
//!   before it started and that is allocated again on this node for another pod in the time this
//!   watch is behind. That is why the pod watch is off by default (docs/security.md).
//!
//! The cost is in RBAC: `list` and `watch` of pods cannot be narrowed to one node by a role, so a
//! driver with the pod watch may list every pod of the cluster (it asks only for its own node's).
//! `--pod-watch=false` (the chart's `podWatch: false`, the default) turns it off, and the role
//! with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use vgpu_scheduling::{Namespace, ObjectName, Uid};

use super::pod_store::{Read, Slot, Store, admit, remove};
use super::read::{Cached, SourceError, get_current};
use super::slim;
use crate::backoff::Backoff;
use crate::plugin::claim::{ClaimRef, allocated_here, consumer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::{Labels, WatchRestarts, labels};

/// Claims read ahead at once: a relist of a busy node asks for its pods' claims in a burst, and
/// the API server should not get them all in the same millisecond.
const CONCURRENT_READS: usize = 4;

/// How long a claim read ahead may be handed to a prepare: the kubelet prepares a pod's claims
/// within moments of its binding, so an older read is of a pod that did not start, and is read
/// again instead.
pub const MAX_READ_AHEAD_AGE: Duration = Duration::from_secs(60);

/// The read ahead as the metrics count it.
#[derive(Clone)]
pub struct ReadAheadMetrics {
    /// Events of this node's pod watch.
    pub(crate) pod_events: Counter,
    /// Restarts of that watch.
    restarts: Counter,
    /// Claims read ahead, by result (`used` by a prepare, `missed`: a prepare read the API,
    /// `not_ours`: read and dropped).
    pub(crate) prefetch: Family<Labels, Counter>,
}

impl ReadAheadMetrics {
    /// Registers the families; the watch's restarts go to `restarts`.
    pub fn register(registry: &mut Registry, restarts: &WatchRestarts) -> Self {
        let m = Self { pod_events: Counter::default(), restarts: restarts.of("pods"), prefetch: Family::default() };
        registry.register("vgpu_dra_pod_events", "Events of the watch of this node's pods", m.pod_events.clone());
        registry.register(
            "vgpu_dra_claim_prefetch",
            "Claims read ahead for this node's pods: used by a prepare, missed (the prepare read the API), or not ours",
            m.prefetch.clone(),
        );
        m
    }
}

/// The pods bound to this node that name claims, and the claims of those pods read ahead.
#[derive(Clone)]
pub struct NodePods(Arc<Shared>);

/// What the clones of one [`NodePods`] share.
struct Shared {
    driver: String,
    node: String,
    store: Mutex<Store>,
    metrics: Option<ReadAheadMetrics>,
}

impl NodePods {
    /// An empty store for the claims of `driver` on `node`.
    pub fn new(driver: impl Into<String>, node: impl Into<String>, metrics: Option<ReadAheadMetrics>) -> Self {
        Self(Arc::new(Shared { driver: driver.into(), node: node.into(), store: Mutex::default(), metrics }))
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        // Every update is a few inserts and removes of whole entries: a panic cannot leave one
        // half-written.
        vgpu_dra_runtime::sync::lock(&self.0.store)
    }

    /// How many pods and claims read ahead it holds.
    pub fn len(&self) -> (usize, usize) {
        let store = self.lock();
        (store.pods.len(), store.claims.len())
    }

    /// The pod `namespace/name` with UID `uid`, when it is bound here and names claims.
    pub fn pod(&self, namespace: &Namespace, name: &ObjectName, uid: &str) -> Option<Pod> {
        let store = self.lock();
        let entry = store.pods.get(uid)?;
        if entry.namespace != namespace.as_str() || entry.name != name.as_str() {
            return None;
        }
        serde_json::from_slice(entry.json.as_deref()?).ok()
    }

    /// The claim the kubelet named, when it was read ahead and is still current: same UID, and
    /// reserved for a pod still bound here (its allocation cannot change while that holds). A
    /// read under way is waited for, at most `wait`. `None` sends the caller to the API.
    pub async fn take(&self, claim: &ClaimRef, wait: Duration) -> Option<ResourceClaim> {
        let key = claim.key();
        let reading = match self.lock().claims.get(&key) {
            Some(Slot::Reading { done }) => Some(done.clone()),
            Some(Slot::Ready { .. }) => None,
            None => return self.count("missed", None),
        };
        if let Some(mut done) = reading {
            // A dropped sender ends the wait too: the read is over either way.
            let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        }
        let mut store = self.lock();
        let taken = match store.claims.get(&key) {
            // While the watch may have missed something, nothing read ahead is current.
            Some(_) if store.stale => None,
            Some(Slot::Ready { uid, pod, read, json })
                if uid == claim.uid.as_str() && store.has_pod(pod) && read.elapsed() <= MAX_READ_AHEAD_AGE =>
            {
                serde_json::from_slice(json).ok()
            }
            Some(Slot::Ready { .. }) => {
                // Another UID (the claim was made anew), its pod left, or read too long ago:
                // never current again.
                store.claims.remove(&key);
                None
            }
            // Still reading after the wait: left to finish, and the API is read now.
            Some(Slot::Reading { .. }) | None => None,
        };
        drop(store);
        let result = if taken.is_some() { "used" } else { "missed" };
        self.count(result, taken)
    }

    /// Drops what was read ahead for the claim `claim`, just prepared: a retry reads the API,
    /// and the kubelet prepares a claim once per pod. Its pod's JSON goes too once every claim
    /// read ahead for it has been prepared.
    pub fn prepared(&self, claim: &ClaimRef) {
        let mut store = self.lock();
        let key = claim.key();
        let pod = match store.claims.get(&key) {
            Some(Slot::Ready { uid, pod, .. }) if uid == claim.uid.as_str() => pod.clone(),
            _ => return,
        };
        store.claims.remove(&key);
        if let Some(entry) = store.pods.get_mut(&pod)
            && entry.namespace == claim.namespace.as_str()
        {
            if !entry.prepared.iter().any(|n| n == claim.name.as_str()) {
                entry.prepared.push(claim.name.to_string());
            }
            if !entry.awaits_prepares() {
                entry.json = None;
            }
        }
    }

    /// Forgets what was read ahead of the claim `uid`: it was unprepared, so its pod is done
    /// with it, and a claim made for another pod next (a standalone claim can be deallocated
    /// and allocated again under the same UID) must be read anew, whatever this watch has seen.
    pub fn forget(&self, uid: &Uid) {
        self.lock().claims.retain(|_, slot| !matches!(slot, Slot::Ready { uid: read, .. } if read == uid.as_str()));
    }

    /// The watch failed: it may have missed a deletion, so every claim read ahead is dropped and
    /// none is handed out until the next full list of the node's pods is done.
    fn invalidate(&self) {
        let mut store = self.lock();
        store.stale = true;
        store.relisting = None;
        store.claims.retain(|_, slot| matches!(slot, Slot::Reading { .. }));
    }

    fn count<T>(&self, result: &str, value: Option<T>) -> Option<T> {
        if let Some(m) = &self.0.metrics {
            m.prefetch.get_or_create(&labels(&[("result", result)])).inc();
        }
        value
    }

    /// Takes in one watch event; returns the claims to read ahead.
    fn apply(&self, event: watcher::Event<Pod>) -> Vec<Read> {
        let mut store = self.lock();
        let store = &mut *store;
        match event {
            watcher::Event::Init => {
                store.relisting = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(pod) => {
                let Store { pods, relisting, claims, .. } = store;
                admit(relisting.get_or_insert_with(HashMap::new), Some(pods), claims, pod)
            }
            watcher::Event::InitDone => {
                if let Some(listed) = store.relisting.take() {
                    store.pods = listed;
                }
                // Claims of pods gone while the watch was down.
                let pods = &store.pods;
                store.claims.retain(|_, slot| match slot {
                    Slot::Ready { pod, .. } => pods.contains_key(pod),
                    Slot::Reading { .. } => true,
                });
                store.stale = false;
                Vec::new()
            }
            watcher::Event::Apply(pod) => admit(&mut store.pods, None, &mut store.claims, pod),
            watcher::Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    remove(store, uid);
                }
                Vec::new()
            }
        }
    }

    /// Keeps what a read ahead found, when it is ours and its pod is still here.
    fn offer(&self, read: &Read, found: Option<ResourceClaim>) {
        let mut store = self.lock();
        let key = read.key();
        let keep = found.filter(|c| self.reserved_here_for(c, &read.pod) && store.has_pod(&read.pod));
        let kept = keep.and_then(|claim| {
            let uid = claim.metadata.uid.clone()?;
            let json = serde_json::to_vec(&slim::claim(&claim)).ok()?.into();
            Some(Slot::Ready { uid, pod: read.pod.clone(), read: tokio::time::Instant::now(), json })
        });
        match kept {
            Some(slot) => {
                store.claims.insert(key, slot);
            }
            None => {
                store.claims.remove(&key);
                drop(store);
                self.count("not_ours", Some(()));
            }
        }
    }

    /// Whether `claim` is allocated to this node and reserved for the pod with UID `pod`.
    fn reserved_here_for(&self, claim: &ResourceClaim, pod: &str) -> bool {
        allocated_here(claim, &self.0.driver, &self.0.node) && consumer(claim).is_some_and(|(_, uid)| uid == pod)
    }

    /// Watches this node's pods and reads their claims ahead, until `cancel`. A failed watch
    /// invalidates what was read ahead and is started anew (a full list) after a jittered,
    /// growing pause.
    pub async fn run(self, client: kube::Client, timeout: Duration, cancel: CancellationToken) {
        let pods: Api<Pod> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.0.node));
        let permits = Arc::new(Semaphore::new(CONCURRENT_READS));
        let mut backoff = Backoff::default();
        tracing::info!(node = %self.0.node, "watching this node's pods to read their claims ahead");
        loop {
            let mut events = std::pin::pin!(watcher(pods.clone(), config.clone()));
            let failure = loop {
                let event = tokio::select! {
                    () = cancel.cancelled() => return,
                    event = events.next() => event,
                };
                match event {
                    Some(Ok(event)) => {
                        if matches!(event, watcher::Event::InitDone) {
                            backoff.reset();
                        }
                        if let Some(m) = &self.0.metrics
                            && matches!(
                                event,
                                watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_)
                            )
                        {
                            m.pod_events.inc();
                        }
                        for read in self.apply(event) {
                            self.spawn_read(client.clone(), read, timeout, permits.clone(), cancel.clone());
                        }
                    }
                    Some(Err(e)) => break e.to_string(),
                    None => break "the watch ended".to_owned(),
                }
            };
            self.invalidate();
            if let Some(m) = &self.0.metrics {
                m.restarts.inc();
            }
            let pause = backoff.next_pause();
            tracing::warn!(node = %self.0.node, error = %failure, retry_in = ?pause, "pod watch failed; claims read ahead are dropped and the node's pods listed anew");
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Reads one claim ahead on a task of its own (each read has its deadline).
    fn spawn_read(
        &self,
        client: kube::Client,
        read: Read,
        timeout: Duration,
        permits: Arc<Semaphore>,
        cancel: CancellationToken,
    ) {
        let (tx, rx) = watch::channel(false);
        self.lock().claims.insert(read.key(), Slot::Reading { done: rx });
        let this = self.clone();
        tokio::spawn(async move {
            let found = tokio::select! {
                () = cancel.cancelled() => None,
                found = async {
                    let _permit = permits.acquire().await.ok()?;
                    match this.read_ahead(client, &read, timeout).await {
                        Ok(found) => found,
                        Err(e) => {
                            tracing::debug!(claim = %read.key(), error = %e, "claim not read ahead; a prepare reads it");
                            None
                        }
                    }
                } => found,
            };
            this.offer(&read, found);
            let _ = tx.send(true);
        });
    }

    /// The claim of `read`: from the API server's watch cache when that already has it allocated
    /// here and reserved for the pod; from etcd when the cache may lag (not yet allocated or
    /// reserved); `None` when it is allocated elsewhere (an allocation does not change).
    async fn read_ahead(
        &self,
        client: kube::Client,
        read: &Read,
        timeout: Duration,
    ) -> Result<Option<ResourceClaim>, SourceError> {
        let (Ok(namespace), Ok(name)) = (Namespace::new(&read.namespace), ObjectName::new(&read.name)) else {
            return Ok(None);
        };
        let api: Api<ResourceClaim> = Api::namespaced(client, namespace.as_str());
        let judge = |c: &ResourceClaim| {
            if self.reserved_here_for(c, &read.pod) {
                Cached::Current
            } else if c.status.as_ref().is_some_and(|s| s.allocation.is_some())
                && !allocated_here(c, &self.0.driver, &self.0.node)
            {
                Cached::NotOurs
            } else {
                Cached::Unsure
            }
        };
        get_current(&api, &name, timeout, || format!("ResourceClaim {namespace}/{name}"), judge).await
    }
}

#[cfg(test)]
#[path = "node_pods_tests.rs"]
mod tests;
