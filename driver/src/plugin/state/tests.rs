//! The state core without the test bed: temp dirs for the checkpoint, the CDI and HAMi-core
//! directories, fixed claims and pods, a mock inventory; an unreachable API where an API error
//! is the point.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use vgpu_scheduling::{Ratio, SharingConfig, Uid};

use super::*;
use crate::discovery::mock::{MockSource, parse_spec};
use crate::plugin::api::ClaimSource;
use crate::plugin::cdi::CdiOptions;
use crate::plugin::storage::checkpoint::Checkpoint;
use crate::plugin::storage::held_spec::HeldSpec;

const DRIVER: &str = "hami-core-gpu.project-hami.io";

fn uid(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// A claim allocated on node n1 with `results` (YAML flow mappings without driver and pool).
fn claim(name: &str, n: u32, results: &[&str], reserved_for: Option<(&str, &str)>) -> ResourceClaim {
    let results: String = results.iter().map(|r| format!("      - {{driver: {DRIVER}, pool: n1, {r}}}\n")).collect();
    let reserved = reserved_for
        .map_or(String::new(), |(pod, pod_uid)| format!("  reservedFor:\n  - {{resource: pods, name: {pod}, uid: {pod_uid}}}\n"));
    let yaml = format!(
        "metadata: {{name: {name}, namespace: ns, uid: {}}}\nspec: {{}}\nstatus:\n{reserved}  allocation:\n    devices:\n      results:\n{results}",
        uid(n)
    );
    serde_saphyr::from_str(&yaml).unwrap()
}

fn share(device: &str, request: &str, share: u32, memory: &str, cores: u32) -> String {
    format!(
        "device: {device}, request: {request}, shareID: {}, consumedCapacity: {{memory: {memory}, cores: \"{cores}\", shares: \"1\"}}",
        uid(900 + share)
    )
}

struct Node {
    root: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        Self { root: tempfile::tempdir().unwrap() }
    }

    fn cdi(&self) -> CdiOptions {
        CdiOptions {
            lock_dir: self.root.path().join("lock"),
            synthesize_nodes: true,
            ..CdiOptions::for_driver(&vgpu_scheduling::DriverName::new(DRIVER).unwrap(), &self.root.path().join("vgpu")).unwrap()
        }
    }

    fn specs(&self) -> SpecDir {
        SpecDir::new(self.root.path().join("cdi"), self.cdi().kind)
    }

    fn checkpoint_dir(&self) -> std::path::PathBuf {
        self.root.path().join("checkpoint")
    }

    /// Every file in the CDI and checkpoint directories, temp files included.
    fn files(&self) -> Vec<String> {
        [self.root.path().join("cdi"), self.checkpoint_dir()]
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    async fn state_with(&self, claims: ClaimSource, config: SharingConfig, options: StateOptions) -> State {
        let source = Arc::new(MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()));
        let storage = Storage { checkpoint: Checkpoint::new(self.checkpoint_dir()), cdi: self.cdi(), specs: self.specs() };
        State::recover(claims, source, config, "n1".into(), storage, options).await.unwrap()
    }

    async fn state(&self, claims: Vec<ResourceClaim>, pods: Vec<Pod>) -> State {
        self.state_with(fixed(claims, pods), SharingConfig::default(), StateOptions::default()).await
    }
}

fn fixed(claims: Vec<ResourceClaim>, pods: Vec<Pod>) -> ClaimSource {
    ClaimSource::Fixed { claims: Arc::new(claims), pods: Arc::new(pods) }
}

/// An API server that refuses every connection: every read is an error, never an answer.
fn dead_api() -> ClaimSource {
    crate::install_crypto_provider();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    ClaimSource::Api {
        client: kube::Client::try_from(config).unwrap(),
        cache: None,
        timeout: Duration::from_secs(2),
        node_pods: None,
    }
}

fn cref(name: &str, n: u32) -> ClaimRef {
    ClaimRef::new("ns", name, &uid(n)).unwrap()
}

