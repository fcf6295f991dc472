//! The chart as a user installs it: `helm install` of `charts/vgpu-dra` on a real node (kubelet,
//! containerd, runc) with pod networking, and the chart's own pods doing the work. Nothing runs
//! our binary but the kubelet, from an image built from this repository
//! (`integration/k8s/build-image.sh`) and imported into the node's containerd.
//!
//! 1. docs/quickstart.md's install commands, run as written with this node, image, HAMi-core
//!    image (the test bed's stand-in library) and CA put in, plus the mock inventory the section
//!    tells GPU-less clusters to add. The chart's defaults otherwise: its host paths, ports,
//!    probes, security contexts and RBAC.
//! 2. The DaemonSet's pod: its init container installs the library into the host directory, the
//!    driver registers with the kubelet and publishes its slice, and it is Ready. The webhook's two
//!    replicas are Ready (their probes, from the kubelet, over the pod network), the registration
//!    Job completes, and the API server calls the webhook through its Service.
//! 3. 003's pod as written for HAMi (`nvidia.com/gpu: 1`, `gpumem: 4096`, `gpucores: 50`), with
//!    the test image, as root and as uid 65534: converted by the installed webhook, prepared by the
//!    installed driver, and each sees 4096m / 50 from inside (HAMi-core's environment, and what
//!    the preloaded stand-in library recorded). Source document 000's single pod
//!    (`volcano.sh/vgpu-*`, scheduler `volcano`) with the test image: converted by the installed
//!    webhook, scheduled by a real vc-scheduler, it sees 2000m / 30.
//! 4. The liveness probe means something: the DRA socket removed under the running driver, the
//!    kubelet restarts the driver's container, which serves again.
//! 5. `helm upgrade` to another image tag rolls the DaemonSet and the webhook; the running pod
//!    keeps its container, its limits and its CDI spec, and the new driver unprepares its claim
//!    when it goes.
//! 6. `helm uninstall` leaves no ResourceSlice, webhook configuration or DeviceClass; the host
//!    files docs/quickstart.md says stay, stay.
//!
//! Needs what `vgpu_dra_integration::node` needs (root, namespaces, cgroups), a C compiler, and
//! `ip` (iproute2) for the pod network. A missing one fails the test by name; it never skips.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use common::chart::{chart_dir, helm};
use common::pod_report::{POD_SCRIPT, check, wait_output, wait_output_in};
use common::{NODE, card_uuid, quickstart, seed_000};
use serde_json::Value;
use vgpu_dra_integration::image::{driver_image, hami_core_image};
use vgpu_dra_integration::node::{BUSYBOX_IMAGE, DYNAMIC_PROGRAM, Node, NodeOptions, build_stand_in};
use vgpu_dra_integration::volcano::{Volcano, VolcanoOptions};
use vgpu_dra_integration::{ControlPlane, Kubectl, PlaneOptions, driver_binary, eventually};

const RELEASE: &str = "vgpu-dra";
const NAMESPACE: &str = "vgpu-dra";
const REPOSITORY: &str = "vgpu-dra.test/vgpu-dra";
const HAMI_CORE_IMAGE: &str = "vgpu-dra.test/hami-core:1";
const MOCK_GPUS: &str = "1xTesla T4:15Gi";
const DRIVER: &str = "hami-core-gpu.project-hami.io";
/// HAMi-core's host directory and the kubelet's root, as the chart's defaults name them.
const VGPU_DIR: &str = "/usr/local/vgpu";
const KUBELET_DIR: &str = "/var/lib/kubelet";
const CDI_DIR: &str = "/var/run/cdi";
const NOBODY: u32 = 65534;

#[test]
fn the_chart_installs_runs_upgrades_and_uninstalls_on_a_real_node() {
    let plane = ControlPlane::start_with(&PlaneOptions { pod_network: true, ..PlaneOptions::default() }).unwrap();
    let mut node = Node::start_with(&plane, NODE, &NodeOptions { pod_network: true }).unwrap();
    if let Err(e) = scenario(&plane, &mut node) {
        eprintln!("{}", diagnostics(plane.kubectl()));
        panic!("{e:#}");
    }
}

