//! The benchmark harness itself stays working: a tiny run against the debug driver produces
//! every figure. (The figures are judged in BENCHMARKS.md, never here.)

#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

#[test]
fn a_tiny_run_reports_every_figure() {
    let (report, table) =
        bench(&["--claims", "6", "--sizes", "1,5", "--concurrency", "2", "--nodes", "2", "--webhook-pods", "6"]);
    let single = &report["single"];
    // Per size: sequential, then 2 and 3 in flight.
    let latency = single["latency"].as_array().unwrap();
    assert_eq!(latency.len(), 6, "{report:#}");
    assert_eq!(latency[5]["prepare"]["calls"], 5);
    assert_eq!(latency[5]["mode"], "concurrent(3)");
    // vgpu-dra counts its fsyncs: a prepare fsyncs its own checkpoint record, and an unprepare
    // alone fsyncs the directory its record left; unprepares in flight may share that fsync.
    for run in latency {
        let (prepare, unprepare) = (run["prepare_fsyncs_per_claim"].as_f64(), run["unprepare_fsyncs_per_claim"].as_f64());
        let alone = run["mode"] == "sequential";
        assert!(prepare.is_some_and(|f| f >= 1.0), "{run:#}");
        assert!(unprepare.is_some_and(|f| if alone { f >= 1.0 } else { f > 0.0 }), "{run:#}");
        // The pod watch is off by default: nothing is read ahead, so there is no share to tell.
        assert!(run["prepares_read_ahead"].is_null(), "{run:#}");
    }
    assert_eq!(single["fresh_claims"], false);
    assert!(single["start_to_first_slice_ms"].as_f64().unwrap() > 0.0);
    assert!(single["idle"]["rss_mib"].as_f64().unwrap() > 1.0);
    assert_eq!(single["wipe_recovery_ms"].as_array().unwrap().len(), 1);
    assert_eq!(single["steady_requests"]["writes"], 0, "an idle plugin wrote to the API: {report:#}");
    let scale = &report["scale"];
    assert_eq!(
        (scale["nodes"].as_u64(), scale["nodes_with_slices"].as_u64(), scale["claims"].as_u64()),
        (Some(2), Some(2), Some(6))
    );
    assert_eq!(scale["prepare"]["calls"], 6);
    let webhook = &report["webhook"];
    assert_eq!((webhook["pods"].as_u64(), webhook["direct_sequential"]["calls"].as_u64()), (Some(6), Some(6)), "{report:#}");
    assert_eq!(webhook["direct_concurrent"]["calls"], 6);
    assert_eq!(webhook["api_server_converted"]["calls"], 6);
    assert!(webhook["rss_mib"].as_f64().unwrap() > 1.0);
    assert!(report["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert!(table.contains("goals"), "{table}");
}

/// `--fresh-claims`: every run gets claims of its own, allocated just before it, and with the
/// pod watch on the driver takes them read ahead. The node's pod limit leaves room for two
/// runs' pods beside the memory sample's (22 here, against 25 pods made in all), so the six
/// runs are allocated only if each run's pods are deleted after it.
#[test]
fn fresh_claims_are_made_for_each_run_and_read_ahead() {
    let (report, table) = bench(&[
        "--claims",
        "4",
        "--sizes",
        "3,4",
        "--nodes",
        "0",
        "--webhook-pods",
        "0",
        "--monitor-claims",
        "0",
        "--fresh-claims",
        "--driver-args=--pod-watch=true",
    ]);
    let single = &report["single"];
    assert_eq!(single["fresh_claims"], true);
    let latency = single["latency"].as_array().unwrap();
    assert_eq!(latency.len(), 6, "{report:#}");
    let shares: Vec<f64> = latency.iter().map(|r| r["prepares_read_ahead"].as_f64().unwrap()).collect();
    assert!(shares.iter().all(|s| (0.0..=1.0).contains(s)), "{shares:?}");
    // A pod's claim is read when the pod is bound, seconds before its run: most are taken
    // from memory (a claim whose read was still under way when the bench began goes to the
    // API, so not every one need be).
    assert!(shares.iter().sum::<f64>() / shares.len() as f64 > 0.5, "{shares:?}\n{table}");
    assert_eq!(single["prepared_claims"], 4);
    assert!(table.contains("each over claims made for it"), "{table}");
}

/// Runs the bench with `args` against the debug driver, with 2 and 3 calls in flight, a second
/// of steady state and one wipe; its JSON report and its table.
fn bench(args: &[&str]) -> (Value, String) {
    let driver = vgpu_dra_integration::driver_binary().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("results.json");
    let run = Command::new(env!("CARGO_BIN_EXE_vgpu-dra-bench"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["--in-flight", "2,3", "--steady-seconds", "1", "--wipes", "1"])
        .args(args)
        .arg(format!("--vgpu-dra={}", driver.display()))
        .arg(format!("--out={}", out.display()))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "bench failed:\n{table}\n{}", String::from_utf8_lossy(&run.stderr));
    (serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap(), table)
}
