//! One computation at a time, shared by every caller it can answer: what keeps the HTTP
//! endpoints' work bounded however many requests arrive. Anyone who can reach the metrics port
//! can send requests; each `/healthz` makes two gRPC calls into the plugin and each `/metrics`
//! takes the state lock, so without this a flood of requests is a flood of that work.
//!
//! A caller gets the result of a computation that started after it arrived (so nothing it reads
//! predates its request), or of one that finished at most `reuse_for` before; otherwise it
//! computes, and callers arriving meanwhile wait for that result or the next.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// The last result, with when its computation started and finished.
#[derive(Debug)]
pub struct Coalesced<T> {
    last: Mutex<Option<Computed<T>>>,
    reuse_for: Duration,
}

#[derive(Debug)]
struct Computed<T> {
    started: Instant,
    finished: Instant,
    value: T,
}

impl<T: Clone> Coalesced<T> {
    /// Results are reused by callers that arrive within `reuse_for` of their computation's
    /// end (zero: only by callers that arrived before it started).
    pub fn new(reuse_for: Duration) -> Self {
        Self { last: Mutex::new(None), reuse_for }
    }

    /// A result fresh enough for a caller arriving now, computing it with `compute` if there is
    /// none. A caller that gives up (its future dropped) while computing leaves no result; the
    /// next caller computes.
    pub async fn get<F, Fut>(&self, compute: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let arrived = Instant::now();
        let mut last = self.last.lock().await;
        // With a window, a result that ended within it (or after the caller arrived) will do;
        // without one, only a computation that started after the caller arrived.
        let windowed =
            |c: &Computed<T>| !self.reuse_for.is_zero() && arrived.saturating_duration_since(c.finished) <= self.reuse_for;
        if let Some(c) = &*last
            && (c.started >= arrived || windowed(c))
        {
            return c.value.clone();
        }
        let started = Instant::now();
        let value = compute().await;
        *last = Some(Computed { started, finished: Instant::now(), value: value.clone() });
        value
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A computation that takes `took` and returns how many computations ran, itself included.
    fn counted(runs: &Arc<AtomicUsize>, took: Duration) -> impl Future<Output = usize> + use<> {
        let runs = runs.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(took).await;
            n
        }
    }

    #[tokio::test(start_paused = true)]
    async fn callers_arriving_together_share_one_computation_and_later_ones_wait_for_the_next() {
        let c = Arc::new(Coalesced::new(Duration::ZERO));
        let runs = Arc::new(AtomicUsize::new(0));
        // The first starts computing; 99 more arrive while it runs.
        let first = {
            let (c, runs) = (c.clone(), runs.clone());
            tokio::spawn(async move { c.get(|| counted(&runs, Duration::from_secs(1))).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let others: Vec<_> = (0..99)
            .map(|_| {
                let (c, runs) = (c.clone(), runs.clone());
                tokio::spawn(async move { c.get(|| counted(&runs, Duration::from_secs(1))).await })
            })
            .collect();
        assert_eq!(first.await.unwrap(), 1);
        // They arrived after the first computation started: it may predate what they ask about,
        // so one more runs for all of them.
        for other in others {
            assert_eq!(other.await.unwrap(), 2);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // A caller arriving after that gets a computation of its own.
        assert_eq!(c.get(|| counted(&runs, Duration::from_secs(1))).await, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_is_reused_within_its_window_and_not_after() {
        let c = Coalesced::new(Duration::from_secs(1));
        let runs = Arc::new(AtomicUsize::new(0));
        assert_eq!(c.get(|| counted(&runs, Duration::from_millis(100))).await, 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(c.get(|| counted(&runs, Duration::from_millis(100))).await, 1, "500 ms after it finished");
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(c.get(|| counted(&runs, Duration::from_millis(100))).await, 2, "1.2 s after it finished");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gives_up_leaves_nothing_half_done() {
        let c = Coalesced::new(Duration::from_secs(60));
        let runs = Arc::new(AtomicUsize::new(0));
        let gave_up = tokio::time::timeout(Duration::from_millis(10), c.get(|| counted(&runs, Duration::from_secs(1)))).await;
        assert!(gave_up.is_err());
        assert_eq!(c.get(|| counted(&runs, Duration::from_millis(1))).await, 2, "the next caller computes");
    }
}
