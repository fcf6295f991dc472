//! The Helm chart as a cluster sees it: helm against the test plane, and the driver run the way
//! the chart's DaemonSet runs it (its arguments and config file as the API server holds them, the
//! identity of a DaemonSet pod bound to the node), since no kubelet starts real pods here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use vgpu_dra_integration::{
    ControlPlane, ManagedProcess, WEBHOOK_CLIENT_NAME, driver_binary, free_port, start_driver_as, write_kubeconfig,
};

/// The chart in this repository.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/vgpu-dra")
}

/// The `helm` arguments that give the webhook the plane's API server as its only client (the CA
/// of the client certificate of the plane's admission configuration, and its name): what every
/// install with the webhook sets (the chart stops without a CA, or an explicit opt-out).
pub fn client_auth_sets(plane: &ControlPlane) -> Vec<String> {
    vec![
        "--set-file".to_owned(),
        format!("webhook.clientAuth.caBundle={}", plane.webhook_client_ca().display()),
        "--set".to_owned(),
        format!("webhook.clientAuth.names={{{WEBHOOK_CLIENT_NAME}}}"),
    ]
}

/// Runs the test bed's helm against `plane` with `args`; `Err` carries helm's stderr.
pub fn helm(plane: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let home = plane.dir().join("helm-home");
    let out = Command::new(&plane.components().helm)
        .args(args)
        .env("KUBECONFIG", plane.kubeconfig())
        // helm keeps caches and repositories under these; never the user's.
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::null())
        .output()
        .context("running helm")?;
    if !out.status.success() {
        bail!("helm {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The objects of a rendered chart as the API server stores them, from a server-side dry run:
/// each one checked by the real API server (schema, admission) and none created. The release
/// namespace must exist.
pub fn dry_run(plane: &ControlPlane, rendered: &str) -> anyhow::Result<Vec<Value>> {
    let out = plane.kubectl().run_with_input(
        &["apply", "--server-side", "--dry-run=server", "--force-conflicts", "-o", "json", "-f", "-"],
        Some(rendered),
    )?;
    let value: Value = serde_json::from_str(&out).context("kubectl apply -o json printed no JSON")?;
    Ok(match value["kind"].as_str() {
        Some("List") => value["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![value],
    })
}

/// The object of `kind` named `name` among `objects`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> anyhow::Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name} among {} objects", objects.len()))
}

/// The arguments of the first container of a workload (DaemonSet, Deployment).
pub fn container_args(workload: &Value) -> Vec<String> {
    workload["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// Flags the DaemonSet sets to host paths (and the host port) that a test replaces with its own.
const HOST_FLAGS: [&str; 6] =
    ["--kubelet-dir=", "--cdi-dir=", "--hami-core-dir=", "--lock-dir=", "--dev-root=", "--metrics-address="];

/// A driver started as a pod of the chart's DaemonSet on one node.
pub struct DaemonSetPod {
    /// The driver process.
    pub process: ManagedProcess,
    /// The kubeconfig with the pod's bound service-account token.
    pub kubeconfig: PathBuf,
    /// The arguments the DaemonSet gave, as the driver got them.
    pub args: Vec<String>,
}

/// Starts the driver for `node` as DaemonSet `namespace/daemonset` would: a Pod of its service
/// account bound to `node` (so its token names the node), that token, the container's arguments
/// and the ConfigMap's file. Host paths and the port become the test's own; `extra` is added.
pub fn run_as_daemonset_pod(
    plane: &ControlPlane,
    namespace: &str,
    daemonset: &str,
    node: &str,
    extra: &[&str],
) -> anyhow::Result<DaemonSetPod> {
    let kubectl = plane.kubectl();
    let ds = kubectl.get_json(&["daemonset", daemonset, "-n", namespace])?;
    let pod_spec = &ds["spec"]["template"]["spec"];
    let sa = pod_spec["serviceAccountName"].as_str().context("DaemonSet names no service account")?;
    let container = &pod_spec["containers"][0];
    let config = config_file(plane, namespace, pod_spec, &format!("{daemonset}-{node}-config.yaml"))?;
    let pod_name = format!("{daemonset}-{node}");
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let kubeconfig = pod_token(plane, namespace, sa, &pod_name, Some(node), labels)?;

    let given: Vec<String> = container["args"]
        .as_array()
        .context("driver container has no args")?
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(given.first().map(String::as_str) == Some("kubelet-plugin"), "DaemonSet runs {given:?}");
    // A flag in `extra` replaces the chart's (the driver refuses one given twice).
    let flag = |a: &str| a.split_once('=').map_or(a, |(f, _)| f).to_owned();
    let overridden: Vec<String> = extra.iter().map(|a| format!("{}=", flag(a))).collect();
    let mut args: Vec<String> = given[1..]
        .iter()
        .filter(|a| !HOST_FLAGS.iter().any(|f| a.starts_with(f)) && !overridden.iter().any(|f| a.starts_with(f.as_str())))
        .map(|a| if a.starts_with("--config=") { format!("--config={}", config.display()) } else { a.clone() })
        .collect();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = start_driver_as(plane, &kubeconfig, &pod_name, node, &refs)?;
    Ok(DaemonSetPod { process, kubeconfig, args: given })
}

/// A kubeconfig with a token of DaemonSet `daemonset`'s service account bound to a new pod of it
/// on `node`, as the kubelet would give that node's driver pod; no driver runs with it.
pub fn daemonset_token(plane: &ControlPlane, namespace: &str, daemonset: &str, node: &str) -> anyhow::Result<PathBuf> {
    let ds = plane.kubectl().get_json(&["daemonset", daemonset, "-n", namespace])?;
    let sa = ds["spec"]["template"]["spec"]["serviceAccountName"].as_str().context("DaemonSet names no service account")?;
    pod_token(plane, namespace, sa, &format!("{daemonset}-{node}"), Some(node), &ds["spec"]["template"]["metadata"]["labels"])
}

/// The device configuration file of a pod spec's `config` volume, written under the plane's
/// directory as `file`: the ConfigMap's `config.yaml`, or the key an `items` entry maps to it.
fn config_file(plane: &ControlPlane, namespace: &str, pod_spec: &Value, file: &str) -> anyhow::Result<PathBuf> {
    let volume = pod_spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "config"))
        .context("the pod spec has no config volume")?;
    let name = volume["configMap"]["name"].as_str().context("the config volume is no ConfigMap")?;
    let key = volume["configMap"]["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["path"] == "config.yaml"))
        .and_then(|i| i["key"].as_str())
        .unwrap_or("config.yaml");
    let cm = plane.kubectl().get_json(&["configmap", name, "-n", namespace])?;
    let path = plane.dir().join(file);
    std::fs::write(&path, cm["data"][key].as_str().with_context(|| format!("ConfigMap {name} has no {key}"))?)?;
    Ok(path)
}

/// A token of `sa` bound to a new Pod `pod_name` (labels `labels`, on `node` when given: the
/// token then carries the node, which the slice policy checks), in a kubeconfig.
fn pod_token(
    plane: &ControlPlane,
    namespace: &str,
    sa: &str,
    pod_name: &str,
    node: Option<&str>,
    labels: &Value,
) -> anyhow::Result<PathBuf> {
    let kubectl = plane.kubectl();
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels},
        "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": "registry.invalid/none"}]}});
    if let Some(node) = node {
        pod["spec"]["nodeName"] = node.into();
    }
    kubectl.apply(&pod.to_string())?;
    let uid = kubectl.run(&["get", "pod", pod_name, "-n", namespace, "-o", "jsonpath={.metadata.uid}"])?;
    let token = kubectl.run(&[
        "create",
        "token",
        sa,
        "-n",
        namespace,
        "--bound-object-kind=Pod",
        &format!("--bound-object-name={pod_name}"),
        &format!("--bound-object-uid={}", uid.trim()),
        "--duration=2h",
    ])?;
    let kubeconfig = plane.dir().join(format!("{pod_name}.kubeconfig"));
    write_kubeconfig(&kubeconfig, plane.server(), token.trim())?;
    Ok(kubeconfig)
}

