//! The Helm chart on the test bed: lint and schema with the test bed's helm, the rendered objects
//! accepted by the real API server, the driver running with exactly the DaemonSet's arguments and
//! the chart's RBAC, its DeviceClass selecting our slices in a real allocation, and the
//! ValidatingAdmissionPolicy refusing writes to another node's slices in the API server's own
//! admission; and the HAMi compatibility webhook run with exactly its Deployment's arguments and
//! its own least-privilege RBAC, registering itself and converting a HAMi pod.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use anyhow::Context;
use common::chart::{
    chart_dir, client_auth_sets, container_args, daemonset_token, dry_run, find, helm, registration_job, run_as_daemonset_pod,
    run_as_webhook_pod, run_registration_job,
};
use common::{DRIVER, claim_and_pod_on};
use vgpu_dra_integration::{ControlPlane, Kubectl, eventually};

const NS: &str = "vgpu-dra";

fn slice_yaml(name: &str, node: &str, driver: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: {name}}}\n\
spec: {{driver: {driver}, nodeName: {node}, pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}, devices: []}}\n"
    )
}

fn refused(result: anyhow::Result<String>, wants: &[&str]) {
    let err = format!("{:#}", result.expect_err("the API server accepted a write the policy forbids"));
    for want in wants {
        assert!(err.contains(want), "refusal lacks {want:?}: {err}");
    }
}

/// The image every install names: the one the user built and pushed.
const IMAGE: &str = "image.repository=registry.example.com/vgpu-dra";

/// `helm <args> --set <IMAGE> <client auth> <sets>`: an install as the README writes it.
fn helm_with(plane: &ControlPlane, args: &[&str], sets: &[&str]) -> anyhow::Result<String> {
    let auth = client_auth_sets(plane);
    let mut full: Vec<&str> = args.to_vec();
    full.extend(["--set", IMAGE]);
    full.extend(auth.iter().map(String::as_str));
    for set in sets {
        full.extend(["--set", set]);
    }
    helm(plane, &full)
}

#[test]
fn chart_lints_and_refuses_bad_values() {
    let plane = ControlPlane::start().expect("control plane");
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let all = format!("{chart}/ci/all-values.yaml");
    // No image is published, so every install names one (README); without it the install fails
    // with a message that says what to do.
    helm_with(&plane, &["lint", "--strict", chart], &[]).unwrap();
    helm(&plane, &["lint", "--strict", chart, "-f", &all]).unwrap();
    let err = helm(&plane, &["template", "x", chart]).expect_err("an install without an image");
    assert!(format!("{err:#}").contains("image.repository is empty: build the image"), "{err:#}");
    // Nor without saying who may call the webhook: the API server's client CA, or the opt-out.
    let err = helm(&plane, &["template", "x", chart, "--set", IMAGE]).expect_err("an install without the client CA");
    let err = format!("{err:#}");
    assert!(err.contains("webhook.clientAuth.caBundle is empty") && err.contains("webhook.clientAuth.enabled=false"), "{err}");
    // A wrong value fails at install time with the value's path in the message.
    for (set, wants) in [
        ("deviceSplitCount=0", "/deviceSplitCount"),
        ("logLevel=loud", "/logLevel"),
        ("driverName=Not_A_Name", "/driverName"),
        ("metrics.port=70000", "/metrics/port"),
        ("deviceMemoryScaling=-1", "/deviceMemoryScaling"),
        ("hamiCore.hostPath=relative/dir", "/hamiCore/hostPath"),
        ("devicesplitcount=4", "devicesplitcount"),
        ("webhook.timeoutSeconds=31", "/webhook/timeoutSeconds"),
        ("webhook.replicas=0", "/webhook/replicas"),
        ("webhook.port=0", "/webhook/port"),
        ("webhook.excludedNamespaces={Bad_NS}", "/webhook/excludedNamespaces/0"),
        ("webhook.certificate.validityDays=0", "/webhook/certificate/validityDays"),
        ("webhook.certificate.checkSeconds=1", "/webhook/certificate/checkSeconds"),
        ("webhook.certManager.enabled=yes", "/webhook/certManager/enabled"),
        ("webhook.certManager.issuerRef.name=corp-ca", "/webhook/certManager/issuerRef"),
        ("webhook.clientAuth.enabled=yes", "/webhook/clientAuth/enabled"),
        ("webhook.clientAuth.names={kube-apiserver,kube-apiserver}", "/webhook/clientAuth/names"),
        ("webhook.clientAuth.names={with blank}", "/webhook/clientAuth/names/0"),
        ("webhook.volcano.cpuRequest=lots", "/webhook/volcano/cpuRequest"),
        ("webhook.volcano.schedulerNames={a,b,a}", "/webhook/volcano/schedulerNames"),
        ("devicePlugin.enabled=maybe", "/devicePlugin/enabled"),
        ("devicePlugin.deviceSplitCount=4", "deviceSplitCount"),
        ("hami-dra.drivers.nvidia.containerDriver=maybe", "/hami-dra/drivers/nvidia/containerDriver"),
        ("hami-dra.scheduler.enabled=true", "scheduler"),
        ("nvidiaDriverRoot=run/nvidia", "/nvidiaDriverRoot"),
        ("extendedResourceName=gpu", "/extendedResourceName"),
        ("migDeviceClassName=Not_A_Class", "migDeviceClassName"),
        ("dynamicMig.mode=on", "/dynamicMig/mode"),
        ("dynamicMig.instanceSharing=yes", "/dynamicMig/instanceSharing"),
    ] {
        let err = helm_with(&plane, &["template", "x", chart], &[set]).expect_err(set);
        assert!(format!("{err:#}").contains(wants), "--set {set}: {err:#}");
    }
    let err = helm(&plane, &["template", "x", chart, "--set", IMAGE, "--set", "webhook.clientAuth.caBundle=not-a-certificate"])
        .expect_err("a client CA that is no certificate");
    assert!(format!("{err:#}").contains("/webhook/clientAuth/caBundle"), "{err:#}");
    // dra.enabled=false installs nothing (HAMi's device-plugin mode is not ours to run), and
    // needs no client CA.
    let off = helm(&plane, &["template", "x", chart, "--set", IMAGE, "--set", "dra.enabled=false"]).unwrap();
    assert!(!off.contains("kind:"), "{off}");
    // The webhook is on by default, with the driver only, and can be left out (then no client
    // CA is asked for).
    let on = helm_with(&plane, &["template", "x", chart], &[]).unwrap();
    assert!(on.contains("name: x-vgpu-dra-webhook\n") && on.contains("kind: PodDisruptionBudget"), "{on}");
    assert!(on.contains("--client-ca-file=") && on.contains("name: x-vgpu-dra-webhook-client-ca"), "{on}");
    // The registration Job is named by what it registers: another device configuration, flag or
    // image runs a new one (a Job's pod template cannot change).
    let job = |rendered: &str| {
        rendered.split("kind: Job\nmetadata:\n  name: ").nth(1).and_then(|r| r.lines().next()).map(str::to_owned)
    };
    let first = job(&on).expect("a registration Job");
    assert!(first.starts_with("x-vgpu-dra-webhook-registrar-"), "{first}");
    assert_eq!(job(&helm_with(&plane, &["template", "x", chart], &[]).unwrap()), Some(first.clone()), "stable");
    for other in [
        "webhook.excludedNamespaces={kube-system,monitoring}",
        "deviceSplitCount=4",
        "image.tag=other",
        "webhook.timeoutSeconds=5",
    ] {
        let again = job(&helm_with(&plane, &["template", "x", chart], &[other]).unwrap());
        assert!(again.is_some() && again != Some(first.clone()), "{other}: {again:?}");
    }
    // The driver gets CAP_SYS_ADMIN and the runtime's MIG capabilities only with dynamic MIG on.
    let driver_container = |rendered: &str| rendered.split("kind: DaemonSet").nth(1).unwrap_or_default().to_owned();
    let plain = driver_container(&on);
    assert!(
        plain.contains("--dynamic-mig=off") && !plain.contains("SYS_ADMIN") && !plain.contains("NVIDIA_MIG_CONFIG_DEVICES"),
        "{plain}"
    );
    let mig = driver_container(&helm_with(&plane, &["template", "x", chart], &["dynamicMig.mode=listed"]).unwrap());
    assert!(mig.contains("--dynamic-mig=listed") && mig.contains("add: [\"SYS_ADMIN\"]"), "{mig}");
    assert!(mig.contains("name: NVIDIA_MIG_CONFIG_DEVICES") && mig.contains("name: NVIDIA_MIG_MONITOR_DEVICES"), "{mig}");
    let no_webhook = helm(&plane, &["template", "x", chart, "--set", IMAGE, "--set", "webhook.enabled=false"]).unwrap();
    assert!(!no_webhook.contains("webhook"), "{no_webhook}");
    assert!(no_webhook.contains("kind: DaemonSet"), "{no_webhook}");
    // The explicit opt-out: no client CA asked for or mounted, and the notes warn.
    let open = helm(&plane, &["template", "x", chart, "--set", IMAGE, "--set", "webhook.clientAuth.enabled=false"]).unwrap();
    assert!(open.contains("kind: Deployment") && !open.contains("--client-ca-file") && !open.contains("-client-ca\n"), "{open}");
    let off =
        helm(&plane, &["template", "x", chart, "--set", IMAGE, "--set", "dra.enabled=false", "--set", "webhook.enabled=true"])
            .unwrap();
    assert!(!off.contains("kind:"), "{off}");
    // HAMi's device-plugin mode is refused at render time with what to do, whatever else is set.
    for extra in ["dra.enabled=true", "dra.enabled=false"] {
        let err = helm_with(&plane, &["template", "x", chart], &[extra, "devicePlugin.enabled=true"])
            .expect_err("devicePlugin.enabled=true");
        let err = format!("{err:#}");
        assert!(
            err.contains("vgpu-dra has no device-plugin mode") && err.contains("drop --set devicePlugin.enabled=true"),
            "{err}"
        );
    }
}

