//! `vgpu-dra convert` and `kubectl vgpu convert`: HAMi's and volcano-vgpu-device-plugin's example
//! manifests, in the shapes they publish, converted without a cluster into objects the real API
//! server accepts with no webhook registered, whose pods then get their shares from the real
//! scheduler; a privileged one refused with the webhook's reason; and, against a cluster, the
//! workloads still written for HAMi or Volcano listed with what each becomes.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use common::seed_000;
use common::webhook::DEVICE_CLASS;
use common::{Dirs, NODE, driver};
use vgpu_dra_integration::{ControlPlane, driver_binary, eventually, plugin_dir};

// mirrors HAMi's examples/nvidia/example.yaml: a Deployment of 3000 MiB, default cores.
const HAMI_DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: cuda-sample-vector-add
  labels: {app: cuda-sample-vector-add}
spec:
  replicas: 1
  selector:
    matchLabels: {app: cuda-sample-vector-add}
  template:
    metadata:
      labels: {app: cuda-sample-vector-add}
    spec:
      containers:
      - name: cuda-sample-vector-add
        image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04
        command: [/bin/bash, -c, --]
        args: [while true; do /cuda-samples/vectorAdd; done]
        resources:
          limits:
            nvidia.com/gpu: 1
            nvidia.com/gpumem: 3000
"#;

// mirrors HAMi's examples/nvidia/default_use.yaml: one pod, 3000 MiB and 30 % of a card.
const HAMI_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: 3000
          nvidia.com/gpucores: 30
"#;

// mirrors HAMi's examples/nvidia/use_memory_fraction.yaml: half of each of two cards.
const HAMI_FRACTION: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod-fraction
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 2
          nvidia.com/gpumem-percentage: 50
"#;

// mirrors volcano-vgpu-device-plugin's examples/vgpu-deployment.yaml (its image and model
// shortened): a Deployment for Volcano's scheduler asking 1 GiB.
const VOLCANO_DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: resnet101-deployment
spec:
  selector:
    matchLabels: {app: resnet101-server}
  replicas: 1
  template:
    metadata:
      labels: {app: resnet101-server}
    spec:
      schedulerName: volcano
      containers:
      - name: resnet101-container
        image: tensorflow/serving:latest
        ports:
        - containerPort: 8501
        resources:
          limits:
            volcano.sh/vgpu-number: 1
            volcano.sh/vgpu-memory: 1024
"#;

// mirrors HAMi's examples/nvidia/use_as_normal.yaml with a privileged container, which sees every
// card and escapes the limits: the webhook refuses it.
const PRIVILEGED: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod-privileged
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      securityContext: {privileged: true}
      resources:
        limits:
          nvidia.com/gpu: 1
"#;

