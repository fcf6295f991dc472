//! Wire pins: bytes written by hand from the documented field numbers must decode to the right
//! fields, and our encodings must produce exactly those bytes.

use prost::Message;

use crate::{dra_v1, dra_v1beta1, health_v1alpha1, registration};

/// A length-delimited field: tag byte for (field, wire type 2), length, payload.
fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(field << 3) | 2, u8::try_from(payload.len()).unwrap()];
    out.extend_from_slice(payload);
    out
}

#[test]
fn v1_claim_fields_are_namespace_1_uid_2_name_3() {
    let bytes = [ld(1, b"ns"), ld(2, b"uid-1"), ld(3, b"claim")].concat();
    let claim = dra_v1::Claim::decode(bytes.as_slice()).unwrap();
    assert_eq!(claim.namespace, "ns");
    assert_eq!(claim.uid, "uid-1");
    assert_eq!(claim.name, "claim");
    assert_eq!(claim.encode_to_vec(), bytes);
}

#[test]
fn v1_device_pins_share_id_at_5() {
    let bytes =
        [ld(1, b"gpu"), ld(2, b"node-a"), ld(3, b"hami-gpu-0"), ld(4, b"k8s.x/claim=u-hami-gpu-0"), ld(5, b"share-1")].concat();
    let dev = dra_v1::Device::decode(bytes.as_slice()).unwrap();
    assert_eq!(dev.request_names, ["gpu"]);
    assert_eq!(dev.pool_name, "node-a");
    assert_eq!(dev.device_name, "hami-gpu-0");
    assert_eq!(dev.cdi_device_ids, ["k8s.x/claim=u-hami-gpu-0"]);
    assert_eq!(dev.share_id.as_deref(), Some("share-1"));
    assert_eq!(dev.encode_to_vec(), bytes);
}

#[test]
fn v1_unset_share_id_is_absent_on_the_wire() {
    let dev = dra_v1::Device { device_name: "d".into(), ..Default::default() };
    assert_eq!(dev.encode_to_vec(), ld(3, b"d"));
}

#[test]
fn v1beta1_device_ignores_a_share_id_from_a_newer_peer() {
    let bytes = [ld(3, b"hami-gpu-1"), ld(5, b"share-1")].concat();
    let dev = dra_v1beta1::Device::decode(bytes.as_slice()).unwrap();
    assert_eq!(dev.device_name, "hami-gpu-1");
    assert_eq!(dev.encode_to_vec(), ld(3, b"hami-gpu-1"));
}

#[test]
fn prepare_response_is_a_map_keyed_by_claim_uid_with_error_at_2() {
    // map entry: key = 1, value = 2; NodePrepareResourceResponse.error = 2.
    let value = ld(2, b"boom");
    let entry = [ld(1, b"uid-9"), ld(2, &value)].concat();
    let bytes = ld(1, &entry);
    let resp = dra_v1::NodePrepareResourcesResponse::decode(bytes.as_slice()).unwrap();
    assert_eq!(resp.claims["uid-9"].error, "boom");
    assert!(resp.claims["uid-9"].devices.is_empty());
}

#[test]
fn unprepare_response_error_is_field_1() {
    let value = ld(1, b"gone");
    let entry = [ld(1, b"u"), ld(2, &value)].concat();
    let resp = dra_v1::NodeUnprepareResourcesResponse::decode(ld(1, &entry).as_slice()).unwrap();
    assert_eq!(resp.claims["u"].error, "gone");
    let req = dra_v1::NodeUnprepareResourcesRequest { claims: vec![dra_v1::Claim { uid: "u".into(), ..Default::default() }] };
    assert_eq!(req.encode_to_vec(), ld(1, &ld(2, b"u")));
}

#[test]
fn plugin_info_fields() {
    let bytes =
        [ld(1, b"DRAPlugin"), ld(2, b"drv"), ld(3, b"/p/dra.sock"), ld(4, b"v1.DRAPlugin"), ld(4, b"v1beta1.DRAPlugin")].concat();
    let info = registration::PluginInfo::decode(bytes.as_slice()).unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "drv");
    assert_eq!(info.endpoint, "/p/dra.sock");
    assert_eq!(info.supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    assert_eq!(info.encode_to_vec(), bytes);

    // RegistrationStatus: bool plugin_registered = 1 (varint), string error = 2.
    let status = registration::RegistrationStatus::decode(&[0x08, 0x01, 0x12, 0x01, b'x'][..]).unwrap();
    assert!(status.plugin_registered);
    assert_eq!(status.error, "x");
}

#[test]
fn device_health_fields() {
    let id = [ld(1, b"pool"), ld(2, b"dev")].concat();
    // health = 2 (varint UNHEALTHY=2), last_updated_time = 3, timeout = 4, message = 5.
    let mut health = ld(1, &id);
    health.extend_from_slice(&[0x10, 0x02, 0x18, 0x2a, 0x20, 0x1e]);
    health.extend(ld(5, b"xid 79"));
    let resp = health_v1alpha1::NodeWatchResourcesResponse::decode(ld(1, &health).as_slice()).unwrap();
    let d = &resp.devices[0];
    let ident = d.device.as_ref().unwrap();
    assert_eq!((ident.pool_name.as_str(), ident.device_name.as_str()), ("pool", "dev"));
    assert_eq!(d.health(), health_v1alpha1::HealthStatus::Unhealthy);
    assert_eq!(d.last_updated_time, 42);
    assert_eq!(d.health_check_timeout_seconds, 30);
    assert_eq!(d.message, "xid 79");
}

#[test]
fn service_paths_match_the_kubelet() {
    use crate::dra_v1::dra_plugin_server::DraPluginServer;
    use crate::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer;
    use crate::registration::registration_server::RegistrationServer;
    use tonic::server::NamedService;
    assert_eq!(<DraPluginServer<()> as NamedService>::NAME, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin");
    assert_eq!(<RegistrationServer<()> as NamedService>::NAME, "pluginregistration.Registration");
    assert_eq!(<DraResourceHealthServer<()> as NamedService>::NAME, "v1alpha1.DRAResourceHealth");
}