fn env(spec: &cdi_spec::Spec, key: &str) -> Option<String> {
    spec.container_edits.env.iter().find_map(|e| e.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_writes_spec_record_and_a_directory_any_user_can_write() {
    let node = Node::new();
    let c = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None);
    let state = node.state(vec![c], vec![]).await;
    let answer = state.prepare(&cref("c1", 1)).await.unwrap();
    assert_eq!(answer.len(), 1);
    let spec = node.specs().read(&uid(1)).unwrap().unwrap();
    assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(), Some("4096m"));
    assert_eq!(env(&spec, "CUDA_DEVICE_SM_LIMIT").as_deref(), Some("50"));
    assert_eq!(mode(&node.cdi().claims_root.join(uid(1))), 0o777);
    assert_eq!(state.prepare(&cref("c1", 1)).await.unwrap(), answer, "repeatable");
    // A garbled spec of a prepared claim is rewritten by the next prepare.
    let file = node.specs().file_for(&uid(1)).unwrap();
    std::fs::write(&file, "{garbage").unwrap();
    assert_eq!(state.prepare(&cref("c1", 1)).await.unwrap(), answer);
    assert_eq!(node.specs().read(&uid(1)).unwrap().unwrap(), spec);
    state.unprepare(&Uid::new(uid(1)).unwrap()).await.unwrap();
    assert!(!node.cdi().claims_root.join(uid(1)).exists());
    assert!(node.specs().read(&uid(1)).unwrap().is_none());
    state.unprepare(&Uid::new(uid(1)).unwrap()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_spec_is_rewritten_only_from_the_claims_own_record() {
    let node = Node::new();
    let c1 = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None);
    let c2 = claim("c2", 2, &[&share("hami-gpu-1", "gpu", 2, "2Gi", 20)], None);
    let state = node.state(vec![c1, c2], vec![]).await;
    let answer = state.prepare(&cref("c1", 1)).await.unwrap();
    state.prepare(&cref("c2", 2)).await.unwrap();
    let (spec1, spec2) = (node.specs().read(&uid(1)).unwrap().unwrap(), node.specs().read(&uid(2)).unwrap().unwrap());
    let file = node.specs().file_for(&uid(1)).unwrap();
    // Lost, or replaced by a valid spec that is not the claim's: written back from the record.
    std::fs::remove_file(&file).unwrap();
    assert_eq!(state.prepare(&cref("c1", 1)).await.unwrap(), answer);
    assert_eq!(node.specs().read(&uid(1)).unwrap().unwrap(), spec1);
    std::fs::copy(node.specs().file_for(&uid(2)).unwrap(), &file).unwrap();
    assert_eq!(state.prepare(&cref("c1", 1)).await.unwrap(), answer);
    assert_eq!(node.specs().read(&uid(1)).unwrap().unwrap(), spec1);
    // A record of the claim with another spec than the one prepared (stale, or put there) is
    // never written back: the prepare fails, saying why, and writes nothing.
    let checkpoint = Checkpoint::new(node.checkpoint_dir());
    let entry = checkpoint.load().unwrap().claims.remove(&Uid::new(uid(1)).unwrap()).unwrap();
    let stale = PreparedClaim { spec: HeldSpec::new(&spec2), ..entry.clone() };
    checkpoint.record(&stale, &spec2).unwrap();
    std::fs::remove_file(&file).unwrap();
    let err = state.prepare(&cref("c1", 1)).await.unwrap_err();
    assert!(err.chain().contains("not the one the claim was prepared with"), "{}", err.chain());
    assert!(!file.exists());
    // The right record back: the spec is written again.
    checkpoint.record(&entry, &spec1).unwrap();
    assert_eq!(state.prepare(&cref("c1", 1)).await.unwrap(), answer);
    assert_eq!(node.specs().read(&uid(1)).unwrap().unwrap(), spec1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_requests_on_one_card_are_one_device_with_the_summed_limit() {
    let node = Node::new();
    let c = claim(
        "c1",
        1,
        &[
            &share("hami-gpu-0", "a", 1, "4Gi", 20),
            &share("hami-gpu-1", "b", 2, "2Gi", 10),
            &share("hami-gpu-0", "c", 3, "8Gi", 30),
        ],
        None,
    );
    let state = node.state(vec![c], vec![]).await;
    let answer = state.prepare(&cref("c1", 1)).await.unwrap();
    let spec = node.specs().read(&uid(1)).unwrap().unwrap();
    assert_eq!(spec.devices.len(), 2, "one CDI device per card");
    assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(), Some("12288m"));
    assert_eq!(env(&spec, "CUDA_DEVICE_SM_LIMIT_0").as_deref(), Some("50"));
    assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_1").as_deref(), Some("2048m"));
    assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_2"), None);
    assert_eq!(env(&spec, "NVIDIA_VISIBLE_DEVICES").map(|v| v.split(',').count()), Some(2));
    assert_eq!(answer[0].cdi_ids, answer[2].cdi_ids, "both requests on card 0 name its one device");
    assert_ne!(answer[0].cdi_ids, answer[1].cdi_ids);
    // The ledger holds three shares: card 0 carries 12Gi and two of its split count.
    let snap = state.snapshot().await;
    let used = &snap.usage[&vgpu_scheduling::DeviceName::new("hami-gpu-0").unwrap()];
    assert_eq!((used["memory"].to_string(), used["shares"].to_string()), ("12Gi".into(), "2".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_using_two_claims_or_part_of_one_is_refused_by_name() {
    let node = Node::new();
    let pod: Pod = serde_saphyr::from_str(
        r"
metadata: {name: p, namespace: ns, uid: pod-1}
spec:
  resourceClaims: [{name: x, resourceClaimName: c1}, {name: y, resourceClaimName: c2}, {name: z, resourceClaimName: c3}]
  containers:
  - {name: both, image: i, resources: {claims: [{name: x}, {name: y}]}}
  - {name: part, image: i, resources: {claims: [{name: z, request: a}]}}
",
    )
    .unwrap();
    let c1 = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "1Gi", 10)], Some(("p", "pod-1")));
    let c2 = claim("c2", 2, &[&share("hami-gpu-1", "gpu", 2, "1Gi", 10)], Some(("p", "pod-1")));
    let c3 =
        claim("c3", 3, &[&share("hami-gpu-0", "a", 3, "1Gi", 10), &share("hami-gpu-1", "b", 4, "1Gi", 10)], Some(("p", "pod-1")));
    let state = node.state(vec![c1, c2, c3], vec![pod]).await;
    let err = state.prepare(&cref("c1", 1)).await.unwrap_err().chain();
    assert!(err.contains("container both of pod p also uses claim c2"), "{err}");
    let err = state.prepare(&cref("c3", 3)).await.unwrap_err().chain();
    assert!(err.contains("container part of pod p uses only request(s) [\"a\"]"), "{err}");
    // Nothing was admitted, written or created for the refused claims.
    assert_eq!(state.prepared_count().await, 0);
    assert!(node.specs().list_owned().unwrap().is_empty());
    assert!(!node.cdi().claims_root.join(uid(1)).exists());
    assert_eq!(node.files(), Vec::<String>::new(), "the files written while the pod was read are gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_refused_before_it_is_staged_leaves_no_temp_file() {
    let node = Node::new();
    // Allocated on another node's pool, so not this node's to prepare.
    let elsewhere: ResourceClaim = serde_saphyr::from_str(&format!(
        "metadata: {{name: c2, namespace: ns, uid: {}}}\nspec: {{}}\nstatus:\n  allocation:\n    devices:\n      results:\n      - {{driver: {DRIVER}, pool: n2, device: hami-gpu-0, request: gpu}}\n",
        uid(2)
    ))
    .unwrap();
    let state = node.state(vec![elsewhere], vec![]).await;
    for (name, n) in [("c1", 1), ("c2", 2)] {
        assert!(state.prepare(&cref(name, n)).await.is_err(), "{name}");
        assert_eq!(node.files(), Vec::<String>::new(), "{name}: the temp files made while it was read are gone");
    }
    drop(state);
    let state = node.state_with(dead_api(), SharingConfig::default(), StateOptions::default()).await;
    assert!(state.prepare(&cref("c1", 1)).await.is_err());
    assert_eq!(node.files(), Vec::<String>::new(), "an API error leaves nothing either");
    assert_eq!(state.prepared_count().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_a_smaller_configuration_keeps_every_share_and_blocks_the_card() {
    let node = Node::new();
    let claims = vec![
        claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "12Gi", 10)], None),
        claim("c2", 2, &[&share("hami-gpu-0", "gpu", 2, "12Gi", 10)], None),
        claim("c3", 3, &[&share("hami-gpu-0", "gpu", 3, "1Gi", 10)], None),
    ];
    let scaled = SharingConfig { memory_scaling: Ratio::parse("deviceMemoryScaling", "2").unwrap(), ..SharingConfig::default() };
    let state = node.state_with(fixed(claims.clone(), vec![]), scaled, StateOptions::default()).await;
    state.prepare(&cref("c1", 1)).await.unwrap();
    state.prepare(&cref("c2", 2)).await.unwrap();
    drop(state);
    // Memory scaling 2 -> 1: 24Gi prepared on a card that now offers 15Gi.
    let state = node.state(claims, vec![]).await;
    let snap = state.snapshot().await;
    let card = vgpu_scheduling::DeviceName::new("hami-gpu-0").unwrap();
    assert_eq!(snap.usage[&card]["memory"].to_string(), "24Gi");
    assert_eq!(snap.overcommitted, vec![(card.clone(), "memory".to_owned())]);
    let err = state.prepare(&cref("c3", 3)).await.unwrap_err();
    assert_eq!(err.reason(), "over_capacity", "{}", err.chain());
    // Releasing one share brings the card back under its capacity.
    state.unprepare(&Uid::new(uid(2)).unwrap()).await.unwrap();
    state.check_once().await;
    assert!(state.snapshot().await.overcommitted.is_empty());
    state.prepare(&cref("c3", 3)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_survives_fifos_directories_and_links_in_every_directory() {
    let node = Node::new();
    let c = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None);
    let state = node.state(vec![c.clone()], vec![]).await;
    state.prepare(&cref("c1", 1)).await.unwrap();
    drop(state);
    let stem = node.cdi().kind.file_stem();
    for dir in [node.checkpoint_dir(), node.root.path().join("cdi")] {
        let fifo = dir.join(format!("{stem}_{}.json", uid(7)));
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        std::fs::create_dir(dir.join(format!("{}.json", uid(8)))).unwrap();
        std::fs::create_dir(dir.join(format!("{stem}_{}.json", uid(9)))).unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join(format!("{stem}_{}.json", uid(6)))).unwrap();
    }
    // Garble the prepared claim's spec too: start-up rewrites it.
    std::fs::write(node.specs().file_for(&uid(1)).unwrap(), "not json").unwrap();
    let state = tokio::time::timeout(Duration::from_secs(20), node.state(vec![c], vec![])).await.expect("start-up hung");
    assert_eq!(state.prepared_count().await, 1);
    assert!(node.specs().read(&uid(1)).unwrap().is_some());
    state.prepare(&cref("c1", 1)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_record_while_the_api_is_down_deletes_nothing_and_holds_the_card() {
    let node = Node::new();
    let c = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None);
    let state = node.state(vec![c.clone()], vec![]).await;
    state.prepare(&cref("c1", 1)).await.unwrap();
    drop(state);
    let record = node.checkpoint_dir().join(format!("{}.json", uid(1)));
    std::fs::write(&record, "{truncated").unwrap();
    let state = node.state_with(dead_api(), SharingConfig::default(), StateOptions::default()).await;
    assert!(node.specs().read(&uid(1)).unwrap().is_some(), "the running claim's spec stays");
    assert!(node.cdi().claims_root.join(uid(1)).is_dir(), "and its directory");
    let snap = state.snapshot().await;
    let card = vgpu_scheduling::DeviceName::new("hami-gpu-0").unwrap();
    assert_eq!(snap.usage[&card]["memory"].to_string(), "15Gi", "the card is held whole until the API answers");
    drop(state);
    // With the API back, the claim is adopted with its real share.
    let state = node.state(vec![c], vec![]).await;
    assert_eq!(state.prepared_count().await, 1);
    let snap = state.snapshot().await;
    assert_eq!(snap.usage[&card]["memory"].to_string(), "4Gi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_gone_from_the_api_are_released_after_the_grace_period_only() {
    let node = Node::new();
    let c = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None);
    let state = node.state(vec![c], vec![]).await;
    state.prepare(&cref("c1", 1)).await.unwrap();
    drop(state);
    // An API error is no verdict: nothing is released, however long it lasts.
    let options = StateOptions { deleted_claim_grace: Duration::ZERO, ..Default::default() };
    let state = node.state_with(dead_api(), SharingConfig::default(), options.clone()).await;
    state.check_once().await;
    assert_eq!(state.prepared_count().await, 1);
    drop(state);
    // Deleted from the API: kept within the grace period, released after it.
    let patient = StateOptions { deleted_claim_grace: Duration::from_secs(3600), ..Default::default() };
    let state = node.state_with(fixed(vec![], vec![]), SharingConfig::default(), patient).await;
    state.check_once().await;
    assert_eq!(state.prepared_count().await, 1);
    drop(state);
    let state = node.state_with(fixed(vec![], vec![]), SharingConfig::default(), options).await;
    state.check_once().await;
    state.check_once().await;
    assert_eq!(state.prepared_count().await, 0);
    assert!(node.specs().read(&uid(1)).unwrap().is_none());
    // Recreated under the same name with a new UID counts as gone too.
    let state = node.state(vec![claim("c1", 2, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None)], vec![]).await;
    state.prepare(&cref("c1", 2)).await.unwrap();
    assert_eq!(state.prepared_count().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_leaves_no_directory_record_or_share() {
    let node = Node::new();
    let c = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None);
    let state = node.state(vec![c], vec![]).await;
    // A directory where the spec file goes: the write fails.
    let target = node.specs().file_for(&uid(1)).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    let err = state.prepare(&cref("c1", 1)).await.unwrap_err();
    assert_eq!(err.reason(), "storage");
    assert!(err.chain().contains("os error"), "the OS error is kept: {}", err.chain());
    assert!(!node.cdi().claims_root.join(uid(1)).exists());
    assert!(!node.checkpoint_dir().join(format!("{}.json", uid(1))).exists());
    assert!(state.snapshot().await.usage.values().all(|u| u.values().all(|q| q.is_zero())));
    let name = target.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(node.files(), vec![name], "only the directory in the spec's way is left");
    std::fs::remove_dir(&target).unwrap();
    state.prepare(&cref("c1", 1)).await.unwrap();
}

/// The temp files in the node's checkpoint and CDI directories.
fn temp_files(node: &Node) -> usize {
    node.files().iter().filter(|f| f.starts_with('.')).count()
}

/// Waits until `check` holds for the temp files of `node` (spares are made on blocking threads).
async fn temp_files_become(node: &Node, what: &str, check: impl Fn(usize) -> bool) {
    for _ in 0..200 {
        if check(temp_files(node)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: {:?}", node.files());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spare_temp_files_are_made_ahead_used_by_prepares_and_removed_with_the_state() {
    let node = Node::new();
    let claims: Vec<ResourceClaim> =
        (1..=5).map(|n| claim(&format!("c{n}"), n, &[&share("hami-gpu-0", "gpu", n, "1Gi", 10)], None)).collect();
    let elsewhere: ResourceClaim = serde_saphyr::from_str(&format!(
        "metadata: {{name: c9, namespace: ns, uid: {}}}\nspec: {{}}\nstatus:\n  allocation:\n    devices:\n      results:\n      - {{driver: {DRIVER}, pool: n2, device: hami-gpu-0, request: gpu}}\n",
        uid(9)
    ))
    .unwrap();
    let options = StateOptions { spare_files: 2, ..StateOptions::default() };
    let all = claims.iter().cloned().chain([elsewhere]).collect();
    let state = node.state_with(fixed(all, vec![]), SharingConfig::default(), options).await;
    // Two claims' worth: a record's and a spec's temp file each.
    temp_files_become(&node, "spares made at start", |n| n == 4).await;
    for n in 1..=5 {
        state.prepare(&cref(&format!("c{n}"), n)).await.unwrap();
        assert!(temp_files(&node) <= 4, "never more than the spares: {:?}", node.files());
    }
    assert!(state.prepare(&cref("c9", 9)).await.is_err(), "another node's claim");
    temp_files_become(&node, "spares made again, and a refused claim's files gone", |n| n == 4).await;
    assert_eq!(state.prepared_count().await, 5);
    for n in 1..=5 {
        let spec = node.specs().read(&uid(n)).unwrap().unwrap();
        assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(), Some("1024m"), "c{n}'s spec is whole");
    }
    drop(state);
    temp_files_become(&node, "the spares removed with the state", |n| n == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_after_the_directories_were_emptied_does_not_use_the_lost_spares() {
    let node = Node::new();
    let claims: Vec<ResourceClaim> =
        (1..=3).map(|n| claim(&format!("c{n}"), n, &[&share("hami-gpu-0", "gpu", n, "1Gi", 10)], None)).collect();
    let options = StateOptions { spare_files: 2, ..StateOptions::default() };
    let state = node.state_with(fixed(claims, vec![]), SharingConfig::default(), options).await;
    temp_files_become(&node, "spares made at start", |n| n == 4).await;
    // Someone empties the CDI directory (a tmpfs) and the checkpoint's temp files go too.
    for dir in [node.root.path().join("cdi"), node.checkpoint_dir()] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
                std::fs::remove_file(path).unwrap();
            }
        }
    }
    for n in 1..=3 {
        state.prepare(&cref(&format!("c{n}"), n)).await.unwrap_or_else(|e| panic!("c{n}: {}", e.chain()));
        assert!(node.specs().read(&uid(n)).unwrap().is_some(), "c{n}");
    }
}

/// An API server whose watch cache lags: a GET with `resourceVersion=0` gets `cached`, a quorum
/// GET gets `current` (`None`: not found); pods are never found. Counts the claim reads of each
/// kind.
fn lagging_api(cached: ResourceClaim, current: Option<ResourceClaim>) -> (ClaimSource, Arc<std::sync::Mutex<(u32, u32)>>) {
    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    let reads = Arc::new(std::sync::Mutex::new((0, 0)));
    let counted = reads.clone();
    let service = tower::service_fn(move |request: Request<Body>| {
        let (cached, current, counted) = (cached.clone(), current.clone(), counted.clone());
        async move {
            let path = request.uri().path().to_owned();
            let from_cache = request.uri().query().is_some_and(|q| q.contains("resourceVersion=0"));
            let found = if !path.contains("/resourceclaims/") {
                None
            } else if from_cache {
                counted.lock().unwrap().0 += 1;
                Some(cached)
            } else {
                counted.lock().unwrap().1 += 1;
                current
            };
            let response = match found {
                Some(claim) => Response::new(Body::from(serde_json::to_vec(&claim).unwrap())),
                None => {
                    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
                    let mut r = Response::new(Body::from(serde_json::to_vec(&status).unwrap()));
                    *r.status_mut() = StatusCode::NOT_FOUND;
                    r
                }
            };
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let client = kube::Client::new(service, "default");
    let source = ClaimSource::api(client).with_cache(crate::plugin::api::ClaimCache::new(DRIVER, "n1"));
    (source, reads)
}

/// Finding 2 of the tenant-safety issue: a standalone claim deallocated and allocated again on
/// this node for another pod keeps its UID, and a lagging watch cache still shows the old
/// devices and limits. A prepare acts only on a quorum read, and not at all on a claim whose
/// fresh read is reserved for no pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_never_writes_the_allocation_a_lagging_cache_still_shows() {
    let node = Node::new();
    let old = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "12Gi", 90)], Some(("first", "pod-1")));
    for (current, cores) in [
        // Allocated anew on the other card with other limits.
        (claim("c1", 1, &[&share("hami-gpu-1", "gpu", 2, "2Gi", 10)], Some(("second", "pod-2"))), Some(10)),
        // The same card, smaller.
        (claim("c1", 1, &[&share("hami-gpu-0", "gpu", 3, "1Gi", 5)], Some(("second", "pod-2"))), Some(5)),
        // Deallocated: the first pod is gone, no one holds it.
        (claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "12Gi", 90)], None), None),
    ] {
        let (source, reads) = lagging_api(old.clone(), Some(current.clone()));
        let state = node.state_with(source, SharingConfig::default(), StateOptions::default()).await;
        let prepared = state.prepare(&cref("c1", 1)).await;
        match cores {
            Some(cores) => {
                prepared.unwrap();
                let spec = node.specs().read(&uid(1)).unwrap().unwrap();
                assert_eq!(env(&spec, "CUDA_DEVICE_SM_LIMIT").as_deref(), Some(cores.to_string().as_str()), "{spec:?}");
                state.unprepare(&Uid::new(uid(1)).unwrap()).await.unwrap();
            }
            None => {
                let e = prepared.unwrap_err().chain();
                assert!(e.contains("reserved for no pod"), "{e}");
                assert!(node.specs().read(&uid(1)).unwrap().is_none());
            }
        }
        let (cache, quorum) = *reads.lock().unwrap();
        assert_eq!((cache, quorum), (0, 1), "one quorum read of the claim, none from the watch cache");
    }
}

