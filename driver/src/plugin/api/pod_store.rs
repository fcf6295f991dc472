//! What the watch of this node's pods has found, and its bookkeeping: the pending pods bound
//! here that name claims, and the claims read ahead for them. Pure: no I/O;
//! [`super::node_pods`] feeds it from the watch and the reads, and hands out what it holds.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use super::slim;

/// What the watch and the reads ahead have found.
#[derive(Default)]
pub(super) struct Store {
    /// Pending pods by UID, as [`slim::pod`] keeps them, with the claims already asked for.
    pub(super) pods: HashMap<String, PodEntry>,
    /// While the watch relists: the pods listed so far, which replace `pods` when it is done.
    pub(super) relisting: Option<HashMap<String, PodEntry>>,
    /// Claims read or being read ahead, by `namespace/name`.
    pub(super) claims: HashMap<String, Slot>,
    /// The watch failed since its last full list: it may have missed a pod's deletion, so
    /// nothing read ahead is handed out until the next list is done.
    pub(super) stale: bool,
}

/// A pod as kept (as JSON: a parsed `Pod` takes several kilobytes even when nearly empty, and a
/// node may hold many pending pods), and the claims of it read ahead (by name), so an update
/// reads none twice. Its JSON is kept only while a prepare may still need it: not every claim
/// read ahead for it has been prepared; afterwards the entry only says that the pod is bound
/// here and still pending (so that its next update asks for nothing again).
pub(super) struct PodEntry {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) json: Option<Box<[u8]>>,
    pub(super) asked: Vec<String>,
    /// The claims of `asked` prepared since.
    pub(super) prepared: Vec<String>,
}

impl PodEntry {
    /// Whether a prepare may still read this pod.
    pub(super) fn awaits_prepares(&self) -> bool {
        self.asked.iter().any(|n| !self.prepared.contains(n))
    }
}

/// One claim read ahead.
pub(super) enum Slot {
    /// Its read is under way; the sender says when it is done.
    Reading { done: watch::Receiver<bool> },
    /// Read with UID `uid` at `read`, allocated here and reserved for the pod with UID `pod`;
    /// kept as JSON until a prepare takes it (the same reason as for pods).
    Ready { uid: String, pod: String, read: tokio::time::Instant, json: Box<[u8]> },
}

/// One read ahead to start: the claim `namespace/name` of the pod with UID `pod`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Read {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) pod: String,
}

impl Read {
    /// `namespace/name`, the key of its [`Slot`] (as [`crate::plugin::claim::ClaimRef::key`] makes it for a prepare).
    pub(super) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Keeps `pod` in `into` while it is bound, names claims and is pending; returns its claims not
/// asked for yet. A pod that starts, finishes or is on its way out is forgotten with its claims
/// read ahead: the kubelet prepares every claim of a pod before it starts any container, so
/// nothing reads them again (a prepare that comes after all the same reads the API).
pub(super) fn admit(
    into: &mut HashMap<String, PodEntry>,
    previous: Option<&HashMap<String, PodEntry>>,
    claims: &mut HashMap<String, Slot>,
    pod: Pod,
) -> Vec<Read> {
    let Some(uid) = pod.metadata.uid.clone() else { return Vec::new() };
    let leaving = pod.metadata.deletion_timestamp.is_some()
        || pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Succeeded" || p == "Failed");
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_none_or(|p| p == "Pending");
    let names = claim_names(&pod);
    if leaving || !pending || names.is_empty() {
        into.remove(&uid);
        drop_claims_of(claims, &uid);
        return Vec::new();
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let known = into.get(&uid).or_else(|| previous.and_then(|p| p.get(&uid)));
    let mut asked = known.map(|e| e.asked.clone()).unwrap_or_default();
    let prepared = known.map(|e| e.prepared.clone()).unwrap_or_default();
    let mut reads = Vec::new();
    for name in names {
        if !asked.contains(&name) {
            asked.push(name.clone());
            reads.push(Read { namespace: namespace.clone(), name, pod: uid.clone() });
        }
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut entry = PodEntry { namespace, name, json: None, asked, prepared };
    if entry.awaits_prepares() {
        let Ok(json) = serde_json::to_vec(&slim::pod(&pod)) else { return Vec::new() };
        entry.json = Some(json.into());
    }
    into.insert(uid, entry);
    reads
}

/// Forgets the pod `uid` and its claims read ahead.
pub(super) fn remove(store: &mut Store, uid: &str) {
    store.pods.remove(uid);
    if let Some(listing) = &mut store.relisting {
        listing.remove(uid);
    }
    drop_claims_of(&mut store.claims, uid);
}

impl Store {
    /// Whether the pod `uid` is bound here, as last listed or being listed.
    pub(super) fn has_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid) || self.relisting.as_ref().is_some_and(|l| l.contains_key(uid))
    }
}

/// Drops the claims read ahead for the pod `uid`.
fn drop_claims_of(claims: &mut HashMap<String, Slot>, uid: &str) {
    claims.retain(|_, slot| !matches!(slot, Slot::Ready { pod, .. } if pod == uid));
}

/// The claims `pod` names: by name, or through its status for claims made from templates (the
/// controller writes their names there before the pod can be scheduled).
fn claim_names(pod: &Pod) -> Vec<String> {
    let Some(entries) = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()) else { return Vec::new() };
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    let mut names: Vec<String> = entries
        .iter()
        .filter_map(|e| {
            e.resource_claim_name
                .clone()
                .or_else(|| statuses?.iter().find(|s| s.name == e.name).and_then(|s| s.resource_claim_name.clone()))
        })
        .collect();
    names.sort();
    names.dedup();
    names
}
