//! Latency summaries.

use std::time::Duration;

use serde::Serialize;

/// Percentiles and throughput of one run of calls.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Calls made.
    pub calls: usize,
    /// Median, in milliseconds.
    pub p50_ms: f64,
    /// 90th percentile, in milliseconds.
    pub p90_ms: f64,
    /// 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// Slowest call, in milliseconds.
    pub max_ms: f64,
    /// Calls per second over the run's wall time.
    pub per_second: f64,
}

impl Summary {
    /// Summarises `latencies` of calls that took `wall` in all.
    pub fn of(mut latencies: Vec<Duration>, wall: Duration) -> Self {
        latencies.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let at = |q: f64| {
            if latencies.is_empty() {
                return 0.0;
            }
            // Nearest rank: the smallest value with at least q of the calls at or below it.
            let rank = (q * latencies.len() as f64).ceil() as usize;
            ms(latencies[rank.clamp(1, latencies.len()) - 1])
        };
        Self {
            calls: latencies.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: latencies.last().map_or(0.0, |d| ms(*d)),
            per_second: if wall.is_zero() { 0.0 } else { latencies.len() as f64 / wall.as_secs_f64() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let l: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(l, Duration::from_secs(2));
        assert_eq!((s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(s.per_second, 50.0);
        let one = Summary::of(vec![Duration::from_millis(3)], Duration::from_millis(3));
        assert_eq!((one.p50_ms, one.p99_ms), (3.0, 3.0));
    }
}
