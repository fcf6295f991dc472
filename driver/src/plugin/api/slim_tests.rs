use super::*;
use serde_json::{Value, json};

/// A pod as the API server sends it: most of what a real one carries, none of which a prepare
/// reads, around the fields it does.
fn full_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainer-0",
            "namespace": "team-a",
            "uid": "0b6f3c0e-6a2c-4f57-9a55-2f0c1d3e4a5b",
            "labels": {"app": "trainer"},
            "annotations": {"note": "x"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ReplicationController", "name": "rc", "uid": "u"}],
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:containers": {}}}}]
        },
        "spec": {
            "nodeName": "node-1",
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "a", "path": "a"}]}},
                {"name": "proj", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
            ],
            "initContainers": [{"name": "fetch", "image": "busybox", "command": ["sh", "-c", "true"]}],
            "containers": [
                {"name": "main", "image": "cuda:12", "env": [{"name": "SECRET", "value": "s"}],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                 "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "gpu", "request": "r0"}]}},
                {"name": "sidecar", "image": "envoy", "resources": {"requests": {"memory": "64Mi"}}},
                {"name": "plain", "image": "busybox"}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h200"]}]}]}}}
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "trainer-0-gpu-x7k2p"}]
        }
    })
}

/// What the prepare keeps of `json`, parsed whole and slimmed, and parsed slim.
fn both(json: &Value) -> (Pod, Pod) {
    let whole: Pod = serde_json::from_value(json.clone()).unwrap();
    let read: PodRead = serde_json::from_value(json.clone()).unwrap();
    (pod(&whole), Pod::from(read))
}

/// The value at `path` (keys, and indexes of lists).
fn field<'a>(json: &'a mut Value, path: &[&str]) -> &'a mut Value {
    path.iter().fold(json, |at, p| match p.parse::<usize>() {
        Ok(i) => &mut at[i],
        Err(_) => &mut at[*p],
    })
}

/// The slim parser agrees with the whole one on `json`: the same pod kept, or both refuse it.
fn agree(json: &Value, case: &str) {
    let whole = serde_json::from_value::<Pod>(json.clone());
    let read = serde_json::from_value::<PodRead>(json.clone());
    match (whole, read) {
        (Ok(whole), Ok(read)) => assert_eq!(Pod::from(read), pod(&whole), "{case}"),
        (Err(_), Err(_)) => {}
        (whole, read) => panic!("{case}: whole parser {:?}, slim parser {:?}", whole.err(), read.err()),
    }
}

#[test]
fn a_pod_parsed_slim_is_the_whole_pod_slimmed() {
    let (whole, slim) = both(&full_pod());
    assert_eq!(slim, whole);
    // The fields the container check reads are there, not only equal.
    let spec = slim.spec.as_ref().unwrap();
    assert_eq!(spec.containers.len(), 3);
    assert_eq!(spec.containers[0].resources.as_ref().unwrap().claims.as_ref().unwrap()[0].name, "gpu");
    assert_eq!(spec.resource_claims.as_ref().unwrap()[0].resource_claim_template_name.as_deref(), Some("one-gpu"));
    let status = slim.status.as_ref().unwrap().resource_claim_statuses.as_ref().unwrap();
    assert_eq!(status[0].resource_claim_name.as_deref(), Some("trainer-0-gpu-x7k2p"));
    assert_eq!(slim.metadata.uid.as_deref(), Some("0b6f3c0e-6a2c-4f57-9a55-2f0c1d3e4a5b"));
}

#[test]
fn every_field_left_out_or_null_reads_as_the_whole_parser_reads_it() {
    // Each optional part of the pod removed or set to null in turn: the slim parser must agree
    // with the whole one on every shape the API server can send.
    let paths: &[&[&str]] = &[
        &["status"],
        &["status", "resourceClaimStatuses"],
        &["spec", "initContainers"],
        &["spec", "resourceClaims"],
        &["metadata", "namespace"],
        &["metadata", "uid"],
        &["spec", "containers", "0", "resources"],
        &["spec", "containers", "0", "resources", "claims"],
        &["spec", "containers", "2", "name"],
        &["spec", "containers"],
        &["spec", "resourceClaims"],
        &["spec"],
        &["metadata"],
    ];
    for path in paths {
        for null in [false, true] {
            let mut json = full_pod();
            let (last, parents) = path.split_last().unwrap();
            let at = field(&mut json, parents);
            if null {
                at[*last] = Value::Null;
            } else {
                at.as_object_mut().unwrap().remove(*last);
            }
            agree(&json, &format!("{path:?} {}", if null { "null" } else { "left out" }));
        }
    }
}

#[test]
fn a_pod_of_the_wrong_shape_is_refused_by_both() {
    // Where the whole parser refuses a field of the wrong type, the slim one must too, and
    // not make a pod up.
    let cases: &[(&str, &[&str], Value)] = &[
        ("containers not a list", &["spec", "containers"], json!("main")),
        ("a claim not an object", &["spec", "containers", "0", "resources", "claims"], json!(["gpu"])),
        ("the uid a number", &["metadata", "uid"], json!(7)),
        ("the claim statuses an object", &["status", "resourceClaimStatuses"], json!({"gpu": "x"})),
    ];
    for (case, path, value) in cases {
        let mut json = full_pod();
        *field(&mut json, path) = value.clone();
        assert!(serde_json::from_value::<Pod>(json.clone()).is_err(), "{case}: the whole parser takes it");
        agree(&json, case);
    }
}

#[test]
fn it_is_read_at_the_pod_url() {
    use kube::Resource;
    assert_eq!(PodRead::url_path(&(), Some("team-a")), Pod::url_path(&(), Some("team-a")));
    assert_eq!(PodRead::kind(&()), "Pod");
}