/// Finding 1 of the tenant-safety issue: what a container leaves in its claim directory (here
/// 30,000 nested directories, a FIFO and a link to a host file) costs an unprepare one rename;
/// the directory is gone at once and its content is removed in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprepare_moves_a_hostile_claim_directory_away_without_reading_it() {
    use rustix::fs::{CWD, FileType, Mode, OFlags};
    let node = Node::new();
    let c = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None);
    let state = node.state(vec![c], vec![]).await;
    state.prepare(&cref("c1", 1)).await.unwrap();
    let dir = node.cdi().claims_root.join(uid(1));
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
    let mut fd = rustix::fs::openat(CWD, &dir, flags, Mode::empty()).unwrap();
    for _ in 0..30_000 {
        rustix::fs::mkdirat(&fd, c"d", Mode::RWXU).unwrap();
        fd = rustix::fs::openat(&fd, c"d", flags, Mode::empty()).unwrap();
    }
    drop(fd);
    rustix::fs::mknodat(CWD, dir.join("fifo"), FileType::Fifo, Mode::RUSR | Mode::WUSR, 0).unwrap();
    let host = node.root.path().join("host-file");
    std::fs::write(&host, b"keep").unwrap();
    std::os::unix::fs::symlink(&host, dir.join("link")).unwrap();

    state.unprepare(&Uid::new(uid(1)).unwrap()).await.unwrap();
    assert!(!dir.exists(), "the claim's directory is gone when the unprepare answers");
    let trash = node.cdi().claims_root.join(crate::plugin::storage::trash::TRASH_DIR);
    for _ in 0..600 {
        if std::fs::read_dir(&trash).unwrap().next().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(std::fs::read_dir(&trash).unwrap().next().is_none(), "emptied in the background");
    assert_eq!(std::fs::read(&host).unwrap(), b"keep");
    // A directory left by an older version, or a move that failed, is swept by the periodic check.
    std::fs::create_dir_all(node.cdi().claims_root.join(uid(7)).join("x")).unwrap();
    state.check_once().await;
    assert!(!node.cdi().claims_root.join(uid(7)).exists());
}

