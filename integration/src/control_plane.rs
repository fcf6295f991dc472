//! A real control plane on loopback: etcd, kube-apiserver (DRA gates on), kube-scheduler and
//! kube-controller-manager (resource claim controller), with an admin token kubeconfig.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::pki::{ClientCa, write_cert_kubeconfig};
use crate::webhook_tls::path_str;
use crate::{Components, ManagedProcess, components, eventually, free_port};

/// The DRA features the tests rely on; beta and on by default in 1.36, named so a release that
/// changes a default fails loudly instead of silently testing something else.
pub(crate) const FEATURE_GATES: &str = "DRAConsumableCapacity=true,DRADeviceTaints=true,DRAPartitionableDevices=true,DRAExtendedResource=true,DRADeviceBindingConditions=true";
const ADMIN_TOKEN: &str = "vgpu-dra-test-admin-token";
/// The common name of the client certificate the API server presents to every webhook.
pub const WEBHOOK_CLIENT_NAME: &str = "vgpu-dra-test-apiserver";

/// How to start a [`ControlPlane`].
#[derive(Debug, Clone, Default)]
pub struct PlaneOptions {
    /// Write an audit log of every request (metadata only), for counting a client's requests.
    pub audit: bool,
    /// kube-apiserver's `--feature-gates` instead of the test bed's (which turn on everything the
    /// driver uses), to see what the driver does on a cluster without one of them.
    pub apiserver_feature_gates: Option<String>,
    /// Serve DeviceTaintRules (KEP-5055) and act on them: GA in 1.37; in 1.36 a beta gate that is
    /// off, with its API in `resource.k8s.io/v1beta2`, which is off too.
    pub device_taint_rules: bool,
    /// What installed workloads need of a cluster (`crate::pod_network`): the controllers of
    /// Deployments, ReplicaSets, DaemonSets, Jobs, EndpointSlices, PodDisruptionBudgets and the
    /// root CA ConfigMap; Services resolved to their endpoints; and the `cluster` egress (to pods
    /// and kubelets) through [`ControlPlane::egress_socket`], which a node with a pod network
    /// serves.
    pub pod_network: bool,
}

