//! The chart's Grafana dashboard asks only for metrics the driver exports: every metric name in
//! its PromQL is a series of the driver's own registry, and the chart ships the file unchanged in
//! a ConfigMap with the sidecar's label when `dashboard.enabled` is set.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vgpu_dra::daemon::Telemetry;
use vgpu_dra::discovery::DeviceSource;
use vgpu_dra::discovery::mock::{MockSource, parse_spec};
use vgpu_dra::monitor::metrics::{CardFigures, SeriesKey};
use vgpu_dra::monitor::region::DeviceUsage;
use vgpu_dra::plugin::state::StateSnapshot;
use vgpu_scheduling::{SharingConfig, publish};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/vgpu-dra")
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(chart().join("dashboards/vgpu-dra.json")).unwrap()).unwrap()
}

/// PromQL words that are not metric names when they stand alone: operators, modifiers and the
/// aggregations, which may be followed by `by (...)` instead of their argument.
const KEYWORDS: [&str; 26] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
];
/// Modifiers whose parenthesised list holds label names, not expressions.
const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names a PromQL expression selects: identifiers outside strings, label matchers,
/// ranges and label lists that are neither functions, keywords nor Grafana variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let c: Vec<char> = expr.chars().collect();
    let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    let skip_to = |from: usize, close: char| (from + 1..c.len()).find(|&j| c[j] == close).map_or(c.len(), |j| j + 1);
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            q @ ('"' | '\'' | '`') => i = skip_to(i, q),
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '$' => {
                i += 1;
                while i < c.len() && ident(c[i]) {
                    i += 1;
                }
            }
            ch if ch.is_ascii_digit() || ch == '.' => {
                while i < c.len() && (ident(c[i]) || c[i] == '.') {
                    i += 1;
                }
            }
            ch if ident(ch) => {
                let start = i;
                while i < c.len() && ident(c[i]) {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let next = (i..c.len()).find(|&j| !c[j].is_whitespace());
                let call = next.is_some_and(|j| c[j] == '(');
                if call && LABEL_LISTS.contains(&word.as_str()) {
                    i = skip_to(next.unwrap(), ')');
                } else if !call && !KEYWORDS.contains(&word.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Every PromQL expression of the dashboard: panel targets and the variables' queries.
fn expressions(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr", Value::String(s)) => out.push(s.clone()),
                        // `label_values(metric, label)`: only the metric is one.
                        ("definition", Value::String(s)) => {
                            let inner = s.trim().trim_start_matches("label_values(").trim_end_matches(')');
                            out.push(inner.split(',').next().unwrap_or_default().to_owned());
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// The series names the driver's registry exposes, with every family given a series.
fn exported() -> BTreeSet<String> {
    let telemetry = Telemetry::new("n1".into());
    let inventory = MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()).inventory().unwrap();
    let published = publish(&inventory, &SharingConfig::default());
    let usage = published.iter().map(|d| (d.name.clone(), d.capacity_values())).collect();
    let overcommitted = vec![(published[0].name.clone(), "memory".to_owned())];
    telemetry.calls.prepared(0.01, None);
    telemetry.calls.prepared(0.01, Some("x"));
    telemetry.calls.unprepared(0.01, true);
    telemetry.publish.wrote("apply", false);
    telemetry.report.update(&StateSnapshot { published, usage, shares: Vec::new(), prepared: 1, overcommitted });
    let key = SeriesKey {
        namespace: "ns".into(),
        pod: "p".into(),
        container: "main".into(),
        claim_uid: "u-1".into(),
        index: 0,
        uuid: "GPU-a".into(),
    };
    telemetry.monitor.show(vec![(key, CardFigures { usage: DeviceUsage::default(), limit: 1, since_last_kernel: Some(1) })]);
    telemetry.monitor.bad_regions.get_or_create(&vec![("reason".to_owned(), "links".to_owned())]).inc();
    let text = telemetry.metrics.encode();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn promql_metric_names_are_extracted_and_nothing_else() {
    let names = metric_names(
        "histogram_quantile(0.95, sum by (le) (rate(a_bucket{x=\"y z\", n=~\"$node\"}[$__rate_interval])))\n/ on(node, device) group_left b_total offset 5m and count(c == 0) > bool 1e3",
    );
    assert_eq!(names, BTreeSet::from(["a_bucket".to_owned(), "b_total".to_owned(), "c".to_owned()]));
}

#[test]
fn the_dashboard_uses_only_metrics_the_driver_exports() {
    let dashboard = dashboard();
    let exprs = expressions(&dashboard);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let exported = exported();
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "the dashboard queries metrics the driver does not export: {unknown:?}\nexported: {exported:?}");
    // The panels the issue asks for: allocation per node and card, prepare latency, errors.
    for want in [
        "vgpu_dra_device_allocated",
        "vgpu_dra_device_capacity",
        "vgpu_dra_prepare_duration_seconds_bucket",
        "vgpu_dra_prepare_errors_total",
        "hami_vgpu_memory_used_bytes",
        "hami_container_device_utilization_ratio",
    ] {
        assert!(used.contains(want), "no panel uses {want}");
    }
    let titles: Vec<&str> = dashboard["panels"].as_array().unwrap().iter().filter_map(|p| p["title"].as_str()).collect();
    for want in ["Memory allocated per node", "Cores allocated per card", "Prepare latency", "Prepare errors by reason"] {
        assert!(titles.contains(&want), "{titles:?}");
    }
}

#[test]
fn the_chart_ships_the_dashboard_for_the_grafana_sidecar_when_asked() {
    let helm = &vgpu_dra_integration::components().unwrap().helm;
    let home = tempfile::tempdir().unwrap();
    let render = |sets: &[&str]| {
        let mut cmd = Command::new(helm);
        cmd.args([
            "template",
            "r",
            chart().to_str().unwrap(),
            "-n",
            "monitoring",
            "--set",
            "image.repository=registry.example.com/vgpu-dra",
            // The webhook is not looked at here: no client CA for it.
            "--set",
            "webhook.clientAuth.enabled=false",
        ]);
        for s in sets {
            cmd.args(["--set", s]);
        }
        for var in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
            cmd.env(var, home.path());
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "helm template {sets:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(!render(&[]).contains("-dashboard"), "off by default");
    let rendered = render(&["dashboard.enabled=true"]);
    let doc = rendered.split("\n---\n").find(|d| d.contains("name: r-vgpu-dra-dashboard")).unwrap();
    assert!(doc.contains("\n    grafana_dashboard: \"1\"\n"), "{doc}");
    // The block scalar under the key, indented four spaces: the file as shipped.
    let (_, block) = doc.split_once("  vgpu-dra.json: |-\n").unwrap();
    let text: String = block.lines().map(|l| l.strip_prefix("    ").unwrap_or(l)).collect::<Vec<_>>().join("\n");
    let shipped: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(shipped, dashboard());
    let custom = render(&["dashboard.enabled=true", "dashboard.label.key=example.com/dashboard", "dashboard.label.value=gpu"]);
    assert!(custom.contains("example.com/dashboard: \"gpu\""), "{custom}");
}
