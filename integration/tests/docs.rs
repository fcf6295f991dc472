//! Every example in `docs/` runs here, in page order, against a real API server, scheduler and
//! controller manager: `sh` blocks through bash with the test bed's kubectl and helm, `yaml`
//! blocks applied (or, when tagged, rendered as chart values, read as a driver config file, or
//! decoded by Kueue's own types). The quick start's node is a real one (a kubelet and containerd,
//! `vgpu_dra_integration::node`) with a mock card; the test stands in for what the chart's
//! DaemonSet would start there: it runs the driver as the DaemonSet's pod, and builds the
//! stand-in for HAMi-core's `libvgpu.so` into the node's HAMi-core directory. The kubelet prepares
//! the quick start's claims through the driver and runs its pods: the one that prints its limits
//! runs to completion, and what `kubectl logs` shows of it is checked.
//!
//! Volcano's blocks cannot run against Volcano here (the suite cannot build it, see
//! docs/volcano.md): `yaml volcano` blocks go to the API server as a server-side dry run with
//! Volcano's CRDs installed (schema-checked, not scheduled), the `yaml volcano-scheduler-conf`
//! block must be the configuration `integration/tests/volcano.rs` runs Volcano with, and
//! `sh syntax-only` blocks (commands that build or run Volcano) are only parsed by bash.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::cdi_check;
use common::chart::{chart_dir, run_as_daemonset_pod};
use serde_json::Value;
use vgpu_dra_integration::kueue::{Kueue, KueueVersion};
use vgpu_dra_integration::node::{Node, build_stand_in};
use vgpu_dra_integration::{ControlPlane, driver_binary, eventually, node_host_dir};

/// The pages, in the order a reader follows them; the quick start's clean-up runs last.
const PAGES: [&str; 12] = [
    "quickstart.md",
    "resource-model.md",
    "configuration.md",
    "compatibility.md",
    "migration.md",
    "troubleshooting.md",
    "kueue.md",
    "volcano.md",
    "metrics.md",
    "quotas.md",
    "security.md",
    "README.md",
];
/// Where docs/security.md puts the API server's admission files.
const ADMISSION_DIR: &str = "/etc/kubernetes/admission/";
const NODE: &str = "gpu-node-1";

#[derive(Debug)]
struct Block {
    page: &'static str,
    line: usize,
    section: String,
    lang: String,
    tag: String,
    body: String,
}

impl Block {
    fn at(&self) -> String {
        format!("docs/{}:{}", self.page, self.line)
    }
}

fn docs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

fn blocks(page: &'static str) -> Vec<Block> {
    let text = std::fs::read_to_string(docs_dir().join(page)).unwrap();
    let (mut out, mut section, mut open): (Vec<Block>, String, Option<Block>) = (Vec::new(), String::new(), None);
    for (i, line) in text.lines().enumerate() {
        if let Some(block) = open.as_mut() {
            if line.trim_end() == "```" {
                out.extend(open.take());
            } else {
                block.body.push_str(line);
                block.body.push('\n');
            }
        } else if let Some(info) = line.strip_prefix("```") {
            let mut words = info.split_whitespace();
            let lang = words.next().unwrap_or_default().to_owned();
            let tag = words.collect::<Vec<_>>().join(" ");
            open = Some(Block { page, line: i + 1, section: section.clone(), lang, tag, body: String::new() });
        } else if let Some(h) = line.strip_prefix("## ") {
            section = h.trim().to_owned();
        }
    }
    assert!(open.is_none(), "docs/{page}: unclosed code block");
    out
}

/// What the quick start's pod that prints its limits shows in `kubectl logs`, besides the
/// library in `/etc/ld.so.preload` (the node's stand-in for `/usr/local/vgpu/libvgpu.so`).
const LIMITS_SHOWN: [&str; 3] = ["CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT=50", "CUDA_DEVICE_SM_LIMIT_0=50"];

struct Docs {
    /// The Kueue of the last manager Configuration block (stopped before the plane).
    kueue: Option<Kueue>,
    /// The quick start's node (stopped before the plane).
    node: Node,
    plane: ControlPlane,
    driver: Option<common::chart::DaemonSetPod>,
    scratch: PathBuf,
    /// Whether Volcano's CRDs are installed (at the first `yaml volcano` block).
    volcano_crds: bool,
}

