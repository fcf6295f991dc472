use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;
use crate::compat::fixtures::*;
use crate::compat::{convert_pod, job_match_condition};

/// Source document 000's gang: two workers of 3000 MiB / 30 cores, plus a task without GPUs and
/// fields this crate does not know, which must pass through untouched.
fn gang_job() -> Value {
    let worker = |name: &str| {
        json!({
            "name": name,
            "replicas": 1,
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "template": {
                "metadata": {"annotations": {"nvidia.com/use-gputype": "T4"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "cuda",
                        "image": "nvidia/cuda",
                        "resources": {"limits": {
                            "volcano.sh/vgpu-number": 1,
                            "volcano.sh/vgpu-memory": 3000,
                            "volcano.sh/vgpu-cores": 30,
                        }},
                    }],
                },
            },
        })
    };
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "gang", "namespace": "volcano-demo"},
        "spec": {
            "minAvailable": 2,
            "schedulerName": "volcano",
            "plugins": {"env": [], "svc": []},
            "tasks": [
                worker("worker-a"),
                {"name": "coordinator", "replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
                worker("worker-b"),
            ],
        },
    })
}

#[test]
fn every_task_is_converted_at_its_own_path_and_the_rest_passes_through() {
    let job = gang_job();
    let conv = convert_volcano_job(&job, &CompatSettings::volcano(), &t4_facts()).unwrap();
    assert!(conv.changed());
    // Two workers of one shape share one template.
    assert_eq!(conv.templates.len(), 1, "{:?}", conv.templates);
    let name = conv.templates[0].metadata.name.clone().unwrap();
    let mut out = job.clone();
    apply_patch(&mut out, &conv.patch);
    for task in [0, 2] {
        let spec = &out["spec"]["tasks"][task]["template"]["spec"];
        assert_eq!(spec["resourceClaims"], json!([{"name": "vgpu-cuda", "resourceClaimTemplateName": name}]), "{out:#}");
        // The Job's pods are Volcano's and request nothing else: they keep a cpu request.
        assert_eq!(spec["containers"][0]["resources"], json!({"requests": {"cpu": "1m"}, "claims": [{"name": "vgpu-cuda"}]}));
    }
    // Everything but the converted containers and claims is as it was.
    let mut expected = job.clone();
    for task in [0, 2] {
        let spec = &mut expected["spec"]["tasks"][task]["template"]["spec"];
        spec["resourceClaims"] = out["spec"]["tasks"][task]["template"]["spec"]["resourceClaims"].clone();
        spec["containers"][0]["resources"] = out["spec"]["tasks"][task]["template"]["spec"]["containers"][0]["resources"].clone();
    }
    assert_eq!(out, expected);
    // The task's annotations select the card model as a pod's would.
    let spec = serde_json::to_value(&conv.templates[0].spec).unwrap();
    let request = &spec["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(request["capacity"]["requests"], json!({"cores": "30", "memory": (3000u64 << 20).to_string()}));
    assert!(request["selectors"][0]["cel"]["expression"].as_str().unwrap().contains(r#"["t4"]"#), "{request}");
}

#[test]
fn a_task_converts_exactly_as_the_same_pod_would() {
    let job = gang_job();
    let conv = convert_volcano_job(&job, &CompatSettings::volcano(), &t4_facts()).unwrap();
    let template = &job["spec"]["tasks"][0]["template"];
    // The pod Volcano's controller makes: the template with the Job's scheduler.
    let mut spec = template["spec"].clone();
    spec["schedulerName"] = job["spec"]["schedulerName"].clone();
    let pod: Pod = serde_json::from_value(json!({"metadata": template["metadata"], "spec": spec})).unwrap();
    let as_pod = convert_pod(&pod, &CompatSettings::volcano(), &t4_facts()).unwrap();
    assert_eq!(as_pod.templates, conv.templates);
    let task_ops: Vec<Value> = conv
        .patch
        .iter()
        .filter(|op| op["path"].as_str().unwrap().starts_with("/spec/tasks/0/"))
        .map(|op| {
            let mut op = op.clone();
            op["path"] = json!(op["path"].as_str().unwrap().replace("/spec/tasks/0/template/spec", "/spec"));
            op
        })
        .collect();
    assert_eq!(task_ops, as_pod.patch);
}

#[test]
fn a_denied_task_denies_the_job_naming_task_container_and_resource() {
    let mut job = gang_job();
    job["spec"]["tasks"][2]["template"]["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-memory-percentage"] =
        json!(50);
    let err = convert_volcano_job(&job, &CompatSettings::volcano(), &t4_facts()).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("task \"worker-b\": container \"cuda\""), "{text}");
    assert!(text.contains("volcano.sh/vgpu-memory"), "{text}");
    assert_eq!(err.reason(), "memory_and_percentage");

    let mut job = gang_job();
    job["spec"]["tasks"][1]["template"]["spec"]["containers"] = json!("not a list");
    let err = convert_volcano_job(&job, &CompatSettings::volcano(), &t4_facts()).unwrap_err();
    assert!(err.to_string().starts_with("task \"coordinator\": spec.tasks[1].template is not a pod template"), "{err}");
    assert_eq!(err.reason(), "bad_template");
}

#[test]
fn a_job_without_hami_resources_or_tasks_is_unchanged() {
    let settings = CompatSettings::hami();
    for job in [
        gang_job(), // Volcano's names are not HAMi's: the HAMi settings leave them alone.
        json!({"spec": {}}),
        json!({"spec": {"tasks": [{"name": "t"}]}}),
        json!({"spec": {"tasks": [{"template": {"metadata": {}}}]}}),
    ] {
        let conv = convert_volcano_job(&job, &settings, &t4_facts()).unwrap();
        assert!(!conv.changed() && conv.templates.is_empty(), "{job}");
    }
}

#[test]
fn a_converted_job_is_left_alone() {
    let settings = CompatSettings::volcano();
    let mut job = gang_job();
    let first = convert_volcano_job(&job, &settings, &t4_facts()).unwrap();
    apply_patch(&mut job, &first.patch);
    let again = convert_volcano_job(&job, &settings, &t4_facts()).unwrap();
    assert!(!again.changed(), "{:?}", again.patch);
}

#[test]
fn warnings_name_their_task() {
    let mut job = gang_job();
    job["spec"]["tasks"][0]["template"]["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] = json!("binpack");
    let conv = convert_volcano_job(&job, &CompatSettings::volcano(), &t4_facts()).unwrap();
    assert_eq!(conv.warnings.len(), 1, "{:?}", conv.warnings);
    assert!(conv.warnings[0].starts_with("task \"worker-a\": ") && conv.warnings[0].contains("hami.io/gpu-scheduler-policy"));
}

#[test]
fn the_job_match_condition_names_the_task_templates() {
    let expr = job_match_condition(&CompatSettings::volcano());
    assert!(expr.contains("object.spec.tasks.exists(t") && expr.contains("volcano.sh/vgpu-memory"), "{expr}");
}
