use serde_json::json;

use super::*;

const DRIVER: &str = "gpu.example.com";
const NODE: &str = "node-a";

fn pod(uid: &str, phase: &str, claims: &[(&str, Option<&str>)]) -> Pod {
    // Each entry: the pod's claim entry name, and its claim's name (`None`: from a template, the
    // name in the status).
    let entries: Vec<_> = claims
        .iter()
        .map(|(entry, name)| match name {
            Some(n) => json!({"name": entry, "resourceClaimName": n}),
            None => json!({"name": entry, "resourceClaimTemplateName": "t"}),
        })
        .collect();
    let statuses: Vec<_> = claims
        .iter()
        .filter(|(_, name)| name.is_none())
        .map(|(entry, _)| json!({"name": entry, "resourceClaimName": format!("{uid}-{entry}")}))
        .collect();
    let uses: Vec<_> = claims.iter().map(|(entry, _)| json!({"name": entry})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{uid}"), "namespace": "ns", "uid": uid},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": entries,
            "containers": [{"name": "main", "image": "secret.example.com/app", "env": [{"name": "TOKEN", "value": "s3cret"}],
                "resources": {"claims": uses, "limits": {"cpu": "1"}}}],
        },
        "status": {"phase": phase, "resourceClaimStatuses": statuses},
    }))
    .unwrap()
}

fn claim(name: &str, uid: &str, pool: &str, reserved_for: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "managedFields": [{"manager": "kube-scheduler"}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c"}}]}},
        "status": {
            "allocation": {"devices": {"results": [{"driver": DRIVER, "pool": pool, "device": "hami-gpu-0", "request": "gpu"}]}},
            "reservedFor": [{"resource": "pods", "name": format!("pod-{reserved_for}"), "uid": reserved_for}],
        },
    }))
    .unwrap()
}

fn wanted(name: &str, uid: &str) -> ClaimRef {
    ClaimRef::new("ns", name, uid).unwrap()
}

fn read(name: &str, pod: &str) -> Read {
    Read { namespace: "ns".into(), name: name.into(), pod: pod.into() }
}

fn store() -> NodePods {
    NodePods::new(DRIVER, NODE, None)
}

const WAIT: Duration = Duration::from_millis(100);

#[test]
fn a_pending_pod_has_each_of_its_claims_read_once() {
    let pods = store();
    let p = pending_p1();
    let mut reads = pods.apply(watcher::Event::Apply(p.clone()));
    reads.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(reads, vec![read("direct", "p1"), read("p1-b", "p1")], "by name, through the status, once each");
    assert!(pods.apply(watcher::Event::Apply(p)).is_empty(), "an update of the pod reads nothing again");
    assert_eq!(pods.len().0, 1);
    // Pods past pending had every claim prepared before they started, and pods without claims
    // have none to prepare: neither is kept, nor has a claim read.
    let others = [
        pod("p2", "Running", &[("a", Some("other"))]),
        pod("p3", "Pending", &[]),
        pod("p4", "Unknown", &[("a", Some("other"))]),
        pod("p5", "Succeeded", &[("a", Some("other"))]),
    ];
    for other in &others {
        assert!(pods.apply(watcher::Event::Apply(other.clone())).is_empty(), "{other:?}");
        assert_eq!(pods.len().0, 1, "{other:?}");
    }
    // Nor when a relist finds them.
    pods.apply(watcher::Event::Init);
    assert!(pods.apply(watcher::Event::InitApply(pending_p1())).is_empty());
    for other in others {
        assert!(pods.apply(watcher::Event::InitApply(other)).is_empty());
    }
    pods.apply(watcher::Event::InitDone);
    assert_eq!(pods.len().0, 1);
}

fn pending_p1() -> Pod {
    pod("p1", "Pending", &[("a", Some("direct")), ("b", None), ("c", Some("direct"))])
}

