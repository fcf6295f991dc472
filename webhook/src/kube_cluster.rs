//! The real cluster behind an admission ([`Cluster`], [`QuotaStore`](crate::quota::QuotaStore)):
//! the driver's ResourceSlices, listed at most once per cache period, and the templates created
//! in the admitted object's namespace, with every call bounded by a timeout.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use tokio::sync::Mutex;
use vgpu_scheduling::ClassFacts;
use vgpu_scheduling::compat::CardModel;

use crate::admit::{AdmitError, Cluster};

/// Field manager of the templates this webhook creates.
const MANAGER: &str = "vgpu-dra-webhook";

/// The real cluster: ResourceSlices listed at most once per `cache_for`, templates created with
/// every call bounded by `timeout`.
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
    driver: String,
    timeout: Duration,
    cache_for: Duration,
    cache: Arc<Mutex<Option<(Instant, ClassFacts)>>>,
    /// Templates known to exist, by namespace and name, with when that was last confirmed.
    known: Arc<std::sync::Mutex<HashMap<(String, String), Instant>>>,
    /// Card models named by configuration, offered whether or not a node publishes them now.
    card_models: Vec<CardModel>,
    /// Where the quota ledgers are kept: the webhook's own namespace.
    ledger_namespace: String,
}

/// How long a template confirmed to exist with our content is not asked for again: pods of one
/// shape arrive in bursts (a Deployment, a Job), and one create per shape and minute keeps
/// admissions off the API server. A template's spec cannot be changed, only the template
/// deleted and made again; whoever may delete templates in a namespace can swap one between any
/// admission and the claim made from it, so this adds no way in (docs/security.md).
const KNOWN_TEMPLATE_FOR: Duration = Duration::from_secs(60);

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").field("driver", &self.driver).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// A cluster reading slices of `driver` through `client`.
    pub fn new(client: kube::Client, driver: &str, timeout: Duration, cache_for: Duration) -> Self {
        Self {
            client,
            driver: driver.to_owned(),
            timeout,
            cache_for,
            cache: Arc::default(),
            known: Arc::default(),
            card_models: Vec::new(),
            ledger_namespace: String::new(),
        }
    }

    /// This cluster keeping quota ledgers in `namespace` (the webhook's own).
    #[must_use]
    pub fn with_ledger_namespace(self, namespace: &str) -> Self {
        Self { ledger_namespace: namespace.to_owned(), ..self }
    }

    pub(crate) fn client(&self) -> kube::Client {
        self.client.clone()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn ledger_namespace(&self) -> &str {
        &self.ledger_namespace
    }

    /// This cluster offering `models` besides the published ones (`--card-model`).
    #[must_use]
    pub fn with_card_models(self, models: &[CardModel]) -> Self {
        Self { card_models: models.to_vec(), ..self }
    }

    /// The known-templates map; a poisoned lock only means a panicking admission, and the map
    /// holds nothing that panic could leave half-written.
    fn known_lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Instant>> {
        let mut known = vgpu_dra_runtime::sync::lock(&self.known);
        // Bounded by the shapes in use: forget the stale ones as we go.
        if known.len() > 4096 {
            known.retain(|_, at| at.elapsed() < KNOWN_TEMPLATE_FOR);
        }
        known
    }

    async fn list_facts(&self) -> Result<ClassFacts, AdmitError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.driver={}", self.driver));
        let list = tokio::time::timeout(self.timeout, api.list(&params))
            .await
            .map_err(|_| AdmitError::Timeout { what: "listing ResourceSlices".into(), timeout: self.timeout })?
            .map_err(|source| AdmitError::ListSlices { driver: self.driver.clone(), source })?;
        Ok(ClassFacts::from_slices(&list.items, &self.driver).with_models(self.card_models.iter().cloned()))
    }
}

