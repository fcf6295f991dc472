#![allow(clippy::unwrap_used)]

use vgpu_scheduling::CompatSettings;
use vgpu_scheduling::compat::{job_match_condition, pod_match_condition};

use std::sync::Arc;

use super::*;

fn registration(endpoint: Endpoint) -> Registration {
    Registration {
        name: "vgpu-dra-webhook".into(),
        endpoint,
        ca_bundle: Some("-----BEGIN CERTIFICATE-----\n".into()),
        match_condition: pod_match_condition(&CompatSettings::hami()),
        job_match_condition: None,
        claim_match_condition: None,
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
        assert_eq!(endpoint.client_config(PODS_PATH, None).url.as_deref(), Some(pods));
        assert_eq!(endpoint.client_config(JOBS_PATH, None).url.as_deref(), Some(jobs));
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

const CONFIG: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vgpu-dra-webhook";
const DAY: Duration = Duration::from_secs(86_400);

/// Another writer's change to the held configuration.
type Change = Box<dyn FnOnce(&mut serde_json::Value) + Send>;

/// A configuration held by a fake API server, with resourceVersions, server-side apply of whole
/// objects and JSON patches, both conditional on a resourceVersion they carry.
#[derive(Default)]
struct Held {
    object: Option<serde_json::Value>,
    version: u64,
    calls: Vec<String>,
    /// Another writer's change, made once just before the first write is answered: a
    /// concurrent replica between our read and our write.
    interloper: Option<Change>,
}

impl Held {
    fn store(&mut self, mut object: serde_json::Value) -> Vec<u8> {
        self.version += 1;
        object["metadata"]["resourceVersion"] = self.version.to_string().into();
        let body = serde_json::to_vec(&object).unwrap();
        self.object = Some(object);
        body
    }

    fn answer(&mut self, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, Vec<u8>) {
        if path != CONFIG {
            return status(404);
        }
        if method == "PATCH"
            && let (Some(change), Some(object)) = (self.interloper.take(), self.object.clone())
        {
            let mut object = object;
            change(&mut object);
            self.store(object);
        }
        let current = self.object.as_ref().and_then(|o| o["metadata"]["resourceVersion"].as_str()).map(str::to_owned);
        match (method, content_type) {
            ("GET", _) => match &self.object {
                Some(o) => (200, serde_json::to_vec(o).unwrap()),
                None => status(404),
            },
            ("PATCH", "application/apply-patch+yaml") => {
                let object: serde_json::Value = serde_json::from_slice(body).unwrap();
                let wanted = object["metadata"]["resourceVersion"].as_str().map(str::to_owned);
                if wanted.is_some() && wanted != current {
                    return status(409);
                }
                (200, self.store(object))
            }
            ("PATCH", "application/json-patch+json") => {
                let Some(mut object) = self.object.clone() else { return status(404) };
                let patch: json_patch::Patch = serde_json::from_slice(body).unwrap();
                json_patch::patch(&mut object, &patch).unwrap();
                if object["metadata"]["resourceVersion"].as_str().map(str::to_owned) != current {
                    return status(409);
                }
                (200, self.store(object))
            }
            _ => status(405),
        }
    }
}

fn status(code: u16) -> (u16, Vec<u8>) {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        _ => "MethodNotAllowed",
    };
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": reason});
    (code, serde_json::to_vec(&status).unwrap())
}

fn client(held: &Arc<std::sync::Mutex<Held>>) -> kube::Client {
    let held = Arc::clone(held);
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let held = Arc::clone(&held);
        async move {
            let (method, path) = (request.method().to_string(), request.uri().path().to_owned());
            let content_type =
                request.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            let body = request.into_body().collect_bytes().await.unwrap();
            let mut held = held.lock().unwrap();
            held.calls.push(format!("{method} {content_type}"));
            let (code, body) = held.answer(&method, &path, &content_type, &body);
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(code).body(kube::client::Body::from(body)).unwrap(),
            )
        }
    });
    kube::Client::new(service, "default")
}

/// A CA made `days_ago` with a year's validity, as PEM.
fn ca(days_ago: u32) -> String {
    let now = SystemTime::now() - days_ago * DAY;
    crate::tls::CertBundle::generate_at(&["wh.ns.svc".into()], 365 * DAY, now).unwrap().ca_pem
}

fn registered(held: &Arc<std::sync::Mutex<Held>>) -> Vec<String> {
    let held = held.lock().unwrap();
    let object: MutatingWebhookConfiguration = serde_json::from_value(held.object.clone().unwrap()).unwrap();
    let hooks = object.webhooks.unwrap();
    let bundles: Vec<String> =
        hooks.iter().map(|w| String::from_utf8(w.client_config.ca_bundle.clone().unwrap().0).unwrap()).collect();
    assert!(bundles.iter().all(|b| *b == bundles[0]), "every webhook gets the same bundle");
    bundles[0].split_inclusive("-----END CERTIFICATE-----\n").map(str::to_owned).collect()
}

