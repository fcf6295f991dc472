//! HAMi's own example workloads on the test bed, through the real API server and `vgpu-dra
//! webhook` over TLS. Every pod of Project-HAMi/HAMi `examples/nvidia/` and of
//! Project-HAMi/volcano-vgpu-device-plugin `examples/` is rewritten here with the same resources
//! and annotations (a Deployment as the pod its ReplicaSet would make: the test bed runs no
//! workload controllers; `nodeSelector` added so each lands on the node its check needs), and
//! gets HAMi's meaning: the claim the resource claim controller makes (count, memory, cores,
//! selectors), the real scheduler's allocation (`consumedCapacity` on distinct cards), and for
//! some the CDI spec the driver writes (HAMi-core's limits); or the denial or warning of the
//! compatibility rules. Also `nvidia.com/gpu: 2` is two distinct cards or none,
//! `gpumem-percentage` is a percentage of the card picked, and the scheduler's extended-resource
//! path (KEP-5004) gives the limits the webhook gives. HAMi's MIG examples (`mig_example.yaml`,
//! `dynamic_mig_example.yaml`) get MIG instances of a node offering dynamic MIG: the profile named,
//! or the smallest profile that holds the memory asked.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::Value;
use vgpu_dra_integration::{
    ControlPlane, Kubectl, KubeletSim, ManagedProcess, eventually, free_port, node_host_dir, start_driver,
};
use vgpu_scheduling::Quantity;
use vgpu_scheduling::compat::{TEMPLATE_PREFIX, claim_entry_name};

mod common;

use common::webhook;
use common::{DRIVER, Dirs, NODE, cdi_check, claim_response, kubelet};

/// The webhook's own namespace: never sent to the webhook.
const WEBHOOK_NAMESPACE: &str = "vgpu-dra";
const MIB: u64 = 1 << 20;
/// The chart's MIG DeviceClass name (`mig.<deviceClassName>`).
const MIG_CLASS: &str = "mig.hami-core-gpu.project-hami.io";

/// The chart's DeviceClass of dynamic-MIG devices, the name the webhook derives by default.
fn mig_device_class() -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: {MIG_CLASS}}}\nspec:\n  selectors:\n  - cel:\n      expression: device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].type == \"hami-mig\"\n"
    )
}

/// HAMi's DeviceClass as the chart writes it, optionally standing for an extended resource.
fn device_class(extended_resource: Option<&str>) -> String {
    let extended = extended_resource.map(|r| format!("  extendedResourceName: {r}\n")).unwrap_or_default();
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: {DRIVER}}}\nspec:\n{extended}  selectors:\n  - cel:\n      expression: device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].type == \"hami-gpu\"\n"
    )
}

/// Memory on each card, in HAMi's meaning.
#[derive(Debug, Clone, Copy)]
enum Mem {
    /// The whole card (no memory asked, or 100 %).
    Whole,
    /// MiB.
    Mib(u64),
    /// Percent of the card picked (HAMi: `Totalmem * P / 100`, in MiB).
    Percent(u64),
}

impl Mem {
    fn bytes_of(self, card_memory: u64) -> u64 {
        match self {
            Self::Whole => card_memory,
            Self::Mib(m) => m * MIB,
            Self::Percent(p) => card_memory / MIB * p / 100 * MIB,
        }
    }
}

/// What HAMi gives one container: `count` distinct cards with `memory` and `cores` on each.
#[derive(Debug, Clone, Copy)]
struct Ask {
    count: usize,
    memory: Mem,
    cores: u64,
}

const fn ask(count: usize, memory: Mem, cores: u64) -> Ask {
    Ask { count, memory, cores }
}

/// A published card, or a dynamic-MIG device (`mig`: one placement of a profile on a card).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Card {
    node: String,
    device: String,
    product: String,
    uuid: String,
    memory: u64,
    mig: bool,
}

fn amount(v: &Value) -> anyhow::Result<u64> {
    let text = v.as_str().with_context(|| format!("{v} is not a quantity"))?;
    Quantity::parse(text)?.as_u64_exact().with_context(|| format!("{text} is not a whole amount"))
}

/// A control plane with HAMi's DeviceClasses, mock GPU nodes and, once started, the webhook.
/// Field order is drop order: the processes stop (printing their logs on a failure) before the
/// plane removes its directory.
struct Bed {
    webhook: Option<ManagedProcess>,
    drivers: Vec<ManagedProcess>,
    plane: ControlPlane,
    kubectl: Kubectl,
    metrics_port: u16,
    /// The resource names the webhook converts (HAMi's unless started with Volcano's).
    resources: &'static [&'static str],
}

impl Bed {
    fn start(class: &str) -> anyhow::Result<Self> {
        let plane = ControlPlane::start()?;
        let kubectl = plane.kubectl().clone();
        kubectl.apply(class)?;
        kubectl.apply(&mig_device_class())?;
        kubectl.run(&["create", "namespace", WEBHOOK_NAMESPACE])?;
        Ok(Self { plane, kubectl, drivers: Vec::new(), webhook: None, metrics_port: 0, resources: HAMI_RESOURCES })
    }

    /// Node `node` whose driver publishes the mock cards `gpus` (`--mock-gpus` syntax); [`NODE`]
    /// gets the common [`Dirs`] (so [`kubelet`] prepares its claims), others their own host dir.
    fn node(&mut self, node: &str, gpus: &str) -> anyhow::Result<Dirs> {
        self.node_with(node, gpus, &[])
    }

    /// [`Bed::node`] with `extra` driver flags.
    fn node_with(&mut self, node: &str, gpus: &str, extra: &[String]) -> anyhow::Result<Dirs> {
        self.plane.create_node(node)?;
        let dirs = if node == NODE { Dirs::new(self.plane.dir()) } else { Dirs::new(&node_host_dir(&self.plane, node)) };
        let mut args = dirs.args();
        args.retain(|a| !a.starts_with("--mock-gpus"));
        args.push(format!("--mock-gpus={gpus}"));
        args.extend(extra.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.drivers.push(start_driver(&self.plane, &format!("driver-{node}"), node, &refs)?);
        Ok(dirs)
    }

    /// The cards the nodes publish, once there are `total`.
    fn cards(&mut self, total: usize) -> anyhow::Result<Vec<Card>> {
        let kubectl = self.kubectl.clone();
        let drivers = &mut self.drivers;
        eventually(&format!("{total} published cards"), Duration::from_secs(60), || {
            for d in drivers.iter_mut() {
                d.check_running()?;
            }
            let list = kubectl.get_json(&["resourceslices"])?;
            let mut cards = Vec::new();
            for slice in list["items"].as_array().into_iter().flatten() {
                for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
                    let text = |k: &str| d["attributes"][k]["string"].as_str().unwrap_or_default().to_owned();
                    cards.push(Card {
                        node: slice["spec"]["pool"]["name"].as_str().unwrap_or_default().to_owned(),
                        device: d["name"].as_str().unwrap_or_default().to_owned(),
                        product: text("productName"),
                        uuid: text("uuid"),
                        memory: amount(&d["capacity"]["memory"]["value"])?,
                        mig: text("type") == "hami-mig",
                    });
                }
            }
            Ok((cards.len() == total).then_some(cards))
        })
    }

    /// Starts the webhook (with `extra` flags) and waits until the API server calls it with
    /// `probe`, a pod it converts (a server-side dry run, which creates nothing).
    fn start_webhook(&mut self, extra: &[String], probe: &str) -> anyhow::Result<()> {
        // On the plane's webhook port, where the API server presents its client certificate.
        let (port, metrics) = (self.plane.webhook_port(), free_port()?);
        let mut flags = vec![format!("--metrics-address=127.0.0.1:{metrics}")];
        flags.extend(extra.iter().cloned());
        let mut webhook = webhook::spawn(&self.plane, "webhook", (port, port), WEBHOOK_NAMESPACE, &flags)?;
        webhook::wait_called(&self.plane, &mut webhook, probe)?;
        self.webhook = Some(webhook);
        self.metrics_port = metrics;
        Ok(())
    }

