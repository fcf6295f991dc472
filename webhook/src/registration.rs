//! The MutatingWebhookConfiguration that sends HAMi-style pods here, and only those.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference, WebhookClientConfig,
};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};

/// Path the webhook serves pod admissions on.
pub const PODS_PATH: &str = "/mutate-pods";
/// Path the webhook serves Volcano Job admissions on.
pub const JOBS_PATH: &str = "/mutate-volcano-jobs";
/// API group of Volcano's batch Jobs.
pub const VOLCANO_BATCH_GROUP: &str = "batch.volcano.sh";
/// Field manager of the server-side apply.
const MANAGER: &str = "vgpu-dra-webhook";

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Service (port 443, paths [`PODS_PATH`] and [`JOBS_PATH`]).
    Service {
        /// Service name.
        name: String,
        /// Service namespace.
        namespace: String,
    },
    /// The URL of the pod endpoint, for API servers outside the cluster network (and the test
    /// bed); Jobs go to the same URL with its last path segment replaced by
    /// `mutate-volcano-jobs`.
    Url(String),
}

impl Endpoint {
    /// The client configuration for the endpoint serving `path` ([`PODS_PATH`] or [`JOBS_PATH`]).
    fn client_config(&self, path: &str, ca_bundle: &str) -> WebhookClientConfig {
        let ca_bundle = Some(ByteString(ca_bundle.as_bytes().to_vec()));
        match self {
            Self::Service { name, namespace } => WebhookClientConfig {
                service: Some(ServiceReference {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    path: Some(path.to_owned()),
                    port: Some(443),
                }),
                ca_bundle,
                ..Default::default()
            },
            Self::Url(url) => {
                let url = if path == PODS_PATH {
                    url.clone()
                } else {
                    // Keep scheme, host and any prefix a proxy in front needs; swap the last segment.
                    let base = url.split(['?', '#']).next().unwrap_or(url);
                    let prefix = base.rsplit_once('/').map_or(base, |(head, _)| head);
                    format!("{prefix}{path}")
                };
                WebhookClientConfig { url: Some(url), ca_bundle, ..Default::default() }
            }
        }
    }
}

/// What the registration says.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// Name of the configuration; its pod webhook is named the same, with `.vgpu-dra.io`
    /// appended where it has no dot (the API wants a qualified name), its Job webhook the same
    /// with `jobs.` before.
    pub name: String,
    /// Where the API server sends reviews.
    pub endpoint: Endpoint,
    /// The CA that signed the serving certificate (PEM).
    pub ca_bundle: String,
    /// The CEL expression selecting the pods (`vgpu_scheduling::compat::pod_match_condition`).
    pub match_condition: String,
    /// The CEL expression selecting Volcano Jobs (`vgpu_scheduling::compat::job_match_condition`);
    /// no Job webhook when absent.
    pub job_match_condition: Option<String>,
    /// The object whose deletion deletes the configuration (the chart's ClusterRole), so an
    /// uninstall does not leave a webhook behind that fails closed.
    pub owner: Option<OwnerReference>,
    /// Namespaces never sent: `kube-system` and the webhook's own (so it can always restart).
    pub excluded_namespaces: Vec<String>,
    /// `timeoutSeconds`.
    pub timeout_seconds: i32,
}

