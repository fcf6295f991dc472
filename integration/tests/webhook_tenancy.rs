//! What the webhook does for whom, on the test bed. Only the API server may send it reviews: a
//! forged review posted straight to its port, by a client without the API server's client
//! certificate, is refused before any review is read, and creates nothing, whatever namespace
//! it names. And a ResourceClaimTemplate that someone else made under the name of one of ours is
//! never handed to a pod: the pod is refused, naming the template, until it is gone.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use vgpu_dra_integration::{ControlPlane, Kubectl, ManagedProcess, WEBHOOK_CLIENT_NAME, eventually, free_port, http_get};

mod common;

use common::webhook::{self, DEVICE_CLASS};
use common::{Dirs, NODE, driver};

/// The webhook's own namespace.
const NAMESPACE: &str = "vgpu-dra";

/// A HAMi pod of `memory` MiB in `namespace`.
fn hami_pod(name: &str, namespace: &str, memory: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  containers:\n  - name: cuda\n    image: registry.invalid/none\n    resources:\n      limits: {{nvidia.com/gpu: 1, nvidia.com/gpumem: {memory}}}\n"
    )
}

/// A plane with a node's slices, the class, namespaces and a webhook (metrics on the port
/// returned) that the API server calls.
fn bed(plane: &ControlPlane, namespaces: &[&str]) -> anyhow::Result<(ManagedProcess, ManagedProcess, u16, u16)> {
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl();
    kubectl.apply(DEVICE_CLASS)?;
    for ns in std::iter::once(&NAMESPACE).chain(namespaces) {
        kubectl.run(&["create", "namespace", ns])?;
    }
    let dirs = Dirs::new(plane.dir());
    let drv = driver(plane, &dirs, "driver");
    eventually("the node's slices", Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceslices"])?;
        Ok(list["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
    })?;
    let (port, metrics) = (plane.webhook_port(), free_port()?);
    let mut hook =
        webhook::spawn(plane, "webhook", (port, port), NAMESPACE, &[format!("--metrics-address=127.0.0.1:{metrics}")])?;
    webhook::wait_called(plane, &mut hook, &hami_pod("probe", "default", 1024))?;
    Ok((hook, drv, port, metrics))
}

/// The templates of `namespace`.
fn templates(kubectl: &Kubectl, namespace: &str) -> anyhow::Result<Vec<Value>> {
    Ok(kubectl.get_json(&["resourceclaimtemplates", "-n", namespace])?["items"].as_array().cloned().unwrap_or_default())
}

/// An AdmissionReview of `pod` as the API server would send it for `namespace`, written to a file.
fn forged_review(dir: &Path, namespace: &str, memory: u32) -> anyhow::Result<PathBuf> {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "forged", "namespace": namespace},
        "spec": {"containers": [{"name": "cuda", "image": "registry.invalid/none",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": memory.to_string()}}}]}
    });
    let gvk = json!({"group": "", "version": "v1", "kind": "Pod"});
    let gvr = json!({"group": "", "version": "v1", "resource": "pods"});
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0f6a6a5e-0000-4000-8000-000000000001", "kind": gvk, "resource": gvr, "requestKind": gvk,
            "requestResource": gvr, "name": "forged", "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    });
    let path = dir.join(format!("forged-{namespace}-{memory}.json"));
    std::fs::write(&path, review.to_string())?;
    Ok(path)
}

/// A client certificate and its key, or none.
type Identity<'a> = Option<(&'a Path, &'a Path)>;

/// POSTs `review` to the webhook on `port` with curl, presenting `identity` (certificate, key);
/// the HTTP status, or curl's error.
fn post(port: u16, review: &Path, identity: Identity<'_>) -> Result<String, String> {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-k", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", review.display()));
    if let Some((cert, key)) = identity {
        curl.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let out = curl.arg(format!("https://127.0.0.1:{port}/mutate-pods")).output().map_err(|e| e.to_string())?;
    let status = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() && status != "000" {
        Ok(status)
    } else {
        Err(format!("curl {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A CA of someone else's and a client certificate of it bearing the API server's name.
fn foreign_identity(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = dir.join("foreign");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
    let subject = format!("/CN={WEBHOOK_CLIENT_NAME}");
    for step in [
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=foreign CA",
        ][..],
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "c.key",
            "-out",
            "c.csr",
            "-subj",
            &subject,
        ],
        &[
            "x509",
            "-req",
            "-in",
            "c.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "c.crt",
            "-days",
            "2",
            "-extfile",
            "client.ext",
        ],
    ] {
        let out = Command::new("openssl").current_dir(&dir).args(step).stdin(Stdio::null()).output()?;
        anyhow::ensure!(out.status.success(), "openssl {step:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((dir.join("c.crt"), dir.join("c.key")))
}

/// The sum of `metric`'s samples whose labels contain `labels`.
fn metric(port: u16, metric: &str, labels: &str) -> anyhow::Result<f64> {
    let text = http_get(port, "/metrics")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(metric) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Any pod that can reach the webhook's port could post reviews naming any namespace, and the
/// webhook would create templates there with its cluster-wide right. Every client but the API
/// server is refused in the TLS handshake: one without a certificate, one with a certificate of
/// another CA bearing the API server's name, one with a certificate of the API server's CA
/// bearing another name. Nothing is created, each refusal is counted and logged, and the API
/// server's own calls go on.
#[test]
fn only_the_api_server_may_send_reviews() {
    let plane = ControlPlane::start().expect("control plane");
    if let Err(e) = forged_scenario(&plane) {
        panic!("{e:#}");
    }
}

fn forged_scenario(plane: &ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let (mut hook, mut drv, port, metrics) = bed(plane, &["victim"])?;
    let foreign = foreign_identity(plane.dir())?;
    let (other_cert, other_key) = plane.issue_webhook_client_certificate("alice")?;
    let forgers: [(&str, Identity<'_>, &str); 3] = [
        ("no certificate", None, "no_certificate"),
        ("another CA's certificate of the API server's name", Some((&foreign.0, &foreign.1)), "untrusted_certificate"),
        ("the API server's CA's certificate of another name", Some((&other_cert, &other_key)), "name_not_allowed"),
    ];
    for (i, (who, identity, reason)) in forgers.iter().enumerate() {
        // A new shape each time: a template no one has made yet.
        let review = forged_review(plane.dir(), "victim", 1000 + u32::try_from(i)?)?;
        let answer = post(port, &review, *identity);
        anyhow::ensure!(answer.is_err(), "{who}: the webhook answered {answer:?}");
        eventually(&format!("{who}: refusal counted"), Duration::from_secs(10), || {
            let counted = metric(metrics, "vgpu_dra_webhook_refused_clients_total", &format!("reason=\"{reason}\""))?;
            Ok((counted >= 1.0).then_some(()))
        })?;
    }
    let made = templates(&kubectl, "victim")?;
    anyhow::ensure!(made.is_empty(), "forged reviews made templates: {made:?}");
    let reviews = metric(metrics, "vgpu_dra_webhook_admissions_total", "")?;
    let log = std::fs::read_to_string(hook.log())?;
    anyhow::ensure!(log.matches("refused a client that is not the API server").count() == 1, "logged once per address:\n{log}");

    // The API server's own call, for the same namespace, goes through and creates its template.
    kubectl.run_with_input(&["create", "-f", "-"], Some(&hami_pod("real", "victim", 2048)))?;
    let pod = kubectl.get_json(&["pod", "real", "-n", "victim"])?;
    anyhow::ensure!(pod["spec"]["resourceClaims"].is_array(), "not converted: {pod}");
    anyhow::ensure!(templates(&kubectl, "victim")?.len() == 1, "the real pod's template");
    anyhow::ensure!(metric(metrics, "vgpu_dra_webhook_admissions_total", "")? == reviews + 1.0, "one more review read");
    hook.check_running()?;
    drv.check_running()?;
    Ok(())
}

/// Someone who may create templates in a namespace makes one under the name the webhook gives
/// pods of a shape, with other content (more memory, another request, labels for the claims,
/// no label of ours). Pods of that shape are refused, naming the template, and the template is
/// left as it is; once it is deleted, pods of the shape get vgpu-dra's. A copy of vgpu-dra's own
/// template, made by someone else, is used as it is.
#[test]
fn a_template_someone_else_made_under_our_name_is_never_used() {
    let plane = ControlPlane::start().expect("control plane");
    if let Err(e) = hijack_scenario(&plane) {
        panic!("{e:#}");
    }
}

/// A template as a user would write it back: `template` without what the API server adds.
fn as_written(template: &Value, namespace: &str) -> Value {
    let mut t = template.clone();
    let meta = t["metadata"].as_object_mut().unwrap();
    for key in ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"] {
        meta.remove(key);
    }
    meta.insert("namespace".into(), namespace.into());
    t
}

fn hijack_scenario(plane: &ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let (mut hook, _drv, _port, _metrics) = bed(plane, &["team-a", "team-b"])?;
    // vgpu-dra's template for 3000 MiB pods, made in team-b.
    kubectl.run_with_input(&["create", "-f", "-"], Some(&hami_pod("model", "team-b", 3000)))?;
    let pod = kubectl.get_json(&["pod", "model", "-n", "team-b"])?;
    let name = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].as_str().unwrap_or_default().to_owned();
    anyhow::ensure!(!name.is_empty(), "not converted: {pod}");
    let ours = kubectl.get_json(&["resourceclaimtemplate", &name, "-n", "team-b"])?;

    let edit = |f: &dyn Fn(&mut Value)| {
        let mut t = as_written(&ours, "team-a");
        f(&mut t);
        t
    };
    let request = "/spec/spec/devices/requests/0";
    let taken: Vec<(&str, Value)> = vec![
        (
            "more memory",
            edit(&|t| *t.pointer_mut(&format!("{request}/exactly/capacity/requests/memory")).unwrap() = "14Gi".into()),
        ),
        (
            "a second request",
            edit(&|t| {
                let mut second = t.pointer(request).unwrap().clone();
                second["name"] = "extra".into();
                t["spec"]["spec"]["devices"]["requests"].as_array_mut().unwrap().push(second);
            }),
        ),
        ("labels for the claims", edit(&|t| t["spec"]["metadata"] = json!({"labels": {"owner": "mallory"}}))),
        ("no label of ours", edit(&|t| t["metadata"]["labels"] = json!({"owner": "mallory"}))),
    ];
    for (i, (what, template)) in taken.iter().enumerate() {
        kubectl.run_with_input(&["create", "-f", "-"], Some(&template.to_string()))?;
        let before = kubectl.get_json(&["resourceclaimtemplate", &name, "-n", "team-a"])?;
        let pod = format!("victim-{i}");
        let err = kubectl.run_with_input(&["create", "-f", "-"], Some(&hami_pod(&pod, "team-a", 3000))).err();
        let err =
            err.map(|e| format!("{e:#}")).unwrap_or_else(|| format!("{what}: the pod was admitted with someone else's template"));
        anyhow::ensure!(
            err.contains(&format!("ResourceClaimTemplate team-a/{name} exists with content vgpu-dra did not give it"))
                && err.contains("delete it (vgpu-dra makes it again) or rename it"),
            "{what}: {err}"
        );
        anyhow::ensure!(kubectl.run(&["get", "pod", &pod, "-n", "team-a"]).is_err(), "{what}: the pod exists");
        let after = kubectl.get_json(&["resourceclaimtemplate", &name, "-n", "team-a"])?;
        anyhow::ensure!(after == before, "{what}: the template was changed");
        kubectl.run(&["delete", "resourceclaimtemplate", &name, "-n", "team-a"])?;
    }

    // A faithful copy is as good as ours.
    kubectl.run_with_input(&["create", "-f", "-"], Some(&as_written(&ours, "team-a").to_string()))?;
    kubectl.run_with_input(&["create", "-f", "-"], Some(&hami_pod("copy", "team-a", 3000)))?;
    let pod = kubectl.get_json(&["pod", "copy", "-n", "team-a"])?;
    anyhow::ensure!(pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == name.as_str(), "{pod}");
    // Gone, it is made again with vgpu-dra's content.
    kubectl.run(&["delete", "resourceclaimtemplate", &name, "-n", "team-a"])?;
    let mut fresh = hami_pod("fresh", "team-a", 3000);
    // The webhook remembers a template it confirmed for a minute: another shape asks again.
    fresh = fresh.replace("nvidia.com/gpumem: 3000", "nvidia.com/gpumem: 3001");
    kubectl.run_with_input(&["create", "-f", "-"], Some(&fresh))?;
    let pod = kubectl.get_json(&["pod", "fresh", "-n", "team-a"])?;
    let fresh_name = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].as_str().unwrap_or_default().to_owned();
    kubectl.get_json(&["resourceclaimtemplate", &fresh_name, "-n", "team-a"])?;
    let log = std::fs::read_to_string(hook.log())?;
    anyhow::ensure!(log.matches("a template of ours is taken").count() == taken.len(), "each refusal logged:\n{log}");
    hook.check_running()?;
    Ok(())
}
