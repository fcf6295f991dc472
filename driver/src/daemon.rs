//! `vgpu-dra kubelet-plugin`: the node daemon. Parses nothing itself: it takes the parsed
//! arguments, builds the parts, runs them until SIGTERM or SIGINT, and drains with a deadline.

use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use cdi_spec::SpecDir;
use vgpu_scheduling::{LimitOptions, SharingConfig};

use crate::cli::{KubeletPluginArgs, LogFormat};
use crate::discovery::{DeviceLoop, DeviceLoopOptions, DeviceSource};
use crate::http::Probes;
use crate::metrics::Metrics;
use crate::plugin::cdi::CdiOptions;
use crate::plugin::checkpoint::Checkpoint;
use crate::plugin::health::HealthService;
use crate::plugin::node_pods::NodePods;
use crate::plugin::source::{ClaimCache, ClaimSource, DEFAULT_API_TIMEOUT};
use crate::plugin::state::{State, StateOptions, Storage};
use crate::plugin::{self, Paths};
use crate::publisher::{Publisher, PublisherOptions};

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

/// Sets up logging from `RUST_LOG` (default `info`); a bad filter fails fast. Colours only when
/// stderr is a terminal: log collectors store the escape codes verbatim.
///
/// # Errors
/// When the filter does not parse.
pub fn init_tracing(format: LogFormat) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) => tracing_subscriber::EnvFilter::try_new(&spec).with_context(|| format!("RUST_LOG={spec:?}"))?,
        Err(_) => tracing_subscriber::EnvFilter::new("info"),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// Runs the daemon until a signal.
///
/// # Errors
/// Bad configuration ([`crate::cli::UsageError`]), no usable device source, or no API access.
pub fn run(args: &KubeletPluginArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format)?;
    let resolved = args.config.resolve_all(&args.node_name)?;
    resolved.log_ignored();
    let config = resolved.sharing.clone();
    // The only reader of the devices: everyone else reads its snapshots, without I/O.
    let poll = Duration::from_millis(args.inventory_poll_ms.max(100));
    let devices =
        DeviceLoop::start(args.source.daemon_source(&args.node_name)?, DeviceLoopOptions { poll, ..Default::default() })
            .context("starting the device loop")?;
    let snapshots = devices.source();
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
        let cancel = CancellationToken::new();
        tracing::info!(node = %args.node_name, driver = %config.driver_name, split = config.device_split_count, "vgpu-dra kubelet plugin starting");
        let paths = Paths::new(&args.kubelet_dir, config.driver_name.as_str());
        let metrics = Arc::new(Metrics::new(args.node_name.clone()));
        let cdi = cdi_options(args, &config)?;
        {
            let cdi = cdi.clone();
            tokio::task::spawn_blocking(move || plugin::host::prepare(&cdi)).await?.context("preparing HAMi-core's host files")?;
        }
        let specs = SpecDir::new(&args.cdi_dir, cdi.kind.clone());
        snapshots.first(FIRST_INVENTORY).await.with_context(|| format!("no GPU inventory within {FIRST_INVENTORY:?}"))?;
        if let Ok(inventory) = snapshots.inventory() {
            resolved.log_mig(&inventory);
        }
        let source: Arc<dyn DeviceSource> = Arc::new(snapshots.clone());
        // This node's claims only: read ahead for the pods bound here, else one by one when the
        // kubelet names them; never a watch of the cluster's claims (see `plugin::source`).
        let cache = ClaimCache::new(config.driver_name.to_string(), args.node_name.clone());
        let claims = ClaimSource::api(client.clone()).with_cache(cache);
        let node_pods = args
            .pod_watch
            .then(|| NodePods::new(config.driver_name.to_string(), args.node_name.clone(), Some(metrics.clone())));
        let claims = match &node_pods {
            Some(pods) => claims.with_node_pods(pods.clone()),
            None => claims,
        };
        let pod_watch = node_pods.map(|pods| tokio::spawn(pods.run(client.clone(), DEFAULT_API_TIMEOUT, cancel.clone())));
        let options = StateOptions {
            deleted_claim_grace: Duration::from_secs(args.deleted_claim_grace_seconds),
            spare_files: SPARE_FILES,
            ..Default::default()
        };
        let state = State::recover(
            claims,
            source,
            config.clone(),
            args.node_name.clone(),
            Storage { checkpoint: Checkpoint::new(&paths.checkpoint), cdi, specs },
            options,
        )
        .await
        .context("recovering prepared claims")?
        .with_fail_point(args.fail_point);
        let state = Arc::new(state);
        let maintenance = tokio::spawn(state.clone().maintain(Duration::from_millis(args.state_check_ms.max(100)), cancel.clone()));
        let registered = Arc::new(AtomicBool::new(false));
        let driver = config.driver_name.to_string();
        let (health_tx, health_rx) = tokio::sync::watch::channel(Vec::new());
        let health_feed = tokio::spawn(plugin::health::follow_snapshots(snapshots.clone(), config.clone(), health_tx, cancel.clone()));
        let publisher = Publisher::new(client, args.node_name.clone(), snapshots, config, PublisherOptions::default())
            .with_metrics(metrics.clone());
        let health = HealthService { pool: args.node_name.clone(), devices: health_rx };
        let probes = Probes {
            registered: registered.clone(),
            published: publisher.ready_flag(),
            sockets: vec![paths.dra_socket.clone(), paths.registration_socket.clone()],
        };
        let http_cancel = cancel.clone();
        let http = tokio::spawn(crate::http::serve(args.metrics_address, probes, metrics.clone(), state.clone(), cancel.clone()));
        let http = tokio::spawn(async move {
            if let Ok(Err(e)) = http.await {
                tracing::error!(error = %format!("{e:#}"), "metrics and probes endpoint failed");
                http_cancel.cancel();
            }
        });
        let plugin_cancel = cancel.clone();
        let plugin_metrics = metrics.clone();
        let plugin = tokio::spawn(async move {
            if let Err(e) = plugin::serve(&paths, &driver, state, health, registered, Some(plugin_metrics), plugin_cancel.clone()).await {
                // A plugin that cannot serve the kubelet is useless: stop everything.
                tracing::error!(error = %format!("{e:#}"), "kubelet plugin failed");
                plugin_cancel.cancel();
            }
        });
        let publisher_task = tokio::spawn(publisher.run(cancel.clone()));
        let mut task = tokio::spawn(async move {
            let pod_watch = async move {
                if let Some(watch) = pod_watch {
                    let _ = watch.await;
                }
            };
            let _ = tokio::join!(plugin, publisher_task, http, health_feed, maintenance, pod_watch);
        });
        tokio::select! {
            signal = shutdown_signal() => {
                tracing::info!(signal, "shutting down");
                cancel.cancel();
            }
            res = &mut task => {
                res.context("driver tasks")?;
                anyhow::bail!("the kubelet plugin stopped");
            }
        }
        tokio::select! {
            _ = &mut task => {}
            () = tokio::time::sleep(DRAIN_GRACE) => tracing::warn!("shutdown took longer than {DRAIN_GRACE:?}; exiting"),
            _ = shutdown_signal() => tracing::warn!("second signal; exiting now"),
        }
        Ok(())
    })
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