fn with_bundle(registration: &Registration, ca_bundle: Option<String>) -> serde_json::Value {
    serde_json::to_value(Registration { ca_bundle, ..registration.clone() }.configuration()).unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Writer {
    Full,
    CaBundle,
}

async fn write(writer: Writer, registration: &Registration, held: &Arc<std::sync::Mutex<Held>>) -> Result<(), RegistrationError> {
    match writer {
        Writer::Full => registration.apply(client(held), Duration::from_secs(5)).await,
        Writer::CaBundle => registration.apply_ca_bundle(client(held), Duration::from_secs(5)).await,
    }
}

/// A replica registering the CA of the Secret it read never drops a CA registered by another
/// that is still valid, whatever the order: it read an older Secret than the one registered (it
/// started during a renewal), a newer one (it recreated a deleted Secret), or another replica
/// writes between its read and its write.
#[tokio::test]
async fn a_write_never_drops_a_registered_ca_still_valid() {
    crate::install_crypto_provider();
    let (old, current, renewed, concurrent, expired) = (ca(300), ca(200), ca(0), ca(1), ca(400));
    for writer in [Writer::Full, Writer::CaBundle] {
        for (case, ours, before, interloper) in [
            ("an older Secret than the one registered", &current, format!("{renewed}{current}"), None),
            ("a recreated Secret", &renewed, current.clone(), None),
            ("a replica three renewals behind", &old, format!("{renewed}{current}{expired}"), None),
            ("a concurrent writer", &current, old.clone(), Some(concurrent.clone())),
        ] {
            let mut r = registration(Endpoint::Service { name: "wh".into(), namespace: "vgpu".into() });
            r.job_match_condition = Some(job_match_condition(&CompatSettings::volcano()));
            let held = Arc::new(std::sync::Mutex::new(Held::default()));
            held.lock().unwrap().store(with_bundle(&r, Some(before.clone())));
            if let Some(theirs) = interloper.clone() {
                let encoded = serde_json::to_value(ByteString(format!("{theirs}{before}").into_bytes())).unwrap();
                held.lock().unwrap().interloper = Some(Box::new(move |o: &mut serde_json::Value| {
                    for w in o["webhooks"].as_array_mut().unwrap() {
                        w["clientConfig"]["caBundle"] = encoded.clone();
                    }
                }));
            }
            r.ca_bundle = Some(ours.clone());
            write(writer, &r, &held).await.unwrap_or_else(|e| panic!("{writer:?}, {case}: {e}"));
            let now = registered(&held);
            assert_eq!(&now[0], ours, "{writer:?}, {case}: ours first");
            for kept in [&before, &interloper.clone().unwrap_or_default()] {
                for block in kept.split_inclusive("-----END CERTIFICATE-----\n").filter(|b| *b != expired) {
                    assert!(now.iter().any(|n| n == block), "{writer:?}, {case}: a registered CA still valid was dropped");
                }
            }
            assert!(!now.contains(&expired), "{writer:?}, {case}: expired CAs go");
            let writes = held.lock().unwrap().calls.iter().filter(|c| c.starts_with("PATCH")).count();
            assert_eq!(writes, if interloper.is_some() { 2 } else { 1 }, "{writer:?}, {case}: a conflict is retried");
        }
    }
}

/// Where the registration Job made the configuration, the webhook writes its caBundle and
/// nothing else; without the configuration it waits for the Job instead of making one.
#[tokio::test]
async fn the_ca_bundle_writer_changes_only_the_ca_bundle_and_never_creates() {
    crate::install_crypto_provider();
    let mut r = registration(Endpoint::Service { name: "wh".into(), namespace: "vgpu".into() });
    r.ca_bundle = Some(ca(0));
    let held = Arc::new(std::sync::Mutex::new(Held::default()));
    let err = r.apply_ca_bundle(client(&held), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, RegistrationError::NotRegistered { .. }), "{err}");
    assert!(held.lock().unwrap().object.is_none());

    // As the Job registers: no caBundle.
    let made = with_bundle(&r, None);
    assert!(made["webhooks"][0]["clientConfig"].get("caBundle").is_none(), "the Job leaves the field to the webhook");
    held.lock().unwrap().store(made.clone());
    r.apply_ca_bundle(client(&held), Duration::from_secs(5)).await.unwrap();
    let mut now = held.lock().unwrap().object.clone().unwrap();
    assert_eq!(registered(&held), [r.ca_bundle.clone().unwrap()]);
    now["webhooks"][0]["clientConfig"].as_object_mut().unwrap().remove("caBundle");
    now["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    let mut made = made;
    made["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    assert_eq!(now, made, "only the caBundle changed");
    // Written again unchanged: no write at all.
    let writes =
        |held: &Arc<std::sync::Mutex<Held>>| held.lock().unwrap().calls.iter().filter(|c| c.starts_with("PATCH")).count();
    let before = writes(&held);
    r.apply_ca_bundle(client(&held), Duration::from_secs(5)).await.unwrap();
    assert_eq!(writes(&held), before);

    // A configuration without this webhook (another Job's flags) is reported, not patched.
    let mut other = r.clone();
    other.name = "vgpu-dra-webhook".into();
    other.job_match_condition = Some(job_match_condition(&CompatSettings::volcano()));
    let err = other.apply_ca_bundle(client(&held), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(&err, RegistrationError::NoWebhook { webhook, .. } if webhook.starts_with("jobs.")), "{err}");
}
