//! ResourceClaim admissions: the namespace GPU quota check ([`crate::quota`]) with the review
//! around it, and the API calls it makes on the real cluster.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use serde_json::json;
use vgpu_scheduling::quota::Dimension;

use crate::admit::{AdmitError, Cluster};
use crate::kube_cluster::KubeCluster;
use crate::metrics::{Metrics, Outcome};
use crate::quota::{
    Checked, Ledger, QuotaOutcome, QuotaStore, RESERVATION_ANNOTATION, check_claim, ledger_data, ledger_from_data, ledger_name,
};
use crate::review::{self, Decision};

/// Answers ResourceClaim admission reviews with the quota check.
#[derive(Debug)]
pub struct ClaimAdmitter<C> {
    cluster: C,
    keys: BTreeMap<String, Dimension>,
    classes: Vec<String>,
    metrics: Metrics,
    deadline: Duration,
}

impl<C: Cluster + QuotaStore> ClaimAdmitter<C> {
    /// Checks claims on `classes` against quotas on `keys`, within `deadline`.
    pub fn new(
        cluster: C,
        keys: BTreeMap<String, Dimension>,
        classes: Vec<String>,
        metrics: Metrics,
        deadline: Duration,
    ) -> Self {
        Self { cluster, keys, classes, metrics, deadline }
    }

    /// The answer to the claim review in `body`: unchanged when no quota applies, the
    /// reservation's annotation added when it fits, a denial in the API server's quota words
    /// when it does not, a refusal when the cluster cannot be asked.
    pub async fn review(&self, body: &[u8]) -> AdmissionReview<DynamicObject> {
        let request = match review::parse::<ResourceClaim>(body, "ResourceClaim") {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable admission review");
                self.metrics.observe_claim(Outcome::Invalid);
                return review::invalid(&e);
            }
        };
        let namespace = request.namespace.clone().unwrap_or_default();
        let decided = match (request.object.as_ref().filter(|_| review::is_create(&request)), namespace.is_empty()) {
            (Some(claim), false) => {
                match tokio::time::timeout(self.deadline, self.decide(&namespace, claim, request.dry_run)).await {
                    Ok(d) => d,
                    Err(_) => Err(AdmitError::Timeout { what: "checking the GPU quota".into(), timeout: self.deadline }),
                }
            }
            _ => Ok(None),
        };
        let decided = decided.map(|checked| {
            let Some(checked) = checked else { return QuotaOutcome::Unlimited };
            for l in &checked.limits.0 {
                self.metrics.quota(&namespace, &l.quota, &l.key, checked.used.get(l.dimension), l.hard);
            }
            checked.outcome
        });
        let (outcome, decision) = match decided {
            Ok(QuotaOutcome::Unlimited) => (Outcome::Unchanged, Decision::Allow { patch: Vec::new(), warnings: Vec::new() }),
            Ok(QuotaOutcome::Reserved(id)) => {
                (Outcome::Converted, Decision::Allow { patch: annotate(&request.object, &id), warnings: Vec::new() })
            }
            Ok(QuotaOutcome::Exceeded(e)) => {
                self.metrics.denied("quota_exceeded");
                tracing::info!(namespace, quota = e.quota, message = %e, "claim refused by quota");
                (Outcome::Denied, Decision::Deny { message: e.to_string() })
            }
            Err(e) => {
                tracing::warn!(namespace, error = %crate::error_chain(&e), "quota check failed");
                (Outcome::Error, Decision::Deny { message: format!("vgpu-dra webhook: {}; try again", crate::error_chain(&e)) })
            }
        };
        self.metrics.observe_claim(outcome);
        review::respond(&request, decision)
    }

    async fn decide(&self, namespace: &str, claim: &ResourceClaim, dry_run: bool) -> Result<Option<Checked>, AdmitError> {
        let facts = self.cluster.class_facts().await?;
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        check_claim(&self.cluster, namespace, claim, (&self.keys, &self.classes, &facts), dry_run, now).await.map(Some)
    }
}

/// The patch setting the reservation annotation, whatever the claim carried under that key.
fn annotate(claim: &Option<ResourceClaim>, id: &str) -> Vec<serde_json::Value> {
    let has_annotations = claim.as_ref().and_then(|c| c.metadata.annotations.as_ref()).is_some();
    if has_annotations {
        let key = RESERVATION_ANNOTATION.replace('~', "~0").replace('/', "~1");
        vec![json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": id})]
    } else {
        vec![json!({"op": "add", "path": "/metadata/annotations", "value": {RESERVATION_ANNOTATION: id}})]
    }
}

impl QuotaStore for KubeCluster {
    async fn quotas(&self, namespace: &str) -> Result<Vec<ResourceQuota>, AdmitError> {
        let api: Api<ResourceQuota> = Api::namespaced(self.client(), namespace);
        let what = format!("listing the ResourceQuotas of {namespace}");
        Ok(self.bounded(&what, api.list(&ListParams::default())).await?.items)
    }

    async fn claims(&self, namespace: &str) -> Result<Vec<ResourceClaim>, AdmitError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client(), namespace);
        let what = format!("listing the ResourceClaims of {namespace}");
        // A list without a resourceVersion is read from etcd, not the API server's cache.
        Ok(self.bounded(&what, api.list(&ListParams::default())).await?.items)
    }

    async fn ledger(&self, namespace: &str) -> Result<Ledger, AdmitError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client(), self.ledger_namespace());
        let name = ledger_name(namespace);
        let found = self.bounded(&format!("reading the quota ledger {name}"), api.get_opt(&name)).await?;
        Ok(found.map_or_else(Ledger::default, |cm| Ledger {
            version: cm.metadata.resource_version.clone(),
            reservations: ledger_from_data(&cm.data.unwrap_or_default()),
        }))
    }

    async fn write_ledger(&self, namespace: &str, ledger: &Ledger) -> Result<bool, AdmitError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client(), self.ledger_namespace());
        let name = ledger_name(namespace);
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: ledger.version.clone(),
                labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "vgpu-dra".to_owned())])),
                ..Default::default()
            },
            data: Some(ledger_data(ledger)),
            ..Default::default()
        };
        let what = format!("writing the quota ledger {name}");
        let written = match &ledger.version {
            Some(_) => tokio::time::timeout(self.timeout(), api.replace(&name, &PostParams::default(), &object)).await,
            None => tokio::time::timeout(self.timeout(), api.create(&PostParams::default(), &object)).await,
        };
        match written {
            Err(_) => Err(AdmitError::Timeout { what, timeout: self.timeout() }),
            Ok(Ok(_)) => Ok(true),
            // Changed or made since it was read: the caller reads it again.
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => Ok(false),
            Ok(Err(source)) => Err(AdmitError::Quota { what, source }),
        }
    }
}

impl KubeCluster {
    async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, AdmitError> {
        match tokio::time::timeout(self.timeout(), call).await {
            Ok(r) => r.map_err(|source| AdmitError::Quota { what: what.to_owned(), source }),
            Err(_) => Err(AdmitError::Timeout { what: what.to_owned(), timeout: self.timeout() }),
        }
    }
}
