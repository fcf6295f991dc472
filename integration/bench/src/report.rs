//! The figures of a run: a table on stdout and a JSON file, with the machine they came from.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cluster::Requests;
use crate::procfs::Usage;
use crate::stats::Summary;

/// Where the figures were measured.
#[derive(Debug, Serialize)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// CPUs available to the run.
    pub cpus: usize,
    /// Memory, in GiB.
    pub memory_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// The repository commit measured.
    pub commit: String,
    /// When, in UTC (`date -u`).
    pub date: String,
    /// The Kubernetes release of the test bed.
    pub kubernetes: String,
    /// The file system of the nodes' directories (checkpoints and CDI specs are written there).
    pub node_fs: String,
}

fn first_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.lines().next().unwrap_or_default().trim().to_owned())
        .unwrap_or_default()
}

impl Machine {
    /// This machine, now, with the nodes' files under `node_dirs`.
    pub fn here(node_dirs: std::path::PathBuf) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Self {
            cpu: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
                .unwrap_or_default(),
            cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            commit: first_line("git", &["rev-parse", "--short", "HEAD"]),
            date: first_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
            kubernetes: std::env::var("K8S_VERSION").unwrap_or_else(|_| "v1.36.3".into()),
            node_fs: file_system(&node_dirs),
        }
    }
}

/// The file system `path` is on, as "`PATH`: TYPE on SOURCE", and for ext4 whether it has a
/// journal: without one, ext4 looks through recently freed inodes on every file it creates,
/// which makes a prepare's temp files slow after many claims were unprepared.
fn file_system(path: &std::path::Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some((mount, fstype, source)) = mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            Some((mount, right.next()?, right.next()?))
        })
        .filter(|(mount, ..)| path.starts_with(mount))
        .max_by_key(|(mount, ..)| mount.len())
    else {
        return format!("{}: unknown file system", path.display());
    };
    let journal = if fstype == "ext4" {
        let device = source.rsplit('/').next().unwrap_or(source);
        let journaled = std::fs::read_dir("/proc/fs/jbd2")
            .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{device}-"))))
            .unwrap_or(false);
        if journaled { ", with a journal" } else { ", without a journal" }
    } else {
        ""
    };
    format!("{}: {fstype} on {source} (mounted at {mount}){journal}", path.display())
}

/// Latency of one mode at one size.
#[derive(Debug, Serialize)]
pub struct LatencyRun {
    /// Claims in the run.
    pub claims: usize,
    /// `sequential` or `concurrent(N)`.
    pub mode: String,
    /// NodePrepareResources, one claim per call.
    pub prepare: Summary,
    /// NodeUnprepareResources, one claim per call.
    pub unprepare: Summary,
    /// fsyncs per claim prepared, where the plugin counts them (vgpu-dra's
    /// `vgpu_dra_fsyncs_total`); `None` for other drivers.
    pub prepare_fsyncs_per_claim: Option<f64>,
    /// fsyncs per claim unprepared, likewise.
    pub unprepare_fsyncs_per_claim: Option<f64>,
    /// The share of the prepares that took their claim from what the plugin read ahead
    /// (vgpu-dra's pod watch, `vgpu_dra_claim_prefetch_total{result="used"}`); `None` where the
    /// plugin does not count it or its pod watch is off.
    pub prepares_read_ahead: Option<f64>,
}

/// The single-node figures.
#[derive(Debug, Serialize)]
pub struct Single {
    /// From process start to the first ResourceSlice, in milliseconds.
    pub start_to_first_slice_ms: f64,
    /// Idle resources, shortly after start.
    pub idle: Usage,
    /// Share of one core used while idle.
    pub idle_cpu_share: f64,
    /// The plugin's requests over the steady-state window.
    pub steady_requests: Requests,
    /// The window's length, in seconds.
    pub steady_seconds: f64,
    /// Requests per minute at steady state.
    pub steady_requests_per_minute: f64,
    /// Time for the scheduler to allocate all claims, in seconds.
    pub allocate_seconds: f64,
    /// Latency by size and mode.
    pub latency: Vec<LatencyRun>,
    /// Whether each latency run had claims made for it (`--fresh-claims`) rather than the
    /// first claims of one set.
    pub fresh_claims: bool,
    /// Resources with every claim prepared.
    pub with_prepared: Usage,
    /// How many claims were prepared for that sample.
    pub prepared_claims: usize,
    /// Each wipe's time until the slices were back, in milliseconds.
    pub wipe_recovery_ms: Vec<f64>,
    /// How long a wipe's recovery was waited for, in seconds.
    pub wipe_timeout_seconds: u64,
    /// Which driver and node did not get their slices back in time, if one did not.
    pub wipe_not_recovered: Option<String>,
}

