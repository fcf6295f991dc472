//! Every example in `docs/` runs here, in page order, against a real API server, scheduler and
//! controller manager: `sh` blocks through bash with the test bed's kubectl and helm, `yaml`
//! blocks applied (or, when tagged, rendered as chart values, read as a driver config file, or
//! decoded by Kueue's own types). Where the docs assume a kubelet, the test stands in: it runs the
//! driver as the chart's DaemonSet pod and prepares the quick start's claim through the kubelet's
//! own plugin code.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::chart::{chart_dir, run_as_daemonset_pod};
use common::{DRIVER, cdi_check, claim_response};
use serde_json::Value;
use vgpu_dra_integration::kueue::{Kueue, KueueVersion};
use vgpu_dra_integration::{ControlPlane, KubeletSim, KubeletSimOptions, driver_binary, eventually, node_host_dir};

/// The pages, in the order a reader follows them; the quick start's clean-up runs last.
const PAGES: [&str; 8] = [
    "quickstart.md",
    "resource-model.md",
    "configuration.md",
    "compatibility.md",
    "troubleshooting.md",
    "kueue.md",
    "metrics.md",
    "README.md",
];
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

struct Docs {
    /// The Kueue of the last manager Configuration block (stopped before the plane).
    kueue: Option<Kueue>,
    plane: ControlPlane,
    driver: Option<common::chart::DaemonSetPod>,
    kubelet: Option<KubeletSim>,
    scratch: PathBuf,
}

impl Docs {
    fn sh(&self, block: &Block) {
        let bins = self.plane.components();
        let path = format!(
            "{}:{}:{}",
            bins.kubectl.parent().unwrap().display(),
            bins.helm.parent().unwrap().display(),
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
            .output()
            .unwrap();
        eprintln!("--- {} ---\n{}{}", block.at(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{} failed:\n{}\n{}", block.at(), block.body, String::from_utf8_lossy(&out.stderr));
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
                let finalizer =
                    block.body.contains("kubectl delete pod cuda-smoke").then(|| self.finalize_deleted_pod("cuda-smoke"));
                self.sh(block);
                if let Some(f) = finalizer {
                    f.join().unwrap();
                }
                if block.body.contains("helm install") {
                    self.start_driver();
                }
            }
            ("yaml", "") => {
                let applied = self.plane.kubectl().apply(&block.body);
                assert!(applied.is_ok(), "{}: {:#}", block.at(), applied.unwrap_err());
                if block.body.contains("name: cuda-smoke") {
                    self.prepare_quickstart_pod();
                }
            }
            ("yaml", "values") => {
                let values = self.file(block);
                let chart = chart_dir();
                let rendered = common::chart::helm(
                    &self.plane,
                    // Every install names the image the user built (README); values files need not.
                    &[
                        "template",
                        "docs-values",
                        chart.to_str().unwrap(),
                        "-n",
                        "vgpu-dra",
                        "--set",
                        "image.repository=registry.example.com/vgpu-dra",
                        "-f",
                    ]
                    .into_iter()
                    .chain([values.to_str().unwrap()])
                    .collect::<Vec<_>>(),
                );
                let rendered = rendered.unwrap_or_else(|e| panic!("{}: {e:#}", block.at()));
                let checked = self.plane.kubectl().run_with_input(
                    &["apply", "--server-side", "--dry-run=server", "--force-conflicts", "-f", "-"],
                    Some(&rendered),
                );
                assert!(checked.is_ok(), "{}: {:#}", block.at(), checked.unwrap_err());
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
            (lang, tag) => panic!("{}: a {lang:?} block tagged {tag:?} is neither run nor output", block.at()),
        }
    }

    /// What the kubelet does for a deleted pod, which the docs' `kubectl delete pod` waits for:
    /// unprepare its claims, then remove the pod object (grace period 0).
    fn finalize_deleted_pod(&mut self, pod: &str) -> std::thread::JoinHandle<()> {
        let kubectl = self.plane.kubectl().clone();
        if let Some(kubelet) = self.kubelet.as_mut() {
            let status = kubectl.get_json(&["pod", pod, "-n", "default"]).unwrap();
            let claim = status["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().unwrap().to_owned();
            let uid = kubectl.run(&["get", "resourceclaim", &claim, "-n", "default", "-o", "jsonpath={.metadata.uid}"]).unwrap();
            let reply = kubelet.unprepare(&[("default", &claim, &uid)]).unwrap();
            assert!(claim_response(&reply, &uid).get("error").is_none_or(|e| e.as_str() == Some("")), "{reply}");
        }
        let pod = pod.to_owned();
        std::thread::spawn(move || {
            eventually("the pod marked for deletion", Duration::from_secs(60), || {
                let p = kubectl.get_json(&["pod", &pod, "-n", "default"])?;
                Ok(p["metadata"]["deletionTimestamp"].is_string().then_some(()))
            })
            .unwrap();
            kubectl.run(&["delete", "pod", &pod, "-n", "default", "--grace-period=0", "--force"]).unwrap();
        })
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
        let registry = node_host_dir(&self.plane, NODE).join("kubelet/plugins_registry");
        let mut kubelet =
            KubeletSim::start(&registry, DRIVER, &KubeletSimOptions { node_name: NODE.into(), ..Default::default() }).unwrap();
        kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER).unwrap();
        self.driver = Some(pod);
        self.kubelet = Some(kubelet);
    }

    /// What the kubelet would do for `cuda-smoke`: wait for its claim's allocation, prepare it, and
    /// check the limits the quick start promises are in the CDI spec the runtime would apply.
    fn prepare_quickstart_pod(&mut self) {
        let kubectl = self.plane.kubectl().clone();
        let claim = eventually("cuda-smoke's generated claim", Duration::from_secs(30), || {
            let pod = kubectl.get_json(&["pod", "cuda-smoke", "-n", "default"])?;
            Ok(pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().map(str::to_owned))
        })
        .unwrap();
        let result = self.plane.wait_allocated("default", &claim, Duration::from_secs(30)).unwrap();
        assert_eq!(result["consumedCapacity"]["memory"], "4Gi", "{result}");
        let uid = kubectl.run(&["get", "resourceclaim", &claim, "-n", "default", "-o", "jsonpath={.metadata.uid}"]).unwrap();
        let kubelet = self.kubelet.as_mut().expect("the driver runs");
        let reply = kubelet.prepare(&[("default", &claim, &uid)]).unwrap();
        let id = claim_response(&reply, &uid)["devices"][0]["cdi_device_ids"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{reply}"))
            .to_owned();
        let report = cdi_check(&node_host_dir(&self.plane, NODE).join("cdi"), &[&id]);
        let env: Vec<&str> = report["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for want in ["CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT=50"] {
            assert!(env.contains(&want), "the quick start promises {want}: {env:?}");
        }
    }
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

    let plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let crds = plane.components().kueue_crds.clone();
    plane.kubectl().run(&["apply", "--server-side", "-f", crds.to_str().unwrap()]).unwrap();
    plane.kubectl().wait_crds_established(Duration::from_secs(60)).unwrap();
    let scratch = plane.dir().join("docs");
    std::fs::create_dir_all(&scratch).unwrap();
    let mut docs = Docs { plane, driver: None, kubelet: None, kueue: None, scratch };

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
}
