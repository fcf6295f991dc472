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

/// An unprepare makes its record's removal durable without the lock, with the fsync that the
/// others in flight share: with that fsync held off, every unprepare in flight has removed its
/// record and waits, the state still answers (counting them prepared, their specs still there),
/// and a prepare of one of those claims waits for its unprepare to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepares_in_flight_share_the_fsync_and_leave_the_lock_free() {
    const N: u32 = 8;
    let node = Node::new();
    let state = Arc::new(node.state(small_claims(N), vec![]).await);
    for i in 1..=N {
        state.prepare(&cref(&format!("c{i}"), i)).await.unwrap();
    }
    let record = |i: u32| node.checkpoint_dir().join(format!("{}.json", uid(i)));
    let held = state.record_sync.hold().await;
    let unprepares: Vec<_> = (1..=N)
        .map(|i| {
            let state = state.clone();
            tokio::spawn(async move { state.unprepare(&Uid::new(uid(i)).unwrap()).await })
        })
        .collect();
    let removed = async {
        while (1..=N).any(|i| record(i).exists()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), removed).await.expect("every unprepare removes its record before the fsync");
    let snapshot = tokio::time::timeout(Duration::from_secs(5), state.snapshot()).await.expect("the lock is free meanwhile");
    assert_eq!(snapshot.prepared, N as usize, "prepared until the removal is durable");
    for i in 1..=N {
        assert!(
            node.specs().read(&uid(i)).unwrap().is_some(),
            "the spec of claim {i} goes only after its record is durably gone"
        );
    }
    // The periodic check runs meanwhile and leaves the claims being unprepared alone: claim 2's
    // spec and directory, lost as a tmpfs loses them, are not made again.
    std::fs::remove_file(node.specs().file_for(&uid(2)).unwrap()).unwrap();
    std::fs::remove_dir_all(node.cdi().claims_root.join(uid(2))).unwrap();
    tokio::time::timeout(Duration::from_secs(5), state.check_once()).await.expect("the lock is free meanwhile");
    assert!(!node.cdi().claims_root.join(uid(2)).exists(), "no repair of a claim being unprepared");
    let again = {
        let state = state.clone();
        tokio::spawn(async move { state.prepare(&cref("c1", 1)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(unprepares.iter().all(|u| !u.is_finished()), "no unprepare answers before the fsync");
    assert!(!again.is_finished(), "a prepare of a claim being unprepared waits for it");
    drop(held);
    for u in unprepares {
        u.await.unwrap().unwrap();
    }
    again.await.unwrap().unwrap();
    assert_eq!(state.each_prepared(|p| Some(p.claim.uid.to_string())).await, vec![uid(1)]);
    assert!(record(1).exists() && node.specs().read(&uid(1)).unwrap().is_some() && node.cdi().claims_root.join(uid(1)).exists());
    for i in 2..=N {
        assert!(!record(i).exists(), "record of claim {i}");
        assert!(node.specs().read(&uid(i)).unwrap().is_none(), "spec of claim {i}");
        assert!(!node.cdi().claims_root.join(uid(i)).exists(), "directory of claim {i}");
    }
    let usage = state.snapshot().await.usage;
    let used: Vec<String> = usage.values().map(|u| u["memory"].to_string()).filter(|m| m != "0").collect();
    assert_eq!(used, ["256Mi"], "only claim 1's share is held: {usage:?}");
    drop(state);
    assert_eq!(node.state(small_claims(N), vec![]).await.prepared_count().await, 1, "a restart reads the same");
}

/// A claim that fits only once an unprepare in flight gives its shares back waits for it
/// instead of being refused; one that does not fit even then is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_waits_for_the_capacity_an_unprepare_in_flight_gives_back() {
    let node = Node::new();
    // A 15Gi card: 12Gi and 8Gi do not fit together, 8Gi and 8Gi do not either.
    let big = claim("big", 1, &[&share("hami-gpu-0", "gpu", 1, "12Gi", 0)], None);
    let next = claim("next", 2, &[&share("hami-gpu-0", "gpu", 2, "8Gi", 0)], None);
    let third = claim("third", 3, &[&share("hami-gpu-0", "gpu", 3, "8Gi", 0)], None);
    let state = Arc::new(node.state(vec![big, next, third], vec![]).await);
    state.prepare(&cref("big", 1)).await.unwrap();
    let held = state.record_sync.hold().await;
    let unprepare = {
        let state = state.clone();
        tokio::spawn(async move { state.unprepare(&Uid::new(uid(1)).unwrap()).await })
    };
    let record = node.checkpoint_dir().join(format!("{}.json", uid(1)));
    tokio::time::timeout(Duration::from_secs(10), async {
        while record.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the unprepare removes its record");
    let prepare = {
        let state = state.clone();
        tokio::spawn(async move { state.prepare(&cref("next", 2)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!prepare.is_finished(), "neither refused nor admitted while the big claim's record may come back");
    drop(held);
    unprepare.await.unwrap().unwrap();
    prepare.await.unwrap().expect("admitted once the big claim is gone");
    // Nothing in flight: a claim that does not fit is refused at once.
    let refused = tokio::time::timeout(Duration::from_secs(5), state.prepare(&cref("third", 3))).await.expect("not waiting");
    assert!(refused.is_err(), "8Gi beside 8Gi on a 15Gi card");
    assert_eq!(state.each_prepared(|p| Some(p.claim.uid.to_string())).await, vec![uid(2)]);
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
