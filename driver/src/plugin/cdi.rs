//! The CDI spec of a prepared claim: HAMi-core's limits and library, the card's device nodes.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use cdi_spec::{ContainerEdits, Device, DeviceNode, Kind, Mount, NameError, Spec};
use vgpu_scheduling::device::{CAPACITY_CORES, CAPACITY_MEMORY};
use vgpu_scheduling::{DeviceShare, LimitError, LimitOptions, PublishedDevice, Quantity, container_env};

use super::claim::{ClaimDevice, ClaimRef};

/// Annotation naming the claim of a spec, so specs can be matched with claims after a lost
/// checkpoint.
pub const ANNOTATION_CLAIM: &str = "vgpu-dra.io/claim";
/// NVIDIA's character device major.
const NVIDIA_MAJOR: i64 = 195;

/// Where HAMi-core's pieces live on the host and what goes into every spec.
#[derive(Debug, Clone)]
pub struct CdiOptions {
    /// The CDI kind, `k8s.<driver>/claim`.
    pub kind: Kind,
    /// Host path of `libvgpu.so`, mounted at the same path (HAMi-core dlopens it there).
    pub libvgpu: PathBuf,
    /// Host file naming the library, mounted at `/etc/ld.so.preload`.
    pub preload: PathBuf,
    /// Root of the per-claim host directories (the shared-cache files).
    pub claims_root: PathBuf,
    /// HAMi-core's lock directory.
    pub lock_dir: PathBuf,
    /// Where device nodes are looked up.
    pub dev_root: PathBuf,
    /// Name the card's nodes even when absent on the host (mock inventories).
    pub synthesize_nodes: bool,
    /// HAMi-core knobs.
    pub limits: LimitOptions,
    /// Directories searched for the NVIDIA Container Toolkit's own specs.
    pub toolkit_dirs: Vec<PathBuf>,
    /// Where the NVIDIA driver's `/proc` files are read (MIG capability minors).
    pub proc_root: PathBuf,
}

impl CdiOptions {
    /// The options for `driver` with HAMi-core installed in `hami_core_dir`: the one place that
    /// knows the kind's form and where the library, the preload file and the claim directories
    /// live. Device nodes are read from `/dev`, the lock is `/tmp/vgpulock`; no toolkit specs are
    /// looked for and no HAMi-core knobs are set until the caller says so.
    ///
    /// # Errors
    /// [`NameError`] when the driver name makes no valid CDI kind.
    pub fn for_driver(driver: &vgpu_scheduling::DriverName, hami_core_dir: &Path) -> Result<Self, NameError> {
        Ok(Self {
            kind: Kind::new(&format!("k8s.{driver}"), "claim")?,
            libvgpu: hami_core_dir.join("libvgpu.so"),
            preload: hami_core_dir.join("ld.so.preload"),
            claims_root: hami_core_dir.join("claims"),
            lock_dir: PathBuf::from("/tmp/vgpulock"),
            dev_root: PathBuf::from("/dev"),
            synthesize_nodes: false,
            limits: LimitOptions::default(),
            toolkit_dirs: Vec::new(),
            proc_root: PathBuf::from("/proc"),
        })
    }
}

/// Failures building a spec.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Limits cannot be expressed.
    #[error(transparent)]
    Limits(#[from] LimitError),
    /// A CDI name is invalid.
    #[error(transparent)]
    Name(#[from] NameError),
}

/// The CDI device name of each share, in the claim's order: `<claimUID>-<device>[-<shareID>]`
/// (HAMi DRA's naming) for a card holding one share of the claim, `<claimUID>-<device>` for
/// every share of a card holding several: they are one device inside the container, so they
/// name one CDI device, with one limit for their sum.
pub fn cdi_device_names(claim: &ClaimRef, devices: &[ClaimDevice]) -> Vec<String> {
    devices
        .iter()
        .map(|d| {
            let shared = devices.iter().filter(|o| o.device == d.device).count() > 1;
            match &d.share_id {
                Some(share) if !shared => format!("{}-{}-{share}", claim.uid, d.device),
                _ => format!("{}-{}", claim.uid, d.device),
            }
        })
        .collect()
}

/// The host directory of a claim.
pub fn claim_dir(options: &CdiOptions, claim: &ClaimRef) -> PathBuf {
    options.claims_root.join(claim.uid.as_str())
}

/// The value of `key` in `env`, the environment a spec gives every container of its claim
/// (`containerEdits.env`).
pub fn spec_env<'a>(env: &'a [String], key: &str) -> Option<&'a str> {
    env.iter().find_map(|e| e.strip_prefix(key)?.strip_prefix('='))
}