impl Docs {
    /// Runs an `sh` block; returns what it printed on stdout.
    fn sh(&self, block: &Block) -> String {
        let bins = self.plane.components();
        // With vgpu-dra and kubectl-vgpu (the pages' `vgpu-dra convert`, `kubectl vgpu`).
        let path = format!(
            "{}:{}:{}:{}",
            bins.kubectl.parent().unwrap().display(),
            bins.helm.parent().unwrap().display(),
            vgpu_dra_integration::plugin_dir().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let home = self.plane.dir().join("helm-home");
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block.body])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .env("PATH", path)
            .env("KUBECONFIG", self.plane.kubeconfig())
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            // The CA of the client certificate the API server presents to webhooks (the install
            // lines give it to the chart; docs/security.md makes one).
            .env("WEBHOOK_CLIENT_CA", self.plane.webhook_client_ca())
            .output()
            .unwrap();
        eprintln!("--- {} ---\n{}{}", block.at(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{} failed:\n{}\n{}", block.at(), block.body, String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn file(&self, block: &Block) -> PathBuf {
        let path = self.scratch.join(format!("{}-{}.yaml", block.page.trim_end_matches(".md"), block.line));
        std::fs::write(&path, &block.body).unwrap();
        path
    }

    fn run(&mut self, block: &Block) {
        match (block.lang.as_str(), block.tag.as_str()) {
            ("text", _) => {}
            ("sh", "") => {
                let printed = self.sh(block);
                if block.body.contains("helm install") {
                    if block.page == "quickstart.md" {
                        // tests/helm_install.rs runs this block, placeholders put in, on a real node.
                        let installed = common::quickstart::install_block().unwrap_or_else(|e| panic!("{}: {e:#}", block.at()));
                        assert_eq!(
                            installed.trim(),
                            block.body.trim(),
                            "{}: not the block the helm install test runs",
                            block.at()
                        );
                    }
                    self.start_driver();
                }
                if block.body.contains("kubectl logs") {
                    self.node.check_running().unwrap();
                    let hami_core = node_host_dir(&self.plane, NODE).join("vgpu");
                    let library = hami_core.join("libvgpu.so").display().to_string();
                    let cache = format!("CUDA_DEVICE_MEMORY_SHARED_CACHE={}/claims/", hami_core.display());
                    for want in LIMITS_SHOWN.into_iter().chain([library.as_str()]) {
                        assert!(
                            printed.lines().any(|l| l == want),
                            "{}: the container did not show {want}:\n{printed}",
                            block.at()
                        );
                    }
                    assert!(printed.lines().any(|l| l.starts_with(&cache)), "{}: no {cache}...:\n{printed}", block.at());
                }
            }
            ("yaml", "") => {
                let applied = self.plane.kubectl().apply(&block.body);
                assert!(applied.is_ok(), "{}: {:#}", block.at(), applied.unwrap_err());
                if block.body.contains("name: cuda-smoke") {
                    self.check_quickstart_claim("cuda-smoke");
                }
            }
            ("yaml", "values") => {
                let values = self.file(block);
                let client_auth = common::chart::client_auth_sets(&self.plane);
                let chart = chart_dir();
                let rendered = common::chart::helm(
                    &self.plane,
                    // Every install names the image the user built (README) and the CA of the
                    // API server's client certificate (security.md); values files need not.
                    &[
                        "template",
                        "docs-values",
                        chart.to_str().unwrap(),
                        "-n",
                        "vgpu-dra",
                        "--set",
                        "image.repository=registry.example.com/vgpu-dra",
                    ]
                    .into_iter()
                    .chain(client_auth.iter().map(String::as_str))
                    .chain(["-f", values.to_str().unwrap()])
                    .collect::<Vec<_>>(),
                );
                let rendered = rendered.unwrap_or_else(|e| panic!("{}: {e:#}", block.at()));
                let checked = self.plane.kubectl().run_with_input(
                    &["apply", "--server-side", "--dry-run=server", "--force-conflicts", "-f", "-"],
                    Some(&rendered),
                );
                assert!(checked.is_ok(), "{}: {:#}", block.at(), checked.unwrap_err());
            }
            ("yaml", tag @ ("admission-config" | "admission-kubeconfig")) => {
                // The files the test bed's API server runs with, in its own directory.
                let dir = self.plane.webhook_client_ca().parent().unwrap().to_owned();
                let file = if tag == "admission-config" { "admission-config.yaml" } else { "webhook-client.kubeconfig" };
                let ran = std::fs::read_to_string(dir.join(file)).unwrap();
                let url_host = format!("127.0.0.1:{}", self.plane.webhook_port());
                assert_eq!(
                    block
                        .body
                        .replace(ADMISSION_DIR, &format!("{}/", dir.display()))
                        .replace("name: vgpu-dra-webhook.vgpu-dra.svc", &format!("name: {url_host}")),
                    ran,
                    "{}: not the file the test bed's kube-apiserver runs with",
                    block.at()
                );
            }
            ("yaml", "vgpu-dra-config") => {
                let config = self.file(block);
                let out = Command::new(driver_binary().unwrap())
                    .args(["inventory", "--node-name", NODE, "--mock-gpus", "1xTesla T4:15Gi", "-o", "json"])
                    .arg(format!("--config={}", config.display()))
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{}: {}", block.at(), String::from_utf8_lossy(&out.stderr));
                let list: Value = serde_json::from_slice(&out.stdout).unwrap();
                assert!(list["items"][0]["spec"]["devices"][0]["capacity"]["shares"]["value"].is_string(), "{list}");
            }
            ("yaml", "kueue-config") => {
                // The release the block needs: v0.19 when it names a v0.19 gate. kueue-check
                // decodes with v0.18's types; v0.19's manager decodes its file as strictly.
                let version = KueueVersion::for_configuration(&block.body);
                if version == KueueVersion::V018 {
                    let config = self.file(block);
                    let out = Command::new(&self.plane.components().kueue_check).arg(&config).output().unwrap();
                    assert!(out.status.success(), "{}: {}", block.at(), String::from_utf8_lossy(&out.stderr));
                }
                // The real manager runs with it, and serves the blocks that follow (its webhooks
                // fail closed for Kueue's kinds, so it must stay up until the next one).
                drop(self.kueue.take());
                let kueue =
                    Kueue::start_version(&self.plane, &block.body, version).unwrap_or_else(|e| panic!("{}: {e:#}", block.at()));
                self.kueue = Some(kueue);
            }
            ("yaml", "volcano") => {
                self.install_volcano_crds();
                let checked = self.plane.kubectl().run_with_input(&["apply", "--dry-run=server", "-f", "-"], Some(&block.body));
                assert!(checked.is_ok(), "{}: {:#}", block.at(), checked.unwrap_err());
            }
            ("yaml", "volcano-scheduler-conf") => {
                assert_eq!(
                    block.body,
                    vgpu_dra_integration::volcano::DRA_SCHEDULER_CONF,
                    "{}: not the configuration integration/tests/volcano.rs runs Volcano with",
                    block.at()
                );
            }
            ("yaml", "device-taint-rule") => {
                // Served as v1 from 1.37, as v1beta2 in 1.36 (the test bed turns it on there); a
                // server-side dry run, so the quick start's card stays in service.
                let kubectl = self.plane.kubectl();
                let version = common::taint_rule_version(kubectl)
                    .unwrap_or_else(|| panic!("{}: no version serves DeviceTaintRules", block.at()));
                let body =
                    block.body.replace("apiVersion: resource.k8s.io/v1\n", &format!("apiVersion: resource.k8s.io/{version}\n"));
                assert!(body.contains(&format!("pool: {NODE}")), "{}: the rule does not name the quick start's node", block.at());
                let checked = kubectl.run_with_input(&["apply", "--dry-run=server", "-f", "-"], Some(&body));
                assert!(checked.is_ok(), "{}: {:#}", block.at(), checked.unwrap_err());
            }
            ("sh", "syntax-only") => {
                let out = Command::new("bash").args(["-n", "-c", &block.body]).output().unwrap();
                assert!(out.status.success(), "{}: {}", block.at(), String::from_utf8_lossy(&out.stderr));
            }
            (lang, tag) => panic!("{}: a {lang:?} block tagged {tag:?} is neither run nor output", block.at()),
        }
    }

    /// Volcano v1.15.1's CRDs (Jobs, Queues, PodGroups, ...), from the release the test bed pins.
    fn install_volcano_crds(&mut self) {
        if self.volcano_crds {
            return;
        }
        let crds = self.plane.components().volcano_crds.clone();
        self.plane.kubectl().run(&["apply", "--server-side", "-f", crds.to_str().unwrap()]).unwrap();
        self.plane.kubectl().wait_crds_established(Duration::from_secs(60)).unwrap();
        self.volcano_crds = true;
    }

    /// The DaemonSet's pod on the quick start's node, with a mock card (there is no GPU here).
    fn start_driver(&mut self) {
        let mut pod = run_as_daemonset_pod(&self.plane, "vgpu-dra", "vgpu-dra", NODE, &["--mock-gpus=1xTesla T4:15Gi"]).unwrap();
        let kubectl = self.plane.kubectl().clone();
        eventually("the quick start's slice", Duration::from_secs(30), || {
            pod.process.check_running()?;
            let list = kubectl.get_json(&["resourceslices", &format!("--field-selector=spec.nodeName={NODE}")])?;
            Ok(list["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
        })
        .unwrap();
        self.driver = Some(pod);
    }

    /// What the node does for `pod`: its claim allocated with the quick start's 4Gi, the kubelet
    /// has the driver prepare it (the CDI spec appears), and the spec, read by the CDI library,
    /// gives the limits the quick start promises. (The pod's image is never pulled here.)
    fn check_quickstart_claim(&mut self, pod: &str) {
        let kubectl = self.plane.kubectl().clone();
        let claim = eventually(&format!("{pod}'s generated claim"), Duration::from_secs(30), || {
            let p = kubectl.get_json(&["pod", pod, "-n", "default"])?;
            Ok(p["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().map(str::to_owned))
        })
        .unwrap();
        let result = self.plane.wait_allocated("default", &claim, Duration::from_secs(30)).unwrap();
        assert_eq!(result["consumedCapacity"]["memory"], "4Gi", "{result}");
        let uid = kubectl.run(&["get", "resourceclaim", &claim, "-n", "default", "-o", "jsonpath={.metadata.uid}"]).unwrap();
        let cdi = self.node.cdi_dir().to_owned();
        let ids = eventually(&format!("{pod}'s claim prepared by the kubelet"), Duration::from_secs(60), || {
            self.node.check_running()?;
            if let Some(d) = self.driver.as_mut() {
                d.process.check_running()?;
            }
            cdi_device_ids(&cdi, &uid)
        })
        .unwrap();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let report = cdi_check(&cdi, &ids);
        let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for want in ["CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT=50"] {
            assert!(env.contains(&want), "the quick start promises {want}: {env:?}");
        }
    }
}

/// The fully qualified CDI device names (`vendor/class=name`) of the spec files in `dir` written
/// for claim `uid`, once there is one.
fn cdi_device_ids(dir: &Path, uid: &str) -> anyhow::Result<Option<Vec<String>>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_name().to_string_lossy().contains(uid) {
            continue;
        }
        let spec: Value = serde_json::from_str(&std::fs::read_to_string(entry.path())?)?;
        let kind = spec["kind"].as_str().unwrap_or_default();
        ids.extend(
            spec["devices"].as_array().into_iter().flatten().filter_map(|d| d["name"].as_str()).map(|n| format!("{kind}={n}")),
        );
    }
    Ok((!ids.is_empty()).then_some(ids))
}

#[test]
fn every_docs_example_runs() {
    let listed: std::collections::BTreeSet<String> = PAGES.iter().map(|p| (*p).to_owned()).collect();
    let present: std::collections::BTreeSet<String> = std::fs::read_dir(docs_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    assert_eq!(listed, present, "a page in docs/ is not run by this test");

    let options = vgpu_dra_integration::PlaneOptions { device_taint_rules: true, ..Default::default() };
    let plane = ControlPlane::start_with(&options).expect("control plane");
    let node = Node::start(&plane, NODE).unwrap_or_else(|e| panic!("starting the quick start's node: {e:#}"));
    // What the chart's DaemonSet would find (or, with hamiCore.installImage, copy) on a GPU node.
    let host = node_host_dir(&plane, NODE);
    build_stand_in(&host.join("vgpu/libvgpu.so"), &host.join("vgpulock")).unwrap();
    let crds = plane.components().kueue_crds.clone();
    plane.kubectl().run(&["apply", "--server-side", "-f", crds.to_str().unwrap()]).unwrap();
    plane.kubectl().wait_crds_established(Duration::from_secs(60)).unwrap();
    let scratch = plane.dir().join("docs");
    std::fs::create_dir_all(&scratch).unwrap();
    let mut docs = Docs { kueue: None, node, plane, driver: None, scratch, volcano_crds: false };

    let all: Vec<Block> = PAGES.iter().flat_map(|p| blocks(p)).collect();
    let (cleanup, main): (Vec<&Block>, Vec<&Block>) = all.iter().partition(|b| b.section.ends_with("Clean up"));
    let mut ran = 0;
    for block in main.into_iter().chain(cleanup) {
        docs.run(block);
        ran += usize::from(block.lang != "text");
    }
    assert!(ran >= 15, "only {ran} examples found; did the block syntax change?");
    if let Some(d) = docs.driver.as_mut() {
        d.process.check_running().unwrap();
    }
    docs.node.check_running().unwrap();
}