/// Permissive stand-ins for cert-manager's Issuer and Certificate kinds, which the test bed has
/// not: they let the API server take and return the chart's cert-manager objects (as JSON) but
/// check nothing in them.
const CERT_MANAGER_STAND_INS: &str = r"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: issuers.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {plural: issuers, singular: issuer, kind: Issuer, listKind: IssuerList}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: certificates.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {plural: certificates, singular: certificate, kind: Certificate, listKind: CertificateList}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
";

/// `helm template <release> -n <namespace>` of the chart with the image, the client CA and `sets`.
fn template(plane: &ControlPlane, release: &str, namespace: &str, sets: &[&str]) -> anyhow::Result<String> {
    let chart = chart_dir();
    helm_with(plane, &["template", release, chart.to_str().unwrap(), "-n", namespace], sets)
}

#[test]
fn chart_takes_hamis_install_line_and_the_webhook_values() {
    let plane = ControlPlane::start().expect("control plane");
    if let Err(e) = install_keys(&plane) {
        panic!("{e:#}");
    }
}

fn install_keys(plane: &ControlPlane) -> anyhow::Result<()> {
    // HAMi's install line (source document 003), host-installed driver: rendered, and every object
    // accepted by the API server.
    let hami_line = ["dra.enabled=true", "devicePlugin.enabled=false", "hami-dra.drivers.nvidia.containerDriver=false"];
    let objects = dry_run(plane, &template(plane, "hami", "default", &hami_line)?)?;
    for (kind, name) in [
        ("DaemonSet", "hami-vgpu-dra"),
        ("Deployment", "hami-vgpu-dra-webhook"),
        ("DeviceClass", DRIVER),
        ("ClusterRole", "hami-vgpu-dra-webhook"),
    ] {
        find(&objects, kind, name)?;
    }
    let ds = find(&objects, "DaemonSet", "hami-vgpu-dra")?;
    let args = container_args(ds);
    anyhow::ensure!(args.contains(&"--dev-root=/dev".to_owned()), "host driver: {args:?}");
    // Volcano's pods keep a request Volcano counts (docs/volcano.md).
    let args = container_args(find(&objects, "Deployment", "hami-vgpu-dra-webhook")?);
    for want in ["--volcano-scheduler-names=volcano", "--volcano-cpu-request=1m"] {
        anyhow::ensure!(args.contains(&want.to_owned()), "webhook: {want} missing from {args:?}");
    }

    // The driver root: the host's by default and for containerDriver=false; the GPU Operator's
    // driver container's for true, its parent mounted so a driver container that starts later is
    // seen; nvidiaDriverRoot wins over both.
    let volume = |spec: &serde_json::Value| {
        spec["volumes"].as_array().and_then(|v| v.iter().find(|v| v["name"] == "driver-root").cloned())
    };
    for (sets, dev_root, mount) in [
        (&[][..], "/dev", None),
        (&["hami-dra.drivers.nvidia.containerDriver=false"], "/dev", None),
        (&["hami-dra.drivers.nvidia.containerDriver=true"], "/run/nvidia/driver/dev", Some("/run/nvidia")),
        (&["hami-dra.drivers.nvidia.containerDriver=true", "nvidiaDriverRoot=/"], "/dev", None),
        (
            &["hami-dra.drivers.nvidia.containerDriver=false", "nvidiaDriverRoot=/opt/drivers/nvidia"],
            "/opt/drivers/nvidia/dev",
            Some("/opt/drivers"),
        ),
    ] {
        let objects = dry_run(plane, &template(plane, "x", "default", sets)?)?;
        let ds = find(&objects, "DaemonSet", "x-vgpu-dra")?;
        let (args, spec) = (container_args(ds), &ds["spec"]["template"]["spec"]);
        anyhow::ensure!(args.contains(&format!("--dev-root={dev_root}")), "{sets:?}: {args:?}");
        match mount {
            None => anyhow::ensure!(volume(spec).is_none(), "{sets:?} mounts {:?}", volume(spec)),
            Some(path) => {
                let v = volume(spec).with_context(|| format!("{sets:?}: no driver-root volume"))?;
                anyhow::ensure!(v["hostPath"]["path"] == path, "{sets:?}: {v}");
                let mounts = &spec["containers"][0]["volumeMounts"];
                let mount = mounts.as_array().and_then(|m| m.iter().find(|m| m["name"] == "driver-root"));
                anyhow::ensure!(
                    mount.is_some_and(|m| m["mountPath"] == path
                        && m["mountPropagation"] == "HostToContainer"
                        && m["readOnly"] == true),
                    "{sets:?}: {mounts}"
                );
            }
        }
    }

    // extendedResourceName on the DeviceClass: HAMi's nvidia.com/gpu by default, none with "".
    let class = |sets: &[&str]| -> anyhow::Result<serde_json::Value> {
        Ok(find(&dry_run(plane, &template(plane, "x", "default", sets)?)?, "DeviceClass", DRIVER)?["spec"].clone())
    };
    let spec = class(&[])?;
    anyhow::ensure!(spec["extendedResourceName"] == "nvidia.com/gpu", "{spec}");
    let spec = class(&["extendedResourceName="])?;
    anyhow::ensure!(spec.get("extendedResourceName").is_none(), "{spec}");

    cert_manager(plane)
}