/// A running control plane; dropping it stops every process and removes its files.
pub struct ControlPlane {
    // Field order is drop order: clients first, etcd last.
    controller_manager: Option<ManagedProcess>,
    scheduler: Option<ManagedProcess>,
    apiserver: ManagedProcess,
    etcd: ManagedProcess,
    kubectl: Kubectl,
    server: String,
    client_ca: ClientCa,
    /// The CA of the client certificate the API server presents to webhooks.
    webhook_clients: ClientCa,
    /// The loopback port of the webhook URL it presents that certificate to.
    webhook_port: u16,
    /// The `cluster` egress's proxy socket, with [`PlaneOptions::pod_network`].
    egress_socket: Option<PathBuf>,
    dir: tempfile::TempDir,
    /// How long bring-up took.
    pub startup: Duration,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager and waits until the
    /// API server is ready.
    ///
    /// # Errors
    /// When a component is missing or does not come up in time (its log is quoted).
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&PlaneOptions::default())
    }

    /// [`ControlPlane::start`] with options.
    ///
    /// # Errors
    /// When a component is missing or does not come up in time (its log is quoted).
    pub fn start_with(options: &PlaneOptions) -> anyhow::Result<Self> {
        // The ports are picked free and then handed to the components, so another process (an
        // outgoing connection of a test running beside this one) can take one in between: a
        // bring-up that lost a port is made again on new ones.
        let mut attempt = 1;
        loop {
            match Self::start_once(options) {
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    eprintln!("control plane: a port was taken before its component bound it; starting again ({e:#})");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// One bring-up of [`ControlPlane::start_with`], on ports picked now.
    fn start_once(options: &PlaneOptions) -> anyhow::Result<Self> {
        let started = Instant::now();
        let bins = components()?;
        let gates = if options.device_taint_rules {
            format!("{FEATURE_GATES},DRADeviceTaintRules=true")
        } else {
            FEATURE_GATES.to_owned()
        };
        let dir = tempfile::Builder::new().prefix("vgpu-dra-cp-").tempdir()?;
        let d = dir.path();
        let sa_key = d.join("sa.key");
        let status = Command::new("openssl").args(["genrsa", "-out"]).arg(&sa_key).arg("2048").stderr(Stdio::null()).status()?;
        if !status.success() {
            bail!("openssl genrsa failed");
        }
        std::fs::write(d.join("tokens.csv"), format!("{ADMIN_TOKEN},admin,admin-uid,system:masters\n"))?;
        let webhook_port = free_port()?;
        let (webhook_clients, admission_config) = write_admission_config(d, webhook_port, options.pod_network)?;
        // Kubelets authenticate with client certificates as `system:node:<name>`, as in a
        // cluster, so that the Node authorizer and NodeRestriction judge them; the API server
        // presents one to the kubelets, which ask the API whether it may.
        let client_ca = ClientCa::new(&d.join("client-pki"), "vgpu-dra-test-client-ca")?;
        let (apiserver_cert, apiserver_key) =
            client_ca.issue("kube-apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")?;

        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = ManagedProcess::spawn(
            "etcd",
            &bins.etcd,
            &strings(&[
                "--name=default",
                &format!("--data-dir={}", d.join("etcd").display()),
                &format!("--listen-client-urls={etcd_url}"),
                &format!("--advertise-client-urls={etcd_url}"),
                &format!("--listen-peer-urls={peer_url}"),
                &format!("--initial-advertise-peer-urls={peer_url}"),
                &format!("--initial-cluster=default={peer_url}"),
                "--log-level=warn",
            ]),
            d,
        )?;
        let server = format!("https://127.0.0.1:{api_port}");
        let mut audit = Vec::new();
        if options.audit {
            // Metadata of each request once it is answered (a watch: once it starts).
            std::fs::write(
                d.join("audit-policy.yaml"),
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
            )?;
            audit.push(format!("--audit-policy-file={}", d.join("audit-policy.yaml").display()));
            audit.push(format!("--audit-log-path={}", d.join("audit.log").display()));
            audit.push("--audit-log-mode=blocking".to_owned());
        }
        let mut extra = audit;
        let egress_socket = options.pod_network.then(|| d.join("egress.sock"));
        if let Some(socket) = &egress_socket {
            std::fs::write(d.join("egress.yaml"), crate::pod_network::egress_selector_config(socket))?;
            extra.push(format!("--egress-selector-config-file={}", d.join("egress.yaml").display()));
            extra.push("--enable-aggregator-routing=true".to_owned());
        }
        let apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            &bins.kube_apiserver,
            &[
                strings(&[
                    &format!("--etcd-servers={etcd_url}"),
                    &format!("--secure-port={api_port}"),
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    &format!("--cert-dir={}", d.join("apiserver-certs").display()),
                    &format!("--token-auth-file={}", d.join("tokens.csv").display()),
                    &format!("--client-ca-file={}", client_ca.cert().display()),
                    &format!("--kubelet-client-certificate={}", apiserver_cert.display()),
                    &format!("--kubelet-client-key={}", apiserver_key.display()),
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    &format!("--service-account-key-file={}", sa_key.display()),
                    &format!("--service-account-signing-key-file={}", sa_key.display()),
                    "--service-cluster-ip-range=10.0.0.0/24",
                    &format!("--feature-gates={}", options.apiserver_feature_gates.as_deref().unwrap_or(&gates)),
                    if options.device_taint_rules {
                        "--runtime-config=resource.k8s.io/v1=true,resource.k8s.io/v1beta2=true"
                    } else {
                        "--runtime-config=resource.k8s.io/v1=true"
                    },
                    "--profiling=false",
                    // The kubernetes Service endpoint cannot be a loopback address; nothing needs it.
                    "--endpoint-reconciler-type=none",
                    // Every webhook it calls gets its client certificate.
                    &format!("--admission-control-config-file={}", admission_config.display()),
                ]),
                extra,
            ]
            .concat(),
            d,
        )?;
        let kubeconfig = d.join("admin.kubeconfig");
        write_kubeconfig(&kubeconfig, &server, ADMIN_TOKEN)?;
        let kubectl = Kubectl { bin: bins.kubectl.clone(), kubeconfig: kubeconfig.clone() };
        let mut plane = Self {
            controller_manager: None,
            scheduler: None,
            apiserver,
            etcd,
            kubectl,
            server,
            client_ca,
            webhook_clients,
            webhook_port,
            egress_socket,
            dir,
            startup: Duration::ZERO,
        };
        plane.wait_ready()?;
        let kc = format!("--kubeconfig={}", kubeconfig.display());
        plane.scheduler = Some(ManagedProcess::spawn(
            "kube-scheduler",
            &bins.kube_scheduler,
            &strings(&[&kc, "--leader-elect=false", "--secure-port=0", &format!("--feature-gates={gates}"), "--v=2"]),
            plane.dir.path(),
        )?);
        let mut controllers = "--controllers=resourceclaim-controller,serviceaccount-controller,garbage-collector-controller,namespace-controller,device-taint-eviction-controller".to_owned();
        if options.pod_network {
            controllers.push_str(",deployment-controller,replicaset-controller,daemonset-controller,job-controller,endpointslice-controller,disruption-controller,root-ca-certificate-publisher-controller");
            // The API server's own certificate stands for the cluster's CA (as `node` publishes it).
        }
        let root_ca = format!("--root-ca-file={}", plane.dir.path().join("apiserver-certs/apiserver.crt").display());
        plane.controller_manager = Some(ManagedProcess::spawn(
            "kube-controller-manager",
            &bins.kube_controller_manager,
            &strings(&[
                &kc,
                "--leader-elect=false",
                "--secure-port=0",
                &controllers,
                &format!("--feature-gates={gates}"),
                if options.pod_network { &root_ca } else { "--root-ca-file=" },
            ]),
            plane.dir.path(),
        )?);
        // Pods can only be created once the default service account exists.
        eventually("the default service account", Duration::from_secs(60), || {
            plane.check_processes()?;
            Ok(plane.kubectl.run(&["get", "serviceaccount", "default", "-o", "name"]).ok())
        })?;
        plane.startup = started.elapsed();
        eprintln!("control plane up in {:.1} s at {}", plane.startup.as_secs_f64(), plane.server);
        record_bring_up(plane.startup);
        Ok(plane)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Duration::from_secs(90);
        eventually("kube-apiserver /readyz", deadline, || {
            self.etcd.check_running()?;
            self.apiserver.check_running()?;
            Ok(self.kubectl.run(&["get", "--raw", "/readyz"]).ok().filter(|s| s.trim() == "ok"))
        })
        .map(|_| ())
    }

    /// Fails when a component has died, quoting its log.
    ///
    /// # Errors
    /// When any process of the plane has exited.
    pub fn check_processes(&mut self) -> anyhow::Result<()> {
        self.etcd.check_running()?;
        self.apiserver.check_running()?;
        for p in self.scheduler.iter_mut().chain(self.controller_manager.iter_mut()) {
            p.check_running()?;
        }
        Ok(())
    }

    /// kubectl against this plane as cluster admin.
    pub fn kubectl(&self) -> &Kubectl {
        &self.kubectl
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubectl.kubeconfig
    }

    /// The API server URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The CA whose client certificates the API server trusts (kubelets trust it for the API
    /// server's own).
    pub fn client_ca(&self) -> &ClientCa {
        &self.client_ca
    }

    /// A kubeconfig for the kubelet of node `name`: a client certificate of
    /// `system:node:<name>` in `system:nodes`.
    ///
    /// # Errors
    /// When the certificate or the file cannot be made.
    pub fn node_kubeconfig(&self, name: &str) -> anyhow::Result<PathBuf> {
        let (cert, key) = self.client_ca.issue(&format!("node-{name}"), &format!("system:node:{name}"), "system:nodes")?;
        let path = self.dir.path().join(format!("node-{name}.kubeconfig"));
        write_cert_kubeconfig(&path, &self.server, &cert, &key)?;
        Ok(path)
    }

    /// The audit log, when the plane was started with [`PlaneOptions::audit`].
    pub fn audit_log(&self) -> Option<PathBuf> {
        Some(self.dir.path().join("audit.log")).filter(|p| p.exists())
    }

    /// The API server's process id (benchmarks read its CPU time and memory from /proc).
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.pid()
    }

    /// The socket a node with a pod network serves the `cluster` egress on
    /// ([`PlaneOptions::pod_network`]).
    pub fn egress_socket(&self) -> Option<&Path> {
        self.egress_socket.as_deref()
    }

    /// A scratch directory that lives as long as the plane.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA (PEM file) of the client certificate the API server presents to the webhook at
    /// `https://127.0.0.1:<`[`ControlPlane::webhook_port`]`>`, of common name
    /// [`WEBHOOK_CLIENT_NAME`]: what `--client-ca-file` names.
    pub fn webhook_client_ca(&self) -> PathBuf {
        self.webhook_clients.cert()
    }

    /// The loopback port of the one webhook URL the API server presents its client certificate
    /// to (vgpu-dra's, on the test bed). Other webhooks (Kueue's, Volcano's) get none: Volcano's
    /// server checks a certificate it is given against the system's roots.
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// Another client certificate (certificate and key files) of that CA, with common name `name`.
    ///
    /// # Errors
    /// When openssl fails.
    pub fn issue_webhook_client_certificate(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        self.webhook_clients.issue(&format!("other-{name}"), name, "vgpu-dra-test")
    }

    /// The binaries this plane runs.
    pub fn components(&self) -> &'static Components {
        components().unwrap_or_else(|_| unreachable!("started, so found"))
    }

    /// Freezes kube-apiserver (SIGSTOP) until the returned guard is dropped: the server keeps its
    /// port and the kernel still accepts connections, but nothing is answered, as with a hung
    /// server. Nothing that needs the API works meanwhile, teardown included, so keep the guard's
    /// scope short.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn freeze_apiserver(&self) -> anyhow::Result<FrozenApiServer<'_>> {
        self.apiserver.signal("STOP")?;
        Ok(FrozenApiServer { apiserver: &self.apiserver })
    }

    /// Waits until the scheduler has allocated claim `namespace/name` and returns its first
    /// device result (`driver`, `pool`, `device`, `shareID`, `consumedCapacity`).
    ///
    /// # Errors
    /// When no allocation appears in `timeout` or a component died meanwhile.
    pub fn wait_allocated(&mut self, namespace: &str, name: &str, timeout: Duration) -> anyhow::Result<Value> {
        let kubectl = self.kubectl.clone();
        eventually(&format!("claim {namespace}/{name} allocated"), timeout, || {
            self.check_processes()?;
            let claim = kubectl.get_json(&["resourceclaim", name, "-n", namespace])?;
            Ok(claim["status"]["allocation"]["devices"]["results"].get(0).cloned())
        })
    }

    /// Creates a Node that the scheduler considers ready and schedulable, and returns its UID.
    ///
    /// # Errors
    /// When the API refuses it.
    pub fn create_node(&self, name: &str) -> anyhow::Result<String> {
        self.kubectl.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/hostname: {name}\n    gpu: \"on\"\n"
        ))?;
        let status = serde_json::json!({"status": {
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node",
                            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }});
        self.kubectl.run(&["patch", "node", name, "--subresource=status", "--type=merge", "-p", &status.to_string()])?;
        // Admission taints new nodes not-ready; no node lifecycle controller runs to lift it.
        self.kubectl.run(&["patch", "node", name, "--type=merge", "-p", r#"{"spec":{"taints":null}}"#])?;
        let uid = self.kubectl.run(&["get", "node", name, "-o", "jsonpath={.metadata.uid}"])?;
        Ok(uid.trim().to_owned())
    }
}

