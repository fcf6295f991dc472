//! `vgpu-dra-bench`: measures a DRA kubelet plugin on the test bed (real etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager) and prints the figures as a table and a JSON
//! file. The plugin is named by driver name, command line and socket path, so any DRA plugin
//! can be measured the same way; the defaults measure vgpu-dra on mock cards.
//!
//! Speed and memory goals are judged here, by figures, never by timed tests.

mod apiserver;
mod client;
mod cluster;
mod counters;
mod monitor;
mod procfs;
mod report;
mod single;
mod stats;
mod target;
mod webhook;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, stream};
use vgpu_dra_integration::{ControlPlane, PlaneOptions};

use client::Plugin;
use report::{Machine, Report, Scale};
use stats::Summary;
use target::{Running, Target};

/// Benchmarks of a DRA kubelet plugin on the test bed.
#[derive(Debug, Parser)]
#[command(name = "vgpu-dra-bench", after_long_help = ANOTHER_DRIVER)]
struct Args {
    /// The DRA driver name the plugin publishes.
    #[arg(long, default_value = "hami-core-gpu.project-hami.io")]
    driver_name: String,
    /// The plugin's command line, run by bash once per node; placeholders {node}, {dir},
    /// {kubeconfig}, {driver}. Default: vgpu-dra (--vgpu-dra) with 8 mock H200 per node, in the
    /// environment its image gives it (one malloc arena, no tcache).
    #[arg(long)]
    driver_command: Option<String>,
    /// The vgpu-dra binary for the default command.
    #[arg(long, default_value = "target/release/vgpu-dra")]
    vgpu_dra: PathBuf,
    /// Flags added to the default command, e.g. `--pod-watch=true --claim-status=false`: one
    /// build measured under other settings.
    #[arg(long, default_value = "")]
    driver_args: String,
    /// A command the default command runs under (a profiler such as `heaptrack -o FILE`).
    #[arg(long, default_value = "")]
    driver_wrapper: String,
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
    /// Calls in flight in the concurrent runs of the scale run, the webhook and the memory
    /// sample.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Calls in flight in the single node's latency runs, each size run once per value (and
    /// once sequentially).
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    in_flight: Vec<usize>,
    /// Give each latency run claims made for it just before it, and deleted after it, instead
    /// of the first claims of one set that every run prepares and unprepares again. A plugin
    /// that reads a pod's claims when the pod is bound here (vgpu-dra's pod watch) then takes
    /// them from memory in every run, as it does for a kubelet, which prepares a claim once per
    /// pod; with one set, the runs after the first read the API for claims whose unprepare
    /// dropped what was read ahead. Costs the scheduler's time for each run's claims (about a
    /// minute per 1,000).
    #[arg(long)]
    fresh_claims: bool,
    /// Steady-state window for counting API requests, in seconds.
    #[arg(long, default_value_t = 30)]
    steady_seconds: u64,
    /// Slice wipes to time.
    #[arg(long, default_value_t = 5)]
    wipes: usize,
    /// How long to wait for a plugin's slices, in seconds: after each wipe (a wipe not
    /// recovered in time is reported, naming driver and node, and the run goes on without
    /// further wipes), and for the first slice after start (the run stops there). Drivers
    /// built on the upstream ResourceSlice controller restore wiped slices in about 50 s.
    #[arg(long, default_value_t = 120)]
    wipe_timeout_seconds: u64,
    /// Simulated nodes in the scale run (0 skips it).
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Where the nodes' directories ({dir}: checkpoint, CDI specs, sockets) are made, to measure
    /// on a file system like the nodes' (default: in TMPDIR, beside the control plane's files).
    /// The report names the file system, and for ext4 whether it has a journal.
    #[arg(long)]
    node_dirs: Option<PathBuf>,
    /// Skip the single-node run.
    #[arg(long)]
    skip_single: bool,
    /// Also save the driver's `/proc/<pid>/smaps` at the idle and the 1,000-prepared samples, as
    /// `<this>.idle.smaps` and `<this>.prepared.smaps`, to see what each mapping holds.
    #[arg(long)]
    smaps: Option<PathBuf>,
    /// Pods in the webhook's admission-latency runs (0 skips them; vgpu-dra only).
    #[arg(long, default_value_t = 1000)]
    webhook_pods: usize,
    /// Prepared claims in the node monitor's run (0 skips it; vgpu-dra only).
    #[arg(long, default_value_t = 1000)]
    monitor_claims: usize,
    /// Ticks the monitor's run times.
    #[arg(long, default_value_t = 20)]
    monitor_ticks: usize,
    /// Where the JSON figures go.
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
}

