//! `vgpu-dra-bench`: measures a DRA kubelet plugin on the test bed (real etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager) and prints the figures as a table and a JSON
//! file. The plugin is named by driver name, command line and socket path, so any DRA plugin
//! can be measured the same way; the defaults measure vgpu-dra on mock cards.
//!
//! Speed and memory goals are judged here, by figures, never by timed tests.

mod client;
mod cluster;
mod procfs;
mod report;
mod stats;
mod target;
mod webhook;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::{StreamExt, stream};
use vgpu_dra_integration::{ControlPlane, PlaneOptions};

use client::{ClaimId, Plugin};
use report::{LatencyRun, Machine, Report, Scale, Single};
use stats::Summary;
use target::{Running, Target};

/// Benchmarks of a DRA kubelet plugin on the test bed.
#[derive(Debug, Parser)]
#[command(name = "vgpu-dra-bench")]
struct Args {
    /// The DRA driver name the plugin publishes.
    #[arg(long, default_value = "hami-core-gpu.project-hami.io")]
    driver_name: String,
    /// The plugin's command line, run by bash once per node; placeholders {node}, {dir},
    /// {kubeconfig}, {driver}. Default: vgpu-dra (--vgpu-dra) with 8 mock H200 per node.
    #[arg(long)]
    driver_command: Option<String>,
    /// The vgpu-dra binary for the default command.
    #[arg(long, default_value = "target/release/vgpu-dra")]
    vgpu_dra: PathBuf,
    /// The plugin's DRA service socket; same placeholders.
    #[arg(long, default_value = "{dir}/kubelet/plugins/{driver}/dra.sock")]
    socket: String,
    /// Capacity each claim requests (NAME=QUANTITY,...); empty for drivers without capacity.
    #[arg(long, default_value = "memory=128Mi,cores=0")]
    claim_requests: String,
    /// Claims in the largest run.
    #[arg(long, default_value_t = 1000)]
    claims: usize,
    /// Claim counts to measure latency at.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    sizes: Vec<usize>,
    /// Calls in flight in the concurrent runs.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Steady-state window for counting API requests, in seconds.
    #[arg(long, default_value_t = 30)]
    steady_seconds: u64,
    /// Slice wipes to time.
    #[arg(long, default_value_t = 5)]
    wipes: usize,
    /// Simulated nodes in the scale run (0 skips it).
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Skip the single-node run.
    #[arg(long)]
    skip_single: bool,
    /// Pods in the webhook's admission-latency runs (0 skips them; vgpu-dra only).
    #[arg(long, default_value_t = 1000)]
    webhook_pods: usize,
    /// Where the JSON figures go.
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
}

impl Args {
    fn target(&self) -> anyhow::Result<Target> {
        let command = match &self.driver_command {
            Some(c) => c.clone(),
            None => {
                let bin = std::fs::canonicalize(&self.vgpu_dra)
                    .with_context(|| format!("{} (build it: cargo build --release -p vgpu-dra)", self.vgpu_dra.display()))?;
                format!(
                    "{} kubelet-plugin --node-name={{node}} --kubeconfig={{kubeconfig}} --kubelet-dir={{dir}}/kubelet \
--cdi-dir={{dir}}/cdi --hami-core-dir={{dir}}/vgpu --lock-dir={{dir}}/vgpulock --metrics-address=127.0.0.1:0 \
--driver-name={{driver}} --mock-gpus='8xNVIDIA H200:141Gi' --device-split-count=128",
                    bin.display()
                )
            }
        };
        Ok(Target { driver: self.driver_name.clone(), command, socket: self.socket.clone() })
    }
}

