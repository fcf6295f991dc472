use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use serde_json::json;

use super::*;
use crate::compat::fixtures::*;
use crate::compat::{CompatSettings, PodConversion, convert_pod, convert_volcano_job};

const NUMBER: &str = "volcano.sh/vgpu-number";
const MEMORY: &str = "volcano.sh/vgpu-memory";
const CORES: &str = "volcano.sh/vgpu-cores";

fn volcano() -> CompatSettings {
    CompatSettings::volcano()
}

/// Source document 000's GPU container: three Volcano vGPU limits and nothing else.
fn gpu(name: &str) -> Container {
    container(name, &[(NUMBER, "1"), (MEMORY, "3000"), (CORES, "30")])
}

/// A pod of `containers` (and `init` containers) for `scheduler`.
fn pod_for(scheduler: Option<&str>, containers: Vec<Container>, init: Vec<Container>) -> Pod {
    let mut p = pod("p", containers, &[]);
    let spec = p.spec.as_mut().unwrap();
    spec.scheduler_name = scheduler.map(str::to_owned);
    spec.init_containers = (!init.is_empty()).then_some(init);
    p
}

fn convert(p: &Pod) -> PodConversion {
    convert_with(p, &volcano())
}

fn convert_with(p: &Pod, settings: &CompatSettings) -> PodConversion {
    let conv = convert_pod(p, settings, &t4_facts()).unwrap();
    let mut doc = serde_json::to_value(p).unwrap();
    apply_patch(&mut doc, &conv.patch);
    assert_eq!(doc, serde_json::to_value(&conv.pod).unwrap(), "the patch makes the returned pod");
    conv
}

/// The patch operations that touch a `requests/cpu` or a whole `requests`.
fn cpu_ops(conv: &PodConversion) -> Vec<Value> {
    conv.patch
        .iter()
        .filter(|op| {
            op["op"] == "add" && op["path"].as_str().is_some_and(|p| p.ends_with("/requests/cpu") || p.ends_with("/requests"))
        })
        .cloned()
        .collect()
}

fn requests_of(c: &Container) -> Value {
    serde_json::to_value(c.resources.as_ref().and_then(|r| r.requests.as_ref())).unwrap()
}

#[test]
fn only_a_non_zero_request_or_limit_volcano_counts_is_a_request() {
    let of = |pairs: &[(&str, &str)]| PodSpec { containers: vec![container("c", pairs)], ..Default::default() };
    for (spec, want, why) in [
        (PodSpec::default(), false, "no container"),
        (of(&[]), false, "no resources"),
        (of(&[("cpu", "0")]), false, "a zero cpu"),
        (of(&[("memory", "0Mi"), ("cpu", "0m")]), false, "zeros in other forms"),
        (of(&[("pods", "1"), ("count/pods", "1")]), false, "pods and count/* (Volcano ignores them)"),
        (of(&[("cpu", "1m")]), true, "the smallest cpu"),
        (of(&[("cpu", "100m")]), true, "a cpu limit, which the API server makes the request"),
        (of(&[("memory", "1")]), true, "one byte"),
        (of(&[("ephemeral-storage", "1Gi")]), true, "ephemeral storage"),
        (of(&[("hugepages-2Mi", "2Mi")]), true, "huge pages"),
        (of(&[("example.com/nic", "1")]), true, "an extended resource"),
        (of(&[("cpu", "lots")]), true, "not a quantity (the API server refuses it anyway)"),
    ] {
        assert_eq!(requests_something(&spec), want, "{why}");
    }
    // Requests as well as limits, init containers, pod-level resources and overhead.
    let requests = PodSpec { containers: vec![with_requests("c", &[], &[("memory", "64Mi")])], ..Default::default() };
    let init = PodSpec { init_containers: Some(vec![container("i", &[("cpu", "1")])]), ..of(&[]) };
    let pod_level = PodSpec {
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".to_owned(), KubeQuantity("1".into()))].into_iter().collect()),
            ..Default::default()
        }),
        ..of(&[])
    };
    let overhead =
        PodSpec { overhead: Some([("memory".to_owned(), KubeQuantity("120Mi".into()))].into_iter().collect()), ..of(&[]) };
    for (spec, why) in
        [(requests, "a memory request"), (init, "an init container's cpu"), (pod_level, "pod-level"), (overhead, "overhead")]
    {
        assert!(requests_something(&spec), "{why}");
    }
}

