//! The MutatingWebhookConfiguration that sends HAMi-style pods here, and only those.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use kube::api::{Api, Patch, PatchParams};

/// Path the webhook serves pod admissions on.
pub const PODS_PATH: &str = "/mutate-pods";
/// Field manager of the server-side apply.
const MANAGER: &str = "vgpu-dra-webhook";

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Service (port 443, path [`PODS_PATH`]).
    Service {
        /// Service name.
        name: String,
        /// Service namespace.
        namespace: String,
    },
    /// A URL, for API servers outside the cluster network (and the test bed).
    Url(String),
}

/// What the registration says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Name of the configuration; its one webhook is named the same, with `.vgpu-dra.io`
    /// appended where it has no dot (the API wants a qualified name).
    pub name: String,
    /// Where the API server sends reviews.
    pub endpoint: Endpoint,
    /// The CA that signed the serving certificate (PEM).
    pub ca_bundle: String,
    /// The CEL expression selecting the pods (`vgpu_scheduling::compat::pod_match_condition`).
    pub match_condition: String,
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
    #[error("applying MutatingWebhookConfiguration {name}: no answer from the API server within {timeout:?}")]
    Timeout {
        /// Name.
        name: String,
        /// The timeout.
        timeout: Duration,
    },
}

impl Registration {
    /// The webhook's qualified name.
    pub fn webhook_name(&self) -> String {
        if self.name.contains('.') { self.name.clone() } else { format!("{}.vgpu-dra.io", self.name) }
    }

    /// The configuration object.
    pub fn configuration(&self) -> MutatingWebhookConfiguration {
        let client_config = match &self.endpoint {
            Endpoint::Service { name, namespace } => WebhookClientConfig {
                service: Some(ServiceReference {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    path: Some(PODS_PATH.to_owned()),
                    port: Some(443),
                }),
                ..Default::default()
            },
            Endpoint::Url(url) => WebhookClientConfig { url: Some(url.clone()), ..Default::default() },
        };
        let webhook = MutatingWebhook {
            name: self.webhook_name(),
            admission_review_versions: vec!["v1".to_owned()],
            client_config: WebhookClientConfig {
                ca_bundle: Some(ByteString(self.ca_bundle.as_bytes().to_vec())),
                ..client_config
            },
            // Fail: a HAMi pod let through unconverted would ask the kubelet for nvidia.com/gpu,
            // which no node has. matchConditions keep every other pod away, so an outage blocks
            // only these.
            failure_policy: Some("Fail".to_owned()),
            match_policy: Some("Equivalent".to_owned()),
            match_conditions: Some(vec![MatchCondition {
                name: "hami-resources".to_owned(),
                expression: self.match_condition.clone(),
            }]),
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "kubernetes.io/metadata.name".to_owned(),
                    operator: "NotIn".to_owned(),
                    values: Some(self.excluded_namespaces.clone()),
                }]),
                ..Default::default()
            }),
            // Converted pods carry a claim and no HAMi resource: calling again would change nothing.
            reinvocation_policy: Some("Never".to_owned()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".to_owned()]),
                operations: Some(vec!["CREATE".to_owned()]),
                resources: Some(vec!["pods".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            }]),
            // Templates are created only for admissions that are not dry runs.
            side_effects: "NoneOnDryRun".to_owned(),
            timeout_seconds: Some(self.timeout_seconds),
            ..Default::default()
        };
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "vgpu-dra".to_owned())])),
                ..Default::default()
            },
            webhooks: Some(vec![webhook]),
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
            Err(_) => Err(RegistrationError::Timeout { name: self.name.clone(), timeout }),
            Ok(Err(source)) => Err(RegistrationError::Apply { name: self.name.clone(), source }),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use vgpu_scheduling::CompatSettings;
    use vgpu_scheduling::compat::pod_match_condition;

    use super::*;

    fn registration(endpoint: Endpoint) -> Registration {
        Registration {
            name: "vgpu-dra-webhook".into(),
            endpoint,
            ca_bundle: "-----BEGIN CERTIFICATE-----\n".into(),
            match_condition: pod_match_condition(&CompatSettings::hami()),
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
}
