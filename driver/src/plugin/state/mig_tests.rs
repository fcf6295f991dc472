//! Dynamic MIG through the state, against the simulator: instances made at prepare, shared
//! by the claims on one device, destroyed with the last, and none left by an interrupted
//! prepare after a restart.

use super::*;
use crate::discovery::DeviceSource;
use crate::mig::view::mock_sim;
use crate::mig::{DynamicMig, MigControl, MigSettings, MigSim, MigView};
use crate::plugin::mig::{MigHold, MigPrepare};
use crate::plugin::storage::held_spec::HeldSpec;

const CARDS: &str = "NVIDIA A800-SXM4-80GB:80Gi:mig,Tesla T4:15Gi";

/// A node with one A800 in MIG mode offering dynamic MIG, the simulator standing for its card.
struct MigNode {
    node: Node,
    sim: Arc<MigSim>,
    card: String,
    /// `--mig-instance-sharing`.
    shared: bool,
}

impl MigNode {
    fn new() -> Self {
        let node = Node::new();
        let inventory = MockSource::new("n1", parse_spec(CARDS).unwrap()).inventory().unwrap();
        let sim = Arc::new(mock_sim(&inventory, None).unwrap());
        Self { node, sim, card: inventory.gpus[0].uuid.clone(), shared: false }
    }

    async fn state(&self, claims: Vec<ResourceClaim>) -> State {
        self.state_driving(claims, self.sim.clone()).await
    }

    /// The state with `control` driving the card (the simulator's instances still listed).
    async fn state_driving(&self, claims: Vec<ResourceClaim>, control: Arc<dyn MigControl>) -> State {
        let raw: Arc<dyn DeviceSource> = Arc::new(MockSource::new("n1", parse_spec(CARDS).unwrap()));
        let source = Arc::new(MigView::new(raw, self.sim.clone()));
        let settings = MigSettings { mode: DynamicMig::All, shared_instances: self.shared, ..Default::default() };
        let options = StateOptions { mig: Some(MigPrepare { control, settings }), ..Default::default() };
        let n = &self.node;
        let storage = Storage { checkpoint: Checkpoint::new(n.checkpoint_dir()), cdi: n.cdi(), specs: n.specs() };
        State::recover(fixed(claims, vec![]), source, SharingConfig::default(), "n1".into(), storage, options).await.unwrap()
    }

    fn instances(&self) -> Vec<crate::mig::MigInstance> {
        self.sim.instances(&self.card).unwrap()
    }
}

fn placement(name: &str, n: u32, device: &str) -> ResourceClaim {
    claim(name, n, &[&format!("device: {device}, request: gpu")], None)
}

