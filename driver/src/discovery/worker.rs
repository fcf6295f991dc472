//! One blocking call at a time on a thread of its own, waited for until a deadline and abandoned
//! after it. A call that hangs in the driver then blocks only its own thread; the caller sees the
//! call is still out and sends no other until it returns, so hung calls never pile up.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::time::Instant;

/// What [`Worker::start`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// A new call is running.
    Started,
    /// The call of an earlier round has not returned yet; none was started.
    StillRunning,
    /// The thread is gone (the call panicked); the worker must be replaced.
    Gone,
}

/// A thread that runs `call` each time it is asked to.
pub(crate) struct Worker<T> {
    requests: Sender<()>,
    answers: Receiver<T>,
    /// A call was asked for and its answer not yet taken.
    outstanding: bool,
}

impl<T: Send + 'static> Worker<T> {
    /// Starts the thread, named `name`; it ends once the worker is dropped and its call in flight
    /// (if any) has returned.
    ///
    /// # Errors
    /// When the thread cannot be created.
    pub(crate) fn spawn(name: String, call: impl Fn() -> T + Send + 'static) -> std::io::Result<Self> {
        let (requests, asked) = channel::<()>();
        let (answer, answers) = channel();
        std::thread::Builder::new().name(name).spawn(move || {
            while asked.recv().is_ok() {
                if answer.send(call()).is_err() {
                    return;
                }
            }
        })?;
        Ok(Self { requests, answers, outstanding: false })
    }

    /// Starts a call unless the previous one is still running. The late answer of a call that
    /// missed its deadline is dropped: it is stale by now.
    pub(crate) fn start(&mut self) -> Start {
        if self.outstanding {
            match self.answers.try_recv() {
                Ok(_) => self.outstanding = false,
                Err(TryRecvError::Empty) => return Start::StillRunning,
                Err(TryRecvError::Disconnected) => return Start::Gone,
            }
        }
        if self.requests.send(()).is_err() {
            return Start::Gone;
        }
        self.outstanding = true;
        Start::Started
    }

    /// The answer of the call in flight, waiting for it until `deadline`; `None` when it has not
    /// come by then (the call stays out) or no call is out.
    pub(crate) fn answer(&mut self, deadline: Instant) -> Option<T> {
        if !self.outstanding {
            return None;
        }
        match self.answers.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(value) => {
                self.outstanding = false;
                Some(value)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn answers_within_the_deadline_and_abandons_a_hung_call() {
        let hang = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let (h, c) = (hang.clone(), calls.clone());
        let mut worker = Worker::spawn("test-worker".into(), move || {
            c.fetch_add(1, Ordering::SeqCst);
            while h.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            7
        })
        .unwrap();
        let soon = || Instant::now() + Duration::from_millis(500);
        assert_eq!(worker.start(), Start::Started);
        assert_eq!(worker.answer(soon()), Some(7));
        assert_eq!(worker.answer(soon()), None, "no call out");

        hang.store(true, Ordering::SeqCst);
        assert_eq!(worker.start(), Start::Started);
        assert_eq!(worker.answer(Instant::now() + Duration::from_millis(50)), None, "hung");
        assert_eq!(worker.start(), Start::StillRunning, "no second call while the first hangs");
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        hang.store(false, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(worker.start(), Start::Started, "the late answer is dropped and a fresh call made");
        assert_eq!(worker.answer(soon()), Some(7));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_panicking_call_leaves_a_gone_worker() {
        let mut worker = Worker::<u8>::spawn("test-panic".into(), || panic!("driver bug")).unwrap();
        assert_eq!(worker.start(), Start::Started);
        assert_eq!(worker.answer(Instant::now() + Duration::from_secs(5)), None);
        assert_eq!(worker.start(), Start::Gone);
    }
}
