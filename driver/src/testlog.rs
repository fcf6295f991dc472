//! Captures what the code under test logs, so a test can say which events a failure must leave.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// The lines logged at warn or above while the guard lives, on this thread (the paused-time
/// tests run on one thread, so their spawned tasks log here too).
#[derive(Clone, Default)]
pub struct Warnings(Arc<Mutex<Vec<u8>>>);

impl Warnings {
    /// Starts capturing; capture stops when the returned guard drops.
    pub fn capture() -> (Self, DefaultGuard) {
        let log = Self::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (log, tracing::subscriber::set_default(subscriber))
    }

    /// The captured lines.
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap()).lines().map(str::to_owned).collect()
    }
}

impl Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks the calls a failing watch made at `times` over two minutes: growing pauses (0.5 s
/// doubling to 30 s, each in [cap/2, cap]: at most 14 calls, where a fixed 500 ms retry makes
/// about 240), and one warning per failure in `warnings`, each with all of `naming`.
pub fn assert_backed_off(times: &[tokio::time::Instant], warnings: &Warnings, naming: &[&str]) {
    use std::time::Duration;
    assert!((4..=14).contains(&times.len()), "{} calls in 120 s", times.len());
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    for pair in gaps.windows(2).filter(|pair| pair[0] < Duration::from_secs(15)) {
        assert!(pair[1] >= pair[0], "pauses grow until the longest: {gaps:?}");
    }
    assert!(gaps.iter().all(|g| *g <= Duration::from_secs(30)), "{gaps:?}");
    let lines = warnings.lines();
    assert!(lines.len() >= times.len() - 1, "one warning per failure: {lines:?}");
    assert!(lines.iter().all(|l| l.contains("WARN") && naming.iter().all(|n| l.contains(n))), "{lines:?}");
}