/// Errors of registering.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The API server refused the apply.
    #[error("applying MutatingWebhookConfiguration {name}")]
    Apply {
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer in time.
    #[error("{what} {name}: no answer from the API server within {timeout:?}")]
    Timeout {
        /// The step.
        what: &'static str,
        /// Name.
        name: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The owner ClusterRole could not be read (absent, or no `get` on it).
    #[error("reading ClusterRole {name}, the owner of the webhook configuration")]
    Owner {
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// An owner reference to ClusterRole `name`, read through `client`: deleting that ClusterRole
/// (as `helm uninstall` does) makes the garbage collector delete the configuration.
///
/// # Errors
/// [`RegistrationError::Owner`] when it cannot be read, [`RegistrationError::Timeout`] when the
/// API server does not answer within `timeout`.
pub async fn cluster_role_owner(
    client: kube::Client,
    name: &str,
    timeout: Duration,
) -> Result<OwnerReference, RegistrationError> {
    let api: Api<ClusterRole> = Api::all(client);
    let role = tokio::time::timeout(timeout, api.get(name))
        .await
        .map_err(|_| RegistrationError::Timeout { what: "reading ClusterRole", name: name.to_owned(), timeout })?
        .map_err(|source| RegistrationError::Owner { name: name.to_owned(), source })?;
    Ok(OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".to_owned(),
        kind: "ClusterRole".to_owned(),
        name: name.to_owned(),
        uid: role.metadata.uid.unwrap_or_default(),
        // Not a controller, and no blockOwnerDeletion: that would need finalizer rights on RBAC.
        ..Default::default()
    })
}

impl Registration {
    /// The pod webhook's qualified name.
    pub fn webhook_name(&self) -> String {
        if self.name.contains('.') { self.name.clone() } else { format!("{}.vgpu-dra.io", self.name) }
    }

    /// The Volcano Job webhook's qualified name: `jobs.` before the pod webhook's.
    pub fn job_webhook_name(&self) -> String {
        format!("jobs.{}", self.webhook_name())
    }

    /// The configuration object.
    pub fn configuration(&self) -> MutatingWebhookConfiguration {
        let pods = self.webhook(
            self.webhook_name(),
            PODS_PATH,
            &self.match_condition,
            RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".to_owned()]),
                operations: Some(vec!["CREATE".to_owned()]),
                resources: Some(vec!["pods".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            },
        );
        // Volcano's controller makes pods from the converted templates, which carry no HAMi
        // resource and so never match the pod webhook: each workload is converted once.
        let jobs = self.job_match_condition.as_ref().map(|condition| {
            self.webhook(
                self.job_webhook_name(),
                JOBS_PATH,
                condition,
                RuleWithOperations {
                    api_groups: Some(vec![VOLCANO_BATCH_GROUP.to_owned()]),
                    api_versions: Some(vec!["v1alpha1".to_owned()]),
                    operations: Some(vec!["CREATE".to_owned()]),
                    resources: Some(vec!["jobs".to_owned()]),
                    scope: Some("Namespaced".to_owned()),
                },
            )
        });
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "vgpu-dra".to_owned())])),
                owner_references: self.owner.clone().map(|o| vec![o]),
                ..Default::default()
            },
            webhooks: Some(std::iter::once(pods).chain(jobs).collect()),
        }
    }

    fn webhook(&self, name: String, path: &str, condition: &str, rule: RuleWithOperations) -> MutatingWebhook {
        MutatingWebhook {
            name,
            admission_review_versions: vec!["v1".to_owned()],
            client_config: self.endpoint.client_config(path, &self.ca_bundle),
            // Fail: a HAMi workload let through unconverted would ask the kubelet for
            // nvidia.com/gpu, which no node has. matchConditions keep every other object away, so
            // an outage blocks only these.
            failure_policy: Some("Fail".to_owned()),
            match_policy: Some("Equivalent".to_owned()),
            match_conditions: Some(vec![MatchCondition { name: "hami-resources".to_owned(), expression: condition.to_owned() }]),
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "kubernetes.io/metadata.name".to_owned(),
                    operator: "NotIn".to_owned(),
                    values: Some(self.excluded_namespaces.clone()),
                }]),
                ..Default::default()
            }),
            // Converted objects carry a claim and no HAMi resource: calling again would change nothing.
            reinvocation_policy: Some("Never".to_owned()),
            rules: Some(vec![rule]),
            // Templates are created only for admissions that are not dry runs.
            side_effects: "NoneOnDryRun".to_owned(),
            timeout_seconds: Some(self.timeout_seconds),
            ..Default::default()
        }
    }

    /// Creates or updates the configuration (server-side apply, so replicas applying the same
    /// object agree and fields others own are left alone).
    ///
    /// # Errors
    /// [`RegistrationError`] when the API server refuses or does not answer within `timeout`.
    pub async fn apply(&self, client: kube::Client, timeout: Duration) -> Result<(), RegistrationError> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(client);
        let mut object = self.configuration();
        // Server-side apply needs the type in the body.
        let value = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": std::mem::take(&mut object.metadata),
            "webhooks": object.webhooks,
        });
        let params = PatchParams::apply(MANAGER).force();
        match tokio::time::timeout(timeout, api.patch(&self.name, &params, &Patch::Apply(&value))).await {
            Err(_) => Err(RegistrationError::Timeout {
                what: "applying MutatingWebhookConfiguration",
                name: self.name.clone(),
                timeout,
            }),
            Ok(Err(source)) => Err(RegistrationError::Apply { name: self.name.clone(), source }),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use vgpu_scheduling::CompatSettings;
    use vgpu_scheduling::compat::{job_match_condition, pod_match_condition};

    use super::*;

    fn registration(endpoint: Endpoint) -> Registration {
        Registration {
            name: "vgpu-dra-webhook".into(),
            endpoint,
            ca_bundle: "-----BEGIN CERTIFICATE-----\n".into(),
            match_condition: pod_match_condition(&CompatSettings::hami()),
            job_match_condition: None,
            owner: None,
            excluded_namespaces: vec!["kube-system".into(), "vgpu".into()],
            timeout_seconds: 10,
        }
    }

    #[test]
    fn the_configuration_sends_only_hami_pods_and_fails_closed() {
        let c = registration(Endpoint::Service { name: "wh".into(), namespace: "vgpu".into() }).configuration();
        let json = serde_json::to_value(&c).unwrap();
        let w = &json["webhooks"][0];
        assert_eq!(w["name"], "vgpu-dra-webhook.vgpu-dra.io");
        assert_eq!(w["failurePolicy"], "Fail");
        assert_eq!(w["sideEffects"], "NoneOnDryRun");
        assert_eq!(w["reinvocationPolicy"], "Never");
        assert_eq!(w["timeoutSeconds"], 10);
        assert_eq!(w["admissionReviewVersions"], serde_json::json!(["v1"]));
        assert_eq!(
            w["clientConfig"]["service"],
            serde_json::json!({"name": "wh", "namespace": "vgpu", "path": "/mutate-pods", "port": 443})
        );
        assert!(w["clientConfig"].get("url").is_none());
        // caBundle travels base64-encoded.
        assert_eq!(w["clientConfig"]["caBundle"], "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==");
        let expr = w["matchConditions"][0]["expression"].as_str().unwrap();
        assert!(expr.contains("nvidia.com/gpumem") && expr.contains("initContainers"), "{expr}");
        assert_eq!(
            w["namespaceSelector"]["matchExpressions"][0],
            serde_json::json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "vgpu"]})
        );
        assert_eq!(
            w["rules"][0],
            serde_json::json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"})
        );
    }

    #[test]
    fn a_url_endpoint_replaces_the_service() {
        let mut r = registration(Endpoint::Url("https://127.0.0.1:9443/mutate-pods".into()));
        r.name = "wh.example.com".into();
        let json = serde_json::to_value(r.configuration()).unwrap();
        assert_eq!(json["webhooks"][0]["name"], "wh.example.com");
        assert_eq!(json["webhooks"][0]["clientConfig"]["url"], "https://127.0.0.1:9443/mutate-pods");
        assert!(json["webhooks"][0]["clientConfig"].get("service").is_none());
    }

    #[test]
    fn volcano_jobs_get_their_own_webhook_on_their_own_path() {
        let mut r = registration(Endpoint::Service { name: "wh".into(), namespace: "vgpu".into() });
        assert_eq!(serde_json::to_value(r.configuration()).unwrap()["webhooks"].as_array().unwrap().len(), 1);
        r.job_match_condition = Some(job_match_condition(&CompatSettings::volcano()));
        let json = serde_json::to_value(r.configuration()).unwrap();
        let (pods, jobs) = (&json["webhooks"][0], &json["webhooks"][1]);
        assert_eq!(jobs["name"], "jobs.vgpu-dra-webhook.vgpu-dra.io");
        assert_eq!(jobs["clientConfig"]["service"]["path"], "/mutate-volcano-jobs");
        assert_eq!(
            jobs["rules"][0],
            serde_json::json!({"apiGroups": ["batch.volcano.sh"], "apiVersions": ["v1alpha1"], "operations": ["CREATE"], "resources": ["jobs"], "scope": "Namespaced"})
        );
        assert!(jobs["matchConditions"][0]["expression"].as_str().unwrap().contains("object.spec.tasks"));
        // Everything that keeps other objects away and fails closed is the pods' too.
        for key in ["failurePolicy", "sideEffects", "namespaceSelector", "timeoutSeconds", "reinvocationPolicy"] {
            assert_eq!(jobs[key], pods[key], "{key}");
        }
        assert_eq!(jobs["clientConfig"]["caBundle"], pods["clientConfig"]["caBundle"]);
    }

    #[test]
    fn the_job_url_replaces_the_last_segment_of_the_pod_url() {
        for (pods, jobs) in [
            ("https://127.0.0.1:9443/mutate-pods", "https://127.0.0.1:9443/mutate-volcano-jobs"),
            ("https://gw.example.com/vgpu/mutate-pods", "https://gw.example.com/vgpu/mutate-volcano-jobs"),
        ] {
            let endpoint = Endpoint::Url(pods.into());
            assert_eq!(endpoint.client_config(PODS_PATH, "").url.as_deref(), Some(pods));
            assert_eq!(endpoint.client_config(JOBS_PATH, "").url.as_deref(), Some(jobs));
        }
    }

    #[test]
    fn an_owner_makes_the_configuration_collectable() {
        let mut r = registration(Endpoint::Url("https://127.0.0.1:9443/mutate-pods".into()));
        r.owner = Some(OwnerReference {
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: "ClusterRole".into(),
            name: "vgpu-dra-webhook".into(),
            uid: "5a2c".into(),
            ..Default::default()
        });
        let json = serde_json::to_value(r.configuration()).unwrap();
        assert_eq!(
            json["metadata"]["ownerReferences"],
            serde_json::json!([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "vgpu-dra-webhook", "uid": "5a2c"}])
        );
    }
}
