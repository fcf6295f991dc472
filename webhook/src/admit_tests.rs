#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::Mutex as StdMutex;

use serde_json::{Value, json};
use vgpu_scheduling::compat::CardModel;
use vgpu_scheduling::convert_pod;

use super::*;
use crate::kube_cluster::KubeCluster;
use crate::review::tests::{job_review, pod_review};

#[derive(Debug, Default)]
struct FakeCluster {
    fail: bool,
    hang: bool,
    /// Every template name is taken by someone else's content.
    conflict: bool,
    created: StdMutex<Vec<(String, ResourceClaimTemplate)>>,
}

impl Cluster for Arc<FakeCluster> {
    async fn class_facts(&self) -> Result<ClassFacts, AdmitError> {
        if self.fail {
            return Err(AdmitError::Timeout { what: "listing ResourceSlices".into(), timeout: Duration::from_secs(1) });
        }
        Ok(ClassFacts::new([CardModel { product_name: "Tesla T4".into(), memory_bytes: 15 << 30 }], 1))
    }

    async fn create_templates(&self, namespace: &str, templates: &[ResourceClaimTemplate]) -> Result<(), AdmitError> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        if self.conflict {
            let name = templates[0].metadata.name.clone().unwrap_or_default();
            return Err(AdmitError::TemplateConflict { namespace: namespace.to_owned(), name });
        }
        let mut created = self.created.lock().unwrap();
        created.extend(templates.iter().map(|t| (namespace.to_owned(), t.clone())));
        Ok(())
    }
}

fn admitter(cluster: &Arc<FakeCluster>) -> Admitter<Arc<FakeCluster>> {
    Admitter::new(CompatSettings::hami(), Arc::clone(cluster), Metrics::unregistered())
}

/// The pod of source document 003 section 3.1.
fn smoke_pod(limits: Value, privileged: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hami-compatible-smoke"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "cuda", "image": "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu24.04",
            "securityContext": {"privileged": privileged},
            "resources": {"limits": limits}
        }]}
    })
}

fn response(review: &AdmissionReview<DynamicObject>) -> &kube::core::admission::AdmissionResponse {
    review.response.as_ref().unwrap()
}

#[tokio::test]
async fn the_hami_smoke_pod_gets_a_template_and_a_patch() {
    let cluster = Arc::new(FakeCluster::default());
    let limits = json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 50});
    let review = admitter(&cluster).review(&pod_review(smoke_pod(limits, false), false)).await;
    let r = response(&review);
    assert!(r.allowed, "{r:?}");
    let patch: Vec<Value> = serde_json::from_slice(r.patch.as_ref().unwrap()).unwrap();
    // Its limits were all HAMi's: the whole map goes, leaving no `limits: {}`.
    assert!(patch.contains(&json!({"op": "remove", "path": "/spec/containers/0/resources/limits"})), "{patch:?}");
    let created = cluster.created.lock().unwrap();
    assert_eq!(created.len(), 1);
    let (namespace, template) = &created[0];
    assert_eq!(namespace, "team-a");
    let name = template.metadata.name.clone().unwrap();
    let entry = patch.iter().find(|op| op["path"] == "/spec/resourceClaims").unwrap();
    assert_eq!(entry["value"][0]["resourceClaimTemplateName"], name.as_str());
    let spec = serde_json::to_value(&template.spec).unwrap();
    let exactly = &spec["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(exactly["capacity"]["requests"], json!({"cores": "50", "memory": "4294967296"}), "{spec}");
}

#[tokio::test]
async fn a_dry_run_converts_but_creates_nothing() {
    let cluster = Arc::new(FakeCluster::default());
    let review = admitter(&cluster).review(&pod_review(smoke_pod(json!({"nvidia.com/gpu": 1}), false), true)).await;
    assert!(response(&review).allowed);
    assert!(response(&review).patch.is_some());
    assert!(cluster.created.lock().unwrap().is_empty());
}

