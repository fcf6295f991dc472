//! Reads from the API server, and nothing else: claims one at a time, this node's pods and their
//! claims read ahead, and the events recorded on claims. Every call has a deadline.

pub mod node_pods;
pub mod read;
mod slim;
pub mod source;

pub use self::read::SourceError;
pub use self::source::{ClaimCache, ClaimEvent, ClaimSource, DEFAULT_API_TIMEOUT};