/// The many-node figures.
#[derive(Debug, Serialize)]
pub struct Scale {
    /// Simulated nodes, one plugin process each.
    pub nodes: usize,
    /// ResourceSlices published, and the nodes they cover.
    pub slices: usize,
    /// Nodes with slices.
    pub nodes_with_slices: usize,
    /// From the first start to every node's slices, in seconds.
    pub all_slices_seconds: f64,
    /// Claims allocated and prepared.
    pub claims: usize,
    /// Time for the scheduler to allocate them, in seconds.
    pub allocate_seconds: f64,
    /// Preparing them all on their nodes' plugins, concurrently.
    pub prepare: Summary,
    /// Sum of all plugins' RSS with the claims prepared, in MiB.
    pub total_rss_mib: f64,
    /// The plugins' API requests from start to the end of preparing.
    pub requests_until_prepared: Requests,
    /// The plugins' API requests from the claims' creation to the end of preparing them.
    pub requests_for_claims: Requests,
    /// Watch events the API server sent for ResourceClaims meanwhile, to every watcher.
    pub claim_watch_events: f64,
    /// Watch events the API server sent for ResourceSlices meanwhile, to every watcher.
    pub slice_watch_events: f64,
    /// Watch events the API server sent for Pods meanwhile, to every watcher (the scheduler's,
    /// the controllers' and each node's watch of its own pods).
    pub pod_watch_events: f64,
    /// Watches open at the end, by resource.
    pub watches: std::collections::BTreeMap<String, f64>,
    /// The API server's CPU seconds from the plugins' start to the end of preparing.
    pub apiserver_cpu_seconds: f64,
    /// The API server's peak resident memory, in MiB.
    pub apiserver_peak_rss_mib: f64,
    /// The plugins' API requests per minute afterwards, all nodes together.
    pub steady_requests_per_minute: f64,
    /// Wall time of the scale run, in seconds.
    pub wall_seconds: f64,
}

/// Everything a run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// The driver measured.
    pub driver: String,
    /// Its command template.
    pub command: String,
    /// Single-node figures.
    pub single: Option<Single>,
    /// Many-node figures.
    pub scale: Option<Scale>,
    /// The HAMi compatibility webhook's admission figures.
    pub webhook: Option<crate::webhook::WebhookRun>,
    /// The node monitor's tick.
    pub monitor: Option<crate::monitor::MonitorRun>,
    /// The goals the figures are held against, and whether each was met.
    pub goals: BTreeMap<String, bool>,
}

