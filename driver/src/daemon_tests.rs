use super::*;
use crate::metrics::labels;

#[test]
fn every_family_is_exposed() {
    let t = Telemetry::new("n1".into());
    t.calls.prepare_seconds.get_or_create(&labels(&[("result", "ok")])).observe(0.001);
    t.calls.unprepare_seconds.get_or_create(&labels(&[("result", "ok")])).observe(0.001);
    t.publish.slice_writes.get_or_create(&labels(&[("op", "apply"), ("result", "ok")])).inc();
    let text = t.metrics.encode();
    // Families without series are left out of the exposition; these have one each.
    for name in [
        "vgpu_dra_unprepare_duration_seconds_count{result=\"ok\"} 1",
        "vgpu_dra_slice_writes_total{op=\"apply\",result=\"ok\"} 1",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
}

/// docs/metrics.md lists exactly the families the driver registers, under the names a query
/// uses (counters with `_total`).
#[test]
fn metrics_doc_lists_every_family() {
    let t = Telemetry::new("n1".into());
    let l = labels(&[("x", "y")]);
    let r = &t.report;
    for f in r.float_families() {
        f.get_or_create(&l).set(1.0);
    }
    r.overcommitted.get_or_create(&l).set(1);
    r.prepared.set(1);
    t.calls.prepare_seconds.get_or_create(&l).observe(0.001);
    t.calls.unprepare_seconds.get_or_create(&l).observe(0.001);
    for c in [&t.calls.prepare_errors, &t.publish.slice_writes, &t.read_ahead.prefetch] {
        c.get_or_create(&l).inc();
    }
    t.read_ahead.pod_events.inc();
    t.monitor.bad_regions.get_or_create(&l).inc();
    t.monitor.writes.get_or_create(&l).inc();
    t.status.count("written");
    let key = crate::monitor::metrics::SeriesKey {
        namespace: "ns".into(),
        pod: "p".into(),
        container: "c".into(),
        claim_uid: "u-1".into(),
        index: 0,
        uuid: "GPU-a".into(),
    };
    let usage = crate::monitor::region::DeviceUsage::default();
    t.monitor.show(vec![(key, crate::monitor::metrics::CardFigures { usage, limit: 1, since_last_kernel: Some(1) })]);
    let exposed: std::collections::BTreeSet<String> = t
        .metrics
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| match l.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            Some((name, _)) => name.to_owned(),
            None => l.to_owned(),
        })
        .collect();
    let doc = include_str!("../../docs/metrics.md");
    let documented: std::collections::BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned()))
        .filter(|n| !n.starts_with('/'))
        .collect();
    assert_eq!(exposed, documented, "docs/metrics.md and the registry differ");
}

/// The built app serves the kubelet's sockets, answers the probes' calls on them, and stops
/// within the drain deadline when cancelled, removing its registration socket: an API server
/// that answers nothing useful beyond the start-up check (every other request a 404) stops no
/// part from starting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_app_serves_the_kubelet_and_stops_when_cancelled() {
    use clap::Parser;

    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| format!("{}", dir.path().join(name).display());
    let cli = crate::cli::Cli::try_parse_from([
        "vgpu-dra".to_owned(),
        "kubelet-plugin".to_owned(),
        "--node-name=n1".to_owned(),
        format!("--kubelet-dir={}", at("kubelet")),
        format!("--cdi-dir={}", at("cdi")),
        format!("--hami-core-dir={}", at("vgpu")),
        format!("--lock-dir={}", at("lock")),
        "--metrics-address=127.0.0.1:0".to_owned(),
        "--mock-gpus=2xTesla T4:15Gi".to_owned(),
    ])
    .unwrap();
    let crate::cli::Command::KubeletPlugin(args) = cli.command else { panic!("not the kubelet plugin") };
    let resolved = args.config.resolve_all(&args.node_name).unwrap();
    let devices = DeviceLoop::start(args.source.daemon_source(&args.node_name).unwrap(), DeviceLoopOptions::default()).unwrap();
    // It serves what the start-up check asks (the DRA group, a dry-run slice echoed back),
    // and nothing else.
    let service = tower::service_fn(|request: http::Request<kube::client::Body>| async move {
        let (parts, body) = request.into_parts();
        let (status, body) = match (parts.method.as_str(), parts.uri.path()) {
            ("GET", "/apis/resource.k8s.io/v1") => (
                200,
                br#"{"kind":"APIResourceList","groupVersion":"resource.k8s.io/v1","resources":[{"name":"resourceslices","singularName":"","namespaced":false,"kind":"ResourceSlice","verbs":[]},{"name":"resourceclaims","singularName":"","namespaced":true,"kind":"ResourceClaim","verbs":[]}]}"#.to_vec(),
            ),
            ("POST", "/apis/resource.k8s.io/v1/resourceslices") => (201, body.collect_bytes().await.unwrap().to_vec()),
            _ => (404, br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound"}"#.to_vec()),
        };
        Ok::<_, std::convert::Infallible>(
            http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(body))
                .unwrap(),
        )
    });
    let app = App::build(&args, &resolved, (devices.source(), None), kube::Client::new(service, "default")).await.unwrap();
    let registration = app.paths.registration_socket.clone();
    let sockets = crate::plugin::kubelet::probe::PluginSockets::from(&app.paths);
    let metrics = app.telemetry.metrics.clone();
    let cancel = CancellationToken::new();
    let parts = app.spawn(&cancel);
    let started = std::time::Instant::now();
    while !registration.exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "no registration socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The real services answer the liveness probe's calls; its empty prepare counts nowhere.
    sockets.check(crate::plugin::kubelet::probe::CALL_TIMEOUT).await.expect("both sockets answer");
    assert!(!metrics.encode().contains("vgpu_dra_prepare_duration_seconds_count"), "the probe is not a prepare");
    cancel.cancel();
    tokio::time::timeout(DRAIN_GRACE, parts).await.expect("stopped within the drain deadline").unwrap();
    assert!(!registration.exists(), "the kubelet sees the plugin leave");
}
