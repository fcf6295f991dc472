//! A real node: our driver registers with a real kubelet, which prepares claims through it and
//! hands containerd the CDI devices; runc starts real containers, and what they see is asserted
//! from inside them. The container's program that ld.so runs loads a stand-in for HAMi-core's
//! `libvgpu.so` (`integration/testdata/libvgpu-stand-in.c`, built here) through the
//! `/etc/ld.so.preload` the spec mounts; its constructor records the uid and the limits it sees.
//!
//! Scenario (003's claim on a mock 15Gi T4): a pod as root and a pod as uid 65534 share the card
//! and both see `CUDA_DEVICE_MEMORY_LIMIT_0=4096m` and SM limit 50, which their claims'
//! `status.devices` (written by the driver under the chart's RBAC) say too; a third such claim
//! cannot fit (150 cores) and its pod waits; deleting a pod unprepares its claim (its CDI spec is removed)
//! and the waiting pod starts; a kubelet restart leaves running pods alone and their claims
//! prepared; so does a driver restart, which rewrites no spec; a reboot (containers gone, the CDI
//! directory wiped, the kubelet restarted) brings the pods back with their specs rewritten and
//! the same limits. Last, the compatibility path: 003's pod as written for HAMi
//! (`nvidia.com/gpu: 1`, `nvidia.com/gpumem: 4096`, `nvidia.com/gpucores: 50`) is converted by
//! our admission webhook into a claim, starts on a share freed for it, and sees the same limits.
//! Then the node monitor, with the stand-in's regions and kernel launches: a running pod's usage
//! in the metrics (and in `kubectl vgpu usage --metrics`), a lone active pod bursting and
//! throttled again when a second is active, and a priority-0 pod blocking a priority-1 one within
//! two ticks and releasing it when it stops.
//! Then a pod fills its claim directory with what a hostile tenant would (50,000 nested
//! directories, 20,000 files, a FIFO, links to host files) and ends: the driver unprepares it and
//! stays up.
//!
//! As in a cluster: the driver runs with the chart's service account, RBAC and admission
//! policies (a token bound to a pod on the node), the API server authorizes the kubelet with the
//! Node authorizer and NodeRestriction, and the kubelet asks the API server who may use its API.
//!
//! Needs root, overlayfs, namespaces, cgroups (see `vgpu_dra_integration::node`), a C compiler,
//! and the node's components from `integration/k8s/build-node.sh`. A missing one fails the test
//! by name; it never skips.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::chart::{chart_dir, helm, run_as_daemonset_pod};
use common::pod_report::{POD_SCRIPT, check, wait_output};
use common::{card_uuid, status_devices, webhook};
use serde_json::Value;
use vgpu_dra_integration::node::{BUSYBOX_IMAGE, DYNAMIC_PROGRAM, Node, build_stand_in};
use vgpu_dra_integration::{ControlPlane, Kubectl, ManagedProcess, eventually, free_port, http_get, node_host_dir};

const NODE: &str = "gpu-node";
/// `nobody`: stands for any user but root that a container runs as.
const NOBODY: u32 = 65534;

#[test]
fn pods_on_a_real_node_see_their_claims_limits_as_root_and_as_nobody() {
    let mut plane = ControlPlane::start().expect("control plane");
    let started = Instant::now();
    let mut node = Node::start(&plane, NODE).unwrap_or_else(|e| panic!("starting the node: {e:#}"));
    eprintln!("node up in {:.1} s", started.elapsed().as_secs_f64());
    // Panicking while the node and the plane are alive prints their logs.
    if let Err(e) = scenario(&mut plane, &mut node) {
        panic!("{e:#}");
    }
}