    /// `kubectl create -f -`: stderr on success (where kubectl prints admission warnings), the
    /// error with stderr otherwise.
    fn create(&self, yaml: &str) -> anyhow::Result<String> {
        webhook::create(&self.plane, yaml)
    }

    fn pod(&self, ns: &str, name: &str) -> anyhow::Result<Value> {
        self.kubectl.get_json(&["pod", name, "-n", ns])
    }

    /// The claim the resource claim controller made for `container` of pod `ns/pod`, after
    /// checking that the pod references one of our templates for it and no longer carries
    /// `resources` (HAMi's names) in that container.
    fn claim_of(&self, ns: &str, pod: &str, container: &str, resources: &[&str]) -> anyhow::Result<Value> {
        let entry = claim_entry_name(container);
        let p = self.pod(ns, pod)?;
        let spec = &p["spec"];
        let reference = spec["resourceClaims"].as_array().into_iter().flatten().find(|c| c["name"] == entry.as_str());
        let template = reference.and_then(|c| c["resourceClaimTemplateName"].as_str()).unwrap_or_default();
        ensure!(template.starts_with(TEMPLATE_PREFIX), "pod {pod}: no template for {container}: {spec:#}");
        let c = spec["initContainers"].as_array().into_iter().chain(spec["containers"].as_array()).flatten();
        let c = c.into_iter().find(|c| c["name"] == container).with_context(|| format!("no container {container}"))?;
        ensure!(c["resources"]["claims"].as_array().is_some_and(|l| l.iter().any(|e| e["name"] == entry.as_str())), "{c:#}");
        for field in ["limits", "requests"] {
            let left: Vec<&String> = c["resources"][field].as_object().into_iter().flat_map(|m| m.keys()).collect();
            ensure!(!left.iter().any(|k| resources.contains(&k.as_str())), "{pod}/{container} still asks {left:?}");
        }
        let kubectl = self.kubectl.clone();
        let name = eventually(&format!("the claim of {ns}/{pod} for {container}"), Duration::from_secs(30), || {
            let p = kubectl.get_json(&["pod", pod, "-n", ns])?;
            let statuses = p["status"]["resourceClaimStatuses"].as_array().cloned().unwrap_or_default();
            Ok(statuses
                .iter()
                .find(|s| s["name"] == entry.as_str())
                .and_then(|s| s["resourceClaimName"].as_str())
                .map(str::to_owned))
        })?;
        self.kubectl.get_json(&["resourceclaim", &name, "-n", ns])
    }

    /// The allocation results of claim `ns/name`, once the scheduler has made them.
    fn allocated(&mut self, ns: &str, name: &str) -> anyhow::Result<Vec<Value>> {
        let kubectl = self.kubectl.clone();
        let plane = &mut self.plane;
        eventually(&format!("claim {ns}/{name} allocated"), Duration::from_secs(60), || {
            plane.check_processes()?;
            let claim = kubectl.get_json(&["resourceclaim", name, "-n", ns])?;
            Ok(claim["status"]["allocation"]["devices"]["results"].as_array().filter(|r| !r.is_empty()).cloned())
        })
    }

    /// The claim of `container` of pod `default/pod`, checked against `want` on `cards`.
    fn checked_claim(&self, pod: &str, container: &str, want: Ask, selectors: &[&str], cards: &[Card]) -> anyhow::Result<String> {
        let claim = self.claim_of("default", pod, container, self.resources)?;
        check_request(&claim, want, selectors, cards).with_context(|| format!("pod {pod}"))?;
        Ok(claim["metadata"]["name"].as_str().unwrap_or_default().to_owned())
    }

    /// [`Bed::checked_claim`] and the claim's allocation; returns the claim and the cards used.
    fn check(&mut self, pod: &str, container: &str, want: Ask, selectors: &[&str], cards: &[Card]) -> anyhow::Result<Placed> {
        let name = self.checked_claim(pod, container, want, selectors, cards)?;
        let results = self.allocated("default", &name)?;
        let used = check_allocation(&results, want, cards).with_context(|| format!("pod {pod}: {results:#?}"))?;
        Ok(Placed { claim: name, cards: used })
    }

    /// The allocation of MIG claim `claim`: `count` devices of the MIG node, each with the card
    /// (its whole-card device, by the placement's `hami-gpu-<minor>` prefix), the device's name and
    /// the (sub)request it serves.
    fn mig_allocation(&mut self, claim: &Value, count: usize, cards: &[Card]) -> anyhow::Result<Vec<(Card, String, String)>> {
        let name = claim["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let results = self.allocated("default", &name)?;
        ensure!(results.len() == count, "{} results for {count}: {results:#?}", results.len());
        let mut out = Vec::new();
        for r in &results {
            ensure!(r["pool"] == MIG_NODE, "{r}");
            let device = r["device"].as_str().unwrap_or_default();
            let (parent, _) = device.split_once("-mig-").with_context(|| format!("{device} is no MIG device"))?;
            let card =
                cards.iter().find(|c| c.node == MIG_NODE && c.device == parent).with_context(|| format!("no card {parent}"))?;
            ensure!(cards.iter().any(|c| c.node == MIG_NODE && c.device == device), "{device} is not published");
            out.push((card.clone(), device.to_owned(), r["request"].as_str().unwrap_or_default().to_owned()));
        }
        Ok(out)
    }

    fn metrics(&self) -> anyhow::Result<String> {
        use std::io::Read as _;
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port))?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    }
}

/// An allocated claim and the cards it got, in result order.
struct Placed {
    claim: String,
    cards: Vec<Card>,
}

