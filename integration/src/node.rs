//! A real node for the test bed: containerd 2.x (CDI on, reading the driver's CDI directory) and
//! the kubelet at the test bed's release, registered against a [`ControlPlane`], running real
//! containers with runc. Everything listens on loopback or on sockets under a temp dir:
//!
//! - Networking: a pod on the host network shares the machine's; any other pod gets a network
//!   namespace with nothing but its loopback interface, from a CNI plugin of this module's own
//!   (no bridge, no veth, no route: nothing of the machine's network changes), and an address no
//!   interface carries. Pods that need no network beyond themselves run as on any node.
//! - Images: only the two this module imports (and the names [`BUSYBOX_ALIASES`] give the test
//!   image); every registry is `127.0.0.1:1`, so a pull fails at once, the same on every machine.
//! - Identity, as in a cluster: the kubelet authenticates as `system:node:<name>` with a client
//!   certificate ([`ControlPlane::node_kubeconfig`]), so the API server's Node authorizer and
//!   NodeRestriction limit it to its own node's objects; its own API authenticates callers by
//!   certificate or token and asks the API server whether they may (no anonymous access).
//! - `kubectl logs` and `exec`: the kubelet serves on `127.0.0.1` (the API server presents its
//!   client certificate), and the Node's address is `127.0.0.1`, set by this module: the kubelet
//!   refuses a loopback node IP, and runs as with an external cloud provider, which leaves a
//!   Node's addresses that are set alone.
//! - The ConfigMap `kube-root-ca.crt` in `default`, which the plane's controller manager does not
//!   publish, is published, so pods that mount a service-account token start.
//!
//! The kubelet's root directory is [`node_host_dir`]`/kubelet` and containerd reads CDI specs from
//! [`node_host_dir`]`/cdi`: the directories [`crate::start_driver`] gives a driver unless told
//! otherwise, so a driver started for the same node registers with this kubelet.
//!
//! containerd and the kubelet share a mount namespace of the node's own (containerd starts it,
//! the kubelet joins it), so that the volumes the kubelet mounts (a service-account token's
//! tmpfs) are what containerd bind-mounts into containers, and nothing they mount shows on the
//! machine. In it the six kernel settings the kubelet would otherwise rewrite for the whole
//! machine (`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`, ...) read as the
//! values it wants, `/var/log` is a tmpfs (its legacy `/var/log/containers` links), and so is
//! `/var/lib/cni`, where the CNI library caches results (the one change on the machine is that
//! empty directory). Pod cgroups live under a cgroup root of this node's own, created before the
//! kubelet starts and removed after. On a cgroup v1 host the kubelet is told `failCgroupV1: false`
//! (KEP-5573: since 1.35 it refuses cgroup v1 otherwise).
//!
//! Needs root, overlayfs, mount/PID/IPC/UTS/network namespaces, `nsenter` and the cgroup
//! controllers the kubelet uses; [`require_node_support`] names whichever is missing. Binaries come from
//! `integration/k8s/build-node.sh` (or `VGPU_DRA_BIN_<NAME>` variables for all of them).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, bail, ensure};

use crate::control_plane::FEATURE_GATES;
use crate::{ControlPlane, Kubectl, ManagedProcess, eventually, free_port, node_host_dir};

/// The sandbox image every pod's sandbox runs (`integration/k8s/node/pause.c`).
pub const PAUSE_IMAGE: &str = "vgpu-dra.test/pause:1";
/// The test image: Debian's busybox-static, plus `/usr/bin/env` dynamically linked (so ld.so, and
/// with it `/etc/ld.so.preload`, runs) and the C library it loads.
pub const BUSYBOX_IMAGE: &str = "vgpu-dra.test/busybox:1";
/// The test image's dynamically linked program.
pub const DYNAMIC_PROGRAM: &str = "/usr/bin/env";
/// Further names of [`BUSYBOX_IMAGE`] on the node, so that examples written for any cluster
/// (`image: busybox:1.36`, as in the docs) run here unchanged, without a registry.
pub const BUSYBOX_ALIASES: [&str; 1] = ["docker.io/library/busybox:1.36"];
/// The CNI plugin of the node (see the module's documentation): `ADD` gives the pod an address
/// from its sandbox's ID and creates nothing; everything else succeeds doing nothing.
const CNI_PLUGIN: &str = r#"#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
ADD)
	id="$CNI_CONTAINERID"
	printf '{"cniVersion":"1.0.0","ips":[{"address":"10.%d.%d.%d/32"}]}' \
		"0x$(echo "$id" | cut -c1-2)" "0x$(echo "$id" | cut -c3-4)" "0x$(echo "$id" | cut -c5-6)"
	;;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
esac
"#;

