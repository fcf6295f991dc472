//! The driver's word in each prepared claim's `status.devices` (KEP-4817), written in the
//! background so a prepare never waits on it: the kubelet gets its answer from the checkpoint
//! and the spec alone, and an API server that is slow or down costs the status, never a pod.
//!
//! One writer per node. What is asked last for a claim wins: a set that has not gone out yet is
//! replaced by the clear of an unprepare, so the API never ends with the older of the two. The
//! writes give way to a burst of prepares: they wait until no new wish came for [`QUIET`] (or the
//! oldest has waited [`MAX_DEFER`]), since where the API server shares the node's cores each
//! apply takes CPU the burst's pods are waiting on (BENCHMARKS.md measures it), and a claim
//! prepared and unprepared within the burst then costs one write, not two. Each
//! write is a server-side apply of the status subresource under the driver's field manager,
//! naming the claim's UID (the API server refuses it for a claim recreated under the same name),
//! so it touches only this driver's entries, and a clear removes only them. Since 1.36 the API
//! server lets a node's driver write only entries of its own driver on claims allocated to its
//! own node (`resourceclaims/driver`, `associated-node:patch`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use kube::Resource;
use kube::api::{Patch, PatchParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use vgpu_scheduling::Uid;

use crate::backoff::Backoff;
use crate::metrics::{Labels, labels};
use crate::plugin::claim::ClaimRef;

/// How long no new wish must have come before the writes start.
pub const QUIET: Duration = Duration::from_millis(500);
/// The longest a wish waits for a quiet moment; under steady prepares writes go on after it.
pub const MAX_DEFER: Duration = Duration::from_secs(10);

/// Tries of one write the API server failed (timeouts, 5xx, 429) before it is dropped; the
/// next start-up writes every prepared claim's status again.
const MAX_TRIES: u32 = 6;

/// The writes' outcomes, by result: `written`, `gone` (the claim was deleted), `refused` (the
/// API server will not take it: no RBAC, the claim deallocated or recreated) and `failed` (no
/// answer after every try).
#[derive(Clone, Default)]
pub struct StatusMetrics(Family<Labels, Counter>);

impl StatusMetrics {
    /// Registers the family.
    pub fn register(registry: &mut Registry) -> Self {
        let this = Self::default();
        registry.register("vgpu_dra_claim_status_writes", "Writes of prepared claims' status.devices, by result", this.0.clone());
        this
    }

    /// Counts one write that ended with `result`.
    pub(crate) fn count(&self, result: &str) {
        self.0.get_or_create(&labels(&[("result", result)])).inc();
    }
}

/// What a claim's status should say: these entries (none: this driver's entries removed).
#[derive(Debug, Clone)]
struct Wanted {
    claim: ClaimRef,
    /// The apply's body, as JSON: one allocation of a few hundred bytes per claim waiting, not
    /// the entries' many small ones (a burst of 1,000 prepares queues 1,000 of them).
    body: Box<[u8]>,
    /// Whether it removes this driver's entries.
    clears: bool,
    tries: u32,
}

/// The wishes not yet written, with when the last came and since when the queue has not been
/// empty.
#[derive(Default)]
struct Queue {
    wanted: BTreeMap<Uid, Wanted>,
    last_wish: Option<tokio::time::Instant>,
    waiting_since: Option<tokio::time::Instant>,
}

impl Queue {
    /// How long the writes should still give way: `None` once the queue is quiet or has waited
    /// long enough (or is empty).
    fn hold_off(&self, now: tokio::time::Instant) -> Option<Duration> {
        let (last, since) = (self.last_wish?, self.waiting_since?);
        let quiet = QUIET.checked_sub(now - last)?;
        let deferred = MAX_DEFER.checked_sub(now - since)?;
        Some(quiet.min(deferred)).filter(|d| !d.is_zero())
    }

    fn pop(&mut self) -> Option<(Uid, Wanted)> {
        let next = self.wanted.pop_first();
        if self.wanted.is_empty() {
            self.waiting_since = None;
        }
        next
    }
}

/// The writer of this node's claims' `status.devices`; cheap to clone.
#[derive(Clone)]
pub struct StatusWriter {
    shared: Arc<Shared>,
}

struct Shared {
    client: kube::Client,
    manager: String,
    timeout: Duration,
    pending: std::sync::Mutex<Queue>,
    wake: tokio::sync::Notify,
    metrics: StatusMetrics,
    /// Whether a refusal for want of RBAC was logged at warn already (once is enough to act on).
    warned_forbidden: AtomicBool,
}

/// How one write ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Written,
    Gone,
    Refused { forbidden: bool, message: String },
    Failed(String),
}

impl StatusWriter {
    /// A writer applying as field manager `manager` (the driver's name), each call within `timeout`.
    pub fn new(client: kube::Client, manager: impl Into<String>, timeout: Duration, metrics: StatusMetrics) -> Self {
        Self {
            shared: Arc::new(Shared {
                client,
                manager: manager.into(),
                timeout,
                pending: std::sync::Mutex::default(),
                wake: tokio::sync::Notify::new(),
                metrics,
                warned_forbidden: AtomicBool::new(false),
            }),
        }
    }

    /// Asks for `claim`'s entries of this driver to be `devices` (empty: removed).
    pub fn set(&self, claim: &ClaimRef, devices: Vec<AllocatedDeviceStatus>) {
        let body = serde_json::to_vec(&apply_body(claim, &devices)).unwrap_or_default().into_boxed_slice();
        let wanted = Wanted { claim: claim.clone(), body, clears: devices.is_empty(), tries: 0 };
        let now = tokio::time::Instant::now();
        let mut queue = self.pending();
        queue.wanted.insert(claim.uid.clone(), wanted);
        queue.last_wish = Some(now);
        queue.waiting_since.get_or_insert(now);
        drop(queue);
        self.shared.wake.notify_one();
    }

