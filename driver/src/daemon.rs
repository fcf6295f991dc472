//! `vgpu-dra kubelet-plugin`: the node daemon. Parses nothing itself: it takes the parsed
//! arguments and goes config -> build -> spawn -> drain: [`App::build`] makes every part (and is
//! what a test can build), [`App::spawn`] runs them, and [`drain`] waits for SIGTERM or SIGINT and
//! stops them within a deadline.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use cdi_spec::SpecDir;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vgpu_scheduling::{LimitOptions, SharingConfig};

use crate::cli::{KubeletPluginArgs, LogFormat};
use crate::config::Resolved;
use crate::discovery::{DeviceLoop, DeviceLoopOptions, DeviceSource, SnapshotSource};
use crate::http::{Probes, Scrape};
use crate::metrics::{Fsyncs, Metrics, WatchRestarts};
use crate::mig::{DynamicMig, MigSettings, PoolLayout};
use crate::monitor::feedback::SwitchMode;
use crate::monitor::metrics::MonitorMetrics;
use crate::monitor::{Monitor, MonitorOptions};
use crate::plugin;
use crate::plugin::api::node_pods::{NodePods, ReadAheadMetrics};
use crate::plugin::api::status::{StatusMetrics, StatusWriter};
use crate::plugin::api::{ClaimCache, ClaimSource, DEFAULT_API_TIMEOUT};
use crate::plugin::cdi::CdiOptions;
use crate::plugin::kubelet::Paths;
use crate::plugin::kubelet::health::HealthService;
use crate::plugin::kubelet::service::CallMetrics;
use crate::plugin::mig::MigPrepare;
use crate::plugin::report::DeviceReport;
use crate::plugin::state::{State, StateOptions, Storage};
use crate::plugin::storage::checkpoint::Checkpoint;
use crate::publisher::{PublishMetrics, Publisher, PublisherOptions};
use crate::slices::PoolIdentity;

/// How long shutdown may take before the process gives up waiting.
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// How long start-up waits for the device loop's first inventory: a round lasts at most two read
/// deadlines (the card list, then the cards), so only a source that cannot list its cards at all
/// takes longer, and then the daemon cannot work.
const FIRST_INVENTORY: Duration = Duration::from_secs(30);
/// How long connecting to the API server may take. A connection either opens within moments or
/// the server is unreachable; waiting kube's default 30 s only delays the retry. Answers have no
/// client-wide deadline, because watches stay open for minutes: each publisher call has its own.
const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Sets up logging from `RUST_LOG` (default `info`), in `format`; a bad filter fails fast.
///
/// # Errors
/// When the filter does not parse.
pub fn init_tracing(format: LogFormat) -> anyhow::Result<()> {
    vgpu_dra_runtime::logging::init(format == LogFormat::Json).map_err(anyhow::Error::from)
}

/// Runs the daemon until a signal.
///
/// # Errors
/// Bad configuration ([`crate::cli::UsageError`]), no usable device source, or no API access.
pub fn run(args: &KubeletPluginArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format)?;
    let resolved = args.config.resolve_all(&args.node_name)?;
    resolved.log_ignored();
    // The only reader of the devices: everyone else reads its snapshots, without I/O.
    let poll = Duration::from_millis(args.inventory_poll_ms.max(100));
    let (source, mig_control) = mig_control(args, args.source.daemon_source(&args.node_name)?)?;
    let devices =
        DeviceLoop::start(source, DeviceLoopOptions { poll, ..Default::default() }).context("starting the device loop")?;
    // Blocking work is file I/O of prepares, which take one lock in turn: more threads than this
    // buy no speed, and each idle one keeps its stack and malloc cache resident for 10 s.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()?;
    // `devices` lives until the runtime has stopped: dropping it stops the loop.
    runtime.block_on(async {
        let client = kube_client(args).await?;
        let app = App::build(args, &resolved, (devices.source(), mig_control), client).await?;
        let cancel = CancellationToken::new();
        drain(app.spawn(&cancel), &cancel).await
    })
}

/// Every metrics family of the daemon, each owned by its component, in one registry.
pub struct Telemetry {
    /// The registry.
    pub metrics: Arc<Metrics>,
    /// The kubelet's calls.
    pub calls: CallMetrics,
    /// The pod watch's read ahead.
    pub read_ahead: ReadAheadMetrics,
    /// Slice writes.
    pub publish: PublishMetrics,
    /// The devices' figures, set at each scrape.
    pub report: Arc<DeviceReport>,
    /// The node monitor's usage figures.
    pub monitor: MonitorMetrics,
    /// The claims' status writes.
    pub status: StatusMetrics,
}