#[test]
fn a_volcano_pod_left_with_no_request_gets_the_cpu_request_on_its_gpu_container() {
    // 000's single pod: its only requests were the vGPU limits the conversion takes away.
    let conv = convert(&pod_for(Some("volcano"), vec![gpu("cuda")], vec![]));
    let spec = conv.pod.spec.as_ref().unwrap();
    assert_eq!(requests_of(&spec.containers[0]), json!({"cpu": "1m"}));
    assert_eq!(cpu_ops(&conv), [json!({"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"cpu": "1m"}})]);
    assert!(requests_something(spec) && conv.warnings.is_empty());

    // With the vGPU resources also in requests (as the API server stores a pod's limits), the
    // emptied requests are removed and come back with the cpu.
    let mut both = gpu("cuda");
    let limits = both.resources.as_ref().unwrap().limits.clone();
    both.resources.as_mut().unwrap().requests = limits;
    let conv = convert(&pod_for(Some("volcano"), vec![both], vec![]));
    assert_eq!(cpu_ops(&conv), [json!({"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"cpu": "1m"}})]);
    assert_eq!(requests_of(&conv.pod.spec.unwrap().containers[0]), json!({"cpu": "1m"}));
}

#[test]
fn a_pod_that_requests_anything_else_is_left_as_written() {
    let cpu_limit = container("cuda", &[(NUMBER, "1"), (MEMORY, "3000"), ("cpu", "2")]);
    let memory_request = with_requests("cuda", &[(NUMBER, "1")], &[("memory", "1Gi")]);
    let storage = container("cuda", &[(NUMBER, "1"), ("ephemeral-storage", "1Gi")]);
    let sidecar_cpu = container("log", &[("cpu", "50m")]);
    let init_memory = container("fetch", &[("memory", "64Mi")]);
    for (p, why) in [
        (pod_for(Some("volcano"), vec![cpu_limit], vec![]), "a cpu limit"),
        (pod_for(Some("volcano"), vec![memory_request], vec![]), "a memory request"),
        (pod_for(Some("volcano"), vec![storage], vec![]), "ephemeral storage"),
        (pod_for(Some("volcano"), vec![gpu("cuda"), sidecar_cpu], vec![]), "another container's cpu"),
        (pod_for(Some("volcano"), vec![gpu("cuda")], vec![init_memory]), "an init container's memory"),
    ] {
        let conv = convert(&p);
        assert!(conv.changed(), "{why}: converted");
        assert!(cpu_ops(&conv).is_empty(), "{why}: {:?}", conv.patch);
        for c in &conv.pod.spec.as_ref().unwrap().containers {
            assert!(!requests_of(c).as_object().is_some_and(|r| r.get("cpu") == Some(&json!("1m"))), "{why}: {c:?}");
        }
    }
}

#[test]
fn pods_of_other_schedulers_are_left_as_written() {
    for scheduler in [None, Some("default-scheduler"), Some("my-scheduler"), Some("Volcano"), Some("")] {
        let conv = convert(&pod_for(scheduler, vec![gpu("cuda")], vec![]));
        assert!(conv.changed());
        assert!(cpu_ops(&conv).is_empty(), "{scheduler:?}: {:?}", conv.patch);
    }
    // Volcano's scheduler names are configurable (vc-scheduler's --scheduler-name).
    let settings = CompatSettings {
        volcano: VolcanoSettings { scheduler_names: vec!["vc-a".into(), "vc-b".into()], ..VolcanoSettings::default() },
        ..volcano()
    };
    assert_eq!(cpu_ops(&convert_with(&pod_for(Some("vc-b"), vec![gpu("cuda")], vec![]), &settings)).len(), 1);
    assert!(cpu_ops(&convert_with(&pod_for(Some("volcano"), vec![gpu("cuda")], vec![]), &settings)).is_empty());
}

#[test]
fn the_request_is_configurable_and_can_be_turned_off() {
    let p = pod_for(Some("volcano"), vec![gpu("cuda")], vec![]);
    let with = |cpu: Option<&str>| CompatSettings {
        volcano: VolcanoSettings { cpu_request: cpu.map(|c| Quantity::parse(c).unwrap()), ..VolcanoSettings::default() },
        ..volcano()
    };
    let conv = convert_with(&p, &with(Some("0.01")));
    assert_eq!(requests_of(&conv.pod.spec.unwrap().containers[0]), json!({"cpu": "10m"}));
    for off in [None, Some("0")] {
        let conv = convert_with(&p, &with(off));
        assert!(conv.changed() && cpu_ops(&conv).is_empty(), "{off:?}");
        assert!(!requests_something(conv.pod.spec.as_ref().unwrap()));
    }
    assert_eq!(VolcanoSettings::default().cpu_request, Some(Quantity::parse("1m").unwrap()));
}

#[test]
fn the_first_gpu_container_gets_it_regular_containers_before_init_containers() {
    // Two GPU containers and a plain one: only the first GPU container gets the request.
    let conv = convert(&pod_for(Some("volcano"), vec![container("plain", &[]), gpu("a"), gpu("b")], vec![]));
    assert_eq!(cpu_ops(&conv), [json!({"op": "add", "path": "/spec/containers/1/resources/requests", "value": {"cpu": "1m"}})]);
    // A GPU init container and a GPU container: the container, which lasts as long as the pod.
    let conv = convert(&pod_for(Some("volcano"), vec![gpu("main")], vec![gpu("warmup")]));
    assert_eq!(cpu_ops(&conv), [json!({"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"cpu": "1m"}})]);
    // Only an init container has a GPU: it gets it (Volcano counts init containers' requests).
    let conv = convert(&pod_for(Some("volcano"), vec![container("main", &[])], vec![gpu("warmup")]));
    assert_eq!(
        cpu_ops(&conv),
        [json!({"op": "add", "path": "/spec/initContainers/0/resources/requests", "value": {"cpu": "1m"}})]
    );
    assert!(requests_something(conv.pod.spec.as_ref().unwrap()));
}

#[test]
fn a_container_naming_a_zero_cpu_is_passed_over_and_a_pod_of_only_those_is_warned() {
    // A zero cpu limit would refuse a request above it: the next GPU container gets it.
    let zero = container("a", &[(NUMBER, "1"), ("cpu", "0")]);
    let conv = convert(&pod_for(Some("volcano"), vec![zero.clone(), gpu("b")], vec![]));
    assert_eq!(cpu_ops(&conv), [json!({"op": "add", "path": "/spec/containers/1/resources/requests", "value": {"cpu": "1m"}})]);
    let conv = convert(&pod_for(Some("volcano"), vec![zero], vec![]));
    assert!(conv.changed() && cpu_ops(&conv).is_empty(), "{:?}", conv.patch);
    assert_eq!(conv.warnings.len(), 1, "{:?}", conv.warnings);
    assert!(conv.warnings[0].contains("best-effort") && conv.warnings[0].contains("request some cpu"), "{}", conv.warnings[0]);
}

#[test]
fn a_pod_converted_to_no_device_gets_nothing() {
    // A count of 0: no claim, so no GPU container to keep requesting (Volcano saw 0 under HAMi).
    let conv = convert(&pod_for(Some("volcano"), vec![container("cuda", &[(NUMBER, "0")])], vec![]));
    assert!(conv.changed() && cpu_ops(&conv).is_empty(), "{:?}", conv.patch);
}

#[test]
fn a_converted_pod_is_not_converted_again() {
    let first = convert(&pod_for(Some("volcano"), vec![gpu("cuda")], vec![]));
    let again = convert(&first.pod);
    assert!(!again.changed(), "{:?}", again.patch);
}

#[test]
fn a_jobs_pods_get_the_scheduler_volcano_gives_them() {
    let settings = VolcanoSettings::default();
    assert_eq!(settings.job_pod_scheduler(Some("tmpl"), Some("job")), "tmpl");
    assert_eq!(settings.job_pod_scheduler(None, Some("job")), "job");
    assert_eq!(settings.job_pod_scheduler(Some(""), Some("")), "volcano");
    assert_eq!(settings.job_pod_scheduler(None, None), "volcano");
    let named = VolcanoSettings { scheduler_names: vec!["vc-a".into(), "vc-b".into()], ..settings };
    assert_eq!(named.job_pod_scheduler(None, None), "vc-a");
}

/// A Volcano Job of one task (000's gang) with the given scheduler names on the Job and its
/// template, and `resources` on its container.
fn job(job_scheduler: Option<&str>, template_scheduler: Option<&str>, resources: Value) -> Value {
    let mut spec = json!({"restartPolicy": "Never", "containers": [{"name": "cuda", "image": "cuda", "resources": resources}]});
    if let Some(s) = template_scheduler {
        spec["schedulerName"] = json!(s);
    }
    let mut job = json!({
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "gang", "namespace": "volcano-demo"},
        "spec": {"minAvailable": 2, "tasks": [{"name": "worker", "replicas": 2, "template": {"spec": spec}}]},
    });
    if let Some(s) = job_scheduler {
        job["spec"]["schedulerName"] = json!(s);
    }
    job
}

#[test]
fn job_tasks_follow_the_same_rule_with_volcano_as_the_default_scheduler() {
    let limits = json!({"limits": {NUMBER: 1, MEMORY: 3000, CORES: 30}});
    let cpu_path = "/spec/tasks/0/template/spec/containers/0/resources/requests";
    let added = json!([{"op": "add", "path": cpu_path, "value": {"cpu": "1m"}}]);
    for (job_scheduler, template_scheduler, resources, want_cpu) in [
        // A Job that names no scheduler is Volcano's: its webhook writes the default in.
        (None, None, limits.clone(), true),
        (Some("volcano"), None, limits.clone(), true),
        (Some("default-scheduler"), None, limits.clone(), false),
        // The template's own name wins over the Job's.
        (Some("volcano"), Some("default-scheduler"), limits.clone(), false),
        (Some("default-scheduler"), Some("volcano"), limits.clone(), true),
        // A task that requests something keeps its requests as written.
        (None, None, json!({"limits": {NUMBER: 1, "cpu": "500m"}}), false),
        (None, None, json!({"limits": {NUMBER: 1}, "requests": {"memory": "1Gi"}}), false),
    ] {
        let job = job(job_scheduler, template_scheduler, resources.clone());
        let conv = convert_volcano_job(&job, &volcano(), &t4_facts()).unwrap();
        assert!(conv.changed());
        let ops: Vec<Value> =
            conv.patch.iter().filter(|op| op["path"].as_str().unwrap().contains("/requests")).cloned().collect();
        let want = if want_cpu { added.as_array().unwrap().clone() } else { Vec::new() };
        assert_eq!(ops, want, "{job_scheduler:?} / {template_scheduler:?} / {resources}");
        let mut out = job.clone();
        apply_patch(&mut out, &conv.patch);
        let container = &out["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"];
        assert!(container["limits"].get(MEMORY).is_none(), "{out:#}");
    }
}