fn scenario(plane: &mut ControlPlane, node: &mut Node) -> anyhow::Result<()> {
    let kubectl = plane.kubectl().clone();
    let host = node_host_dir(plane, NODE);
    let (vgpu, lock) = (host.join("vgpu"), host.join("vgpulock"));
    std::fs::create_dir_all(&vgpu)?;
    build_stand_in(&vgpu.join("libvgpu.so"), &lock)?;
    install_chart(plane)?;
    let metrics_port = free_port()?;
    let mut driver = chart_driver(plane, metrics_port)?;
    let card = eventually("the node's ResourceSlice", Duration::from_secs(60), || {
        driver.check_running()?;
        node.check_running()?;
        card_uuid(&kubectl, "hami-gpu-0")
    })?;

    // Two pods share the card: root and nobody, each with 003's claim.
    kubectl.apply(&claim_and_pod("as-root", "4Gi", "50", None))?;
    kubectl.apply(&claim_and_pod("as-nobody", "4Gi", "50", Some(NOBODY)))?;
    let mut uids = BTreeMap::new();
    for (pod, uid) in [("as-root", 0), ("as-nobody", NOBODY)] {
        let seen = wait_output(node, &kubectl, pod).with_context(|| format!("pod {pod}"))?;
        eprintln!("pod {pod} printed:\n{}", seen.raw);
        driver.check_running()?;
        let claim_uid = kubectl.run(&["get", "resourceclaim", pod, "-o", "jsonpath={.metadata.uid}"])?;
        let claim_dir = vgpu.join("claims").join(&claim_uid);
        let cache = format!("{}/{card}.cache", claim_dir.display());
        check(&seen, pod, uid, &card, &cache).with_context(|| format!("what pod {pod} (uid {uid}) saw:\n{}", seen.raw))?;
        uids.insert(pod, claim_uid);
        // The claim's status says what the container saw (KEP-4817), written under the chart's
        // token and RBAC: the card and its limits.
        let entry = eventually(&format!("{pod}'s claim status.devices"), Duration::from_secs(30), || {
            driver.check_running()?;
            Ok(status_devices(&kubectl, "default", pod)?.into_iter().next())
        })?;
        let data = &entry["data"];
        ensure!(
            data["uuid"] == card.as_str() && data["memoryLimit"] == "4096m" && data["smLimit"] == "50" && data["cudaIndex"] == 0,
            "{pod}'s claim status says {entry}"
        );
        // `kubectl vgpu why` shows the driver's word once it is there.
        let why = webhook::vgpu(plane, &["why", pod])?;
        ensure!(
            why.contains("Limits (prepared, as the driver wrote them): CUDA_DEVICE_MEMORY_LIMIT_0=4096m")
                && why.contains(card.as_str()),
            "kubectl vgpu why {pod}:\n{why}"
        );
    }

    // A third share cannot fit (150 of 100 cores): its pod waits, its claim stays unallocated.
    kubectl.apply(&claim_and_pod("third", "4Gi", "50", None))?;
    std::thread::sleep(Duration::from_secs(5));
    let third = kubectl.get_json(&["pod", "third"])?;
    ensure!(third["spec"]["nodeName"].is_null(), "a third 50-core share was scheduled onto a 100-core card: {third}");
    let claim = kubectl.get_json(&["resourceclaim", "third"])?;
    ensure!(claim["status"]["allocation"].is_null(), "a third 50-core share was allocated: {claim}");

    // Deleting a pod unprepares its claim: the kubelet calls the driver, which removes the spec.
    ensure!(cdi_specs(node, &uids["as-root"]) == 1, "no CDI spec of as-root's claim in {}", node.cdi_dir().display());
    kubectl.run(&["delete", "pod", "as-root", "--wait=false"])?;
    eventually("as-root's claim unprepared (its CDI spec removed)", Duration::from_secs(60), || {
        node.check_running()?;
        driver.check_running()?;
        Ok((cdi_specs(node, &uids["as-root"]) == 0).then_some(()))
    })?;
    // Its share is free again: the waiting pod gets it and starts.
    let seen = wait_output(node, &kubectl, "third").context("pod third, once a share was free")?;
    ensure!(seen.record.get("memory").map(String::as_str) == Some("4096m"), "pod third saw:\n{}", seen.raw);

    // A kubelet restart leaves running containers alone and their claims prepared.
    let before = container_ids(&kubectl, &["as-nobody", "third"])?;
    node.restart_kubelet().context("restarting the kubelet")?;
    std::thread::sleep(Duration::from_secs(10));
    node.check_running()?;
    let after = container_ids(&kubectl, &["as-nobody", "third"])?;
    ensure!(before == after, "containers changed across a kubelet restart: before {before:?}, after {after:?}");
    let running = ["as-nobody", "third"];
    let mut claim_uids = Vec::new();
    for pod in running {
        let uid = kubectl.run(&["get", "resourceclaim", pod, "-o", "jsonpath={.metadata.uid}"])?;
        ensure!(cdi_specs(node, &uid) == 1, "{pod}'s claim lost its CDI spec across a kubelet restart");
        claim_uids.push(uid);
    }
    driver.check_running()?;

    // A driver restart while pods run: they keep running, their specs stay as they were.
    let specs = spec_files(node)?;
    driver.stop();
    let mut driver = chart_driver(plane, metrics_port)?;
    eventually("the restarted driver's ResourceSlice", Duration::from_secs(60), || {
        driver.check_running()?;
        card_uuid(&kubectl, "hami-gpu-0")
    })?;
    std::thread::sleep(Duration::from_secs(5));
    driver.check_running()?;
    node.check_running()?;
    ensure!(container_ids(&kubectl, &running)? == after, "containers changed across a driver restart");
    ensure!(spec_files(node)? == specs, "CDI specs changed across a driver restart: before {specs:?}");

    // A reboot: every container gone, the CDI directory (a tmpfs on a real node) empty, the
    // kubelet started again. It prepares the claims again, the driver rewrites their specs, and
    // the pods run again with the same limits.
    node.stop_kubelet();
    node.kill_containers();
    for entry in std::fs::read_dir(node.cdi_dir())? {
        std::fs::remove_file(entry?.path())?;
    }
    node.start_kubelet().context("starting the kubelet after the reboot")?;
    for (pod, (uid, claim_uid)) in running.iter().zip([(NOBODY, &claim_uids[0]), (0, &claim_uids[1])]) {
        eventually(&format!("pod {pod} restarted after the reboot"), Duration::from_secs(120), || {
            node.check_running()?;
            driver.check_running()?;
            let p = kubectl.get_json(&["pod", pod])?;
            let status = &p["status"]["containerStatuses"][0];
            Ok((status["restartCount"].as_u64().unwrap_or(0) >= 1 && status["state"]["running"].is_object()).then_some(()))
        })?;
        let seen = wait_output(node, &kubectl, pod).with_context(|| format!("pod {pod} after the reboot"))?;
        let cache = format!("{}/{card}.cache", vgpu.join("claims").join(claim_uid).display());
        check(&seen, pod, uid, &card, &cache).with_context(|| format!("what pod {pod} saw after the reboot:\n{}", seen.raw))?;
        ensure!(cdi_specs(node, claim_uid) == 1, "{pod}'s claim has no CDI spec after the reboot");
    }

    // The compatibility path, on the share pod third frees.
    kubectl.run(&["delete", "pod", "third", "--wait=false"])?;
    eventually("third's claim unprepared", Duration::from_secs(60), || {
        node.check_running()?;
        driver.check_running()?;
        Ok((cdi_specs(node, &claim_uids[1]) == 0).then_some(()))
    })?;
    let mut webhook = start_webhook(plane)?;
    hami_pod_through_the_webhook(node, &kubectl, &vgpu, &card).context("003's pod written for HAMi")?;
    webhook.check_running()?;
    driver.check_running()?;
    // as-nobody and 003's pod hold all the card's cores (50 each): the next pod asks 0 cores,
    // which HAMi's fit rule keeps off such a card, so as-nobody leaves first.
    kubectl.run(&["delete", "pod", "as-nobody", "--wait=false"])?;
    eventually("as-nobody's claim unprepared", Duration::from_secs(60), || {
        node.check_running()?;
        driver.check_running()?;
        Ok((cdi_specs(node, &claim_uids[0]) == 0).then_some(()))
    })?;
    node_monitor(plane, node, &kubectl, &mut driver, &vgpu, &card, metrics_port).context("the node monitor")?;
    // Last: its clean-up empties the claims' root.
    hostile_claim_directory(node, &kubectl, &mut driver, &vgpu).context("a pod that fills its claim directory")?;
    Ok(())
}