/// cert-manager issues the webhook's certificate: the chart's Issuers and Certificates (or only
/// the serving one from the user's issuer), the webhook reading the Secret, which it may no
/// longer create or update.
fn cert_manager(plane: &ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl();
    kubectl.apply(CERT_MANAGER_STAND_INS)?;
    kubectl.wait_crds_established(Duration::from_secs(60))?;
    kubectl.run(&["create", "namespace", "certs"])?;
    let rendered = template(plane, "cm", "certs", &["webhook.certManager.enabled=true", "webhook.certificate.validityDays=30"])?;
    let objects = dry_run(plane, &rendered)?;
    let name = "cm-vgpu-dra-webhook";
    let mut kinds: Vec<String> = objects
        .iter()
        .filter(|o| o["apiVersion"] == "cert-manager.io/v1")
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap_or_default(), o["metadata"]["name"].as_str().unwrap_or_default()))
        .collect();
    kinds.sort();
    let want = [
        format!("Certificate/{name}"),
        format!("Certificate/{name}-ca"),
        format!("Issuer/{name}-ca"),
        format!("Issuer/{name}-selfsigned"),
    ];
    anyhow::ensure!(kinds == want, "cert-manager objects {kinds:?}");
    let ca = find(&objects, "Certificate", &format!("{name}-ca"))?;
    anyhow::ensure!(ca["spec"]["isCA"] == true && ca["spec"]["issuerRef"]["name"] == format!("{name}-selfsigned"), "{ca}");
    let ca_issuer = find(&objects, "Issuer", &format!("{name}-ca"))?;
    anyhow::ensure!(ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"], "{ca_issuer}");
    let serving = find(&objects, "Certificate", name)?;
    let deploy = find(&objects, "Deployment", name)?;
    let args = container_args(deploy);
    // Written where the webhook reads it, for every name of its Service.
    anyhow::ensure!(
        args.contains(&format!("--secret-name={}", serving["spec"]["secretName"].as_str().unwrap_or("?"))),
        "{args:?} {serving}"
    );
    let service = find(&objects, "Service", name)?;
    anyhow::ensure!(service["metadata"]["namespace"] == "certs", "{service}");
    let dns = serving["spec"]["dnsNames"].clone();
    anyhow::ensure!(
        dns == serde_json::json!([
            name,
            format!("{name}.certs"),
            format!("{name}.certs.svc"),
            format!("{name}.certs.svc.cluster.local")
        ]),
        "dnsNames {dns}"
    );
    anyhow::ensure!(
        serving["spec"]["issuerRef"]
            == serde_json::json!({"name": format!("{name}-ca"), "kind": "Issuer", "group": "cert-manager.io"}),
        "{serving}"
    );
    anyhow::ensure!(serving["spec"]["duration"] == "720h", "{serving}");
    anyhow::ensure!(args.contains(&"--certificate-source=secret".to_owned()), "{args:?}");
    anyhow::ensure!(!args.iter().any(|a| a.starts_with("--certificate-validity-days")), "{args:?}");

    // The webhook's RBAC, as the API server decides it: get on its one Secret, nothing more.
    kubectl.apply(&rendered)?;
    let may = |args: &[&str]| {
        let user = format!("--as=system:serviceaccount:certs:{name}");
        let mut full = vec!["auth", "can-i", "-q", &user];
        full.extend_from_slice(args);
        kubectl.run(&full).is_ok()
    };
    let secret = format!("secrets/{name}-tls");
    anyhow::ensure!(may(&["get", &secret, "-n", "certs"]), "the webhook may not read its Secret");
    for denied in
        [&["create", "secrets", "-n", "certs"][..], &["update", &secret, "-n", "certs"], &["patch", &secret, "-n", "certs"]]
    {
        anyhow::ensure!(!may(denied), "with cert-manager the webhook may {denied:?}");
    }

    // The user's issuer: the serving Certificate only, from it.
    let user_issuer = [
        "webhook.certManager.enabled=true",
        "webhook.certManager.issuerRef.name=corp-ca",
        "webhook.certManager.issuerRef.kind=ClusterIssuer",
    ];
    let objects = dry_run(plane, &template(plane, "cm", "certs", &user_issuer)?)?;
    let cm: Vec<&serde_json::Value> = objects.iter().filter(|o| o["apiVersion"] == "cert-manager.io/v1").collect();
    anyhow::ensure!(cm.len() == 1 && cm[0]["kind"] == "Certificate", "{cm:?}");
    anyhow::ensure!(
        cm[0]["spec"]["issuerRef"] == serde_json::json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}),
        "{}",
        cm[0]["spec"]
    );
    Ok(())
}

