//! One admission: read the pod, convert it with the class's facts, create the templates it
//! references, answer. The cluster side sits behind [`Cluster`] so the review handling is tested
//! without an API server.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use tokio::sync::Mutex;
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
    /// Creates `templates` in `namespace`; one that exists already counts as created (names are
    /// content hashes, so it has the same content).
    fn create_templates(
        &self,
        namespace: &str,
        templates: &[ResourceClaimTemplate],
    ) -> impl Future<Output = Result<(), AdmitError>> + Send;
}

/// Answers pod admission reviews.
#[derive(Debug)]
pub struct Admitter<C> {
    settings: CompatSettings,
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
        Self { settings, cluster, metrics, deadline: DEFAULT_DEADLINE }
    }

    /// This admitter answering within `deadline` (a refusal when the cluster is slower).
    #[must_use]
    pub fn with_deadline(self, deadline: Duration) -> Self {
        Self { deadline, ..self }
    }

    /// The settings it converts with.
    pub fn settings(&self) -> &CompatSettings {
        &self.settings
    }

    /// The answer to the review in `body`; never fails: errors are denials the client sees.
    pub async fn review(&self, body: &[u8]) -> AdmissionReview<DynamicObject> {
        let started = Instant::now();
        let request = match review::parse(body) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable admission review");
                self.metrics.observe(Outcome::Invalid, started.elapsed().as_secs_f64());
                return review::invalid(&e);
            }
        };
        let (outcome, decision) = match tokio::time::timeout(self.deadline, self.decide(&request)).await {
            Ok(answer) => answer,
            // Templates made before the deadline stay: they are shared and named by content.
            Err(_) => {
                let e = AdmitError::Timeout { what: "admitting the pod".into(), timeout: self.deadline };
                (Outcome::Error, error_decision(&e))
            }
        };
        let pod = request.name.as_str();
        let namespace = request.namespace.as_deref().unwrap_or_default();
        match &decision {
            Decision::Deny { message } => tracing::info!(namespace, pod, ?outcome, message, "pod denied"),
            Decision::Allow { patch, .. } if !patch.is_empty() => {
                tracing::info!(namespace, pod, operations = patch.len(), dry_run = request.dry_run, "pod converted");
            }
            Decision::Allow { .. } => tracing::debug!(namespace, pod, "pod left unchanged"),
        }
        self.metrics.observe(outcome, started.elapsed().as_secs_f64());
        review::respond(&request, decision)
    }

    async fn decide(&self, request: &AdmissionRequest<Pod>) -> (Outcome, Decision) {
        let unchanged = || (Outcome::Unchanged, Decision::Allow { patch: Vec::new(), warnings: Vec::new() });
        let Some(pod) = request.object.as_ref().filter(|_| review::is_pod_create(request)) else {
            return unchanged();
        };
        // Only pods with HAMi resources are sent, but a hand-made registration may send others:
        // those need no slices.
        if !asks_for_own_resources(pod, &self.settings) {
            return unchanged();
        }
        let facts = match self.cluster.class_facts().await {
            Ok(f) => f,
            Err(e) => return (Outcome::Error, error_decision(&e)),
        };
        let conversion = match convert_pod(pod, &self.settings, &facts) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.denied(e.reason());
                return (Outcome::Denied, Decision::Deny { message: e.to_string() });
            }
        };
        if !conversion.changed() {
            return unchanged();
        }
        // A dry run must not leave templates behind (sideEffects: NoneOnDryRun).
        if !request.dry_run {
            let namespace = request.namespace.as_deref().or(pod.metadata.namespace.as_deref()).unwrap_or("default");
            if let Err(e) = self.cluster.create_templates(namespace, &conversion.templates).await {
                return (Outcome::Error, error_decision(&e));
            }
        }
        (Outcome::Converted, Decision::Allow { patch: conversion.patch, warnings: conversion.warnings })
    }
}

/// Whether any container or init container names one of `settings`' resources.
fn asks_for_own_resources(pod: &Pod, settings: &CompatSettings) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    spec.init_containers.iter().flatten().chain(&spec.containers).any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            [&r.limits, &r.requests].into_iter().flatten().any(|m| m.keys().any(|k| settings.is_own_resource(k)))
        })
    })
}

/// A refusal for a cluster failure: the pod cannot be converted now, and letting it through
/// unconverted would leave it unschedulable; the client retries.
fn error_decision(error: &AdmitError) -> Decision {
    tracing::warn!(error = %error_chain(error), "admission failed");
    Decision::Deny { message: format!("vgpu-dra webhook: {}; try again", error_chain(error)) }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
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
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").field("driver", &self.driver).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// A cluster reading slices of `driver` through `client`.
    pub fn new(client: kube::Client, driver: &str, timeout: Duration, cache_for: Duration) -> Self {
        Self { client, driver: driver.to_owned(), timeout, cache_for, cache: Arc::default() }
    }

    async fn list_facts(&self) -> Result<ClassFacts, AdmitError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.driver={}", self.driver));
        let list = tokio::time::timeout(self.timeout, api.list(&params))
            .await
            .map_err(|_| AdmitError::Timeout { what: "listing ResourceSlices".into(), timeout: self.timeout })?
            .map_err(|source| AdmitError::ListSlices { driver: self.driver.clone(), source })?;
        Ok(ClassFacts::from_slices(&list.items, &self.driver))
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
                    tracing::warn!(error = %error_chain(&e), "using the last known ResourceSlices");
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
            let mut template = template.clone();
            template.metadata.namespace = Some(namespace.to_owned());
            let what = || format!("creating ResourceClaimTemplate {namespace}/{name}");
            match tokio::time::timeout(self.timeout, api.create(&params, &template)).await {
                Err(_) => return Err(AdmitError::Timeout { what: what(), timeout: self.timeout }),
                Ok(Ok(_)) => tracing::info!(namespace, template = name, "ResourceClaimTemplate created"),
                // Same name = same content: another admission made it first.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => {}
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