/// The end of `--help`: how to measure a plugin other than vgpu-dra.
const ANOTHER_DRIVER: &str = "\
Measuring another driver:
  Any DRA kubelet plugin that can run outside a cluster (a kubeconfig, a node name, and its
  kubelet directories as flags) can be measured. Give its driver name, its command line (bash,
  started once per node; {node} the node name, {dir} a fresh directory standing in for the
  node's host paths, {kubeconfig} a kubeconfig for a service account bound to cluster-admin,
  {driver} the driver name), the socket it serves DRA on, and the capacity each claim asks for
  ('' for drivers without consumable capacity). Every claim of the single-node run must fit on
  one node: a driver with exclusive devices needs at least --claims devices there, or fewer
  --claims and --sizes. The webhook runs are vgpu-dra's: pass --webhook-pods 0.

  Example, the kubernetes-sigs example driver's kubelet plugin, 16 shared fake GPUs:
    vgpu-dra-bench --nodes 0 --webhook-pods 0 --driver-name gpu.example.com \\
      --claim-requests memory=1Gi,compute=1 --wipe-timeout-seconds 120 \\
      --driver-command 'dra-example-kubeletplugin --node-name={node} --kubeconfig={kubeconfig} \\
        --cdi-root={dir}/cdi --kubelet-registrar-directory-path={dir}/kubelet/plugins_registry \\
        --kubelet-plugins-directory-path={dir}/kubelet/plugins --driver-name={driver} \\
        --num-devices=16 --gpu-allow-multiple-allocations --kube-api-qps=1000 --kube-api-burst=1000'

  The default --socket, {dir}/kubelet/plugins/{driver}/dra.sock, is where plugins built on the
  upstream kubeletplugin helper listen when given those directories. See BENCHMARKS.md.";

impl Args {
    /// How long to wait for slices: first publish and recovery after a wipe.
    fn slice_timeout(&self) -> Duration {
        Duration::from_secs(self.wipe_timeout_seconds)
    }

    fn target(&self) -> anyhow::Result<Target> {
        let command = match &self.driver_command {
            Some(c) => c.clone(),
            None => {
                let bin = std::fs::canonicalize(&self.vgpu_dra)
                    .with_context(|| format!("{} (build it: cargo build --release -p vgpu-dra)", self.vgpu_dra.display()))?;
                // The environment the image and the chart give it (one malloc arena, no per-thread caches).
                format!(
                    "env MALLOC_ARENA_MAX=1 GLIBC_TUNABLES=glibc.malloc.tcache_count=0 {} {} kubelet-plugin --node-name={{node}} --kubeconfig={{kubeconfig}} --kubelet-dir={{dir}}/kubelet \
--cdi-dir={{dir}}/cdi --hami-core-dir={{dir}}/vgpu --lock-dir={{dir}}/vgpulock --metrics-address=127.0.0.1:0 \
--driver-name={{driver}} --mock-gpus='8xNVIDIA H200:141Gi' --device-split-count=512 {}",
                    self.driver_wrapper,
                    bin.display(),
                    self.driver_args
                )
            }
        };
        Ok(Target { driver: self.driver_name.clone(), command, socket: self.socket.clone(), node_root: None })
    }
}