/// `vgpu-dra convert <args>` with `input` on standard input.
fn convert(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(driver_binary().unwrap())
        .arg("convert")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn published_examples_convert_into_objects_the_api_server_accepts_and_the_scheduler_places() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let files = [HAMI_DEPLOYMENT, HAMI_POD, HAMI_FRACTION, VOLCANO_DEPLOYMENT, seed_000::GANG].join("---\n");

    // Without a cluster: the same output whatever the order of the runs, warnings as lines.
    let out = convert(&["-f", "-", "--mock-gpus=2xTesla T4:15Gi"], &files);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(out.status.success(), "convert failed: {stderr}");
    ensure!(stderr.lines().all(|l| l.starts_with("warning: ")), "{stderr}");
    let converted = String::from_utf8(out.stdout)?;
    ensure!(convert(&["-f", "-", "--mock-gpus=2xTesla T4:15Gi"], &files).stdout == converted.as_bytes(), "not stable");
    for gone in ["nvidia.com/gpu", "volcano.sh/vgpu"] {
        ensure!(!converted.contains(gone), "{gone} left in:\n{converted}");
    }
    ensure!(converted.matches("kind: ResourceClaimTemplate").count() >= 4, "{converted}");

    // A privileged container: refused with the webhook's reason, nothing printed.
    let out = convert(&["-f", "-"], &format!("{HAMI_POD}---\n{PRIVILEGED}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && out.stdout.is_empty(), "{stderr}");
    ensure!(
        stderr
            .contains("error: Pod/gpu-pod-privileged: container \"ubuntu-container\" is privileged and asks for nvidia.com/gpu"),
        "{stderr}"
    );

    // The API server takes the output with no webhook registered; the pods get their shares.
    let kubectl = plane.kubectl().clone();
    kubectl.apply(DEVICE_CLASS)?;
    let crd = plane.components().volcano_crds.join("batch.volcano.sh_jobs.yaml");
    kubectl.run(&["apply", "--server-side", "-f", crd.to_str().context("path")?])?;
    kubectl.wait_crds_established(Duration::from_secs(60))?;
    kubectl.run(&["create", "namespace", seed_000::DEMO])?;
    plane.create_node(NODE)?;
    let dirs = Dirs::new(plane.dir());
    let mut drv = driver(plane, &dirs, "driver");
    kubectl.run_with_input(&["apply", "-f", "-"], Some(&converted))?;
    let claim = eventually("gpu-pod's claim allocated", Duration::from_secs(60), || {
        let pod = kubectl.get_json(&["pod", "gpu-pod", "-n", "default"])?;
        let Some(name) = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str() else { return Ok(None) };
        let claim = kubectl.get_json(&["resourceclaim", name, "-n", "default"])?;
        Ok(claim["status"]["allocation"]["devices"]["results"].get(0).cloned())
    })?;
    ensure!(claim["consumedCapacity"]["cores"] == "30", "{claim}");
    // (The test bed runs no Deployment controller: the Deployment is checked as stored.)
    let deployment = kubectl.get_json(&["deployment", "cuda-sample-vector-add", "-n", "default"])?;
    let template = deployment["spec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        .as_str()
        .context("the Deployment names no template")?;
    kubectl.get_json(&["resourceclaimtemplate", template, "-n", "default"])?;
    let job = kubectl.get_json(&["jobs.batch.volcano.sh", "vcjob-vgpu-gang", "-n", seed_000::DEMO])?;
    ensure!(job["spec"]["tasks"][0]["template"]["spec"]["resourceClaims"].is_array(), "{job:#}");

    // Against the cluster: the workloads still written for HAMi or Volcano (applied as they are,
    // no webhook converting them), what each becomes, and which would be refused.
    kubectl.run(&["create", "namespace", "legacy"])?;
    // (This API server forbids privileged pods, so the refused one is refused for its value.)
    let too_much = HAMI_POD.replace("name: gpu-pod", "name: gpu-pod-too-much").replace("gpumem: 3000", "gpumem-percentage: 150");
    for yaml in [HAMI_DEPLOYMENT, HAMI_POD, &too_much, VOLCANO_DEPLOYMENT] {
        kubectl.run_with_input(&["apply", "-n", "legacy", "-f", "-"], Some(yaml))?;
    }
    let path = format!("{}:{}", plugin_dir()?.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(&plane.components().kubectl)
        .env("PATH", path)
        .args(["vgpu", "convert", "--all-namespaces", &format!("--kubeconfig={}", plane.kubeconfig().display())])
        .output()?;
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "kubectl vgpu convert: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{table}");
    let row = |name: &str| table.lines().find(|l| l.split_whitespace().nth(2) == Some(name)).unwrap_or_default().to_owned();
    ensure!(row("cuda-sample-vector-add").starts_with("legacy") && row("cuda-sample-vector-add").contains("converts"), "{table}");
    ensure!(row("gpu-pod").contains("1 x (3000Mi, 30 cores)"), "{table}");
    ensure!(row("gpu-pod-too-much").contains("refused") && row("gpu-pod-too-much").contains("150 is out of range"), "{table}");
    ensure!(row("resnet101-deployment").contains("1 x (1Gi, 0 cores)"), "{table}");
    // What the webhook made in default names nothing of HAMi's any more; the ReplicaSets and
    // pods of the legacy Deployments are their Deployments' rows.
    ensure!(!table.lines().any(|l| l.starts_with("default ")), "{table}");
    ensure!(table.lines().count() == 5, "a header and four workloads: {table}");
    drv.check_running()?;
    Ok(())
}
