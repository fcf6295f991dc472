//! Blocking disk work: the checkpoint, the host files containers read, the NVIDIA toolkit's specs
//! and the trash of claim directories.

pub mod checkpoint;
pub mod held_spec;
pub mod host;
pub mod record_file;
pub mod spares;
pub mod toolkit;
pub mod trash;

/// Runs file work (fsync included) on a blocking thread and waits for it there, so that the
/// runtime's work stays on its workers. [`blocking`] hands the worker's core to another thread
/// instead, and over a burst every thread of the pool had then run the runtime's work (parsed
/// API answers), each keeping the stack that took. For work whose caller cannot be dropped
/// midway, or that may go on without it: the work finishes even if the caller is dropped.
pub(crate) async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    joined(tokio::task::spawn_blocking(f).await)
}

/// The output of a finished blocking task; its panic goes on in the caller.
pub(crate) fn joined<T>(result: Result<T, tokio::task::JoinError>) -> T {
    result.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Runs small synchronous file work (fsync included) without stalling the runtime's other tasks.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}
