//! The API server: reads of claims one at a time and of this node's pods and their claims read
//! ahead; and what the driver writes on claims, events and `status.devices` (`status`). Every
//! call has a deadline.

pub mod node_pods;
mod pod_store;
pub mod read;
mod slim;
pub mod source;
pub mod status;

pub use self::read::SourceError;
pub use self::source::{ClaimCache, ClaimEvent, ClaimSource, DEFAULT_API_TIMEOUT};