impl Telemetry {
    /// Registers every component's families for `node`, HAMi's legacy names included.
    pub fn new(node: String) -> Self {
        Self::with_legacy_names(node, true)
    }

    /// Registers every component's families for `node`; HAMi's legacy names only when
    /// `legacy_names`.
    pub fn with_legacy_names(node: String, legacy_names: bool) -> Self {
        let mut registry = Registry::default();
        let restarts = WatchRestarts::register(&mut registry);
        Fsyncs::register(&mut registry);
        let calls = CallMetrics::register(&mut registry);
        let read_ahead = ReadAheadMetrics::register(&mut registry, &restarts);
        let publish = PublishMetrics::register(&mut registry, &restarts);
        let report = Arc::new(DeviceReport::register(&mut registry, node));
        let monitor = MonitorMetrics::register(&mut registry, legacy_names);
        let status = StatusMetrics::register(&mut registry);
        Self { metrics: Arc::new(Metrics::new(registry)), calls, read_ahead, publish, report, monitor, status }
    }
}

/// The daemon's parts, built and not yet running.
pub struct App {
    paths: Paths,
    state: Arc<State>,
    node_pods: Option<NodePods>,
    client: kube::Client,
    publisher: Publisher,
    snapshots: SnapshotSource,
    config: SharingConfig,
    pool: String,
    telemetry: Telemetry,
    metrics_address: std::net::SocketAddr,
    state_check: Duration,
    monitor: Option<Monitor>,
    claim_status: Option<StatusWriter>,
}

impl App {
    /// Builds every part: host files, the first inventory, the claims' source, the recovered
    /// state and the publisher.
    ///
    /// # Errors
    /// When a part cannot be made: host files, no inventory in time, a failed recovery.
    pub async fn build(
        args: &KubeletPluginArgs,
        resolved: &Resolved,
        (snapshots, mig_control): (SnapshotSource, Option<Control>),
        client: kube::Client,
    ) -> anyhow::Result<Self> {
        let config = resolved.sharing.clone();
        let node = args.node_name.clone();
        tracing::info!(%node, driver = %config.driver_name, split = config.device_split_count, "vgpu-dra kubelet plugin starting");
        let paths = Paths::new(&args.kubelet_dir, config.driver_name.as_str());
        let telemetry = Telemetry::with_legacy_names(node.clone(), args.legacy_metrics);
        let cdi = cdi_options(args, &config)?;
        {
            let cdi = cdi.clone();
            tokio::task::spawn_blocking(move || plugin::storage::host::prepare(&cdi))
                .await?
                .context("preparing HAMi-core's host files")?;
        }
        let specs = SpecDir::new(&args.cdi_dir, cdi.kind.clone());
        let claims_root = cdi.claims_root.clone();
        snapshots.first(FIRST_INVENTORY).await.with_context(|| format!("no GPU inventory within {FIRST_INVENTORY:?}"))?;
        let mig = args.config.mig(resolved);
        check_api_server(&client, resolved, &snapshots, &node, &mig).await?;
        // This node's claims only: read ahead for the pods bound here, else one by one when the
        // kubelet names them; never a watch of the cluster's claims (see `plugin::api`).
        let driver = config.driver_name.to_string();
        let node_pods = args.pod_watch.then(|| NodePods::new(driver.clone(), node.clone(), Some(telemetry.read_ahead.clone())));
        let mut claims = ClaimSource::api(client.clone()).with_cache(ClaimCache::new(driver.clone(), node.clone()));
        if let Some(pods) = &node_pods {
            claims = claims.with_node_pods(pods.clone());
        }
        let options = StateOptions {
            deleted_claim_grace: Duration::from_secs(args.deleted_claim_grace_seconds),
            spare_files: SPARE_FILES,
            // Shares `mig.owned` with the publisher: the instances prepares make are not foreign.
            mig: mig_control.map(|control| MigPrepare { control, settings: mig.clone() }),
            ..Default::default()
        };
        let source: Arc<dyn DeviceSource> = Arc::new(snapshots.clone());
        let storage = Storage { checkpoint: Checkpoint::new(&paths.checkpoint), cdi, specs };
        let state = State::recover(claims, source, config.clone(), node.clone(), storage, options)
            .await
            .context("recovering prepared claims")?
            .with_fail_point(args.fail_point);
        let claim_status = args
            .claim_status
            .then(|| StatusWriter::new(client.clone(), driver.clone(), DEFAULT_API_TIMEOUT, telemetry.status.clone()));
        let state = Arc::new(state.with_claim_status(claim_status.clone()));
        let monitor = (args.monitor_interval_ms > 0).then(|| {
            let switch = if args.idle_bursting { SwitchMode::Feedback } else { SwitchMode::AlwaysOn };
            let options = MonitorOptions { interval: Duration::from_millis(args.monitor_interval_ms.max(100)), switch };
            Monitor::new(state.clone(), claims_root, options, telemetry.monitor.clone())
        });
        let publisher =
            Publisher::new(client.clone(), node.clone(), snapshots.clone(), config.clone(), PublisherOptions::default())
                .with_mig(mig)
                .with_metrics(telemetry.publish.clone());
        Ok(Self {
            paths,
            state,
            node_pods,
            client,
            publisher,
            snapshots,
            config,
            pool: node,
            telemetry,
            metrics_address: args.metrics_address,
            state_check: Duration::from_millis(args.state_check_ms.max(100)),
            monitor,
            claim_status,
        })
    }

