//! The pause before a failed watch is started again: growing, so an API server that is down is
//! not asked ever faster by every node at once, and jittered, so that the nodes of a cluster that
//! all lost their watches at the same moment (an API server restart) come back spread out
//! instead of together.

use std::time::Duration;

/// The first pause.
const FIRST: Duration = Duration::from_millis(500);
/// The longest pause.
const LONGEST: Duration = Duration::from_secs(30);

/// Exponential backoff with full jitter: the n-th pause is uniform in [cap/2, cap], where cap
/// doubles from 0.5 s (`FIRST`) up to 30 s (`LONGEST`); [`Backoff::reset`] after a success starts over.
#[derive(Debug, Clone)]
pub struct Backoff {
    cap: Duration,
    first: Duration,
    longest: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(FIRST, LONGEST)
    }
}

impl Backoff {
    /// A backoff from `first` up to `longest`.
    pub fn new(first: Duration, longest: Duration) -> Self {
        Self { cap: first, first, longest: longest.max(first) }
    }

    /// The pause to wait now; the next one is longer, up to the longest.
    pub fn next_pause(&mut self) -> Duration {
        let cap = self.cap;
        self.cap = (self.cap * 2).min(self.longest);
        // Half fixed, half random: never a busy loop, never two nodes in step.
        let half = cap / 2;
        half + half.mul_f64(fastrand::f64())
    }

    /// Starts over from the first pause (the watch worked again).
    pub fn reset(&mut self) {
        self.cap = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_to_the_longest_and_start_over_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let pauses: Vec<Duration> = (0..8).map(|_| b.next_pause()).collect();
        let caps = [100, 200, 400, 800, 1000, 1000, 1000, 1000];
        for (pause, cap) in pauses.iter().zip(caps) {
            let cap = Duration::from_millis(cap);
            assert!(*pause >= cap / 2 && *pause <= cap, "{pause:?} outside [{:?}, {cap:?}]", cap / 2);
        }
        b.reset();
        assert!(b.next_pause() <= Duration::from_millis(100));
    }

    #[test]
    fn two_nodes_failing_together_do_not_retry_together() {
        let pauses: Vec<Duration> = (0..32).map(|_| Backoff::default().next_pause()).collect();
        let distinct: std::collections::BTreeSet<Duration> = pauses.iter().copied().collect();
        assert!(distinct.len() > 16, "jitter spreads the first retries: {pauses:?}");
    }
}