#[tokio::test]
async fn a_pod_that_starts_is_forgotten_with_what_was_read_ahead_for_it() {
    let pods = store();
    let (ns, name) = (Namespace::new("ns").unwrap(), ObjectName::new("pod-p1").unwrap());
    let claims = [("a", Some("c1")), ("b", Some("c2"))];
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &claims)));
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    pods.offer(&read("c2", "p1"), Some(claim("c2", "u2", NODE, "p1")));
    // c2 was prepared from the API (say its read ahead came late): its read ahead stays behind.
    pods.prepared(&wanted("c1", "u1"));
    assert_eq!(pods.len(), (1, 1));
    assert!(pods.apply(watcher::Event::Apply(pod("p1", "Running", &claims))).is_empty());
    assert_eq!(pods.len(), (0, 0), "neither the pod nor its claim read ahead is kept once it runs");
    assert!(pods.pod(&ns, &name, "p1").is_none());
    assert!(pods.take(&wanted("c2", "u2"), WAIT).await.is_none(), "a late prepare reads the API");
}

#[test]
fn only_what_the_container_check_reads_of_a_pod_is_kept() {
    let pods = store();
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &[("a", None)])));
    let (ns, name) = (Namespace::new("ns").unwrap(), ObjectName::new("pod-p1").unwrap());
    let kept = pods.pod(&ns, &name, "p1").expect("kept");
    assert!(pods.pod(&ns, &name, "another-uid").is_none(), "the UID must match");
    assert!(pods.pod(&Namespace::new("other").unwrap(), &name, "p1").is_none(), "and the namespace");
    let text = serde_json::to_string(&kept).unwrap();
    for secret in ["s3cret", "secret.example.com", "cpu"] {
        assert!(!text.contains(secret), "{secret} kept: {text}");
    }
    let uses = crate::plugin::containers::uses_of(&kept, "p1-a");
    assert_eq!(uses.len(), 1, "the check still sees which container uses the claim: {text}");
    assert_eq!(uses[0].container, "main");
}

#[tokio::test]
async fn a_claim_read_ahead_is_handed_out_while_current_and_never_after() {
    let pods = store();
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &[("a", Some("c1"))])));
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    let taken = pods.take(&wanted("c1", "u1"), WAIT).await.expect("current");
    assert!(taken.metadata.managed_fields.is_none(), "field managers are not kept");
    assert!(allocated_here(&taken, DRIVER, NODE), "the allocation is kept: the prepare uses it");
    assert_eq!(pods.take(&wanted("c1", "u1"), WAIT).await, Some(taken), "a retry takes it again while its pod is bound");
    assert!(pods.take(&wanted("c1", "u-other"), WAIT).await.is_none(), "another UID: the claim was made anew");
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_none(), "and what was read of the old one is gone");
    assert!(pods.take(&wanted("c9", "u9"), WAIT).await.is_none(), "never read");

    // Not kept: another node's, another driver's, reserved for another pod, not allocated.
    for found in [
        claim("c1", "u1", "node-b", "p1"),
        claim("c1", "u1", NODE, "p9"),
        serde_json::from_value(json!({"metadata": {"name": "c1", "namespace": "ns", "uid": "u1"}, "spec": {}})).unwrap(),
        {
            let mut c = claim("c1", "u1", NODE, "p1");
            c.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap().results.as_mut().unwrap()[0]
                .driver = "other.example.com".into();
            c
        },
    ] {
        pods.offer(&read("c1", "p1"), Some(found.clone()));
        assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_none(), "{found:?}");
    }
    pods.offer(&read("c1", "p1"), None);
    assert_eq!(pods.len().1, 0);
}