impl KubeCluster {
    /// Whether the existing template of `template`'s name holds what creating `template` would
    /// store: its spec equal to a server-side dry run of ours under another name (so defaults
    /// and canonical quantities compare equal), and our labels.
    async fn check_existing(
        &self,
        api: &Api<ResourceClaimTemplate>,
        namespace: &str,
        template: &ResourceClaimTemplate,
    ) -> Result<(), AdmitError> {
        let name = template.metadata.name.clone().unwrap_or_default();
        let failed = |source| AdmitError::CheckTemplate { namespace: namespace.to_owned(), name: name.clone(), source };
        let timed_out = |what: &str| AdmitError::Timeout {
            what: format!("{what} ResourceClaimTemplate {namespace}/{name}"),
            timeout: self.timeout,
        };
        let stored =
            tokio::time::timeout(self.timeout, api.get(&name)).await.map_err(|_| timed_out("reading"))?.map_err(failed)?;
        let mut probe = template.clone();
        probe.metadata.name = None;
        probe.metadata.generate_name = Some(format!("{name}-"));
        let params = PostParams { dry_run: true, field_manager: Some(MANAGER.to_owned()) };
        let expected = tokio::time::timeout(self.timeout, api.create(&params, &probe))
            .await
            .map_err(|_| timed_out("dry-run creating a copy of"))?
            .map_err(failed)?;
        let labels_kept = template
            .metadata
            .labels
            .iter()
            .flatten()
            .all(|(k, v)| stored.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v));
        if stored.spec == expected.spec && labels_kept {
            return Ok(());
        }
        tracing::debug!(namespace, template = name, stored = ?stored.spec, expected = ?expected.spec, "template content differs");
        Err(AdmitError::TemplateConflict { namespace: namespace.to_owned(), name })
    }
}

impl Cluster for KubeCluster {
    async fn class_facts(&self) -> Result<ClassFacts, AdmitError> {
        // One list at a time: admissions arriving together share it.
        let mut cache = self.cache.lock().await;
        if let Some((at, facts)) = cache.as_ref()
            && at.elapsed() < self.cache_for
        {
            return Ok(facts.clone());
        }
        match self.list_facts().await {
            Ok(facts) => {
                *cache = Some((Instant::now(), facts.clone()));
                Ok(facts)
            }
            // Slices change slowly: an older answer beats refusing every GPU pod.
            Err(e) => match cache.as_ref() {
                Some((_, facts)) => {
                    tracing::warn!(error = %crate::error_chain(&e), "using the last known ResourceSlices");
                    Ok(facts.clone())
                }
                None => Err(e),
            },
        }
    }

    async fn create_templates(&self, namespace: &str, templates: &[ResourceClaimTemplate]) -> Result<(), AdmitError> {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), namespace);
        let params = PostParams { dry_run: false, field_manager: Some(MANAGER.to_owned()) };
        for template in templates {
            let name = template.metadata.name.clone().unwrap_or_default();
            let key = (namespace.to_owned(), name.clone());
            if self.known_lock().get(&key).is_some_and(|at| at.elapsed() < KNOWN_TEMPLATE_FOR) {
                continue;
            }
            let mut template = template.clone();
            template.metadata.namespace = Some(namespace.to_owned());
            let what = || format!("creating ResourceClaimTemplate {namespace}/{name}");
            match tokio::time::timeout(self.timeout, api.create(&params, &template)).await {
                Err(_) => return Err(AdmitError::Timeout { what: what(), timeout: self.timeout }),
                Ok(Ok(_)) => {
                    tracing::info!(namespace, template = name, "ResourceClaimTemplate created");
                    self.known_lock().insert(key, Instant::now());
                }
                // Another admission made it first, or someone else took the name: ours only when
                // its content is.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                    self.check_existing(&api, namespace, &template).await?;
                    self.known_lock().insert(key, Instant::now());
                }
                Ok(Err(source)) => {
                    return Err(AdmitError::CreateTemplate { namespace: namespace.to_owned(), name, source });
                }
            }
        }
        Ok(())
    }
}