/// The claim's status follows its preparation: set with the card and limits after a prepare,
/// cleared after the unprepare, and set again for every prepared claim when a restarted driver
/// takes the writer (a crash between a prepare and its write leaves nothing unsaid).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepares_and_unprepares_ask_for_the_claims_status_and_a_restart_asks_again() {
    use crate::plugin::api::status::{StatusMetrics, StatusWriter};
    let client = dead_client();
    let node = Node::new();
    let claims = vec![
        claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "4Gi", 50)], None),
        claim("c2", 2, &[&share("hami-gpu-1", "gpu", 2, "2Gi", 10)], None),
    ];
    let writer = StatusWriter::new(client, DRIVER, Duration::from_secs(1), StatusMetrics::default());
    let state = node.state(claims.clone(), vec![]).await.with_claim_status(Some(writer.clone()));
    assert_eq!(writer.queued(), 0, "nothing prepared, nothing to say");
    state.prepare(&cref("c1", 1)).await.unwrap();
    state.prepare(&cref("c2", 2)).await.unwrap();
    let c1 = writer.wanted(&Uid::new(uid(1)).unwrap()).expect("a status for c1");
    assert_eq!((c1.len(), c1[0].device.as_str(), c1[0].pool.as_str()), (1, "hami-gpu-0", "n1"));
    let data = &c1[0].data.as_ref().unwrap().0;
    assert_eq!((data["memoryLimit"].as_str(), data["smLimit"].as_str()), (Some("4096m"), Some("50")));
    assert_eq!(c1[0].share_id.as_deref(), Some(uid(901).as_str()));

    state.unprepare(&Uid::new(uid(1)).unwrap()).await.unwrap();
    assert_eq!(writer.wanted(&Uid::new(uid(1)).unwrap()), Some(Vec::new()), "the unprepare clears what the prepare set");

    drop(state);
    let restarted = StatusWriter::new(dead_client(), DRIVER, Duration::from_secs(1), StatusMetrics::default());
    let _state = node.state(claims, vec![]).await.with_claim_status(Some(restarted.clone()));
    assert_eq!(restarted.queued(), 1, "only the claim still prepared");
    let c2 = restarted.wanted(&Uid::new(uid(2)).unwrap()).expect("c2 said again at start");
    assert_eq!(c2[0].data.as_ref().unwrap().0["smLimit"], "10");
}

fn dead_client() -> kube::Client {
    let ClaimSource::Api { client, .. } = dead_api() else { unreachable!() };
    client
}

#[path = "mig_tests.rs"]
mod mig_tests;

mod concurrency;