#[tokio::test]
async fn what_was_read_ahead_goes_once_the_pods_claims_are_prepared() {
    let pods = store();
    let (ns, name) = (Namespace::new("ns").unwrap(), ObjectName::new("pod-p1").unwrap());
    let p = pod("p1", "Pending", &[("a", Some("c1")), ("b", Some("c2"))]);
    pods.apply(watcher::Event::Apply(p.clone()));
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    pods.offer(&read("c2", "p1"), Some(claim("c2", "u2", NODE, "p1")));
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_some());
    // A claim of another UID prepared under the same name drops nothing.
    pods.prepared(&wanted("c1", "u-other"));
    assert_eq!(pods.len().1, 2);
    pods.prepared(&wanted("c1", "u1"));
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_none(), "prepared: a retry reads the API");
    assert!(pods.pod(&ns, &name, "p1").is_some(), "c2 is still to be prepared and reads the pod");
    assert!(pods.take(&wanted("c2", "u2"), WAIT).await.is_some());
    pods.prepared(&wanted("c2", "u2"));
    assert_eq!(pods.len(), (1, 0), "the pod stays known as bound here");
    assert!(pods.pod(&ns, &name, "p1").is_none(), "its JSON is gone");
    // An update of the pod while it is pending keeps none either, and reads nothing again.
    assert!(pods.apply(watcher::Event::Apply(p)).is_empty());
    assert!(pods.pod(&ns, &name, "p1").is_none());
    assert_eq!(pods.len(), (1, 0));
}

#[tokio::test]
async fn a_pod_that_leaves_takes_its_claims_read_ahead_with_it() {
    let pods = store();
    for (uid, name) in [("p1", "c1"), ("p2", "c2"), ("p3", "c3"), ("p4", "c4")] {
        pods.apply(watcher::Event::Apply(pod(uid, "Pending", &[("a", Some(name))])));
        pods.offer(&read(name, uid), Some(claim(name, &format!("u-{name}"), NODE, uid)));
    }
    assert_eq!(pods.len(), (4, 4));
    pods.apply(watcher::Event::Delete(pod("p1", "Pending", &[])));
    let mut deleting = pod("p2", "Pending", &[("a", Some("c2"))]);
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
    pods.apply(watcher::Event::Apply(deleting));
    pods.apply(watcher::Event::Apply(pod("p3", "Failed", &[("a", Some("c3"))])));
    assert_eq!(pods.len(), (1, 1));
    for (name, uid) in [("c1", "u-c1"), ("c2", "u-c2"), ("c3", "u-c3")] {
        assert!(pods.take(&wanted(name, uid), WAIT).await.is_none(), "{name}");
    }
    // A read that comes back after its pod left is not kept.
    pods.apply(watcher::Event::Delete(pod("p4", "Pending", &[])));
    pods.offer(&read("c4", "p4"), Some(claim("c4", "u-c4", NODE, "p4")));
    assert!(pods.take(&wanted("c4", "u-c4"), WAIT).await.is_none());
    assert_eq!(pods.len(), (0, 0));
}

#[tokio::test]
async fn a_relist_forgets_pods_gone_meanwhile_and_reads_no_claim_twice() {
    let pods = store();
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &[("a", Some("c1"))])));
    pods.apply(watcher::Event::Apply(pod("p2", "Pending", &[("a", Some("c2"))])));
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    pods.offer(&read("c2", "p2"), Some(claim("c2", "u2", NODE, "p2")));
    // The watch restarts: p2 was deleted while it was down, p3 is new.
    assert!(pods.apply(watcher::Event::Init).is_empty());
    assert!(pods.apply(watcher::Event::InitApply(pod("p1", "Pending", &[("a", Some("c1"))]))).is_empty(), "asked already");
    assert_eq!(pods.apply(watcher::Event::InitApply(pod("p3", "Pending", &[("a", Some("c3"))]))), vec![read("c3", "p3")]);
    // A read ahead that ends during the relist is kept for a pod the relist has listed.
    pods.offer(&read("c3", "p3"), Some(claim("c3", "u3", NODE, "p3")));
    assert!(pods.apply(watcher::Event::InitDone).is_empty());
    assert_eq!(pods.len(), (2, 2));
    assert!(pods.take(&wanted("c2", "u2"), WAIT).await.is_none(), "p2 is gone");
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_some());
    assert!(pods.take(&wanted("c3", "u3"), WAIT).await.is_some());
}