#[test]
fn chart_installs_and_confines_the_driver_to_its_node() {
    let mut plane = ControlPlane::start().expect("control plane");
    if let Err(e) = scenario(&mut plane) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    for node in ["node-a", "node-b"] {
        plane.create_node(node)?;
    }

    // Every option set: the objects are valid to the real API server.
    kubectl.run(&["create", "namespace", "vgpu-dra-full"])?;
    let full = helm(plane, &["template", "full", chart, "-n", "vgpu-dra-full", "-f", &format!("{chart}/ci/all-values.yaml")])?;
    kubectl.apply(&full)?;
    let ds = kubectl.get_json(&["daemonset", "full-vgpu-dra", "-n", "vgpu-dra-full"])?;
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for want in [
        "--hami-core-dir=/opt/hami/vgpu",
        "--kubelet-dir=/var/lib/k0s/kubelet",
        "--mock-gpus=2xTesla T4:15Gi",
        // nvidiaDriverRoot wins over hami-dra.drivers.nvidia.containerDriver.
        "--dev-root=/opt/nvidia/driver/dev",
        "--pod-watch=true",
    ] {
        anyhow::ensure!(args.contains(want), "DaemonSet args lack {want}: {args}");
    }
    // With the pod watch the role lists and watches pods (a role cannot narrow that to a node).
    let pod_verbs = |role: &str| -> anyhow::Result<Vec<serde_json::Value>> {
        let role = kubectl.get_json(&["clusterrole", role])?;
        Ok(role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["resources"].as_array().is_some_and(|res| res.iter().any(|x| x == "pods")))
            .flat_map(|r| r["verbs"].as_array().into_iter().flatten().cloned())
            .collect())
    };
    let verbs = pod_verbs("full-vgpu-dra")?;
    anyhow::ensure!(verbs == ["get", "list", "watch"], "podWatch=true gives pod verbs {verbs:?}");
    let webhook = kubectl.get_json(&["deployment", "full-vgpu-dra-webhook", "-n", "vgpu-dra-full"])?;
    let args = webhook["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for want in [
        "--listen=0.0.0.0:10443",
        "--device-class=shared-gpu.example.com",
        "--driver-name=vgpu.example.com",
        "--timeout-seconds=5",
        "--excluded-namespaces=kube-system,monitoring",
        "--registration=ca-bundle",
        "--client-ca-file=/etc/vgpu-dra-webhook/client-ca/ca.crt",
        "--client-name=kube-apiserver,apiserver-webhook-client.example.com",
        "--certificate-source=self-signed",
        "--certificate-validity-days=90",
        "--certificate-check-seconds=60",
    ] {
        anyhow::ensure!(args.contains(want), "webhook Deployment args lack {want}: {args}");
    }
    // The registration Job owns the registration to the webhook's ClusterRole.
    let job = registration_job(plane, "vgpu-dra-full", "full")?;
    let args = container_args(&job);
    for want in
        ["--registration=registrar", "--owner-cluster-role=full-vgpu-dra-webhook", "--excluded-namespaces=kube-system,monitoring"]
    {
        anyhow::ensure!(args.iter().any(|a| a == want), "registration Job args lack {want}: {args:?}");
    }
    let class = kubectl.get_json(&["deviceclass", "shared-gpu.example.com"])?;
    anyhow::ensure!(class["spec"]["extendedResourceName"] == "example.com/shared-gpu", "{}", class["spec"]);

    // The defaults, the way the issue and the docs install it.
    kubectl.run(&["create", "namespace", NS])?;
    let rendered = template(plane, "vgpu-dra", NS, &[])?;
    kubectl.apply(&rendered)?;
    // Least privilege by default: no pod watch, so the role reads single pods only.
    let verbs = pod_verbs("vgpu-dra")?;
    anyhow::ensure!(verbs == ["get"], "the default gives pod verbs {verbs:?}");
    let class = kubectl.get_json(&["deviceclass", DRIVER])?;
    anyhow::ensure!(class["spec"]["selectors"][0]["cel"]["expression"].as_str().is_some_and(|e| e.contains("hami-gpu")));
    // HAMi's own class has it: the scheduler serves a bare nvidia.com/gpu the webhook did not see.
    anyhow::ensure!(class["spec"]["extendedResourceName"] == "nvidia.com/gpu", "{}", class["spec"]);

    // The driver as the DaemonSet runs it on node-a, with the service account's RBAC only.
    let mut pod = run_as_daemonset_pod(plane, NS, "vgpu-dra", "node-a", &["--mock-gpus=1xTesla T4:15Gi"])?;
    let as_driver = kubectl.with_kubeconfig(pod.kubeconfig.clone());
    eventually("node-a's slice published with the chart's RBAC", Duration::from_secs(30), || {
        pod.process.check_running()?;
        let list = kubectl.get_json(&["resourceslices", "--field-selector=spec.nodeName=node-a"])?;
        Ok(list["items"].as_array().and_then(|i| i.first().cloned()))
    })?;

    // The chart's DeviceClass selects the slice in a real allocation by the scheduler.
    kubectl.apply(&claim_and_pod_on("share", "node-a", "4Gi", "50"))?;
    let result = plane.wait_allocated("default", "share", Duration::from_secs(30))?;
    assert_eq!(result["device"], "hami-gpu-0");
    assert_eq!(result["pool"], "node-a");
    assert_eq!(result["consumedCapacity"]["memory"], "4Gi");
    assert_eq!(result["consumedCapacity"]["cores"], "50");

    // Least privilege: nothing beyond the verbs the driver calls (`can-i -q` exits 1 for no).
    let may = |verb: &str, resource: &str| as_driver.run(&["auth", "can-i", "-q", verb, resource]).is_ok();
    anyhow::ensure!(
        may("patch", "resourceslices") && may("get", "resourceclaims") && may("get", "pods"),
        "the driver lacks its own verbs"
    );
    for (verb, resource) in [
        // No pod watch by default (podWatch): no pod of the cluster is listed or watched.
        ("list", "pods"),
        ("watch", "pods"),
        ("update", "resourceslices"),
        ("get", "secrets"),
        ("patch", "nodes"),
        ("create", "resourceclaims"),
        // A node reads the claims the kubelet names, never the cluster's in bulk.
        ("list", "resourceclaims"),
        ("watch", "resourceclaims"),
        ("update", "pods"),
        ("delete", "pods"),
    ] {
        anyhow::ensure!(!may(verb, resource), "the driver may {verb} {resource}");
    }

    claim_status_is_confined(plane, &kubectl, &as_driver)?;

    // The policy, in the API server's admission: node-a's token cannot touch node-b's slices.
    refused(as_driver.apply(&slice_yaml("intruder", "node-b", DRIVER)), &["may not write ResourceSlice intruder of node node-b"]);
    kubectl.apply(&slice_yaml("node-b-own", "node-b", DRIVER))?;
    refused(as_driver.run(&["delete", "resourceslice", "node-b-own"]), &["node-a may not write", "of node node-b"]);
    refused(
        as_driver.apply(
            &slice_yaml("node-b-own", "node-b", DRIVER)
                .replace("{name: node-b-own}", "{name: node-b-own, labels: {taken: 'yes'}}"),
        ),
        &["may not write ResourceSlice node-b-own of node node-b"],
    );
    // Nor write another driver's slices on its own node.
    refused(
        as_driver.apply(&slice_yaml("foreign", "node-a", "gpu.nvidia.com")),
        &["only ResourceSlices of driver", "gpu.nvidia.com"],
    );
    // A token not bound to a pod on a node names no node, and may write nothing.
    let unbound = kubectl.run(&["create", "token", "vgpu-dra", "-n", NS])?;
    let unbound_cfg = plane.dir().join("unbound.kubeconfig");
    vgpu_dra_integration::write_kubeconfig(&unbound_cfg, plane.server(), unbound.trim())?;
    refused(kubectl.with_kubeconfig(unbound_cfg).apply(&slice_yaml("unbound-write", "node-a", DRIVER)), &["names no node"]);
    // The admin is not the driver: the policy leaves everyone else alone.
    kubectl.run(&["delete", "resourceslice", "node-b-own"])?;

    webhook_scenario(plane, &kubectl)?;

    // After all that, node-a's own slices are still the driver's to keep.
    pod.process.check_running()?;
    assert_only_driver_slices(&kubectl)?;
    let log = std::fs::read_to_string(pod.process.log())?;
    anyhow::ensure!(!log.to_lowercase().contains("forbidden"), "the driver hit RBAC limits:\n{log}");
    Ok(())
}

