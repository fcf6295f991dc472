#![allow(clippy::unwrap_used)]

use std::sync::Mutex as StdMutex;

use serde_json::{Value, json};
use vgpu_scheduling::compat::CardModel;

use super::*;
use crate::review::tests::{job_review, pod_review};

#[derive(Debug, Default)]
struct FakeCluster {
    fail: bool,
    hang: bool,
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
    assert!(
        patch.contains(&json!({"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpumem"})),
        "{patch:?}"
    );
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
