//! One admission: read the pod, convert it with the class's facts, create the templates it
//! references, answer. The cluster side sits behind [`Cluster`] so the review handling is tested
//! without an API server.
//!
//! Templates are created only in the namespace of the request, and only for an object of that
//! namespace. A template that exists already is used only when its content is what this
//! conversion gives (read back and compared with a server-side dry run of ours, so defaults and
//! canonical quantities compare equal): one someone else made under that name is not handed to
//! the pod.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde::de::DeserializeOwned;
use vgpu_scheduling::compat::{convert_volcano_job, job_resource_names, pick, pod_resource_names};
use vgpu_scheduling::{ClassFacts, CompatSettings, convert_pod};

use crate::metrics::{Metrics, Outcome};
use crate::review::{self, Decision};

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

#[cfg(test)]
#[path = "admit_tests.rs"]
mod tests;