/// The claim status permission (`claimStatus`, on by default from 1.36), in the API server's
/// authorization: node-a's driver may write its own driver's entries of `status.devices` of a
/// claim allocated to node-a, and nothing else: not another driver's entries, not the claim's
/// allocation or reservations, and no entry at all with a token of node-b's driver pod.
fn claim_status_is_confined(plane: &mut ControlPlane, kubectl: &Kubectl, as_driver: &Kubectl) -> anyhow::Result<()> {
    let result = plane.wait_allocated("default", "share", Duration::from_secs(30))?;
    let entry = |driver: &str, memory: &str| {
        serde_json::json!({"driver": driver, "pool": result["pool"], "device": result["device"], "shareID": result["shareID"],
            "data": {"memoryLimit": memory}})
    };
    // A server-side apply of the status, as the driver makes it: one PATCH, no read first.
    let uid = kubectl.run(&["get", "resourceclaim", "share", "-o", "jsonpath={.metadata.uid}"])?;
    let patch = |who: &Kubectl, status: serde_json::Value| {
        let claim = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "share", "namespace": "default", "uid": uid}, "status": status});
        let args =
            ["apply", "--server-side", "--force-conflicts", "--subresource=status", "--field-manager=test-driver", "-f", "-"];
        who.run_with_input(&args, Some(&claim.to_string()))
    };
    patch(as_driver, serde_json::json!({"devices": [entry(DRIVER, "4096m")]}))
        .context("node-a's driver writing its own entry")?;
    let written = kubectl.get_json(&["resourceclaim", "share"])?;
    anyhow::ensure!(written["status"]["devices"][0]["data"]["memoryLimit"] == "4096m", "{}", written["status"]);

    let node_b = kubectl.with_kubeconfig(daemonset_token(plane, NS, "vgpu-dra", "node-b")?);
    refused(
        patch(&node_b, serde_json::json!({"devices": [entry(DRIVER, "1m")]})),
        &["resourceclaims/driver", "arbitrary-node:patch"],
    );
    let foreign = [entry(DRIVER, "4096m"), entry("gpu.nvidia.com", "1m")];
    refused(patch(as_driver, serde_json::json!({"devices": foreign})), &["resourceclaims/driver"]);
    let intruder = serde_json::json!([{"resource": "pods", "name": "intruder", "uid": "00000000-0000-0000-0000-00000000dead"}]);
    refused(
        patch(as_driver, serde_json::json!({"devices": [entry(DRIVER, "4096m")], "reservedFor": intruder})),
        &["resourceclaims/binding"],
    );
    let may = |verb: &str, resource: &str| as_driver.run(&["auth", "can-i", "-q", verb, resource]).is_ok();
    anyhow::ensure!(!may("update", "resourceclaims/status") && !may("patch", "resourceclaims/binding"), "status verbs too wide");
    let unchanged = kubectl.get_json(&["resourceclaim", "share"])?;
    anyhow::ensure!(unchanged["status"] == written["status"], "a refused patch changed the claim: {}", unchanged["status"]);
    patch(as_driver, serde_json::json!({"devices": []})).context("node-a's driver clearing its entry")?;
    let cleared = kubectl.get_json(&["resourceclaim", "share"])?;
    anyhow::ensure!(cleared["status"]["devices"].as_array().is_none_or(Vec::is_empty), "{}", cleared["status"]);
    Ok(())
}