const HAMI_RESOURCES: &[&str] =
    &["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "nvidia.com/priority"];
const VOLCANO_RESOURCES: &[&str] =
    &["volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-memory-percentage", "volcano.sh/vgpu-cores"];

/// The claim asks `want`: `count` distinct cards (a uuid `distinctAttribute` when more than one),
/// the memory (none for a whole card; for a percentage one `firstAvailable` subrequest per card
/// model of `cards`, each asking that percentage of its model), the cores, and selectors
/// containing each of `selectors`. One request `gpu` of `count` cards, except a percentage of
/// several cards over several models: one request per card (`gpu-<i>`), as HAMi lets each card
/// be of its own model.
fn check_request(claim: &Value, want: Ask, selectors: &[&str], cards: &[Card]) -> anyhow::Result<()> {
    let devices = &claim["spec"]["devices"];
    let requests = devices["requests"].as_array().context("no requests")?;
    // The card models of the class: MIG devices are not cards.
    let models: BTreeSet<(&str, u64)> = cards.iter().filter(|c| !c.mig).map(|c| (c.product.as_str(), c.memory)).collect();
    let per_card = matches!(want.memory, Mem::Percent(_)) && want.count > 1 && models.len() > 1;
    let names: Vec<String> = if per_card { (0..want.count).map(|i| format!("gpu-{i}")).collect() } else { vec!["gpu".into()] };
    let got: Vec<&str> = requests.iter().filter_map(|r| r["name"].as_str()).collect();
    ensure!(got == names, "requests {got:?}, want {names:?}: {devices:#}");
    let per_request = if per_card { 1 } else { want.count };
    for request in requests {
        let alternatives: Vec<&Value> = match want.memory {
            Mem::Percent(_) => request["firstAvailable"].as_array().context("no firstAvailable")?.iter().collect(),
            _ => vec![&request["exactly"]],
        };
        let mut memories = Vec::new();
        for alt in &alternatives {
            ensure!(alt["deviceClassName"] == DRIVER && alt["count"] == per_request, "{devices:#}");
            let asked = &alt["capacity"]["requests"];
            if want.cores == 100 {
                // An exclusive card asks no cores amount: the policy's default, every core.
                ensure!(asked.get("cores").is_none(), "cores 100 asks every core: {devices:#}");
            } else {
                ensure!(amount(&asked["cores"])? == want.cores, "cores: {devices:#}");
            }
            match want.memory {
                Mem::Whole => ensure!(asked.get("memory").is_none(), "a whole card asks no memory: {devices:#}"),
                Mem::Mib(m) => ensure!(amount(&asked["memory"])? == m * MIB, "memory: {devices:#}"),
                Mem::Percent(_) => memories.push(amount(&asked["memory"])?),
            }
            let cel: Vec<&str> =
                alt["selectors"].as_array().into_iter().flatten().filter_map(|s| s["cel"]["expression"].as_str()).collect();
            if selectors.is_empty() && !matches!(want.memory, Mem::Percent(_)) {
                ensure!(cel.is_empty(), "no annotation, no selector: {devices:#}");
            }
            for s in selectors {
                ensure!(cel.iter().any(|e| e.contains(s)), "no selector with {s:?}: {devices:#}");
            }
        }
        if let Mem::Percent(_) = want.memory {
            let mut expected: Vec<u64> = models.iter().map(|(_, m)| want.memory.bytes_of(*m)).collect();
            expected.sort_unstable();
            memories.sort_unstable();
            ensure!(memories == expected, "one subrequest per model {models:?} at its share {expected:?}: {devices:#}");
        }
    }
    let constraint = &devices["constraints"][0];
    if want.count > 1 {
        ensure!(constraint["distinctAttribute"].as_str() == Some(&format!("{DRIVER}/uuid")), "no distinct cards: {devices:#}");
        ensure!(constraint["requests"] == serde_json::json!(names), "the constraint spans every request: {devices:#}");
    } else {
        ensure!(devices.get("constraints").is_none(), "{devices:#}");
    }
    Ok(())
}

/// The allocation gives `want` on `count` distinct cards; returns them in result order.
fn check_allocation(results: &[Value], want: Ask, cards: &[Card]) -> anyhow::Result<Vec<Card>> {
    ensure!(results.len() == want.count, "{} results for {} cards", results.len(), want.count);
    let mut used = Vec::new();
    for r in results {
        let card =
            cards.iter().find(|c| r["pool"] == c.node.as_str() && r["device"] == c.device.as_str()).context("unknown device")?;
        let consumed = &r["consumedCapacity"];
        ensure!(amount(&consumed["memory"])? == want.memory.bytes_of(card.memory), "memory on {card:?}");
        if want.cores == 0 {
            // The least a share takes: it keeps cores 0 off a card whose cores are all held.
            ensure!(consumed["cores"] == "1m", "cores 0 on {card:?}: {consumed}");
        } else {
            ensure!(amount(&consumed["cores"])? == want.cores, "cores on {card:?}: {consumed}");
        }
        used.push(card.clone());
    }
    let distinct: BTreeSet<(&str, &str)> = used.iter().map(|c| (c.node.as_str(), c.device.as_str())).collect();
    ensure!(distinct.len() == used.len(), "one card twice");
    Ok(used)
}

/// Prepares claim `ns/name` through the kubelet's plugin code and returns the environment the
/// CDI library injects for it.
fn prepared_env(kubelet: &mut KubeletSim, dirs: &Dirs, kubectl: &Kubectl, ns: &str, name: &str) -> anyhow::Result<Vec<String>> {
    let uid = kubectl.run(&["get", "resourceclaim", name, "-n", ns, "-o", "jsonpath={.metadata.uid}"])?;
    let reply = kubelet.prepare(&[(ns, name, &uid)])?;
    let r = claim_response(&reply, &uid);
    ensure!(r.get("error").is_none_or(|e| e.as_str() == Some("")), "prepare failed: {reply}");
    let ids: BTreeSet<&str> = r["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["cdi_device_ids"].as_array().into_iter().flatten().filter_map(Value::as_str))
        .collect();
    let report = cdi_check(&dirs.cdi, &ids.into_iter().collect::<Vec<_>>());
    Ok(report["env"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect())
}

/// The environment holds HAMi-core's limits: `CUDA_DEVICE_MEMORY_LIMIT_<i>` for each of `memory`
/// (bytes, in CUDA order) and `CUDA_DEVICE_SM_LIMIT=cores`.
fn check_limits(env: &[String], memory: &[u64], cores: u64) -> anyhow::Result<()> {
    let mut want: Vec<String> =
        memory.iter().enumerate().map(|(i, b)| format!("CUDA_DEVICE_MEMORY_LIMIT_{i}={}m", b / MIB)).collect();
    want.push(format!("CUDA_DEVICE_SM_LIMIT={cores}"));
    for w in &want {
        ensure!(env.contains(w), "{w} missing from {env:?}");
    }
    ensure!(!env.iter().any(|e| e.starts_with(&format!("CUDA_DEVICE_MEMORY_LIMIT_{}=", memory.len()))), "{env:?}");
    Ok(())
}

/// `nodeSelector` placing a pod on `node`.
fn on(node: &str) -> String {
    format!("nodeSelector: {{kubernetes.io/hostname: {node}}}")
}

/// A pod of one container `cuda` asking `limits` (the shape of most of HAMi's examples), with
/// `annotations` and `placement` (a line of its spec: [`on`] a node, [`BY_VOLCANO`], or none).
fn gpu_pod(name: &str, ns: &str, placement: &str, annotations: &str, limits: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  annotations: {{{annotations}}}\nspec:\n  {placement}\n  containers:\n  - name: cuda\n    image: ubuntu:18.04\n    command: [bash, -c, sleep 86400]\n    resources:\n      limits: {{{limits}}}\n"
    )
}

// ---- HAMi's examples/nvidia/ ----------------------------------------------------------------

/// The node most examples land on (and where claims are prepared): many cards of one model, so
/// every whole-card example finds free ones.
const MANY_T4: &str = "24xTesla T4:15Gi";
/// Card models for the type annotations: the pod asking A100 or V100 must get exactly those two,
/// the one refusing 1080 and 2080 (once the others are taken) must get the two T4s. The cards a
/// pod must avoid come first: the allocator tries devices in order, so a selector that did
/// nothing would show.
const TYPES_NODE: &str = "gpu-types";
const TYPES: &str = "1xNVIDIA GeForce GTX 1080 Ti:11Gi,1xNVIDIA GeForce RTX 2080 Ti:11Gi,2xTesla T4:15Gi,1xNVIDIA A100-PCIE-40GB:40Gi,1xTesla V100-SXM2-32GB:32Gi";
const UUIDS_NODE: &str = "gpu-uuids";
const SHARE_NODE: &str = "gpu-share";
/// The UUID the examples give as "like" a card's: no card has it.
const EXAMPLE_UUID: &str = "GPU-03f69c50-207a-2038-9b45-23cac89cb67e";

/// An example of the examples' usual shape (one container `cuda` asking `limits`, with
/// `annotations`) placed on `node`, and what HAMi gives it.
struct Example {
    file: &'static str,
    name: &'static str,
    node: &'static str,
    annotations: &'static str,
    limits: &'static str,
    want: Ask,
    /// Substrings of the claim's selectors (none: the claim has none).
    selectors: &'static [&'static str],
    /// Admission warnings kubectl prints.
    warnings: &'static [&'static str],
}