    /// Starts every part; the handle ends when all have stopped. A part that cannot go on
    /// (the kubelet's sockets, the metrics endpoint) cancels the others.
    pub fn spawn(self, cancel: &CancellationToken) -> JoinHandle<()> {
        let Self {
            paths,
            state,
            node_pods,
            client,
            publisher,
            snapshots,
            config,
            pool,
            telemetry,
            metrics_address,
            state_check,
            monitor,
            claim_status,
        } = self;
        let monitor = monitor.map(|m| tokio::spawn(m.run(cancel.clone())));
        let claim_status = claim_status.map(|w| tokio::spawn(w.run(cancel.clone())));
        let driver = config.driver_name.to_string();
        let pod_watch = node_pods.map(|pods| tokio::spawn(pods.run(client, DEFAULT_API_TIMEOUT, cancel.clone())));
        let maintenance = tokio::spawn(state.clone().maintain(state_check, cancel.clone()));
        let trimming = tokio::spawn(crate::alloc::trim_after_bursts(state.changes(), cancel.clone()));
        let registered = Arc::new(AtomicBool::new(false));
        let (health_tx, health_rx) = tokio::sync::watch::channel(Vec::new());
        let health_feed = tokio::spawn(plugin::kubelet::health::follow_snapshots(snapshots, config, health_tx, cancel.clone()));
        let probes = Probes {
            registered: registered.clone(),
            published: publisher.ready_flag(),
            sockets: plugin::kubelet::probe::PluginSockets::from(&paths),
            call_timeout: plugin::kubelet::probe::CALL_TIMEOUT,
            checks: Arc::default(),
        };
        let scrape = Scrape::new(telemetry.metrics, telemetry.report, state.clone());
        let http =
            essential("metrics and probes endpoint", cancel, crate::http::serve(metrics_address, probes, scrape, cancel.clone()));
        let health = HealthService { pool, devices: health_rx };
        let calls = Some(telemetry.calls);
        let plugin_cancel = cancel.clone();
        let plugin = essential("kubelet plugin", cancel, async move {
            plugin::kubelet::serve(&paths, &driver, state, health, registered, calls, plugin_cancel).await
        });
        let publisher = tokio::spawn(publisher.run(cancel.clone()));
        tokio::spawn(async move {
            let optional = async move {
                if let Some(watch) = pod_watch {
                    let _ = watch.await;
                }
                if let Some(monitor) = monitor {
                    let _ = monitor.await;
                }
                if let Some(writer) = claim_status {
                    let _ = writer.await;
                }
            };
            let _ = tokio::join!(plugin, publisher, http, health_feed, maintenance, trimming, optional);
        })
    }
}

/// Checks once at start that the API server serves what the node's first slice needs (it stops
/// the driver only when the server says it lacks something), and warns when dynamic MIG is on
/// and the scheduler may be too old for its counters.
async fn check_api_server(
    client: &kube::Client,
    resolved: &Resolved,
    snapshots: &SnapshotSource,
    node: &str,
    mig: &MigSettings,
) -> anyhow::Result<()> {
    let config = &resolved.sharing;
    let first_slice = snapshots.inventory().ok().and_then(|inventory| {
        resolved.log_mig(&inventory);
        let pool = PoolIdentity { driver: config.driver_name.clone(), node_name: node.to_owned(), node_uid: None, generation: 1 };
        let slices = PoolLayout::new(&inventory, config, mig).slices(&pool);
        slices.into_iter().find(|s| s.spec.devices.is_some())
    });
    match crate::preflight::check(client, first_slice.as_ref()).await {
        Err(e) if e.is_definite() => return Err(e.into()),
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "could not check the API server at start; going on"),
        Ok(()) => {}
    }
    if mig.mode != DynamicMig::Off {
        crate::preflight::warn_if_counters_unsafe(client).await;
    }
    Ok(())
}

