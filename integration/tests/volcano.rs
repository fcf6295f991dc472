//! Volcano's own scheduler, controller manager and admission webhooks on the test bed. First Volcano
//! by itself: a gang Job of CPU pods gets its PodGroup and both pods bound; a Job whose task
//! template references a ResourceClaimTemplate of the vgpu-dra DeviceClass gets its claim allocated
//! by vc-scheduler (device, consumed capacity) and its pod bound. Then source document 000 end to
//! end on one 12 GiB RTX 3060: its pod and Volcano Jobs (`volcano.sh/vgpu-*` resources) converted by
//! the vgpu-dra webhook, their claims allocated by vc-scheduler and prepared by the node driver with
//! HAMi-core's limits; the gang too big for the card, and the gang over its queue's capability
//! (2 shares / 6000 MiB / 60 cores, in Volcano's DRA keys), both held whole as 000 shows, because
//! the webhook gives each converted pod a cpu request Volcano counts: see [`seed_steps`].
//!
//! On the node, a gang stays whole whatever moment of a prepare the driver is killed at, and a
//! gang the node refuses half of (a configuration shrank) leaves nothing counted once it is given
//! up.
//!
//! Volcano is built by `integration/k8s/build.sh`, with volcano.sh/apis from the Go module proxy
//! or, where the proxy does not serve it, from the workspace's checked copy (docs/volcano.md);
//! a machine with neither fails these tests with that reason. The one test that needs no
//! Volcano checks that docs/volcano.md shows the Queue and Jobs these tests run.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use vgpu_dra_integration::volcano::{Volcano, VolcanoOptions};
use vgpu_dra_integration::{ControlPlane, Kubectl, KubeletSim, ManagedProcess, eventually, free_port, start_driver};

mod common;

use common::seed_000::{self, DEMO};
use common::webhook::{self, DEVICE_CLASS};
use common::{
    DRIVER, Dirs, NODE, PREPARE_FAIL_POINTS, cdi_check, claim_holder, claim_response, hand_allocated_claim, kubelet, wait_dead,
};

/// Source document 000's card.
const RTX_3060: &str = "--mock-gpus=1xNVIDIA GeForce RTX 3060:12Gi";

/// The driver for `NODE` with one 12 GiB RTX 3060, named `name`, with `extra` arguments.
fn rtx_3060_driver(plane: &ControlPlane, dirs: &Dirs, name: &str, extra: &[&str]) -> ManagedProcess {
    let mut args: Vec<String> = dirs.args().into_iter().filter(|a| !a.starts_with("--mock-gpus")).collect();
    args.push(RTX_3060.to_owned());
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    start_driver(plane, name, NODE, &refs).unwrap()
}

/// What every test here runs on: a control plane with `NODE` and HAMi's DeviceClass, the driver
/// with 000's card, Volcano, and, for 000's workloads, the vgpu-dra webhook and 000's namespace.
/// Fields in this order so that the control plane is the last to go.
struct Bed {
    plane: ControlPlane,
    kubectl: Kubectl,
    dirs: Dirs,
    driver: ManagedProcess,
    webhook: Option<ManagedProcess>,
    volcano: Volcano,
}

impl Bed {
    /// Starts it; `seed` adds the webhook and 000's namespace.
    fn start(seed: bool) -> Self {
        let plane = ControlPlane::start().expect("control plane");
        let kubectl = plane.kubectl().clone();
        plane.create_node(NODE).unwrap();
        kubectl.apply(DEVICE_CLASS).unwrap();
        let dirs = Dirs::new(plane.dir());
        let driver = rtx_3060_driver(&plane, &dirs, "driver", &[]);
        let webhook = seed.then(|| start_vgpu_webhook(&plane).unwrap());
        let volcano = Volcano::start(&plane, &VolcanoOptions::default()).expect("volcano");
        if seed {
            kubectl.run(&["create", "namespace", DEMO]).unwrap();
        }
        Self { plane, kubectl, dirs, driver, webhook, volcano }
    }
}