fn scenario(plane: &ControlPlane, node: &mut Node) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let stand_in = images(plane, node)?;
    install(plane)?;
    wait_installed(node, &kubectl, &stand_in)?;
    let card = card_uuid(&kubectl, "hami-gpu-0")?.context("the slice names no UUID for hami-gpu-0")?;
    let vgpu = node.host_view(VGPU_DIR).context("no host view of the HAMi-core directory")?;
    hami_pod_sees_its_limits(node, &kubectl, "hami-root", None, &card)?;
    live_usage_through_the_pod_proxy(plane)?;
    // Held to the end: its webhooks stay registered.
    let _volcano = volcano_pod_sees_its_limits(plane, node, &kubectl)?;
    liveness_restarts_a_deaf_driver(node, &kubectl)?;
    let spec_before = spec_of(node, &kubectl, "hami-root")?;
    upgrade(plane, node, &kubectl)?;
    ensure!(spec_of(node, &kubectl, "hami-root")? == spec_before, "hami-root's CDI spec changed across the roll");
    hami_pod_sees_its_limits(node, &kubectl, "hami-nobody", Some(NOBODY), &card)?;
    // The new driver knows the claim the old one prepared: it unprepares it.
    let root_claim = claim_uid(&kubectl, "hami-root")?;
    kubectl.run(&["delete", "pod", "hami-root", "--wait=true"])?;
    eventually("the new driver to unprepare hami-root's claim", Duration::from_secs(60), || {
        Ok((cdi_specs(node, &root_claim) == 0).then_some(()))
    })?;
    uninstall(plane, node, &kubectl, &vgpu)
}

/// The driver's image (tags t1 and t2, one content) and a HAMi-core install image holding the
/// stand-in library, imported into the node; returns the stand-in's bytes.
fn images(plane: &ControlPlane, node: &Node) -> anyhow::Result<Vec<u8>> {
    let dir = plane.dir().join("images");
    std::fs::create_dir_all(&dir)?;
    let driver = driver_image(driver_binary()?, &format!("{REPOSITORY}:t1"), &dir)?;
    // The lock directory the chart gives the driver, as HAMi-core's built-in one.
    let library = dir.join("libvgpu.so");
    build_stand_in(&library, Path::new("/tmp/vgpulock"))?;
    let hami = hami_core_image(&library, HAMI_CORE_IMAGE, &dir)?;
    for tar in [&driver, &hami] {
        node.ctr(&["images", "import", "--snapshotter=overlayfs", &tar.display().to_string()])
            .with_context(|| format!("importing {}", tar.display()))?;
    }
    node.ctr(&["images", "tag", "--force", &format!("{REPOSITORY}:t1"), &format!("{REPOSITORY}:t2")])?;
    Ok(std::fs::read(&library)?)
}

