//! The single-node run: one plugin process, its start and idle figures, the prepare and
//! unprepare latency runs, its memory with every claim prepared, and slice wipes.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, stream};
use vgpu_dra_integration::ControlPlane;

use crate::client::{ClaimId, Plugin};
use crate::counters::{self, Meter};
use crate::report::{LatencyRun, Single};
use crate::stats::Summary;
use crate::target::Target;
use crate::{Args, audited_plane, cluster, pid_of, procfs};

/// The single node's run: start, idle, latency runs, memory with every claim prepared, wipes.
pub async fn single(args: &Args, target: &Target) -> anyhow::Result<Single> {
    let plane = audited_plane()?;
    let node = "bench-node-0";
    plane.create_node(node)?;
    // Room for the claims of the memory sample, and with --fresh-claims for a run's claims
    // beside those of the run before it, whose pods may not be gone yet.
    let fresh = if args.fresh_claims { 2 * args.sizes.iter().max().copied().unwrap_or(0) } else { 0 };
    cluster::allow_pods(&plane, node, args.claims + fresh + 10)?;
    let identity = cluster::prepare(&plane, &target.driver)?;
    let client = cluster::client(&plane).await?;
    let audit_log = plane.audit_log().context("no audit log")?;

    let mut running = target.start(&plane, &identity.kubeconfig, node)?;
    let first = cluster::time_until(args.slice_timeout(), || async {
        Ok(cluster::slice_count(&client, &target.driver, node).await? > 0)
    })
    .await
    .with_context(|| {
        format!(
            "driver {} on node {node}: no ResourceSlice within {} s of start (--wipe-timeout-seconds); \
its output ends:\n{}",
            target.driver,
            args.wipe_timeout_seconds,
            running.process.tail(20)
        )
    })?;
    let plugin = Plugin::connect(&running.socket, Duration::from_secs(30)).await?;
    let pid = pid_of(&running)?;

    // Idle: settled after start, then the steady window for CPU and API requests.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = procfs::sample(pid).with_context(|| {
        format!("driver {} on node {node} stopped; its output ends:\n{}", target.driver, running.process.tail(20))
    })?;
    let window = cluster::AuditWindow::start(&audit_log)?;
    let steady = Duration::from_secs(args.steady_seconds);
    tokio::time::sleep(steady).await;
    let after_idle = procfs::sample(pid)?;
    if let Some(prefix) = &args.smaps {
        procfs::save_smaps(pid, &prefix.with_extension("idle.smaps"))?;
    }
    let steady_requests = window.requests_of(&identity.user)?;

    cluster::create_claims(&plane, "c", args.claims, &args.claim_requests, Some(node))?;
    let (claims, allocate) = cluster::wait_allocated(&client, "c", args.claims, Duration::from_secs(300)).await?;

    let meter = Meter::from_log(running.process.log());
    let bed = Bed { plane: &plane, client: &client, node, plugin: &plugin, meter: &meter };
    let latency = latency_runs(args, &bed, &claims).await?;

    // Every claim prepared: memory once settled (as for idle: the daemon gives a burst's freed
    // pages back after a quiet second), then the slices wiped the way a kubelet does.
    run(&plugin, &claims, args.concurrency, true).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let with_prepared = procfs::sample(pid)?;
    if let Some(prefix) = &args.smaps {
        procfs::save_smaps(pid, &prefix.with_extension("prepared.smaps"))?;
    }
    let count = cluster::slice_count(&client, &target.driver, node).await?;
    let mut wipe_recovery_ms = Vec::new();
    let mut wipe_not_recovered = None;
    for wipe in 1..=args.wipes {
        cluster::wipe(&client, &target.driver, node).await?;
        let back = cluster::time_until(args.slice_timeout(), || async {
            Ok(cluster::slice_count(&client, &target.driver, node).await? >= count)
        })
        .await;
        match back {
            Ok(took) => wipe_recovery_ms.push(took.as_secs_f64() * 1e3),
            Err(_) => {
                // Reported, not fatal: the latency and memory figures are still good. Later
                // wipes would time a plugin that has not recovered from this one, so stop.
                let now = cluster::slice_count(&client, &target.driver, node).await.unwrap_or(0);
                let message = format!(
                    "driver {} on node {node}: {now} of {count} slices back {} s after wipe {wipe} of {} \
(--wipe-timeout-seconds); no further wipes",
                    target.driver, args.wipe_timeout_seconds, args.wipes
                );
                eprintln!("bench: {message}");
                wipe_not_recovered = Some(message);
                break;
            }
        }
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
        fresh_claims: args.fresh_claims,
        with_prepared,
        prepared_claims: claims.len(),
        wipe_recovery_ms,
        wipe_timeout_seconds: args.wipe_timeout_seconds,
        wipe_not_recovered,
    })
}