/// A frozen kube-apiserver ([`ControlPlane::freeze_apiserver`]); dropping it lets the server run
/// again (SIGCONT), also when the test panics.
pub struct FrozenApiServer<'a> {
    apiserver: &'a ManagedProcess,
}

impl FrozenApiServer<'_> {
    /// Lets the server run again.
    pub fn thaw(self) {}
}

impl Drop for FrozenApiServer<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.apiserver.signal("CONT") {
            eprintln!("thawing kube-apiserver: {e:#}");
        }
    }
}

/// Appends the bring-up time to `target/test-bed-timings.log`, which `scripts/test.sh` prints
/// after the run (libtest captures what tests print).
fn record_bring_up(took: Duration) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-bed-timings.log");
    let test = std::thread::current().name().unwrap_or("?").to_owned();
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "control plane bring-up {:.1} s ({test})", took.as_secs_f64());
    }
}

/// Writes the API server's admission configuration under `dir`: the webhook admission plugins
/// present a client certificate (common name [`WEBHOOK_CLIENT_NAME`], of a CA made here for
/// webhook clients only) to the webhook at `127.0.0.1:<webhook_port>` (kubeconfig user of that
/// name), and none to others. The CA, and the configuration's path.
///
/// The files are those docs/security.md shows, in `<dir>/admission/` for
/// `/etc/kubernetes/admission/` and with the URL's `host:port` for the Service's name
/// (`integration/tests/docs.rs` compares them).
/// With `service_webhooks`, the certificate also goes to every webhook behind a Service (an
/// installed chart's, `<service>.<namespace>.svc`, which `*.svc` matches), not only to the
/// loopback URL; never to the other URLs (Volcano's webhook refuses a client certificate it
/// did not sign).
fn write_admission_config(dir: &Path, webhook_port: u16, service_webhooks: bool) -> anyhow::Result<(ClientCa, PathBuf)> {
    let admission = dir.join("admission");
    let clients = ClientCa::new(&admission, "vgpu-dra-test-webhook-client-ca")?;
    let (cert, key) = clients.issue("webhook-client", WEBHOOK_CLIENT_NAME, "vgpu-dra-test")?;
    let kubeconfig = admission.join("webhook-client.kubeconfig");
    let user = |name: &str| -> anyhow::Result<String> {
        Ok(format!(
            "- name: {name}\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            path_str(&cert)?,
            path_str(&key)?
        ))
    };
    let mut users = user(&format!("127.0.0.1:{webhook_port}"))?;
    if service_webhooks {
        users.push_str(&user("'*.svc'")?);
    }
    std::fs::write(&kubeconfig, format!("apiVersion: v1\nkind: Config\nusers:\n{users}"))?;
    let plugin = |name: &str| -> anyhow::Result<String> {
        Ok(format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            path_str(&kubeconfig)?
        ))
    };
    let config = admission.join("admission-config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
            plugin("ValidatingAdmissionWebhook")?,
            plugin("MutatingAdmissionWebhook")?
        ),
    )?;
    Ok((clients, config))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// Writes a kubeconfig that authenticates with a bearer token (the serving cert is self-signed).