#[tokio::test]
async fn bad_input_is_denied_by_name_and_nothing_is_created() {
    let cluster = Arc::new(FakeCluster::default());
    let a = admitter(&cluster);
    for (limits, privileged, want) in [
        (json!({"nvidia.com/gpu": 1}), true, "container \"cuda\" is privileged and asks for nvidia.com/gpu"),
        (json!({"nvidia.com/gpumem-percentage": 150}), false, "container \"cuda\": nvidia.com/gpumem-percentage: 150"),
    ] {
        let review = a.review(&pod_review(smoke_pod(limits, privileged), false)).await;
        let r = response(&review);
        assert!(!r.allowed);
        assert!(r.result.message.starts_with(want), "{}", r.result.message);
        assert!(r.patch.is_none());
    }
    assert!(cluster.created.lock().unwrap().is_empty());
    assert_eq!(a.metrics.admissions(Outcome::Denied), 2);
}

#[tokio::test]
async fn a_pod_without_gpus_is_left_alone() {
    let cluster = Arc::new(FakeCluster { fail: true, ..Default::default() });
    let review = admitter(&cluster).review(&pod_review(smoke_pod(json!({"cpu": "1"}), false), false)).await;
    let r = response(&review);
    assert!(r.allowed && r.patch.is_none(), "{r:?}");
}

#[tokio::test]
async fn a_cluster_failure_refuses_the_pod_so_it_can_be_retried() {
    let cluster = Arc::new(FakeCluster { fail: true, ..Default::default() });
    let review = admitter(&cluster).review(&pod_review(smoke_pod(json!({"nvidia.com/gpu": 1}), false), false)).await;
    let r = response(&review);
    assert!(!r.allowed);
    assert!(
        r.result.message.contains("listing ResourceSlices: no answer") && r.result.message.ends_with("try again"),
        "{}",
        r.result.message
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_cluster_is_a_refusal_within_the_deadline() {
    let cluster = Arc::new(FakeCluster { hang: true, ..Default::default() });
    let admitter = admitter(&cluster).with_deadline(Duration::from_secs(9));
    let review = admitter.review(&pod_review(smoke_pod(json!({"nvidia.com/gpu": 1}), false), false)).await;
    let r = response(&review);
    assert!(!r.allowed);
    assert_eq!(r.result.message, "vgpu-dra webhook: admitting the Pod: no answer from the API server within 9s; try again");
}

/// A Volcano Job of two tasks, one asking `limits`, as the API server sends it.
fn volcano_job(limits: Value) -> Value {
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "gang"},
        "spec": {"minAvailable": 2, "schedulerName": "volcano", "tasks": [
            {"name": "ps", "replicas": 1, "template": {"spec": {"containers": [{"name": "ps", "image": "busybox"}]}}},
            {"name": "worker", "replicas": 2, "template": {"spec": {"containers": [
                {"name": "cuda", "image": "nvidia/cuda", "resources": {"limits": limits}}
            ]}}},
        ]}
    })
}

#[tokio::test]
async fn a_volcano_job_gets_templates_and_a_patch_on_its_task() {
    let cluster = Arc::new(FakeCluster::default());
    let a = admitter(&cluster);
    let review = a.review_job(&job_review(volcano_job(json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000})), false)).await;
    let r = response(&review);
    assert!(r.allowed, "{r:?}");
    let patch: Vec<Value> = serde_json::from_slice(r.patch.as_ref().unwrap()).unwrap();
    assert!(patch.iter().all(|op| op["path"].as_str().unwrap().starts_with("/spec/tasks/1/template/spec/")), "{patch:?}");
    let created = cluster.created.lock().unwrap();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].0, "team-a");
    assert_eq!(a.metrics.admissions(Outcome::Converted), 1);
}