const CHART_NS: &str = "vgpu-dra";

/// The chart with its defaults (the webhook left out: this test starts its own), as the cluster
/// would get it: the driver's service account, RBAC and admission policies, and the DeviceClass.
fn install_chart(plane: &ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl();
    kubectl.run(&["create", "namespace", CHART_NS])?;
    let chart = chart_dir();
    let chart = chart.to_str().context("chart path")?;
    let rendered = helm(
        plane,
        &[
            "template",
            "vgpu-dra",
            chart,
            "-n",
            CHART_NS,
            "--set",
            "image.repository=registry.example.com/vgpu-dra",
            "--set",
            "webhook.enabled=false",
        ],
    )?;
    kubectl.apply(&rendered)?;
    Ok(())
}

/// The driver as the chart's DaemonSet runs it on this node: its arguments, and the token of its
/// service account bound to a pod on the node (the slice policy checks the node it names), so it
/// can do only what the chart allows.
fn chart_driver(plane: &ControlPlane, metrics_port: u16) -> anyhow::Result<ManagedProcess> {
    let metrics = format!("--metrics-address=127.0.0.1:{metrics_port}");
    let extra = ["--mock-gpus=1xTesla T4:15Gi", "--state-check-ms=1000", &metrics, MONITOR_INTERVAL, "--legacy-metrics=true"];
    Ok(run_as_daemonset_pod(plane, CHART_NS, "vgpu-dra", NODE, &extra)?.process)
}