/// The PodGroup Volcano's controller made for Job `job`.
fn podgroup_of(kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<Option<Value>> {
    let list = kubectl.get_json(&["podgroups.scheduling.volcano.sh", "-n", namespace])?;
    Ok(list["items"].as_array().into_iter().flatten().find(|pg| owned_by(pg, "Job", job)).cloned())
}

fn owned_by(object: &Value, kind: &str, name: &str) -> bool {
    object["metadata"]["ownerReferences"].as_array().is_some_and(|o| o.iter().any(|r| r["kind"] == kind && r["name"] == name))
}

/// The pods Volcano's controller made for Job `job`, by name.
fn pods_of(kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<Vec<Value>> {
    let list = kubectl.get_json(&["pods", "-n", namespace, "-l", &format!("volcano.sh/job-name={job}")])?;
    let mut pods = list["items"].as_array().cloned().unwrap_or_default();
    pods.sort_by(|a, b| a["metadata"]["name"].as_str().cmp(&b["metadata"]["name"].as_str()));
    Ok(pods)
}

/// Waits until `count` pods of Job `job` are bound to `NODE` and returns them.
fn wait_bound(
    volcano: &mut Volcano,
    kubectl: &Kubectl,
    (namespace, job): (&str, &str),
    count: usize,
) -> anyhow::Result<Vec<Value>> {
    eventually(&format!("{count} pods of Job {namespace}/{job} bound"), Duration::from_secs(90), || {
        volcano.check_running()?;
        let pods = pods_of(kubectl, namespace, job)?;
        let bound = pods.iter().filter(|p| p["spec"]["nodeName"] == NODE).count();
        Ok((pods.len() == count && bound == count).then_some(pods))
    })
}

/// The name of the claim made for `pod`'s first pod claim (from its template).
fn claim_name_of(kubectl: &Kubectl, pod: &Value) -> anyhow::Result<String> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap();
    let name = pod["metadata"]["name"].as_str().unwrap();
    eventually(&format!("the claim of pod {namespace}/{name}"), Duration::from_secs(30), || {
        let pod = kubectl.get_json(&["pod", name, "-n", namespace])?;
        Ok(pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().map(str::to_owned))
    })
}

/// A claim's allocation results, if it is allocated.
fn allocation(kubectl: &Kubectl, namespace: &str, claim: &str) -> anyhow::Result<Option<Value>> {
    let claim = kubectl.get_json(&["resourceclaim", claim, "-n", namespace])?;
    Ok(claim["status"]["allocation"]["devices"]["results"].as_array().map(|r| Value::Array(r.clone())))
}

/// The one device result of `claim` once allocated; checks that it is this driver's card on `NODE`.
fn wait_allocated(volcano: &mut Volcano, kubectl: &Kubectl, namespace: &str, claim: &str) -> anyhow::Result<Value> {
    let results = eventually(&format!("claim {namespace}/{claim} allocated"), Duration::from_secs(60), || {
        volcano.check_running()?;
        allocation(kubectl, namespace, claim)
    })?;
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 1, "{results:?}");
    let result = results[0].clone();
    assert_eq!(result["driver"], DRIVER, "{result}");
    assert_eq!(result["pool"], NODE, "{result}");
    assert_eq!(result["device"], "hami-gpu-0", "{result}");
    Ok(result)
}

/// The amount of a quantity in bytes (the API server may store `3000Mi` as `3145728k`).
fn bytes(quantity: &Value) -> u64 {
    vgpu_scheduling::Quantity::parse(quantity.as_str().unwrap()).unwrap().as_u64_exact().unwrap()
}

fn assert_consumed(result: &Value, memory_mib: u64, cores: &str) {
    let consumed = &result["consumedCapacity"];
    assert_eq!(bytes(&consumed["memory"]), memory_mib << 20, "{result}");
    assert_eq!(consumed["cores"], cores, "{result}");
    assert_eq!(consumed["shares"], "1", "{result}");
}

/// Prepares `claim` as the kubelet would and checks HAMi-core's limits in its CDI spec; returns
/// the claim's UID.
fn prepare(
    kubelet: &mut KubeletSim,
    kubectl: &Kubectl,
    dirs: &Dirs,
    namespace: &str,
    claim: &str,
    limits: &[&str],
) -> anyhow::Result<String> {
    let uid = kubectl.run(&["get", "resourceclaim", claim, "-n", namespace, "-o", "jsonpath={.metadata.uid}"])?;
    let reply = kubelet.prepare(&[(namespace, claim, &uid)])?;
    let r = claim_response(&reply, &uid);
    anyhow::ensure!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    let id = r["devices"][0]["cdi_device_ids"][0].as_str().unwrap().to_owned();
    let report = cdi_check(&dirs.cdi, &[&id]);
    let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for want in limits {
        assert!(env.contains(want), "{want} missing from {env:?} ({namespace}/{claim})");
    }
    Ok(uid)
}

