//! Command-line interface: every flag has an environment twin; parsing has no side effects.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use vgpu_scheduling::SharingConfig;

use crate::config::{self, ConfigFlags};
use crate::discovery::mock::{MockSource, parse_spec};
use crate::discovery::nvml::NvmlSource;
use crate::discovery::{DeviceSource, MockFileSource};
use crate::mig::{DynamicMig, MigSettings, PoolLayout};
use crate::slices::PoolIdentity;

/// vgpu-dra: share NVIDIA GPUs between pods through Kubernetes DRA, with HAMi-core limits.
#[derive(Debug, Parser)]
#[command(name = "vgpu-dra", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the ResourceSlices this node would publish, without a cluster.
    Inventory(InventoryArgs),
    /// Run on the node: publish the node's ResourceSlices and keep them true.
    KubeletPlugin(KubeletPluginArgs),
    /// Print the CDI spec an allocated ResourceClaim (YAML or JSON file) would get on this node.
    PreparePreview(PreparePreviewArgs),
    /// Serve the admission webhook that converts pods written for HAMi into DRA claims.
    Webhook(vgpu_dra_webhook::WebhookArgs),
    /// Per card: memory, cores and shares allocated of the total, and who holds them (`kubectl vgpu usage`).
    Usage(vgpu_dra_cli::UsageArgs),
    /// For each claim of a pod: where it went and its limits, or what stops each card (`kubectl vgpu why`).
    Why(vgpu_dra_cli::WhyArgs),
    /// HAMi or Volcano manifests (-f) converted as the webhook converts them, without a cluster;
    /// without -f, the cluster's workloads that still use those resources (`kubectl vgpu convert`).
    Convert(vgpu_dra_cli::ConvertArgs),
    /// Hardware check: create and destroy one MIG instance on a card already in MIG mode.
    #[command(hide = true)]
    MigCheck(MigCheckArgs),
}

/// Arguments of `vgpu-dra mig-check`.
#[derive(Debug, clap::Args)]
pub struct MigCheckArgs {
    /// The card's GPU UUID (`nvidia-smi -L`); it must already be in MIG mode.
    #[arg(long, env = "VGPU_DRA_MIG_CHECK_CARD")]
    pub card: String,
    /// The GPU-instance profile id to create (19 is the smallest, `1g`).
    #[arg(long, env = "VGPU_DRA_MIG_CHECK_PROFILE", default_value_t = 19)]
    pub profile: u32,
}

/// Arguments of `vgpu-dra prepare-preview`.
#[derive(Debug, clap::Args)]
pub struct PreparePreviewArgs {
    /// The allocated ResourceClaim, as `kubectl get resourceclaim -o yaml` prints it.
    #[arg(long, env = "VGPU_DRA_CLAIM")]
    pub claim: PathBuf,
    /// The node the claim is prepared on.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Device source.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Sharing configuration.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// HAMi-core's host directory.
    #[arg(long, env = "VGPU_DRA_HAMI_CORE_DIR", default_value = "/usr/local/vgpu")]
    pub hami_core_dir: PathBuf,
}

/// Output formats.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Where the GPUs come from: NVML unless a mock is given.
#[derive(Debug, Clone, clap::Args)]
pub struct SourceArgs {
    /// Mock GPUs instead of NVML: `[COUNTx]PRODUCT:MEMORY,...`, e.g. `1xTesla T4:15Gi`.
    #[arg(long, env = "VGPU_DRA_MOCK_GPUS", conflicts_with = "mock_inventory")]
    pub mock_gpus: Option<String>,
    /// Mock inventory file (JSON or YAML: driverVersion, cudaDriverVersion, gpus[]), re-read on
    /// every poll so cards and health can be changed by editing it.
    #[arg(long, env = "VGPU_DRA_MOCK_INVENTORY")]
    pub mock_inventory: Option<PathBuf>,
    /// With a mock: the file the MIG simulator keeps its instances in, so they outlive the
    /// process as a card's do (tests of crash recovery); without it they live in memory.
    #[arg(long, env = "VGPU_DRA_MOCK_MIG_STATE", hide = true)]
    pub mock_mig_state: Option<PathBuf>,
}