/// The name of the claim's HAMi-core region file inside its directory: the last component of
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` in the spec's `env`, when it is a plain file name.
pub fn region_file(env: &[String]) -> Option<String> {
    let path = Path::new(spec_env(env, "CUDA_DEVICE_MEMORY_SHARED_CACHE")?);
    let name = path.file_name()?.to_str()?;
    (!name.starts_with('.')).then(|| name.to_owned())
}

/// Whether the claim's devices were allocated with admin access: its spec is a monitoring view.
pub fn is_admin(devices: &[ClaimDevice]) -> bool {
    !devices.is_empty() && devices.iter().all(|d| d.admin)
}

/// The spec of a claim allocated with admin access (KEP-5018: a monitoring tool in a namespace an
/// administrator labelled for it): the cards' device nodes and `NVIDIA_VISIBLE_DEVICES`, and none
/// of HAMi-core (no preload, no limits, no claim directory): the tools it is for (nvidia-smi,
/// DCGM) read the whole card, which HAMi-core's view of a share would hide.
fn admin_spec(
    options: &CdiOptions,
    claim: &ClaimRef,
    devices: &[ClaimDevice],
    published: &[PublishedDevice],
) -> Result<Spec, BuildError> {
    let mut uuids: Vec<String> = Vec::new();
    for d in devices {
        let uuid = card_uuid(d, published);
        if !uuids.contains(&uuid) {
            uuids.push(uuid);
        }
    }
    let mut spec = Spec::new(&options.kind, card_devices(options, claim, devices, published))?;
    spec.annotations.insert(ANNOTATION_CLAIM.into(), claim.key());
    spec.container_edits = ContainerEdits {
        env: vec![format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))],
        device_nodes: shared_nodes(options),
        ..Default::default()
    };
    spec.set_minimum_version();
    Ok(spec)
}

/// The uuid of a share's card (its device name for a card no longer published).
fn card_uuid(d: &ClaimDevice, published: &[PublishedDevice]) -> String {
    published.iter().find(|p| p.name == d.device).map_or_else(|| d.device.to_string(), |c| c.uuid.clone())
}

/// One CDI device per name ([`cdi_device_names`]), each with its card's device node.
fn card_devices(options: &CdiOptions, claim: &ClaimRef, devices: &[ClaimDevice], published: &[PublishedDevice]) -> Vec<Device> {
    let mut cdi_devices: Vec<Device> = Vec::new();
    for (d, name) in devices.iter().zip(cdi_device_names(claim, devices)) {
        if cdi_devices.iter().any(|c| c.name == name) {
            continue;
        }
        let minor = published.iter().find(|p| p.name == d.device).map_or(0, |c| c.minor);
        let nodes = device_node(options, &format!("nvidia{minor}"), Some(i64::from(minor))).into_iter().collect();
        cdi_devices.push(Device {
            name,
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits { device_nodes: nodes, ..Default::default() },
        });
    }
    cdi_devices
}

/// The nodes every container of a claim needs beside its cards'.
fn shared_nodes(options: &CdiOptions) -> Vec<DeviceNode> {
    let shared = [("nvidiactl", Some(255)), ("nvidia-uvm", None), ("nvidia-uvm-tools", None)];
    shared.iter().filter_map(|(n, m)| device_node(options, n, *m)).collect()
}

/// Builds the claim's spec. Limits are indexed by the claim's distinct cards in the order they
/// first appear among its results, which is the CUDA order inside a container using the claim;
/// shares of one card are summed into that card's one limit. The limits sit at spec level so
/// every container of the claim gets all of them, and each device adds its own card's node.
///
/// # Errors
/// [`BuildError`] when the limits or names cannot be expressed.
pub fn build_spec(
    options: &CdiOptions,
    claim: &ClaimRef,
    devices: &[ClaimDevice],
    published: &[PublishedDevice],
    claim_env: &[(String, String)],
) -> Result<Spec, BuildError> {
    if is_admin(devices) {
        return admin_spec(options, claim, devices, published);
    }
    let shares: Vec<DeviceShare> = devices
        .iter()
        .map(|d| {
            let get = |name: &str| d.consumption.get(name).copied().unwrap_or(Quantity::ZERO);
            DeviceShare { uuid: card_uuid(d, published), memory: get(CAPACITY_MEMORY), cores: get(CAPACITY_CORES) }
        })
        .collect();
    let dir = claim_dir(options, claim);
    let mut env = container_env(&shares, &dir.display().to_string(), &options.limits)?;
    // The claim's own HAMi-core settings win over the node's defaults for the same variable.
    for (key, value) in claim_env {
        env.retain(|(k, _)| k != key);
        env.push((key.clone(), value.clone()));
    }
    let mut spec = Spec::new(&options.kind, card_devices(options, claim, devices, published))?;
    spec.annotations.insert(ANNOTATION_CLAIM.into(), claim.key());
    spec.container_edits = ContainerEdits {
        env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        device_nodes: shared_nodes(options),
        mounts: vec![
            bind(&options.libvgpu, &options.libvgpu, "ro"),
            bind(&options.preload, Path::new("/etc/ld.so.preload"), "ro"),
            bind(&dir, &dir, "rw"),
            bind(&options.lock_dir, &options.lock_dir, "rw"),
        ],
        ..Default::default()
    };
    spec.set_minimum_version();
    Ok(spec)
}

/// Gives each CDI device of `spec` that stands for a MIG instance in `holds` the instance's two
/// capability nodes, `/dev/nvidia-caps/nvidia-cap<M>` for its GPU instance and its compute
/// instance: without them CUDA in the container cannot open the instance. The minors come from
/// the driver's `capabilities/gpu<minor>/mig/gi<X>[/ci<Y>]/access` files (`DeviceFileMinor: M`).
///
/// # Errors
/// What is missing, naming the file: on a mock node (`synthesize_nodes`) there are no such
/// files and the nodes are left out instead.
pub fn add_mig_nodes(
    spec: &mut Spec,
    options: &CdiOptions,
    claim: &ClaimRef,
    devices: &[ClaimDevice],
    holds: &[super::mig::MigHold],
) -> Result<(), (String, String)> {
    for (d, name) in devices.iter().zip(cdi_device_names(claim, devices)) {
        let Some(hold) = holds.iter().find(|h| h.device == d.device) else { continue };
        let Some(instance) = &hold.instance else { continue };
        let mut nodes = Vec::new();
        for ci in [None, Some(instance.ci_id)] {
            match cap_node(options, hold.minor, instance.gi_id, ci) {
                Ok(node) => nodes.push(node),
                Err(_) if options.synthesize_nodes => {}
                Err(why) => return Err((d.device.to_string(), why)),
            }
        }
        if let Some(device) = spec.devices.iter_mut().find(|c| c.name == name)
            && !nodes.is_empty()
        {
            device.container_edits.device_nodes.extend(nodes);
        }
    }
    Ok(())
}

/// The capability node of GPU instance `gi` (its compute instance `ci`) on card `gpu_minor`,
/// from the host's `/dev/nvidia-caps`, else with the major `/proc/devices` gives `nvidia-caps`.
fn cap_node(options: &CdiOptions, gpu_minor: u32, gi: u32, ci: Option<u32>) -> Result<DeviceNode, String> {
    let root = options.proc_root.join("driver/nvidia/capabilities");
    let minor = crate::mig::caps::caps_minor(&root, gpu_minor, gi, ci)
        .map_err(|e| format!("MIG capability file of GPU instance {gi} (compute instance {ci:?}): {e}"))?;
    let minor = i64::from(minor);
    let name = format!("nvidia-caps/nvidia-cap{minor}");
    if let Some(node) = device_node(options, &name, None) {
        return Ok(node);
    }
    let major = std::fs::read_to_string(options.proc_root.join("devices"))
        .ok()
        .and_then(|d| d.lines().find_map(|l| l.trim().strip_suffix(" nvidia-caps").and_then(|m| m.trim().parse::<i64>().ok())));
    // The runtime makes the node in the container from its numbers (CDI needs no host node when
    // they are given): the driver creates a new instance's capability nodes on the host only
    // when something asks (nvidia-modprobe), so they may well be missing there.
    match major {
        Some(major) => Ok(DeviceNode {
            path: format!("/dev/{name}"),
            kind: Some("c".into()),
            major: Some(major),
            minor: Some(minor),
            permissions: Some("rw".into()),
            ..Default::default()
        }),
        None => Err(format!(
            "MIG capability node {} is not on the host and {} names no nvidia-caps major",
            options.dev_root.join(&name).display(),
            options.proc_root.join("devices").display(),
        )),
    }
}

fn bind(host: &Path, container: &Path, mode: &str) -> Mount {
    Mount {
        host_path: host.display().to_string(),
        container_path: container.display().to_string(),
        options: vec![mode.into(), "nosuid".into(), "nodev".into(), "bind".into()],
        kind: None,
    }
}

/// A device node from the host (type and numbers read from it); a mock names the NVIDIA ones
/// that have fixed numbers; otherwise an absent node is left out.
fn device_node(options: &CdiOptions, name: &str, nvidia_minor: Option<i64>) -> Option<DeviceNode> {
    let host = options.dev_root.join(name);
    let path = format!("/dev/{name}");
    let host_path = (host != Path::new(&path)).then(|| host.display().to_string());
    if let Ok(meta) = std::fs::metadata(&host)
        && meta.file_type().is_char_device()
    {
        let rdev = meta.rdev();
        let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
        let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
        return Some(DeviceNode {
            path,
            host_path,
            kind: Some("c".into()),
            major: i64::try_from(major).ok(),
            minor: i64::try_from(minor).ok(),
            permissions: Some("rw".into()),
            ..Default::default()
        });
    }
    let minor = nvidia_minor.filter(|_| options.synthesize_nodes)?;
    Some(DeviceNode {
        path,
        kind: Some("c".into()),
        major: Some(NVIDIA_MAJOR),
        minor: Some(minor),
        permissions: Some("rw".into()),
        ..Default::default()
    })
}
