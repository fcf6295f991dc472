//! The vgpu-dra webhook as the test bed runs it: a process on loopback that registers its own
//! URL and answers only the API server (the client certificate of the plane's admission
//! configuration), and the wait until the API server really calls it.

use std::time::Duration;

use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, ManagedProcess, WEBHOOK_CLIENT_NAME, driver_binary, eventually};

/// HAMi's DeviceClass, selecting every device of the driver.
pub const DEVICE_CLASS: &str = r#"apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: hami-core-gpu.project-hami.io}
spec:
  selectors:
  - cel:
      expression: device.driver == "hami-core-gpu.project-hami.io"
"#;

/// `vgpu-dra webhook` named `name`, listening on `listen` and registering the URL on port
/// `url_port` (replicas of one Service all register the same one), its Secret in `namespace`,
/// with `extra` flags. On the plane's [`ControlPlane::webhook_port`], the one URL the API server
/// presents its client certificate to, it requires that certificate (unless `extra` names
/// another `--client-ca-file`); on another port it answers any client.
pub fn spawn(
    plane: &ControlPlane,
    name: &str,
    (listen, url_port): (u16, u16),
    namespace: &str,
    extra: &[String],
) -> anyhow::Result<ManagedProcess> {
    let mut args = vec![
        "webhook".to_owned(),
        format!("--url=https://127.0.0.1:{url_port}/mutate-pods"),
        format!("--listen=127.0.0.1:{listen}"),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--namespace={namespace}"),
    ];
    if url_port == plane.webhook_port() && !extra.iter().any(|a| a.starts_with("--client-ca-file")) {
        args.extend(client_auth(plane));
    }
    args.extend(extra.iter().cloned());
    ManagedProcess::spawn(name, driver_binary()?, &args, plane.dir())
}

/// The flags that make a webhook answer only the plane's API server.
pub fn client_auth(plane: &ControlPlane) -> [String; 2] {
    [format!("--client-ca-file={}", plane.webhook_client_ca().display()), format!("--client-name={WEBHOOK_CLIENT_NAME}")]
}

/// Waits until the API server calls `webhook`: a server-side dry run of `probe` (a pod the
/// webhook converts; a dry run creates nothing) comes back with claims. Returns that pod.
pub fn wait_called(plane: &ControlPlane, webhook: &mut ManagedProcess, probe: &str) -> anyhow::Result<Value> {
    let kubectl = plane.kubectl();
    eventually("the API server calling the webhook", Duration::from_secs(60), || {
        webhook.check_running()?;
        let out = kubectl.run_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(probe))?;
        let pod: Value = serde_json::from_str(&out)?;
        Ok(pod["spec"]["resourceClaims"].is_array().then_some(pod))
    })
}

/// The body of `GET /metrics` on the webhook's metrics `port`.
pub fn metrics(port: u16) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

/// HAMi's DeviceClass, the webhook's `namespace`, and node [`super::NODE`] with its driver (on
/// the common [`super::Dirs`]) once its slice is published: where the webhook tests on the real
/// scheduler start.
pub fn node_with_class(plane: &ControlPlane, namespace: &str) -> anyhow::Result<(super::Dirs, ManagedProcess)> {
    let kubectl = plane.kubectl();
    kubectl.apply(DEVICE_CLASS)?;
    kubectl.run(&["create", "namespace", namespace])?;
    plane.create_node(super::NODE)?;
    let dirs = super::Dirs::new(plane.dir());
    let driver = super::driver(plane, &dirs, "driver");
    eventually("the node's slice", Duration::from_secs(30), || {
        Ok(kubectl.get_json(&["resourceslices"])?["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
    })?;
    Ok((dirs, driver))
}

/// `kubectl create -f -` of `yaml`: kubectl's stderr (where admission warnings go) on success,
/// the error with it otherwise.
pub fn create(plane: &ControlPlane, yaml: &str) -> anyhow::Result<String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(&plane.components().kubectl)
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .args(["create", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().ok_or_else(|| anyhow::anyhow!("kubectl stdin"))?.write_all(yaml.as_bytes())?;
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    anyhow::ensure!(out.status.success(), "kubectl create: {stderr}");
    Ok(stderr)
}

/// `vgpu-dra <args> --kubeconfig <plane's>`: its standard output, once it succeeded.
pub fn vgpu(plane: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(driver_binary()?)
        .args(args)
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .output()?;
    anyhow::ensure!(out.status.success(), "vgpu-dra {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