/// The node monitor's tick in this test: a fifth of HAMi's 5 s, so its cases take seconds.
const MONITOR_INTERVAL: &str = "--monitor-interval-ms=1000";
const TICK: Duration = Duration::from_secs(1);

/// Finding 1 of the tenant-safety issue, on a real node: a pod nests 50,000 directories in its
/// claim directory (1,000 levels at a time, moved under the next, so no path grows past
/// PATH_MAX), adds 20,000 files, a FIFO and links to a host file and directory, and ends. The kubelet
/// unprepares its claim; the driver answers, keeps running (a removal that recursed per level
/// overflowed its stack here), the directory leaves at once and its content is removed in the
/// background, and the file the link names is untouched.
fn hostile_claim_directory(node: &mut Node, kubectl: &Kubectl, driver: &mut ManagedProcess, vgpu: &Path) -> anyhow::Result<()> {
    let name = "deep-tree";
    let _cleanup = DeepTreeCleanup(vgpu.join("claims"));
    let script = serde_json::to_string(HOSTILE_SCRIPT)?;
    // A host file the pod links to (by its host path): a removal that followed links would take it.
    let sentinel = vgpu.join("sentinel");
    std::fs::write(&sentinel, "keep")?;
    let pod = format!(
        r#"{}---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {NODE}}}
  hostNetwork: true
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", {script}]
    env: [{{name: SENTINEL, value: "{sentinel}"}}]
    resources: {{claims: [{{name: gpu}}]}}
"#,
        common::claim_yaml(name, "1Gi", "0"),
        sentinel = sentinel.display()
    );
    kubectl.apply(&pod)?;
    let claim_uid = eventually("the deep-tree claim allocated", Duration::from_secs(60), || {
        let uid = kubectl.run(&["get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}"])?;
        let claim = kubectl.get_json(&["resourceclaim", name])?;
        Ok(claim["status"]["allocation"].is_object().then_some(uid))
    })?;
    let seen = eventually("the deep-tree pod done", Duration::from_secs(180), || {
        node.check_running()?;
        driver.check_running()?;
        let pod = kubectl.get_json(&["pod", name])?;
        Ok((pod["status"]["phase"] == "Succeeded" || pod["status"]["phase"] == "Failed").then_some(pod))
    })?;
    let log = node.container_log("default", name, "main")?;
    ensure!(
        seen["status"]["phase"] == "Succeeded" && log.contains("levels=50\n"),
        "the pod did not build its tree: {log}\n{}",
        seen["status"]
    );
    let dir = vgpu.join("claims").join(&claim_uid);
    eventually("the deep-tree claim unprepared", Duration::from_secs(120), || {
        node.check_running()?;
        driver.check_running()?;
        Ok((cdi_specs(node, &claim_uid) == 0 && !dir.exists()).then_some(()))
    })?;
    let trash = vgpu.join("claims").join(".trash");
    eventually("the claim directory removed from the trash", Duration::from_secs(120), || {
        driver.check_running()?;
        Ok(std::fs::read_dir(&trash).map_or(true, |mut d| d.next().is_none()).then_some(()))
    })?;
    ensure!(std::fs::read_to_string(&sentinel)? == "keep", "the host file the pod linked to was touched");
    driver.check_running()
}