/// The node's binaries and images, from `integration/k8s/build-node.sh`.
#[derive(Debug, Clone)]
pub struct NodeComponents {
    /// The kubelet.
    pub kubelet: PathBuf,
    /// containerd.
    pub containerd: PathBuf,
    /// containerd's runc shim (found by containerd on its `PATH`).
    pub containerd_shim_runc_v2: PathBuf,
    /// containerd's client, to import images.
    pub ctr: PathBuf,
    /// runc.
    pub runc: PathBuf,
    /// [`PAUSE_IMAGE`] as an OCI layout in a tar archive.
    pub pause_image: PathBuf,
    /// [`BUSYBOX_IMAGE`] as an OCI layout in a tar archive.
    pub busybox_image: PathBuf,
}

const NAMES: [&str; 7] =
    ["kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc", "node-image-pause", "node-image-busybox"];

/// The node's components, found or built once per test process.
///
/// # Errors
/// When one is missing and cannot be built; tests fail on it (never skip), so CI notices.
pub fn node_components() -> anyhow::Result<&'static NodeComponents> {
    static FOUND: OnceLock<Result<NodeComponents, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| locate().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("node components unavailable: {e}"))
}

fn locate() -> anyhow::Result<NodeComponents> {
    let from_env =
        |name: &str| std::env::var_os(format!("VGPU_DRA_BIN_{}", name.to_uppercase().replace('-', "_"))).map(PathBuf::from);
    let mut paths: Vec<PathBuf> = NAMES.iter().filter_map(|n| from_env(n)).collect();
    if paths.len() != NAMES.len() {
        paths = build()?;
    }
    for (name, p) in NAMES.iter().zip(&paths) {
        ensure!(p.is_file(), "{name}: {} does not exist", p.display());
    }
    let [kubelet, containerd, containerd_shim_runc_v2, ctr, runc, pause_image, busybox_image]: [PathBuf; 7] =
        paths.try_into().map_err(|_| anyhow::anyhow!("wrong number of node components"))?;
    Ok(NodeComponents { kubelet, containerd, containerd_shim_runc_v2, ctr, runc, pause_image, busybox_image })
}

fn build() -> anyhow::Result<Vec<PathBuf>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/build-node.sh");
    let out = Command::new(&script).output().with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed:\n{}", script.display(), String::from_utf8_lossy(&out.stderr));
    }
    let stdout = String::from_utf8(out.stdout)?;
    NAMES
        .iter()
        .map(|name| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .map(PathBuf::from)
                .with_context(|| format!("build-node.sh printed no path for {name}"))
        })
        .collect()
}

/// The cgroup hierarchy of the host, as the kubelet and runc will use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup v1 (with or without a v2 hierarchy beside it): one mount per controller set.
    V1 {
        /// The mount points of the v1 hierarchies and of a v2 one beside them.
        mounts: Vec<PathBuf>,
    },
    /// The unified cgroup v2 hierarchy at this mount point.
    V2 {
        /// Its mount point.
        mount: PathBuf,
    },
}

impl Cgroups {
    fn mounts(&self) -> Vec<PathBuf> {
        match self {
            Self::V1 { mounts } => mounts.clone(),
            Self::V2 { mount } => vec![mount.clone()],
        }
    }
}

/// The cgroup controllers the kubelet requires (cgroup v1 names).
const V1_CONTROLLERS: [&str; 7] = ["cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer"];

/// Checks what a real node needs of the machine, naming what is missing: root, overlayfs,
/// namespaces, the cgroup controllers. Returns the cgroup layout found.
///
/// # Errors
/// One message naming every missing feature.
pub fn require_node_support() -> anyhow::Result<Cgroups> {
    let mut missing = Vec::new();
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if uid.as_deref().ok() != Some("0") {
        missing.push("root: containerd, runc and the kubelet run as root (mounts, cgroups, namespaces)".to_owned());
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems.lines().any(|l| l.split_whitespace().last() == Some("overlay")) {
        missing.push("overlayfs (the `overlay` file system): containerd's snapshotter mounts container roots with it".to_owned());
    }
    let probe = Command::new("unshare").args(["--mount", "--pid", "--ipc", "--uts", "--net", "--fork", "true"]).output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => missing.push(format!(
            "mount, PID, IPC, UTS and network namespaces: `unshare --mount --pid --ipc --uts --net --fork true` fails ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => missing.push(format!("util-linux `unshare` ({e})")),
    }
    // The kubelet joins the node's mount namespace (see the module's documentation).
    if !Path::new("/usr/bin/nsenter").is_file() {
        missing.push("util-linux `nsenter` at /usr/bin/nsenter: the kubelet joins containerd's mount namespace".to_owned());
    }
    let cgroups = cgroup_layout();
    match &cgroups {
        Ok(Cgroups::V1 { mounts }) => {
            let have: Vec<String> = mounts
                .iter()
                .flat_map(|m| {
                    m.file_name().and_then(|n| n.to_str()).unwrap_or_default().split(',').map(str::to_owned).collect::<Vec<_>>()
                })
                .collect();
            for c in V1_CONTROLLERS {
                if !have.iter().any(|h| h == c) {
                    missing.push(format!("the cgroup v1 `{c}` controller (no hierarchy mounted for it under /sys/fs/cgroup)"));
                }
            }
        }
        Ok(Cgroups::V2 { mount }) => {
            let controllers = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
            for c in ["cpu", "cpuset", "memory", "pids"] {
                if !controllers.split_whitespace().any(|h| h == c) {
                    missing.push(format!("the cgroup v2 `{c}` controller (not in {}/cgroup.controllers)", mount.display()));
                }
            }
        }
        Err(e) => missing.push(format!("{e:#}")),
    }
    ensure!(missing.is_empty(), "this machine cannot run a real node; it lacks:\n- {}", missing.join("\n- "));
    cgroups
}

/// The cgroup mounts under `/sys/fs/cgroup`, from `/proc/self/mountinfo`.
fn cgroup_layout() -> anyhow::Result<Cgroups> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mut v1 = Vec::new();
    let mut v2 = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else { continue };
        let (Some(point), Some(fstype)) = (fields.get(4), fields.get(sep + 1)) else { continue };
        if !point.starts_with("/sys/fs/cgroup") {
            continue;
        }
        match *fstype {
            "cgroup" => v1.push(PathBuf::from(point)),
            "cgroup2" => v2 = Some(PathBuf::from(point)),
            _ => {}
        }
    }
    match (v1.is_empty(), v2) {
        (false, v2) => Ok(Cgroups::V1 { mounts: v1.into_iter().chain(v2).collect() }),
        (true, Some(mount)) => Ok(Cgroups::V2 { mount }),
        (true, None) => bail!("cgroups: no cgroup v1 or v2 hierarchy is mounted under /sys/fs/cgroup"),
    }
}

