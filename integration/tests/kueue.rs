//! Kueue's own controller manager on the test bed: its Job webhook (called by the real API server)
//! suspends queued Jobs at creation, its scheduler admits them against a ClusterQueue's quota and
//! unsuspends them, and kube-controller-manager's Job controller then makes their pods. Then source
//! document 003 end to end: HAMi-style Jobs counted by ResourceTransformations, their pods
//! converted by the vgpu-dra webhook, their claims allocated by the scheduler and prepared by the
//! driver; the Job over quota waits until one is deleted. Last, the DRA-native path with Kueue
//! v0.19: Jobs whose pods use a ResourceClaimTemplate, counted by the memory they ask of the card
//! (`KueueDRAIntegrationConsumableCapacity`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use vgpu_dra_integration::kueue::{Kueue, KueueVersion};
use vgpu_dra_integration::{ControlPlane, Kubectl, ManagedProcess, eventually, free_port};

mod common;

use common::webhook::{self, DEVICE_CLASS};
use common::{Dirs, cdi_check, claim_response, driver, kubelet};

const NODE: &str = "kueue-node";

/// A Configuration with only the Job integration, as a user writes it.
const CPU_CONFIG: &str = "apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
integrations:
  frameworks:
  - batch/job
";

const CPU_QUEUES: &str = "apiVersion: v1
kind: Namespace
metadata:
  name: kueue-cpu
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: default-flavor
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: cpu-cq
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: default-flavor
      resources:
      - name: cpu
        nominalQuota: 1
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: cpu-queue
  namespace: kueue-cpu
spec:
  clusterQueue: cpu-cq
";

/// A Job of one pod asking one CPU, queued in `cpu-queue`; not suspended by its author.
fn cpu_job(name: &str) -> String {
    format!(
        "apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: kueue-cpu
  labels:
    kueue.x-k8s.io/queue-name: cpu-queue
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: work
        image: registry.invalid/none
        resources:
          requests:
            cpu: 1
"
    )
}

