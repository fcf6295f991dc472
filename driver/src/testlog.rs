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

/// The pauses between successive calls made at `times`.
pub fn gaps(times: &[tokio::time::Instant]) -> Vec<std::time::Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}