/// docs/quickstart.md's install commands, with this node, image and CA.
fn install(plane: &ControlPlane) -> anyhow::Result<()> {
    let chart = chart_dir().canonicalize()?;
    let commands = quickstart::install_commands(
        [NODE, REPOSITORY, "t1", HAMI_CORE_IMAGE, "\"$WEBHOOK_CLIENT_CA\""],
        &format!("--set 'mockGpus={MOCK_GPUS}'"),
    )?
    .replace("charts/vgpu-dra", &chart.display().to_string());
    eprintln!("running docs/quickstart.md's install commands:\n{commands}");
    let bin_dir = plane.dir().join("bin");
    std::fs::create_dir_all(&bin_dir)?;
    for (name, target) in [("kubectl", &plane.components().kubectl), ("helm", &plane.components().helm)] {
        let link = bin_dir.join(name);
        if !link.exists() {
            std::os::unix::fs::symlink(target, &link)?;
        }
    }
    let home = plane.dir().join("helm-home");
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("/bin/sh")
        .args(["-ec", &commands])
        .env("PATH", path)
        .env("KUBECONFIG", plane.kubeconfig())
        .env("WEBHOOK_CLIENT_CA", plane.webhook_client_ca())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        out.status.success(),
        "the install commands failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Everything the install should have brought up on its own.
fn wait_installed(node: &mut Node, kubectl: &Kubectl, stand_in: &[u8]) -> anyhow::Result<()> {
    wait_daemonset(node, kubectl, None)?;
    let library = node.host_view(VGPU_DIR).context("no HAMi-core directory")?.join("libvgpu.so");
    ensure!(
        std::fs::read(&library).ok().as_deref() == Some(stand_in),
        "the init container did not install the HAMi-core image's library at {}",
        library.display()
    );
    eventually("the node's ResourceSlice", Duration::from_secs(60), || Ok(card_uuid(kubectl, "hami-gpu-0")?.map(|_| ())))?;
    wait_webhook(node, kubectl, "t1")
}

/// Waits until the DaemonSet's one pod runs image tag `tag` (any, if `None`) and is Ready;
/// returns its name.
fn wait_daemonset(node: &mut Node, kubectl: &Kubectl, tag: Option<&str>) -> anyhow::Result<String> {
    eventually("the driver's DaemonSet pod Ready", Duration::from_secs(180), || {
        node.check_running()?;
        let pods = kubectl.get_json(&["pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vgpu-dra"])?;
        let ready = pods["items"].as_array().into_iter().flatten().find(|p| {
            p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
                && p["metadata"]["deletionTimestamp"].is_null()
                && tag.is_none_or(|t| p["spec"]["containers"][0]["image"].as_str().is_some_and(|i| i.ends_with(&format!(":{t}"))))
                && is_ready(p)
        });
        Ok(ready.and_then(|p| p["metadata"]["name"].as_str()).map(str::to_owned))
    })
}

/// Waits until the webhook's Deployment has all its replicas at image tag `tag` Ready, a
/// registration Job for that image completed, and the API server calls the webhook: a pod
/// asking for HAMi's resources is converted (checked with a server-side dry run, which creates
/// nothing but runs admission).
fn wait_webhook(node: &mut Node, kubectl: &Kubectl, tag: &str) -> anyhow::Result<()> {
    let name = format!("{RELEASE}-webhook");
    eventually(&format!("webhook {name} rolled out at tag {tag}"), Duration::from_secs(180), || {
        node.check_running()?;
        let d = kubectl.get_json(&["deployment", &name, "-n", NAMESPACE])?;
        let want = d["spec"]["replicas"].as_i64().unwrap_or(-1);
        let image_ok =
            d["spec"]["template"]["spec"]["containers"][0]["image"].as_str().is_some_and(|i| i.ends_with(&format!(":{tag}")));
        let status = &d["status"];
        let done = image_ok
            && status["observedGeneration"] == d["metadata"]["generation"]
            && status["updatedReplicas"].as_i64() == Some(want)
            && status["readyReplicas"].as_i64() == Some(want)
            && status["replicas"].as_i64() == Some(want);
        Ok(done.then_some(()))
    })?;
    eventually("the registration Job for this image to complete", Duration::from_secs(120), || {
        let jobs = kubectl.get_json(&["jobs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=webhook-registration"])?;
        let done = jobs["items"].as_array().into_iter().flatten().any(|j| {
            j["spec"]["template"]["spec"]["containers"][0]["image"].as_str().is_some_and(|i| i.ends_with(&format!(":{tag}")))
                && j["status"]["succeeded"].as_i64() == Some(1)
        });
        Ok(done.then_some(()))
    })?;
    eventually("the API server to call the webhook through its Service", Duration::from_secs(60), || {
        let out =
            kubectl.run_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(&hami_pod("probe", None)));
        Ok(out
            .ok()
            .and_then(|o| serde_json::from_str::<Value>(&o).ok())
            .filter(|p| p["spec"]["resourceClaims"][0].is_object())
            .map(|_| ()))
    })
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// 003's pod as written for HAMi's device plugin: one card, 4096 MiB, 50 % of its cores; with the
/// test image and [`POD_SCRIPT`], as `user` (root when `None`).
fn hami_pod(name: &str, user: Option<u32>) -> String {
    let security = user.map_or_else(String::new, |u| format!("  securityContext: {{runAsUser: {u}, runAsGroup: {u}}}\n"));
    common::pod_report::hami_pod_003(name, &security)
}

/// Creates [`hami_pod`] and checks what its container sees.
fn hami_pod_sees_its_limits(node: &mut Node, kubectl: &Kubectl, name: &str, user: Option<u32>, card: &str) -> anyhow::Result<()> {
    kubectl.apply(&hami_pod(name, user))?;
    let seen = wait_output(node, kubectl, name)?;
    eprintln!("pod {name} printed:\n{}", seen.raw);
    let claim = claim_uid(kubectl, name)?;
    let cache = format!("{VGPU_DIR}/claims/{claim}/{card}.cache");
    check(&seen, name, user.unwrap_or(0), card, &cache).with_context(|| format!("what pod {name} saw:\n{}", seen.raw))?;
    ensure!(cdi_specs(node, &claim) == 1, "{name}'s claim has no CDI spec");
    Ok(())
}

/// `kubectl vgpu usage --live` (the same code as `vgpu-dra usage`): the node monitor's figures,
/// read from the installed driver pod's metrics port through the API server's pod proxy, are on
/// the node's card, beside the pod holding a share of it.
fn live_usage_through_the_pod_proxy(plane: &ControlPlane) -> anyhow::Result<()> {
    let out = Command::new(driver_binary()?)
        .args(["usage", "--live", "-o", "json"])
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "usage --live failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(&text).with_context(|| format!("usage --live printed no JSON: {text}"))?;
    let card = report["cards"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["node"] == NODE && c["device"] == "hami-gpu-0")
        .with_context(|| format!("usage --live shows no hami-gpu-0 of {NODE}: {report:#}"))?;
    ensure!(card["live"].is_object(), "usage --live read no figures for the card through the pod proxy: {card:#}");
    ensure!(
        card["pods"].as_array().into_iter().flatten().any(|p| p == "default/hami-root"),
        "usage --live does not show hami-root on the card: {card:#}"
    );
    Ok(())
}

/// Source document 000's single pod (`volcano.sh/vgpu-*` resources, scheduler `volcano`) with the
/// test image and [`POD_SCRIPT`] for its image and command: converted by the installed webhook
/// (which adds the CPU request Volcano needs to schedule it as a real task), scheduled by
/// vc-scheduler, prepared by the installed driver; its container sees 000's 2000m / 30. Deleted
/// once checked (its card has no room for it and 003's two pods). Returns Volcano, whose webhooks
/// stay registered while it runs.
fn volcano_pod_sees_its_limits(plane: &ControlPlane, node: &mut Node, kubectl: &Kubectl) -> anyhow::Result<Volcano> {
    let mut volcano = Volcano::start(plane, &VolcanoOptions::default())?;
    if kubectl.run(&["get", "namespace", seed_000::DEMO, "-o", "name"]).is_err() {
        kubectl.run(&["create", "namespace", seed_000::DEMO])?;
    }
    let manifest = with_test_program(seed_000::SINGLE)?;
    kubectl.run_with_input(&["create", "-f", "-"], Some(&manifest))?;
    let name = "volcano-vgpu-single";
    let seen = wait_output_in(node, kubectl, seed_000::DEMO, name, "cuda")?;
    volcano.check_running()?;
    eprintln!("pod {name} printed:\n{}", seen.raw);
    let mut problems = Vec::new();
    for (what, got, want) in [
        ("CUDA_DEVICE_MEMORY_LIMIT_0", seen.env.get("CUDA_DEVICE_MEMORY_LIMIT_0"), "2000m"),
        ("CUDA_DEVICE_SM_LIMIT", seen.env.get("CUDA_DEVICE_SM_LIMIT"), "30"),
        ("the preloaded library's memory limit", seen.record.get("memory"), "2000m"),
        ("the preloaded library's SM limit", seen.record.get("cores"), "30"),
    ] {
        if got.map(String::as_str) != Some(want) {
            problems.push(format!("{what} is {got:?}, not {want:?}"));
        }
    }
    ensure!(problems.is_empty(), "pod {name}:\n- {}\n{}", problems.join("\n- "), seen.raw);
    let pod = kubectl.get_json(&["pod", name, "-n", seed_000::DEMO])?;
    ensure!(
        pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"].as_str().is_some_and(|g| !g.is_empty()),
        "pod {name} was not scheduled through a Volcano PodGroup: {}",
        pod["metadata"]
    );
    kubectl.run(&["delete", "pod", name, "-n", seed_000::DEMO, "--wait=true"])?;
    Ok(volcano)
}

/// `manifest` (one container) with the test image and [`POD_SCRIPT`] for its image and command.
fn with_test_program(manifest: &str) -> anyhow::Result<String> {
    let script = serde_json::to_string(&POD_SCRIPT.replace("DYNAMIC_PROGRAM", DYNAMIC_PROGRAM))?;
    let (head, rest) = manifest.split_once("    command:\n").context("the manifest has no command")?;
    let (_, tail) = rest.split_once("    resources:\n").context("the manifest has no resources after its command")?;
    let head: String = head
        .lines()
        .map(|l| if l.trim_start().starts_with("image: ") { format!("    image: {BUSYBOX_IMAGE}\n") } else { format!("{l}\n") })
        .collect();
    Ok(format!("{head}    command: [\"/bin/sh\", \"-c\", {script}]\n    resources:\n{tail}"))
}

fn claim_uid(kubectl: &Kubectl, pod: &str) -> anyhow::Result<String> {
    let p = kubectl.get_json(&["pod", pod])?;
    let claim = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .with_context(|| format!("pod {pod} names no claim: {}", p["status"]))?
        .to_owned();
    kubectl.run(&["get", "resourceclaim", &claim, "-o", "jsonpath={.metadata.uid}"])
}

fn cdi_dir(node: &Node) -> PathBuf {
    node.host_view(CDI_DIR).unwrap_or_else(|| node.cdi_dir().to_owned())
}

/// How many CDI spec files of claim `uid` the node holds.
fn cdi_specs(node: &Node, uid: &str) -> usize {
    std::fs::read_dir(cdi_dir(node))
        .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().contains(uid)).count())
        .unwrap_or(0)
}