/// The kernel settings the kubelet sets at start unless they already hold, and the values it
/// wants (`pkg/kubelet/cm`'s `setupKernelTunables`); the node shows it these values instead.
const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// How a node is set up beyond what every node has.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// Installed workloads run as in a cluster: pods get a network ([`crate::pod_network`]; the
    /// plane must have [`crate::PlaneOptions::pod_network`]), and the node's directories are seen
    /// by the kubelet, containerd and every container at the paths a chart's defaults name
    /// ([`STANDARD_PATHS`]), bound in the node's mount namespace.
    pub pod_network: bool,
}

/// Where a node with [`NodeOptions::pod_network`] shows its directories, and their names under
/// [`node_host_dir`]: the kubelet's root, the CDI directory, HAMi-core's host directory and
/// HAMi-core's lock directory, as the chart's defaults name them. Each mount point is created
/// empty on the machine if missing; what is bound there is seen only inside the node.
pub const STANDARD_PATHS: [(&str, &str); 4] =
    [("/var/lib/kubelet", "kubelet"), ("/var/run/cdi", "cdi"), ("/usr/local/vgpu", "vgpu"), ("/tmp/vgpulock", "vgpulock")];

/// A running node; dropping it stops its kubelet, its containers and containerd, and removes
/// its cgroups and mounts.
pub struct Node {
    name: String,
    kubelet: Option<ManagedProcess>,
    containerd: Option<ManagedProcess>,
    /// containerd's gRPC socket.
    socket: PathBuf,
    /// The kubelet's `--root-dir`.
    kubelet_dir: PathBuf,
    cdi_dir: PathBuf,
    cgroups: Cgroups,
    /// The node's cgroup root, such as `/vgpu-dra-node-abc123`.
    cgroup_root: String,
    kubeconfig: PathBuf,
    /// The CA of the API server's client certificate, which the kubelet authenticates it by.
    client_ca: PathBuf,
    kubectl: Kubectl,
    kubelet_starts: u32,
    options: NodeOptions,
    /// The API server's address from inside the node, and the egress to it.
    network: Option<(crate::pod_network::Relay, crate::pod_network::EgressProxy)>,
    /// The plane's API server address on the machine.
    server: String,
    /// The plane's egress socket.
    egress_socket: Option<PathBuf>,
    /// The node's directories by name under [`node_host_dir`].
    host: PathBuf,
    // Last: removed once everything above is stopped.
    dir: tempfile::TempDir,
}

impl Node {
    /// Starts containerd and a kubelet registering node `name` against `plane`, imports the two
    /// images, and waits until the Node object exists (its not-ready taint removed: no node
    /// lifecycle controller runs to lift it).
    ///
    /// # Errors
    /// When the machine lacks a feature ([`require_node_support`]), a component is missing, or a
    /// component does not come up in time (its log is quoted).
    pub fn start(plane: &ControlPlane, name: &str) -> anyhow::Result<Self> {
        Self::start_with(plane, name, &NodeOptions::default())
    }