fn main() -> anyhow::Result<()> {
    // See the driver's main: name the TLS provider instead of relying on feature unification.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let mut target = args.target()?;
    // Removed at the end of the run, with every node's files in it.
    let node_root = match &args.node_dirs {
        Some(dir) => Some(
            tempfile::Builder::new().prefix("vb-").tempdir_in(dir).with_context(|| format!("--node-dirs {}", dir.display()))?,
        ),
        None => None,
    };
    target.node_root = node_root.as_ref().map(|d| d.path().to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut report = Report {
        machine: Machine::here(node_root.as_ref().map_or_else(std::env::temp_dir, |d| d.path().to_owned())),
        driver: target.driver.clone(),
        command: target.command.clone(),
        single: None,
        scale: None,
        webhook: None,
        monitor: None,
        goals: Default::default(),
    };
    if !args.skip_single {
        eprintln!("bench: single node");
        report.single = Some(runtime.block_on(single::single(&args, &target))?);
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
    if args.monitor_claims > 0 && args.driver_command.is_none() {
        eprintln!("bench: node monitor, {} claims", args.monitor_claims);
        let dir = target.node_root.clone().unwrap_or_else(std::env::temp_dir);
        report.monitor = Some(monitor::run(args.monitor_claims, args.monitor_ticks, &dir)?);
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
    ControlPlane::start_with(&PlaneOptions { audit: true, ..Default::default() })
}

fn pid_of(running: &Running) -> anyhow::Result<u32> {
    running.process.pid().context("plugin not running")
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
    let server_pid = plane.apiserver_pid().context("kube-apiserver not running")?;
    let server_before = apiserver::usage(server_pid)?;

    let first_start = Instant::now();
    let mut plugins: Vec<Running> =
        nodes.iter().map(|n| target.start(&plane, &identity.kubeconfig, n)).collect::<anyhow::Result<_>>()?;
    let want = nodes.len();
    // Hundreds of plugins start at once on a few CPUs: at least 300 s, more if asked for.
    let wait = args.slice_timeout().max(Duration::from_secs(300));
    let published =
        cluster::time_until(wait, || async { Ok(cluster::slices_of_driver(&client, &target.driver).await?.1 >= want) }).await;
    let Ok(all_slices) = published else {
        bail!("{}", unpublished(&client, target, &nodes, &mut plugins, wait).await);
    };
    let _ = first_start;
    let (slices, nodes_with_slices) = cluster::slices_of_driver(&client, &target.driver).await?;

    // Watch traffic from here on is what claims cost: slices are published and stay put.
    let watch_before = apiserver::WatchTraffic::scrape(&client).await?;
    let claims_window = cluster::AuditWindow::start(&plane.audit_log().context("no audit log")?)?;
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
    let requests_for_claims = claims_window.requests_of(&identity.user)?;
    let watch_after = apiserver::WatchTraffic::scrape(&client).await?;
    let server_after = apiserver::usage(server_pid)?;

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
        requests_for_claims,
        claim_watch_events: watch_after.events_since(&watch_before, "resourceclaims"),
        slice_watch_events: watch_after.events_since(&watch_before, "resourceslices"),
        pod_watch_events: watch_after.events_since(&watch_before, "pods"),
        watches: watch_after.watches,
        apiserver_cpu_seconds: server_after.cpu_seconds - server_before.cpu_seconds,
        apiserver_peak_rss_mib: server_after.peak_rss_mib,
        steady_requests_per_minute: steady_requests.total as f64 * 60.0 / steady.as_secs_f64(),
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Which nodes have no slice of the driver after `waited`, and which of their plugins exited.
async fn unpublished(
    client: &kube::Client,
    target: &Target,
    nodes: &[String],
    plugins: &mut [Running],
    waited: Duration,
) -> String {
    let with = cluster::nodes_with_slices(client, &target.driver).await.unwrap_or_default();
    let missing: Vec<&str> = nodes.iter().map(String::as_str).filter(|n| !with.contains(*n)).collect();
    let exited: Vec<String> = plugins
        .iter_mut()
        .filter(|p| missing.contains(&p.node.as_str()))
        .filter_map(|p| p.process.check_running().err().map(|e| format!("\n{}: {e:#}", p.node)))
        .take(3)
        .collect();
    format!(
        "driver {}: {} of {} nodes have no ResourceSlice {} s after start (--wipe-timeout-seconds): {}{}{}",
        target.driver,
        missing.len(),
        nodes.len(),
        waited.as_secs(),
        missing.iter().take(10).copied().collect::<Vec<_>>().join(", "),
        if missing.len() > 10 { ", ..." } else { "" },
        exited.concat()
    )
}