const WARN_GPU_POLICY: &str = "Warning: annotation hami.io/gpu-scheduler-policy is ignored: kube-scheduler picks the card";
const WARN_NODE_POLICY: &str = "Warning: annotation hami.io/node-scheduler-policy is ignored: kube-scheduler scores the nodes";

/// The single-container examples, in the order they are applied (the type and UUID ones depend
/// on it: see [`TYPES`]; USE/NOUSE stand for UUIDs of the node's cards, the examples' own being
/// placeholders).
const EXAMPLES: &[Example] = &[
    // 3000 MiB and 30 % of one card.
    Example {
        file: "default_use.yaml",
        name: "default-use",
        node: NODE,
        annotations: "",
        limits: "nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30",
        want: ask(1, Mem::Mib(3000), 30),
        selectors: &[],
        warnings: &[],
    },
    // A count alone: whole cards, exclusively (cores 100).
    Example {
        file: "default_use_legacy.yaml",
        name: "default-use-legacy",
        node: NODE,
        annotations: "",
        limits: "nvidia.com/gpu: 2",
        want: ask(2, Mem::Whole, 100),
        selectors: &[],
        warnings: &[],
    },
    // HAMi's vgpu-mode hami-core is what a pod without it gets: shares of whole cards.
    Example {
        file: "HAMi's docs: nvidia.com/vgpu-mode: hami-core",
        name: "hami-core-mode",
        node: NODE,
        annotations: "nvidia.com/vgpu-mode: hami-core",
        limits: "nvidia.com/gpu: 1, nvidia.com/gpumem: 3000",
        want: ask(1, Mem::Mib(3000), 0),
        selectors: &[],
        warnings: &[],
    },
    Example {
        file: "specify_scheduling_policy.yaml",
        name: "scheduling-policy",
        node: NODE,
        annotations: "hami.io/node-scheduler-policy: spread, hami.io/gpu-scheduler-policy: binpack",
        limits: "nvidia.com/gpu: 1",
        want: ask(1, Mem::Whole, 100),
        selectors: &[],
        warnings: &[WARN_NODE_POLICY, WARN_GPU_POLICY],
    },
    Example {
        file: "use_exclusive_card.yaml",
        name: "exclusive-card",
        node: NODE,
        annotations: "",
        limits: "nvidia.com/gpu: 2, nvidia.com/gpumem-percentage: 100, nvidia.com/gpucores: 100",
        want: ask(2, Mem::Whole, 100),
        selectors: &[],
        warnings: &[],
    },
    // Half of each card picked, on two cards.
    Example {
        file: "use_memory_fraction.yaml",
        name: "memory-fraction",
        node: NODE,
        annotations: "",
        limits: "nvidia.com/gpu: 2, nvidia.com/gpumem-percentage: 50, nvidia.com/gpucores: 30",
        want: ask(2, Mem::Percent(50), 30),
        selectors: &[],
        warnings: &[],
    },
    // Of HAMi pull requests, not on master: hami.io/vulkan and the index annotations have no
    // meaning in HAMi's master, and none here (no selector, no warning).
    Example {
        file: "vulkan_example.yaml",
        name: "vulkan-example",
        node: NODE,
        annotations: "hami.io/vulkan: \"true\"",
        limits: "nvidia.com/gpu: \"1\", nvidia.com/gpumem: \"1024\", nvidia.com/gpucores: \"30\"",
        want: ask(1, Mem::Mib(1024), 30),
        selectors: &[],
        warnings: &[],
    },
    Example {
        file: "sglang_gpu_sharing.yaml (its Deployment's pod)",
        name: "sglang-qwen",
        node: NODE,
        annotations: "",
        limits: "nvidia.com/gpu: 1, nvidia.com/gpumem: 12000, nvidia.com/gpucores: 30",
        want: ask(1, Mem::Mib(12000), 30),
        selectors: &[],
        warnings: &[],
    },
    Example {
        file: "specify_index_to_use.yaml",
        name: "index-to-use",
        node: NODE,
        annotations: "nvidia.com/use-gpuindexes: \"0,1\"",
        limits: "nvidia.com/gpu: 1",
        want: ask(1, Mem::Whole, 100),
        selectors: &[],
        warnings: &[],
    },
    Example {
        file: "specify_index_not_use.yaml",
        name: "index-not-use",
        node: NODE,
        annotations: "nvidia.com/nouse-gpuindexes: \"0\"",
        limits: "nvidia.com/gpu: 2",
        want: ask(2, Mem::Whole, 100),
        selectors: &[],
        warnings: &[],
    },
    Example {
        file: "specify_card_type_to_use.yaml",
        name: "card-type-to-use",
        node: TYPES_NODE,
        annotations: "nvidia.com/use-gputype: \"A100,V100\"",
        limits: "nvidia.com/gpu: 2",
        want: ask(2, Mem::Whole, 100),
        selectors: &[r#"["a100", "v100"]"#],
        warnings: &[],
    },
    Example {
        file: "specify_card_type_not_use.yaml",
        name: "card-type-not-use",
        node: TYPES_NODE,
        annotations: "nvidia.com/nouse-gputype: \"1080,2080\"",
        limits: "nvidia.com/gpu: 2",
        want: ask(2, Mem::Whole, 100),
        selectors: &[r#"!(has("#, r#"["1080", "2080"]"#],
        warnings: &[],
    },
    Example {
        file: "specify_uuid_to_use.yaml",
        name: "uuid-to-use",
        node: UUIDS_NODE,
        annotations: "nvidia.com/use-gpuuuid: \"USE,GPU-03f69c50-207a-2038-9b45-23cac89cb67e\"",
        limits: "nvidia.com/gpu: 1",
        want: ask(1, Mem::Whole, 100),
        selectors: &["USE", EXAMPLE_UUID],
        warnings: &[],
    },
    Example {
        file: "specify_uuid_not_use.yaml",
        name: "uuid-not-use",
        node: UUIDS_NODE,
        annotations: "nvidia.com/nouse-gpuuuid: \"NOUSE\"",
        limits: "nvidia.com/gpu: 2",
        want: ask(2, Mem::Whole, 100),
        selectors: &["NOUSE"],
        warnings: &[],
    },
];

// mirrors examples/nvidia/example.yaml (the pod of its Deployment's template)
const EXAMPLE_DEPLOYMENT_POD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: cuda-sample-vector-add, namespace: default, labels: {app: cuda-sample-vector-add}}
spec:
  nodeSelector: {kubernetes.io/hostname: gpu-node}
  schedulerName: default-scheduler
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
  - name: cuda-sample-vector-add
    image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04
    command: [/bin/bash, -c, --]
    args: [while true; do /cuda-samples/vectorAdd; done]
    resources:
      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}
"#;

// mirrors examples/nvidia/vllm_cross_vgpu.yaml (the pod of its Deployment's template, without
// the PersistentVolumeClaim volume, which no provisioner here would bind)
const VLLM_POD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: vllm-cross-vgpu, namespace: default, labels: {app: vllm-cross-vgpu}}
spec:
  nodeSelector: {kubernetes.io/hostname: gpu-node}
  schedulerName: default-scheduler
  containers:
  - name: vllm
    image: vllm/vllm-openai:latest
    args: [vllm serve Qwen/Qwen2.5-3B-Instruct --tensor-parallel-size 2 --disable-custom-all-reduce]
    resources:
      limits: {cpu: "8", memory: 20Gi, nvidia.com/gpu: 2, nvidia.com/gpumem-percentage: 30, nvidia.com/gpucores: 30}
      requests: {cpu: "2", memory: 6Gi, nvidia.com/gpu: 2, nvidia.com/gpumem-percentage: 30, nvidia.com/gpucores: 30}
