//! What a vgpu-dra plugin counts of its own work, read from its metrics at the address its log
//! names (the benchmark starts it on port 0): the fsyncs it made (`vgpu_dra_fsyncs_total`) and
//! the prepares that took their claim from what its pod watch read ahead
//! (`vgpu_dra_claim_prefetch_total{result="used"}`). Another driver exposes neither, and its
//! figures say `null`; so does vgpu-dra's read ahead with its pod watch off.

use std::net::SocketAddr;
use std::path::Path;

/// Reads one plugin's counters.
#[derive(Debug, Clone, Copy)]
pub struct Meter {
    port: Option<u16>,
}

/// The counters at one moment; `None` where the plugin does not count it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Every fsync the plugin made.
    pub fsyncs: Option<u64>,
    /// Prepares that took their claim read ahead.
    pub read_ahead: Option<u64>,
}

impl Meter {
    /// The meter of the plugin whose log is at `log` (none when the log names no metrics
    /// address).
    pub fn from_log(log: &Path) -> Self {
        Self { port: std::fs::read_to_string(log).ok().as_deref().and_then(metrics_port) }
    }

    /// The plugin's counts now; empty without a metrics address or when it does not answer.
    pub async fn counts(&self) -> Counts {
        let Some(port) = self.port else { return Counts::default() };
        let text = tokio::task::spawn_blocking(move || vgpu_dra_integration::http_get(port, "/metrics")).await;
        match text {
            Ok(Ok(text)) => Counts::of(&text),
            _ => Counts::default(),
        }
    }
}

impl Counts {
    /// The counts in a metrics exposition.
    fn of(metrics: &str) -> Self {
        // Every prepare counts `used` or `missed` with the pod watch on, none with it off: no
        // sample of the family yet says "not counted" until a prepare has run.
        let watching = metrics.lines().any(|l| l.starts_with("vgpu_dra_claim_prefetch_total{"));
        let read_ahead = sample(metrics, "vgpu_dra_claim_prefetch_total{result=\"used\"}").or_else(|| watching.then_some(0));
        Self { fsyncs: sample(metrics, "vgpu_dra_fsyncs_total"), read_ahead }
    }
}

/// The port of the address in vgpu-dra's "metrics and probes listening address=..." line.
fn metrics_port(log: &str) -> Option<u16> {
    let line = log.lines().rev().find(|l| l.contains("metrics and probes listening"))?;
    let address = line.split_whitespace().find_map(|w| w.strip_prefix("address="))?;
    address.parse::<SocketAddr>().ok().map(|a| a.port())
}

/// The value of the sample `series` (name and labels as exposed) in an exposition.
fn sample(metrics: &str, series: &str) -> Option<u64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
}

/// The rise of a count between two readings, per claim; `None` when either is missing or no
/// claim ran.
pub fn per_claim(before: Option<u64>, after: Option<u64>, claims: usize) -> Option<f64> {
    let (before, after) = (before?, after?);
    (claims > 0).then(|| after.saturating_sub(before) as f64 / claims as f64)
}

/// The share of a run's `claims` prepares that took their claim read ahead, between the
/// readings before and after them. A plugin counts nothing before its first prepare, so a
/// count only after the run started from zero.
pub fn read_ahead_share(before: Counts, after: Counts, claims: usize) -> Option<f64> {
    let after = after.read_ahead?;
    per_claim(Some(before.read_ahead.unwrap_or(0)), Some(after), claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_comes_from_the_last_listening_line() {
        let log = "2026-12-06T03:00:00Z  INFO vgpu_dra::http: metrics and probes listening address=127.0.0.1:0\n\
                   2026-12-06T03:00:01Z  INFO vgpu_dra::http: metrics and probes listening address=127.0.0.1:41234\n";
        assert_eq!(metrics_port(log), Some(41234));
        assert_eq!(metrics_port("INFO something else address=127.0.0.1:9"), None);
        assert_eq!(metrics_port("metrics and probes listening address=nowhere"), None);
    }

    #[test]
    fn the_counts_are_read_from_the_exposition() {
        let text = "# HELP vgpu_dra_fsyncs fsyncs\n# TYPE vgpu_dra_fsyncs counter\nvgpu_dra_fsyncs_total 1234\n\
                    # TYPE vgpu_dra_claim_prefetch counter\nvgpu_dra_claim_prefetch_total{result=\"missed\"} 7\n\
                    vgpu_dra_claim_prefetch_total{result=\"used\"} 93\n# EOF\n";
        let c = Counts::of(text);
        assert_eq!((c.fsyncs, c.read_ahead), (Some(1234), Some(93)));
        assert_eq!(Counts::of("vgpu_dra_fsyncs_totalish 3\n").fsyncs, None);
        assert_eq!(per_claim(Some(100), Some(400), 100), Some(3.0));
        assert_eq!(per_claim(None, Some(400), 100), None);
        assert_eq!(per_claim(Some(1), Some(2), 0), None);
    }

    #[test]
    fn a_read_ahead_not_yet_used_is_zero_and_no_watch_is_none() {
        let watching = "vgpu_dra_claim_prefetch_total{result=\"missed\"} 4\n";
        assert_eq!(Counts::of(watching).read_ahead, Some(0));
        let off = "# TYPE vgpu_dra_claim_prefetch counter\nvgpu_dra_fsyncs_total 1\n";
        assert_eq!(Counts::of(off).read_ahead, None);
        let none = Counts::default();
        let used = |n| Counts { read_ahead: Some(n), ..Counts::default() };
        assert_eq!(read_ahead_share(none, used(90), 100), Some(0.9));
        assert_eq!(read_ahead_share(used(90), used(90), 100), Some(0.0));
        assert_eq!(read_ahead_share(none, none, 100), None);
    }
}