/// Removes what is left under the claims' root when the hostile scenario ends, so that a failing
/// driver does not leave a tree the test bed's own clean-up (the standard library's recursive
/// removal, as in the driver before) would overflow this test's stack on.
struct DeepTreeCleanup(std::path::PathBuf);

impl Drop for DeepTreeCleanup {
    fn drop(&mut self) {
        let trash = vgpu_dra::plugin::storage::trash::Trash::new(&self.0);
        for entry in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if entry.file_name() != vgpu_dra::plugin::storage::trash::TRASH_DIR {
                let _ = trash.discard(&entry.path());
            }
        }
        for _ in 0..100 {
            if trash.empty(vgpu_dra::plugin::storage::trash::DEFAULT_BUDGET).left == 0 {
                break;
            }
        }
    }
}

/// What the hostile pod runs in its claim directory.
const HOSTILE_SCRIPT: &str = r#"dir="${CUDA_DEVICE_MEMORY_SHARED_CACHE%/*}"
cd "$dir" || exit 1
mkfifo fifo
ln -s "$SENTINEL" link
ln -s "${SENTINEL%/*}" link-to-dir
mkdir wide
i=0; while [ $i -lt 20000 ]; do : > wide/f$i; i=$((i+1)); done
chain=$(i=0; while [ $i -lt 1000 ]; do printf d/; i=$((i+1)); done)
mkdir tree
n=0; while [ $n -lt 50 ]; do mkdir -p "next/$chain" && mv tree "next/$chain" && mv next tree || break; n=$((n+1)); done
echo "levels=$n"
"#;