/// A pod written for HAMi (source document 003 section 3.1's limits).
const HAMI_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: hami-pod, namespace: default}\nspec:\n  containers:\n  - name: cuda\n    image: registry.invalid/none\n    resources:\n      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4096, nvidia.com/gpucores: 50}\n";

/// The webhook of the default install: its objects as the chart made them, the registration
/// Job and the process run with their arguments and their service accounts' tokens, the Job
/// registering the webhook, the webhook keeping its caBundle, converting a HAMi pod with nothing
/// more than its RBAC allows, and unable to widen which requests are sent to it.
fn webhook_scenario(plane: &ControlPlane, kubectl: &Kubectl) -> anyhow::Result<()> {
    let name = "vgpu-dra-webhook";
    let deploy = kubectl.get_json(&["deployment", name, "-n", NS])?;
    anyhow::ensure!(deploy["spec"]["replicas"] == 2, "replicas: {}", deploy["spec"]["replicas"]);
    let service = kubectl.get_json(&["service", name, "-n", NS])?;
    anyhow::ensure!(
        service["spec"]["ports"][0]["port"] == 443 && service["spec"]["ports"][0]["targetPort"] == "https",
        "Service ports: {}",
        service["spec"]["ports"]
    );
    anyhow::ensure!(service["spec"]["selector"]["app.kubernetes.io/component"] == "webhook", "{}", service["spec"]);
    let pdb = kubectl.get_json(&["poddisruptionbudget", name, "-n", NS])?;
    anyhow::ensure!(pdb["spec"]["selector"] == deploy["spec"]["selector"], "PDB selects {}", pdb["spec"]["selector"]);
    // One ConfigMap for the driver, the webhook and the registration Job: the driver's.
    let ds = kubectl.get_json(&["daemonset", "vgpu-dra", "-n", NS])?;
    let job = registration_job(plane, NS, "vgpu-dra")?;
    let volume = |spec: &serde_json::Value| {
        spec["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "config").map(|v| v["configMap"]["name"].clone()))
    };
    anyhow::ensure!(volume(&deploy).is_some() && volume(&deploy) == volume(&ds), "webhook config {:?}", volume(&deploy));
    anyhow::ensure!(volume(&job) == volume(&ds), "registration config {:?}", volume(&job));
    // The Job and the webhook describe the same webhooks.
    let registration_args = |args: Vec<String>| -> Vec<String> {
        args.into_iter()
            .filter(|a| {
                [
                    "--service-name",
                    "--webhook-name",
                    "--config",
                    "--driver-name",
                    "--device-class",
                    "--timeout-seconds",
                    "--excluded-namespaces",
                    "--volcano-",
                ]
                .iter()
                .any(|f| a.starts_with(f))
            })
            .collect()
    };
    anyhow::ensure!(
        registration_args(container_args(&job)) == registration_args(container_args(&deploy)),
        "the Job registers other webhooks than the Deployment serves"
    );

    // The webhook starts before the Job has run, as it does at install: ready, nothing calls it yet.
    let mut replica = run_as_webhook_pod(plane, NS, name)?;
    let as_webhook = kubectl.with_kubeconfig(replica.kubeconfig.clone());
    eventually("the webhook waiting for the registration", Duration::from_secs(60), || {
        replica.process.check_running()?;
        Ok(std::fs::read_to_string(replica.process.log())?.contains("made by the registration Job").then_some(()))
    })?;
    anyhow::ensure!(kubectl.run(&["get", "mutatingwebhookconfiguration", name]).is_err(), "the webhook registered itself");
    // Ready meanwhile: `helm install --wait` waits for the Deployment while the Job runs beside it.
    let ready = http_get(replica.metrics_port, "/readyz")?;
    anyhow::ensure!(ready.starts_with("HTTP/1.1 200"), "not ready before the registration: {ready}");
    let log = run_registration_job(plane, NS, "vgpu-dra", &replica.url)?;
    anyhow::ensure!(log.contains("registered; the webhook keeps its caBundle"), "{log}");
    // The Job registered the webhook; the webhook adds its CA.
    let config = eventually("the webhook's caBundle registered", Duration::from_secs(60), || {
        replica.process.check_running()?;
        let config = kubectl.get_json(&["mutatingwebhookconfiguration", name])?;
        Ok(config["webhooks"][0]["clientConfig"]["caBundle"].as_str().is_some_and(|b| !b.is_empty()).then_some(config))
    })?;
    let hook = &config["webhooks"][0];
    anyhow::ensure!(hook["failurePolicy"] == "Fail" && hook["timeoutSeconds"] == 10, "{hook}");
    let excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"].to_string();
    anyhow::ensure!(excluded.contains("kube-system") && excluded.contains(NS), "excluded namespaces {excluded}");
    // Owned by the webhook's ClusterRole, which helm uninstall deletes (checked below).
    let role_uid = kubectl.run(&["get", "clusterrole", name, "-o", "jsonpath={.metadata.uid}"])?;
    let owners = &config["metadata"]["ownerReferences"];
    anyhow::ensure!(
        owners.as_array().is_some_and(|o| o.iter().any(|o| o["kind"] == "ClusterRole"
            && o["apiVersion"] == "rbac.authorization.k8s.io/v1"
            && o["name"] == name
            && o["uid"] == role_uid.trim())),
        "the configuration is not owned by ClusterRole {name}: {owners}"
    );
    let secret = kubectl.get_json(&["secret", "vgpu-dra-webhook-tls", "-n", NS])?;
    anyhow::ensure!(secret["type"] == "kubernetes.io/tls", "{}", secret["type"]);
    for path in ["/healthz", "/readyz"] {
        let answer = http_get(replica.metrics_port, path)?;
        anyhow::ensure!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }

    // A HAMi pod goes through it (the API server presenting the client certificate the chart's
    // client CA signed): a template created in the pod's namespace from the listed slices.
    eventually("the API server calling the webhook", Duration::from_secs(60), || {
        let out = kubectl.run_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(HAMI_POD))?;
        Ok(out.contains("resourceClaimTemplateName").then_some(()))
    })?;
    kubectl.apply(HAMI_POD)?;
    let pod = kubectl.get_json(&["pod", "hami-pod", "-n", "default"])?;
    let template = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].as_str().unwrap_or_default().to_owned();
    anyhow::ensure!(!template.is_empty(), "the pod was not converted: {}", pod["spec"]);
    kubectl.get_json(&["resourceclaimtemplate", &template, "-n", "default"])?;

    // Least privilege (`can-i -q` exits 1 for no).
    let may = |args: &[&str]| {
        let mut full = vec!["auth", "can-i", "-q"];
        full.extend_from_slice(args);
        as_webhook.run(&full).is_ok()
    };
    let own_hook = format!("mutatingwebhookconfigurations/{name}");
    for allowed in [
        &["create", "resourceclaimtemplates", "-n", "default"][..],
        &["create", "resourceclaimtemplates", "-n", "team-a"],
        // Read back when its name is taken, to compare.
        &["get", "resourceclaimtemplates", "-n", "default"],
        &["list", "resourceslices"],
        &["get", &own_hook],
        &["patch", &own_hook],
        &["get", "secrets/vgpu-dra-webhook-tls", "-n", NS],
        &["update", "secrets/vgpu-dra-webhook-tls", "-n", NS],
        &["create", "secrets", "-n", NS],
    ] {
        anyhow::ensure!(may(allowed), "the webhook may not {allowed:?}");
    }
    for denied in [
        &["get", "secrets/vgpu-dra-webhook-tls", "-n", "default"][..],
        &["create", "secrets", "-n", "default"],
        &["get", "secrets/other", "-n", NS],
        &["update", "secrets/other", "-n", NS],
        &["list", "secrets", "-n", NS],
        &["delete", "secrets/vgpu-dra-webhook-tls", "-n", NS],
        &["patch", "mutatingwebhookconfigurations/other"],
        // The registration Job creates it; the webhook keeps its caBundle only.
        &["create", &own_hook],
        &["delete", &own_hook],
        &["create", "validatingwebhookconfigurations"],
        &["update", "resourceslices"],
        &["watch", "resourceslices"],
        &["list", "resourceclaimtemplates", "-n", "default"],
        &["delete", "resourceclaimtemplates", "-n", "default"],
        &["update", "resourceclaimtemplates", "-n", "default"],
        &["create", "resourceclaims", "-n", "default"],
        &["get", "pods", "-n", "default"],
        &["delete", "pods", "-n", "default"],
        &["get", "nodes"],
        &["get", "clusterroles.rbac.authorization.k8s.io/vgpu-dra"],
        &["get", &format!("clusterroles.rbac.authorization.k8s.io/{name}")],
        &["list", "clusterroles.rbac.authorization.k8s.io"],
    ] {
        anyhow::ensure!(!may(denied), "the webhook may {denied:?}");
    }
    cannot_widen_its_registration(kubectl, &as_webhook, name)?;

    replica.process.check_running()?;
    let log = std::fs::read_to_string(replica.process.log())?;
    anyhow::ensure!(!log.to_lowercase().contains("forbidden"), "the webhook hit RBAC limits:\n{log}");
    // The pod is left for the scheduler. helm uninstall deletes the ClusterRole, and the garbage
    // collector then the registration, which would otherwise refuse HAMi pods with no webhook.
    kubectl.run(&["delete", "pod", "hami-pod", "-n", "default", "--wait=false"])?;
    replica.process.stop();
    kubectl.run(&["delete", "clusterrole", name])?;
    eventually("the garbage collector deletes the registration", Duration::from_secs(60), || {
        let left = kubectl.run(&["get", "mutatingwebhookconfiguration", name, "--ignore-not-found", "-o", "name"])?;
        Ok(left.trim().is_empty().then_some(()))
    })?;
    Ok(())
}

