use k8s_openapi::api::core::v1::ResourceClaim as ContainerClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use serde_json::json;

use super::*;
use crate::compat::fixtures::*;

fn hami() -> CompatSettings {
    CompatSettings::hami()
}

/// The seed pod of source document 003, section 3.1.
fn seed_pod(name: &str) -> Pod {
    let mut c = container("cuda", &[(GPU, "1"), (MEM, "4096"), (CORES, "50"), ("cpu", "1")]);
    c.command = Some(vec!["bash".into(), "-c".into(), "nvidia-smi && sleep 3600".into()]);
    pod(name, vec![c], &[])
}

/// Checks that the patch turns the input into the returned pod, field for field.
fn assert_patch_matches(input: &Pod, conv: &PodConversion) {
    let mut doc = serde_json::to_value(input).unwrap();
    apply_patch(&mut doc, &conv.patch);
    assert_eq!(doc, serde_json::to_value(&conv.pod).unwrap());
}

#[test]
fn seed_pod_references_one_template_and_loses_its_hami_resources() {
    let input = seed_pod("hami-compatible-smoke");
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert!(conv.changed());
    assert_eq!(conv.templates.len(), 1);
    let template = &conv.templates[0];
    let name = template.metadata.name.clone().unwrap();
    assert_eq!(name, "hami-vgpu-f0729609fe2abd5a");
    assert_eq!(template.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"], "vgpu-dra");
    let spec = serde_json::to_value(conv.pod.spec.as_ref().unwrap()).unwrap();
    assert_eq!(spec["containers"][0]["resources"], json!({"limits": {"cpu": "1"}, "claims": [{"name": "vgpu-cuda"}]}));
    assert_eq!(spec["resourceClaims"], json!([{"name": "vgpu-cuda", "resourceClaimTemplateName": name}]));
    assert_eq!(
        conv.patch,
        [
            json!({"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"}),
            json!({"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores"}),
            json!({"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpumem"}),
            json!({"op": "add", "path": "/spec/containers/0/resources/claims", "value": [{"name": "vgpu-cuda"}]}),
            json!({"op": "add", "path": "/spec/resourceClaims", "value": [{"name": "vgpu-cuda", "resourceClaimTemplateName": name}]}),
        ]
    );
    assert_patch_matches(&input, &conv);
    assert!(conv.warnings.is_empty());
}

#[test]
fn a_converted_pod_is_left_alone() {
    let first = convert_pod(&seed_pod("p"), &hami(), &t4_facts()).unwrap();
    let again = convert_pod(&first.pod, &hami(), &t4_facts()).unwrap();
    assert!(!again.changed());
    assert!(again.templates.is_empty());
    assert_eq!(again.pod, first.pod);
}

#[test]
fn a_pod_without_hami_resources_is_unchanged_and_not_warned() {
    let input = pod("web", vec![container("nginx", &[("cpu", "1")])], &[("hami.io/gpu-scheduler-policy", "binpack")]);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert!(!conv.changed());
    assert_eq!(conv.pod, input);
    assert!(conv.warnings.is_empty() && conv.templates.is_empty());
}

#[test]
fn fifty_pods_of_one_shape_share_one_template() {
    let names: std::collections::BTreeSet<String> = (0..50)
        .map(|i| convert_pod(&seed_pod(&format!("job-{i}")), &hami(), &t4_facts()).unwrap())
        .map(|c| c.templates[0].metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn init_and_second_containers_get_their_own_claims() {
    let mut input = pod(
        "train",
        vec![container("main", &[(GPU, "1"), (MEM, "2048")]), container("side", &[(CORES, "20")]), container("log", &[])],
        &[],
    );
    input.spec.as_mut().unwrap().init_containers = Some(vec![container("warmup", &[(PCT, "100")])]);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    let spec = conv.pod.spec.as_ref().unwrap();
    let entries: Vec<&str> = spec.resource_claims.as_ref().unwrap().iter().map(|c| c.name.as_str()).collect();
    assert_eq!(entries, ["vgpu-warmup", "vgpu-main", "vgpu-side"]);
    assert_eq!(conv.templates.len(), 3);
    let init = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.resources.as_ref().unwrap().claims.as_ref().unwrap()[0].name, "vgpu-warmup");
    assert!(spec.containers[2].resources.as_ref().unwrap().claims.is_none());
    assert!(conv.patch.iter().any(|op| op["path"] == "/spec/initContainers/0/resources/claims"));
    assert_patch_matches(&input, &conv);
}

#[test]
fn two_containers_of_one_shape_share_the_template_but_not_the_claim() {
    let input = pod("two", vec![container("a", &[(GPU, "1"), (MEM, "1024")]), container("b", &[(GPU, "1"), (MEM, "1024")])], &[]);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert_eq!(conv.templates.len(), 1);
    assert_eq!(conv.pod.spec.unwrap().resource_claims.unwrap().len(), 2);
}

#[test]
fn existing_claims_are_appended_to() {
    let mut c = container("cuda", &[(GPU, "1")]);
    c.resources.as_mut().unwrap().claims = Some(vec![ContainerClaim { name: "nic".into(), request: None }]);
    let mut input = pod("p", vec![c], &[]);
    input.spec.as_mut().unwrap().resource_claims =
        Some(vec![PodResourceClaim { name: "nic".into(), resource_claim_name: Some("rdma".into()), ..Default::default() }]);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert!(conv.patch.iter().any(|op| op["path"] == "/spec/containers/0/resources/claims/-"));
    assert!(conv.patch.iter().any(|op| op["path"] == "/spec/resourceClaims/-"));
    assert_eq!(conv.pod.spec.as_ref().unwrap().resource_claims.as_ref().unwrap().len(), 2);
    assert_patch_matches(&input, &conv);
}

#[test]
fn hami_resources_in_requests_are_removed_too() {
    let input = pod("p", vec![with_requests("cuda", &[(GPU, "1")], &[(GPU, "1"), ("cpu", "1")])], &[]);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    let r = conv.pod.spec.as_ref().unwrap().containers[0].resources.clone().unwrap();
    assert_eq!(r.limits, None, "no empty limits are left behind");
    assert_eq!(r.requests.unwrap().keys().collect::<Vec<_>>(), ["cpu"]);
    assert!(conv.patch.iter().any(|op| op == &json!({"op": "remove", "path": "/spec/containers/0/resources/limits"})));
    assert!(conv.patch.iter().any(|op| op["path"] == "/spec/containers/0/resources/requests/nvidia.com~1gpu"));
    assert_patch_matches(&input, &conv);
}

#[test]
fn containers_asking_no_device_are_stripped_without_a_claim() {
    let input = pod("p", vec![container("cuda", &[(GPU, "0"), (PRIO, "1")])], &[]);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert!(conv.changed() && conv.templates.is_empty());
    assert!(conv.pod.spec.as_ref().unwrap().resource_claims.is_none());
    assert_eq!(conv.warnings.len(), 1);
    assert_patch_matches(&input, &conv);
}

#[test]
fn one_bad_container_denies_the_whole_pod() {
    let input = pod("p", vec![container("ok", &[(GPU, "1")]), privileged(container("root", &[(MEM, "1024")]))], &[]);
    let e = convert_pod(&input, &hami(), &t4_facts()).unwrap_err();
    assert_eq!(e.reason(), "privileged");
    assert!(e.to_string().contains("\"root\"") && e.to_string().contains(MEM), "{e}");
}

#[test]
fn our_entries_are_recognised_and_foreign_ones_not_overwritten() {
    let converted = convert_pod(&seed_pod("p"), &hami(), &t4_facts()).unwrap().pod;
    let mut again = converted.clone();
    again.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap()
        .insert(GPU.into(), KubeQuantity("1".into()));
    let e = convert_pod(&again, &hami(), &t4_facts()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "container \"cuda\": nvidia.com/gpu: the container already has a vgpu-dra claim and asks for HAMi resources again"
    );
    let mut foreign = seed_pod("p");
    foreign.spec.as_mut().unwrap().resource_claims =
        Some(vec![PodResourceClaim { name: "vgpu-cuda".into(), resource_claim_name: Some("mine".into()), ..Default::default() }]);
    assert_eq!(convert_pod(&foreign, &hami(), &t4_facts()).unwrap_err().reason(), "claim_name_taken");
}

#[test]
fn annotations_become_selectors_and_warnings() {
    let annotations = [
        ("nvidia.com/use-gputype", r#"T4"] || true || [""#),
        ("nvidia.com/vgpu-mode", "hami-core"),
        ("hami.io/node-scheduler-policy", "binpack"),
    ];
    let input = pod("p", vec![container("cuda", &[(GPU, "1")])], &annotations);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert_eq!(conv.warnings.len(), 1, "{:?}", conv.warnings);
    let selectors =
        &conv.templates[0].spec.spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0].exactly.as_ref().unwrap().selectors;
    assert_eq!(selectors.as_ref().unwrap().len(), 1);
    // hami-core is what a pod without the annotation gets: the same template.
    let unset = pod("p", vec![container("cuda", &[(GPU, "1")])], &annotations[..1]);
    assert_eq!(convert_pod(&unset, &hami(), &t4_facts()).unwrap().templates, conv.templates);
}

#[test]
fn volcano_task_templates_are_patched_at_their_own_path() {
    let spec = pod("t", vec![container("worker", &[("volcano.sh/vgpu-memory", "2000"), ("volcano.sh/vgpu-cores", "30")])], &[])
        .spec
        .unwrap();
    let path = "/spec/tasks/1/template/spec";
    let conv =
        convert_pod_spec(&annotations(&[]), &spec, Some("volcano"), path, &CompatSettings::volcano(), &t4_facts()).unwrap();
    assert!(conv.patch.iter().all(|op| op["path"].as_str().unwrap().starts_with("/spec/tasks/1/template/spec/")));
    // Volcano's pods keep a request (the cpu Volcano's scheduler counts, see volcano.rs).
    assert!(conv.patch.iter().any(|op| op["path"] == "/spec/tasks/1/template/spec/containers/0/resources/requests"));
    let requests =
        serde_json::to_value(&conv.templates[0].spec).unwrap()["spec"]["devices"]["requests"][0]["exactly"]["capacity"].clone();
    assert_eq!(requests, json!({"requests": {"cores": "30", "memory": (2000u64 << 20).to_string()}}));
}

#[test]
fn claim_entry_names_are_dns_labels() {
    assert_eq!(claim_entry_name("cuda"), "vgpu-cuda");
    let long = "a".repeat(63);
    let other = format!("{}b", "a".repeat(62));
    let (n1, n2) = (claim_entry_name(&long), claim_entry_name(&other));
    assert!(n1.len() <= 63 && n2.len() <= 63);
    assert_ne!(n1, n2);
}

#[test]
fn match_conditions_mention_every_configured_name() {
    let pod_expr = pod_match_condition(&hami());
    for name in [GPU, MEM, PCT, CORES, PRIO, "nvidia.com/mig-"] {
        assert!(pod_expr.contains(&format!("\"{name}\"")), "{name} missing from {pod_expr}");
    }
    assert!(pod_expr.starts_with("has(object.spec) && ((has(object.spec.initContainers) ? object.spec.initContainers : [])"));
    assert!(pod_expr.contains("c.resources.limits.exists(k, ") && pod_expr.contains("c.resources.requests.exists(k, "));
    let volcano = pod_match_condition(&CompatSettings::volcano());
    assert!(volcano.contains("\"volcano.sh/vgpu-memory-percentage\"") && !volcano.contains("\"nvidia.com/gpu\""));
    let job = job_match_condition(&CompatSettings::volcano());
    assert!(job.contains("object.spec.tasks.exists(t, ") && job.contains("t.template.spec.containers"));
    // Configured names are escaped like annotation values.
    let odd = CompatSettings { count_resource: r#"x"] || true || ["#.into(), ..hami() };
    let (shape, _) = cel_skeleton(&pod_match_condition(&odd));
    assert_eq!(shape, cel_skeleton(&pod_expr).0);
}

/// HAMi's examples/nvidia/dynamic_mig_example.yaml: `vgpu-mode: mig`, two cards of 8000 MiB.
#[test]
fn mig_mode_asks_instances_on_the_mig_class() {
    let annotations = [("nvidia.com/vgpu-mode", "mig"), ("hami.io/gpu-scheduler-policy", "binpack")];
    let input = pod("p", vec![container("cuda", &[(GPU, "2"), (MEM, "8000"), (CORES, "30"), (PRIO, "1")])], &annotations);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert_patch_matches(&input, &conv);
    let devices = serde_json::to_value(&conv.templates[0].spec.spec.devices).unwrap();
    let subs = devices["requests"][0]["firstAvailable"].as_array().unwrap();
    assert!(subs.iter().all(|s| s["deviceClassName"] == "mig.hami-core-gpu.project-hami.io" && s["count"] == 2), "{devices}");
    assert!(subs[0]["selectors"][0]["cel"]["expression"].as_str().unwrap().contains(r#"compareTo(quantity("8000Mi")) >= 0"#));
    assert_eq!(devices["constraints"][0]["distinctAttribute"], "hami-core-gpu.project-hami.io/parentUUID");
    assert!(devices.get("config").is_none(), "{devices}");
    let resources = serde_json::to_value(&conv.pod.spec.as_ref().unwrap().containers[0].resources).unwrap();
    assert_eq!(resources, json!({"claims": [{"name": "vgpu-cuda"}]}));
    // The card policy warns as before; cores and priority say why they do not apply.
    assert_eq!(conv.warnings.len(), 3, "{:?}", conv.warnings);
    assert!(conv.warnings[0].starts_with("annotation hami.io/gpu-scheduler-policy is ignored"));
    assert!(conv.warnings[1].starts_with("container \"cuda\": nvidia.com/gpucores does not apply in MIG mode"));
    assert!(conv.warnings[2].starts_with("container \"cuda\": nvidia.com/priority does not apply in MIG mode"));
    // The same pod without the annotation gets shares of whole cards, as before.
    let shares = convert_pod(&pod("p", input.spec.clone().unwrap().containers, &[]), &hami(), &t4_facts()).unwrap();
    let exactly = serde_json::to_value(&shares.templates[0].spec.spec.devices).unwrap()["requests"][0]["exactly"].clone();
    assert_eq!(exactly["deviceClassName"], "hami-core-gpu.project-hami.io");
    assert_ne!(shares.templates[0].metadata.name, conv.templates[0].metadata.name);
}

#[test]
fn with_unannotated_mig_only_a_pod_without_the_annotation_may_land_on_an_instance() {
    let settings = CompatSettings { unannotated_mig: true, ..hami() };
    let containers = vec![container("cuda", &[(GPU, "1"), (MEM, "9000"), (CORES, "30")])];
    let kinds = |annotations: &[(&str, &str)], settings: &CompatSettings| {
        let conv = convert_pod(&pod("p", containers.clone(), annotations), settings, &t4_facts()).unwrap();
        let devices = serde_json::to_value(&conv.templates[0].spec.spec.devices).unwrap();
        match devices["requests"][0]["firstAvailable"].as_array() {
            Some(subs) => subs.iter().map(|s| s["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>(),
            None => vec!["exactly".to_owned()],
        }
    };
    let either = kinds(&[], &settings);
    assert_eq!(either[0], "share", "{either:?}");
    assert!(either[1..].iter().all(|n| n.starts_with("mig-profile-")) && either.len() > 1, "{either:?}");
    // The annotation still decides where given; off, nothing changes.
    assert_eq!(kinds(&[("nvidia.com/vgpu-mode", "hami-core")], &settings), ["exactly"]);
    assert!(kinds(&[("nvidia.com/vgpu-mode", "mig")], &settings).iter().all(|n| n.starts_with("mig-profile-")));
    assert_eq!(kinds(&[], &hami()), ["exactly"]);
}

/// HAMi's examples/nvidia/mig_example.yaml: `nvidia.com/mig-3g.20gb: 1`.
#[test]
fn mig_resources_become_a_claim_for_their_profile() {
    let input = pod("p", vec![container("cuda", &[("nvidia.com/mig-3g.20gb", "1")])], &[]);
    let conv = convert_pod(&input, &hami(), &t4_facts()).unwrap();
    assert_patch_matches(&input, &conv);
    let devices = serde_json::to_value(&conv.templates[0].spec.spec.devices).unwrap();
    assert_eq!(devices["requests"][0]["name"], "mig-3g-20gb");
    assert_eq!(devices["requests"][0]["exactly"]["deviceClassName"], "mig.hami-core-gpu.project-hami.io");
    assert!(conv.warnings.is_empty(), "{:?}", conv.warnings);
    // Unknown profiles are refused by container and resource; nothing is converted.
    let bad = pod("p", vec![container("cuda", &[("nvidia.com/mig-9g.99gb", "1")])], &[]);
    let e = convert_pod(&bad, &hami(), &t4_facts()).unwrap_err();
    assert_eq!(e.reason(), "unknown_mig_profile");
    assert!(e.to_string().starts_with("container \"cuda\": nvidia.com/mig-9g.99gb: "), "{e}");
}

#[test]
fn a_bad_mode_is_refused_only_where_cards_are_converted() {
    let mode = [("nvidia.com/vgpu-mode", "mps")];
    let e = convert_pod(&pod("p", vec![container("cuda", &[(GPU, "1")])], &mode), &hami(), &t4_facts()).unwrap_err();
    assert_eq!(e.reason(), "vgpu_mode");
    assert!(e.to_string().starts_with("annotation nvidia.com/vgpu-mode: \"mps\" is not a mode vgpu-dra serves"), "{e}");
    let untouched = convert_pod(&pod("p", vec![container("cuda", &[("cpu", "1")])], &mode), &hami(), &t4_facts()).unwrap();
    assert!(!untouched.changed());
    // MIG instances by profile do not depend on the mode.
    let by_profile = pod("p", vec![container("cuda", &[("nvidia.com/mig-1g.10gb", "1")])], &mode);
    assert!(convert_pod(&by_profile, &hami(), &t4_facts()).unwrap().changed());
}

#[test]
fn volcano_pods_take_volcanos_mode_annotation() {
    let spec = pod("t", vec![container("worker", &[("volcano.sh/vgpu-number", "1"), ("volcano.sh/vgpu-memory", "9000")])], &[])
        .spec
        .unwrap();
    let mode = annotations(&[("volcano.sh/vgpu-mode", "mig")]);
    let conv = convert_pod_spec(&mode, &spec, Some("volcano"), "/spec", &CompatSettings::volcano(), &t4_facts()).unwrap();
    let devices = serde_json::to_value(&conv.templates[0].spec.spec.devices).unwrap();
    let first = &devices["requests"][0]["firstAvailable"][0];
    assert_eq!(first["deviceClassName"], "mig.hami-core-gpu.project-hami.io");
    assert!(first["selectors"][0]["cel"]["expression"].as_str().unwrap().contains("migProfileId == 19"), "{first}");
}
