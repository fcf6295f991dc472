//! The webhook's certificates on the test bed. A Secret written by another issuer (as
//! cert-manager writes it) is waited for, served and registered; while its key is unusable the
//! webhook waits, not ready, saying why, and never writes it; replaced by one of another CA, it is
//! registered and served within seconds, without a restart, and the real API server verifies the
//! new certificate. A self-signed certificate lives as long as `--certificate-validity-days`
//! says, checked with openssl rather than our own parser. And the events that used to refuse HAMi
//! pods for a while (a deleted Secret while replicas serve, a corrupt key while a replica starts)
//! refuse none: a stream of pods created through the API server across them is admitted whole.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::Value;
use vgpu_dra_integration::{ControlPlane, Kubectl, ManagedProcess, eventually, free_port, http_get};

mod common;

use common::webhook::{self, DEVICE_CLASS};
use common::{Dirs, NODE, driver};

/// The webhook's own namespace, where its Secret lives.
const NAMESPACE: &str = "vgpu-dra";
/// The Secret another issuer writes.
const EXTERNAL_SECRET: &str = "webhook-tls";
/// The Secret the webhook makes itself (the flag's default).
const SELF_SIGNED_SECRET: &str = "vgpu-dra-webhook-tls";
/// The configuration the webhook registers (the flag's default).
const CONFIGURATION: &str = "vgpu-dra-webhook";

/// A pod asking for one HAMi GPU.
const POD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: hami-gpu, namespace: default}
spec:
  containers:
  - name: cuda
    image: registry.invalid/none
    resources:
      limits: {nvidia.com/gpu: 1}
"#;

/// A webhook listening on `port` of loopback and registering that URL.
fn start_webhook(plane: &ControlPlane, port: u16, extra: &[&str]) -> anyhow::Result<ManagedProcess> {
    let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
    webhook::spawn(plane, "webhook", (port, port), NAMESPACE, &extra)
}

/// A CA and a serving certificate for 127.0.0.1 signed by it, PEM-encoded: what an issuer
/// other than the webhook writes.
#[derive(Clone)]
struct Issued {
    ca: String,
    cert: String,
    key: String,
}

fn issue(ca_name: &str) -> anyhow::Result<Issued> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])?;
    leaf.distinguished_name.push(DnType::CommonName, "vgpu-dra-webhook");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(Issued { ca: ca_cert.pem(), cert: cert.pem(), key: key.serialize_pem() })
}

