//! Where the plugin reads claims and pods: the API server, one claim at a time (the kubelet names
//! the claim it wants prepared), or a fixed set of objects (`prepare-preview`, unit tests). Every
//! API call has a deadline, so a hung API server costs one claim its answer, never a whole batch:
//! the kubelet waits 45 s for a batch, and claims already prepared need no API at all.
//!
//! A node reads only its own claims, so its API traffic and memory follow the claims of this node,
//! not of the cluster (no watch of all claims; the ServiceAccount needs `get` on claims only).
//! With the pod watch ([`NodePods`]) most claims and pods were read ahead when their pod was bound
//! here, and a prepare takes them from there; what it lacks is read with a quorum GET (from etcd,
//! never from the API server's watch cache). A cached answer with the right UID, allocated here,
//! proves nothing: a standalone claim keeps its UID when it is deallocated and allocated again,
//! on this node, for another pod, and a lagging cache still shows the old devices and limits. The
//! time each claim was last read current (same UID, allocated here) is kept until it is
//! unprepared: a periodic check re-reads a claim only when that is older than the check asks.
//! Nothing else of the claim is kept: the pod it was prepared for is in its record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::GetParams;
use kube::{Api, Resource as _};
use vgpu_scheduling::{Namespace, ObjectName, Uid};

use super::node_pods::NodePods;
use super::read::{Cached, SourceError, get, get_current};
use super::slim::PodRead;
use crate::plugin::claim::{ClaimRef, allocated_here};

/// How long one API read may take. Well under the kubelet's 45 s, and short enough that a batch
/// mixing prepared claims (answered from the checkpoint) with one that needs the API is answered
/// within 5 s even when the API server hangs.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(3);

/// When each of this node's claims was last read current from the API (same UID, allocated
/// here): 48 bytes or so per claim. Entries leave when the claim is unprepared or a read finds it
/// gone or no longer ours, so the cache holds this node's claims only.
#[derive(Clone)]
pub struct ClaimCache {
    driver: String,
    node: String,
    entries: Arc<Mutex<Entries>>,
}

/// When each claim was last read current.
type Entries = HashMap<Uid, Instant>;

impl ClaimCache {
    /// An empty cache for the claims of `driver` on `node`.
    pub fn new(driver: impl Into<String>, node: impl Into<String>) -> Self {
        Self { driver: driver.into(), node: node.into(), entries: Arc::default() }
    }

    /// How many claims it holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic elsewhere cannot leave the map half-written: every update is one insert or remove.
        vgpu_dra_runtime::sync::lock(&self.entries)
    }

    /// Whether `found` is the claim asked for and allocated to this node.
    fn current(&self, claim: &ClaimRef, found: &ResourceClaim) -> bool {
        found.metadata.uid.as_deref() == Some(claim.uid.as_str()) && allocated_here(found, &self.driver, &self.node)
    }

    /// Notes what a read found of `claim`: current now, or gone or not ours.
    fn update(&self, claim: &ClaimRef, found: Option<&ResourceClaim>) {
        match found {
            Some(c) if self.current(claim, c) => {
                self.lock().insert(claim.uid.clone(), Instant::now());
            }
            _ => {
                self.lock().remove(&claim.uid);
            }
        }
    }
}

/// Claims and pods, from the API or from a fixed set.
#[derive(Clone)]
pub enum ClaimSource {
    /// The API server, claim by claim.
    Api {
        /// The client.
        client: kube::Client,
        /// This node's claims as last read; without it every read is a quorum GET and nothing
        /// is kept.
        cache: Option<ClaimCache>,
        /// Deadline of each read.
        timeout: Duration,
        /// This node's pods and the claims read ahead for them (`--pod-watch`).
        node_pods: Option<NodePods>,
    },
    /// Fixed objects: what `prepare-preview` was given.
    Fixed {
        /// The claims.
        claims: Arc<Vec<ResourceClaim>>,
        /// The pods.
        pods: Arc<Vec<Pod>>,
    },
}

impl ClaimSource {
    /// The API through `client`, without a cache yet.
    pub fn api(client: kube::Client) -> Self {
        Self::Api { client, cache: None, timeout: DEFAULT_API_TIMEOUT, node_pods: None }
    }

    /// Adds the node's claim cache (API sources only).
    #[must_use]
    pub fn with_cache(self, cache: ClaimCache) -> Self {
        match self {
            Self::Api { client, timeout, node_pods, .. } => Self::Api { client, cache: Some(cache), timeout, node_pods },
            fixed @ Self::Fixed { .. } => fixed,
        }
    }

    /// Takes claims and pods from what the node's pod watch read ahead, when it has them (API
    /// sources only).
    #[must_use]
    pub fn with_node_pods(self, pods: NodePods) -> Self {
        match self {
            Self::Api { client, timeout, cache, .. } => Self::Api { client, cache, timeout, node_pods: Some(pods) },
            fixed @ Self::Fixed { .. } => fixed,
        }
    }