fn main() -> anyhow::Result<()> {
    // See the driver's main: name the TLS provider instead of relying on feature unification.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let target = args.target()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut report = Report {
        machine: Machine::here(),
        driver: target.driver.clone(),
        command: target.command.clone(),
        single: None,
        scale: None,
        webhook: None,
        goals: Default::default(),
    };
    if !args.skip_single {
        eprintln!("bench: single node");
        report.single = Some(runtime.block_on(single(&args, &target))?);
    }
    if args.nodes > 0 {
        eprintln!("bench: {} nodes", args.nodes);
        report.scale = Some(runtime.block_on(scale(&args, &target))?);
    }
    if args.webhook_pods > 0 {
        eprintln!("bench: webhook admission, {} pods", args.webhook_pods);
        let bin = std::fs::canonicalize(&args.vgpu_dra)
            .with_context(|| format!("{} (build it: cargo build --release -p vgpu-dra)", args.vgpu_dra.display()))?;
        report.webhook = Some(runtime.block_on(webhook::run(&bin, &target, args.webhook_pods, args.concurrency))?);
    }
    report.judge();
    print!("{}", report.table());
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    eprintln!("bench: figures written to {}", args.out.display());
    Ok(())
}

fn audited_plane() -> anyhow::Result<ControlPlane> {
    ControlPlane::start_with(&PlaneOptions { audit: true })
}

fn pid_of(running: &Running) -> anyhow::Result<u32> {
    running.process.pid().context("plugin not running")
}