/// The `Unschedulable` condition of Job `job`'s PodGroup, once vc-scheduler has set it, with the
/// PodGroup.
fn wait_unschedulable(volcano: &mut Volcano, kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<(Value, String)> {
    eventually(&format!("Job {namespace}/{job}'s PodGroup unschedulable"), Duration::from_secs(90), || {
        volcano.check_running()?;
        let Some(pg) = podgroup_of(kubectl, namespace, job)? else { return Ok(None) };
        let message = pg["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Unschedulable" && c["status"] == "True")
            .and_then(|c| c["message"].as_str())
            .map(str::to_owned);
        Ok(message.map(|m| (pg, m)))
    })
}

/// The messages of the Warning events on Volcano Job `job`.
fn job_warnings(kubectl: &Kubectl, namespace: &str, job: &str) -> anyhow::Result<Vec<String>> {
    let selector = format!("involvedObject.kind=Job,involvedObject.name={job},type=Warning");
    let list = kubectl.get_json(&["events", "-n", namespace, "--field-selector", &selector])?;
    Ok(list["items"].as_array().into_iter().flatten().filter_map(|e| e["message"].as_str().map(str::to_owned)).collect())
}

/// Deletes Volcano Job `job`: its prepared claims are released on the node, its pods go (no kubelet
/// runs here to finish them) and their claims with them.
fn delete_job(
    kubectl: &Kubectl,
    kubelet: &mut KubeletSim,
    (namespace, job): (&str, &str),
    prepared: &[(String, String)],
) -> anyhow::Result<()> {
    let pods = pods_of(kubectl, namespace, job)?;
    let claims: Vec<String> = pods
        .iter()
        .filter_map(|p| p["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().map(str::to_owned))
        .collect();
    kubectl.run(&["delete", "jobs.batch.volcano.sh", job, "-n", namespace, "--wait=false"])?;
    for (claim, uid) in prepared {
        kubelet.unprepare(&[(namespace, claim, uid)])?;
    }
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap();
        kubectl.run(&["delete", "pod", name, "-n", namespace, "--grace-period=0", "--force", "--ignore-not-found"])?;
    }
    eventually(&format!("Job {namespace}/{job}'s pods and claims gone"), Duration::from_secs(60), || {
        let left = kubectl.get_json(&["resourceclaims", "-n", namespace])?;
        let claim_left = left["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["metadata"]["name"].as_str().is_some_and(|n| claims.iter().any(|m| m == n)));
        Ok((pods_of(kubectl, namespace, job)?.is_empty() && !claim_left).then_some(()))
    })
}

const CPU_GANG: &str = "apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: cpu-gang
  namespace: default
spec:
  minAvailable: 2
  schedulerName: volcano
  tasks:
  - name: worker
    replicas: 2
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: work
          image: registry.invalid/none
          resources:
            requests:
              cpu: 100m
";

const DRA_JOB: &str = r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-3000mi-30
  namespace: default
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: hami-core-gpu.project-hami.io
          capacity:
            requests:
              memory: 3000Mi
              cores: "30"
---
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: dra-job
  namespace: default
spec:
  minAvailable: 1
  schedulerName: volcano
  tasks:
  - name: worker
    replicas: 1
    template:
      spec:
        restartPolicy: Never
        resourceClaims:
        - name: gpu
          resourceClaimTemplateName: gpu-3000mi-30
        containers:
        - name: cuda
          image: registry.invalid/none
          resources:
            claims:
            - name: gpu
"#;

/// Volcano by itself: a gang of CPU pods, then a Job whose pods ask the vgpu-dra DeviceClass
/// through a claim template.
#[test]
fn volcano_binds_gangs_and_allocates_claims() {
    let Bed { plane: _plane, kubectl, driver: mut drv, mut volcano, .. } = Bed::start(false);

    // The gang: one PodGroup of minMember 2 in the default queue, both pods bound by vc-scheduler.
    kubectl.run_with_input(&["create", "-f", "-"], Some(CPU_GANG)).unwrap();
    let pods = wait_bound(&mut volcano, &kubectl, ("default", "cpu-gang"), 2).unwrap();
    for pod in &pods {
        assert_eq!(pod["spec"]["schedulerName"], "volcano", "{pod:#}");
    }
    let pg = podgroup_of(&kubectl, "default", "cpu-gang").unwrap().expect("a PodGroup");
    assert_eq!(pg["spec"]["minMember"], 2, "{pg:#}");
    assert_eq!(pg["spec"]["queue"], "default", "{pg:#}");

    // The claim of the DRA Job's pod: allocated by vc-scheduler on the card, 3000Mi / 30 cores of
    // it consumed, and the pod bound.
    kubectl.apply(DRA_JOB).unwrap();
    let pods = wait_bound(&mut volcano, &kubectl, ("default", "dra-job"), 1).unwrap();
    let claim = claim_name_of(&kubectl, &pods[0]).unwrap();
    let result = wait_allocated(&mut volcano, &kubectl, "default", &claim).unwrap();
    assert_consumed(&result, 3000, "30");
    let claim = kubectl.get_json(&["resourceclaim", &claim, "-n", "default"]).unwrap();
    let reserved = &claim["status"]["reservedFor"];
    assert_eq!(reserved[0]["name"], pods[0]["metadata"]["name"], "{claim:#}");
    volcano.check_running().unwrap();
    drv.check_running().unwrap();
}

/// The vgpu-dra webhook with source document 001's device configuration (Volcano's resource
/// names), once the API server calls it.
fn start_vgpu_webhook(plane: &ControlPlane) -> anyhow::Result<ManagedProcess> {
    plane.kubectl().run(&["create", "namespace", "vgpu-dra"])?;
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduling/testdata/volcano-device-config.yaml");
    let port = free_port()?;
    let flags = [format!("--metrics-address=127.0.0.1:{}", free_port()?), format!("--config={}", config.display())];
    let mut webhook = webhook::spawn(plane, "vgpu-dra-webhook", (port, port), "vgpu-dra", &flags)?;
    let probe = "apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: default}\nspec:\n  containers:\n  - name: c\n    image: registry.invalid/none\n    resources: {limits: {volcano.sh/vgpu-number: 1}}\n";
    webhook::wait_called(plane, &mut webhook, probe)?;
    Ok(webhook)
}

#[test]
fn source_document_000_volcano_gang_and_queue_on_one_shared_card() {
    let Bed { mut plane, dirs, driver: mut drv, webhook, mut volcano, .. } = Bed::start(true);
    let mut kubelet = kubelet(&dirs);
    seed_steps(&mut plane, &mut volcano, &mut kubelet, &dirs).unwrap();
    webhook.unwrap().check_running().unwrap();
    drv.check_running().unwrap();
}

/// Item 3 of the Volcano issue: Volcano binds 000's gang of 2 x 3000 MiB as a whole, and on the
/// node the gang stays whole whatever moment of a prepare the driver is killed at (each of its
/// fail points, SIGKILL). The first worker is prepared, the driver dies preparing the second; at
/// the crash no spec of the second is on disk without its record (so a driver writing the spec
/// first fails here); after the restart, before the kubelet retries, the first is prepared (record
/// and spec) and the second is whole or absent: a record with its spec or neither, no temp file. After the retry both
/// run with 000's limits and the card's ledger counts both: a hand-allocated 6500 MiB claim, which
/// fits beside one worker (12 GiB card), is refused.
#[test]
fn a_gang_stays_whole_on_the_node_when_the_driver_dies_preparing_it() {
    let Bed { plane, kubectl, dirs, driver: mut drv, webhook, mut volcano } = Bed::start(true);
    kubectl.run_with_input(&["create", "-f", "-"], Some(seed_000::GANG)).unwrap();
    let job = (DEMO, "vcjob-vgpu-gang");
    let pods = wait_bound(&mut volcano, &kubectl, job, 2).unwrap();
    let workers: Vec<(String, String)> = pods
        .iter()
        .map(|pod| {
            let claim = claim_name_of(&kubectl, pod).unwrap();
            assert_consumed(&wait_allocated(&mut volcano, &kubectl, DEMO, &claim).unwrap(), 3000, "30");
            let uid = kubectl.run(&["get", "resourceclaim", &claim, "-n", DEMO, "-o", "jsonpath={.metadata.uid}"]).unwrap();
            (claim, uid)
        })
        .collect();
    // Fits beside one worker of the 12 GiB card, not beside both.
    let (probe, probe_status) = hand_allocated_claim(DEMO, "probe", 1, "6500Mi", &claim_holder(&kubectl, DEMO));
    kubectl.run_with_input(&["create", "-f", "-"], Some(&probe)).unwrap();
    kubectl.run_with_input(&["replace", "--subresource=status", "-f", "-"], Some(&probe_status)).unwrap();
    let probe_uid = kubectl.run(&["get", "resourceclaim", "probe", "-n", DEMO, "-o", "jsonpath={.metadata.uid}"]).unwrap();
    let limits = ["CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "CUDA_DEVICE_SM_LIMIT=30"];
    let [(first, first_uid), (second, second_uid)] = &workers[..] else { panic!("two workers: {workers:?}") };

    for point in PREPARE_FAIL_POINTS {
        let mut k = kubelet(&dirs);
        prepare(&mut k, &kubectl, &dirs, DEMO, first, &limits).unwrap();
        drop(k);
        drv.stop();
        let mut dying = rtx_3060_driver(&plane, &dirs, &format!("driver-{point}"), &[&format!("--fail-point={point}")]);
        let mut k = kubelet(&dirs);
        let reply = k.prepare(&[(DEMO, second.as_str(), second_uid.as_str())]).unwrap();
        let r = claim_response(&reply, second_uid);
        assert!(
            reply.get("error").is_some() || r.get("error").is_some_and(|e| e != ""),
            "{point}: the driver should have died: {reply}"
        );
        wait_dead(&mut dying);
        drop(k);

        // At the moment of the crash, what a runtime could read (a spec) is never more than what
        // the node counts (a record): no spec of the second worker without its record.
        let recorded_at_crash = dirs.checkpointed().contains(second_uid);
        assert!(
            dirs.specs_for(second_uid) <= usize::from(recorded_at_crash),
            "{point}: the second worker's CDI spec is on disk without its record"
        );
        let crashed = dirs.temp_files();
        drv = rtx_3060_driver(&plane, &dirs, &format!("driver-after-{point}"), &[]);
        let mut k = kubelet(&dirs);
        let recorded = dirs.checkpointed();
        assert!(recorded.contains(first_uid) && dirs.specs_for(first_uid) == 1, "{point}: the first worker lost: {recorded:?}");
        let second_recorded = recorded.contains(second_uid);
        assert_eq!(dirs.specs_for(second_uid), usize::from(second_recorded), "{point}: the second worker half-prepared");
        let left: Vec<String> = dirs.temp_files().into_iter().filter(|f| crashed.contains(f)).collect();
        assert_eq!(left, Vec::<String>::new(), "{point}: a crash's temp files are removed at start");
        assert_eq!(dirs.written_temp_files(), Vec::<String>::new(), "{point}: nothing staged is left");

        // The kubelet retries the prepare it got no answer for, and repeats the other.
        prepare(&mut k, &kubectl, &dirs, DEMO, second, &limits).unwrap();
        prepare(&mut k, &kubectl, &dirs, DEMO, first, &limits).unwrap();
        let reply = k.prepare(&[(DEMO, "probe", probe_uid.as_str())]).unwrap();
        let error = claim_response(&reply, &probe_uid)["error"].as_str().unwrap_or_default().to_owned();
        assert!(error.contains("memory requested 6500Mi"), "{point}: both workers must count on the card: {reply}");

        for (claim, uid) in &workers {
            k.unprepare(&[(DEMO, claim.as_str(), uid.as_str())]).unwrap();
        }
        assert!(dirs.checkpointed().is_empty(), "{point}");
        assert_eq!(dirs.specs_for(first_uid) + dirs.specs_for(second_uid), 0, "{point}");
    }
    volcano.check_running().unwrap();
    webhook.unwrap().check_running().unwrap();
    drv.check_running().unwrap();
}

/// Item 3 of the Volcano issue, its second half: Volcano binds 000's gang of 2 x 3000 MiB whole,
/// then the node's configuration shrinks (deviceSplitCount 1: one share per card) before the
/// kubelet prepares it. The node prepares the first worker and refuses the second, by name and
/// reason; the card's ledger counts exactly the one prepared share (a one-share probe is refused).
/// Volcano gives the gang up (the Job is deleted, its pods and claims go with it) and no kubelet
/// unprepares anything: the driver releases the first worker's share by itself once its claim is
/// gone, and the probe fits. Nothing of either worker stays on disk.
#[test]
fn a_gang_half_refused_by_the_node_leaves_nothing_counted_once_given_up() {
    let Bed { plane, kubectl, dirs, driver: mut drv, webhook, mut volcano } = Bed::start(true);
    kubectl.run_with_input(&["create", "-f", "-"], Some(seed_000::GANG)).unwrap();
    let job = (DEMO, "vcjob-vgpu-gang");
    let pods = wait_bound(&mut volcano, &kubectl, job, 2).unwrap();
    let workers: Vec<(String, String)> = pods
        .iter()
        .map(|pod| {
            let claim = claim_name_of(&kubectl, pod).unwrap();
            assert_consumed(&wait_allocated(&mut volcano, &kubectl, DEMO, &claim).unwrap(), 3000, "30");
            let uid = kubectl.run(&["get", "resourceclaim", &claim, "-n", DEMO, "-o", "jsonpath={.metadata.uid}"]).unwrap();
            (claim, uid)
        })
        .collect();
    let [(first, first_uid), (second, second_uid)] = &workers[..] else { panic!("two workers: {workers:?}") };

    // The configuration shrinks under the bound gang; the restarted driver checks often and
    // releases a claim gone from the API after 2 s.
    drv.stop();
    let mut drv = rtx_3060_driver(
        &plane,
        &dirs,
        "driver-one-share",
        &["--device-split-count=1", "--deleted-claim-grace-seconds=2", "--state-check-ms=500"],
    );
    let mut k = kubelet(&dirs);
    prepare(&mut k, &kubectl, &dirs, DEMO, first, &["CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "CUDA_DEVICE_SM_LIMIT=30"]).unwrap();
    let reply = k.prepare(&[(DEMO, second.as_str(), second_uid.as_str())]).unwrap();
    let error = claim_response(&reply, second_uid)["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("shares requested 1, only 0 of 1 free"), "the second worker refused with the reason: {reply}");
    assert_eq!(dirs.checkpointed(), vec![first_uid.clone()], "only the first worker is recorded");
    assert_eq!((dirs.specs_for(first_uid), dirs.specs_for(second_uid)), (1, 0));

    // The ledger holds the first worker's one share: a one-share probe does not fit.
    let (probe, probe_status) = hand_allocated_claim(DEMO, "probe", 1, "1Gi", &claim_holder(&kubectl, DEMO));
    kubectl.run_with_input(&["create", "-f", "-"], Some(&probe)).unwrap();
    kubectl.run_with_input(&["replace", "--subresource=status", "-f", "-"], Some(&probe_status)).unwrap();
    let probe_uid = kubectl.run(&["get", "resourceclaim", "probe", "-n", DEMO, "-o", "jsonpath={.metadata.uid}"]).unwrap();
    let reply = k.prepare(&[(DEMO, "probe", probe_uid.as_str())]).unwrap();
    let error = claim_response(&reply, &probe_uid)["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("shares"), "the first worker's share counts: {reply}");

    // Volcano gives the gang up: the Job goes, its pods and their claims with it. The kubelet
    // unprepares nothing; the driver finds the first worker's claim gone and releases it.
    kubectl.run(&["delete", "jobs.batch.volcano.sh", job.1, "-n", DEMO, "--wait=false"]).unwrap();
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap();
        kubectl.run(&["delete", "pod", name, "-n", DEMO, "--grace-period=0", "--force", "--ignore-not-found"]).unwrap();
    }
    eventually("the gang's claims gone from the API", Duration::from_secs(60), || {
        let gone =
            workers.iter().all(|(claim, _)| kubectl.run(&["get", "resourceclaim", claim, "-n", DEMO, "-o", "name"]).is_err());
        Ok(gone.then_some(()))
    })
    .unwrap();
    // The release removes the record first, then the spec: done when both are gone.
    eventually("the first worker's share released by the driver", Duration::from_secs(60), || {
        drv.check_running()?;
        Ok((dirs.checkpointed().is_empty() && dirs.specs_for(first_uid) == 0).then_some(()))
    })
    .unwrap();
    assert_eq!((dirs.specs_for(first_uid), dirs.specs_for(second_uid)), (0, 0), "nothing of the gang left on disk");
    let reply = k.prepare(&[(DEMO, "probe", probe_uid.as_str())]).unwrap();
    let error = claim_response(&reply, &probe_uid)["error"].as_str().unwrap_or_default().to_owned();
    assert_eq!(error, "", "the card is free again: {reply}");
    volcano.check_running().unwrap();
    webhook.unwrap().check_running().unwrap();
    drv.check_running().unwrap();
}

/// A Job of 000 whose containers also request `cpu: 100m` of their own, under `name`.
fn with_cpu_request(job: &str, name: &str) -> String {
    let original = job.lines().find_map(|l| l.strip_prefix("  name: ")).unwrap();
    let with = job.replace(
        "          resources:\n            limits:\n",
        "          resources:\n            requests:\n              cpu: 100m\n            limits:\n",
    );
    assert_ne!(with, job);
    with.replace(&format!("  name: {original}\n"), &format!("  name: {name}\n"))
}

/// The cpu the vgpu-dra webhook adds to a converted pod of Volcano's scheduler that requests
/// nothing else (its default `--volcano-cpu-request`).
const WEBHOOK_CPU: &str = "1m";

/// Checks that every one of `pods` requests `cpu` in its one container.
fn assert_cpu_request(pods: &[Value], cpu: &str) {
    for pod in pods {
        assert_eq!(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"], cpu, "{pod:#}");
    }
}

/// The message Volcano gives for a gang of two held whole, as 000 quotes it.
const SEED_HELD: &str =
    "1/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable; Pending: 1 Schedulable, 1 Unschedulable";

/// Source document 000 in order, its pod and Jobs unchanged. The webhook moves their
/// `volcano.sh/vgpu-*` limits into claims, which Volcano does not count among a task's requests,
/// and adds `cpu: 1m` to each (they request nothing else): without it Volcano would take them for
/// best-effort tasks, which its `backfill` action binds one by one, holding no gang whole and
/// checking no queue capability (see docs/volcano.md). With it Volcano schedules them as 000 shows.
fn seed_steps(plane: &mut ControlPlane, volcano: &mut Volcano, kubelet: &mut KubeletSim, dirs: &Dirs) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let limits_3000 = ["CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "CUDA_DEVICE_SM_LIMIT=30"];

    // (a) The single pod: converted (with the webhook's cpu), put in a PodGroup of its own by
    // Volcano, its claim allocated by vc-scheduler (2000 MiB / 30 cores of the card), bound, and
    // prepared with the limits of 000.
    kubectl.run_with_input(&["create", "-f", "-"], Some(seed_000::SINGLE))?;
    let pod = eventually("the single pod bound", Duration::from_secs(90), || {
        volcano.check_running()?;
        let pod = kubectl.get_json(&["pod", "volcano-vgpu-single", "-n", DEMO])?;
        Ok((pod["spec"]["nodeName"] == NODE).then_some(pod))
    })?;
    let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
    assert!(limits.get("volcano.sh/vgpu-memory").is_none(), "not converted: {pod:#}");
    assert_cpu_request(std::slice::from_ref(&pod), WEBHOOK_CPU);
    let group = pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"].as_str().unwrap_or_default().to_owned();
    assert!(group.starts_with("podgroup-"), "{pod:#}");
    let claim = claim_name_of(&kubectl, &pod)?;
    let result = wait_allocated(volcano, &kubectl, DEMO, &claim)?;
    assert_consumed(&result, 2000, "30");
    let uid = prepare(kubelet, &kubectl, dirs, DEMO, &claim, &["CUDA_DEVICE_MEMORY_LIMIT_0=2000m", "CUDA_DEVICE_SM_LIMIT=30"])?;
    kubelet.unprepare(&[(DEMO, &claim, &uid)])?;
    kubectl.run(&["delete", "pod", "volcano-vgpu-single", "-n", DEMO, "--grace-period=0", "--force"])?;
    eventually("the single pod's claim gone with it", Duration::from_secs(60), || {
        Ok(kubectl.run(&["get", "resourceclaim", &claim, "-n", DEMO, "-o", "name"]).is_err().then_some(()))
    })?;

    // (b) The gang of 2 x 3000 MiB / 30: both workers bound to the one card, both claims allocated
    // on it, the PodGroup running, and each worker prepared with 3000m / 30.
    kubectl.run_with_input(&["create", "-f", "-"], Some(seed_000::GANG))?;
    let job = (DEMO, "vcjob-vgpu-gang");
    let prepared = run_gang(volcano, kubelet, &kubectl, dirs, job, 3000, &limits_3000)?;
    assert_cpu_request(&pods_of(&kubectl, DEMO, job.1)?, WEBHOOK_CPU);
    delete_job(&kubectl, kubelet, job, &prepared)?;

    // (c) The gang of 2 x 9000 MiB: held whole as in 000. The card could take one worker, but
    // neither is bound and no claim is allocated; Volcano gives 000's reason (adding the origin
    // of it) on the PodGroup and, as a PodGroupPending event, on the Job.
    kubectl.run_with_input(&["create", "-f", "-"], Some(seed_000::GANG_INSUFFICIENT))?;
    let name = "vcjob-vgpu-gang-insufficient";
    let job = (DEMO, name);
    let (pg, message) = wait_unschedulable(volcano, &kubectl, DEMO, name)?;
    assert!(message.starts_with(&format!("{SEED_HELD}. Origin reason is {name}-vgpu-worker-")), "{message}");
    assert!(message.ends_with(": 0/1 nodes are unavailable: 1 cannot allocate all claims."), "{message}");
    assert_eq!(pg["status"]["phase"], "Inqueue", "{pg:#}");
    assert_eq!(condition(&pg, "Unschedulable").unwrap()["reason"], "NotEnoughResources", "{pg:#}");
    assert_held(volcano, &kubectl, job)?;
    assert_cpu_request(&pods_of(&kubectl, DEMO, name)?, WEBHOOK_CPU);
    let event = format!("PodGroup {DEMO}:{name} unschedulable, reason: {message}");
    eventually("the Job's PodGroupPending event", Duration::from_secs(60), || {
        Ok(job_warnings(&kubectl, DEMO, name)?.contains(&event).then_some(()))
    })?;
    delete_job(&kubectl, kubelet, job, &[])?;

    // (d) 000's queue, capped at 2 shares / 6000 MiB / 60 cores in Volcano's DRA keys: the
    // 2 x 3000 MiB gang is admitted and runs, counted against the queue as in 000 (2 devices,
    // 6000 MiB, 60 cores)...
    kubectl.apply(seed_000::QUEUE)?;
    eventually("gpu-small-queue open", Duration::from_secs(60), || {
        let queue = kubectl.get_json(&["queues.scheduling.volcano.sh", "gpu-small-queue"])?;
        Ok((queue["status"]["state"] == "Open").then_some(()))
    })?;
    kubectl.run_with_input(&["create", "-f", "-"], Some(seed_000::QUEUE_FIT))?;
    let job = (DEMO, "vcjob-vgpu-queue-fit");
    let prepared = run_gang(volcano, kubelet, &kubectl, dirs, job, 3000, &limits_3000)?;
    wait_queue_allocated(&kubectl, "2", 6000, "60")?;
    delete_job(&kubectl, kubelet, job, &prepared)?;
    // ...and the 2 x 4500 MiB gang is held by the queue although the card alone (12 GiB, 100
    // cores) would take both workers, with 000's reason.
    kubectl.run_with_input(&["create", "-f", "-"], Some(seed_000::QUEUE_EXCEEDS))?;
    let name = "vcjob-vgpu-queue-exceeds";
    let job = (DEMO, name);
    let (pg, message) = wait_unschedulable(volcano, &kubectl, DEMO, name)?;
    assert_eq!(message, SEED_HELD, "{pg:#}");
    assert_eq!(pg["spec"]["queue"], "gpu-small-queue", "{pg:#}");
    assert_eq!(pg["status"]["phase"], "Inqueue", "{pg:#}");
    assert_held(volcano, &kubectl, job)?;
    let event = format!("PodGroup {DEMO}:{name} unschedulable, reason: {SEED_HELD}");
    eventually("the Job's PodGroupPending event", Duration::from_secs(60), || {
        Ok(job_warnings(&kubectl, DEMO, name)?.contains(&event).then_some(()))
    })?;
    delete_job(&kubectl, kubelet, job, &[])?;

    // The queue's other two caps hold gangs as well: 2 x 3000 MiB / 40 cores (80 of 60 cores),
    // here with a cpu request of the Job's own, which the webhook leaves as written; and
    // 3 x 1000 MiB / 10 cores (3 of 2 devices, that is shares).
    let cores = with_cpu_request(seed_000::QUEUE_FIT, "vcjob-vgpu-queue-cores").replace("vgpu-cores: 30", "vgpu-cores: 40");
    let shares = seed_000::QUEUE_FIT
        .replace("name: vcjob-vgpu-queue-fit", "name: vcjob-vgpu-queue-shares")
        .replace("minAvailable: 2", "minAvailable: 3")
        .replace("replicas: 2", "replicas: 3")
        .replace("vgpu-memory: 3000", "vgpu-memory: 1000")
        .replace("vgpu-cores: 30", "vgpu-cores: 10");
    let three = "1/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable; Pending: 1 Unschedulable, 2 Schedulable";
    for (yaml, name, want, cpu) in
        [(cores, "vcjob-vgpu-queue-cores", SEED_HELD, "100m"), (shares, "vcjob-vgpu-queue-shares", three, WEBHOOK_CPU)]
    {
        kubectl.run_with_input(&["create", "-f", "-"], Some(&yaml))?;
        let (pg, message) = wait_unschedulable(volcano, &kubectl, DEMO, name)?;
        assert_eq!(message, want, "{pg:#}");
        let pods = pods_of(&kubectl, DEMO, name)?;
        assert!(pods.iter().all(|p| p["spec"]["nodeName"].is_null()), "{pods:#?}");
        assert_cpu_request(&pods, cpu);
        delete_job(&kubectl, kubelet, (DEMO, name), &[])?;
    }
    volcano.check_running()
}

/// The condition `kind` of an object's status.
fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

/// Waits until both workers of gang `job` are bound and their claims allocated on the card
/// (`memory_mib` / 30 cores each) and the PodGroup runs; prepares each claim, checking `limits`
/// in its CDI spec. Returns the prepared claims (name, UID).
fn run_gang(
    volcano: &mut Volcano,
    kubelet: &mut KubeletSim,
    kubectl: &Kubectl,
    dirs: &Dirs,
    job: (&str, &str),
    memory_mib: u64,
    limits: &[&str],
) -> anyhow::Result<Vec<(String, String)>> {
    let pods = wait_bound(volcano, kubectl, job, 2)?;
    let mut prepared = Vec::new();
    for pod in &pods {
        let claim = claim_name_of(kubectl, pod)?;
        assert_consumed(&wait_allocated(volcano, kubectl, job.0, &claim)?, memory_mib, "30");
        let uid = prepare(kubelet, kubectl, dirs, job.0, &claim, limits)?;
        prepared.push((claim, uid));
    }
    let pg = eventually(&format!("{}'s PodGroup running", job.1), Duration::from_secs(60), || {
        Ok(podgroup_of(kubectl, job.0, job.1)?.filter(|pg| pg["status"]["phase"] == "Running"))
    })?;
    assert_eq!(pg["spec"]["minMember"], 2, "{pg:#}");
    assert_eq!(condition(&pg, "Scheduled").unwrap()["status"], "True", "{pg:#}");
    Ok(prepared)
}

/// Waits until gpu-small-queue reports `devices` devices, `memory_mib` MiB and `cores` cores of
/// the DeviceClass allocated (000's queue status shows 2 / 6k / 60 in its vGPU resources).
fn wait_queue_allocated(kubectl: &Kubectl, devices: &str, memory_mib: u64, cores: &str) -> anyhow::Result<()> {
    let class = "hami-core-gpu.project-hami.io";
    eventually("gpu-small-queue's DRA allocation", Duration::from_secs(60), || {
        let queue = kubectl.get_json(&["queues.scheduling.volcano.sh", "gpu-small-queue"])?;
        let allocated = &queue["status"]["allocated"];
        let memory = allocated[format!("memory.deviceclass/{class}")].as_str().map(|m| bytes(&Value::from(m)));
        let counted = allocated[format!("deviceclass/{class}")] == devices
            && memory == Some(memory_mib << 20)
            && allocated[format!("cores.deviceclass/{class}")] == cores;
        Ok(counted.then_some(()))
    })
}

/// Asserts, for a while, that no pod of `job` is bound and no claim of its pods is allocated.
fn assert_held(volcano: &mut Volcano, kubectl: &Kubectl, (namespace, job): (&str, &str)) -> anyhow::Result<()> {
    for _ in 0..5 {
        volcano.check_running()?;
        let pods = pods_of(kubectl, namespace, job)?;
        assert_eq!(pods.len(), 2, "Volcano made both pods of {job}");
        for pod in &pods {
            assert!(pod["spec"]["nodeName"].is_null(), "a pod of a held gang bound: {pod:#}");
            if let Some(claim) = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str() {
                let allocated = allocation(kubectl, namespace, claim)?;
                assert!(allocated.is_none(), "claim {claim} of a held gang allocated: {allocated:?}");
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

/// The bodies of the fenced blocks of `text` whose info string is `info`.
fn fenced_blocks(text: &str, info: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in text.lines() {
        if let Some(body) = open.as_mut() {
            if line.trim_end() == "```" {
                blocks.extend(open.take());
            } else {
                body.push_str(line);
                body.push('\n');
            }
        } else if line.strip_prefix("```").is_some_and(|i| i.trim() == info) {
            open = Some(String::new());
        }
    }
    blocks
}

/// docs/volcano.md shows the pod, Queue and Jobs the tests above run against Volcano, unchanged,
/// and nothing else as Volcano's objects (the docs test can only dry-run them: it has no Volcano).
#[test]
fn the_docs_show_what_these_tests_run() {
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/volcano.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let shown = fenced_blocks(&text, "yaml volcano");
    let run = [
        seed_000::QUEUE,
        seed_000::SINGLE,
        seed_000::GANG,
        seed_000::GANG_INSUFFICIENT,
        seed_000::QUEUE_FIT,
        seed_000::QUEUE_EXCEEDS,
    ];
    assert_eq!(shown, run, "the `yaml volcano` blocks of {} and the objects this test runs differ", page.display());
    let conf = fenced_blocks(&text, "yaml volcano-scheduler-conf");
    assert_eq!(conf, [vgpu_dra_integration::volcano::DRA_SCHEDULER_CONF], "{}", page.display());
    assert!(text.contains(&format!("--feature-gates={}", vgpu_dra_integration::volcano::SCHEDULER_FEATURE_GATES)));
}