/// The text of the CDI spec of pod `pod`'s claim.
fn spec_of(node: &Node, kubectl: &Kubectl, pod: &str) -> anyhow::Result<String> {
    let uid = claim_uid(kubectl, pod)?;
    let entry = std::fs::read_dir(cdi_dir(node))?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().contains(&uid))
        .with_context(|| format!("no CDI spec of {pod}'s claim {uid}"))?;
    Ok(std::fs::read_to_string(entry.path())?)
}

/// Removes the driver's DRA socket under it (the process keeps serving a socket no one can
/// reach): the liveness probe, which makes a DRA call through that path, fails, and the kubelet
/// restarts the container, which serves the socket again.
fn liveness_restarts_a_deaf_driver(node: &mut Node, kubectl: &Kubectl) -> anyhow::Result<()> {
    let pod = wait_daemonset(node, kubectl, None)?;
    let restarts = |kubectl: &Kubectl| -> anyhow::Result<i64> {
        let p = kubectl.get_json(&["pod", &pod, "-n", NAMESPACE])?;
        Ok(p["status"]["containerStatuses"][0]["restartCount"].as_i64().unwrap_or(0))
    };
    let before = restarts(kubectl)?;
    let socket = node.host_view(KUBELET_DIR).context("no kubelet directory")?.join("plugins").join(DRIVER).join("dra.sock");
    std::fs::remove_file(&socket).with_context(|| format!("removing {}", socket.display()))?;
    eventually("the kubelet to restart the driver's container", Duration::from_secs(120), || {
        node.check_running()?;
        Ok((restarts(kubectl)? > before).then_some(()))
    })?;
    eventually("the restarted driver's socket", Duration::from_secs(60), || Ok(socket.exists().then_some(())))?;
    wait_daemonset(node, kubectl, None)?;
    Ok(())
}