/// What the latency runs talk to: the test bed, the plugin and its counters.
struct Bed<'a> {
    plane: &'a ControlPlane,
    client: &'a kube::Client,
    node: &'a str,
    plugin: &'a Plugin,
    meter: &'a Meter,
}

/// Each size of `--sizes` once sequentially and once per `--in-flight`: over the first claims
/// of `claims`, the same ones in every run, or with `--fresh-claims` over claims made for the
/// run.
async fn latency_runs(args: &Args, bed: &Bed<'_>, claims: &[ClaimId]) -> anyhow::Result<Vec<LatencyRun>> {
    let mut runs = Vec::new();
    let modes: Vec<Option<usize>> = std::iter::once(None).chain(args.in_flight.iter().copied().map(Some)).collect();
    for &n in args.sizes.iter().filter(|n| **n <= claims.len()) {
        for &in_flight in &modes {
            let run = if args.fresh_claims {
                fresh_run(args, bed, &format!("f{}", runs.len()), n, in_flight).await?
            } else {
                latency_run(bed, &claims[..n], in_flight).await?
            };
            runs.push(run);
        }
    }
    Ok(runs)
}

/// A latency run over `n` claims made for it, named `<prefix>-<i>`: allocated just before it,
/// so that a plugin that reads a pod's claims when the pod is bound here has read them (as a
/// kubelet prepares a pod's claims moments after its binding), and deleted with their pods
/// after it, so that runs do not pile up pods on the node.
async fn fresh_run(args: &Args, bed: &Bed<'_>, prefix: &str, n: usize, in_flight: Option<usize>) -> anyhow::Result<LatencyRun> {
    cluster::create_claims(bed.plane, prefix, n, &args.claim_requests, Some(bed.node))?;
    let (set, _) = cluster::wait_allocated(bed.client, prefix, n, Duration::from_secs(300)).await?;
    let run = latency_run(bed, &set, in_flight).await?;
    cluster::delete_claims(bed.client, prefix).await?;
    Ok(run)
}

/// Prepares, then unprepares, every claim of `set`: one at a time, or `in_flight` calls at a
/// time; with the fsyncs each claim cost and the share of prepares that took their claim read
/// ahead, where the plugin counts them.
async fn latency_run(bed: &Bed<'_>, set: &[ClaimId], in_flight: Option<usize>) -> anyhow::Result<LatencyRun> {
    let calls = in_flight.unwrap_or(1);
    let start = bed.meter.counts().await;
    let prepare = run(bed.plugin, set, calls, true).await?;
    let prepared = bed.meter.counts().await;
    let unprepare = run(bed.plugin, set, calls, false).await?;
    let end = bed.meter.counts().await;
    Ok(LatencyRun {
        claims: set.len(),
        mode: in_flight.map_or_else(|| "sequential".to_owned(), |c| format!("concurrent({c})")),
        prepare,
        unprepare,
        prepare_fsyncs_per_claim: counters::per_claim(start.fsyncs, prepared.fsyncs, set.len()),
        unprepare_fsyncs_per_claim: counters::per_claim(prepared.fsyncs, end.fsyncs, set.len()),
        prepares_read_ahead: counters::read_ahead_share(start, prepared, set.len()),
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