#[tokio::test]
async fn a_prepare_waits_for_a_read_under_way_and_not_longer_than_told() {
    let pods = store();
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &[("a", Some("c1")), ("b", Some("c2"))])));
    for name in ["c1", "c2"] {
        let (tx, rx) = watch::channel(false);
        pods.lock().claims.insert(format!("ns/{name}"), Slot::Reading { done: rx });
        let (store, delay) = (pods.clone(), if name == "c1" { 20 } else { 2_000 });
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            store.offer(&read(name, "p1"), Some(claim(name, &format!("u-{name}"), NODE, "p1")));
            let _ = tx.send(true);
        });
    }
    let started = std::time::Instant::now();
    assert!(pods.take(&wanted("c1", "u-c1"), Duration::from_secs(5)).await.is_some(), "the read under way is waited for");
    assert!(pods.take(&wanted("c2", "u-c2"), Duration::from_millis(50)).await.is_none(), "too slow: the API is read instead");
    assert!(started.elapsed() < Duration::from_millis(1_500), "{:?}", started.elapsed());
}

#[tokio::test]
async fn an_unprepared_claim_is_read_anew_for_the_next_pod_even_before_the_watch_says_so() {
    let pods = store();
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &[("a", Some("c1"))])));
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_some());
    // p1 is done with it; the kubelet unprepares it before this watch hears that p1 finished.
    pods.forget(&Uid::new("u1").unwrap());
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_none(), "the next pod's prepare reads the API");
    assert_eq!(pods.len(), (1, 0));
}

/// Finding 2 of the tenant-safety issue: a watch that failed may have missed a pod's deletion,
/// so nothing read before is handed out, nor anything at all until a full list is done.
#[tokio::test]
async fn a_failed_watch_hands_out_nothing_until_the_next_full_list() {
    let pods = store();
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &[("a", Some("c1"))])));
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    pods.invalidate();
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_none(), "read before the failure");
    assert_eq!(pods.len().1, 0, "and dropped");
    // The relist brings p1 back (it was not deleted after all) and reads its claim anew...
    pods.apply(watcher::Event::Init);
    let reads = pods.apply(watcher::Event::InitApply(pod("p1", "Pending", &[("a", Some("c1"))])));
    assert!(reads.is_empty(), "asked already, so not asked again by the relist");
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_none(), "not before the list is done");
    pods.apply(watcher::Event::InitDone);
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_some(), "current again once it is");
}

/// A claim read ahead for a pod that did not start within the age bound is read anew.
#[tokio::test(start_paused = true)]
async fn a_claim_read_ahead_too_long_ago_is_not_handed_out() {
    let pods = store();
    pods.apply(watcher::Event::Apply(pod("p1", "Pending", &[("a", Some("c1"))])));
    pods.offer(&read("c1", "p1"), Some(claim("c1", "u1", NODE, "p1")));
    tokio::time::advance(MAX_READ_AHEAD_AGE - Duration::from_secs(1)).await;
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_some());
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(pods.take(&wanted("c1", "u1"), WAIT).await.is_none());
    assert_eq!(pods.len().1, 0);
}

/// An API server that answers every request with a 500 and notes when it was asked.
fn failing_api() -> (kube::Client, Arc<Mutex<Vec<tokio::time::Instant>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let times = asked.clone();
    let service = tower::service_fn(move |_request: http::Request<kube::client::Body>| {
        times.lock().unwrap().push(tokio::time::Instant::now());
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd is down", "code": 500});
        let response = http::Response::builder()
            .status(500)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(body.to_string().into_bytes()))
            .unwrap();
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    (kube::Client::new(service, "default"), asked)
}

/// Finding 7 of the tenant-safety issue: a watch the API server keeps failing is retried after
/// growing, jittered pauses (not every 500 ms), and each failure is logged at warn with its cause.
#[tokio::test(start_paused = true)]
async fn a_pod_watch_that_keeps_failing_is_retried_ever_more_slowly_and_says_why() {
    let (warnings, _guard) = crate::testlog::Warnings::capture();
    let (client, asked) = failing_api();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(store().run(client, Duration::from_secs(5), cancel.clone()));
    tokio::time::sleep(Duration::from_secs(120)).await;
    cancel.cancel();
    task.await.unwrap();

    let times = asked.lock().unwrap().clone();
    crate::testlog::assert_backed_off(&times, &warnings, &["etcd is down", NODE]);
}
