//! The kubelet's side of the DRA v1 gRPC protocol, over a plugin's Unix socket, timed per call.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use vgpu_dra_proto::dra_v1::dra_plugin_client::DraPluginClient;
use vgpu_dra_proto::dra_v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};

/// One claim as the kubelet names it.
#[derive(Debug, Clone)]
pub struct ClaimId {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The node (pool) the scheduler allocated it on.
    pub node: String,
}

impl ClaimId {
    fn wire(&self) -> Claim {
        Claim { namespace: self.namespace.clone(), name: self.name.clone(), uid: self.uid.clone() }
    }
}

/// A connection to one plugin's DRA service.
#[derive(Clone)]
pub struct Plugin {
    client: DraPluginClient<Channel>,
}

impl Plugin {
    /// Connects to the DRA service socket at `socket`, waiting up to `timeout` for it to appear.
    pub async fn connect(socket: &Path, timeout: Duration) -> anyhow::Result<Self> {
        let deadline = Instant::now() + timeout;
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!("{} did not appear within {timeout:?}", socket.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let path: PathBuf = socket.to_owned();
        // The URI is only a placeholder: every connection goes to the socket.
        let channel = Endpoint::try_from("http://localhost")?
            .connect_timeout(timeout)
            .timeout(Duration::from_secs(30))
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
            }))
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(Self { client: DraPluginClient::new(channel) })
    }

    /// NodePrepareResources for `claims` in one call; fails when any claim got an error.
    pub async fn prepare(&self, claims: &[ClaimId]) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let request = NodePrepareResourcesRequest { claims: claims.iter().map(ClaimId::wire).collect() };
        let reply = self.client.clone().node_prepare_resources(request).await.context("NodePrepareResources")?.into_inner();
        let took = started.elapsed();
        for c in claims {
            match reply.claims.get(&c.uid) {
                Some(r) if r.error.is_empty() && !r.devices.is_empty() => {}
                Some(r) => {
                    bail!("prepare {}/{}: {}", c.namespace, c.name, if r.error.is_empty() { "no devices" } else { &r.error })
                }
                None => bail!("prepare {}/{}: no answer", c.namespace, c.name),
            }
        }
        Ok(took)
    }

    /// NodeUnprepareResources for `claims` in one call; fails when any claim got an error.
    pub async fn unprepare(&self, claims: &[ClaimId]) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let request = NodeUnprepareResourcesRequest { claims: claims.iter().map(ClaimId::wire).collect() };
        let reply = self.client.clone().node_unprepare_resources(request).await.context("NodeUnprepareResources")?.into_inner();
        let took = started.elapsed();
        for c in claims {
            match reply.claims.get(&c.uid) {
                Some(r) if r.error.is_empty() => {}
                Some(r) => bail!("unprepare {}/{}: {}", c.namespace, c.name, r.error),
                None => bail!("unprepare {}/{}: no answer", c.namespace, c.name),
            }
        }
        Ok(took)
    }
}