/// The webhook's own account (`as_webhook`, a token of a pod of its Deployment) cannot change
/// which requests are sent to it, or where, or whether a failure lets them through: every field
/// of its MutatingWebhookConfiguration but `caBundle` is refused by the chart's admission policy
/// in the real API server (RBAC lets it patch the object), and so are deleting it and making it
/// anew. It can still rotate the caBundle.
fn cannot_widen_its_registration(kubectl: &Kubectl, as_webhook: &Kubectl, name: &str) -> anyhow::Result<()> {
    let config = kubectl.get_json(&["mutatingwebhookconfiguration", name])?;
    let hooks = config["webhooks"].as_array().map_or(0, Vec::len);
    anyhow::ensure!(hooks == 3, "a pod, a Volcano Job and a ResourceClaim (GPU quota) webhook: {config}");
    let w = "/webhooks/0";
    let mut changes: Vec<(&str, serde_json::Value)> = vec![
        ("all namespaces", serde_json::json!([{"op": "replace", "path": format!("{w}/namespaceSelector"), "value": {}}])),
        (
            "kube-system let in",
            serde_json::json!([{"op": "replace", "path": format!("{w}/namespaceSelector/matchExpressions/0/values"), "value": [NS]}]),
        ),
        (
            "an exclusion turned around",
            serde_json::json!([{"op": "replace", "path": format!("{w}/namespaceSelector/matchExpressions/0/operator"), "value": "In"}]),
        ),
        ("every pod, not only HAMi's", serde_json::json!([{"op": "remove", "path": format!("{w}/matchConditions")}])),
        (
            "a match condition always true",
            serde_json::json!([{"op": "replace", "path": format!("{w}/matchConditions/0/expression"), "value": "true"}]),
        ),
        ("every resource", serde_json::json!([{"op": "replace", "path": format!("{w}/rules/0/resources"), "value": ["*"]}])),
        (
            "updates too",
            serde_json::json!([{"op": "replace", "path": format!("{w}/rules/0/operations"), "value": ["CREATE", "UPDATE"]}]),
        ),
        (
            "an object selector",
            serde_json::json!([{"op": "add", "path": format!("{w}/objectSelector"), "value": {"matchLabels": {"a": "b"}}}]),
        ),
        ("failing open", serde_json::json!([{"op": "replace", "path": format!("{w}/failurePolicy"), "value": "Ignore"}])),
        ("exact matching", serde_json::json!([{"op": "replace", "path": format!("{w}/matchPolicy"), "value": "Exact"}])),
        ("called again", serde_json::json!([{"op": "replace", "path": format!("{w}/reinvocationPolicy"), "value": "IfNeeded"}])),
        ("side effects on dry runs", serde_json::json!([{"op": "replace", "path": format!("{w}/sideEffects"), "value": "None"}])),
        ("a longer timeout", serde_json::json!([{"op": "replace", "path": format!("{w}/timeoutSeconds"), "value": 30}])),
        (
            "another review version",
            serde_json::json!([{"op": "replace", "path": format!("{w}/admissionReviewVersions"), "value": ["v1", "v1beta1"]}]),
        ),
        (
            "another URL",
            serde_json::json!([{"op": "replace", "path": format!("{w}/clientConfig/url"), "value": "https://attacker.example.com/mutate"}]),
        ),
        ("a webhook less", serde_json::json!([{"op": "remove", "path": "/webhooks/1"}])),
        ("no quota check", serde_json::json!([{"op": "remove", "path": "/webhooks/2"}])),
        (
            "claims let through when it is down",
            serde_json::json!([{"op": "replace", "path": "/webhooks/2/failurePolicy", "value": "Ignore"}]),
        ),
        ("no owner (left behind at uninstall)", serde_json::json!([{"op": "remove", "path": "/metadata/ownerReferences"}])),
        ("other labels", serde_json::json!([{"op": "add", "path": "/metadata/labels/extra", "value": "x"}])),
    ];
    // A webhook more: a copy of the pod webhook under another name, sent every pod.
    let mut extra = config["webhooks"][0].clone();
    extra["name"] = "extra.vgpu-dra.io".into();
    extra.as_object_mut().map(|o| o.remove("matchConditions"));
    changes.push(("a webhook more", serde_json::json!([{"op": "add", "path": "/webhooks/-", "value": extra}])));
    for (what, patch) in &changes {
        // The admin may (the policy binds the webhook's account only): the policy is what stops it.
        let dry = kubectl.run(&[
            "patch",
            "mutatingwebhookconfiguration",
            name,
            "--type=json",
            "--dry-run=server",
            "-p",
            &patch.to_string(),
        ]);
        anyhow::ensure!(dry.is_ok(), "{what}: not a valid change to begin with: {dry:?}");
        let err = as_webhook
            .run(&["patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", &patch.to_string()])
            .err()
            .with_context(|| format!("the webhook's account changed its registration: {what}"))?;
        let err = format!("{err:#}");
        anyhow::ensure!(
            err.contains("vgpu-dra-webhook-own-registration") && err.contains("the vgpu-dra webhook may"),
            "{what}: {err}"
        );
    }
    anyhow::ensure!(kubectl.get_json(&["mutatingwebhookconfiguration", name])?["webhooks"] == config["webhooks"], "changed");

    // The caBundle is its to rotate: another CA added, then the one it had.
    let bundle = config["webhooks"][0]["clientConfig"]["caBundle"].as_str().unwrap_or_default().to_owned();
    let other = base64_pem_of_another_ca(kubectl)?;
    for value in [other, bundle] {
        let patch: Vec<serde_json::Value> = (0..hooks)
            .map(|i| serde_json::json!({"op": "replace", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": value}))
            .collect();
        as_webhook.run(&[
            "patch",
            "mutatingwebhookconfiguration",
            name,
            "--type=json",
            "-p",
            &serde_json::Value::from(patch).to_string(),
        ])?;
        let now = kubectl.get_json(&["mutatingwebhookconfiguration", name])?;
        anyhow::ensure!(now["webhooks"][1]["clientConfig"]["caBundle"] == value.as_str(), "the caBundle rotation did not take");
    }

    // Nor may it delete its registration, or make one anew once it is gone.
    let err = as_webhook.run(&["delete", "mutatingwebhookconfiguration", name, "--dry-run=server"]).expect_err("deleted");
    anyhow::ensure!(format!("{err:#}").contains("forbidden"), "{err:#}");
    let mut again = kubectl.get_json(&["mutatingwebhookconfiguration", name])?;
    for key in ["resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"] {
        again["metadata"].as_object_mut().map(|m| m.remove(key));
    }
    again["metadata"]["name"] = format!("{name}-anew").into();
    let err = as_webhook.run_with_input(&["create", "-f", "-"], Some(&again.to_string())).expect_err("created");
    anyhow::ensure!(format!("{err:#}").contains("forbidden"), "{err:#}");
    Ok(())
}

/// A PEM CA of no one, base64 as a caBundle: the content of a rotation.
fn base64_pem_of_another_ca(kubectl: &Kubectl) -> anyhow::Result<String> {
    // The API server's own serving CA would do, but any PEM certificate is a valid caBundle:
    // take the client CA the chart was given.
    let cm = kubectl.get_json(&["configmap", "vgpu-dra-webhook-client-ca", "-n", NS])?;
    let pem = cm["data"]["ca.crt"].as_str().context("no ca.crt")?;
    let secret = kubectl.run(&[
        "create",
        "secret",
        "generic",
        "x",
        "--from-literal",
        &format!("ca={pem}"),
        "--dry-run=client",
        "-o",
        "jsonpath={.data.ca}",
    ])?;
    Ok(secret.trim().to_owned())
}

/// The status line and body of `GET path` on loopback `port`.
fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

fn assert_only_driver_slices(kubectl: &Kubectl) -> anyhow::Result<()> {
    let list = kubectl.get_json(&["resourceslices"])?;
    let nodes: Vec<&str> =
        list["items"].as_array().into_iter().flatten().filter_map(|s| s["spec"]["nodeName"].as_str()).collect();
    anyhow::ensure!(!nodes.is_empty() && nodes.iter().all(|n| *n == "node-a"), "slices on {nodes:?}");
    Ok(())
}