#[tokio::test]
async fn a_bad_volcano_job_is_denied_naming_the_task_and_a_plain_one_passes() {
    let cluster = Arc::new(FakeCluster::default());
    let a = admitter(&cluster);
    let review = a.review_job(&job_review(volcano_job(json!({"nvidia.com/gpu": "1.5"})), false)).await;
    let r = response(&review);
    assert!(!r.allowed);
    assert!(r.result.message.starts_with("task \"worker\": container \"cuda\": nvidia.com/gpu"), "{}", r.result.message);
    let review = a.review_job(&job_review(volcano_job(json!({"cpu": "1"})), false)).await;
    assert!(response(&review).allowed && response(&review).patch.is_none());
    assert!(cluster.created.lock().unwrap().is_empty());
    // A pod review sent to the Job endpoint is not a Job: no task, nothing changes.
    let review = a.review_job(&pod_review(smoke_pod(json!({"nvidia.com/gpu": 1}), false), false)).await;
    assert!(response(&review).allowed && response(&review).patch.is_none());
}

/// Templates go only to the namespace of the request, for an object of that namespace: a
/// review whose object names another namespace, or that names none, is refused with nothing
/// created anywhere.
#[tokio::test]
async fn templates_are_created_only_in_the_requests_namespace() {
    let cluster = Arc::new(FakeCluster::default());
    let a = admitter(&cluster);
    for (request, object, created_in) in [
        (Some("team-a"), None, Some("team-a")),
        (Some("team-a"), Some("team-a"), Some("team-a")),
        (Some("team-b"), Some(""), Some("team-b")),
        (Some("team-a"), Some("kube-system"), None),
        (Some("team-a"), Some("team-b"), None),
        (None, Some("team-b"), None),
        (Some(""), None, None),
    ] {
        cluster.created.lock().unwrap().clear();
        let mut pod = smoke_pod(json!({"nvidia.com/gpu": 1}), false);
        if let Some(ns) = object {
            pod["metadata"]["namespace"] = ns.into();
        }
        let review = a.review(&crate::review::tests::pod_review_in(pod, request)).await;
        let r = response(&review);
        let created: Vec<String> = cluster.created.lock().unwrap().iter().map(|(ns, _)| ns.clone()).collect();
        match created_in {
            Some(ns) => {
                assert!(r.allowed, "{request:?}/{object:?}: {r:?}");
                assert_eq!(created, [ns], "{request:?}/{object:?}");
            }
            None => {
                assert!(!r.allowed && r.patch.is_none(), "{request:?}/{object:?}: {r:?}");
                assert!(r.result.message.starts_with("vgpu-dra webhook: "), "{}", r.result.message);
                assert!(created.is_empty(), "{request:?}/{object:?}: created in {created:?}");
            }
        }
    }
    assert_eq!(a.metrics.denials("namespace"), 4);
    // A Volcano Job too.
    let mut job = volcano_job(json!({"nvidia.com/gpu": 1}));
    job["metadata"]["namespace"] = "kube-system".into();
    cluster.created.lock().unwrap().clear();
    let review = a.review_job(&job_review(job, false)).await;
    assert!(!response(&review).allowed);
    assert!(cluster.created.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_taken_template_name_refuses_the_pod_naming_the_template() {
    let cluster = Arc::new(FakeCluster { conflict: true, ..Default::default() });
    let a = admitter(&cluster);
    let review = a.review(&pod_review(smoke_pod(json!({"nvidia.com/gpu": 1}), false), false)).await;
    let r = response(&review);
    assert!(!r.allowed && r.patch.is_none(), "{r:?}");
    let message = &r.result.message;
    assert!(message.starts_with("vgpu-dra webhook: ResourceClaimTemplate team-a/hami-vgpu-"), "{message}");
    assert!(message.ends_with("delete it (vgpu-dra makes it again) or rename it"), "{message}");
    assert!(!message.contains("try again"), "{message}");
    assert_eq!((a.metrics.admissions(Outcome::Denied), a.metrics.denials("template_conflict")), (1, 1));
}

/// An API server holding the ResourceClaimTemplates of namespace team-a: create (409 for a
/// name taken), get, and dry-run create, each stored or returned with a default filled in and
/// quantities canonical, as the real one does.
#[derive(Default)]
struct TemplateApi {
    stored: StdMutex<std::collections::BTreeMap<String, Value>>,
    calls: StdMutex<Vec<String>>,
}

const TEMPLATES: &str = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates";

/// What the API server makes of a template it is given.
fn as_stored(mut template: Value) -> Value {
    for request in template["spec"]["spec"]["devices"]["requests"].as_array_mut().into_iter().flatten() {
        let exactly = &mut request["exactly"];
        if exactly.get("allocationMode").is_none() {
            exactly["allocationMode"] = "ExactCount".into();
        }
        if exactly["capacity"]["requests"]["memory"] == "4294967296" {
            exactly["capacity"]["requests"]["memory"] = "4Gi".into();
        }
    }
    template
}

impl TemplateApi {
    fn answer(&self, method: &str, path: &str, query: &str, body: &[u8]) -> (u16, Value) {
        self.calls.lock().unwrap().push(format!("{method} {path}?{query}"));
        let status = |code: u16, reason: &str| {
            (
                code,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": reason}),
            )
        };
        let mut stored = self.stored.lock().unwrap();
        match (method, path.strip_prefix(TEMPLATES)) {
            ("POST", Some("")) => {
                let mut template = as_stored(serde_json::from_slice(body).unwrap());
                if query.contains("dryRun=All") {
                    let prefix = template["metadata"]["generateName"].as_str().unwrap().to_owned();
                    template["metadata"]["name"] = format!("{prefix}x7k2p").into();
                    return (201, template);
                }
                let name = template["metadata"]["name"].as_str().unwrap().to_owned();
                if stored.contains_key(&name) {
                    return status(409, "AlreadyExists");
                }
                stored.insert(name, template.clone());
                (201, template)
            }
            ("GET", Some(name)) => match stored.get(name.trim_start_matches('/')) {
                Some(t) => (200, t.clone()),
                None => status(404, "NotFound"),
            },
            _ => status(405, "MethodNotAllowed"),
        }
    }

    fn cluster(self: &Arc<Self>) -> KubeCluster {
        let api = Arc::clone(self);
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let api = Arc::clone(&api);
            async move {
                let (method, path) = (request.method().to_string(), request.uri().path().to_owned());
                let query = request.uri().query().unwrap_or_default().to_owned();
                let body = request.into_body().collect_bytes().await.unwrap();
                let (code, value) = api.answer(&method, &path, &query, &body);
                let body = kube::client::Body::from(serde_json::to_vec(&value).unwrap());
                Ok::<_, std::convert::Infallible>(http::Response::builder().status(code).body(body).unwrap())
            }
        });
        KubeCluster::new(
            kube::Client::new(service, "default"),
            "hami-core-gpu.project-hami.io",
            Duration::from_secs(5),
            Duration::from_secs(10),
        )
    }
}

