//! The kubelet's own plugin manager and DRA client (kubelet-sim) register a trivial plugin written
//! against our `proto/` crate and get prepare/unprepare answers through v1 and v1beta1.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::{Request, Response, Status};
use vgpu_dra_integration::{KubeletSim, KubeletSimOptions};
use vgpu_dra_proto::registration::registration_server::{Registration, RegistrationServer};
use vgpu_dra_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use vgpu_dra_proto::{dra_v1, dra_v1beta1, service_names};

const DRIVER: &str = "trivial.vgpu-dra.test";

struct Registrar {
    endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: service_names::PLUGIN_TYPE_DRA.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec![service_names::DRA_V1.into(), service_names::DRA_V1BETA1.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        assert!(req.get_ref().plugin_registered, "kubelet refused: {}", req.get_ref().error);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Answers every claim with one device whose CDI ID names the claim.
struct Trivial;

fn device(uid: &str) -> dra_v1::Device {
    dra_v1::Device {
        request_names: vec!["gpu".into()],
        pool_name: "node-a".into(),
        device_name: "gpu-0".into(),
        cdi_device_ids: vec![format!("trivial.vgpu-dra.test/claim={uid}")],
        share_id: Some(format!("share-{uid}")),
    }
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for Trivial {
    async fn node_prepare_resources(
        &self,
        req: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        let claims = req.into_inner().claims.into_iter().map(|c| {
            (c.uid.clone(), dra_v1::NodePrepareResourceResponse { devices: vec![device(&c.uid)], error: String::new() })
        });
        Ok(Response::new(dra_v1::NodePrepareResourcesResponse { claims: claims.collect() }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        let claims =
            req.into_inner().claims.into_iter().map(|c| (c.uid, dra_v1::NodeUnprepareResourceResponse { error: String::new() }));
        Ok(Response::new(dra_v1::NodeUnprepareResourcesResponse { claims: claims.collect() }))
    }
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for Trivial {
    async fn node_prepare_resources(
        &self,
        req: Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims: HashMap<_, _> = req
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let d = device(&c.uid);
                let d = dra_v1beta1::Device {
                    request_names: d.request_names,
                    pool_name: d.pool_name,
                    device_name: d.device_name,
                    cdi_device_ids: d.cdi_device_ids,
                };
                (c.uid, dra_v1beta1::NodePrepareResourceResponse { devices: vec![d], error: String::new() })
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = req
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, dra_v1beta1::NodeUnprepareResourceResponse { error: String::new() }));
        Ok(Response::new(dra_v1beta1::NodeUnprepareResourcesResponse { claims: claims.collect() }))
    }
}

/// Serves the trivial plugin on `<dir>/registry/<driver>-reg.sock` and `<dir>/plugin/dra.sock`.
fn serve(rt: &tokio::runtime::Runtime, dir: &Path) -> PathBuf {
    let registry = dir.join("registry");
    let plugin = dir.join("plugin");
    std::fs::create_dir_all(&registry).unwrap();
    std::fs::create_dir_all(&plugin).unwrap();
    let endpoint = plugin.join("dra.sock");
    let _guard = rt.enter();
    // Without the authority shim the kubelet's registration call fails with PROTOCOL_ERROR.
    let dra = vgpu_dra::plugin::kubelet::uds::bind(&endpoint).unwrap();
    let reg = vgpu_dra::plugin::kubelet::uds::bind(&registry.join(format!("{DRIVER}-reg.sock"))).unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(Trivial))
            .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(Trivial))
            .serve_with_incoming(dra),
    );
    rt.spawn(
        tonic::transport::Server::builder().add_service(RegistrationServer::new(Registrar { endpoint })).serve_with_incoming(reg),
    );
    registry
}

fn roundtrip(services: Option<&str>) -> serde_json::Value {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let registry = serve(&rt, dir.path());
    let opts = KubeletSimOptions { services: services.map(str::to_owned), ..Default::default() };
    let mut kubelet = KubeletSim::start(&registry, DRIVER, &opts).unwrap();
    let registered = kubelet.wait_event("registered", Duration::from_secs(30), |e| e["driver"] == DRIVER).unwrap();
    assert!(registered.get("error").is_none(), "{registered}");
    let reply = kubelet.prepare(&[("default", "c1", "uid-1"), ("default", "c2", "uid-2")]).unwrap();
    assert!(reply.get("error").is_none(), "{reply}");
    let unprepared = kubelet.unprepare(&[("default", "c1", "uid-1")]).unwrap();
    assert!(unprepared["response"]["claims"]["uid-1"].is_object(), "{unprepared}");
    reply["response"].clone()
}

#[test]
fn v1_prepare_through_the_kubelets_client_carries_share_ids() {
    let response = roundtrip(None);
    for uid in ["uid-1", "uid-2"] {
        let dev = &response["claims"][uid]["devices"][0];
        assert_eq!(dev["device_name"], "gpu-0", "{response}");
        assert_eq!(dev["pool_name"], "node-a");
        assert_eq!(dev["cdi_device_ids"][0], format!("trivial.vgpu-dra.test/claim={uid}"));
        assert_eq!(dev["share_id"], format!("share-{uid}"));
    }
}

#[test]
fn v1beta1_prepare_through_the_kubelets_client_lacks_share_ids() {
    let response = roundtrip(Some("v1beta1.DRAPlugin"));
    let dev = &response["claims"]["uid-1"]["devices"][0];
    assert_eq!(dev["device_name"], "gpu-0", "{response}");
    assert!(dev.get("share_id").is_none(), "{response}");
}
