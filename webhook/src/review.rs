//! AdmissionReview in and out: parse the API server's request, answer with a patch, a denial or
//! nothing. Pure: no I/O. Generic over the admitted kind: Pods are read typed, Volcano Jobs as
//! [`DynamicObject`]s (no Rust type of Volcano's is needed to rewrite their task templates).

use kube::Resource;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why a review could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not an AdmissionReview of the kind this endpoint serves.
    #[error("the body is not an admission.k8s.io/v1 AdmissionReview of a {kind}")]
    Parse {
        /// The kind the endpoint serves.
        kind: &'static str,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// The review carries no request.
    #[error("the AdmissionReview carries no request")]
    NoRequest,
}

/// What to answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admit, applying `patch` (RFC 6902 operations; empty: unchanged) and showing `warnings`.
    Allow {
        /// The JSON patch.
        patch: Vec<Value>,
        /// Warnings for the client.
        warnings: Vec<String>,
    },
    /// Deny with a message for the client.
    Deny {
        /// The message, naming the container and resource.
        message: String,
    },
}

/// The admission request for a `kind` (named in errors) in `body`.
///
/// # Errors
/// [`ReviewError`] when the body is not a review with a request.
pub fn parse<K: Resource + DeserializeOwned>(body: &[u8], kind: &'static str) -> Result<AdmissionRequest<K>, ReviewError> {
    let review: AdmissionReview<K> = serde_json::from_slice(body).map_err(|source| ReviewError::Parse { kind, source })?;
    review.try_into().map_err(|_| ReviewError::NoRequest)
}

/// Whether the request is one this webhook converts: a CREATE of the object itself (no
/// subresource) that carries the object.
pub fn is_create<K: Resource>(request: &AdmissionRequest<K>) -> bool {
    request.operation == Operation::Create && request.object.is_some() && request.sub_resource.is_none()
}

/// The review answering `request` with `decision`.
pub fn respond<K: Resource>(request: &AdmissionRequest<K>, decision: Decision) -> AdmissionReview<DynamicObject> {
    let response = AdmissionResponse::from(request);
    let response = match decision {
        Decision::Deny { message } => {
            let mut denied = response.deny(message);
            // 403 as the API server's own admission plugins deny; kubectl prints the message.
            denied.result.code = 403;
            denied.result.reason = "Forbidden".to_owned();
            denied
        }
        Decision::Allow { patch, warnings } => {
            let mut allowed = if patch.is_empty() {
                response
            } else {
                match serde_json::from_value::<json_patch::Patch>(Value::Array(patch)) {
                    Ok(p) => match response.clone().with_patch(p) {
                        Ok(r) => r,
                        Err(e) => response.deny(format!("vgpu-dra webhook: serializing the patch: {e}")),
                    },
                    // The conversion's patch is made of add/remove operations; this cannot fail
                    // unless the conversion is broken, and then no half-converted pod gets in.
                    Err(e) => response.deny(format!("vgpu-dra webhook: the conversion made an invalid patch: {e}")),
                }
            };
            if !warnings.is_empty() {
                allowed.warnings = Some(warnings);
            }
            allowed
        }
    };
    response.into_review()
}

/// The review answering a body that could not be read.
pub fn invalid(error: &ReviewError) -> AdmissionReview<DynamicObject> {
    AdmissionResponse::invalid(error).into_review()
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;

    /// A review of a pod CREATE as the API server sends it.
    pub(crate) fn pod_review(pod: Value, dry_run: bool) -> Vec<u8> {
        review_of(pod, ("", "v1", "Pod", "pods"), dry_run)
    }

    /// A review of a Volcano Job CREATE as the API server sends it.
    pub(crate) fn job_review(job: Value, dry_run: bool) -> Vec<u8> {
        review_of(job, ("batch.volcano.sh", "v1alpha1", "Job", "jobs"), dry_run)
    }

    /// A review of a pod CREATE whose request names `namespace` (`None`: names none).
    pub(crate) fn pod_review_in(pod: Value, namespace: Option<&str>) -> Vec<u8> {
        let mut review: Value = serde_json::from_slice(&pod_review(pod, false)).unwrap();
        review["request"]["namespace"] = namespace.map_or(Value::Null, Value::from);
        serde_json::to_vec(&review).unwrap()
    }

    fn review_of(object: Value, (group, version, kind, resource): (&str, &str, &str, &str), dry_run: bool) -> Vec<u8> {
        let gvk = json!({"group": group, "version": version, "kind": kind});
        let gvr = json!({"group": group, "version": version, "resource": resource});
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": gvk,
                "resource": gvr,
                "requestKind": gvk,
                "requestResource": gvr,
                "name": object["metadata"]["name"],
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": object,
                "dryRun": dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_patch_travels_base64_with_its_type_and_the_uid() {
        let body =
            pod_review(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}), false);
        let request = parse::<Pod>(&body, "Pod").unwrap();
        assert!(is_create(&request));
        let patch = vec![json!({"op": "add", "path": "/spec/resourceClaims", "value": []})];
        let review = respond(&request, Decision::Allow { patch, warnings: vec!["w".into()] });
        let out = serde_json::to_value(&review).unwrap();
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        let r = &out["response"];
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        // kube-core writes the bytes as a number array, which the API server's decoder reads
        // into its []byte field as well as base64 (the test bed proves it).
        let bytes: Vec<u8> = serde_json::from_value(r["patch"].clone()).unwrap();
        let sent: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(sent, json!([{"op": "add", "path": "/spec/resourceClaims", "value": []}]));
        assert_eq!(r["warnings"], json!(["w"]));
    }

    #[test]
    fn a_denial_carries_the_message_and_no_patch() {
        let body =
            pod_review(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}), false);
        let request = parse::<Pod>(&body, "Pod").unwrap();
        let out = serde_json::to_value(respond(&request, Decision::Deny { message: "container \"c\": no".into() })).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["message"], "container \"c\": no");
        assert_eq!(out["response"]["status"]["code"], 403);
        assert!(out["response"].get("patch").is_none());
    }

    #[test]
    fn garbage_is_answered_invalid() {
        let err = parse::<Pod>(b"{\"kind\": 3}", "Pod").unwrap_err();
        let out = serde_json::to_value(invalid(&err)).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert!(
            out["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("not an admission.k8s.io/v1 AdmissionReview of a Pod")
        );
    }
}