    /// Whether `claim` (same UID) was read allocated here less than `age` ago: no API call.
    /// Fixed sources: whether they hold it.
    pub fn read_within(&self, claim: &ClaimRef, age: Duration) -> bool {
        match self {
            Self::Api { cache: Some(cache), .. } => cache.lock().get(&claim.uid).is_some_and(|read| read.elapsed() < age),
            Self::Api { .. } => false,
            Self::Fixed { claims, .. } => named(claims, &claim.namespace, &claim.name).is_some(),
        }
    }

    /// Drops what was read ahead for `claim`, now prepared (see [`NodePods::prepared`]).
    pub fn prepared(&self, claim: &ClaimRef) {
        if let Self::Api { node_pods: Some(pods), .. } = self {
            pods.prepared(claim);
        }
    }

    /// Forgets what was read of the claim `uid` (it was unprepared).
    pub fn forget(&self, uid: &Uid) {
        if let Self::Api { cache, node_pods, .. } = self {
            if let Some(cache) = cache {
                cache.lock().remove(uid);
            }
            if let Some(pods) = node_pods {
                pods.forget(uid);
            }
        }
    }

    /// The claim the kubelet asks to prepare: as read ahead when its pod was bound here (see
    /// [`NodePods::take`]), else as [`ClaimSource::claim`] reads it. The periodic checks use
    /// [`ClaimSource::claim`], which always asks the API.
    ///
    /// # Errors
    /// As [`ClaimSource::claim`].
    pub async fn claim_to_prepare(&self, claim: &ClaimRef) -> Result<Option<ResourceClaim>, SourceError> {
        if let Self::Api { cache, timeout, node_pods: Some(pods), .. } = self
            && let Some(ahead) = pods.take(claim, *timeout).await
        {
            if let Some(cache) = cache {
                cache.update(claim, Some(&ahead));
            }
            return Ok(Some(ahead));
        }
        self.claim(claim).await
    }

    /// The claim named by `claim` (whatever its UID: the caller compares), read now with a
    /// quorum GET. `None`: the API says it does not exist.
    ///
    /// # Errors
    /// [`SourceError`] when the API does not answer in time or answers with an error.
    pub async fn claim(&self, claim: &ClaimRef) -> Result<Option<ResourceClaim>, SourceError> {
        let Self::Api { cache, .. } = self else {
            return self.claim_by_name(&claim.namespace, &claim.name).await;
        };
        let found = self.claim_by_name(&claim.namespace, &claim.name).await?;
        if let Some(cache) = cache {
            cache.update(claim, found.as_ref());
        }
        Ok(found)
    }

    /// Whether claims come from the API (a kubelet's prepare), where a claim reserved for no
    /// one is one whose pod is gone; a fixed claim (`prepare-preview`) is taken as it is.
    pub fn is_api(&self) -> bool {
        matches!(self, Self::Api { .. })
    }

    /// The claim `namespace/name`, with one quorum GET (fixed sources: by name).
    ///
    /// # Errors
    /// As [`ClaimSource::claim`].
    pub async fn claim_by_name(&self, namespace: &Namespace, name: &ObjectName) -> Result<Option<ResourceClaim>, SourceError> {
        match self {
            Self::Api { client, timeout, .. } => {
                let api: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace.as_str());
                get(&api, name, &GetParams::default(), *timeout, || format!("ResourceClaim {namespace}/{name}")).await
            }
            Self::Fixed { claims, .. } => Ok(named(claims, namespace, name).cloned()),
        }
    }

    /// The pod `namespace/name`, read for its containers and claims, which cannot change once
    /// the pod exists: the API server's watch cache answers when it holds the pod with UID `uid`
    /// (no read from etcd), else it is read with a quorum GET. `None` when it does not exist (or,
    /// for fixed sources, was not given); the caller still compares the UID.
    ///
    /// # Errors
    /// As [`ClaimSource::claim`].
    pub async fn pod(&self, namespace: &Namespace, name: &ObjectName, uid: &str) -> Result<Option<Pod>, SourceError> {
        match self {
            Self::Api { client, timeout, node_pods, .. } => {
                if let Some(pod) = node_pods.as_ref().and_then(|p| p.pod(namespace, name, uid)) {
                    return Ok(Some(pod));
                }
                let api: Api<PodRead> = Api::namespaced(client.clone(), namespace.as_str());
                let cached = |p: &PodRead| if p.meta().uid.as_deref() == Some(uid) { Cached::Current } else { Cached::Unsure };
                let read = get_current(&api, name, *timeout, || format!("Pod {namespace}/{name}"), cached).await?;
                Ok(read.map(Pod::from))
            }
            Self::Fixed { pods, .. } => Ok(named(pods, namespace, name).cloned()),
        }
    }
}

/// Why an event is recorded on a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimEvent {
    /// The claim's share no longer fits its card (a restart with a smaller configuration).
    OverCapacity,
}