async fn single(args: &Args, target: &Target) -> anyhow::Result<Single> {
    let plane = audited_plane()?;
    let node = "bench-node-0";
    plane.create_node(node)?;
    cluster::allow_pods(&plane, node, args.claims + 10)?;
    let identity = cluster::prepare(&plane, &target.driver)?;
    let client = cluster::client(&plane).await?;
    let audit_log = plane.audit_log().context("no audit log")?;

    let mut running = target.start(&plane, &identity.kubeconfig, node)?;
    let first = cluster::time_until(Duration::from_secs(60), || async {
        Ok(cluster::slice_count(&client, &target.driver, node).await? > 0)
    })
    .await
    .with_context(|| format!("first slice\n{}", running.process.tail(20)))?;
    let plugin = Plugin::connect(&running.socket, Duration::from_secs(30)).await?;
    let pid = pid_of(&running)?;

    // Idle: settled after start, then the steady window for CPU and API requests.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = procfs::sample(pid)?;
    let window = cluster::AuditWindow::start(&audit_log)?;
    let steady = Duration::from_secs(args.steady_seconds);
    tokio::time::sleep(steady).await;
    let after_idle = procfs::sample(pid)?;
    let steady_requests = window.requests_of(&identity.user)?;

    cluster::create_claims(&plane, "c", args.claims, &args.claim_requests, Some(node))?;
    let (claims, allocate) = cluster::wait_allocated(&client, "c", args.claims, Duration::from_secs(300)).await?;

    let mut latency = Vec::new();
    for &n in args.sizes.iter().filter(|n| **n <= claims.len()) {
        let set = &claims[..n];
        let (prepare, unprepare) = (run(&plugin, set, 1, true).await?, run(&plugin, set, 1, false).await?);
        latency.push(LatencyRun { claims: n, mode: "sequential".into(), prepare, unprepare });
        let (prepare, unprepare) =
            (run(&plugin, set, args.concurrency, true).await?, run(&plugin, set, args.concurrency, false).await?);
        latency.push(LatencyRun { claims: n, mode: format!("concurrent({})", args.concurrency), prepare, unprepare });
    }

    // Every claim prepared: memory, then the slices wiped the way a kubelet does.
    run(&plugin, &claims, args.concurrency, true).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with_prepared = procfs::sample(pid)?;
    let count = cluster::slice_count(&client, &target.driver, node).await?;
    let mut wipe_recovery_ms = Vec::new();
    for _ in 0..args.wipes {
        cluster::wipe(&client, &target.driver, node).await?;
        let took = cluster::time_until(Duration::from_secs(30), || async {
            Ok(cluster::slice_count(&client, &target.driver, node).await? >= count)
        })
        .await?;
        wipe_recovery_ms.push(took.as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run(&plugin, &claims, args.concurrency, false).await?;
    running.process.check_running()?;
    Ok(Single {
        start_to_first_slice_ms: first.as_secs_f64() * 1e3,
        idle,
        idle_cpu_share: procfs::cpu_share(idle, after_idle, steady),
        steady_requests_per_minute: steady_requests.total as f64 * 60.0 / steady.as_secs_f64(),
        steady_requests,
        steady_seconds: steady.as_secs_f64(),
        allocate_seconds: allocate.as_secs_f64(),
        latency,
        with_prepared,
        prepared_claims: claims.len(),
        wipe_recovery_ms,
    })
}

/// Prepares (or unprepares) every claim of `set`, one per call, `concurrency` calls at a time.
async fn run(plugin: &Plugin, set: &[ClaimId], concurrency: usize, prepare: bool) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let latencies: Vec<anyhow::Result<Duration>> = stream::iter(set.iter().cloned())
        .map(|c| {
            let plugin = plugin.clone();
            async move {
                let one = [c];
                if prepare { plugin.prepare(&one).await } else { plugin.unprepare(&one).await }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let wall = started.elapsed();
    Ok(Summary::of(latencies.into_iter().collect::<anyhow::Result<_>>()?, wall))
}

async fn scale(args: &Args, target: &Target) -> anyhow::Result<Scale> {
    let started = Instant::now();
    let plane = audited_plane()?;
    let nodes: Vec<String> = (0..args.nodes).map(|i| format!("sim-node-{i:03}")).collect();
    // Node objects in a few threads: each is four API calls through kubectl.
    std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .chunks(nodes.len().div_ceil(4).max(1))
            .map(|chunk| s.spawn(|| chunk.iter().try_for_each(|n| plane.create_node(n).map(|_| ()))))
            .collect();
        handles.into_iter().try_for_each(|h| h.join().map_err(|_| anyhow::anyhow!("node creation panicked"))?)
    })?;
    let identity = cluster::prepare(&plane, &target.driver)?;
    let client = cluster::client(&plane).await?;
    let window = cluster::AuditWindow::start(&plane.audit_log().context("no audit log")?)?;

    let first_start = Instant::now();
    let mut plugins: Vec<Running> =
        nodes.iter().map(|n| target.start(&plane, &identity.kubeconfig, n)).collect::<anyhow::Result<_>>()?;
    let want = nodes.len();
    let all_slices = cluster::time_until(Duration::from_secs(300), || async {
        Ok(cluster::slices_of_driver(&client, &target.driver).await?.1 >= want)
    })
    .await?;
    let _ = first_start;
    let (slices, nodes_with_slices) = cluster::slices_of_driver(&client, &target.driver).await?;

    cluster::create_claims(&plane, "s", args.claims, &args.claim_requests, None)?;
    let (claims, allocate) = cluster::wait_allocated(&client, "s", args.claims, Duration::from_secs(420)).await?;

    let mut by_node = std::collections::HashMap::new();
    for p in &plugins {
        by_node.insert(p.node.clone(), Plugin::connect(&p.socket, Duration::from_secs(60)).await?);
    }
    let prep_started = Instant::now();
    let latencies: Vec<anyhow::Result<Duration>> = stream::iter(claims.iter().cloned())
        .map(|c| {
            let plugin = by_node.get(&c.node).cloned();
            async move { plugin.with_context(|| format!("no plugin for node {}", c.node))?.prepare(&[c]).await }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let prepare = Summary::of(latencies.into_iter().collect::<anyhow::Result<_>>()?, prep_started.elapsed());
    let requests_until_prepared = window.requests_of(&identity.user)?;

    let mut total_rss_mib = 0.0;
    for p in &mut plugins {
        p.process.check_running()?;
        total_rss_mib += procfs::sample(pid_of(p)?)?.rss_mib;
    }
    let steady_window = cluster::AuditWindow::start(&plane.audit_log().context("no audit log")?)?;
    let steady = Duration::from_secs(args.steady_seconds);
    tokio::time::sleep(steady).await;
    let steady_requests = steady_window.requests_of(&identity.user)?;
    Ok(Scale {
        nodes: nodes.len(),
        slices,
        nodes_with_slices,
        all_slices_seconds: all_slices.as_secs_f64(),
        claims: claims.len(),
        allocate_seconds: allocate.as_secs_f64(),
        prepare,
        total_rss_mib,
        requests_until_prepared,
        steady_requests_per_minute: steady_requests.total as f64 * 60.0 / steady.as_secs_f64(),
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}