/// The node monitor with the stand-in's regions: (a) a running pod's usage in the metrics under
/// HAMi DRA's and HAMi's legacy names; (c) a lone active pod may burst (its switch goes to 0) and
/// is throttled again (1) once a second pod is active on the card; (b) that second pod has
/// priority 0, so the first (priority 1) is blocked within two ticks of it becoming active and
/// released once it stops. 003's pod converted by the webhook still holds 50 cores of the card,
/// idle: an idle pod changes nothing.
fn node_monitor(
    plane: &ControlPlane,
    node: &mut Node,
    kubectl: &Kubectl,
    driver: &mut ManagedProcess,
    vgpu: &Path,
    card: &str,
    metrics_port: u16,
) -> anyhow::Result<()> {
    kubectl.apply(&monitored_pod("lone", None))?;
    let lone = running_claim_dir(node, kubectl, driver, vgpu, "lone")?;
    let uid = lone.file_name().and_then(|n| n.to_str()).context("claim directory name")?.to_owned();
    let region = lone.join(format!("{card}.cache"));
    let labels =
        format!(r#"namespace="default",pod="lone",container="main",claim_uid="{uid}",vdevice_index="0",device_uuid="{card}""#);
    let legacy = format!(r#"podnamespace="default",podname="lone",ctrname="main",vdeviceid="0",deviceuuid="{card}",zone="vGPU""#);
    let wanted = [
        (format!("hami_vgpu_memory_used_bytes{{{labels}}}"), 1_073_741_824.0),
        (format!("hami_vgpu_memory_limit_bytes{{{labels}}}"), 2_147_483_648.0),
        (format!("hami_container_device_utilization_ratio{{{labels}}}"), 15.0),
        (format!("vGPU_device_memory_usage_in_bytes{{{legacy}}}"), 1_073_741_824.0),
        (format!("vGPU_device_memory_limit_in_bytes{{{legacy}}}"), 2_147_483_648.0),
    ];
    eventually("the lone pod's usage in the driver's metrics", Duration::from_secs(30), || {
        driver.check_running()?;
        let text = http_get(metrics_port, "/metrics")?;
        Ok(wanted.iter().all(|(series, value)| metric(&text, series) == Some(*value)).then_some(()))
    })
    .with_context(|| format!("wanted:\n{wanted:#?}\ngot:\n{}", http_get(metrics_port, "/metrics").unwrap_or_default()))?;
    // `kubectl vgpu usage --live` shows it beside the allocation.
    let table = webhook::vgpu(plane, &["usage", "--metrics", &format!("http://127.0.0.1:{metrics_port}/metrics")])?;
    let row = table.lines().find(|l| l.contains("hami-gpu-0")).with_context(|| format!("no card row:\n{table}"))?;
    ensure!(table.lines().next().is_some_and(|h| h.contains("USED") && h.contains("SM")), "no live columns:\n{table}");
    // The 003 pod's region has no memory in use; the lone pod's 1Gi of its 2Gi, 15 % of the SMs.
    ensure!(row.contains("1Gi/6Gi") && row.contains("15%"), "the card's live figures are wrong:\n{table}");

    // (c) Alone and active, it may use the idle card.
    std::fs::write(lone.join("stand-in-active"), "")?;
    eventually("the lone active pod's switch off (bursting)", 4 * TICK, || {
        Ok((region_field(&region, SWITCH)? == 0).then_some(()))
    })?;
    // The launcher looks every 200 ms.
    eventually("the lone pod's launcher seeing its switch off", 2 * TICK, || {
        Ok(events(&lone)?.contains(&("switch".into(), 0)).then_some(()))
    })?;

    // (b) A priority-0 pod becomes active on the same card.
    kubectl.apply(&monitored_pod("high", Some(0)))?;
    let high = running_claim_dir(node, kubectl, driver, vgpu, "high")?;
    // HAMi-core initialises a region as just active (recent_kernel 2), so the new pod may block
    // the other for its first tick, as under HAMi; idle, it blocks nothing after that.
    eventually("the lone pod running beside an idle high-priority pod", 5 * TICK, || {
        Ok((region_field(&region, RECENT_KERNEL)? >= 0 && events(&lone)?.last() != Some(&("blocked".into(), 1))).then_some(()))
    })?;
    let before = events(&lone)?.len();
    let since = |what: (&str, i32)| -> anyhow::Result<bool> { Ok(events(&lone)?[before..].contains(&(what.0.into(), what.1))) };
    std::fs::write(high.join("stand-in-active"), "")?;
    let active = Instant::now();
    eventually("the low-priority pod blocked", 10 * TICK, || Ok(since(("blocked", 1))?.then_some(())))?;
    let blocked_after = active.elapsed();
    eprintln!("the low-priority pod was blocked {:.1} s after the high one became active", blocked_after.as_secs_f64());
    // Two ticks, and the stand-in's 200 ms between launches on each side.
    ensure!(blocked_after <= 2 * TICK + Duration::from_millis(900), "blocked only after {blocked_after:?}");
    eventually("the lone pod throttled beside an active high-priority pod", TICK, || {
        Ok((region_field(&region, SWITCH)? == 1).then_some(()))
    })?;
    eventually("the lone pod's launcher seeing its switch on again", 2 * TICK, || Ok(since(("switch", 1))?.then_some(())))?;
    // The high one stops: the low one runs again.
    std::fs::remove_file(high.join("stand-in-active"))?;
    eventually("the low-priority pod released", 10 * TICK, || Ok(since(("blocked", 0))?.then_some(())))?;
    ensure!(region_field(&region, RECENT_KERNEL)? >= 0, "released but recent_kernel is still negative");
    driver.check_running()?;

    // Unprepared claims take their series with them.
    let high_uid = high.file_name().and_then(|n| n.to_str()).context("claim directory name")?.to_owned();
    kubectl.run(&["delete", "pod", "lone", "high", "--wait=false"])?;
    eventually("the two claims' series gone", Duration::from_secs(60), || {
        driver.check_running()?;
        let text = http_get(metrics_port, "/metrics")?;
        Ok((!text.contains(&uid) && !text.contains(&high_uid)).then_some(()))
    })?;
    Ok(())
}

/// The value of the series `series` (name and labels as printed) in a metrics page.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `SWITCH` and `RECENT_KERNEL`: the two fields the monitor writes.
const SWITCH: usize = vgpu_dra::monitor::region::offset::UTILIZATION_SWITCH;
const RECENT_KERNEL: usize = vgpu_dra::monitor::region::offset::RECENT_KERNEL;

fn region_field(path: &Path, at: usize) -> anyhow::Result<i32> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let word = bytes.get(at..at + 4).with_context(|| format!("{} has {} bytes", path.display(), bytes.len()))?;
    Ok(i32::from_ne_bytes(word.try_into()?))
}

/// What the stand-in's launcher recorded: `(what, value)` in order.
fn events(dir: &Path) -> anyhow::Result<Vec<(String, i32)>> {
    let text = std::fs::read_to_string(dir.join("stand-in-events")).unwrap_or_default();
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace().skip(1);
            Some((parts.next()?.to_owned(), parts.next()?.parse().ok()?))
        })
        .collect())
}

