//! Prepares and unprepares in flight at once: admission happens under the lock, the files are
//! made visible outside it, and whatever the interleaving, what is on disk and in the ledger is
//! what the kubelet asked last.

use super::*;

/// Claims `1..=n`, each one 256Mi and 1 core of card `n % 2`.
fn small_claims(n: u32) -> Vec<ResourceClaim> {
    (1..=n).map(|i| claim(&format!("c{i}"), i, &[&share(&format!("hami-gpu-{}", i % 2), "gpu", i, "256Mi", 1)], None)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepares_and_unprepares_in_flight_end_as_last_asked() {
    // Eight per card: within the default split count of 10.
    const N: u32 = 16;
    let node = Node::new();
    let state = Arc::new(node.state(small_claims(N), vec![]).await);
    // Every claim prepared three times at once, and every other one unprepared three times
    // while that runs.
    let mut tasks = Vec::new();
    for round in 0..3 {
        for i in 1..=N {
            let prepare = state.clone();
            tasks.push(tokio::spawn(async move { prepare.prepare(&cref(&format!("c{i}"), i)).await.map(|_| ()) }));
            if (i + round) % 2 == 0 {
                let unprepare = state.clone();
                tasks.push(tokio::spawn(async move { unprepare.unprepare(&Uid::new(uid(i)).unwrap()).await }));
            }
        }
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    // Whichever came first for each claim, its record, spec and directory agree with the state.
    let prepared: Vec<String> = state.each_prepared(|p| Some(p.claim.uid.to_string())).await;
    for i in 1..=N {
        let is = prepared.contains(&uid(i));
        assert_eq!(node.checkpoint_dir().join(format!("{}.json", uid(i))).exists(), is, "record of claim {i}");
        assert_eq!(node.specs().read(&uid(i)).unwrap().is_some(), is, "spec of claim {i}");
        assert_eq!(node.cdi().claims_root.join(uid(i)).exists(), is, "directory of claim {i}");
    }
    // The last word per claim: odd ones prepared, even ones unprepared.
    for i in 1..=N {
        if i % 2 == 1 {
            state.prepare(&cref(&format!("c{i}"), i)).await.unwrap();
        } else {
            state.unprepare(&Uid::new(uid(i)).unwrap()).await.unwrap();
        }
    }
    let kept: Vec<String> = (1..=N).filter(|i| i % 2 == 1).map(uid).collect();
    assert_eq!(state.prepared_count().await, kept.len());
    let mut records: Vec<String> = std::fs::read_dir(node.checkpoint_dir())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
        .filter(|n| !n.starts_with('.'))
        .collect();
    records.sort();
    assert_eq!(records, kept, "one record per prepared claim, none for the others");
    let mut specs: Vec<String> = node.specs().list_owned().unwrap().into_iter().map(|s| s.id).collect();
    specs.sort();
    assert_eq!(specs, kept, "one spec per prepared claim");
    for i in 1..=N {
        assert_eq!(node.cdi().claims_root.join(uid(i)).exists(), i % 2 == 1, "directory of claim {i}");
    }
    // The odd claims all sit on card 1: 8 x 256Mi; card 0 carries nothing.
    let usage = state.snapshot().await.usage;
    let used = |card: &str| usage.get(&vgpu_scheduling::DeviceName::new(card).unwrap()).map(|u| u["memory"].to_string());
    assert_eq!(used("hami-gpu-1").as_deref(), Some("2Gi"));
    assert!(used("hami-gpu-0").is_none_or(|m| m == "0"), "{usage:?}");
    // A restart reads the same: every record durable and whole.
    drop(state);
    let again = node.state(small_claims(N), vec![]).await;
    assert_eq!(again.prepared_count().await, kept.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_read_at_prepare_names_the_claims_consumer_without_another_read() {
    let node = Node::new();
    let pod: Pod = serde_saphyr::from_str(
        r"
metadata: {name: p, namespace: ns, uid: pod-1}
spec:
  resourceClaims: [{name: x, resourceClaimName: c1}]
  initContainers: [{name: setup, image: i, resources: {claims: [{name: x}]}}]
  containers: [{name: main, image: i, resources: {claims: [{name: x}]}}, {name: side, image: i}]
",
    )
    .unwrap();
    let c1 = claim("c1", 1, &[&share("hami-gpu-0", "gpu", 1, "1Gi", 10)], Some(("p", "pod-1")));
    let state = node.state(vec![c1.clone()], vec![pod.clone()]).await;
    state.prepare(&cref("c1", 1)).await.unwrap();
    let consumers = state.each_prepared(|p| p.consumer.clone()).await;
    assert_eq!(
        consumers,
        vec![crate::plugin::containers::Consumer { pod: "p".into(), containers: vec!["setup".into(), "main".into()] }]
    );
    let shares = state.snapshot().await.shares;
    assert_eq!(shares.iter().map(|s| s.pod.as_deref()).collect::<Vec<_>>(), vec![Some("p")]);
    // Not in the record on disk: a restart knows no consumer until it reads the pod, and then
    // keeps it for the metrics.
    drop(state);
    let again = node.state(vec![c1], vec![pod]).await;
    assert_eq!(again.snapshot().await.shares.iter().map(|s| s.pod.clone()).collect::<Vec<_>>(), vec![None]);
    assert_eq!(
        again.consumer_of(&cref("c1", 1)).await.unwrap(),
        Some(("p".to_owned(), vec!["setup".to_owned(), "main".to_owned()]))
    );
    assert_eq!(again.snapshot().await.shares.iter().map(|s| s.pod.as_deref()).collect::<Vec<_>>(), vec![Some("p")]);
}

/// What the state holds per prepared claim, itemised by allocation site when run under
/// heaptrack (BENCHMARKS.md, issue 35): 1,000 claims on 8 cards are prepared and the state is
/// leaked, so every byte it holds shows as a leak of the site that allocated it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run under heaptrack"]
async fn heap_held_for_1000_prepared_claims() {
    let node = Node::new();
    let source = Arc::new(MockSource::new("n1", parse_spec("8xNVIDIA H200:141Gi").unwrap()));
    let storage = Storage { checkpoint: Checkpoint::new(node.checkpoint_dir()), cdi: node.cdi(), specs: node.specs() };
    let claims: Vec<ResourceClaim> = (1..=1000)
        .map(|i| claim(&format!("c{i}"), i, &[&share(&format!("hami-gpu-{}", i % 8), "gpu", i, "128Mi", 0)], None))
        .collect();
    let config = SharingConfig { device_split_count: 200, ..SharingConfig::default() };
    let state =
        State::recover(fixed(claims, vec![]), source, config, "n1".into(), storage, StateOptions::default()).await.unwrap();
    for i in 1..=1000 {
        state.prepare(&cref(&format!("c{i}"), i)).await.unwrap();
    }
    assert_eq!(state.prepared_count().await, 1000);
    std::mem::forget(state);
}