"#;

#[test]
fn hami_nvidia_examples_get_hamis_meaning() {
    if let Err(e) = hami_examples() {
        panic!("{e:#}");
    }
}

fn hami_examples() -> anyhow::Result<()> {
    let mut bed = Bed::start(&device_class(None))?;
    let dirs = bed.node(NODE, MANY_T4)?;
    bed.node(TYPES_NODE, TYPES)?;
    bed.node(UUIDS_NODE, "4xTesla T4:15Gi")?;
    bed.node(SHARE_NODE, "1xTesla T4:15Gi")?;
    let mig_config = bed.plane.dir().join("mig-device-config.yaml");
    std::fs::write(&mig_config, MIG_GROUPS)?;
    let mig_flags = ["--dynamic-mig=listed".to_owned(), format!("--config={}", mig_config.display())];
    bed.node_with(MIG_NODE, MIG_CARDS, &mig_flags)?;
    let cards = bed.cards(24 + 6 + 4 + 1 + MIG_NODE_DEVICES)?;
    let mut kubelet = kubelet(&dirs);
    bed.start_webhook(&[], &gpu_pod("probe", "default", &on(NODE), "", "nvidia.com/gpu: 1"))?;
    let kubectl = bed.kubectl.clone();

    mig_examples(&mut bed, &cards)?;

    // The UUID examples name the node's last card (to use) and its first (not to use), so the
    // allocator's first choice is wrong for both.
    let mut uuids: Vec<&Card> = cards.iter().filter(|c| c.node == UUIDS_NODE).collect();
    uuids.sort_by_key(|c| c.device.clone());
    let (chosen, avoided) = (uuids[3].uuid.as_str(), uuids[0].uuid.as_str());
    let mut placed = std::collections::BTreeMap::new();
    for e in EXAMPLES {
        let sub = |t: &str| t.replace("NOUSE", avoided).replace("USE", chosen);
        let stderr = bed.create(&gpu_pod(e.name, "default", &on(e.node), &sub(e.annotations), e.limits))?;
        for w in e.warnings {
            ensure!(stderr.contains(w), "{}: {w} not in {stderr}", e.file);
        }
        ensure!(!e.warnings.is_empty() || !stderr.contains("Warning:"), "{}: {stderr}", e.file);
        let selectors: Vec<String> = e.selectors.iter().map(|s| sub(s)).collect();
        let selectors: Vec<&str> = selectors.iter().map(String::as_str).collect();
        let p = bed.check(e.name, "cuda", e.want, &selectors, &cards).with_context(|| e.file)?;
        placed.insert(e.name, p);
    }
    // Down to HAMi-core's limits: one card, and half of each of two.
    let env = prepared_env(&mut kubelet, &dirs, &kubectl, "default", &placed["default-use"].claim)?;
    check_limits(&env, &[3000 * MIB], 30).context("default_use.yaml")?;
    let env = prepared_env(&mut kubelet, &dirs, &kubectl, "default", &placed["memory-fraction"].claim)?;
    check_limits(&env, &[(15 << 30) / 2, (15 << 30) / 2], 30).context("use_memory_fraction.yaml")?;
    let models: BTreeSet<&str> = placed["card-type-to-use"].cards.iter().map(|c| c.product.as_str()).collect();
    ensure!(models == BTreeSet::from(["NVIDIA A100-PCIE-40GB", "Tesla V100-SXM2-32GB"]), "use-gputype: {models:?}");
    let not_use = &placed["card-type-not-use"].cards;
    ensure!(not_use.iter().all(|c| c.product == "Tesla T4"), "nouse-gputype: {not_use:?}");
    ensure!(placed["uuid-to-use"].cards[0].uuid == chosen, "use-gpuuuid: {:?}", placed["uuid-to-use"].cards);
    ensure!(placed["uuid-not-use"].cards.iter().all(|c| c.uuid != avoided), "nouse-gpuuuid: {:?}", placed["uuid-not-use"].cards);

    // Memory without cores: HAMi's defaultCores (0), not an exclusive card.
    bed.create(EXAMPLE_DEPLOYMENT_POD)?;
    bed.check("cuda-sample-vector-add", "cuda-sample-vector-add", ask(1, Mem::Mib(3000), 0), &[], &cards)?;
    bed.create(VLLM_POD)?;
    bed.check("vllm-cross-vgpu", "vllm", ask(2, Mem::Percent(30), 30), &[], &cards)?;
    let resources = &bed.pod("default", "vllm-cross-vgpu")?["spec"]["containers"][0]["resources"];
    ensure!(resources["limits"]["cpu"] == "8" && resources["requests"]["memory"] == "6Gi", "other resources kept: {resources}");

    // mirrors examples/nvidia/use_as_normal.yaml: two pods of one whole card never share one.
    let mut normal = Vec::new();
    for name in ["as-normal-1", "as-normal-2"] {
        bed.create(&gpu_pod(name, "default", &on(NODE), "", "nvidia.com/gpu: 1"))?;
        normal.push(bed.check(name, "cuda", ask(1, Mem::Whole, 100), &[], &cards)?.cards);
    }
    ensure!(normal[0] != normal[1], "use_as_normal.yaml: both on {:?}", normal[0]);
    // mirrors examples/nvidia/use_sharing_card.yaml: 40 % and 60 % of the node's one card share it.
    let mut sharing = Vec::new();
    for (name, percent, cores) in [("sharing-1", 40, 60), ("sharing-2", 60, 40)] {
        let limits = format!("nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: {percent}, nvidia.com/gpucores: {cores}");
        bed.create(&gpu_pod(name, "default", &on(SHARE_NODE), "", &limits))?;
        sharing.push(bed.check(name, "cuda", ask(1, Mem::Percent(percent), cores), &[], &cards)?.cards);
    }
    ensure!(sharing[0] == sharing[1], "use_sharing_card.yaml: {sharing:?}");

    let text = bed.metrics()?;
    for reason in ["vgpu_mode", "unknown_mig_profile"] {
        ensure!(text.contains(&format!("vgpu_dra_webhook_denials_total{{reason=\"{reason}\"}} 1")), "{text}");
    }
    Ok(())
}

// ---- MIG: examples/nvidia/mig_example.yaml and dynamic_mig_example.yaml ---------------------

/// The node offering dynamic MIG: two A800-80GB cards and an A100-40GB in MIG mode, as
/// integration/tests/dynamic_mig.rs runs the driver (`--dynamic-mig listed`).
const MIG_NODE: &str = "gpu-mig";
const MIG_CARDS: &str = "2xNVIDIA A800-SXM4-80GB:80Gi:mig,1xNVIDIA A100-SXM4-40GB:40Gi:mig";
/// Source document 001's groups for the A800 (1g.10gb, 2g.20gb, 3g.40gb, 7g.79gb: no 1g.20gb), and
/// the 3g.20gb that HAMi's mig_example.yaml asks for on the A100-40GB.
const MIG_GROUPS: &str = "nvidia:\n  knownMigGeometries:\n  - models: [\"A800-SXM4-80GB\"]\n    allowedGeometries:\n    - group: group1\n      geometries:\n      - {name: 1g.10gb, memory: 10240, count: 7}\n    - group: group2\n      geometries:\n      - {name: 2g.20gb, memory: 20480, count: 3}\n      - {name: 1g.10gb, memory: 10240, count: 1}\n    - group: group3\n      geometries:\n      - {name: 3g.40gb, memory: 40960, count: 2}\n    - group: group4\n      geometries:\n      - {name: 7g.79gb, memory: 80896, count: 1}\n  - models: [\"A100-SXM4-40GB\"]\n    allowedGeometries:\n    - group: group1\n      geometries:\n      - {name: 3g.20gb, memory: 20480, count: 2}\n";
/// Devices the MIG node publishes: per A800 its whole card and 7 + 3 + 2 + 1 placements, for the
/// A100-40GB its whole card and the two placements of 3g.20gb.
const MIG_NODE_DEVICES: usize = 2 * (1 + 7 + 3 + 2 + 1) + (1 + 2);

