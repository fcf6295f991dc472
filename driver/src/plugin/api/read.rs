//! One read of one object, with a deadline: a GET from etcd (quorum), or first from the API
//! server's watch cache when what it holds there can be told current.

use std::time::Duration;

use kube::Api;
use kube::api::GetParams;
use vgpu_scheduling::ObjectName;

/// A failed read; the claim's prepare fails with it and the kubelet retries. Never a reason to
/// delete state: only a definite "not found" is.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The API server did not answer in time.
    #[error("reading {what}: no answer from the API server within {after:?}")]
    Timeout {
        /// The object.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// The API server answered with an error.
    #[error("reading {what}")]
    Api {
        /// The object.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// API reads in flight at once, for the whole process: more buy nothing from an API server
/// that answers a node's reads one or two at a time, and each one in flight beyond that is
/// another pooled connection (TLS state and buffers, about 30 KiB) that stays open after the
/// burst: 64 prepares in flight left 82 of them.
pub const API_READS_AT_ONCE: usize = 8;

static READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(API_READS_AT_ONCE);

/// One GET of `name` with `params`, within `after` (waiting for a turn included); `None` when
/// the API says it does not exist.
pub async fn get<K>(
    api: &Api<K>,
    name: &ObjectName,
    params: &GetParams,
    after: Duration,
    what: impl Fn() -> String,
) -> Result<Option<K>, SourceError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // The name is a validated DNS subdomain: it cannot add a path segment or a query to the URL.
    let read = async {
        // Never closed, so a permit always comes.
        let _turn = READS.acquire().await;
        api.get_with(name.as_str(), params).await
    };
    match tokio::time::timeout(after, read).await {
        Ok(Ok(found)) => Ok(Some(found)),
        Ok(Err(kube::Error::Api(status))) if status.is_not_found() => Ok(None),
        Ok(Err(source)) => Err(SourceError::Api { what: what(), source }),
        Err(_) => Err(SourceError::Timeout { what: what(), after }),
    }
}

/// What the watch cache's copy of an object proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    /// It is current enough to use (for a pod: the UID asked for; its containers never change).
    Current,
    /// It shows the object is not ours, in a way that does not change (allocated elsewhere).
    NotOurs,
    /// It may lag: read from etcd.
    Unsure,
}

/// `name` from the API server's watch cache (`resourceVersion=0`, no read from etcd) when
/// `judge` says that copy is [`Cached::Current`]; `None` when it says [`Cached::NotOurs`];
/// else a quorum GET within what is left of `after`.
///
/// # Errors
/// As [`get`].
pub async fn get_current<K>(
    api: &Api<K>,
    name: &ObjectName,
    after: Duration,
    what: impl Fn() -> String,
    judge: impl Fn(&K) -> Cached,
) -> Result<Option<K>, SourceError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = tokio::time::Instant::now();
    let seen = get(api, name, &GetParams::any(), after, &what).await?;
    match seen.as_ref().map(&judge) {
        Some(Cached::Current) => return Ok(seen),
        Some(Cached::NotOurs) => return Ok(None),
        Some(Cached::Unsure) | None => {}
    }
    get(api, name, &GetParams::default(), after.saturating_sub(started.elapsed()), what).await
}