/// A webhook started as a replica of the chart's webhook Deployment.
pub struct WebhookPod {
    /// The webhook process.
    pub process: ManagedProcess,
    /// The kubeconfig with the pod's bound service-account token.
    pub kubeconfig: PathBuf,
    /// The arguments the Deployment gave.
    pub args: Vec<String>,
    /// The port of /metrics, /healthz and /readyz.
    pub metrics_port: u16,
    /// The URL the API server calls it at (its Service, on the test bed).
    pub url: String,
}

/// The container arguments of a workload, checked to run `webhook`.
fn webhook_args(workload: &Value, kind: &str) -> anyhow::Result<Vec<String>> {
    let given = container_args(workload);
    anyhow::ensure!(given.first().map(String::as_str) == Some("webhook"), "{kind} runs {given:?}");
    Ok(given)
}

/// Starts `vgpu-dra webhook` as Deployment `namespace/deployment` would: the token of its
/// service account bound to a pod, the container's arguments, `POD_NAMESPACE` as the downward API
/// gives it, and the ConfigMaps' files (the device configuration, the client CA). The ports
/// become free loopback ones, and, with no kube-proxy for the API server to reach the Service
/// through, `--url` to this process replaces `--service-name` (the two exclude each other); every
/// other argument is the Deployment's.
pub fn run_as_webhook_pod(plane: &ControlPlane, namespace: &str, deployment: &str) -> anyhow::Result<WebhookPod> {
    let deploy = plane.kubectl().get_json(&["deployment", deployment, "-n", namespace])?;
    let pod_spec = &deploy["spec"]["template"]["spec"];
    let sa = pod_spec["serviceAccountName"].as_str().context("Deployment names no service account")?;
    let container = &pod_spec["containers"][0];
    let env = container["env"].as_array().context("webhook container has no env")?;
    anyhow::ensure!(
        env.iter().any(|e| e["name"] == "POD_NAMESPACE" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"),
        "POD_NAMESPACE is not the pod's namespace: {env:?}"
    );
    let config = config_file(plane, namespace, pod_spec, &format!("{deployment}-config.yaml"))?;
    let pod_name = format!("{deployment}-replica");
    let kubeconfig = pod_token(plane, namespace, sa, &pod_name, None, &deploy["spec"]["template"]["metadata"]["labels"])?;

    let given = webhook_args(&deploy, "Deployment")?;
    // The plane's webhook port: the API server presents its client certificate there.
    let (listen, metrics_port) = (plane.webhook_port(), free_port()?);
    let url = format!("https://127.0.0.1:{listen}/mutate-pods");
    let mut args: Vec<String> = vec!["webhook".to_owned()];
    for arg in &given[1..] {
        let replaced = match arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag) {
            "--listen" => format!("--listen=127.0.0.1:{listen}"),
            "--metrics-address" => format!("--metrics-address=127.0.0.1:{metrics_port}"),
            "--config" => format!("--config={}", config.display()),
            "--service-name" => format!("--url={url}"),
            "--client-ca-file" => {
                let file = mounted_file(plane, namespace, pod_spec, container, arg, &format!("{deployment}-client-ca.crt"))?;
                format!("--client-ca-file={}", file.display())
            }
            _ => arg.clone(),
        };
        args.push(replaced);
    }
    args.extend([format!("--namespace={namespace}"), format!("--kubeconfig={}", kubeconfig.display())]);
    let process = ManagedProcess::spawn(&pod_name, driver_binary()?, &args, plane.dir())?;
    Ok(WebhookPod { process, kubeconfig, args: given, metrics_port, url })
}