/// The template the smoke pod converts to.
fn smoke_template() -> ResourceClaimTemplate {
    let pod: Pod = serde_json::from_value(smoke_pod(json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}), false)).unwrap();
    let facts = ClassFacts::new([CardModel { product_name: "Tesla T4".into(), memory_bytes: 15 << 30 }], 1);
    convert_pod(&pod, &CompatSettings::hami(), &facts).unwrap().templates.remove(0)
}

/// A template already under our name is used only when it holds what we would store; any other
/// content under that name, whoever made it, is refused, and nothing is overwritten.
#[tokio::test]
async fn an_existing_template_is_used_only_with_the_content_we_would_store() {
    let ours = smoke_template();
    let name = ours.metadata.name.clone().unwrap();
    let ours_json = serde_json::to_value(&ours).unwrap();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut t = ours_json.clone();
        f(&mut t);
        t
    };
    let cases: Vec<(&str, Value, bool)> = vec![
        ("made by another admission", ours_json.clone(), true),
        ("made by someone else with our content and more labels", edit(&|t| t["metadata"]["labels"]["team"] = "a".into()), true),
        (
            "other memory",
            edit(&|t| t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "8Gi".into()),
            false,
        ),
        (
            "another device class",
            edit(&|t| t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com".into()),
            false,
        ),
        (
            "a second request",
            edit(&|t| {
                let first = t["spec"]["spec"]["devices"]["requests"][0].clone();
                let mut second = first.clone();
                second["name"] = "extra".into();
                t["spec"]["spec"]["devices"]["requests"] = json!([first, second]);
            }),
            false,
        ),
        (
            "a device config",
            edit(&|t| {
                t["spec"]["spec"]["devices"]["config"] = json!([{"opaque": {"driver": "x.example.com", "parameters": {}}}])
            }),
            false,
        ),
        ("labels for the claims", edit(&|t| t["spec"]["metadata"] = json!({"labels": {"sneaky": "yes"}})), false),
        ("without our label", edit(&|t| t["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "someone"})), false),
    ];
    for (case, existing, usable) in cases {
        let api = Arc::new(TemplateApi::default());
        let stored = as_stored(existing);
        api.stored.lock().unwrap().insert(name.clone(), stored.clone());
        let cluster = api.cluster();
        let result = cluster.create_templates("team-a", std::slice::from_ref(&ours)).await;
        match (usable, result) {
            (true, Ok(())) => {}
            (false, Err(AdmitError::TemplateConflict { namespace, name: taken })) => {
                assert_eq!((namespace.as_str(), taken.as_str()), ("team-a", name.as_str()), "{case}");
            }
            (_, other) => panic!("{case}: {other:?}"),
        }
        assert_eq!(api.stored.lock().unwrap()[&name], stored, "{case}: never overwritten");
        let calls = api.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 3, "{case}: create, get, dry-run create: {calls:?}");
        // Confirmed ours: not asked again for a while; taken: asked again at the next pod.
        let again = cluster.create_templates("team-a", std::slice::from_ref(&ours)).await;
        assert_eq!(again.is_ok(), usable, "{case}");
        assert_eq!(api.calls.lock().unwrap().len(), if usable { 3 } else { 6 }, "{case}");
    }
}

/// Issue 39, item 1: with both sets, each pod is converted with the set it is written in, and a
/// pod written in both is denied naming one resource of each.
#[tokio::test]
async fn each_pod_is_converted_with_the_names_it_is_written_in_and_mixing_them_is_denied() {
    let cluster = Arc::new(FakeCluster::default());
    let both = admitter(&cluster).with_flavour(CompatSettings::volcano());
    let patch_of = |review: &AdmissionReview<DynamicObject>| -> Vec<Value> {
        let r = response(review);
        assert!(r.allowed, "{r:?}");
        serde_json::from_slice(r.patch.as_ref().unwrap()).unwrap()
    };
    for limits in [
        json!({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 1024}),
        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}),
    ] {
        let patch = patch_of(&both.review(&pod_review(smoke_pod(limits.clone(), false), false)).await);
        assert!(patch.contains(&json!({"op": "remove", "path": "/spec/containers/0/resources/limits"})), "{limits}: {patch:?}");
    }
    let memories: Vec<String> = cluster
        .created
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| {
            let spec = serde_json::to_value(&t.spec).unwrap();
            spec["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(memories, [(1024u64 << 20).to_string(), (3000u64 << 20).to_string()], "each with its own memory");

    let mixed = json!({"nvidia.com/gpu": 1, "volcano.sh/vgpu-memory": 1024});
    let review = both.review(&pod_review(smoke_pod(mixed, false), false)).await;
    let r = response(&review);
    assert!(!r.allowed);
    let message = &r.result.message;
    assert!(
        message.contains("nvidia.com/gpu") && message.contains("volcano.sh/vgpu-memory") && message.contains("\"cuda\""),
        "{message}"
    );
    // With HAMi's set alone, the Volcano pod is none of its business.
    let review = admitter(&cluster).review(&pod_review(smoke_pod(json!({"volcano.sh/vgpu-number": 1}), false), false)).await;
    assert!(response(&review).patch.is_none());
}
