//! The node monitor's cost: ticks over `claims` prepared claims whose containers have
//! initialised their HAMi-core regions, doing what the daemon's tick does after it has taken the
//! claims from its state (`vgpu_dra::monitor::feed`: open, read, HAMi's rules, writes; then
//! `figures` and the metric families, HAMi's legacy names included), on the nodes' file system.
//! A quarter of the claims are active each tick (their regions' `recent_kernel` set back to 2 as
//! a launch would, outside the timing) and every fourth one has priority 0, so the ticks block,
//! release and switch as on a busy node.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus_client::registry::Registry;
use serde::Serialize;
use vgpu_dra::monitor::feedback::{Policy, SwitchMode};
use vgpu_dra::monitor::metrics::MonitorMetrics;
use vgpu_dra::monitor::region::offset;
use vgpu_dra::monitor::region::writer::{Process, region};
use vgpu_dra::monitor::{Watched, feed, figures};
use vgpu_dra::plugin::claim::ClaimRef;

use crate::procfs;
use crate::stats::Summary;

/// Cards the claims are spread over, as on a node of 8 GPUs.
const CARDS: usize = 8;

/// The figures of the monitor runs.
#[derive(Debug, Clone, Serialize)]
pub struct MonitorRun {
    /// Prepared claims, each with an initialised region.
    pub claims: usize,
    /// Wall time per tick.
    pub tick: Summary,
    /// CPU time per tick (the ticking thread's user and system time), in milliseconds.
    pub cpu_ms_per_tick: f64,
    /// Fields written into regions per tick.
    pub writes_per_tick: f64,
    /// Resident memory the metric series of every claim and card add, in MiB.
    pub series_rss_mib: f64,
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).context("odd /proc stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Ok((ticks(11) + ticks(12)) / 100.0)
}

/// Runs `ticks` ticks over `claims` claims in a fresh directory under `dir`.
///
/// # Errors
/// When the claims' files cannot be made.
pub fn run(claims: usize, ticks: usize, dir: &Path) -> anyhow::Result<MonitorRun> {
    let scratch = tempfile::Builder::new().prefix("monitor-").tempdir_in(dir)?;
    let root = scratch.path();
    let mut watched = Vec::with_capacity(claims);
    for i in 0..claims {
        let uid = format!("00000000-0000-0000-0000-{i:012}");
        let card = format!("GPU-00000000-0000-0000-0000-{:012}", i % CARDS);
        let claim = ClaimRef::new("bench", &format!("claim-{i}"), &uid)?;
        let w = Watched {
            claim,
            file: format!("{card}.cache"),
            cards: vec![card.clone()],
            limits: vec![1 << 30],
            priority: u8::from(i % 4 != 0),
            policy: Policy::Default,
        };
        let claim_dir = root.join(&uid);
        std::fs::create_dir(&claim_dir)?;
        let pid = i32::try_from(i + 100).unwrap_or(i32::MAX);
        std::fs::write(claim_dir.join(&w.file), region(&[&card], &[1 << 30], &[Process { pid, memory: 256 << 20, sm_util: 5 }]))?;
        watched.push(w);
    }
    let pid = std::process::id();
    let before = procfs::sample(pid)?.rss_mib;
    let mut registry = Registry::default();
    let metrics = MonitorMetrics::register(&mut registry, true);
    let consumers: BTreeMap<_, _> =
        watched.iter().map(|w| (w.claim.uid.clone(), (format!("pod-{}", w.claim.name), "main".to_owned()))).collect();
    let (mut walls, mut cpu, mut writes) = (Vec::new(), 0.0, 0usize);
    let started = Instant::now();
    for _ in 0..ticks {
        for w in watched.iter().step_by(4) {
            let file = std::fs::OpenOptions::new().write(true).open(root.join(w.claim.uid.as_str()).join(&w.file))?;
            std::os::unix::fs::FileExt::write_at(&file, &2i32.to_ne_bytes(), offset::RECENT_KERNEL as u64)?;
        }
        let (t0, c0) = (Instant::now(), thread_cpu()?);
        let tick = feed(root, &watched, SwitchMode::Feedback);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        metrics.show(figures(&watched, &tick.outcomes, &consumers, now));
        walls.push(t0.elapsed());
        cpu += thread_cpu()? - c0;
        writes += tick.writes.len();
    }
    let series_rss_mib = procfs::sample(pid)?.rss_mib - before;
    let n = ticks.max(1) as f64;
    Ok(MonitorRun {
        claims,
        tick: Summary::of(walls, started.elapsed().max(Duration::from_nanos(1))),
        cpu_ms_per_tick: cpu * 1e3 / n,
        writes_per_tick: writes as f64 / n,
        series_rss_mib,
    })
}
