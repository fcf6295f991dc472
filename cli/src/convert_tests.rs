#![allow(clippy::unwrap_used)]

use serde_json::json;
use vgpu_scheduling::compat::{CardModel, FlavourOptions, flavours};

use super::*;

fn both() -> Vec<CompatSettings> {
    flavours(None, &FlavourOptions::default())
}

fn t4() -> ClassFacts {
    ClassFacts::new([CardModel { product_name: "Tesla T4".into(), memory_bytes: 15 << 30 }], 2)
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team-a, labels: {app: web}}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}, annotations: {nvidia.com/use-gputype: "T4"}}
    spec:
      containers:
      - name: cuda
        image: cuda
        resources:
          limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, cpu: 2}
"#;

#[test]
fn a_deployments_template_is_converted_as_the_webhook_converts_its_pods() {
    let docs = documents(DEPLOYMENT).unwrap();
    let Outcome::Converted { object, templates, warnings } = convert_object(&docs[0], &both(), &t4()) else {
        panic!("not converted")
    };
    assert!(warnings.is_empty(), "{warnings:?}");
    // Everything but the GPU resources is as written, the numbers included.
    assert_eq!(object["spec"]["replicas"], 3);
    assert_eq!(object["metadata"]["labels"]["app"], "web");
    let container = &object["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["resources"]["limits"], json!({"cpu": 2}));
    let entry = &object["spec"]["template"]["spec"]["resourceClaims"][0];
    assert_eq!(container["resources"]["claims"][0]["name"], entry["name"]);
    // The template is the one the webhook makes for the same pod: same name, same content.
    let mut pod: Value = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "team-a", "annotations": {"nvidia.com/use-gputype": "T4"}},
        "spec": docs[0]["spec"]["template"]["spec"].clone(),
    }))
    .unwrap();
    quantities_as_strings(&mut pod);
    let from_webhook = compat::convert_pod(&serde_json::from_value(pod).unwrap(), &both()[0], &t4()).unwrap();
    assert_eq!(templates.len(), 1);
    assert_eq!(entry["resourceClaimTemplateName"], templates[0]["metadata"]["name"]);
    assert_eq!(templates[0]["metadata"]["name"], json!(from_webhook.templates[0].metadata.name));
    assert_eq!(templates[0]["spec"], serde_json::to_value(&from_webhook.templates[0].spec).unwrap());
    assert_eq!(templates[0]["kind"], "ResourceClaimTemplate");
}

#[test]
fn every_kind_with_pods_is_found_where_it_keeps_them() {
    let spec = json!({"containers": [{"name": "c", "image": "i", "resources": {"limits": {"volcano.sh/vgpu-number": 1}}}]});
    let template = json!({"metadata": {}, "spec": spec});
    let objects = [
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}),
        json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "r"}, "spec": {"template": template}}),
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"}, "spec": {"template": template}}),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"}, "spec": {"template": template}}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"}, "spec": {"template": template}}),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": template}}),
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
               "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}),
        json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vj"},
               "spec": {"tasks": [{"name": "t", "replicas": 1, "template": template}]}}),
    ];
    for object in objects {
        let outcome = convert_object(&object, &both(), &t4());
        let Outcome::Converted { object: out, templates, .. } = outcome else { panic!("{}: {outcome:?}", label(&object)) };
        assert_eq!(templates.len(), 1, "{}", label(&object));
        let text = out.to_string();
        assert!(!text.contains("volcano.sh/vgpu-number") && text.contains("resourceClaimTemplateName"), "{text}");
    }
    // Kinds without pods, and pods without our resources, are left alone.
    for object in [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"nvidia.com/gpu": "1"}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}),
        json!({"apiVersion": "example.com/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"template": template}}),
    ] {
        assert_eq!(convert_object(&object, &both(), &t4()), Outcome::Unchanged, "{object}");
    }
}

#[test]
fn what_the_webhook_denies_is_refused_with_its_message_and_warnings_are_kept() {
    let privileged = DEPLOYMENT.replace("image: cuda", "image: cuda\n        securityContext: {privileged: true}");
    let Outcome::Refused(message) = convert_object(&documents(&privileged).unwrap()[0], &both(), &t4()) else { panic!() };
    assert!(message.contains("container \"cuda\" is privileged and asks for nvidia.com/gpu"), "{message}");
    let mixed = DEPLOYMENT.replace("cpu: 2", "volcano.sh/vgpu-cores: 10");
    let Outcome::Refused(message) = convert_object(&documents(&mixed).unwrap()[0], &both(), &t4()) else { panic!() };
    assert!(message.contains("mixes two sets"), "{message}");
    let clamped = DEPLOYMENT.replace("cpu: 2", "nvidia.com/gpucores: 150");
    let Outcome::Converted { warnings, .. } = convert_object(&documents(&clamped).unwrap()[0], &both(), &t4()) else { panic!() };
    assert!(warnings.iter().any(|w| w.contains("150")), "{warnings:?}");
}

#[test]
fn lists_and_documents_flatten_and_each_template_is_listed_once_per_namespace() {
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}\n---\n---\n{}",
        serde_json::to_string(&documents(DEPLOYMENT).unwrap()[0]).unwrap(),
        DEPLOYMENT.replace("name: web,", "name: web2,")
    );
    let docs = documents(&list).unwrap();
    assert_eq!(docs.len(), 2, "{docs:?}");
    let p = preview(docs, &both(), &t4());
    assert_eq!(p.documents.len(), 2);
    assert_eq!(p.templates.len(), 1, "one shape, one namespace: {:?}", p.templates);
    assert_eq!(p.templates[0]["metadata"]["namespace"], "team-a");
    assert!(p.refusals.is_empty());
    assert_eq!(label(&p.documents[1]), "Deployment/web2 in team-a");
    assert!(documents("a: [").is_err());
}