    /// [`Node::start`] with options.
    ///
    /// # Errors
    /// As [`Node::start`]; also when `options` asks for a pod network the plane has no egress for.
    pub fn start_with(plane: &ControlPlane, name: &str, options: &NodeOptions) -> anyhow::Result<Self> {
        ensure!(
            !options.pod_network || plane.egress_socket().is_some(),
            "a node with a pod network needs a plane started with PlaneOptions::pod_network"
        );
        let cgroups = require_node_support()?;
        let bins = node_components()?;
        // Short: containerd's shim sockets live in `<dir>/s` and unix socket paths are short.
        let dir = tempfile::Builder::new().prefix("vgpu-node-").tempdir()?;
        let host = node_host_dir(plane, name);
        let kubelet_dir = host.join("kubelet");
        let cdi_dir = host.join("cdi");
        for (_, sub) in STANDARD_PATHS {
            let d = host.join(sub);
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        let unique = dir.path().file_name().and_then(|n| n.to_str()).unwrap_or("vgpu-node").to_owned();
        let socket = dir.path().join("containerd.sock");
        let mut node = Self {
            name: name.to_owned(),
            kubelet: None,
            containerd: None,
            socket,
            kubelet_dir,
            cdi_dir,
            cgroups,
            cgroup_root: format!("/vgpu-dra-{unique}"),
            kubeconfig: plane.node_kubeconfig(name)?,
            client_ca: plane.client_ca().cert(),
            kubectl: plane.kubectl().clone(),
            kubelet_starts: 0,
            options: options.clone(),
            network: None,
            server: plane.server().to_owned(),
            egress_socket: plane.egress_socket().map(Path::to_owned),
            host,
            dir,
        };
        node.start_containerd(bins)?;
        node.start_network()?;
        node.import_images(bins)?;
        node.create_cgroup_root()?;
        node.start_kubelet()?;
        node.wait_registered()?;
        publish_root_ca(plane)?;
        Ok(node)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kubelet's root directory (`--kubelet-dir` of a driver on this node).
    pub fn kubelet_dir(&self) -> &Path {
        &self.kubelet_dir
    }

    /// The CDI directory containerd reads (`--cdi-dir` of a driver on this node).
    pub fn cdi_dir(&self) -> &Path {
        &self.cdi_dir
    }

    /// Where the node keeps what it shows at `path_in_node` (one of [`STANDARD_PATHS`]), as the
    /// machine sees it.
    pub fn host_view(&self, path_in_node: &str) -> Option<PathBuf> {
        STANDARD_PATHS.iter().find(|(p, _)| *p == path_in_node).map(|(_, sub)| self.host.join(sub))
    }

    /// The node's network namespace's holder (containerd), with a pod network.
    fn network_holder(&self) -> Option<u32> {
        if !self.options.pod_network {
            return None;
        }
        self.containerd.as_ref().and_then(ManagedProcess::pid)
    }

    /// With a pod network: the API server's addresses inside the node, and the plane's egress.
    fn start_network(&mut self) -> anyhow::Result<()> {
        let Some(pid) = self.network_holder() else { return Ok(()) };
        let api: std::net::SocketAddr = self
            .server
            .trim_start_matches("https://")
            .parse()
            .with_context(|| format!("the API server's address {}", self.server))?;
        let service: std::net::SocketAddr = format!("{}:443", crate::pod_network::API_SERVICE_IP).parse()?;
        let relay = crate::pod_network::Relay::start(pid, &[(api, api), (service, api)])?;
        let socket = self.egress_socket.clone().context("no egress socket")?;
        let egress = crate::pod_network::EgressProxy::start(pid, &socket)?;
        self.network = Some((relay, egress));
        Ok(())
    }

    /// The kubelet's log.
    pub fn kubelet_log(&self) -> Option<&Path> {
        self.kubelet.as_ref().map(ManagedProcess::log)
    }

    fn start_containerd(&mut self, bins: &NodeComponents) -> anyhow::Result<()> {
        let d = self.dir.path();
        let shim_dir = d.join("s");
        // containerd refuses a shim socket directory longer than 42 bytes; then it uses its default.
        let socket_dir = if shim_dir.as_os_str().len() <= 42 {
            format!("[plugins.'io.containerd.shim.v1.manager']\n  socket_dir = {}\n", toml_str(&shim_dir))
        } else {
            String::new()
        };
        write_cni(d, self.options.pod_network)?;
        // Every registry, `_default`, is an address that refuses connections.
        std::fs::create_dir_all(d.join("registries/_default"))?;
        std::fs::write(d.join("registries/_default/hosts.toml"), "server = \"https://127.0.0.1:1\"\n")?;
        let config = format!(
            r"version = 3
root = {root}
state = {state}
imports = []
disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.tracing.processor.v1.otlp', 'io.containerd.internal.v1.tracing', 'io.containerd.image-verifier.v1.bindir']

[grpc]
  address = {socket}
[ttrpc]
  address = {ttrpc}
[debug]
  address = ''
  level = 'info'
[metrics]
  address = ''

{socket_dir}
[plugins.'io.containerd.internal.v1.opt']
  path = {opt}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{PAUSE_IMAGE}'
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = {registries}

[plugins.'io.containerd.cri.v1.runtime']
  # Root may lack CAP_SYS_RESOURCE (so on the machines this was written on): no process can lower
  # its oom_score_adj, and runc fails every sandbox (-998) unless it is held at containerd's own.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = [{cdi}]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {runc}
        Root = {runc_root}
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{cni_bin}]
    conf_dir = {cni_conf}
    # containerd brings a pod's loopback interface up itself: no `loopback` plugin is needed.
    use_internal_loopback = true

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
",
            root = toml_str(&d.join("root")),
            state = toml_str(&d.join("state")),
            socket = toml_str(&self.socket),
            ttrpc = toml_str(&d.join("containerd.sock.ttrpc")),
            opt = toml_str(&d.join("opt")),
            cdi = toml_str(if self.options.pod_network { Path::new("/var/run/cdi") } else { &self.cdi_dir }),
            runc = toml_str(&bins.runc),
            runc_root = toml_str(&d.join("runc")),
            cni_bin = toml_str(&d.join("cni/bin")),
            cni_conf = toml_str(&d.join("cni/net.d")),
            registries = toml_str(&d.join("registries")),
        );
        let config_path = d.join("containerd.toml");
        std::fs::write(&config_path, config)?;
        // containerd finds its shim on PATH.
        let shim_dir = bins.containerd_shim_runc_v2.parent().context("shim path")?;
        let path = format!("{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", shim_dir.display());
        let mut args = self.node_namespace_setup()?;
        args.extend([
            "/usr/bin/env".to_owned(),
            "-i".to_owned(),
            format!("PATH={path}"),
            bins.containerd.display().to_string(),
            format!("--config={}", config_path.display()),
        ]);
        self.containerd = Some(ManagedProcess::spawn("containerd", Path::new("/usr/bin/unshare"), &args, d)?);
        eventually("containerd answering", Duration::from_secs(60), || {
            self.check_running()?;
            Ok(self.ctr(&["version"]).ok().map(|_| ()))
        })
    }

    /// The arguments of `unshare` that start a program in a new mount namespace for the node,
    /// set up as the module's documentation says.
    fn node_namespace_setup(&self) -> anyhow::Result<Vec<String>> {
        // What the kubelet would write to the machine's kernel settings, it reads from files of ours.
        let sysctls = self.dir.path().join("sysctl");
        std::fs::create_dir_all(&sysctls)?;
        let mut script = vec!["set -e".to_owned()];
        for (key, value) in KUBELET_SYSCTLS {
            let file = sysctls.join(key.replace('/', "."));
            std::fs::write(&file, format!("{value}\n"))?;
            script.push(format!("mount --bind -o ro {} /proc/sys/{key}", file.display()));
        }
        script.push("mount -t tmpfs -o mode=0755 vgpu-dra-node-logs /var/log".to_owned());
        // The mount point on the machine, empty; what is cached there stays in the namespace.
        std::fs::create_dir_all("/var/lib/cni").context("creating /var/lib/cni")?;
        script.push("mount -t tmpfs -o mode=0700 vgpu-dra-node-cni /var/lib/cni".to_owned());
        let mut unshare = vec!["--mount".to_owned()];
        if self.options.pod_network {
            unshare.push("--net".to_owned());
            script.extend(crate::pod_network::namespace_setup());
            for (path, sub) in STANDARD_PATHS {
                std::fs::create_dir_all(path).with_context(|| format!("creating the mount point {path}"))?;
                script.push(format!("mount --bind {} {path}", self.host.join(sub).display()));
            }
        }
        script.push("exec \"$@\"".to_owned());
        Ok([unshare, strings_of(&["--propagation", "slave", "--", "/bin/sh", "-c", &script.join("\n"), "node"])].concat())
    }

    fn import_images(&mut self, bins: &NodeComponents) -> anyhow::Result<()> {
        for (image, tar) in [(PAUSE_IMAGE, &bins.pause_image), (BUSYBOX_IMAGE, &bins.busybox_image)] {
            let tar = tar.display().to_string();
            self.ctr(&["images", "import", "--snapshotter=overlayfs", &tar])
                .with_context(|| format!("importing {image} from {tar}"))?;
        }
        for alias in BUSYBOX_ALIASES {
            self.ctr(&["images", "tag", "--force", BUSYBOX_IMAGE, alias])
                .with_context(|| format!("naming {BUSYBOX_IMAGE} {alias}"))?;
        }
        let listed = self.ctr(&["images", "list", "-q"])?;
        for image in [PAUSE_IMAGE, BUSYBOX_IMAGE].into_iter().chain(BUSYBOX_ALIASES) {
            ensure!(
                listed.lines().any(|l| l.trim() == image),
                "{image} is not among containerd's images after the import:\n{listed}"
            );
        }
        Ok(())
    }

    /// Runs `ctr` in the CRI namespace (`k8s.io`) of this node's containerd; returns stdout.
    ///
    /// # Errors
    /// When ctr fails (its stderr is the message).
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let bins = node_components()?;
        let out = Command::new(&bins.ctr)
            .arg(format!("--address={}", self.socket.display()))
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running ctr")?;
        ensure!(out.status.success(), "ctr {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node's cgroup root in every hierarchy, before the kubelet validates that it exists.
    fn create_cgroup_root(&self) -> anyhow::Result<()> {
        for mount in self.cgroups.mounts() {
            let dir = mount.join(self.cgroup_root.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
            // A new v1 cpuset has no CPUs and no memory nodes: nothing could run in it.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if matches!(self.cgroups, Cgroups::V1 { .. }) && dir.join(file).exists() {
                    let value = std::fs::read_to_string(mount.join(file))?;
                    std::fs::write(dir.join(file), value.trim())
                        .with_context(|| format!("writing {}", dir.join(file).display()))?;
                }
            }
            if matches!(self.cgroups, Cgroups::V2 { .. }) {
                // The kubelet's pod cgroups below need the controllers delegated to them.
                let controllers = std::fs::read_to_string(dir.join("cgroup.controllers"))?;
                let enable: Vec<String> = controllers.split_whitespace().map(|c| format!("+{c}")).collect();
                std::fs::write(dir.join("cgroup.subtree_control"), enable.join(" "))
                    .with_context(|| format!("delegating {controllers} below {}", dir.display()))?;
            }
        }
        Ok(())
    }

    fn write_kubelet_config(&self) -> anyhow::Result<PathBuf> {
        let d = self.dir.path();
        let gates: Vec<String> =
            FEATURE_GATES.split(',').filter_map(|g| g.split_once('=')).map(|(name, on)| format!("  {name}: {on}")).collect();
        let cgroup_v1 = matches!(self.cgroups, Cgroups::V1 { .. });
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine may have cgroup v1 only; since 1.35 the kubelet refuses it unless told (KEP-5573).
failCgroupV1: {fail_v1}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {logs}
volumePluginDir: {volume_plugins}
# Served on loopback, for the API server (`kubectl logs`, `exec`), which presents its client
# certificate: the kubelet asks the API whether a caller may, as in a cluster.
enableServer: true
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {client_ca}}}
authorization: {{mode: Webhook}}
makeIPTablesUtilChains: false
# Not below 0: root may lack CAP_SYS_RESOURCE, which lowering it takes.
oomScoreAdj: 0
failSwapOn: false
resolvConf: ""
registerNode: true
rotateCertificates: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}}
evictionPressureTransitionPeriod: 5s
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
fileCheckFrequency: 5s
featureGates:
{gates}
"#,
            fail_v1 = !cgroup_v1,
            cgroup_root = self.cgroup_root,
            socket = self.socket.display(),
            logs = d.join("pod-logs").display(),
            volume_plugins = d.join("volume-plugins").display(),
            port = free_port()?,
            healthz = free_port()?,
            client_ca = self.client_ca.display(),
            gates = gates.join("\n"),
        );
        let path = d.join("kubelet.yaml");
        std::fs::write(&path, config)?;
        Ok(path)
    }

    /// Starts the kubelet (again, after [`Node::stop_kubelet`]) with the same configuration and
    /// root directory.
    ///
    /// # Errors
    /// When it cannot be started or its health check does not answer in time.
    pub fn start_kubelet(&mut self) -> anyhow::Result<()> {
        ensure!(self.kubelet.is_none(), "the kubelet of {} is running already", self.name);
        let bins = node_components()?;
        let d = self.dir.path().to_owned();
        let config = self.write_kubelet_config()?;
        let healthz = std::fs::read_to_string(&config)?
            .lines()
            .find_map(|l| l.strip_prefix("healthzPort: ").map(str::to_owned))
            .context("no healthz port")?;
        // The node's mount namespace, which containerd holds.
        let holder = self.containerd.as_ref().and_then(ManagedProcess::pid).context("containerd is not running")?;
        self.kubelet_starts += 1;
        let root_dir = if self.options.pod_network { PathBuf::from("/var/lib/kubelet") } else { self.kubelet_dir.clone() };
        let mut args = vec![format!("--mount=/proc/{holder}/ns/mnt")];
        if self.options.pod_network {
            args.push(format!("--net=/proc/{holder}/ns/net"));
        }
        args.extend([
            "--".to_owned(),
            bins.kubelet.display().to_string(),
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--root-dir={}", root_dir.display()),
            format!("--cert-dir={}", d.join("kubelet-pki").display()),
            format!("--hostname-override={}", self.name),
            // Leaves the Node's addresses to this module (see the module's documentation).
            "--cloud-provider=external".to_owned(),
            format!("--v={}", std::env::var("VGPU_DRA_KUBELET_V").unwrap_or_else(|_| "2".into())),
        ]);
        args.extend(
            std::env::var("VGPU_DRA_KUBELET_ARGS")
                .ok()
                .into_iter()
                .flat_map(|a| a.split_whitespace().map(str::to_owned).collect::<Vec<_>>()),
        );
        let name = if self.kubelet_starts == 1 { "kubelet".to_owned() } else { format!("kubelet-{}", self.kubelet_starts) };
        self.kubelet = Some(ManagedProcess::spawn(&name, Path::new("/usr/bin/nsenter"), &args, &d)?);
        let url = format!("http://127.0.0.1:{healthz}/healthz");
        eventually("the kubelet's /healthz", Duration::from_secs(90), || {
            self.check_running()?;
            let body = match self.network_holder() {
                // Its health port is on the node's loopback.
                Some(pid) => {
                    let url = url.clone();
                    crate::pod_network::in_namespace(pid, move || http_get(&url))
                }
                None => http_get(&url),
            };
            Ok(body.ok().filter(|body| body.trim() == "ok").map(|_| ()))
        })
    }

    /// Kills the kubelet (as a crash or a restart would); pods and their containers keep running.
    pub fn stop_kubelet(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            k.stop();
        }
    }

    /// [`Node::stop_kubelet`] then [`Node::start_kubelet`].
    ///
    /// # Errors
    /// As [`Node::start_kubelet`].
    pub fn restart_kubelet(&mut self) -> anyhow::Result<()> {
        self.stop_kubelet();
        self.start_kubelet()
    }

    fn wait_registered(&mut self) -> anyhow::Result<()> {
        let kubectl = self.kubectl.clone();
        let name = self.name.clone();
        eventually(&format!("node {name} registered by its kubelet"), Duration::from_secs(60), || {
            self.check_running()?;
            Ok(kubectl.run(&["get", "node", &name, "-o", "name"]).ok().map(|_| ()))
        })?;
        // The API server's admission taints a new node not-ready, and the kubelet (as with an
        // external cloud provider) uninitialized; no node lifecycle or cloud controller runs to
        // lift them.
        kubectl.run(&["patch", "node", &name, "--type=merge", "-p", r#"{"spec":{"taints":null}}"#])?;
        // Where the API server reaches the kubelet: the kubelet leaves addresses that are set.
        let addresses = r#"{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"}]}}"#;
        kubectl.run(&["patch", "node", &name, "--subresource=status", "--type=merge", "-p", addresses])?;
        Ok(())
    }

    /// Fails when containerd or the kubelet has exited, quoting its log.
    ///
    /// # Errors
    /// When a process of the node has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for p in self.containerd.iter_mut().chain(self.kubelet.iter_mut()) {
            p.check_running()?;
        }
        Ok(())
    }

    /// The output of container `container` of pod `namespace/pod` so far, from the log file
    /// containerd writes for the kubelet (CRI format, one `<time> <stream> <tag> <text>` per line).
    ///
    /// # Errors
    /// When the pod has no log directory on this node or the log cannot be read.
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> anyhow::Result<String> {
        let logs = self.dir.path().join("pod-logs");
        let prefix = format!("{namespace}_{pod}_");
        let pod_dir = std::fs::read_dir(&logs)
            .with_context(|| format!("reading {}", logs.display()))?
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .with_context(|| format!("no log directory of pod {namespace}/{pod} in {}", logs.display()))?
            .path()
            .join(container);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&pod_dir)
            .with_context(|| format!("reading {}", pod_dir.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        files.sort();
        let last = files.last().with_context(|| format!("no log file in {}", pod_dir.display()))?;
        let text = std::fs::read_to_string(last)?;
        let mut out = String::new();
        for line in text.lines() {
            let mut parts = line.splitn(4, ' ');
            let (_, _, tag, body) = (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or(""));
            out.push_str(body);
            if tag != Some("P") {
                out.push('\n');
            }
        }
        Ok(out)
    }

    /// Kills every container (sandboxes included) of this node's containerd and deletes its task,
    /// as a reboot does; the containers' records stay, as on a node whose containerd keeps its root.
    pub fn kill_containers(&self) {
        let Ok(tasks) = self.ctr(&["tasks", "list", "-q"]) else { return };
        for id in tasks.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
        }
        for id in tasks.lines().map(str::trim).filter(|l| !l.is_empty()) {
            for _ in 0..50 {
                if self.ctr(&["tasks", "delete", "--force", id]).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Shims of this node's containerd that outlived it (each names its containerd's socket).
    fn kill_leftover_shims(&self) {
        let socket = self.socket.display().to_string();
        let Ok(procs) = std::fs::read_dir("/proc") else { return };
        for entry in procs.filter_map(Result::ok) {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let ours = args.windows(2).any(|w| w[0] == b"-address" && w[1] == socket.as_bytes());
            if ours {
                let _ = Command::new("kill").args(["-s", "KILL", &pid.to_string()]).status();
            }
        }
    }

    /// Unmounts whatever is still mounted below the node's directory (container roots, shm).
    fn unmount_leftovers(&self) {
        let root = self.dir.path().display().to_string();
        for _ in 0..3 {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mut points: Vec<&str> =
                info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&format!("{root}/"))).collect();
            if points.is_empty() {
                return;
            }
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = Command::new("umount").args(["-l", p]).stderr(Stdio::null()).status();
            }
        }
    }

    /// Removes the node's cgroups, deepest first, once their processes are gone.
    fn remove_cgroups(&self) {
        for mount in self.cgroups.mounts() {
            let top = mount.join(self.cgroup_root.trim_start_matches('/'));
            for _ in 0..50 {
                let mut dirs = Vec::new();
                collect_dirs(&top, &mut dirs);
                dirs.sort_by_key(|d| std::cmp::Reverse(d.as_os_str().len()));
                for d in &dirs {
                    let _ = std::fs::remove_dir(d);
                }
                if !top.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if top.exists() {
                eprintln!("node teardown: cgroup {} is still there", top.display());
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(k) = &self.kubelet
        {
            // The kubelet's log is long: its errors and warnings first, the tail comes with it.
            let text = std::fs::read_to_string(k.log()).unwrap_or_default();
            let problems: Vec<&str> = text.lines().filter(|l| l.starts_with('E') || l.starts_with('W')).collect();
            let last = &problems[problems.len().saturating_sub(40)..];
            eprintln!("----- kubelet errors and warnings ({}) -----\n{}", k.log().display(), last.join("\n"));
        }
        self.stop_kubelet();
        self.kill_containers();
        self.network = None;
        if let Some(mut c) = self.containerd.take() {
            if std::thread::panicking() {
                eprintln!("----- containerd log ({}) -----\n{}", c.log().display(), c.tail(60));
            }
            c.stop();
        }
        self.kill_leftover_shims();
        self.unmount_leftovers();
        self.remove_cgroups();
    }
}

/// The node's CNI configuration and plugin ([`CNI_PLUGIN`], or with a pod network
/// [`crate::pod_network::CNI_PLUGIN`]) under `dir`/`cni`.
fn write_cni(dir: &Path, pod_network: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (conf, bin) = (dir.join("cni/net.d"), dir.join("cni/bin"));
    std::fs::create_dir_all(&conf)?;
    std::fs::create_dir_all(&bin)?;
    let (name, text) =
        if pod_network { ("vgpu-dra-bridge", crate::pod_network::CNI_PLUGIN) } else { ("vgpu-dra-loopback-only", CNI_PLUGIN) };
    let plugin = bin.join(name);
    std::fs::write(&plugin, text)?;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(
        conf.join("10-vgpu-dra.conflist"),
        format!(r#"{{"cniVersion": "1.0.0", "name": "vgpu-dra-node", "plugins": [{{"type": "{name}"}}]}}"#),
    )?;
    Ok(())
}

/// The ConfigMap `kube-root-ca.crt` in namespace `default`, as kube-controller-manager's
/// root-ca-cert-publisher (which the plane does not run) writes it: the kubelet mounts it with
/// every service-account token, and a pod without it never starts. The API server's own
/// certificate stands for the cluster's CA.
fn publish_root_ca(plane: &ControlPlane) -> anyhow::Result<()> {
    let kubectl = plane.kubectl();
    if kubectl.run(&["get", "configmap", "kube-root-ca.crt", "-n", "default", "-o", "name"]).is_ok() {
        return Ok(());
    }
    let cert = plane.dir().join("apiserver-certs/apiserver.crt");
    let ca =
        std::fs::read_to_string(&cert).with_context(|| format!("reading the API server's certificate {}", cert.display()))?;
    let map = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kube-root-ca.crt", "namespace": "default"},
        "data": {"ca.crt": ca},
    });
    kubectl.apply(&map.to_string())?;
    Ok(())
}

/// Builds the stand-in for HAMi-core's `libvgpu.so` (`integration/testdata/libvgpu-stand-in.c`)
/// into `dest`, with HAMi-core's built-in lock directory set to `lock_dir`: the library that
/// `/etc/ld.so.preload` loads in a container on this node, whose constructor records the uid and
/// the limits it sees in `stand-in-record.<uid>` beside the claim's cache file.
///
/// # Errors
/// When the C compiler is missing or fails.
pub fn build_stand_in(dest: &Path, lock_dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/libvgpu-stand-in.c");
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(dest)
        .arg(format!("-DLOCK_DIR=\"{}\"", lock_dir.display()))
        .arg(&source)
        .output()
        .context("running `cc`, needed to build the libvgpu.so stand-in")?;
    ensure!(out.status.success(), "cc {}: {}", source.display(), String::from_utf8_lossy(&out.stderr));
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
    out.push(dir.to_owned());
}

fn toml_str(path: &Path) -> String {
    format!("'{}'", path.display())
}

/// A plain HTTP GET on loopback (the kubelet's health check), without a client library.
fn http_get(url: &str) -> anyhow::Result<String> {
    use std::io::Read;
    let rest = url.strip_prefix("http://").context("not an http URL")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("no HTTP body")?;
    ensure!(head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"), "{}", head.lines().next().unwrap_or(""));
    Ok(body.to_owned())
}

fn strings_of(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}
