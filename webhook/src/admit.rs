//! One admission: read the pod, convert it with the class's facts, create the templates it
//! references, answer. The cluster side sits behind [`Cluster`] so the review handling is tested
//! without an API server.
//!
//! Templates are created only in the namespace of the request, and only for an object of that
//! namespace. A template that exists already is used only when its content is what this
//! conversion gives (read back and compared with a server-side dry run of ours, so defaults and
//! canonical quantities compare equal): one someone else made under that name is not handed to
//! the pod.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;
use vgpu_scheduling::compat::{CardModel, convert_volcano_job, job_resource_names, pick, pod_resource_names};
use vgpu_scheduling::{ClassFacts, CompatSettings, convert_pod};

use crate::metrics::{Metrics, Outcome};
use crate::review::{self, Decision};

/// Field manager of the templates this webhook creates.
const MANAGER: &str = "vgpu-dra-webhook";

/// Errors of the cluster side of an admission.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// Listing the driver's ResourceSlices failed.
    #[error("listing the ResourceSlices of driver {driver}")]
    ListSlices {
        /// The driver.
        driver: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Creating a template failed for another reason than it existing already.
    #[error("creating ResourceClaimTemplate {namespace}/{name}")]
    CreateTemplate {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A template of that name exists with other content than the conversion gives.
    #[error(
        "ResourceClaimTemplate {namespace}/{name} exists with content vgpu-dra did not give it, so pods of this shape \
         cannot use it: delete it (vgpu-dra makes it again) or rename it"
    )]
    TemplateConflict {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// An existing template could not be read back or compared.
    #[error("checking the existing ResourceClaimTemplate {namespace}/{name}")]
    CheckTemplate {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Reading or writing a quota input failed.
    #[error("{what}")]
    Quota {
        /// The step.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The namespace's quota ledger changed under every attempt to reserve.
    #[error("the GPU quota ledger of namespace {namespace} changed under each of {attempts} attempts")]
    Contended {
        /// The namespace.
        namespace: String,
        /// Attempts made.
        attempts: usize,
    },
    /// The OS's random generator failed.
    #[error("no random bytes from the operating system for a quota reservation")]
    Random,
    /// An API call took longer than its timeout.
    #[error("{what}: no answer from the API server within {timeout:?}")]
    Timeout {
        /// The step.
        what: String,
        /// The timeout.
        timeout: Duration,
    },
}

/// What an admission needs from the cluster.
pub trait Cluster: Send + Sync + 'static {
    /// What the class's ResourceSlices offer.
    fn class_facts(&self) -> impl Future<Output = Result<ClassFacts, AdmitError>> + Send;
    /// Creates `templates` in `namespace`; one that exists already counts as created when its
    /// content is the same, and is [`AdmitError::TemplateConflict`] otherwise.
    fn create_templates(
        &self,
        namespace: &str,
        templates: &[ResourceClaimTemplate],
    ) -> impl Future<Output = Result<(), AdmitError>> + Send;
}

/// Answers pod admission reviews.
#[derive(Debug)]
pub struct Admitter<C> {
    /// The name sets it converts (HAMi's, Volcano's), each with its own defaults; a pod or Job
    /// is converted with the one whose names it uses.
    flavours: Vec<CompatSettings>,
    cluster: C,
    metrics: Metrics,
    deadline: Duration,
}

/// Default bound on one admission: under the registration's default `timeoutSeconds` (10), so
/// the client reads our message rather than the API server's generic timeout.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(9);

impl<C: Cluster> Admitter<C> {
    /// An admitter converting with `settings` against `cluster`.
    pub fn new(settings: CompatSettings, cluster: C, metrics: Metrics) -> Self {
        Self { flavours: vec![settings], cluster, metrics, deadline: DEFAULT_DEADLINE }
    }

    /// This admitter converting the names of `more` as well (another flavour's set).
    #[must_use]
    pub fn with_flavour(mut self, more: CompatSettings) -> Self {
        self.flavours.push(more);
        self
    }

    /// This admitter answering within `deadline` (a refusal when the cluster is slower).
    #[must_use]
    pub fn with_deadline(self, deadline: Duration) -> Self {
        Self { deadline, ..self }
    }

    /// The settings it converts with: the first flavour's.
    pub fn settings(&self) -> &CompatSettings {
        &self.flavours[0]
    }

    /// `flavour` for an object, with a denial counted and answered when it mixes flavours.
    fn flavour_or_deny(&self, kind: &str, names: &[(String, String)]) -> Result<Option<&CompatSettings>, (Outcome, Decision)> {
        pick(&self.flavours, kind, names).map_err(|message| {
            self.metrics.denied("mixed_names");
            (Outcome::Denied, Decision::Deny { message })
        })
    }

    /// The answer to the pod review in `body`; never fails: errors are denials the client sees.
    pub async fn review(&self, body: &[u8]) -> AdmissionReview<DynamicObject> {
        let started = Instant::now();
        let request = match self.parse::<Pod>(body, "Pod", started) {
            Ok(r) => r,
            Err(answer) => return *answer,
        };
        let decided = self.bounded("Pod", self.decide_pod(&request)).await;
        self.finish("Pod", &request, decided, started)
    }

    /// The answer to the Volcano Job review in `body`, as [`Admitter::review`].
    pub async fn review_job(&self, body: &[u8]) -> AdmissionReview<DynamicObject> {
        let started = Instant::now();
        let request = match self.parse::<DynamicObject>(body, "Volcano Job", started) {
            Ok(r) => r,
            Err(answer) => return *answer,
        };
        let decided = self.bounded("Volcano Job", self.decide_job(&request)).await;
        self.finish("Volcano Job", &request, decided, started)
    }

    /// The request in `body`, or the answer to a body that is not one.
    fn parse<K: kube::Resource + DeserializeOwned>(
        &self,
        body: &[u8],
        kind: &'static str,
        started: Instant,
    ) -> Result<AdmissionRequest<K>, Box<AdmissionReview<DynamicObject>>> {
        review::parse::<K>(body, kind).map_err(|e| {
            tracing::warn!(error = %e, "unreadable admission review");
            self.metrics.observe(Outcome::Invalid, started.elapsed().as_secs_f64());
            Box::new(review::invalid(&e))
        })
    }

    /// `decide` within the deadline; a refusal past it.
    async fn bounded(&self, kind: &str, decide: impl Future<Output = (Outcome, Decision)>) -> (Outcome, Decision) {
        match tokio::time::timeout(self.deadline, decide).await {
            Ok(answer) => answer,
            // Templates made before the deadline stay: they are shared and named by content.
            Err(_) => {
                let e = AdmitError::Timeout { what: format!("admitting the {kind}"), timeout: self.deadline };
                (Outcome::Error, error_decision(&e))
            }
        }
    }

    /// Logs and counts the decision and answers with it.
    fn finish<K: kube::Resource>(
        &self,
        kind: &str,
        request: &AdmissionRequest<K>,
        (outcome, decision): (Outcome, Decision),
        started: Instant,
    ) -> AdmissionReview<DynamicObject> {
        let name = request.name.as_str();
        let namespace = request.namespace.as_deref().unwrap_or_default();
        match &decision {
            Decision::Deny { message } => tracing::info!(kind, namespace, name, ?outcome, message, "denied"),
            Decision::Allow { patch, .. } if !patch.is_empty() => {
                tracing::info!(kind, namespace, name, operations = patch.len(), dry_run = request.dry_run, "converted");
            }
            Decision::Allow { .. } => tracing::debug!(kind, namespace, name, "left unchanged"),
        }
        self.metrics.observe(outcome, started.elapsed().as_secs_f64());
        review::respond(request, decision)
    }

    async fn decide_pod(&self, request: &AdmissionRequest<Pod>) -> (Outcome, Decision) {
        let Some(pod) = request.object.as_ref().filter(|_| review::is_create(request)) else {
            return unchanged();
        };
        // Only pods with HAMi resources are sent, but a hand-made registration may send others:
        // those need no slices.
        let settings = match self.flavour_or_deny("pod", &pod_resource_names(pod)) {
            Ok(Some(settings)) => settings,
            Ok(None) => return unchanged(),
            Err(denied) => return denied,
        };
        let facts = match self.cluster.class_facts().await {
            Ok(f) => f,
            Err(e) => return (Outcome::Error, error_decision(&e)),
        };
        let conversion = match convert_pod(pod, settings, &facts) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.denied(e.reason());
                return (Outcome::Denied, Decision::Deny { message: e.to_string() });
            }
        };
        let namespace = match self.namespace_of(request, pod.metadata.namespace.as_deref()) {
            Ok(namespace) => namespace,
            Err(denied) => return denied,
        };
        self.create_and_allow(request.dry_run, namespace, conversion.templates, conversion.patch, conversion.warnings).await
    }

    async fn decide_job(&self, request: &AdmissionRequest<DynamicObject>) -> (Outcome, Decision) {
        let Some(job) = request.object.as_ref().filter(|_| review::is_create(request)) else {
            return unchanged();
        };
        let Ok(job_json) = serde_json::to_value(job) else { return unchanged() };
        let settings = match self.flavour_or_deny("Volcano Job", &job_resource_names(&job_json)) {
            Ok(Some(settings)) => settings,
            Ok(None) => return unchanged(),
            Err(denied) => return denied,
        };
        let facts = match self.cluster.class_facts().await {
            Ok(f) => f,
            Err(e) => return (Outcome::Error, error_decision(&e)),
        };
        let conversion = match convert_volcano_job(&job_json, settings, &facts) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.denied(e.reason());
                return (Outcome::Denied, Decision::Deny { message: e.to_string() });
            }
        };
        let namespace = match self.namespace_of(request, job.metadata.namespace.as_deref()) {
            Ok(namespace) => namespace,
            Err(denied) => return denied,
        };
        self.create_and_allow(request.dry_run, namespace, conversion.templates, conversion.patch, conversion.warnings).await
    }

    /// The namespace templates go to: the request's, which the object must not contradict (the
    /// API server never sends such a review; a forged one is refused, not followed elsewhere).
    fn namespace_of<'a, K: kube::Resource>(
        &self,
        request: &'a AdmissionRequest<K>,
        object_namespace: Option<&str>,
    ) -> Result<&'a str, (Outcome, Decision)> {
        let deny = |message: String| {
            self.metrics.denied("namespace");
            Err((Outcome::Denied, Decision::Deny { message }))
        };
        match (request.namespace.as_deref(), object_namespace) {
            (None | Some(""), _) => deny("vgpu-dra webhook: the review names no namespace".to_owned()),
            (Some(ours), Some(theirs)) if !theirs.is_empty() && theirs != ours => {
                deny(format!("vgpu-dra webhook: the object is of namespace {theirs:?}, the request of {ours:?}"))
            }
            (Some(ours), _) => Ok(ours),
        }
    }

    /// Creates the templates a conversion references (none on a dry run) and admits with its
    /// patch; a conversion that changes nothing is admitted as is.
    async fn create_and_allow(
        &self,
        dry_run: bool,
        namespace: &str,
        templates: Vec<ResourceClaimTemplate>,
        patch: Vec<serde_json::Value>,
        warnings: Vec<String>,
    ) -> (Outcome, Decision) {
        if patch.is_empty() {
            return unchanged();
        }
        // A dry run must not leave templates behind (sideEffects: NoneOnDryRun).
        if !dry_run && let Err(e) = self.cluster.create_templates(namespace, &templates).await {
            if let AdmitError::TemplateConflict { .. } = e {
                // Not the cluster's passing fault: retrying changes nothing until someone acts.
                tracing::warn!(error = %e, "a template of ours is taken");
                self.metrics.denied("template_conflict");
                return (Outcome::Denied, Decision::Deny { message: format!("vgpu-dra webhook: {e}") });
            }
            return (Outcome::Error, error_decision(&e));
        }
        (Outcome::Converted, Decision::Allow { patch, warnings })
    }
}

fn unchanged() -> (Outcome, Decision) {
    (Outcome::Unchanged, Decision::Allow { patch: Vec::new(), warnings: Vec::new() })
}

/// A refusal for a cluster failure: the pod cannot be converted now, and letting it through
/// unconverted would leave it unschedulable; the client retries.
fn error_decision(error: &AdmitError) -> Decision {
    tracing::warn!(error = %crate::error_chain(error), "admission failed");
    Decision::Deny { message: format!("vgpu-dra webhook: {}; try again", crate::error_chain(error)) }
}

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

#[cfg(test)]
#[path = "admit_tests.rs"]
mod tests;