/// `helm upgrade` to tag t2: both workloads roll; the pods already running keep their containers.
fn upgrade(plane: &ControlPlane, node: &mut Node, kubectl: &Kubectl) -> anyhow::Result<()> {
    let old = wait_daemonset(node, kubectl, Some("t1"))?;
    let container = |kubectl: &Kubectl| -> anyhow::Result<Value> {
        Ok(kubectl.get_json(&["pod", "hami-root"])?["status"]["containerStatuses"][0].clone())
    };
    let before = container(kubectl)?;
    let chart = chart_dir().canonicalize()?.display().to_string();
    helm(plane, &["upgrade", RELEASE, &chart, "--namespace", NAMESPACE, "--reuse-values", "--set", "image.tag=t2"])?;
    let new = wait_daemonset(node, kubectl, Some("t2"))?;
    ensure!(new != old, "the DaemonSet did not roll: {old} is still its pod");
    wait_webhook(node, kubectl, "t2")?;
    let after = container(kubectl)?;
    ensure!(
        after["containerID"] == before["containerID"] && after["restartCount"] == before["restartCount"],
        "hami-root's container changed across the upgrade: {before} then {after}"
    );
    Ok(())
}

/// `helm uninstall`: the cluster objects go; on the node the library, the preload file and the
/// specs of claims still in use stay (docs/quickstart.md, "Clean up").
fn uninstall(plane: &ControlPlane, node: &mut Node, kubectl: &Kubectl, vgpu: &Path) -> anyhow::Result<()> {
    let nobody_claim = claim_uid(kubectl, "hami-nobody")?;
    helm(plane, &["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s"])?;
    eventually("the chart's cluster objects gone", Duration::from_secs(120), || {
        node.check_running()?;
        let mut left = Vec::new();
        // Every slice (this node's driver was the only one); of the rest, what the chart names.
        for (kind, name) in [
            ("resourceslices", ""),
            ("deviceclasses", DRIVER),
            ("mutatingwebhookconfigurations", RELEASE),
            ("validatingadmissionpolicies", RELEASE),
            ("validatingadmissionpolicybindings", RELEASE),
            ("clusterroles", RELEASE),
            ("clusterrolebindings", RELEASE),
        ] {
            let out = kubectl.run(&["get", kind, "-o", "name"])?;
            let found: Vec<&str> = out.lines().filter(|l| l.rsplit('/').next().is_some_and(|n| n.contains(name))).collect();
            left.extend(found.into_iter().map(str::to_owned));
        }
        Ok(left.is_empty().then_some(()).or_else(|| {
            eprintln!("still there: {left:?}");
            None
        }))
    })?;
    // In the release namespace only what the namespace has anyway, and the webhook's certificate,
    // which the webhook made (not Helm) and docs/quickstart.md says is left.
    let expected =
        ["configmap/kube-root-ca.crt".to_owned(), format!("secret/{RELEASE}-webhook-tls"), "serviceaccount/default".to_owned()];
    eventually("only the webhook's certificate left in the release namespace", Duration::from_secs(60), || {
        let out = kubectl.run(&[
            "get",
            "pods,services,deployments,daemonsets,jobs,configmaps,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets",
            "-n",
            NAMESPACE,
            "-o",
            "name",
        ])?;
        // `deployment.apps/name` as `deployment/name`.
        let mut left: Vec<String> = out
            .lines()
            .filter_map(|l| l.split_once('/'))
            .map(|(kind, name)| format!("{}/{name}", kind.split('.').next().unwrap_or(kind)))
            .collect();
        left.sort();
        if left != expected {
            eprintln!("release namespace holds: {left:?}");
        }
        Ok((left == expected).then_some(()))
    })?;
    ensure!(vgpu.join("libvgpu.so").is_file(), "libvgpu.so was removed while containers may map it");
    ensure!(vgpu.join("ld.so.preload").is_file(), "ld.so.preload was removed while containers mount it");
    ensure!(cdi_specs(node, &nobody_claim) == 1, "the running pod's CDI spec was removed by the uninstall");
    ensure!(vgpu.join("claims").join(&nobody_claim).is_dir(), "the running pod's claim directory was removed by the uninstall");
    let checkpoint = node.host_view(KUBELET_DIR).context("no kubelet directory")?.join("plugins").join(DRIVER).join("checkpoint");
    ensure!(
        checkpoint.join(format!("{nobody_claim}.json")).is_file(),
        "the checkpoint no longer records the running pod's claim: {}",
        checkpoint.display()
    );
    let pod = kubectl.get_json(&["pod", "hami-nobody"])?;
    if pod["status"]["phase"] != "Running" {
        bail!("hami-nobody stopped with the uninstall: {}", pod["status"]);
    }
    Ok(())
}

/// What a failure report needs: every pod's phase and container states, and recent events.
fn diagnostics(kubectl: &Kubectl) -> String {
    let pods = kubectl.run(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_else(|e| format!("{e:#}"));
    let events = kubectl.run(&["get", "events", "-A", "--sort-by=.lastTimestamp"]).unwrap_or_else(|e| format!("{e:#}"));
    let logs = kubectl
        .run(&["logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vgpu-dra", "--all-containers", "--tail=40", "--prefix"])
        .unwrap_or_else(|e| format!("{e:#}"));
    format!("----- pods -----\n{pods}\n----- events -----\n{events}\n----- chart pods' logs -----\n{logs}")
}