impl ClaimSource {
    /// Records a Warning event on `claim` (`kubectl describe resourceclaim` shows it), so the
    /// claim's owner learns what the node's log says. Best effort, with the read deadline: a
    /// failure is logged, never passed on. Fixed sources record nothing.
    pub async fn warn(&self, claim: &ClaimRef, node: &str, what: ClaimEvent, note: String) {
        use kube::runtime::events::{Event, EventType, Recorder, Reporter};
        let Self::Api { client, timeout, .. } = self else { return };
        let reporter = Reporter { controller: "vgpu-dra".into(), instance: Some(node.to_owned()) };
        let recorder = Recorder::new(client.clone(), reporter);
        let reason = match what {
            ClaimEvent::OverCapacity => "OverCapacity",
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Prepare".into(),
            secondary: None,
        };
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            name: Some(claim.name.to_string()),
            namespace: Some(claim.namespace.to_string()),
            uid: Some(claim.uid.to_string()),
            ..Default::default()
        };
        match tokio::time::timeout(*timeout, recorder.publish(&event, &reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(claim = %claim, error = %e, "event not recorded"),
            Err(_) => tracing::warn!(claim = %claim, "event not recorded: no answer from the API server"),
        }
    }
}

/// The object `namespace/name` of a fixed list.
fn named<'a, K: kube::Resource>(list: &'a [K], namespace: &Namespace, name: &ObjectName) -> Option<&'a K> {
    list.iter()
        .find(|o| o.meta().namespace.as_deref() == Some(namespace.as_str()) && o.meta().name.as_deref() == Some(name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(ns: &str, name: &str, uid: &str) -> ResourceClaim {
        serde_saphyr::from_str(&format!("metadata: {{name: {name}, namespace: {ns}, uid: {uid}}}\nspec: {{}}\n")).unwrap()
    }

    #[tokio::test]
    async fn fixed_sources_find_by_namespace_and_name() {
        let source =
            ClaimSource::Fixed { claims: Arc::new(vec![claim("a", "c", "u1"), claim("b", "c", "u2")]), pods: Arc::default() };
        let want = ClaimRef::new("b", "c", "u9").unwrap();
        let found = source.claim(&want).await.unwrap().unwrap();
        assert_eq!(found.metadata.uid.as_deref(), Some("u2"), "the caller compares UIDs");
        assert!(source.pod(&want.namespace, &want.name, "u1").await.unwrap().is_none());
        let missing = ClaimRef::new("c", "c", "u1").unwrap();
        assert!(source.claim(&missing).await.unwrap().is_none());
    }

    fn allocated(uid: &str, driver: &str, pool: &str) -> ResourceClaim {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: c, namespace: ns, uid: {uid}, managedFields: [{{manager: kube-scheduler}}]}}\nspec: {{}}\n\
status: {{allocation: {{devices: {{results: [{{driver: {driver}, pool: {pool}, device: hami-gpu-0, request: gpu}}]}}}}}}\n"
        ))
        .unwrap()
    }

    #[tokio::test]
    async fn the_cache_keeps_only_this_nodes_claims_and_forgets_them() {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let cache = ClaimCache::new("d", "n");
        let source = ClaimSource::api(kube::Client::try_from(config).unwrap()).with_cache(cache.clone());
        let want = ClaimRef::new("ns", "c", "u1").unwrap();
        for (found, kept) in [
            (allocated("u1", "d", "other-node"), false),
            (allocated("u1", "other-driver", "n"), false),
            (allocated("u2", "d", "n"), false),
            (claim("ns", "c", "u1"), false),
            (allocated("u1", "d", "n"), true),
        ] {
            cache.update(&want, Some(&found));
            assert_eq!(source.read_within(&want, Duration::from_secs(60)), kept, "{found:?}");
        }
        assert!(!source.read_within(&want, Duration::ZERO), "too old for the check");
        // A read that finds it gone, or another node's, drops it; so does an unprepare.
        cache.update(&want, None);
        assert!(cache.is_empty());
        cache.update(&want, Some(&allocated("u1", "d", "n")));
        source.forget(&want.uid);
        assert!(cache.is_empty());
    }

    #[tokio::test]
    async fn a_hung_api_server_costs_one_deadline() {
        crate::install_crypto_provider();
        // An address that accepts connections and never answers: a listener nobody serves.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let config = kube::Config::new(url.parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let source = ClaimSource::Api { client, cache: None, timeout: Duration::from_millis(300), node_pods: None };
        let want = ClaimRef::new("ns", "c", "u1").unwrap();
        let started = std::time::Instant::now();
        let err = source.claim(&want).await.unwrap_err();
        assert!(matches!(err, SourceError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(err.to_string(), "reading ResourceClaim ns/c: no answer from the API server within 300ms");
        // More reads than may run at once: those waiting for a turn keep the same deadline.
        let reads = (0..3 * super::super::read::API_READS_AT_ONCE).map(|_| source.claim(&want));
        let started = std::time::Instant::now();
        for result in futures::future::join_all(reads).await {
            assert!(matches!(result, Err(SourceError::Timeout { .. })), "{result:?}");
        }
        assert!(started.elapsed() < Duration::from_millis(900), "{:?}: a wait for a turn added a deadline", started.elapsed());
        drop(listener);
    }
}
