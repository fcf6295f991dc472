//! One computation at a time, shared by every caller it can answer: what keeps the HTTP
//! endpoints' work bounded however many requests arrive. Anyone who can reach the metrics port
//! can send requests; each `/healthz` makes two gRPC calls into the plugin and each `/metrics`
//! takes the state lock, so without this a flood of requests is a flood of that work.
//!
//! A caller gets the result of a computation that started after it arrived, so nothing it reads
//! predates its request (a probe right after a socket breaks sees it broken); otherwise it
//! computes, and callers arriving meanwhile wait for that result or the next.

use std::future::Future;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// The last result and when its computation started.
#[derive(Debug)]
pub struct Coalesced<T> {
    last: Mutex<Option<(Instant, T)>>,
}

impl<T: Clone> Default for Coalesced<T> {
    fn default() -> Self {
        Self { last: Mutex::new(None) }
    }
}

impl<T: Clone> Coalesced<T> {
    /// A result computed after the caller arrived, computing it with `compute` if there is
    /// none. A caller that gives up (its future dropped) while computing leaves no result; the
    /// next caller computes.
    pub async fn get<F, Fut>(&self, compute: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let arrived = Instant::now();
        let mut last = self.last.lock().await;
        if let Some((started, value)) = &*last
            && *started >= arrived
        {
            return value.clone();
        }
        let started = Instant::now();
        let value = compute().await;
        *last = Some((started, value.clone()));
        value
    }

    /// Holds every computation off until the guard is dropped: for tests that need callers
    /// parked at [`Coalesced::get`].
    #[cfg(test)]
    pub(crate) async fn hold(&self) -> tokio::sync::MutexGuard<'_, Option<(Instant, T)>> {
        self.last.lock().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

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
        let c = Arc::new(Coalesced::default());
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
    async fn a_caller_that_gives_up_leaves_nothing_half_done() {
        let c = Coalesced::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let gave_up = tokio::time::timeout(Duration::from_millis(10), c.get(|| counted(&runs, Duration::from_secs(1)))).await;
        assert!(gave_up.is_err());
        assert_eq!(c.get(|| counted(&runs, Duration::from_millis(1))).await, 2, "the next caller computes");
    }
}
