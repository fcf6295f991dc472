//! Where the node's GPUs come from: NVML on a real node, a mock inventory elsewhere.
//!
//! The daemon never reads a source on its async runtime: the [`DeviceLoop`] reads it on threads
//! of its own, card by card, each read under a deadline, and shares the result as a snapshot
//! ([`SnapshotSource`]) that the publisher, prepare, metrics and the health stream read without
//! I/O. One-shot commands (`inventory`, `prepare-preview`) read a source directly.

pub mod device_loop;
pub mod mock;
pub mod mock_file;
pub mod nvml;
pub mod snapshot;
pub mod source;
mod worker;
pub mod xid;

pub use device_loop::{DeviceLoop, DeviceLoopOptions};
pub use mock::MockSpecError;
pub use mock_file::MockFileSource;
pub use snapshot::SnapshotSource;
pub use source::{CardList, DeviceSource, DiscoveryError, read_all};
