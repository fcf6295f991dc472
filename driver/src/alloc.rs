//! The memory allocator after a burst. glibc's malloc keeps the pages a burst of prepares freed
//! (the holes between what is still live) resident until the process exits: 64 prepares in
//! flight left the daemon about 10 MiB above what its claims hold (BENCHMARKS.md, issue 35).
//! Once prepares and unprepares have been quiet for a second, the free pages go back to the
//! kernel. The one call into C is `malloc_trim(3)`.
#![allow(unsafe_code)]

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long no claim may be prepared or unprepared before the allocator is trimmed.
pub const QUIET: Duration = Duration::from_secs(1);

/// Returns the free pages of every malloc arena to the kernel; whether any were returned.
pub fn trim() -> bool {
    // SAFETY: malloc_trim takes no pointer and only walks glibc's own heap under its locks;
    // a pad of 0 keeps nothing spare at the top of the heap.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Trims the allocator ([`trim`], on a blocking thread) after each burst of changes that
/// `changes` announces, once [`QUIET`] has passed without another, until `cancel`. Idle, it
/// waits for the next change and costs nothing.
pub async fn trim_after_bursts(changes: watch::Receiver<u64>, cancel: CancellationToken) {
    after_bursts(changes, cancel, trim).await;
}

/// Runs `act` on a blocking thread after each burst of `changes`, as [`trim_after_bursts`].
async fn after_bursts(mut changes: watch::Receiver<u64>, cancel: CancellationToken, act: fn() -> bool) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = tokio::time::timeout(QUIET, changes.changed()) => match changed {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => break,
                },
            }
        }
        let returned = tokio::task::spawn_blocking(act).await.unwrap_or(false);
        tracing::debug!(returned, "allocator trimmed after a burst of prepares and unprepares");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_freed_by_a_burst_goes_back_to_the_kernel() {
        // Many small blocks, one in eight kept: the freed runs between them are holes of whole
        // pages the heap cannot shrink past, which only a trim returns.
        let blocks: Vec<Vec<u8>> = (0..20_000).map(|i| vec![u8::try_from(i % 251).unwrap(); 2048]).collect();
        let kept: Vec<Vec<u8>> = blocks.into_iter().step_by(8).collect();
        assert!(trim(), "35 MiB of holes and nothing returned");
        assert_eq!(kept.len(), 2_500);
    }

    static ACTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn counted() -> bool {
        ACTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    }

    fn acts() -> usize {
        ACTS.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn one_trim_per_burst_once_it_has_been_quiet_for_a_second() {
        let (tx, rx) = watch::channel(0u64);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(after_bursts(rx, cancel.clone(), counted));
        tokio::time::sleep(QUIET * 3).await;
        assert_eq!(acts(), 0, "nothing changed: no trim");
        for burst in 1..=2 {
            for i in 0..5 {
                tx.send_replace(burst * 10 + i);
                tokio::time::sleep(QUIET / 2).await;
            }
            assert_eq!(acts(), burst as usize - 1, "not while changes keep coming");
            tokio::time::sleep(QUIET * 2).await;
            assert_eq!(acts(), burst as usize, "once after the burst");
        }
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(1), task).await.unwrap().unwrap();
    }
}
