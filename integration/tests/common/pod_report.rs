//! What a test pod reports from inside its container, and the check that it saw 003's claim
//! (4096 MiB, 50 % of the SMs) through HAMi-core's environment and the preloaded stand-in.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure};
use vgpu_dra_integration::node::{BUSYBOX_IMAGE, DYNAMIC_PROGRAM, Node};
use vgpu_dra_integration::{Kubectl, eventually};

/// What the pod's container prints: its uid, its environment as the dynamically linked program
/// sees it (loading the preload), the stand-in's record, whether the claim directory is writable.
pub const POD_SCRIPT: &str = r#"echo "uid=$(id -u)"
dir="${CUDA_DEVICE_MEMORY_SHARED_CACHE%/*}"
# A record left by an earlier run of this container (before a reboot) proves nothing.
rm -f "$dir/stand-in-record.$(id -u)"
DYNAMIC_PROGRAM > /tmp/env.txt 2>/tmp/env.err || echo "dynamic-program-failed=$?"
sed 's/^/env:/' /tmp/env.txt
sed 's/^/stderr:/' /tmp/env.err
sed 's/^/record:/' "$dir/stand-in-record.$(id -u)" || echo "no-record"
if touch "$dir/written-by.$(id -u)"; then echo "claim-dir=writable"; else echo "claim-dir=read-only"; fi
if cat /etc/ld.so.preload >/dev/null; then echo "preload=readable"; else echo "preload=unreadable"; fi
if [ -s /var/run/secrets/kubernetes.io/serviceaccount/token ]; then echo "token=mounted"; else echo "token=none"; fi
echo "done"
exec sleep 3600
"#;

/// Source document 003's pod as written for HAMi's device plugin (one card, 4096 MiB, 50 % of
/// its cores), with the test image and [`POD_SCRIPT`]; `spec_extra` is put at the top of its
/// spec, as YAML lines indented by two (a node selector, a security context).
pub fn hami_pod_003(name: &str, spec_extra: &str) -> String {
    let script = serde_json::to_string(&POD_SCRIPT.replace("DYNAMIC_PROGRAM", DYNAMIC_PROGRAM)).unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
{spec_extra}  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", {script}]
    resources:
      limits:
        nvidia.com/gpu: 1
        nvidia.com/gpumem: 4096
        nvidia.com/gpucores: 50
"#
    )
}

/// What a pod's container printed.
pub struct Seen {
    pub uid: String,
    pub env: BTreeMap<String, String>,
    pub record: BTreeMap<String, String>,
    pub flags: BTreeMap<String, String>,
    pub raw: String,
}

/// Waits until pod `name`'s container `main` has printed `done`, and parses what it printed.
pub fn wait_output(node: &mut Node, kubectl: &Kubectl, name: &str) -> anyhow::Result<Seen> {
    wait_output_in(node, kubectl, "default", name, "main")
}

/// [`wait_output`] for container `container` of pod `namespace/name`.
pub fn wait_output_in(node: &mut Node, kubectl: &Kubectl, namespace: &str, name: &str, container: &str) -> anyhow::Result<Seen> {
    let raw = eventually(&format!("pod {namespace}/{name}'s container to report"), Duration::from_secs(120), || {
        node.check_running()?;
        let pod = kubectl.get_json(&["pod", name, "-n", namespace])?;
        if pod["status"]["phase"] == "Failed" {
            bail!("pod {namespace}/{name} failed: {}", pod["status"]);
        }
        let log = node
            .container_log(namespace, name, container)
            .map_err(|e| anyhow::anyhow!("{e:#}; pod status: {}", pod["status"]))?;
        Ok(log.lines().any(|l| l == "done").then_some(log))
    })?;
    let mut seen = Seen { uid: String::new(), env: BTreeMap::new(), record: BTreeMap::new(), flags: BTreeMap::new(), raw };
    for line in seen.raw.lines() {
        let (map, rest) = if let Some(rest) = line.strip_prefix("env:") {
            (&mut seen.env, rest)
        } else if let Some(rest) = line.strip_prefix("record:") {
            (&mut seen.record, rest)
        } else {
            (&mut seen.flags, line)
        };
        if let Some((k, v)) = rest.split_once('=') {
            map.insert(k.to_owned(), v.to_owned());
        }
    }
    seen.uid = seen.flags.get("uid").cloned().unwrap_or_default();
    Ok(seen)
}

/// Fails naming every way `seen` differs from what pod `pod` (as `uid`, on `card`, with claim cache
/// file `cache`) should see of 003's claim.
pub fn check(seen: &Seen, pod: &str, uid: u32, card: &str, cache: &str) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    let mut want = |what: &str, got: Option<&String>, value: &str| {
        if got.map(String::as_str) != Some(value) {
            problems.push(format!("{what} is {got:?}, not {value:?}"));
        }
    };
    want("the container's uid", Some(&seen.uid), &uid.to_string());
    want("CUDA_DEVICE_MEMORY_LIMIT_0", seen.env.get("CUDA_DEVICE_MEMORY_LIMIT_0"), "4096m");
    want("CUDA_DEVICE_SM_LIMIT", seen.env.get("CUDA_DEVICE_SM_LIMIT"), "50");
    want("NVIDIA_VISIBLE_DEVICES", seen.env.get("NVIDIA_VISIBLE_DEVICES"), card);
    want("CUDA_DEVICE_MEMORY_SHARED_CACHE", seen.env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE"), cache);
    want("/etc/ld.so.preload", seen.flags.get("preload"), "readable");
    want("the claim directory", seen.flags.get("claim-dir"), "writable");
    // The stand-in's record: ld.so loaded libvgpu.so into the dynamically linked program.
    want("the preloaded library's uid", seen.record.get("uid"), &uid.to_string());
    want("the preloaded library's memory limit", seen.record.get("memory"), "4096m");
    want("the preloaded library's SM limit", seen.record.get("cores"), "50");
    want("the preloaded library's cache", seen.record.get("cache"), cache);
    want("the preloaded library's lock", seen.record.get("lock"), "ok");
    ensure!(problems.is_empty(), "pod {pod}:\n- {}", problems.join("\n- "));
    Ok(())
}