/// The registration Job of release `release` in `namespace` (its name carries a hash of what it
/// registers).
///
/// # Errors
/// When there is not exactly one.
pub fn registration_job(plane: &ControlPlane, namespace: &str, release: &str) -> anyhow::Result<Value> {
    let selector = format!("app.kubernetes.io/component=webhook-registration,app.kubernetes.io/instance={release}");
    let list = plane.kubectl().get_json(&["jobs", "-n", namespace, "-l", &selector])?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(items.len() == 1, "{} registration Jobs of release {release}", items.len());
    Ok(items[0].clone())
}

/// Runs the chart's registration Job of release `release` in `namespace` to its end as its pod
/// would: its service account's token bound to a pod, its container's arguments and the device
/// configuration, registering `url` (a webhook replica's, see [`run_as_webhook_pod`]) for the
/// Service. Returns its log.
///
/// # Errors
/// When the Job is not as expected, or the registration fails (its log is the message).
pub fn run_registration_job(plane: &ControlPlane, namespace: &str, release: &str, url: &str) -> anyhow::Result<String> {
    let job_json = registration_job(plane, namespace, release)?;
    let job = job_json["metadata"]["name"].as_str().context("a Job without a name")?.to_owned();
    let job = job.as_str();
    let pod_spec = &job_json["spec"]["template"]["spec"];
    let sa = pod_spec["serviceAccountName"].as_str().context("the Job names no service account")?;
    let config = config_file(plane, namespace, pod_spec, &format!("{job}-config.yaml"))?;
    let pod_name = format!("{job}-run");
    let kubeconfig = pod_token(plane, namespace, sa, &pod_name, None, &job_json["spec"]["template"]["metadata"]["labels"])?;
    let given = webhook_args(&job_json, "Job")?;
    let mut args: Vec<String> = vec!["webhook".to_owned()];
    for arg in &given[1..] {
        args.push(match arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag) {
            "--config" => format!("--config={}", config.display()),
            "--service-name" => format!("--url={url}"),
            _ => arg.clone(),
        });
    }
    args.extend([format!("--namespace={namespace}"), format!("--kubeconfig={}", kubeconfig.display())]);
    let out = Command::new(driver_binary()?).args(&args).stdin(Stdio::null()).output().context("running the registration Job")?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    anyhow::ensure!(out.status.success(), "the registration Job failed ({}):\n{log}", out.status);
    Ok(log)
}

/// The file a container flag `arg` (`--flag=/mount/dir/file`) names, from the ConfigMap volume
/// mounted at its directory, written under the plane's directory as `file`.
fn mounted_file(
    plane: &ControlPlane,
    namespace: &str,
    pod_spec: &Value,
    container: &Value,
    arg: &str,
    file: &str,
) -> anyhow::Result<PathBuf> {
    let path = Path::new(arg.split_once('=').map_or("", |(_, p)| p));
    let (dir, key) = (path.parent().context("no directory")?, path.file_name().and_then(|k| k.to_str()).context("no file")?);
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"].as_str() == dir.to_str()))
        .with_context(|| format!("nothing mounted at {}", dir.display()))?;
    let volume = pod_spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .context("the mount has no volume")?;
    let name = volume["configMap"]["name"].as_str().context("the volume is no ConfigMap")?;
    let cm = plane.kubectl().get_json(&["configmap", name, "-n", namespace])?;
    let out = plane.dir().join(file);
    std::fs::write(&out, cm["data"][key].as_str().with_context(|| format!("ConfigMap {name} has no {key}"))?)?;
    Ok(out)
}