///
/// # Errors
/// When the file cannot be written.
pub fn write_kubeconfig(path: &Path, server: &str, token: &str) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\n\
users:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: user\ncurrent-context: test\n"
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// kubectl bound to one kubeconfig.
#[derive(Debug, Clone)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// kubectl with another kubeconfig (another identity).
    pub fn with_kubeconfig(&self, kubeconfig: PathBuf) -> Self {
        Self { bin: self.bin.clone(), kubeconfig }
    }

    /// Runs kubectl and returns stdout.
    ///
    /// # Errors
    /// When kubectl exits non-zero (its stderr is the message).
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        self.run_with_input(args, None)
    }

    /// Runs kubectl with `input` on stdin.
    ///
    /// # Errors
    /// When kubectl exits non-zero (its stderr is the message).
    pub fn run_with_input(&self, args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display())).args(args);
        cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().context("starting kubectl")?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// `kubectl apply --server-side -f -`.
    ///
    /// # Errors
    /// When the API refuses the objects.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        self.run_with_input(&["apply", "--server-side", "--field-manager=vgpu-dra-test", "-f", "-"], Some(yaml))
    }

    /// `kubectl get ... -o json`, parsed.
    ///
    /// # Errors
    /// When the object does not exist or the output is not JSON.
    pub fn get_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut full = vec!["get"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", "json"]);
        Ok(serde_json::from_str(&self.run(&full)?)?)
    }

    /// Waits until every CustomResourceDefinition is Established. `kubectl wait` is not used: it
    /// fails at once, instead of waiting, on a CRD applied a moment ago that has no conditions yet.
    ///
    /// # Errors
    /// When they are not all established within `timeout`.
    pub fn wait_crds_established(&self, timeout: std::time::Duration) -> anyhow::Result<()> {
        crate::eventually("the CRDs established", timeout, || {
            let list = self.get_json(&["crd"])?;
            let all = list["items"].as_array().into_iter().flatten().all(|crd| {
                crd["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Established" && c["status"] == "True"))
            });
            Ok(all.then_some(()))
        })
    }
}