/// Writes `issued` as Secret [`EXTERNAL_SECRET`] of type `kubernetes.io/tls` with `ca.crt`, as
/// cert-manager does; `verb` is `create` or `replace`.
fn write_secret(plane: &ControlPlane, issued: &Issued, verb: &str) -> anyhow::Result<()> {
    let dir = plane.dir().join(format!("issued-{verb}"));
    std::fs::create_dir_all(&dir)?;
    let mut args = vec!["create".to_owned(), "secret".to_owned(), "generic".to_owned(), EXTERNAL_SECRET.to_owned()];
    for (key, text) in [("ca.crt", &issued.ca), ("tls.crt", &issued.cert), ("tls.key", &issued.key)] {
        std::fs::write(dir.join(key), text)?;
        args.push(format!("--from-file={key}={}", dir.join(key).display()));
    }
    args.extend(["--type=kubernetes.io/tls", "--dry-run=client", "-o", "json"].map(str::to_owned));
    args.push(format!("--namespace={NAMESPACE}"));
    let kubectl = plane.kubectl();
    let manifest = kubectl.run(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    kubectl.run_with_input(&[verb, "-f", "-"], Some(&manifest))?;
    Ok(())
}

/// The decoded text under `key` of Secret `name`.
fn secret_text(kubectl: &Kubectl, name: &str, key: &str) -> anyhow::Result<String> {
    let template = format!(r#"go-template={{{{index .data "{key}" | base64decode}}}}"#);
    kubectl.run(&["get", "secret", name, "-n", NAMESPACE, "-o", &template])
}

/// The registered `caBundle`, decoded.
fn ca_bundle(kubectl: &Kubectl) -> anyhow::Result<String> {
    let template = "go-template={{(index .webhooks 0).clientConfig.caBundle | base64decode}}";
    kubectl.run(&["get", "mutatingwebhookconfiguration", CONFIGURATION, "-o", template])
}

/// Whether a server-side dry run of [`POD`] comes back converted: the API server called the
/// webhook over TLS and trusted its certificate.
fn converted(kubectl: &Kubectl, webhook: &mut ManagedProcess) -> anyhow::Result<Option<()>> {
    webhook.check_running()?;
    let out = kubectl.run_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(POD))?;
    let pod: Value = serde_json::from_str(&out)?;
    Ok(pod["spec"]["resourceClaims"].is_array().then_some(()))
}

fn log_contains(process: &mut ManagedProcess, text: &str) -> anyhow::Result<Option<()>> {
    process.check_running()?;
    Ok(std::fs::read_to_string(process.log())?.contains(text).then_some(()))
}

#[test]
fn a_secret_from_another_issuer_is_served_and_reloaded_without_a_restart() {
    let plane = ControlPlane::start().expect("control plane");
    if let Err(e) = external_scenario(&plane) {
        panic!("{e:#}");
    }
}

fn external_scenario(plane: &ControlPlane) -> anyhow::Result<()> {
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    kubectl.apply(DEVICE_CLASS)?;
    kubectl.run(&["create", "namespace", NAMESPACE])?;
    let dirs = Dirs::new(plane.dir());
    let mut drv = driver(plane, &dirs, "driver");
    eventually("the node's slices", Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceslices"])?;
        Ok(list["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
    })?;

    let secret_flag = format!("--secret-name={EXTERNAL_SECRET}");
    let metrics_port = free_port()?;
    let metrics_flag = format!("--metrics-address=127.0.0.1:{metrics_port}");
    let flags = ["--certificate-source=secret", "--certificate-check-seconds=1", secret_flag.as_str(), metrics_flag.as_str()];
    let mut webhook = start_webhook(plane, plane.webhook_port(), &flags)?;
    // No Secret yet: it waits, saying for which, not ready, and registers nothing.
    eventually("the webhook waiting for its Secret", Duration::from_secs(30), || {
        log_contains(&mut webhook, "waiting for the certificate Secret")
    })?;
    let log = std::fs::read_to_string(webhook.log())?;
    assert!(log.contains(&format!("secret={NAMESPACE}/{EXTERNAL_SECRET}")), "which Secret:\n{log}");
    anyhow::ensure!(
        kubectl.run(&["get", "mutatingwebhookconfiguration", CONFIGURATION]).is_err(),
        "registered without a certificate"
    );
    let readyz = http_get(metrics_port, "/readyz")?;
    anyhow::ensure!(readyz.starts_with("HTTP/1.1 503") && readyz.contains("waiting for the certificate Secret"), "{readyz}");

    // The issuer writes a key that is not its certificate's: the webhook neither exits (a crash
    // loop) nor rewrites the issuer's Secret; it stays not ready and says why.
    let first = issue("first issuer CA")?;
    let other = issue("an unrelated CA")?;
    write_secret(plane, &Issued { key: other.key.clone(), ..first.clone() }, "create")?;
    eventually("not ready, saying the Secret is unusable", Duration::from_secs(30), || {
        webhook.check_running()?;
        let readyz = http_get(metrics_port, "/readyz")?;
        Ok((readyz.starts_with("HTTP/1.1 503") && readyz.contains("is not usable")).then_some(readyz))
    })?;
    let log = std::fs::read_to_string(webhook.log())?;
    assert!(log.contains("WARN") && log.contains("waiting for its issuer to fix it"), "{log}");
    anyhow::ensure!(kubectl.run(&["get", "mutatingwebhookconfiguration", CONFIGURATION]).is_err(), "registered an unusable key");

    write_secret(plane, &first, "replace")?;
    eventually("a pod converted through the first certificate", Duration::from_secs(60), || converted(&kubectl, &mut webhook))?;
    assert_eq!(ca_bundle(&kubectl)?, first.ca);
    anyhow::ensure!(http_get(metrics_port, "/readyz")?.starts_with("HTTP/1.1 200"), "ready once serving");

    // The issuer renews with another CA: within seconds the webhook registers it (first, and the
    // first CA beside it while still valid: another replica may still serve the first
    // certificate) and serves the new certificate, which the API server verifies.
    let second = issue("second issuer CA")?;
    write_secret(plane, &second, "replace")?;
    let both = format!("{}{}", second.ca, first.ca);
    eventually("the second CA registered", Duration::from_secs(10), || Ok((ca_bundle(&kubectl)? == both).then_some(())))?;
    eventually("a pod converted through the second certificate", Duration::from_secs(10), || converted(&kubectl, &mut webhook))?;
    eventually("the reload logged", Duration::from_secs(5), || {
        log_contains(&mut webhook, "serving the certificate now in the Secret")
    })?;
    let log = std::fs::read_to_string(webhook.log())?;
    assert_eq!(log.matches("admission webhook serving").count(), 1, "one start, no restart:\n{log}");

    // The Secret is the issuer's: the webhook never wrote it.
    let secret = kubectl.get_json(&["secret", EXTERNAL_SECRET, "-n", NAMESPACE, "--show-managed-fields"])?;
    let managers: Vec<&str> =
        secret["metadata"]["managedFields"].as_array().into_iter().flatten().filter_map(|f| f["manager"].as_str()).collect();
    assert!(managers.iter().all(|m| m.starts_with("kubectl")), "{managers:?}");
    assert_eq!(secret_text(&kubectl, EXTERNAL_SECRET, "tls.crt")?, second.cert);
    drv.check_running()?;
    Ok(())
}

/// Whether the first certificate of `pem` expires within `seconds`, as openssl sees it.
fn expires_within(pem: &str, seconds: u64) -> anyhow::Result<bool> {
    let mut child = Command::new("openssl")
        .args(["x509", "-noout", "-checkend", &seconds.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting openssl")?;
    child.stdin.take().context("openssl's stdin")?.write_all(pem.as_bytes())?;
    let out = child.wait_with_output()?;
    // 0: still valid `seconds` from now; 1: expired by then; anything else: it did not parse.
    match out.status.code() {
        Some(0) => Ok(false),
        Some(1) => Ok(true),
        _ => bail!("openssl x509 -checkend: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn a_self_signed_certificate_lives_as_long_as_the_validity_flag_says() {
    let plane = ControlPlane::start().expect("control plane");
    if let Err(e) = self_signed_scenario(&plane) {
        panic!("{e:#}");
    }
}

fn self_signed_scenario(plane: &ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    kubectl.run(&["create", "namespace", NAMESPACE])?;
    let mut webhook = start_webhook(plane, plane.webhook_port(), &["--certificate-validity-days=1"])?;
    eventually("the webhook registered", Duration::from_secs(60), || log_contains(&mut webhook, "admission webhook serving"))?;
    let ca = secret_text(&kubectl, SELF_SIGNED_SECRET, "ca.crt")?;
    assert_eq!(ca_bundle(&kubectl)?, ca);
    for key in ["tls.crt", "ca.crt"] {
        let pem = secret_text(&kubectl, SELF_SIGNED_SECRET, key)?;
        // A day from its making, give or take the minute this test took.
        assert!(expires_within(&pem, 86_400 + 60)?, "{key} outlives a day:\n{pem}");
        assert!(!expires_within(&pem, 86_400 - 600)?, "{key} expires well before a day:\n{pem}");
    }
    Ok(())
}

/// Creates HAMi pods through the API server, one after another, until stopped: what a cluster
/// of users does while the webhook's certificates change under it. Each pod is either converted
/// or counted as refused, with the API server's message.
struct PodStream {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl PodStream {
    fn start(kubectl: Kubectl) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut admitted, mut refused) = (0, Vec::new());
            for i in 0.. {
                if running.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let pod = POD.replace("name: hami-gpu,", &format!("name: stream-{i},"));
                match kubectl.run_with_input(&["create", "-o", "json", "-f", "-"], Some(&pod)) {
                    Ok(out) if serde_json::from_str::<Value>(&out).is_ok_and(|p| p["spec"]["resourceClaims"].is_array()) => {
                        admitted += 1;
                    }
                    Ok(out) => refused.push(format!("stream-{i} admitted unconverted: {out}")),
                    Err(e) => refused.push(format!("stream-{i}: {e:#}")),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (admitted, refused)
        });
        Self { stop, thread }
    }

    /// Stops the stream; how many pods were admitted, and every refusal.
    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap_or_else(|_| (0, vec!["the pod stream panicked".to_owned()]))
    }
}

/// How often `process`'s log says `text`.
fn log_count(process: &mut ManagedProcess, text: &str) -> anyhow::Result<usize> {
    process.check_running()?;
    Ok(std::fs::read_to_string(process.log())?.matches(text).count())
}

/// Two replicas share a self-signed Secret: `quick` checks it every second and cannot be reached
/// by the API server, `lagging` serves the registered URL and checks it every 20 s, as replicas
/// behind one Service whose checks fall apart. While HAMi pods keep coming:
/// - the Secret is deleted: `quick` makes a new CA and registers it, and `lagging` serves the
///   old certificate for up to 20 s more, which the registered caBundle must still trust;
/// - with `quick` gone, the Secret's key is replaced by one that is not its certificate's and a
///   replica starts: it replaces the Secret (warning why) instead of exiting, and `lagging`'s
///   certificate stays trusted.
///
/// No pod is refused.
#[test]
fn certificate_events_refuse_no_hami_pod() {
    let plane = ControlPlane::start().expect("control plane");
    if let Err(e) = events_scenario(&plane) {
        panic!("{e:#}");
    }
}

fn events_scenario(plane: &ControlPlane) -> anyhow::Result<()> {
    plane.create_node(NODE)?;
    let kubectl = plane.kubectl().clone();
    kubectl.apply(DEVICE_CLASS)?;
    kubectl.run(&["create", "namespace", NAMESPACE])?;
    let dirs = Dirs::new(plane.dir());
    let mut drv = driver(plane, &dirs, "driver");
    eventually("the node's slices", Duration::from_secs(30), || {
        let list = kubectl.get_json(&["resourceslices"])?;
        Ok(list["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
    })?;
    let url_port = plane.webhook_port();
    let replica = |name: &str, check: u64| -> anyhow::Result<ManagedProcess> {
        let flags = vec![format!("--certificate-check-seconds={check}")];
        webhook::spawn(plane, name, (free_port()?, url_port), NAMESPACE, &flags)
    };
    let mut lagging =
        webhook::spawn(plane, "lagging", (url_port, url_port), NAMESPACE, &["--certificate-check-seconds=20".to_owned()])?;
    eventually("the first replica converting", Duration::from_secs(60), || converted(&kubectl, &mut lagging))?;
    let mut quick = replica("quick", 1)?;
    eventually("the quick replica registered", Duration::from_secs(30), || {
        log_contains(&mut quick, "admission webhook serving")
    })?;
    let stream = PodStream::start(kubectl.clone());
    std::thread::sleep(Duration::from_secs(2));

    // 1. The Secret deleted while both serve.
    let old_ca = secret_text(&kubectl, SELF_SIGNED_SECRET, "ca.crt")?;
    kubectl.run(&["delete", "secret", SELF_SIGNED_SECRET, "-n", NAMESPACE])?;
    let new_ca = eventually("a new Secret made by the quick replica", Duration::from_secs(30), || {
        quick.check_running()?;
        Ok(secret_text(&kubectl, SELF_SIGNED_SECRET, "ca.crt").ok().filter(|ca| *ca != old_ca))
    })?;
    eventually("the new CA registered", Duration::from_secs(30), || Ok(ca_bundle(&kubectl)?.starts_with(&new_ca).then_some(())))?;
    // The lagging replica serves the old certificate until its next check, then the new one.
    let switches = log_count(&mut lagging, "serving the certificate now in the Secret")?;
    eventually("the lagging replica serving the new certificate", Duration::from_secs(40), || {
        Ok((log_count(&mut lagging, "serving the certificate now in the Secret")? > switches).then_some(()))
    })?;
    std::thread::sleep(Duration::from_secs(2));

    // 2. A corrupt key while a replica starts, nobody else fixing it.
    quick.stop();
    let stranger = issue("a stranger's CA")?;
    let patch = serde_json::json!({"data": {"tls.key": base64(stranger.key.as_bytes())}}).to_string();
    kubectl.run(&["patch", "secret", SELF_SIGNED_SECRET, "-n", NAMESPACE, "--type=merge", "-p", &patch])?;
    let mut starting = replica("starting", 1)?;
    eventually("the starting replica serving", Duration::from_secs(60), || {
        log_contains(&mut starting, "admission webhook serving")
    })?;
    let log = std::fs::read_to_string(starting.log())?;
    anyhow::ensure!(
        log.contains("WARN") && log.contains("its key is unreadable or does not match its certificate"),
        "the replacement is not explained:\n{log}"
    );
    // The lagging replica, still on the certificate of step 1, is trusted throughout.
    std::thread::sleep(Duration::from_secs(3));
    let (admitted, refused) = stream.finish();
    anyhow::ensure!(
        refused.is_empty(),
        "{} of {} HAMi pods refused:\n{}",
        refused.len(),
        admitted + refused.len(),
        refused.join("\n")
    );
    anyhow::ensure!(admitted >= 20, "only {admitted} pods were created across the events");
    eprintln!("{admitted} HAMi pods admitted across the certificate events, none refused");
    lagging.check_running()?;
    starting.check_running()?;
    drv.check_running()?;
    Ok(())
}

/// Standard base64 with padding (a Secret's data).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            out.push(if i <= chunk.len() { char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]) } else { '=' });
        }
    }
    out
}