/// Waits for pod `name` to run and returns its claim's host directory.
fn running_claim_dir(
    node: &mut Node,
    kubectl: &Kubectl,
    driver: &mut ManagedProcess,
    vgpu: &Path,
    name: &str,
) -> anyhow::Result<std::path::PathBuf> {
    eventually(&format!("pod {name} running with its stand-in launcher"), Duration::from_secs(120), || {
        node.check_running()?;
        driver.check_running()?;
        let pod = kubectl.get_json(&["pod", name])?;
        if pod["status"]["phase"] != "Running" {
            return Ok(None);
        }
        let uid = kubectl.run(&["get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}"])?;
        let dir = vgpu.join("claims").join(uid);
        Ok(dir.join("stand-in-events").exists().then_some(dir))
    })
}

/// A 2Gi, 20-core claim (with HAMi-core's task priority when given) and a pod whose program
/// loads the stand-in with a kernel launcher, 1 GiB in use and 15 % of the SMs.
fn monitored_pod(name: &str, priority: Option<i64>) -> String {
    let config = priority.map_or_else(String::new, |p| {
        format!(
            r#"    config:
    - opaque:
        driver: {DRIVER}
        parameters: {{apiVersion: {DRIVER}/v1alpha1, kind: HamiCoreConfig, taskPriority: {p}}}
"#,
            DRIVER = common::DRIVER
        )
    });
    format!(
        r#"{claim}{config}---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {NODE}}}
  hostNetwork: true
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["{DYNAMIC_PROGRAM}", "sleep", "3600"]
    env:
    - {{name: STAND_IN_KERNELS, value: "1"}}
    - {{name: STAND_IN_MEMORY_BYTES, value: "1073741824"}}
    - {{name: STAND_IN_SM_UTIL, value: "15"}}
    resources: {{claims: [{{name: gpu}}]}}
"#,
        claim = common::claim_yaml(name, "2Gi", "20")
    )
}

/// `vgpu-dra webhook` on loopback, registered, and called by the API server for HAMi's pods.
fn start_webhook(plane: &ControlPlane) -> anyhow::Result<ManagedProcess> {
    // The chart's namespace: the webhook runs in the release namespace, as the chart puts it.
    plane.kubectl().run(&["get", "namespace", CHART_NS])?;
    let port = free_port()?;
    let metrics = format!("--metrics-address=127.0.0.1:{}", free_port()?);
    let mut webhook = webhook::spawn(plane, "vgpu-dra-webhook", (port, port), "vgpu-dra", &[metrics])?;
    webhook::wait_called(plane, &mut webhook, &hami_pod("probe"))?;
    Ok(webhook)
}

/// 003's pod as written for HAMi's device plugin: one card, 4096 MiB, 50% of its cores; on this
/// node, with the test image and [`POD_SCRIPT`]. Unlike the others it has a network namespace of
/// its own and a service-account token, as most pods do.
fn hami_pod(name: &str) -> String {
    common::pod_report::hami_pod_003(name, &format!("  nodeSelector: {{kubernetes.io/hostname: {NODE}}}\n"))
}

