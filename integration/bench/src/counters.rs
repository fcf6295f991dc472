//! The fsyncs a vgpu-dra plugin made, read from its own `vgpu_dra_fsyncs_total` at the metrics
//! address its log names (the benchmark starts it on port 0). Another driver exposes no such
//! count, and its figures say `null`.

use std::net::SocketAddr;
use std::path::Path;

/// Reads one plugin's fsync count.
#[derive(Debug, Clone, Copy)]
pub struct FsyncMeter {
    port: Option<u16>,
}

impl FsyncMeter {
    /// The meter of the plugin whose log is at `log` (none when the log names no metrics
    /// address).
    pub fn from_log(log: &Path) -> Self {
        Self { port: std::fs::read_to_string(log).ok().as_deref().and_then(metrics_port) }
    }

    /// The plugin's count now; `None` without a metrics address or when it does not answer.
    pub async fn count(&self) -> Option<u64> {
        let port = self.port?;
        let text = tokio::task::spawn_blocking(move || vgpu_dra_integration::http_get(port, "/metrics")).await.ok()?.ok()?;
        fsync_count(&text)
    }
}

/// The port of the address in vgpu-dra's "metrics and probes listening address=..." line.
fn metrics_port(log: &str) -> Option<u16> {
    let line = log.lines().rev().find(|l| l.contains("metrics and probes listening"))?;
    let address = line.split_whitespace().find_map(|w| w.strip_prefix("address="))?;
    address.parse::<SocketAddr>().ok().map(|a| a.port())
}

/// The value of `vgpu_dra_fsyncs_total` in a metrics exposition.
fn fsync_count(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|l| l.strip_prefix("vgpu_dra_fsyncs_total ")).and_then(|v| v.trim().parse().ok())
}

/// Fsyncs per claim between two counts; `None` when either is missing or no claim ran.
pub fn per_claim(before: Option<u64>, after: Option<u64>, claims: usize) -> Option<f64> {
    let (before, after) = (before?, after?);
    (claims > 0).then(|| after.saturating_sub(before) as f64 / claims as f64)
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
    fn the_count_is_read_from_the_exposition() {
        let text = "# HELP vgpu_dra_fsyncs fsyncs\n# TYPE vgpu_dra_fsyncs counter\nvgpu_dra_fsyncs_total 1234\n# EOF\n";
        assert_eq!(fsync_count(text), Some(1234));
        assert_eq!(fsync_count("vgpu_dra_fsyncs_totalish 3\n"), None);
        assert_eq!(per_claim(Some(100), Some(400), 100), Some(3.0));
        assert_eq!(per_claim(None, Some(400), 100), None);
        assert_eq!(per_claim(Some(1), Some(2), 0), None);
    }
}