fn id(n: u32) -> Uid {
    Uid::new(uid(n)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_device_gets_its_own_instance_made_at_prepare_and_destroyed_at_unprepare() {
    let node = MigNode::new();
    let state = node.state(vec![placement("c1", 1, "hami-gpu-0-mig-1g-10gb-3")]).await;
    let answer = state.prepare(&cref("c1", 1)).await.unwrap();
    assert_eq!(answer[0].device, "hami-gpu-0-mig-1g-10gb-3");
    let made = node.instances();
    assert_eq!(made.len(), 1);
    assert_eq!((made[0].gi_profile_id, made[0].start), (19, 3));
    // The container sees the instance, with the instance's memory as its limit.
    let spec = node.node.specs().read(&uid(1)).unwrap().unwrap();
    assert_eq!(env(&spec, "NVIDIA_VISIBLE_DEVICES"), Some(made[0].uuid.clone()));
    assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(), Some("9728m"));
    // The record names it; a repeated prepare makes nothing new.
    let record = state.each_prepared(|p| Some(p.mig.clone())).await;
    assert_eq!(record, vec![vec![MigHold::new(&target(&node, 19, 3, "hami-gpu-0-mig-1g-10gb-3"), Some(made[0].clone()))]]);
    assert_eq!(state.prepare(&cref("c1", 1)).await.unwrap(), answer);
    assert_eq!(node.instances(), made);
    // The instance is ours: the layout still offers its placement device, not a static one.
    let published = state.published().unwrap();
    assert!(published.iter().any(|d| d.name.as_str() == "hami-gpu-0-mig-1g-10gb-3"));
    assert!(!published.iter().any(|d| d.name.as_str().starts_with("hami-gpu-0-mig-1-")), "{published:?}");
    state.unprepare(&id(1)).await.unwrap();
    assert_eq!(node.instances(), Vec::new());
    assert!(node.node.specs().read(&uid(1)).unwrap().is_none());
    state.unprepare(&id(1)).await.unwrap();
}

fn target(node: &MigNode, profile_id: u32, start: u8, device: &str) -> crate::plugin::mig::MigTarget {
    crate::plugin::mig::MigTarget {
        device: vgpu_scheduling::DeviceName::new(device).unwrap(),
        card: node.card.clone(),
        minor: 0,
        profile_id,
        start,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_of_the_whole_card_share_one_full_instance_with_their_own_limits() {
    let node = MigNode::new();
    let claims = vec![
        claim("a", 1, &[&share("hami-gpu-0", "gpu", 1, "20Gi", 30)], None),
        claim("b", 2, &[&share("hami-gpu-0", "gpu", 2, "40Gi", 60)], None),
    ];
    let state = node.state(claims).await;
    state.prepare(&cref("a", 1)).await.unwrap();
    state.prepare(&cref("b", 2)).await.unwrap();
    let made = node.instances();
    assert_eq!(made.len(), 1, "one instance for both");
    assert_eq!((made[0].gi_profile_id, made[0].start), (0, 0), "the full-size instance");
    for (n, memory, cores) in [(1, "20480m", "30"), (2, "40960m", "60")] {
        let spec = node.node.specs().read(&uid(n)).unwrap().unwrap();
        assert_eq!(env(&spec, "NVIDIA_VISIBLE_DEVICES"), Some(made[0].uuid.clone()));
        assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(), Some(memory));
        assert_eq!(env(&spec, "CUDA_DEVICE_SM_LIMIT").as_deref(), Some(cores));
    }
    state.unprepare(&id(1)).await.unwrap();
    assert_eq!(node.instances(), made, "still used by b");
    state.unprepare(&id(2)).await.unwrap();
    assert_eq!(node.instances(), Vec::new(), "gone with its last claim");
}

/// A card that refuses creates at odd starts, as one whose compute ran out between the slices
/// and the prepare would.
struct Refusing(Arc<MigSim>);

impl MigControl for Refusing {
    fn mig_mode(&self, card: &str) -> Result<bool, crate::mig::MigError> {
        self.0.mig_mode(card)
    }
    fn instances(&self, card: &str) -> Result<Vec<crate::mig::MigInstance>, crate::mig::MigError> {
        self.0.instances(card)
    }
    fn create(&self, card: &str, profile: u32, start: u8) -> Result<crate::mig::MigInstance, crate::mig::MigError> {
        if start % 2 == 1 {
            return Err(crate::mig::MigError::NoCompute { card: card.into(), profile: "1g.10gb", start, free: 0 });
        }
        self.0.create(card, profile, start)
    }
    fn destroy(&self, card: &str, gi: u32, ci: u32) -> Result<(), crate::mig::MigError> {
        self.0.destroy(card, gi, ci)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_the_card_refuses_fails_the_claim_and_leaves_nothing() {
    let node = MigNode::new();
    let claims = vec![placement("c1", 1, "hami-gpu-0-mig-1g-10gb-3"), placement("c2", 2, "hami-gpu-0-mig-1g-10gb-2")];
    let state = node.state_driving(claims, Arc::new(Refusing(node.sim.clone()))).await;
    let err = state.prepare(&cref("c1", 1)).await.unwrap_err();
    assert_eq!(err.reason(), "mig");
    let text = err.chain();
    assert!(text.contains("hami-gpu-0-mig-1g-10gb-3") && text.contains("compute slices"), "{text}");
    assert_eq!(node.instances(), Vec::new());
    assert!(node.node.files().is_empty(), "{:?}", node.node.files());
    assert_eq!(state.prepared_count().await, 0);
    // Its placement is not kept as ours, and the ledger let it go: another placement prepares.
    assert!(state.published().unwrap().iter().any(|d| d.name.as_str() == "hami-gpu-0-mig-1g-10gb-3"));
    state.prepare(&cref("c2", 2)).await.unwrap();
    assert_eq!(node.instances().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_an_instance_made_elsewhere_took_is_no_longer_this_nodes() {
    let node = MigNode::new();
    let state = node.state(vec![placement("c1", 1, "hami-gpu-0-mig-1g-10gb-3")]).await;
    // Made outside the driver after the slices were written: 2g.20gb over slices 2 and 3.
    let foreign = node.sim.create(&node.card, 14, 2).unwrap();
    let err = state.prepare(&cref("c1", 1)).await.unwrap_err();
    assert!(err.chain().contains("device hami-gpu-0-mig-1g-10gb-3 does not exist on this node"), "{}", err.chain());
    assert_eq!(node.instances(), vec![foreign]);
    assert!(node.node.files().is_empty(), "{:?}", node.node.files());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_destroys_the_instance_of_a_prepare_interrupted_before_it_was_recorded() {
    let node = MigNode::new();
    let claims = vec![placement("c1", 1, "hami-gpu-0-mig-1g-10gb-3"), placement("c2", 2, "hami-gpu-0-mig-2g-20gb-4")];
    {
        let state = node.state(claims.clone()).await;
        state.prepare(&cref("c2", 2)).await.unwrap();
    }
    // What a kill between the create and its record leaves: the intent, and the instance.
    let spec = node.node.specs().read(&uid(2)).unwrap().unwrap();
    let intent = PreparedClaim {
        claim: cref("c1", 1),
        devices: Vec::new(),
        spec: HeldSpec::new(&spec),
        mig: vec![MigHold::new(&target(&node, 19, 3, "hami-gpu-0-mig-1g-10gb-3"), None)],
        consumer: None,
    };
    Checkpoint::new(node.node.checkpoint_dir()).record(&intent, &spec).unwrap();
    let orphan = node.sim.create(&node.card, 19, 3).unwrap();
    let foreign = node.sim.create(&node.card, 19, 0).unwrap();
    let kept = node.instances().into_iter().find(|i| i.gi_profile_id == 14).unwrap();
    let state = node.state(claims).await;
    let left = node.instances();
    assert!(!left.contains(&orphan), "orphan destroyed: {left:?}");
    assert!(left.contains(&foreign) && left.contains(&kept), "{left:?}");
    assert_eq!(state.prepared_count().await, 1, "the interrupted prepare is not prepared");
    // The kubelet's retry makes it anew.
    state.prepare(&cref("c1", 1)).await.unwrap();
    assert_eq!(node.instances().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_gets_the_instances_capability_nodes() {
    let node = MigNode::new();
    let proc_root = node.node.root.path().join("proc");
    // The simulator numbers the first GPU instance 1; NVIDIA's driver writes these files.
    let gi = proc_root.join("driver/nvidia/capabilities/gpu0/mig/gi1");
    std::fs::create_dir_all(gi.join("ci0")).unwrap();
    std::fs::write(gi.join("access"), "DeviceFileMinor: 12\nDeviceFileMode: 292\n").unwrap();
    std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 13\nDeviceFileMode: 292\n").unwrap();
    std::fs::write(proc_root.join("devices"), "Character devices:\n195 nvidia\n237 nvidia-caps\n").unwrap();
    let raw: Arc<dyn DeviceSource> = Arc::new(MockSource::new("n1", parse_spec(CARDS).unwrap()));
    let source = Arc::new(MigView::new(raw, node.sim.clone()));
    let settings = MigSettings { mode: DynamicMig::All, ..Default::default() };
    let options = StateOptions { mig: Some(MigPrepare { control: node.sim.clone(), settings }), ..Default::default() };
    let n = &node.node;
    let cdi = CdiOptions { proc_root, ..n.cdi() };
    let storage = Storage { checkpoint: Checkpoint::new(n.checkpoint_dir()), cdi, specs: n.specs() };
    let claims = fixed(vec![placement("c1", 1, "hami-gpu-0-mig-1g-10gb-3")], vec![]);
    let state = State::recover(claims, source, SharingConfig::default(), "n1".into(), storage, options).await.unwrap();
    state.prepare(&cref("c1", 1)).await.unwrap();
    let spec = node.node.specs().read(&uid(1)).unwrap().unwrap();
    let nodes: Vec<(String, Option<i64>, Option<i64>)> =
        spec.devices[0].container_edits.device_nodes.iter().map(|d| (d.path.clone(), d.major, d.minor)).collect();
    assert_eq!(
        nodes,
        vec![
            ("/dev/nvidia0".into(), Some(195), Some(0)),
            ("/dev/nvidia-caps/nvidia-cap12".into(), Some(237), Some(12)),
            ("/dev/nvidia-caps/nvidia-cap13".into(), Some(237), Some(13)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_sharing_a_placement_instance_get_one_instance_and_their_own_limits() {
    let node = MigNode { shared: true, ..MigNode::new() };
    let device = "hami-gpu-0-mig-3g-40gb-4";
    let claims = vec![
        claim("a", 1, &[&share(device, "gpu", 1, "10Gi", 40)], None),
        claim("b", 2, &[&share(device, "gpu", 2, "20Gi", 60)], None),
        claim("c", 3, &[&share(device, "gpu", 3, "20Gi", 0)], None),
    ];
    let state = node.state(claims).await;
    state.prepare(&cref("a", 1)).await.unwrap();
    state.prepare(&cref("b", 2)).await.unwrap();
    let made = node.instances();
    assert_eq!(made.len(), 1);
    assert_eq!((made[0].gi_profile_id, made[0].start), (9, 4));
    for (n, memory, cores) in [(1, "10240m", "40"), (2, "20480m", "60")] {
        let spec = node.node.specs().read(&uid(n)).unwrap().unwrap();
        assert_eq!(env(&spec, "NVIDIA_VISIBLE_DEVICES"), Some(made[0].uuid.clone()));
        assert_eq!(env(&spec, "CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(), Some(memory));
        assert_eq!(env(&spec, "CUDA_DEVICE_SM_LIMIT").as_deref(), Some(cores));
    }
    // The instance's own memory bounds its shares: 3g.40gb holds 40448Mi, 30Gi are taken.
    let err = state.prepare(&cref("c", 3)).await.unwrap_err();
    assert_eq!(err.reason(), "over_capacity", "{}", err.chain());
    assert_eq!(node.instances(), made);
    state.unprepare(&id(1)).await.unwrap();
    assert_eq!(node.instances(), made, "b still uses it");
    state.unprepare(&id(2)).await.unwrap();
    assert_eq!(node.instances(), Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_the_container_could_not_open_is_destroyed_and_the_claim_fails() {
    let node = MigNode::new();
    let raw: Arc<dyn DeviceSource> = Arc::new(MockSource::new("n1", parse_spec(CARDS).unwrap()));
    let source = Arc::new(MigView::new(raw, node.sim.clone()));
    let settings = MigSettings { mode: DynamicMig::All, ..Default::default() };
    let options = StateOptions { mig: Some(MigPrepare { control: node.sim.clone(), settings }), ..Default::default() };
    let n = &node.node;
    // A real node (no mock nodes) whose driver wrote no capability files for the instance.
    let cdi = CdiOptions { proc_root: n.root.path().join("proc"), synthesize_nodes: false, ..n.cdi() };
    let storage = Storage { checkpoint: Checkpoint::new(n.checkpoint_dir()), cdi, specs: n.specs() };
    let claims = fixed(vec![placement("c1", 1, "hami-gpu-0-mig-1g-10gb-3")], vec![]);
    let state = State::recover(claims, source, SharingConfig::default(), "n1".into(), storage, options).await.unwrap();
    let err = state.prepare(&cref("c1", 1)).await.unwrap_err();
    assert_eq!(err.reason(), "mig");
    assert!(err.chain().contains("capabilities/gpu0/mig/gi1"), "{}", err.chain());
    assert_eq!(node.instances(), Vec::new(), "the instance made for it is destroyed");
    assert!(node.node.files().is_empty(), "{:?}", node.node.files());
    assert_eq!(state.prepared_count().await, 0);
}