    /// Asks for `claim`'s entries of this driver to be removed (it was unprepared).
    pub fn clear(&self, claim: &ClaimRef) {
        self.set(claim, Vec::new());
    }

    /// How many claims wait for their write.
    pub fn queued(&self) -> usize {
        self.pending().wanted.len()
    }

    /// What waits to be written for claim `uid` (tests of its callers).
    #[cfg(test)]
    pub(crate) fn wanted(&self, uid: &Uid) -> Option<Vec<AllocatedDeviceStatus>> {
        let body: serde_json::Value = serde_json::from_slice(&self.pending().wanted.get(uid)?.body).ok()?;
        serde_json::from_value(body["status"]["devices"].clone()).ok()
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Every update is one insert or remove: a panic elsewhere leaves no half-written map.
        vgpu_dra_runtime::sync::lock(&self.shared.pending)
    }

    /// Writes what is asked, one claim at a time, until `cancel`; a write the API server failed
    /// is tried again after a growing pause, unless something newer was asked for its claim.
    pub async fn run(self, cancel: CancellationToken) {
        let mut backoff = Backoff::default();
        loop {
            let hold_off = self.pending().hold_off(tokio::time::Instant::now());
            if let Some(pause) = hold_off {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(pause) => continue,
                }
            }
            let next = self.pending().pop();
            let Some((uid, wanted)) = next else {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = self.shared.wake.notified() => continue,
                }
            };
            let outcome = tokio::select! {
                () = cancel.cancelled() => return,
                outcome = self.write(&wanted) => outcome,
            };
            if let Outcome::Failed(error) = &outcome
                && wanted.tries + 1 < MAX_TRIES
            {
                let pause = backoff.next_pause();
                tracing::debug!(claim = %wanted.claim, %error, ?pause, "claim status not written; trying again");
                // Unless something newer was asked for the claim meanwhile.
                let tries = wanted.tries + 1;
                {
                    let mut queue = self.pending();
                    queue.wanted.entry(uid).or_insert(Wanted { tries, ..wanted });
                    queue.waiting_since.get_or_insert(tokio::time::Instant::now());
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(pause) => continue,
                }
            }
            if !matches!(outcome, Outcome::Failed(_)) {
                backoff.reset();
            }
            self.report(&wanted, &outcome);
        }
    }

    /// One server-side apply of `wanted`, within the writer's timeout.
    async fn write(&self, wanted: &Wanted) -> Outcome {
        let claim = &wanted.claim;
        let params = PatchParams::apply(&self.shared.manager).force();
        let url = ResourceClaim::url_path(&(), Some(claim.namespace.as_str()));
        // kube builds the URL, query and headers; the body is the one queued, already JSON.
        let request =
            match kube::core::Request::new(url).patch_subresource("status", claim.name.as_str(), &params, &Patch::Apply(())) {
                Ok(r) => r.map(|_| wanted.body.to_vec()),
                Err(e) => return Outcome::Refused { forbidden: false, message: e.to_string() },
            };
        // The answer (the whole claim) is not parsed: only whether it was taken matters.
        match tokio::time::timeout(self.shared.timeout, self.shared.client.request_text(request)).await {
            Err(_) => Outcome::Failed(format!("no answer within {:?}", self.shared.timeout)),
            Ok(Ok(_)) => Outcome::Written,
            Ok(Err(kube::Error::Api(status))) => match status.code {
                404 => Outcome::Gone,
                403 => Outcome::Refused { forbidden: true, message: status.message.clone() },
                400 | 409 | 422 => Outcome::Refused { forbidden: false, message: status.message.clone() },
                _ => Outcome::Failed(format!("{} ({})", status.message, status.code)),
            },
            Ok(Err(e)) => Outcome::Failed(e.to_string()),
        }
    }

    /// Counts and logs how a write ended.
    fn report(&self, wanted: &Wanted, outcome: &Outcome) {
        let claim = &wanted.claim;
        let what = if wanted.clears { "cleared" } else { "set" };
        let result = match outcome {
            Outcome::Written => {
                tracing::debug!(%claim, what, "claim status.devices written");
                "written"
            }
            Outcome::Gone => {
                tracing::debug!(%claim, what, "claim gone; its status needs no write");
                "gone"
            }
            Outcome::Refused { forbidden: true, message } => {
                if self.shared.warned_forbidden.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%claim, %message, "claim status refused");
                } else {
                    tracing::warn!(
                        %claim,
                        %message,
                        "the API server refuses this driver's claim status writes: grant `patch` on resourceclaims/status and \
                         `associated-node:patch` on resourceclaims/driver (the chart does), or run with --claim-status=false; \
                         further refusals are logged at debug"
                    );
                }
                "refused"
            }
            Outcome::Refused { forbidden: false, message } => {
                // The claim moved on (deallocated, allocated anew, recreated): its status is no
                // longer this record's to write.
                tracing::info!(%claim, %message, what, "claim status not written: the claim changed since");
                "refused"
            }
            Outcome::Failed(error) => {
                tracing::warn!(%claim, %error, what, tries = MAX_TRIES, "claim status not written; giving up until the next start");
                "failed"
            }
        };
        self.shared.metrics.count(result);
    }
}

/// The server-side apply body: the claim by name and UID, with this driver's entries.
fn apply_body(claim: &ClaimRef, devices: &[AllocatedDeviceStatus]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name.as_str(), "namespace": claim.namespace.as_str(), "uid": claim.uid.as_str()},
        "status": {"devices": devices},
    })
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