/// The Workload Kueue made for Job `job` in `namespace`.
fn workload_of(kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<Option<Value>> {
    let list = kubectl.get_json(&["workloads.kueue.x-k8s.io", "-n", namespace])?;
    Ok(list["items"].as_array().into_iter().flatten().find(|w| owned_by(w, "Job", job)).cloned())
}

fn owned_by(object: &Value, kind: &str, name: &str) -> bool {
    object["metadata"]["ownerReferences"].as_array().is_some_and(|o| o.iter().any(|r| r["kind"] == kind && r["name"] == name))
}

/// The condition `kind` of an object's status.
fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

fn is_true(object: &Value, kind: &str) -> bool {
    condition(object, kind).is_some_and(|c| c["status"] == "True")
}

/// Waits until Job `job`'s Workload is admitted and returns it.
fn wait_admitted(kueue: &mut Kueue, kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<Value> {
    eventually(&format!("Job {namespace}/{job} admitted"), Duration::from_secs(60), || {
        kueue.check_running()?;
        Ok(workload_of(kubectl, namespace, job)?.filter(|w| is_true(w, "Admitted")))
    })
}

/// Waits until Job `job`'s Workload is held by quota and returns its QuotaReserved message.
fn wait_held(kueue: &mut Kueue, kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<String> {
    eventually(&format!("Job {namespace}/{job} held by quota"), Duration::from_secs(60), || {
        kueue.check_running()?;
        let Some(w) = workload_of(kubectl, namespace, job)? else { return Ok(None) };
        let message = condition(&w, "QuotaReserved").filter(|c| c["status"] == "False").and_then(|c| c["message"].as_str());
        Ok(message.filter(|m| m.contains("insufficient unused quota")).map(str::to_owned))
    })
}

fn suspended(kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<bool> {
    Ok(kubectl.get_json(&["job", job, "-n", namespace])?["spec"]["suspend"] == true)
}

/// The pods the Job controller made for `job`.
fn pods_of(kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<Vec<Value>> {
    let list = kubectl.get_json(&["pods", "-n", namespace, "-l", &format!("batch.kubernetes.io/job-name={job}")])?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// Waits until `job` runs: unsuspended, with a pod from the Job controller; returns the pod.
fn wait_running(kueue: &mut Kueue, kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<Value> {
    eventually(&format!("Job {namespace}/{job} unsuspended with a pod"), Duration::from_secs(60), || {
        kueue.check_running()?;
        if suspended(kubectl, namespace, job)? {
            return Ok(None);
        }
        Ok(pods_of(kubectl, namespace, job)?.pop())
    })
}

#[test]
fn kueue_admits_jobs_within_a_cpu_quota() {
    let plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let mut kueue = Kueue::start(&plane, CPU_CONFIG).expect("kueue");
    let outcome = cpu_scenario(&plane, &mut kueue);
    if let Err(e) = with_manager_log(&mut kueue, outcome) {
        panic!("{e:#}");
    }
}

/// Passes `outcome` on, printing Kueue's manager log first when it failed: the test bed prints
/// its own components' logs, not those of what a test started. A failure that came from Kueue
/// having exited (a webhook call refused, say) says so first.
fn with_manager_log<T>(kueue: &mut Kueue, outcome: anyhow::Result<T>) -> anyhow::Result<T> {
    let Err(e) = outcome else { return outcome };
    eprintln!("----- kueue-manager log -----\n{}", std::fs::read_to_string(kueue.log()).unwrap_or_default());
    match kueue.check_running() {
        Err(exited) => Err(e.context(format!("{exited:#}"))),
        Ok(()) => Err(e),
    }
}

/// The node of source document 003: one Tesla T4 of 15Gi (labelled as the GPU operator labels
/// it, for Kueue's flavor), the DeviceClass, the driver and the kubelet's plugin side.
struct T4Node {
    dirs: Dirs,
    driver: ManagedProcess,
    kubelet: vgpu_dra_integration::KubeletSim,
}

impl T4Node {
    fn start(plane: &ControlPlane) -> anyhow::Result<Self> {
        let kubectl = plane.kubectl();
        plane.create_node(common::NODE)?;
        kubectl.run(&["label", "node", common::NODE, "nvidia.com/gpu.product=Tesla-T4"])?;
        kubectl.apply(DEVICE_CLASS)?;
        let dirs = Dirs::new(plane.dir());
        let driver = driver(plane, &dirs, "driver");
        let kubelet = kubelet(&dirs);
        Ok(Self { dirs, driver, kubelet })
    }
}

fn cpu_scenario(plane: &ControlPlane, kueue: &mut Kueue) -> anyhow::Result<()> {
    let kubectl = plane.kubectl();
    kubectl.apply(CPU_QUEUES)?;

    // Kueue's Job webhook suspends a queued Job as the API server stores it.
    let created: Value =
        serde_json::from_str(&kubectl.run_with_input(&["create", "-o", "json", "-f", "-"], Some(&cpu_job("first")))?)?;
    assert_eq!(created["spec"]["suspend"], true, "{created:#}");
    let admitted = wait_admitted(kueue, kubectl, "kueue-cpu", "first")?;
    assert_eq!(admitted["status"]["admission"]["clusterQueue"], "cpu-cq", "{admitted:#}");
    let assignment = &admitted["status"]["admission"]["podSetAssignments"][0];
    assert_eq!(assignment["flavors"]["cpu"], "default-flavor", "{admitted:#}");
    assert_eq!(assignment["resourceUsage"]["cpu"], "1", "{admitted:#}");
    let pod = wait_running(kueue, kubectl, "kueue-cpu", "first")?;
    assert!(owned_by(&pod, "Job", "first"), "{pod:#}");

    // The second does not fit the quota: it stays suspended, with Kueue's reason, and no pod.
    let created: Value =
        serde_json::from_str(&kubectl.run_with_input(&["create", "-o", "json", "-f", "-"], Some(&cpu_job("second")))?)?;
    assert_eq!(created["spec"]["suspend"], true, "{created:#}");
    let message = wait_held(kueue, kubectl, "kueue-cpu", "second")?;
    assert!(message.contains("insufficient unused quota for cpu in flavor default-flavor"), "{message}");
    assert!(suspended(kubectl, "kueue-cpu", "second")?);
    assert!(pods_of(kubectl, "kueue-cpu", "second")?.is_empty());
    let workload = workload_of(kubectl, "kueue-cpu", "second")?.unwrap();
    assert!(!is_true(&workload, "Admitted"), "{workload:#}");

    // Deleting the first frees the quota: the second is admitted and gets its pod.
    kubectl.run(&["delete", "job", "first", "-n", "kueue-cpu"])?;
    wait_admitted(kueue, kubectl, "kueue-cpu", "second")?;
    wait_running(kueue, kubectl, "kueue-cpu", "second")?;
    kueue.check_running()
}

/// Source document 003's Kueue Configuration (section 3.2), verbatim.
const SEED_CONFIG: &str = "apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
integrations:
  frameworks:
  - batch/job
resources:
  transformations:
  - input: nvidia.com/gpumem
    strategy: Replace
    outputs:
      nvidia.com/total-gpumem: 1
    multiplyBy: nvidia.com/gpu
  - input: nvidia.com/gpucores
    strategy: Replace
    outputs:
      nvidia.com/total-gpucores: 1
    multiplyBy: nvidia.com/gpu
";

/// Source document 003's queues (section 3.3), verbatim.
const SEED_QUEUES: &str = "apiVersion: v1
kind: Namespace
metadata:
  name: hami-kueue-demo
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: hami-t4
spec:
  nodeLabels:
    nvidia.com/gpu.product: Tesla-T4
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: hami-cq
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources:
    - nvidia.com/gpu
    - nvidia.com/total-gpumem
    - nvidia.com/total-gpucores
    flavors:
    - name: hami-t4
      resources:
      - name: nvidia.com/gpu
        nominalQuota: 2
      - name: nvidia.com/total-gpumem
        nominalQuota: 8192
      - name: nvidia.com/total-gpucores
        nominalQuota: 100
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  namespace: hami-kueue-demo
  name: hami-queue
spec:
  clusterQueue: hami-cq
";

/// Source document 003's Job (section 3.4), verbatim; the other two are the same under their names.
const SEED_JOB: &str = r#"apiVersion: batch/v1
kind: Job
metadata:
  namespace: hami-kueue-demo
  name: hami-kueue-running-a
  labels:
    kueue.x-k8s.io/queue-name: hami-queue
spec:
  suspend: true
  parallelism: 1
  completions: 1
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: cuda
        image: nvcr.io/nvidia/cuda:12.6.0-base-ubuntu24.04
        command: ["bash", "-c", "nvidia-smi && echo HAMI_KUEUE_RUNNING_A && sleep 3600"]
        resources:
          limits:
            nvidia.com/gpu: 1
            nvidia.com/gpumem: 4096
            nvidia.com/gpucores: 50
"#;

const DEMO: &str = "hami-kueue-demo";

fn seed_job(name: &str) -> String {
    let marker = name.to_uppercase().replace('-', "_");
    SEED_JOB.replace("hami-kueue-running-a", name).replace("HAMI_KUEUE_RUNNING_A", &marker)
}

/// The vgpu-dra webhook, registered by URL, once the API server calls it.
fn start_vgpu_webhook(plane: &ControlPlane) -> anyhow::Result<ManagedProcess> {
    plane.kubectl().run(&["create", "namespace", "vgpu-dra"])?;
    let port = free_port()?;
    let metrics = format!("--metrics-address=127.0.0.1:{}", free_port()?);
    let mut webhook = webhook::spawn(plane, "vgpu-dra-webhook", (port, port), "vgpu-dra", &[metrics])?;
    let probe = "apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: default}\nspec:\n  containers:\n  - name: c\n    image: registry.invalid/none\n    resources: {limits: {nvidia.com/gpu: 1}}\n";
    webhook::wait_called(plane, &mut webhook, probe)?;
    Ok(webhook)
}

/// One Job's share of the card: its pod, the pod's claim (name, UID) and the CDI device prepared.
struct Share {
    pod: Value,
    claim: String,
    uid: String,
}

/// Waits for `job`'s pod in `namespace`, checks that it asks through a claim template (made by
/// the vgpu-dra webhook, or written so) and that Kueue placed it on the flavor's nodes, waits for
/// its claim's allocation and prepares it as the kubelet would, checking HAMi-core's limits in
/// the CDI spec.
fn run_on_card(
    plane: &mut ControlPlane,
    kueue: &mut Kueue,
    kubelet: &mut vgpu_dra_integration::KubeletSim,
    dirs: &Dirs,
    (namespace, job): (&str, &str),
) -> anyhow::Result<Share> {
    let kubectl = plane.kubectl().clone();
    let pod = wait_running(kueue, &kubectl, namespace, job)?;
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let spec = &pod["spec"];
    assert!(spec["resourceClaims"][0]["resourceClaimTemplateName"].is_string(), "not converted: {pod:#}");
    let limits = &spec["containers"][0]["resources"]["limits"];
    assert!(limits.get("nvidia.com/gpu").is_none() && limits.get("nvidia.com/gpumem").is_none(), "{pod:#}");
    assert_eq!(spec["nodeSelector"]["nvidia.com/gpu.product"], "Tesla-T4", "Kueue's flavor not applied: {pod:#}");
    let claim = eventually(&format!("the claim of pod {name}"), Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceclaims", "-n", namespace])?;
        Ok(list["items"].as_array().into_iter().flatten().find(|c| owned_by(c, "Pod", &name)).cloned())
    })?;
    let claim_name = claim["metadata"]["name"].as_str().unwrap().to_owned();
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_owned();
    let result = plane.wait_allocated(namespace, &claim_name, Duration::from_secs(60))?;
    assert_eq!(result["device"], "hami-gpu-0", "{result}");
    assert_eq!(result["consumedCapacity"]["cores"], "50", "{result}");
    assert!(matches!(result["consumedCapacity"]["memory"].as_str(), Some("4Gi" | "4294967296")), "{result}");
    let reply = kubelet.prepare(&[(namespace, &claim_name, &uid)])?;
    let r = claim_response(&reply, &uid);
    anyhow::ensure!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    let id = r["devices"][0]["cdi_device_ids"][0].as_str().unwrap().to_owned();
    let report = cdi_check(&dirs.cdi, &[&id]);
    let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for want in ["CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT=50"] {
        assert!(env.contains(&want), "{want} missing from {env:?} ({job})");
    }
    Ok(Share { pod, claim: claim_name, uid })
}

fn assert_counted(workload: &Value) {
    let usage = &workload["status"]["admission"]["podSetAssignments"][0]["resourceUsage"];
    assert_eq!(usage["nvidia.com/gpu"], "1", "{workload:#}");
    assert_eq!(usage["nvidia.com/total-gpumem"], "4096", "{workload:#}");
    assert_eq!(usage["nvidia.com/total-gpucores"], "50", "{workload:#}");
    assert!(usage.get("nvidia.com/gpumem").is_none(), "{workload:#}");
}

/// Deletes Job `job` that runs on `share`; as the kubelet would, the node releases its claim (the
/// CDI spec is removed) and the pod goes (no kubelet runs here to finish it), and with it the claim.
fn delete_job(
    kubectl: &Kubectl,
    kubelet: &mut vgpu_dra_integration::KubeletSim,
    dirs: &Dirs,
    (namespace, job): (&str, &str),
    share: &Share,
) -> anyhow::Result<()> {
    kubectl.run(&["delete", "job", job, "-n", namespace])?;
    kubelet.unprepare(&[(namespace, &share.claim, &share.uid)])?;
    let spec_left =
        std::fs::read_dir(&dirs.cdi)?.filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().contains(&share.uid));
    assert!(!spec_left, "the CDI spec of {} was not removed", share.claim);
    let pod = share.pod["metadata"]["name"].as_str().unwrap();
    kubectl.run(&["delete", "pod", pod, "-n", namespace, "--grace-period=0", "--force", "--ignore-not-found"])?;
    eventually("the deleted Job's claim gone with its pod", Duration::from_secs(60), || {
        Ok(kubectl.run(&["get", "resourceclaim", &share.claim, "-n", namespace, "-o", "name"]).is_err().then_some(()))
    })
}

#[test]
fn source_document_003_hami_jobs_under_kueue_quota() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = seed_scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn seed_scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let mut node = T4Node::start(plane)?;
    let mut webhook = start_vgpu_webhook(plane)?;
    let mut kueue = Kueue::start(plane, SEED_CONFIG)?;
    let outcome = seed_steps(plane, &mut kueue, &mut node.kubelet, &node.dirs);
    with_manager_log(&mut kueue, outcome)?;
    webhook.check_running()?;
    node.driver.check_running()
}

fn seed_steps(
    plane: &mut ControlPlane,
    kueue: &mut Kueue,
    kubelet: &mut vgpu_dra_integration::KubeletSim,
    dirs: &Dirs,
) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    kubectl.apply(SEED_QUEUES)?;

    // Two Jobs admitted in turn, each counted 1 / 4096 / 50 and running on its share of the T4.
    let mut shares = Vec::new();
    for job in ["hami-kueue-running-a", "hami-kueue-running-b"] {
        kubectl.run_with_input(&["apply", "-f", "-"], Some(&seed_job(job)))?;
        let workload = wait_admitted(kueue, &kubectl, DEMO, job)?;
        assert_eq!(workload["status"]["admission"]["clusterQueue"], "hami-cq", "{workload:#}");
        assert_counted(&workload);
        shares.push(run_on_card(plane, kueue, kubelet, dirs, (DEMO, job))?);
    }

    // The third waits: suspended, no pod, Kueue's quota message; the queue is full.
    let pending = "hami-kueue-pending-c";
    kubectl.run_with_input(&["apply", "-f", "-"], Some(&seed_job(pending)))?;
    let message = wait_held(kueue, &kubectl, DEMO, pending)?;
    assert!(message.contains("insufficient unused quota for nvidia.com/gpu in flavor hami-t4, 1 more needed"), "{message}");
    assert!(
        message.contains("insufficient unused quota for nvidia.com/total-gpucores in flavor hami-t4, 50 more needed"),
        "{message}"
    );
    assert!(suspended(&kubectl, DEMO, pending)?);
    assert!(pods_of(&kubectl, DEMO, pending)?.is_empty());
    let requests = &workload_of(&kubectl, DEMO, pending)?.unwrap()["status"]["resourceRequests"][0]["resources"];
    assert_eq!(requests["nvidia.com/total-gpumem"], "4096", "{requests}");
    let cq = eventually("hami-cq's usage", Duration::from_secs(30), || {
        let cq = kubectl.get_json(&["clusterqueue", "hami-cq"])?;
        Ok((cq["status"]["admittedWorkloads"] == 2 && cq["status"]["pendingWorkloads"] == 1).then_some(cq))
    })?;
    let usage = &cq["status"]["flavorsUsage"][0];
    assert_eq!(usage["name"], "hami-t4", "{cq:#}");
    let total =
        |name: &str| usage["resources"].as_array().into_iter().flatten().find(|r| r["name"] == name).map(|r| r["total"].clone());
    assert_eq!(total("nvidia.com/gpu"), Some("2".into()), "{cq:#}");
    assert_eq!(total("nvidia.com/total-gpumem"), Some("8192".into()), "{cq:#}");
    assert_eq!(total("nvidia.com/total-gpucores"), Some("100".into()), "{cq:#}");

    // Deleting the first frees its quota; the third is admitted and runs on the freed share.
    delete_job(&kubectl, kubelet, dirs, (DEMO, "hami-kueue-running-a"), &shares.remove(0))?;
    let workload = wait_admitted(kueue, &kubectl, DEMO, pending)?;
    assert_counted(&workload);
    run_on_card(plane, kueue, kubelet, dirs, (DEMO, pending))?;
    kueue.check_running()
}

/// Kueue v0.19's DRA-native quota: the memory a claim template asks of a hami-core-gpu card,
/// counted against the queue (`sources[].capacity`, alpha behind
/// `KueueDRAIntegrationConsumableCapacity`).
const DRA_CONFIG: &str = r#"apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
featureGates:
  KueueDRAIntegrationConsumableCapacity: true
integrations:
  frameworks:
  - batch/job
resources:
  deviceClassMappings:
  - name: hami.io/gpu-memory
    deviceClassNames:
    - hami-core-gpu.project-hami.io
    sources:
    - capacity:
        name: memory
        driver: hami-core-gpu.project-hami.io
        deviceSelector:
          cel:
            expression: device.driver == "hami-core-gpu.project-hami.io"
"#;

/// A second mapping of the same DeviceClass, for its `cores`: what a quota on both would need.
const DRA_CORES_MAPPING: &str = r#"  - name: hami.io/gpu-cores
    deviceClassNames:
    - hami-core-gpu.project-hami.io
    sources:
    - capacity:
        name: cores
        driver: hami-core-gpu.project-hami.io
        deviceSelector:
          cel:
            expression: device.driver == "hami-core-gpu.project-hami.io"
"#;

const DRA_DEMO: &str = "dra-kueue-demo";

/// 8Gi of T4 memory for the namespace's Jobs, and the claim template they use (4Gi, 50 cores).
const DRA_QUEUES: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: dra-kueue-demo
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: hami-t4
spec:
  nodeLabels:
    nvidia.com/gpu.product: Tesla-T4
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: dra-memory-cq
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [hami.io/gpu-memory]
    flavors:
    - name: hami-t4
      resources:
      - name: hami.io/gpu-memory
        nominalQuota: 8Gi
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: dra-queue
  namespace: dra-kueue-demo
spec:
  clusterQueue: dra-memory-cq
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-4g-50
  namespace: dra-kueue-demo
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: hami-core-gpu.project-hami.io
          capacity:
            requests:
              memory: 4Gi
              cores: "50"
"#;

/// A Job whose pod asks for its share of a card through the claim template.
fn dra_job(name: &str) -> String {
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: dra-kueue-demo
  labels:
    kueue.x-k8s.io/queue-name: dra-queue
spec:
  template:
    spec:
      restartPolicy: Never
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: gpu-4g-50
      containers:
      - name: cuda
        image: nvcr.io/nvidia/cuda:12.6.0-base-ubuntu24.04
        command: ["bash", "-c", "nvidia-smi && sleep 3600"]
        resources:
          claims:
          - name: gpu
"#
    )
}

#[test]
fn kueue_v0_19_counts_claim_template_memory_against_a_queue() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = dra_scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn dra_scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let mut node = T4Node::start(plane)?;

    // One dimension per DeviceClass: v0.19.2 refuses a second capacity mapping (cores) of the
    // class whose memory is already mapped; only counter sources may share a class.
    let both = format!("{DRA_CONFIG}{DRA_CORES_MAPPING}");
    assert_eq!(KueueVersion::for_configuration(&both), KueueVersion::V019);
    let refused = Kueue::start_version(plane, &both, KueueVersion::V019).err().expect("a cores mapping beside memory refused");
    let refused = format!("{refused:#}");
    assert!(
        refused.contains("device class already mapped to resource hami.io/gpu-memory")
            && refused.contains("deviceClassMappings[1]"),
        "{refused}"
    );

    let mut kueue = Kueue::start_version(plane, DRA_CONFIG, KueueVersion::for_configuration(DRA_CONFIG))?;
    let outcome = dra_steps(plane, &mut kueue, &mut node.kubelet, &node.dirs);
    with_manager_log(&mut kueue, outcome)?;
    node.driver.check_running()
}

fn dra_steps(
    plane: &mut ControlPlane,
    kueue: &mut Kueue,
    kubelet: &mut vgpu_dra_integration::KubeletSim,
    dirs: &Dirs,
) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    kubectl.apply(DRA_QUEUES)?;

    // Two Jobs admitted in turn, each counted by the 4Gi its claim asks (not by its one device,
    // and not by its cores), then allocated and prepared on the card.
    let mut shares = Vec::new();
    for job in ["dra-running-a", "dra-running-b"] {
        kubectl.run_with_input(&["apply", "-f", "-"], Some(&dra_job(job)))?;
        let workload = wait_admitted(kueue, &kubectl, DRA_DEMO, job)?;
        assert_eq!(workload["status"]["admission"]["clusterQueue"], "dra-memory-cq", "{workload:#}");
        assert_memory_counted(&workload);
        shares.push(run_on_card(plane, kueue, kubelet, dirs, (DRA_DEMO, job))?);
    }

    // The third waits for quota: suspended, no pod, Kueue's message in binary units.
    let pending = "dra-pending-c";
    kubectl.run_with_input(&["apply", "-f", "-"], Some(&dra_job(pending)))?;
    let message = wait_held(kueue, &kubectl, DRA_DEMO, pending)?;
    assert!(message.contains("insufficient unused quota for hami.io/gpu-memory in flavor hami-t4, 4Gi more needed"), "{message}");
    assert!(suspended(&kubectl, DRA_DEMO, pending)?);
    assert!(pods_of(&kubectl, DRA_DEMO, pending)?.is_empty());
    let cq = eventually("dra-memory-cq's usage", Duration::from_secs(30), || {
        let cq = kubectl.get_json(&["clusterqueue", "dra-memory-cq"])?;
        Ok((cq["status"]["admittedWorkloads"] == 2 && cq["status"]["pendingWorkloads"] == 1).then_some(cq))
    })?;
    let usage = &cq["status"]["flavorsUsage"][0];
    assert_eq!(usage["name"], "hami-t4", "{cq:#}");
    assert_eq!(usage["resources"][0]["name"], "hami.io/gpu-memory", "{cq:#}");
    assert_eq!(usage["resources"][0]["total"], "8Gi", "{cq:#}");

    // Deleting one frees 4Gi: the third is admitted and runs on the freed share.
    delete_job(&kubectl, kubelet, dirs, (DRA_DEMO, "dra-running-a"), &shares.remove(0))?;
    let workload = wait_admitted(kueue, &kubectl, DRA_DEMO, pending)?;
    assert_memory_counted(&workload);
    run_on_card(plane, kueue, kubelet, dirs, (DRA_DEMO, pending))?;
    kueue.check_running()
}

fn assert_memory_counted(workload: &Value) {
    let usage = &workload["status"]["admission"]["podSetAssignments"][0]["resourceUsage"];
    assert_eq!(usage["hami.io/gpu-memory"], "4Gi", "{workload:#}");
    assert_eq!(usage.as_object().map(|u| u.len()), Some(1), "only the memory is counted: {workload:#}");
    let flavors = &workload["status"]["admission"]["podSetAssignments"][0]["flavors"];
    assert_eq!(flavors["hami.io/gpu-memory"], "hami-t4", "{workload:#}");
}