/// HAMi's MIG examples through the webhook: the claim the resource claim controller makes and
/// the instance the scheduler gives it; and what is refused.
fn mig_examples(bed: &mut Bed, cards: &[Card]) -> anyhow::Result<()> {
    // mirrors examples/nvidia/mig_example.yaml: one instance of the profile named, here the
    // A100-40GB's 3g.20gb.
    let stderr = bed.create(&gpu_pod("mig-example", "default", &on(MIG_NODE), "", "nvidia.com/mig-3g.20gb: 1"))?;
    ensure!(!stderr.contains("Warning:"), "{stderr}");
    let claim = bed.claim_of("default", "mig-example", "cuda", &["nvidia.com/mig-3g.20gb"])?;
    let requests = &claim["spec"]["devices"]["requests"];
    ensure!(requests[0]["name"] == "mig-3g-20gb", "{requests:#}");
    let exactly = &requests[0]["exactly"];
    ensure!(exactly["deviceClassName"] == MIG_CLASS && exactly["count"] == 1, "{requests:#}");
    let cel = exactly["selectors"][0]["cel"]["expression"].as_str().unwrap_or_default();
    ensure!(cel.contains(r#".profile == "3g.20gb""#), "{cel}");
    let placed = bed.mig_allocation(&claim, 1, cards)?;
    ensure!(placed[0].1.contains("-mig-3g-20gb-") && placed[0].0.product == "NVIDIA A100-SXM4-40GB", "{placed:?}");

    // mirrors examples/nvidia/dynamic_mig_example.yaml: MIG mode, two instances holding 8000 MiB
    // each, on two distinct cards (HAMi's N cards): the smallest profile, 1g.10gb, on each A800.
    // HAMi's card policy still has no DRA meaning and is warned; the mode is not.
    let annotations = "nvidia.com/vgpu-mode: mig, hami.io/gpu-scheduler-policy: binpack";
    let stderr =
        bed.create(&gpu_pod("dynamic-mig", "default", &on(MIG_NODE), annotations, "nvidia.com/gpu: 2, nvidia.com/gpumem: 8000"))?;
    ensure!(stderr.contains(WARN_GPU_POLICY) && !stderr.contains("vgpu-mode"), "{stderr}");
    let claim = bed.claim_of("default", "dynamic-mig", "cuda", HAMI_RESOURCES)?;
    check_mig_request(&claim, 2, 8000)?;
    let placed = bed.mig_allocation(&claim, 2, cards)?;
    ensure!(placed.iter().all(|(_, device, sub)| device.contains("-mig-1g-10gb-") && sub == "gpu/mig-profile-19"), "{placed:?}");
    ensure!(placed[0].0.device != placed[1].0.device, "two instances of one card: {placed:?}");

    // The issue's scheduler check through the webhook: 9000 MiB gets a 1g.10gb, 15000 MiB a
    // 2g.20gb (1g.20gb, listed before it, is not among 001's groups).
    for (pod, mib, profile) in [("mig-9000", 9000, "1g-10gb"), ("mig-15000", 15000, "2g-20gb")] {
        let limits = format!("nvidia.com/gpu: 1, nvidia.com/gpumem: {mib}");
        bed.create(&gpu_pod(pod, "default", &on(MIG_NODE), "nvidia.com/vgpu-mode: mig", &limits))?;
        let claim = bed.claim_of("default", pod, "cuda", HAMI_RESOURCES)?;
        check_mig_request(&claim, 1, mib)?;
        let placed = bed.mig_allocation(&claim, 1, cards)?;
        ensure!(placed[0].1.contains(&format!("-mig-{profile}-")), "{pod}: {placed:?}");
    }

    // Refused, naming what is wrong, and nothing created: a mode vgpu-dra does not serve, a
    // profile no card has.
    let err = bed
        .create(&gpu_pod("mps-mode", "default", &on(MIG_NODE), "nvidia.com/vgpu-mode: mps", "nvidia.com/gpu: 1"))
        .expect_err("mps")
        .to_string();
    ensure!(
        err.contains(
            r#"denied the request: annotation nvidia.com/vgpu-mode: "mps" is not a mode vgpu-dra serves; write "hami-core""#
        ),
        "{err}"
    );
    let err = bed
        .create(&gpu_pod("mig-unknown", "default", &on(MIG_NODE), "", "nvidia.com/mig-9g.99gb: 1"))
        .expect_err("unknown profile")
        .to_string();
    ensure!(err.contains(r#"denied the request: container "cuda": nvidia.com/mig-9g.99gb: no card vgpu-dra knows"#), "{err}");
    for pod in ["mps-mode", "mig-unknown"] {
        ensure!(bed.kubectl.run(&["get", "pod", pod, "-n", "default", "-o", "name"]).is_err(), "{pod} exists");
    }
    Ok(())
}

/// A `vgpu-mode: mig` claim: one request `gpu` listing the GI profiles smallest first (those
/// holding `mib` on some card), each `count` devices of the MIG class whose memory covers `mib`,
/// on distinct cards when more than one.
fn check_mig_request(claim: &Value, count: u64, mib: u64) -> anyhow::Result<()> {
    let devices = &claim["spec"]["devices"];
    ensure!(devices["requests"].as_array().map(Vec::len) == Some(1) && devices["requests"][0]["name"] == "gpu", "{devices:#}");
    let subs = devices["requests"][0]["firstAvailable"].as_array().context("no firstAvailable")?;
    let ids: Vec<&str> = subs.iter().filter_map(|s| s["name"].as_str()?.strip_prefix("mig-profile-")).collect();
    ensure!(ids.first() == Some(&"19") && ids.last() == Some(&"0") && ids.len() == subs.len(), "{devices:#}");
    for sub in subs {
        ensure!(sub["deviceClassName"] == MIG_CLASS && sub["count"] == count && sub.get("capacity").is_none(), "{devices:#}");
        let cel = sub["selectors"][0]["cel"]["expression"].as_str().unwrap_or_default();
        ensure!(cel.contains(&format!(r#"memory.compareTo(quantity("{mib}Mi")) >= 0"#)), "{cel}");
    }
    if count > 1 {
        ensure!(devices["constraints"][0]["distinctAttribute"] == format!("{DRIVER}/parentUUID"), "{devices:#}");
    }
    ensure!(devices.get("config").is_none(), "no HAMi-core configuration for a MIG instance: {devices:#}");
    Ok(())
}

// ---- volcano-vgpu-device-plugin's examples/ --------------------------------------------------

/// The placement of Volcano's pods: its scheduler, which the test bed lacks, so each is checked on
/// its claim, and the same shape placed by kube-scheduler on its allocation.
const BY_VOLCANO: &str = "schedulerName: volcano";

// mirrors examples/vgpu-case03.yml (three containers, the middle one without GPUs)
const VGPU_CASE03: &str = r"apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: default}
spec:
  PLACEMENT
  containers:
  - name: ubuntu-container
    image: ubuntu:18.04
    resources:
      limits: {volcano.sh/vgpu-number: 2, volcano.sh/vgpu-memory: 2000}
  - name: ubuntu-container0
    image: ubuntu:18.04
  - name: ubuntu-container1
    image: ubuntu:18.04
    resources:
      limits: {volcano.sh/vgpu-number: 2, volcano.sh/vgpu-memory: 3000}
";

#[test]
fn volcano_vgpu_examples_get_hamis_meaning() {
    if let Err(e) = volcano_examples() {
        panic!("{e:#}");
    }
}

fn volcano_examples() -> anyhow::Result<()> {
    let mut bed = Bed::start(&device_class(None))?;
    let dirs = bed.node(NODE, "2xTesla T4:15Gi,1xTesla V100-SXM2-32GB:32Gi")?;
    let cards = bed.cards(3)?;
    let mut kubelet = kubelet(&dirs);
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduling/testdata/volcano-device-config.yaml");
    let probe = gpu_pod("probe", "default", &on(NODE), "", "volcano.sh/vgpu-number: 1");
    bed.start_webhook(&[format!("--config={}", config.display())], &probe)?;
    bed.resources = VOLCANO_RESOURCES;
    let kubectl = bed.kubectl.clone();

    // mirrors examples/gpu-share.yml: Volcano's own GPU sharing resource, not the vGPU device
    // plugin's, is left as it is.
    bed.create(&gpu_pod("gpu-share", "default", BY_VOLCANO, "", "volcano.sh/gpu-memory: 1024"))?;
    let pod = bed.pod("default", "gpu-share")?;
    ensure!(pod["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/gpu-memory"] == "1024", "{pod:#}");
    ensure!(pod["spec"].get("resourceClaims").is_none(), "{pod:#}");

    // Cores not given: HAMi's defaultCores (0). 16 GiB fits only the V100.
    for (file, name, limits, want) in [
        ("vgpu-case01.yml", "case01", "volcano.sh/vgpu-memory: 1024, volcano.sh/vgpu-number: 1", ask(1, Mem::Mib(1024), 0)),
        ("vgpu-case02.yml", "case02", "volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 10240", ask(1, Mem::Mib(10240), 0)),
        (
            "vgpu-deployment.yaml",
            "resnet101",
            "volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 16384",
            ask(1, Mem::Mib(16384), 0),
        ),
    ] {
        bed.create(&gpu_pod(name, "default", BY_VOLCANO, "", limits))?;
        bed.checked_claim(name, "cuda", want, &[], &cards).context(file)?;
        let kube = format!("{name}-kube");
        bed.create(&gpu_pod(&kube, "default", &on(NODE), "", limits))?;
        let placed = bed.check(&kube, "cuda", want, &[], &cards).context(file)?;
        if name == "case01" {
            let env = prepared_env(&mut kubelet, &dirs, &kubectl, "default", &placed.claim)?;
            check_limits(&env, &[1024 * MIB], 0).context(file)?;
        }
        if name == "resnet101" {
            ensure!(placed.cards[0].product == "Tesla V100-SXM2-32GB", "{:?}", placed.cards);
        }
    }
    // vgpu-deployment.yaml's replicas share one template.
    for i in 1..3 {
        let limits = "volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 16384";
        bed.create(&gpu_pod(&format!("resnet101-{i}"), "default", BY_VOLCANO, "", limits))?;
    }
    let templates: BTreeSet<String> = ["resnet101", "resnet101-1", "resnet101-2"]
        .iter()
        .map(|name| Ok(bed.pod("default", name)?["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].to_string()))
        .collect::<anyhow::Result<_>>()?;
    ensure!(templates.len() == 1, "{templates:?}");

    // Each GPU container its own claim of two distinct cards; the one without GPUs untouched.
    for (name, placement) in [("case03", BY_VOLCANO.to_owned()), ("case03-kube", on(NODE))] {
        bed.create(&VGPU_CASE03.replacen("NAME", name, 1).replacen("PLACEMENT", &placement, 1))?;
        let pod = bed.pod("default", name)?;
        ensure!(pod["spec"]["resourceClaims"].as_array().map(Vec::len) == Some(2), "{pod:#}");
        ensure!(pod["spec"]["containers"][1]["resources"].get("claims").is_none(), "{pod:#}");
        // Volcano's pod, which requests nothing else, keeps a cpu request on its first GPU
        // container only (docs/volcano.md); kube-scheduler's is left as written.
        let cpu: Vec<&Value> = (0..3).map(|i| &pod["spec"]["containers"][i]["resources"]["requests"]["cpu"]).collect();
        let want = if placement == BY_VOLCANO { ["1m", "", ""] } else { ["", "", ""] };
        ensure!(cpu.iter().zip(want).all(|(got, w)| got.as_str().unwrap_or_default() == w), "{name}: {cpu:?}");
    }
    bed.checked_claim("case03", "ubuntu-container", ask(2, Mem::Mib(2000), 0), &[], &cards)?;
    bed.checked_claim("case03", "ubuntu-container1", ask(2, Mem::Mib(3000), 0), &[], &cards)?;
    bed.check("case03-kube", "ubuntu-container", ask(2, Mem::Mib(2000), 0), &[], &cards)?;
    bed.check("case03-kube", "ubuntu-container1", ask(2, Mem::Mib(3000), 0), &[], &cards)?;
    Ok(())
}

// ---- nvidia.com/gpu: 2, gpumem-percentage, and the extended-resource path -------------------

/// `nvidia.com/gpu: 2` is two distinct cards: on a node of two it gets both, on a node of one it
/// stays unscheduled rather than taking the one card twice.
#[test]
fn two_gpus_are_two_distinct_cards_or_none() {
    if let Err(e) = two_gpus() {
        panic!("{e:#}");
    }
}

fn two_gpus() -> anyhow::Result<()> {
    let mut bed = Bed::start(&device_class(None))?;
    bed.node("two-cards", "2xTesla T4:15Gi")?;
    bed.node("one-card", "1xTesla T4:15Gi")?;
    let cards = bed.cards(3)?;
    bed.start_webhook(&[], &gpu_pod("probe", "default", &on("two-cards"), "", "nvidia.com/gpu: 1"))?;

    bed.create(&gpu_pod("on-two", "default", &on("two-cards"), "", "nvidia.com/gpu: 2"))?;
    let placed = bed.check("on-two", "cuda", ask(2, Mem::Whole, 100), &[], &cards)?;
    ensure!(placed.cards[0].device != placed.cards[1].device, "{:?}", placed.cards);

    // On one card: whole cards, and shares of 1000 MiB, which would leave room for the second
    // share on the same card (the claim's uuid constraint forbids it; kube-scheduler 1.36 does
    // not pick one device twice for one request either).
    bed.create(&gpu_pod("on-one", "default", &on("one-card"), "", "nvidia.com/gpu: 2"))?;
    bed.create(&gpu_pod("on-one-shares", "default", &on("one-card"), "", "nvidia.com/gpu: 2, nvidia.com/gpumem: 1000"))?;
    let claims = [
        bed.checked_claim("on-one", "cuda", ask(2, Mem::Whole, 100), &[], &cards)?,
        bed.checked_claim("on-one-shares", "cuda", ask(2, Mem::Mib(1000), 0), &[], &cards)?,
    ];
    let kubectl = bed.kubectl.clone();
    for pod in ["on-one", "on-one-shares"] {
        let condition = eventually(&format!("{pod} reported unschedulable"), Duration::from_secs(60), || {
            let p = kubectl.get_json(&["pod", pod, "-n", "default"])?;
            let conditions = p["status"]["conditions"].as_array().cloned().unwrap_or_default();
            Ok(conditions.into_iter().find(|c| c["type"] == "PodScheduled" && c["status"] == "False"))
        })?;
        ensure!(condition["reason"] == "Unschedulable", "{pod}: {condition}");
    }
    // A fair wait past the scheduler's first retries.
    std::thread::sleep(Duration::from_secs(10));
    for (pod, claim) in ["on-one", "on-one-shares"].into_iter().zip(&claims) {
        let claim = kubectl.get_json(&["resourceclaim", claim, "-n", "default"])?;
        ensure!(claim["status"].get("allocation").is_none(), "{pod} allocated on a node of one card: {claim:#}");
        let p = bed.pod("default", pod)?;
        ensure!(p["spec"].get("nodeName").is_none(), "{p:#}");
    }
    Ok(())
}

/// The node with two card models of different memory for the percentage checks.
const TWO_MODELS: &str = "1xTesla T4:15Gi,1xNVIDIA A10:24Gi";

/// `nvidia.com/gpumem-percentage: 50` is half of whichever card is picked, on the claim's
/// allocation and in the CDI spec: chosen by `nvidia.com/use-gputype`, or left to the scheduler.
#[test]
fn half_memory_is_half_of_the_card_picked() {
    if let Err(e) = half_memory() {
        panic!("{e:#}");
    }
}

fn half_memory() -> anyhow::Result<()> {
    let mut bed = Bed::start(&device_class(None))?;
    let dirs = bed.node(NODE, TWO_MODELS)?;
    let cards = bed.cards(2)?;
    let mut kubelet = kubelet(&dirs);
    bed.start_webhook(&[], &gpu_pod("probe", "default", &on(NODE), "", "nvidia.com/gpu: 1"))?;
    let kubectl = bed.kubectl.clone();
    let half = "nvidia.com/gpumem-percentage: 50";
    let mut limits = Vec::new();
    for (pod, annotations, product) in [
        ("half-a10", "nvidia.com/use-gputype: A10", Some("NVIDIA A10")),
        ("half-t4", "nvidia.com/use-gputype: t4", Some("Tesla T4")),
        ("half-any", "", None),
    ] {
        bed.create(&gpu_pod(pod, "default", &on(NODE), annotations, half))?;
        // The models the annotation allows: one subrequest each.
        let allowed: Vec<Card> = cards.iter().filter(|c| product.is_none_or(|p| c.product == p)).cloned().collect();
        let placed = bed.check(pod, "cuda", ask(1, Mem::Percent(50), 0), &[], &allowed)?;
        let card = &placed.cards[0];
        ensure!(product.is_none_or(|p| card.product == p), "{pod} on {card:?}");
        let env = prepared_env(&mut kubelet, &dirs, &kubectl, "default", &placed.claim)?;
        check_limits(&env, &[card.memory / 2], 0).with_context(|| format!("{pod} on {card:?}"))?;
        limits.push(card.memory / 2 / MIB);
    }
    ensure!(limits[..2] == [12288, 7680], "{limits:?}");
    Ok(())
}

/// HAMi gives `nvidia.com/gpu: 2` with a percentage on any two cards, each its own share
/// (pkg/device/nvidia/device.go `Fit`: `memreq = dev.Totalmem * k.MemPercentagereq / 100` per
/// card); a node whose two cards are of different models serves it, one card of each.
#[test]
fn two_gpus_at_half_memory_span_two_card_models() {
    if let Err(e) = two_models_half() {
        panic!("{e:#}");
    }
}

fn two_models_half() -> anyhow::Result<()> {
    let mut bed = Bed::start(&device_class(None))?;
    bed.node(NODE, TWO_MODELS)?;
    let cards = bed.cards(2)?;
    bed.start_webhook(&[], &gpu_pod("probe", "default", &on(NODE), "", "nvidia.com/gpu: 1"))?;
    bed.create(&gpu_pod("half-of-two", "default", &on(NODE), "", "nvidia.com/gpu: 2, nvidia.com/gpumem-percentage: 50"))?;
    let placed = bed.check("half-of-two", "cuda", ask(2, Mem::Percent(50), 0), &[], &cards)?;
    ensure!(placed.cards[0].product != placed.cards[1].product, "{:?}", placed.cards);
    Ok(())
}

/// Issue item 11: with the class standing for `nvidia.com/gpu`, a pod asking `nvidia.com/gpu: 1`
/// that the webhook does not see (its own namespace) is served by kube-scheduler's
/// extended-resource claim, and the same pod through the webhook gets the same HAMi-core limits.
#[test]
fn extended_resource_path_and_webhook_give_the_same_limits() {
    if let Err(e) = extended_resource() {
        panic!("{e:#}");
    }
}

fn extended_resource() -> anyhow::Result<()> {
    let mut bed = Bed::start(&device_class(Some("nvidia.com/gpu")))?;
    let dirs = bed.node(NODE, "2xTesla T4:15Gi")?;
    let cards = bed.cards(2)?;
    let mut kubelet = kubelet(&dirs);
    bed.start_webhook(&[], &gpu_pod("probe", "default", &on(NODE), "", "nvidia.com/gpu: 1"))?;
    let kubectl = bed.kubectl.clone();

    // The scheduler's path: the pod keeps its extended resource, the scheduler makes the claim.
    let kubectl_ok = kubectl.clone();
    eventually("the default service account of vgpu-dra", Duration::from_secs(30), || {
        Ok(kubectl_ok.run(&["get", "serviceaccount", "default", "-n", WEBHOOK_NAMESPACE, "-o", "name"]).ok())
    })?;
    bed.create(&gpu_pod("by-scheduler", WEBHOOK_NAMESPACE, &on(NODE), "", "nvidia.com/gpu: 1"))?;
    let pod = bed.pod(WEBHOOK_NAMESPACE, "by-scheduler")?;
    ensure!(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1", "not converted: {pod:#}");
    let name = eventually("the extended-resource claim", Duration::from_secs(60), || {
        let pod = kubectl.get_json(&["pod", "by-scheduler", "-n", WEBHOOK_NAMESPACE])?;
        Ok(pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"].as_str().map(str::to_owned))
    })?;
    ensure!(name.starts_with("by-scheduler-extended-resources-"), "{name}");
    let claim = kubectl.get_json(&["resourceclaim", &name, "-n", WEBHOOK_NAMESPACE])?;
    let annotation = &claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"];
    ensure!(annotation == "true", "{claim:#}");
    let results = bed.allocated(WEBHOOK_NAMESPACE, &name)?;
    let by_scheduler = check_allocation(&results, ask(1, Mem::Whole, 100), &cards).with_context(|| format!("{results:#?}"))?;
    let scheduler_env = prepared_env(&mut kubelet, &dirs, &kubectl, WEBHOOK_NAMESPACE, &name)?;

    // The webhook's path in `default`.
    bed.create(&gpu_pod("by-webhook", "default", &on(NODE), "", "nvidia.com/gpu: 1"))?;
    let placed = bed.check("by-webhook", "cuda", ask(1, Mem::Whole, 100), &[], &cards)?;
    let webhook_env = prepared_env(&mut kubelet, &dirs, &kubectl, "default", &placed.claim)?;

    for (path, env, card) in [("scheduler", &scheduler_env, &by_scheduler[0]), ("webhook", &webhook_env, &placed.cards[0])] {
        check_limits(env, &[card.memory], 100).with_context(|| format!("the {path}'s claim"))?;
    }
    let limits = |env: &[String]| -> Vec<String> {
        env.iter()
            .filter(|e| e.starts_with("CUDA_DEVICE_MEMORY_LIMIT") || e.starts_with("CUDA_DEVICE_SM_LIMIT"))
            .cloned()
            .collect()
    };
    ensure!(limits(&scheduler_env) == limits(&webhook_env), "{scheduler_env:?} vs {webhook_env:?}");
    Ok(())
}
