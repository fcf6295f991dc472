//! `vgpu-dra kubelet-plugin`: the node daemon. Parses nothing itself: it takes the parsed
//! arguments, builds the parts, runs them until SIGTERM or SIGINT, and drains with a deadline.

use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::cli::{KubeletPluginArgs, LogFormat};
use crate::publisher::{Publisher, PublisherOptions};

/// How long shutdown may take before the process gives up waiting.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Sets up logging from `RUST_LOG` (default `info`); a bad filter fails fast.
///
/// # Errors
/// When the filter does not parse.
pub fn init_tracing(format: LogFormat) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) => tracing_subscriber::EnvFilter::try_new(&spec).with_context(|| format!("RUST_LOG={spec:?}"))?,
        Err(_) => tracing_subscriber::EnvFilter::new("info"),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
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
    let config = args.config.resolve(&args.node_name)?;
    let source = args.source.source(&args.node_name)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let client = kube_client(args).await?;
        let cancel = CancellationToken::new();
        tracing::info!(node = %args.node_name, driver = %config.driver_name, split = config.device_split_count, "vgpu-dra kubelet plugin starting");
        let options = PublisherOptions { inventory_poll: Duration::from_millis(args.inventory_poll_ms.max(100)), ..Default::default() };
        let publisher = Publisher::new(client, args.node_name.clone(), source, config, options);
        let mut task = tokio::spawn(publisher.run(cancel.clone()));
        tokio::select! {
            signal = shutdown_signal() => {
                tracing::info!(signal, "shutting down");
                cancel.cancel();
            }
            res = &mut task => {
                res.context("publisher task")?;
                return Ok(());
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

async fn kube_client(args: &KubeletPluginArgs) -> anyhow::Result<kube::Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .context("loading kubeconfig")?
        }
        None => kube::Config::incluster().context("no --kubeconfig and not running in a pod")?,
    };
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