impl Report {
    /// Checks the figures against the goals of issue #9.
    pub fn judge(&mut self) {
        let mut goals = BTreeMap::new();
        if let Some(s) = &self.single {
            // The latency goals are per call; concurrent runs add queueing behind other calls,
            // which is reported but is not what the goal measures.
            let worst =
                |f: fn(&LatencyRun) -> f64| s.latency.iter().filter(|r| r.mode == "sequential").map(f).fold(0.0, f64::max);
            goals.insert("prepare p99 < 5 ms (sequential, claims already allocated)".into(), worst(|r| r.prepare.p99_ms) < 5.0);
            goals.insert("unprepare p99 < 5 ms (sequential)".into(), worst(|r| r.unprepare.p99_ms) < 5.0);
            goals.insert("idle RSS < 15 MB".into(), s.idle.rss_mib * 1.048_576 < 15.0);
            goals.insert("RSS with 1,000 claims < 30 MB".into(), s.with_prepared.rss_mib * 1.048_576 < 30.0);
            goals.insert(
                "slices back < 5 s after a wipe".into(),
                s.wipe_not_recovered.is_none() && s.wipe_recovery_ms.iter().all(|ms| *ms < 5000.0),
            );
            goals.insert("zero steady-state API writes".into(), s.steady_requests.writes == 0);
        }
        if let Some(s) = &self.scale {
            goals.insert("scale run < 10 min".into(), s.wall_seconds < 600.0);
        }
        if let Some(w) = &self.webhook {
            goals.insert(
                format!("webhook admission p99 < 5 ms ({} pods, sequential, loopback)", w.pods),
                w.direct_sequential.p99_ms < 5.0,
            );
        }
        self.goals = goals;
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        out.push_str(&format!(
            "vgpu-dra-bench  driver {}  commit {}  {}\nmachine: {} x{} CPUs, {} GiB, kernel {}, Kubernetes {}\nnodes' files: {}\n\n",
            self.driver, m.commit, m.date, m.cpu, m.cpus, m.memory_gib, m.kernel, m.kubernetes, m.node_fs
        ));
        if let Some(s) = &self.single {
            out.push_str("single node\n");
            out.push_str(&format!("  start to first slice        {:>9.1} ms\n", s.start_to_first_slice_ms));
            out.push_str(&format!(
                "  idle RSS / CPU              {:>9.1} MiB  {:.2}% of a core\n",
                s.idle.rss_mib,
                s.idle_cpu_share * 100.0
            ));
            out.push_str(&format!(
                "  RSS with {} prepared      {:>9.1} MiB  (CPU {:.2} s since start)\n",
                s.prepared_claims, s.with_prepared.rss_mib, s.with_prepared.cpu_seconds
            ));
            out.push_str(&format!(
                "    of which anon / file      {:>5.1} / {:.1} MiB  (idle {:.1} / {:.1})\n",
                s.with_prepared.rss_anon_mib, s.with_prepared.rss_file_mib, s.idle.rss_anon_mib, s.idle.rss_file_mib
            ));
            out.push_str(&format!(
                "  steady-state API requests   {:>9.1} /min ({} writes in {:.0} s)\n",
                s.steady_requests_per_minute, s.steady_requests.writes, s.steady_seconds
            ));
            let wipes: Vec<String> = s.wipe_recovery_ms.iter().map(|ms| format!("{ms:.0}")).collect();
            let wipes = if wipes.is_empty() { "none".to_owned() } else { format!("{} ms", wipes.join(", ")) };
            out.push_str(&format!("  slices back after a wipe    {wipes}\n"));
            if let Some(failed) = &s.wipe_not_recovered {
                out.push_str(&format!("  NOT BACK                    {failed}\n"));
            }
            out.push_str(&format!("  scheduler allocated claims  {:>9.1} s\n\n", s.allocate_seconds));
            out.push_str(if s.fresh_claims {
                "  latency runs: each over claims made for it (--fresh-claims)\n"
            } else {
                "  latency runs: each over the first claims of one set\n"
            });
            out.push_str(
                "  claims  mode            prepare p50/p90/p99 ms     /s  fsync/claim  read ahead   unprepare p50/p90/p99 ms     /s  fsync/claim\n",
            );
            let fsyncs = |f: Option<f64>| f.map_or_else(|| "-".to_owned(), |f| format!("{f:.2}"));
            let share = |f: Option<f64>| f.map_or_else(|| "-".to_owned(), |f| format!("{:.0}%", f * 100.0));
            for r in &s.latency {
                out.push_str(&format!(
                    "  {:>6}  {:<14} {:>6.2} {:>6.2} {:>6.2} {:>7.0} {:>12} {:>11}   {:>6.2} {:>6.2} {:>6.2} {:>7.0} {:>12}\n",
                    r.claims,
                    r.mode,
                    r.prepare.p50_ms,
                    r.prepare.p90_ms,
                    r.prepare.p99_ms,
                    r.prepare.per_second,
                    fsyncs(r.prepare_fsyncs_per_claim),
                    share(r.prepares_read_ahead),
                    r.unprepare.p50_ms,
                    r.unprepare.p90_ms,
                    r.unprepare.p99_ms,
                    r.unprepare.per_second,
                    fsyncs(r.unprepare_fsyncs_per_claim),
                ));
            }
            out.push('\n');
        }
        if let Some(m) = &self.monitor {
            out.push_str(&format!("node monitor: one tick over {} prepared claims with initialised regions\n", m.claims));
            out.push_str(&format!(
                "  tick p50/p90/max             {:>6.2} {:>6.2} {:>6.2} ms  CPU {:.2} ms  {:.0} fields written\n",
                m.tick.p50_ms, m.tick.p90_ms, m.tick.max_ms, m.cpu_ms_per_tick, m.writes_per_tick
            ));
            out.push_str(&format!("  RSS of its series           {:>9.2} MiB\n\n", m.series_rss_mib));
        }
        if let Some(s) = &self.scale {
            out.push_str(&format!("scale: {} nodes, one plugin process each\n", s.nodes));
            out.push_str(&format!(
                "  slices published            {} on {} nodes in {:.1} s\n",
                s.slices, s.nodes_with_slices, s.all_slices_seconds
            ));
            out.push_str(&format!("  claims allocated            {} in {:.1} s\n", s.claims, s.allocate_seconds));
            out.push_str(&format!(
                "  prepared on their nodes     p50 {:.2} / p99 {:.2} ms, {:.0}/s\n",
                s.prepare.p50_ms, s.prepare.p99_ms, s.prepare.per_second
            ));
            out.push_str(&format!(
                "  plugins' RSS                {:.0} MiB all together, {:.1} MiB each\n",
                s.total_rss_mib,
                s.total_rss_mib / s.nodes.max(1) as f64
            ));
            // What must not grow with the cluster: a node's cost for each claim of its own.
            let per_claim = |n: f64| n / s.claims.max(1) as f64;
            out.push_str(&format!(
                "  per own claim               {:.2} plugin requests; watch events (all watchers): {:.2} claim, {:.2} slice, {:.2} pod\n",
                per_claim(s.requests_for_claims.total as f64),
                per_claim(s.claim_watch_events),
                per_claim(s.slice_watch_events),
                per_claim(s.pod_watch_events)
            ));
            out.push_str(&format!(
                "  watches open                claims {:.0}, slices {:.0}, pods {:.0}\n",
                s.watches.get("resourceclaims").copied().unwrap_or(0.0),
                s.watches.get("resourceslices").copied().unwrap_or(0.0),
                s.watches.get("pods").copied().unwrap_or(0.0)
            ));
            out.push_str(&format!(
                "  API server                  {:.1} CPU s from the plugins' start to prepared, peak RSS {:.0} MiB\n",
                s.apiserver_cpu_seconds, s.apiserver_peak_rss_mib
            ));
            out.push_str(&format!(
                "  API requests to prepared    {} ({} writes); then {:.1}/min\n",
                s.requests_until_prepared.total, s.requests_until_prepared.writes, s.steady_requests_per_minute
            ));
            out.push_str(&format!("  wall time                   {:.0} s\n\n", s.wall_seconds));
        }
        if let Some(w) = &self.webhook {
            out.push_str(&format!("webhook admission: {} HAMi pods of {} shapes\n", w.pods, w.shapes));
            out.push_str("  path                              p50/p90/p99/max ms            /s\n");
            for (name, s) in [
                ("direct, sequential".to_owned(), &w.direct_sequential),
                (format!("direct, concurrent({})", w.concurrency), &w.direct_concurrent),
                (format!("API server dry run, {} converted", w.api_server_converted.calls), &w.api_server_converted),
                (format!("API server dry run, {} without GPU", w.api_server_plain.calls), &w.api_server_plain),
            ] {
                out.push_str(&format!(
                    "  {name:<33} {:>6.2} {:>6.2} {:>6.2} {:>7.2} {:>8.0}\n",
                    s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.per_second
                ));
            }
            out.push_str(&format!("  webhook RSS afterwards            {:.1} MiB\n\n", w.rss_mib));
        }
        out.push_str("goals\n");
        for (goal, met) in &self.goals {
            out.push_str(&format!("  [{}] {goal}\n", if *met { "met" } else { "MISSED" }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_system_is_the_deepest_mount_holding_the_path() {
        assert!(file_system(std::path::Path::new("/proc/self/status")).contains(": proc on proc (mounted at /proc)"));
        let root = file_system(std::path::Path::new("/"));
        assert!(root.contains("(mounted at /)"), "{root}");
        assert!(!root.contains("unknown"), "{root}");
    }
}
