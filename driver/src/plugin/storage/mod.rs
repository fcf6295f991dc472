//! Blocking disk work: the checkpoint, the host files containers read, the NVIDIA toolkit's specs
//! and the trash of claim directories.

pub mod checkpoint;
pub mod held_spec;
pub mod host;
pub mod spares;
pub mod toolkit;
pub mod trash;

/// Runs small synchronous file work (fsync included) without stalling the runtime's other tasks.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}
