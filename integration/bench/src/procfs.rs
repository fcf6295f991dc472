//! A process's resident memory and CPU time, from /proc.

use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

/// One sample of a process's resources.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Usage {
    /// Resident set size, in MiB.
    pub rss_mib: f64,
    /// Of that, anonymous pages (heap, stacks), in MiB.
    pub rss_anon_mib: f64,
    /// Of that, pages of mapped files (the binary's text, shared libraries), in MiB.
    pub rss_file_mib: f64,
    /// User plus system CPU time since start, in seconds.
    pub cpu_seconds: f64,
}

/// Clock ticks per second for `/proc/<pid>/stat` times (`getconf CLK_TCK`, almost always 100).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Reads `pid`'s RSS and CPU time now.
pub fn sample(pid: u32) -> anyhow::Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("process {pid}"))?;
    let kib = |field: &str| -> anyhow::Result<f64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {field} in /proc/{pid}/status"))
    };
    let rss_kib = kib("VmRSS:")?;
    let anon_kib = kib("RssAnon:")?;
    let file_kib = kib("RssFile:")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).context("odd /proc stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the command name.
    let cpu = (ticks(11) + ticks(12)) / ticks_per_second();
    Ok(Usage { rss_mib: rss_kib / 1024.0, rss_anon_mib: anon_kib / 1024.0, rss_file_mib: file_kib / 1024.0, cpu_seconds: cpu })
}

/// CPU time used between two samples, as a share of one core over `wall`.
pub fn cpu_share(before: Usage, after: Usage, wall: Duration) -> f64 {
    if wall.is_zero() { 0.0 } else { (after.cpu_seconds - before.cpu_seconds) / wall.as_secs_f64() }
}

/// Copies `pid`'s `/proc/<pid>/smaps` (resident pages per mapping) to `to`, for a breakdown of
/// the RSS figures beside them.
pub fn save_smaps(pid: u32, to: &std::path::Path) -> anyhow::Result<()> {
    let smaps = std::fs::read(format!("/proc/{pid}/smaps")).with_context(|| format!("smaps of process {pid}"))?;
    std::fs::write(to, smaps).with_context(|| format!("{}", to.display()))
}