/// The sharing configuration flags; each wins over the config file.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    /// Config file (YAML): driverName, deviceSplitCount, deviceMemoryScaling,
    /// deviceCoreScaling, filterDevices, nodeConfig.
    #[arg(long, env = "VGPU_DRA_CONFIG")]
    pub config: Option<PathBuf>,
    /// DRA driver name [default: hami-core-gpu.project-hami.io].
    #[arg(long, env = "VGPU_DRA_DRIVER_NAME")]
    pub driver_name: Option<String>,
    /// Shares one card can hold at once (HAMi deviceSplitCount) [default: 10].
    #[arg(long, env = "VGPU_DRA_DEVICE_SPLIT_COUNT")]
    pub device_split_count: Option<u32>,
    /// Memory over-subscription factor (HAMi deviceMemoryScaling) [default: 1].
    #[arg(long, env = "VGPU_DRA_DEVICE_MEMORY_SCALING")]
    pub device_memory_scaling: Option<String>,
    /// Compute over-subscription factor (HAMi deviceCoreScaling) [default: 1].
    #[arg(long, env = "VGPU_DRA_DEVICE_CORE_SCALING")]
    pub device_core_scaling: Option<String>,
    /// Leave out the card with this UUID (repeatable).
    #[arg(long = "filter-uuid", env = "VGPU_DRA_FILTER_UUIDS", value_delimiter = ',')]
    pub filter_uuids: Vec<String>,
    /// Leave out the card with this NVML index (repeatable).
    #[arg(long = "filter-index", env = "VGPU_DRA_FILTER_INDICES", value_delimiter = ',')]
    pub filter_indices: Vec<u32>,
    /// Which cards in MIG mode offer dynamic MIG (a device per profile placement, the
    /// instance made at prepare): `listed` = models the config's knownMigGeometries or
    /// migProfileAllowlist name.
    #[arg(long, env = "VGPU_DRA_DYNAMIC_MIG", value_enum, default_value = "off")]
    pub dynamic_mig: DynamicMig,
    /// Let several claims share one dynamic MIG instance, each with HAMi-core limits inside it
    /// (placement devices then publish memory, cores and shares like a whole card).
    #[arg(long, env = "VGPU_DRA_MIG_INSTANCE_SHARING", default_value_t = false, action = clap::ArgAction::Set)]
    pub mig_instance_sharing: bool,
}

impl ConfigArgs {
    /// The configuration for `node`.
    ///
    /// # Errors
    /// [`UsageError`] naming the key.
    pub fn resolve(&self, node: &str) -> Result<SharingConfig, UsageError> {
        config::resolve(self.config.as_deref(), &self.flags(), node).map_err(|e| UsageError(e.to_string()))
    }

    /// [`ConfigArgs::resolve`], keeping the whole file (HAMi's request settings, MIG
    /// geometries, ignored keys) for the daemon; nothing is logged yet.
    ///
    /// # Errors
    /// [`UsageError`] naming the key.
    pub fn resolve_all(&self, node: &str) -> Result<config::Resolved, UsageError> {
        config::resolve_all(self.config.as_deref(), &self.flags(), node).map_err(|e| UsageError(e.to_string()))
    }

    /// What decides dynamic MIG, from `--dynamic-mig` and the file `resolved` read.
    pub fn mig(&self, resolved: &config::Resolved) -> MigSettings {
        MigSettings {
            mode: self.dynamic_mig,
            config: resolved.file.mig.clone(),
            shared_instances: self.mig_instance_sharing,
            ..Default::default()
        }
    }

    fn flags(&self) -> ConfigFlags {
        ConfigFlags {
            driver_name: self.driver_name.clone(),
            device_split_count: self.device_split_count,
            device_memory_scaling: self.device_memory_scaling.clone(),
            device_core_scaling: self.device_core_scaling.clone(),
            filter_uuids: self.filter_uuids.clone(),
            filter_indices: self.filter_indices.clone(),
        }
    }
}