/// Runs `part`; when it fails, logs why and cancels every other part: the daemon is of no use
/// without it.
fn essential(
    what: &'static str,
    cancel: &CancellationToken,
    part: impl Future<Output = anyhow::Result<()>> + Send + 'static,
) -> JoinHandle<()> {
    let cancel = cancel.clone();
    tokio::spawn(async move {
        if let Err(e) = part.await {
            tracing::error!(error = %format!("{e:#}"), "{what} failed");
            cancel.cancel();
        }
    })
}

/// Waits for SIGTERM or SIGINT, then cancels the parts and gives them `DRAIN_GRACE` to stop; a
/// part set that stops by itself first is an error (one of them failed).
///
/// # Errors
/// When the parts stopped without a signal.
pub async fn drain(mut parts: JoinHandle<()>, cancel: &CancellationToken) -> anyhow::Result<()> {
    tokio::select! {
        signal = shutdown_signal() => {
            tracing::info!(signal, "shutting down");
            cancel.cancel();
        }
        res = &mut parts => {
            res.context("driver tasks")?;
            anyhow::bail!("the kubelet plugin stopped");
        }
    }
    tokio::select! {
        _ = &mut parts => {}
        () = tokio::time::sleep(DRAIN_GRACE) => tracing::warn!("shutdown took longer than {DRAIN_GRACE:?}; exiting"),
        _ = shutdown_signal() => tracing::warn!("second signal; exiting now"),
    }
    Ok(())
}

/// Claims whose temp files are made ahead (see `StateOptions::spare_files`): a sequence of
/// prepares takes one each while the next is made.
const SPARE_FILES: usize = 2;

/// Threads for blocking work (file writes and fsyncs); none of it waits for another task.
const BLOCKING_THREADS: usize = 8;

async fn kube_client(args: &KubeletPluginArgs) -> anyhow::Result<kube::Client> {
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .context("loading kubeconfig")?
        }
        None => kube::Config::incluster().context("no --kubeconfig and not running in a pod")?,
    };
    config.connect_timeout = Some(API_CONNECT_TIMEOUT);
    kube::Client::try_from(config).context("building the Kubernetes client")
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// What makes and destroys MIG instances.
type Control = Arc<dyn crate::mig::MigControl>;

/// The source the device loop reads, and what makes MIG instances for prepares: on a mock node
/// the cards in MIG mode are simulated (their instances kept in `--mock-mig-state` when given),
/// on a real one NVML makes them. None while dynamic MIG is off.
///
/// # Errors
/// When the simulator's state file cannot be read.
fn mig_control(args: &KubeletPluginArgs, raw: Arc<dyn DeviceSource>) -> anyhow::Result<(Arc<dyn DeviceSource>, Option<Control>)> {
    if args.config.dynamic_mig == DynamicMig::Off {
        return Ok((raw, None));
    }
    if args.source.mock_gpus.is_some() || args.source.mock_inventory.is_some() {
        let inventory = raw.inventory().context("reading the mock inventory")?;
        let sim = crate::mig::view::mock_sim(&inventory, args.source.mock_mig_state.as_deref())
            .context("reading the MIG simulator's state")?;
        let sim = Arc::new(sim);
        return Ok((Arc::new(crate::mig::MigView::new(raw, sim.clone())), Some(sim)));
    }
    // NVML a second time (discovery has its own handle): cheap, and each keeps its own lock.
    match crate::mig::NvmlMig::new() {
        Ok(nvml) => Ok((raw, Some(Arc::new(nvml)))),
        Err(e) => {
            tracing::error!(error = %vgpu_dra_runtime::error_chain(&e), "dynamic MIG is on but NVML cannot make instances; prepares of MIG devices fail until the driver restarts with it");
            Ok((raw, None))
        }
    }
}

/// The CDI settings from the arguments.
///
/// # Errors
/// When the driver name makes no valid CDI kind.
pub fn cdi_options(args: &KubeletPluginArgs, config: &SharingConfig) -> anyhow::Result<CdiOptions> {
    Ok(CdiOptions {
        lock_dir: args.lock_dir.clone(),
        dev_root: args.dev_root.clone(),
        synthesize_nodes: args.source.mock_gpus.is_some() || args.source.mock_inventory.is_some(),
        limits: LimitOptions {
            oversubscribed: !config.memory_scaling.is_one(),
            log_level: args.libcuda_log_level,
            core_policy: args.core_utilization_policy.clone(),
        },
        // The toolkit writes to /etc/cdi or /var/run/cdi; ours go to --cdi-dir.
        toolkit_dirs: vec!["/etc/cdi".into(), args.cdi_dir.clone()],
        ..CdiOptions::for_driver(&config.driver_name, &args.hami_core_dir)?
    })
}

#[cfg(test)]
#[path = "daemon_tests.rs"]
mod tests;