/// Creates [`hami_pod`], checks that the webhook turned its HAMi resources into a claim, and that
/// its container sees what 003's claim gives.
fn hami_pod_through_the_webhook(node: &mut Node, kubectl: &Kubectl, vgpu: &Path, card: &str) -> anyhow::Result<()> {
    let name = "hami-pod";
    kubectl.apply(&hami_pod(name))?;
    let pod = kubectl.get_json(&["pod", name])?;
    let spec = &pod["spec"];
    ensure!(spec["resourceClaims"][0]["resourceClaimTemplateName"].is_string(), "the webhook did not convert the pod: {pod:#}");
    let limits = &spec["containers"][0]["resources"]["limits"];
    for resource in ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"] {
        ensure!(limits.get(resource).is_none(), "{resource} is still among the limits: {pod:#}");
    }
    let seen = wait_output(node, kubectl, name)?;
    eprintln!("pod {name} printed:\n{}", seen.raw);
    let pod = kubectl.get_json(&["pod", name])?;
    let claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .with_context(|| format!("pod {name} names no claim: {}", pod["status"]))?;
    let claim_uid = kubectl.run(&["get", "resourceclaim", claim, "-o", "jsonpath={.metadata.uid}"])?;
    let cache = format!("{}/{card}.cache", vgpu.join("claims").join(&claim_uid).display());
    check(&seen, name, 0, card, &cache).with_context(|| format!("what pod {name} saw:\n{}", seen.raw))?;
    ensure!(cdi_specs(node, &claim_uid) == 1, "{name}'s claim {claim} has no CDI spec");
    // The token the kubelet mounted (a tmpfs in the node's mount namespace) is what the container
    // sees, and the pod has an address of its own (the node's CNI plugin).
    ensure!(
        seen.flags.get("token").map(String::as_str) == Some("mounted"),
        "pod {name} sees no service-account token:\n{}",
        seen.raw
    );
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    ensure!(ip.starts_with("10.") && pod["spec"]["hostNetwork"].is_null(), "pod {name}: podIP {ip:?}: {}", pod["status"]);
    Ok(())
}

/// A claim of `memory` and `cores` and a pod using it, running as `user` (the image's default,
/// root, when `None`).
fn claim_and_pod(name: &str, memory: &str, cores: &str, user: Option<u32>) -> String {
    let security = user
        .map_or_else(String::new, |u| format!("  securityContext: {{runAsUser: {u}, runAsGroup: {u}, runAsNonRoot: true}}\n"));
    let script = POD_SCRIPT.replace("DYNAMIC_PROGRAM", DYNAMIC_PROGRAM);
    let script = serde_json::to_string(&script).unwrap();
    format!(
        r#"{}---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {NODE}}}
  hostNetwork: true
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
{security}  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", {script}]
    resources: {{claims: [{{name: gpu}}]}}
"#,
        common::claim_yaml(name, memory, cores)
    )
}

/// The node's CDI spec files, with their contents (not the hidden temp files the driver keeps
/// for its next prepares, which no runtime reads).
fn spec_files(node: &Node) -> anyhow::Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(node.cdi_dir())? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            files.insert(name, std::fs::read_to_string(entry.path())?);
        }
    }
    Ok(files)
}

/// How many CDI spec files of claim `uid` the node's CDI directory holds.
fn cdi_specs(node: &Node, uid: &str) -> usize {
    std::fs::read_dir(node.cdi_dir())
        .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().contains(uid)).count())
        .unwrap_or(0)
}

/// The container ID and restart count of each pod's container.
fn container_ids(kubectl: &Kubectl, pods: &[&str]) -> anyhow::Result<Vec<(String, Value, Value)>> {
    pods.iter()
        .map(|pod| {
            let p = kubectl.get_json(&["pod", pod])?;
            let status = &p["status"]["containerStatuses"][0];
            Ok(((*pod).to_owned(), status["containerID"].clone(), status["restartCount"].clone()))
        })
        .collect()
}