impl SourceArgs {
    /// The device source these flags name.
    ///
    /// # Errors
    /// [`UsageError`] for a bad mock spec; discovery errors when NVML is unavailable.
    pub fn source(&self, node: &str) -> anyhow::Result<Arc<dyn DeviceSource>> {
        self.open(node, false)
    }

    /// [`SourceArgs::source`] for the daemon: NVML also watches XID events.
    ///
    /// # Errors
    /// As [`SourceArgs::source`].
    pub fn daemon_source(&self, node: &str) -> anyhow::Result<Arc<dyn DeviceSource>> {
        self.open(node, true)
    }

    fn open(&self, node: &str, watch_events: bool) -> anyhow::Result<Arc<dyn DeviceSource>> {
        if let Some(spec) = &self.mock_gpus {
            let cards = parse_spec(spec).map_err(|e| UsageError(e.to_string()))?;
            return Ok(Arc::new(MockSource::new(node, cards)));
        }
        if let Some(path) = &self.mock_inventory {
            return Ok(Arc::new(MockFileSource::new(path)));
        }
        let nvml = NvmlSource::new()?;
        Ok(Arc::new(if watch_events { nvml.watching_xids() } else { nvml }))
    }
}

/// Arguments of `vgpu-dra inventory`.
#[derive(Debug, clap::Args)]
pub struct InventoryArgs {
    /// The node the slices are for (also the pool name).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Device source.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Sharing configuration.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Output format.
    #[arg(short = 'o', long, env = "VGPU_DRA_OUTPUT", value_enum, default_value = "yaml")]
    pub output: OutputFormat,
}

/// Arguments of `vgpu-dra kubelet-plugin`.
#[derive(Debug, clap::Args)]
pub struct KubeletPluginArgs {
    /// This node's name (the downward API's `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Kubeconfig; in a pod the service account is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Device source.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Sharing configuration.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The kubelet's root directory (plugins_registry/ and plugins/ live there).
    #[arg(long, env = "VGPU_DRA_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Where CDI specs are written (the runtime reads it; tmpfs on most hosts).
    #[arg(long, env = "VGPU_DRA_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// HAMi-core's host directory: libvgpu.so, ld.so.preload and claims/.
    #[arg(long, env = "VGPU_DRA_HAMI_CORE_DIR", default_value = "/usr/local/vgpu")]
    pub hami_core_dir: PathBuf,
    /// HAMi-core's lock directory, shared by all containers of the node.
    #[arg(long, env = "VGPU_DRA_LOCK_DIR", default_value = "/tmp/vgpulock")]
    pub lock_dir: PathBuf,
    /// Where the cards' device nodes are looked up.
    #[arg(long, env = "VGPU_DRA_DEV_ROOT", default_value = "/dev")]
    pub dev_root: PathBuf,
    /// `LIBCUDA_LOG_LEVEL` for HAMi-core (0-4).
    #[arg(long, env = "VGPU_DRA_LIBCUDA_LOG_LEVEL", value_parser = clap::value_parser!(u8).range(0..=4))]
    pub libcuda_log_level: Option<u8>,
    /// `GPU_CORE_UTILIZATION_POLICY` for HAMi-core.
    #[arg(long, env = "VGPU_DRA_CORE_UTILIZATION_POLICY", value_parser = ["default", "force", "disable"])]
    pub core_utilization_policy: Option<String>,
    /// Abort at this point of prepare/unprepare (crash-recovery tests only).
    #[arg(long, hide = true, value_enum)]
    pub fail_point: Option<crate::plugin::failpoint::FailPoint>,
    /// How long a prepared claim must be gone from the API (deleted, or recreated with a new
    /// UID) before its share is released without an unprepare from the kubelet.
    #[arg(long, env = "VGPU_DRA_DELETED_CLAIM_GRACE_SECONDS", default_value_t = 300)]
    pub deleted_claim_grace_seconds: u64,
    /// How often prepared claims are checked against the API and their specs against the disk,
    /// in milliseconds.
    #[arg(long, env = "VGPU_DRA_STATE_CHECK_MS", default_value_t = 10_000)]
    pub state_check_ms: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "VGPU_DRA_METRICS_ADDRESS", default_value = "0.0.0.0:9394")]
    pub metrics_address: std::net::SocketAddr,
    /// How often the inventory is re-read, in milliseconds.
    #[arg(long, env = "VGPU_DRA_INVENTORY_POLL_MS", default_value_t = 5000)]
    pub inventory_poll_ms: u64,
    /// Log format.
    #[arg(long, env = "VGPU_DRA_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Watch the pods bound to this node and read their claims before the kubelet asks, so a
    /// prepare makes no API call. Needs `list` and `watch` of every pod (a role cannot narrow it
    /// to a node); off: each prepare reads its claim (quorum) and pod (`get` only).
    #[arg(long, env = "VGPU_DRA_POD_WATCH", default_value_t = false, action = clap::ArgAction::Set)]
    pub pod_watch: bool,
    /// How often the node monitor reads each prepared claim's HAMi-core region (usage metrics,
    /// task priority, idle-card bursting), in milliseconds; 0 turns the monitor off.
    #[arg(long, env = "VGPU_DRA_MONITOR_INTERVAL_MS", default_value_t = 5000)]
    pub monitor_interval_ms: u64,
    /// Let a claim use more than its SM limit while no other claim of the same or a higher
    /// priority is active on its card (HAMi's behaviour); false keeps every claim throttled to
    /// its limit at all times (strict isolation).
    #[arg(long, env = "VGPU_DRA_IDLE_BURSTING", default_value_t = true, action = clap::ArgAction::Set)]
    pub idle_bursting: bool,
    /// Also export the usage metrics under HAMi's legacy names and labels
    /// (`vGPU_device_memory_usage_in_bytes{podnamespace,podname,ctrname,vdeviceid,deviceuuid}`,
    /// ...), for HAMi's WebUI and dashboards.
    #[arg(long, env = "VGPU_DRA_LEGACY_METRICS", default_value_t = false, action = clap::ArgAction::Set)]
    pub legacy_metrics: bool,
    /// Write each prepared claim's `status.devices` (the card's UUID and the limits its
    /// containers get), in the background. Needs `patch` of `resourceclaims/status` and, from
    /// Kubernetes 1.36, `associated-node:patch` of `resourceclaims/driver` for the driver's name.
    #[arg(long, env = "VGPU_DRA_CLAIM_STATUS", default_value_t = true, action = clap::ArgAction::Set)]
    pub claim_status: bool,
}

