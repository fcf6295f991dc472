//! The MutatingWebhookConfiguration that sends HAMi-style pods here, and only those.
//!
//! Who writes it: the webhook itself (`--registration=full`), or, as the chart installs it, a
//! registration Job (`--registration=registrar`: everything but the `caBundle`, then exit) while
//! the serving webhook only keeps the `caBundle` current (`--registration=ca-bundle`); the
//! chart's admission policy then holds the webhook's own identity to that field.
//!
//! A `caBundle` is never narrowed by a write here: the CAs already registered that are still
//! valid are kept beside the new ones (the newest first, [`crate::tls::merge_ca_bundles`]), and
//! each write is conditional on the version read, so a replica with an older Secret (starting
//! during a renewal, or still serving a certificate of a deleted Secret) neither drops a CA
//! another replica serves nor loses a concurrent writer's.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference, WebhookClientConfig,
};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};

use crate::tls::merge_ca_bundles;

/// Path the webhook serves pod admissions on.
pub const PODS_PATH: &str = "/mutate-pods";
/// Path the webhook serves Volcano Job admissions on.
pub const JOBS_PATH: &str = "/mutate-volcano-jobs";
/// Path the webhook serves ResourceClaim admissions (the GPU quota check) on.
pub const CLAIMS_PATH: &str = "/mutate-resourceclaims";
/// API group of Volcano's batch Jobs.
pub const VOLCANO_BATCH_GROUP: &str = "batch.volcano.sh";
/// Field manager of the webhook's own writes.
const MANAGER: &str = "vgpu-dra-webhook";
/// Field manager of the registration Job's apply.
const REGISTRAR: &str = "vgpu-dra-webhook-registrar";
/// Conditional writes tried before giving up to the next check (each loses only to another
/// writer's success).
const ATTEMPTS: usize = 5;

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
    fn client_config(&self, path: &str, ca_bundle: Option<&str>) -> WebhookClientConfig {
        let ca_bundle = ca_bundle.map(|ca| ByteString(ca.as_bytes().to_vec()));
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
    /// The CAs that signed the serving certificates (PEM); none for the registration Job,
    /// which leaves the field to the webhook.
    pub ca_bundle: Option<String>,
    /// The CEL expression selecting the pods (`vgpu_scheduling::compat::pod_match_condition`).
    pub match_condition: String,
    /// The CEL expression selecting Volcano Jobs (`vgpu_scheduling::compat::job_match_condition`);
    /// no Job webhook when absent.
    pub job_match_condition: Option<String>,
    /// The CEL expression selecting ResourceClaims on the driver's classes
    /// ([`claim_match_condition`]); no claim webhook (no GPU quotas) when absent.
    pub claim_match_condition: Option<String>,
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
    /// The configuration does not exist (yet): `--registration=ca-bundle` waits for the
    /// registration Job to make it.
    #[error("MutatingWebhookConfiguration {name} does not exist (yet): it is made by the registration Job")]
    NotRegistered {
        /// Name.
        name: String,
    },
    /// The configuration has no webhook of the name this one serves.
    #[error("MutatingWebhookConfiguration {name} has no webhook {webhook}")]
    NoWebhook {
        /// Configuration name.
        name: String,
        /// The webhook missing.
        webhook: String,
    },
    /// The configuration could not be read or patched.
    #[error("{what} MutatingWebhookConfiguration {name}")]
    Api {
        /// The step.
        what: &'static str,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Other writers kept changing the configuration between our read and write.
    #[error("MutatingWebhookConfiguration {name} kept changing under {ATTEMPTS} conditional writes")]
    Contended {
        /// Name.
        name: String,
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

    /// The ResourceClaim webhook's qualified name: `claims.` before the pod webhook's.
    pub fn claim_webhook_name(&self) -> String {
        format!("claims.{}", self.webhook_name())
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
        // Every claim on the driver's classes, whoever writes it, is charged to its namespace.
        let claims = self.claim_match_condition.as_ref().map(|condition| {
            self.webhook(
                self.claim_webhook_name(),
                CLAIMS_PATH,
                condition,
                RuleWithOperations {
                    api_groups: Some(vec!["resource.k8s.io".to_owned()]),
                    api_versions: Some(vec!["v1".to_owned()]),
                    operations: Some(vec!["CREATE".to_owned()]),
                    resources: Some(vec!["resourceclaims".to_owned()]),
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
            webhooks: Some(std::iter::once(pods).chain(jobs).chain(claims).collect()),
        }
    }

    fn webhook(&self, name: String, path: &str, condition: &str, rule: RuleWithOperations) -> MutatingWebhook {
        MutatingWebhook {
            name,
            admission_review_versions: vec!["v1".to_owned()],
            client_config: self.endpoint.client_config(path, self.ca_bundle.as_deref()),
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

    /// The names of the webhooks of this configuration.
    fn webhook_names(&self) -> Vec<String> {
        std::iter::once(self.webhook_name())
            .chain(self.job_match_condition.as_ref().map(|_| self.job_webhook_name()))
            .chain(self.claim_match_condition.as_ref().map(|_| self.claim_webhook_name()))
            .collect()
    }

    /// Creates or updates the configuration (server-side apply, so replicas applying the same
    /// object agree and fields others own are left alone). With a `caBundle`, the CAs registered
    /// now that are still valid are kept beside it, and the write is conditional on the version
    /// read; without one (the registration Job), the field is left to the webhook.
    ///
    /// # Errors
    /// [`RegistrationError`] when the API server refuses or does not answer within `timeout`.
    pub async fn apply(&self, client: kube::Client, timeout: Duration) -> Result<(), RegistrationError> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(client);
        let Some(ours) = &self.ca_bundle else {
            return self.apply_object(&api, self.configuration(), REGISTRAR, timeout).await;
        };
        for _ in 0..ATTEMPTS {
            let current = self.read(&api, timeout).await?;
            let registered = current.as_ref().map(|c| registered_ca_bundle(c, &self.webhook_names())).unwrap_or_default();
            let merged = merge_ca_bundles(ours, &registered, SystemTime::now());
            let mut object = Registration { ca_bundle: Some(merged), ..self.clone() }.configuration();
            // A conflict when someone wrote in between: read again and merge with theirs.
            object.metadata.resource_version = current.and_then(|c| c.metadata.resource_version);
            match self.apply_object(&api, object, MANAGER, timeout).await {
                Err(RegistrationError::Apply { source: kube::Error::Api(s), .. }) if s.code == 409 => {}
                done => return done,
            }
        }
        Err(RegistrationError::Contended { name: self.name.clone() })
    }

    /// Keeps only the `caBundle` of the configuration (made by the registration Job) current:
    /// the CAs of this bundle first, then the registered ones still valid, written with a JSON
    /// patch conditional on the version read.
    ///
    /// # Errors
    /// [`RegistrationError::NotRegistered`] while the configuration does not exist,
    /// [`RegistrationError::NoWebhook`] when it lacks this webhook, others when the API server
    /// refuses or does not answer within `timeout`.
    pub async fn apply_ca_bundle(&self, client: kube::Client, timeout: Duration) -> Result<(), RegistrationError> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(client);
        let ours = self.ca_bundle.as_deref().unwrap_or_default();
        let names = self.webhook_names();
        for _ in 0..ATTEMPTS {
            let current =
                self.read(&api, timeout).await?.ok_or_else(|| RegistrationError::NotRegistered { name: self.name.clone() })?;
            let hooks = current.webhooks.as_deref().unwrap_or_default();
            let mut indices = Vec::new();
            for name in &names {
                let index = hooks.iter().position(|w| &w.name == name);
                indices
                    .push(index.ok_or_else(|| RegistrationError::NoWebhook { name: self.name.clone(), webhook: name.clone() })?);
            }
            let merged = merge_ca_bundles(ours, &registered_ca_bundle(&current, &names), SystemTime::now());
            let unchanged =
                indices.iter().all(|&i| hooks[i].client_config.ca_bundle.as_ref().is_some_and(|b| b.0 == merged.as_bytes()));
            if unchanged {
                return Ok(());
            }
            let encoded = serde_json::to_value(ByteString(merged.into_bytes())).unwrap_or_default();
            // The version read, written back: a conflict when someone wrote in between.
            let mut ops = vec![serde_json::json!({
                "op": "replace", "path": "/metadata/resourceVersion", "value": current.metadata.resource_version,
            })];
            ops.extend(indices.iter().map(
                |i| serde_json::json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}),
            ));
            let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
                .unwrap_or_else(|_| unreachable!("add and replace operations parse"));
            let params = PatchParams { field_manager: Some(MANAGER.to_owned()), ..PatchParams::default() };
            let patched = tokio::time::timeout(timeout, api.patch(&self.name, &params, &Patch::<()>::Json(patch))).await;
            match patched.map_err(|_| self.timed_out("patching the caBundle of MutatingWebhookConfiguration", timeout))? {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(source) => {
                    return Err(RegistrationError::Api { what: "patching the caBundle of", name: self.name.clone(), source });
                }
            }
        }
        Err(RegistrationError::Contended { name: self.name.clone() })
    }

    /// The configuration as it is now; `None` when it does not exist.
    async fn read(
        &self,
        api: &Api<MutatingWebhookConfiguration>,
        timeout: Duration,
    ) -> Result<Option<MutatingWebhookConfiguration>, RegistrationError> {
        tokio::time::timeout(timeout, api.get_opt(&self.name))
            .await
            .map_err(|_| self.timed_out("reading MutatingWebhookConfiguration", timeout))?
            .map_err(|source| RegistrationError::Api { what: "reading", name: self.name.clone(), source })
    }

    /// Server-side applies `object` as `manager`.
    async fn apply_object(
        &self,
        api: &Api<MutatingWebhookConfiguration>,
        mut object: MutatingWebhookConfiguration,
        manager: &str,
        timeout: Duration,
    ) -> Result<(), RegistrationError> {
        // Server-side apply needs the type in the body.
        let value = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": std::mem::take(&mut object.metadata),
            "webhooks": object.webhooks,
        });
        let params = PatchParams::apply(manager).force();
        match tokio::time::timeout(timeout, api.patch(&self.name, &params, &Patch::Apply(&value))).await {
            Err(_) => Err(self.timed_out("applying MutatingWebhookConfiguration", timeout)),
            Ok(Err(source)) => Err(RegistrationError::Apply { name: self.name.clone(), source }),
            Ok(Ok(_)) => Ok(()),
        }
    }

    fn timed_out(&self, what: &'static str, timeout: Duration) -> RegistrationError {
        RegistrationError::Timeout { what, name: self.name.clone(), timeout }
    }
}

/// The CAs registered for the webhooks `names` of `config`, each PEM block once.
fn registered_ca_bundle(config: &MutatingWebhookConfiguration, names: &[String]) -> String {
    config
        .webhooks
        .iter()
        .flatten()
        .filter(|w| names.contains(&w.name))
        .filter_map(|w| w.client_config.ca_bundle.as_ref())
        .filter_map(|b| std::str::from_utf8(&b.0).ok())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A CEL expression true for a ResourceClaim with a request (or a `firstAvailable` choice) on
/// one of `classes`: only those are sent, so a webhook outage blocks no other claim.
pub fn claim_match_condition(classes: &[String]) -> String {
    let list = classes.iter().map(|c| vgpu_scheduling::compat::cel_string(c)).collect::<Vec<_>>().join(", ");
    format!(
        "has(object.spec.devices) && has(object.spec.devices.requests) && object.spec.devices.requests.exists(r, \
         (has(r.exactly) && r.exactly.deviceClassName in [{list}]) || \
         (has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in [{list}])))"
    )
}

#[cfg(test)]
#[path = "registration_tests.rs"]
mod tests;
