//! Where the plugin reads claims and pods: the API server (through the node's watch cache, with
//! a GET on a miss), or a fixed set of objects (`prepare-preview`, unit tests). Every API call
//! has a deadline, so a hung API server costs one claim its answer, never a whole batch: the
//! kubelet waits 45 s for a batch, and claims already prepared need no API at all.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use vgpu_scheduling::{Namespace, ObjectName};

use super::claim::ClaimRef;

/// How long one API read may take. Well under the kubelet's 45 s, and short enough that a batch
/// mixing prepared claims (answered from the checkpoint) with one that needs the API is answered
/// within 5 s even when the API server hangs.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(3);

/// A failed read; the claim's prepare fails with it and the kubelet retries. Never a reason to
/// delete state: only a definite "not found" is.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The API server did not answer in time.
    #[error("reading {what}: no answer from the API server within {after:?}")]
    Timeout {
        /// The object.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// The API server answered with an error.
    #[error("reading {what}")]
    Api {
        /// The object.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// Claims and pods, from the API or from a fixed set.
#[derive(Clone)]
pub enum ClaimSource {
    /// The API server, through the node's claim cache when there is one.
    Api {
        /// The client.
        client: kube::Client,
        /// The watch cache of this node's claims.
        cache: Option<Store<ResourceClaim>>,
        /// Deadline of each read.
        timeout: Duration,
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
        Self::Api { client, cache: None, timeout: DEFAULT_API_TIMEOUT }
    }

    /// Adds the watch cache (API sources only).
    #[must_use]
    pub fn with_cache(self, store: Store<ResourceClaim>) -> Self {
        match self {
            Self::Api { client, timeout, .. } => Self::Api { client, cache: Some(store), timeout },
            fixed @ Self::Fixed { .. } => fixed,
        }
    }

    /// The claim from the cache, only if it is the one asked for (same UID) and allocated: no
    /// API call, for metrics and for the periodic checks.
    pub fn cached(&self, claim: &ClaimRef) -> Option<Arc<ResourceClaim>> {
        match self {
            Self::Api { cache: Some(cache), .. } => {
                let c = cache.get(&ObjectRef::new(claim.name.as_str()).within(claim.namespace.as_str()))?;
                let current = c.metadata.uid.as_deref() == Some(claim.uid.as_str())
                    && c.status.as_ref().is_some_and(|s| s.allocation.is_some());
                current.then_some(c)
            }
            Self::Api { .. } => None,
            Self::Fixed { claims, .. } => named(claims, &claim.namespace, &claim.name).map(|c| Arc::new(c.clone())),
        }
    }

    /// The claim named by `claim` (whatever its UID: the caller compares), from the cache when
    /// it holds the allocated claim with that UID, else with one GET. `None`: the API says it
    /// does not exist.
    ///
    /// # Errors
    /// [`SourceError`] when the API does not answer in time or answers with an error.
    pub async fn claim(&self, claim: &ClaimRef) -> Result<Option<ResourceClaim>, SourceError> {
        if let Some(c) = self.cached(claim) {
            return Ok(Some((*c).clone()));
        }
        self.claim_by_name(&claim.namespace, &claim.name).await
    }

    /// The claim `namespace/name`, with one GET (fixed sources: by name).
    ///
    /// # Errors
    /// As [`ClaimSource::claim`].
    pub async fn claim_by_name(&self, namespace: &Namespace, name: &ObjectName) -> Result<Option<ResourceClaim>, SourceError> {
        match self {
            Self::Api { client, timeout, .. } => {
                get(Api::namespaced(client.clone(), namespace.as_str()), name, *timeout, "ResourceClaim", namespace).await
            }
            Self::Fixed { claims, .. } => Ok(named(claims, namespace, name).cloned()),
        }
    }

    /// The pod `namespace/name`; `None` when it does not exist (or, for fixed sources, was not
    /// given).
    ///
    /// # Errors
    /// As [`ClaimSource::claim`].
    pub async fn pod(&self, namespace: &Namespace, name: &ObjectName) -> Result<Option<Pod>, SourceError> {
        match self {
            Self::Api { client, timeout, .. } => {
                get(Api::namespaced(client.clone(), namespace.as_str()), name, *timeout, "Pod", namespace).await
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

async fn get<K>(
    api: Api<K>,
    name: &ObjectName,
    after: Duration,
    kind: &str,
    namespace: &Namespace,
) -> Result<Option<K>, SourceError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let what = || format!("{kind} {namespace}/{name}");
    // The name is a validated DNS subdomain: it cannot add a path segment or a query to the URL.
    match tokio::time::timeout(after, api.get_opt(name.as_str())).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(source)) => Err(SourceError::Api { what: what(), source }),
        Err(_) => Err(SourceError::Timeout { what: what(), after }),
    }
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
        assert!(source.pod(&want.namespace, &want.name).await.unwrap().is_none());
        let missing = ClaimRef::new("c", "c", "u1").unwrap();
        assert!(source.claim(&missing).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_hung_api_server_costs_one_deadline() {
        crate::install_crypto_provider();
        // An address that accepts connections and never answers: a listener nobody serves.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let config = kube::Config::new(url.parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let source = ClaimSource::Api { client, cache: None, timeout: Duration::from_millis(300) };
        let want = ClaimRef::new("ns", "c", "u1").unwrap();
        let started = std::time::Instant::now();
        let err = source.claim(&want).await.unwrap_err();
        assert!(matches!(err, SourceError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(err.to_string(), "reading ResourceClaim ns/c: no answer from the API server within 300ms");
        drop(listener);
    }
}