/// Log line formats.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// A failure the user caused: printed as one line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A `v1` `List`, the shape `kubectl get -o yaml` prints for several objects.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<T> {
    api_version: &'static str,
    kind: &'static str,
    items: Vec<T>,
}

/// `vgpu-dra inventory`: the slices as a `v1` `List`, written to `out`.
///
/// # Errors
/// [`UsageError`] for bad arguments; other errors for failed output.
pub fn inventory(args: &InventoryArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let resolved = args.config.resolve_all(&args.node_name)?;
    resolved.log_ignored();
    let config = &resolved.sharing;
    let inventory = args.source.source(&args.node_name)?.inventory()?;
    let pool =
        PoolIdentity { driver: config.driver_name.clone(), node_name: args.node_name.clone(), node_uid: None, generation: 1 };
    let layout = PoolLayout::new(&inventory, config, &args.config.mig(&resolved));
    for refusal in &layout.refusals {
        eprintln!("vgpu-dra: warning: {refusal}; its instances are published as they are");
    }
    let slices = layout.slices(&pool);
    let items: Vec<serde_json::Value> = slices
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s)?;
            // k8s-openapi leaves the type fields to the client; a printed object needs them.
            if let Some(obj) = v.as_object_mut() {
                obj.insert("apiVersion".into(), "resource.k8s.io/v1".into());
                obj.insert("kind".into(), "ResourceSlice".into());
            }
            Ok(v)
        })
        .collect::<Result<_, serde_json::Error>>()?;
    let list = List { api_version: "v1", kind: "List", items };
    match args.output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &list)?;
            writeln!(out)?;
        }
        OutputFormat::Yaml => out.write_all(serde_saphyr::to_string(&list)?.as_bytes())?,
    }
    Ok(())
}

