//! The probes' side of the kubelet plugin: one real gRPC call on each of its two sockets, under a
//! deadline, so a server that still accepts connections but no longer answers fails `/healthz`
//! (and the kubelet restarts the container) instead of hanging it.
//!
//! Both calls change nothing. On the registration socket, `GetInfo`: what the kubelet's plugin
//! watcher asks at registration. On the DRA socket, `NodePrepareResources` (v1) with no claims:
//! the service maps over the claims it is given, so an empty batch takes no state lock, writes no
//! checkpoint, counts nothing in the prepare metrics and logs nothing; it still goes through the
//! socket, the HTTP/2 shim and the DRA service the kubelet calls.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Uri};
use vgpu_dra_proto::dra_v1::NodePrepareResourcesRequest;
use vgpu_dra_proto::dra_v1::dra_plugin_client::DraPluginClient;
use vgpu_dra_proto::registration::InfoRequest;
use vgpu_dra_proto::registration::registration_client::RegistrationClient;

use super::Paths;

/// How long one socket's check (connecting and the call) may take before it counts as failed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The kubelet plugin's two sockets.
#[derive(Debug, Clone)]
pub struct PluginSockets {
    /// The plugin-registration socket the kubelet's plugin watcher dials.
    pub registration: PathBuf,
    /// The DRA service socket the kubelet prepares and unprepares claims on.
    pub dra: PathBuf,
}

impl From<&Paths> for PluginSockets {
    fn from(paths: &Paths) -> Self {
        Self { registration: paths.registration_socket.clone(), dra: paths.dra_socket.clone() }
    }
}

/// Which of the two sockets a check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Socket {
    /// The plugin-registration socket, asked `GetInfo`.
    Registration,
    /// The DRA service socket, asked `NodePrepareResources` with no claims.
    Dra,
}

impl Socket {
    /// The call the check makes on this socket.
    pub fn call(self) -> &'static str {
        match self {
            Self::Registration => "GetInfo",
            Self::Dra => "NodePrepareResources",
        }
    }
}

impl std::fmt::Display for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Registration => "registration",
            Self::Dra => "DRA",
        })
    }
}

/// What went wrong with one socket.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The connection was refused or the socket is missing.
    #[error("connecting: {0}")]
    Connect(String),
    /// Connecting or the call took longer than the deadline.
    #[error("{step}: no answer within {timeout:?}")]
    Timeout {
        /// `connecting`, or the call.
        step: &'static str,
        /// The deadline.
        timeout: Duration,
    },
    /// The server answered the call with an error.
    #[error("{call} answered {code:?}: {message}")]
    Status {
        /// The call.
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
}

/// One socket that failed its check.
#[derive(Debug, thiserror::Error)]
#[error("{socket} socket {}: {failure}", path.display())]
pub struct ProbeError {
    /// Which socket.
    pub socket: Socket,
    /// Where it is.
    pub path: PathBuf,
    /// What went wrong.
    pub failure: Failure,
}

impl PluginSockets {
    /// Makes both calls at once, each under `timeout`.
    ///
    /// # Errors
    /// One [`ProbeError`] per socket that failed, the registration socket first.
    pub async fn check(&self, timeout: Duration) -> Result<(), Vec<ProbeError>> {
        let (registration, dra) =
            tokio::join!(check(Socket::Registration, &self.registration, timeout), check(Socket::Dra, &self.dra, timeout));
        let failed: Vec<ProbeError> = [registration, dra].into_iter().filter_map(Result::err).collect();
        if failed.is_empty() { Ok(()) } else { Err(failed) }
    }
}

/// Connects to `path` and makes `socket`'s call, both before `timeout` is up.
async fn check(socket: Socket, path: &Path, timeout: Duration) -> Result<(), ProbeError> {
    let deadline = Instant::now() + timeout;
    let fail = |failure| ProbeError { socket, path: path.to_owned(), failure };
    let channel = match tokio::time::timeout_at(deadline, connect(path)).await {
        Err(_) => return Err(fail(Failure::Timeout { step: "connecting", timeout })),
        Ok(Err(e)) => return Err(fail(Failure::Connect(chain(&e)))),
        Ok(Ok(channel)) => channel,
    };
    match tokio::time::timeout_at(deadline, call(socket, channel)).await {
        Err(_) => Err(fail(Failure::Timeout { step: socket.call(), timeout })),
        Ok(Err(status)) => {
            Err(fail(Failure::Status { call: socket.call(), code: status.code(), message: status.message().to_owned() }))
        }
        Ok(Ok(())) => Ok(()),
    }
}

/// A channel whose every connection goes to the unix socket at `path`.
async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_owned();
    // The URI only fills the requests' authority.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
}

/// `socket`'s call; the answer's content does not matter, only that it came.
async fn call(socket: Socket, channel: Channel) -> Result<(), tonic::Status> {
    match socket {
        Socket::Registration => RegistrationClient::new(channel).get_info(InfoRequest {}).await.map(drop),
        Socket::Dra => DraPluginClient::new(channel)
            .node_prepare_resources(NodePrepareResourcesRequest { claims: Vec::new() })
            .await
            .map(drop),
    }
}

/// `e` and its causes, each said once: tonic's transport errors either print their cause
/// themselves or say only "transport error".
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    if parts.len() > 1 && parts[0] == "transport error" {
        parts.remove(0);
    }
    parts.join(": ")
}