/// `vgpu-dra prepare-preview`: the spec as JSON, or the claim's error as a usage error (exit 2).
/// It runs the daemon's own prepare, against an empty ledger in a scratch directory: what it
/// prints or refuses is what a node with no other claims would do, and it touches no host path.
///
/// # Errors
/// [`UsageError`] for a claim this node would refuse; other errors for unreadable input.
pub fn prepare_preview(args: &PreparePreviewArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::plugin::api::ClaimSource;
    use crate::plugin::cdi::CdiOptions;
    use crate::plugin::claim::ClaimRef;
    use crate::plugin::state::{State, StateOptions, Storage};
    use crate::plugin::storage::checkpoint::Checkpoint;
    let config = args.config.resolve(&args.node_name)?;
    let text = std::fs::read_to_string(&args.claim).map_err(|e| UsageError(format!("--claim {}: {e}", args.claim.display())))?;
    let claim: k8s_openapi::api::resource::v1::ResourceClaim = serde_saphyr::from_str(&text)
        .map_err(|e| UsageError(format!("--claim {}: not a ResourceClaim: {e}", args.claim.display())))?;
    let meta = &claim.metadata;
    let want = ClaimRef::new(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default(),
    )
    .map_err(|e| UsageError(format!("--claim {}: {e}", args.claim.display())))?;
    let source = args.source.source(&args.node_name)?;
    // Fail here, not after the daemon's patience for a first inventory.
    source.inventory()?;
    let cdi = CdiOptions {
        synthesize_nodes: true,
        limits: vgpu_scheduling::LimitOptions { oversubscribed: !config.memory_scaling.is_one(), ..Default::default() },
        ..CdiOptions::for_driver(&config.driver_name, &args.hami_core_dir)?
    };
    let scratch = tempfile::tempdir()?;
    let specs = cdi_spec::SpecDir::new(scratch.path().join("cdi"), cdi.kind.clone());
    let claims = ClaimSource::Fixed { claims: Arc::new(vec![claim]), pods: Arc::default() };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let spec = runtime.block_on(async {
        let state = State::recover(
            claims,
            source,
            config,
            args.node_name.clone(),
            Storage { checkpoint: Checkpoint::new(scratch.path().join("checkpoint")), cdi, specs: specs.clone() },
            StateOptions { host_dirs: false, ..Default::default() },
        )
        .await?;
        state.prepare(&want).await.map_err(|e| UsageError(e.chain()))?;
        specs.read(want.uid.as_str())?.ok_or_else(|| anyhow::anyhow!("the prepared spec is missing"))
    })?;
    serde_json::to_writer_pretty(&mut *out, &spec)?;
    writeln!(out)?;
    Ok(())
}

/// `vgpu-dra mig-check`: one create/destroy round trip through NVML on a card already in MIG
/// mode ([`crate::mig::nvml::check::round_trip`]); never switches MIG mode.
///
/// # Errors
/// [`UsageError`] for a card not in MIG mode or not in the catalogue; other errors for failed
/// NVML calls and mismatches.
pub fn mig_check(args: &MigCheckArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::mig::MigControl;
    use crate::mig::nvml::{NvmlMig, caps_minor, check};
    let (ctl, card) = (NvmlMig::new()?, args.card.as_str());
    if !ctl.mig_mode(card)? {
        return Err(UsageError(format!("GPU {card} is not in MIG mode; mig-check never switches it")).into());
    }
    let info = ctl.card_info(card)?;
    let model = vgpu_scheduling::mig::model_for(&info.name, info.memory_bytes)
        .ok_or_else(|| UsageError(format!("GPU {card} ({}) is not in the MIG catalogue", info.name)))?;
    writeln!(out, "GPU {card}: {} (minor {}), catalogue model {}", info.name, info.minor, model.name())?;
    let placements = ctl.possible_placements(card, args.profile)?;
    let caps = |gi, ci| caps_minor(std::path::Path::new("/proc/driver/nvidia/capabilities"), info.minor, gi, ci);
    check::round_trip(&ctl, card, model, args.profile, &placements, &caps, out)?;
    writeln!(out, "mig-check: the round trip matches")?;
    Ok(())
}
