//! `convert` against a cluster: every workload that still names HAMi's or Volcano's resources,
//! what the webhook makes of it, and which it would refuse.

use std::io::Write;

use kube::api::ApiResource;
use serde_json::Value;
use vgpu_scheduling::compat::{ClassFacts, CompatSettings};

use crate::api::{ApiError, Cluster};
use crate::convert::{Outcome, convert_object};
use crate::table::Table;

/// The kinds that make pods, listed in this order: `(group, version, kind, plural)`.
const KINDS: [(&str, &str, &str, &str); 9] = [
    ("apps", "v1", "Deployment", "deployments"),
    ("apps", "v1", "StatefulSet", "statefulsets"),
    ("apps", "v1", "DaemonSet", "daemonsets"),
    ("apps", "v1", "ReplicaSet", "replicasets"),
    ("batch", "v1", "CronJob", "cronjobs"),
    ("batch", "v1", "Job", "jobs"),
    ("", "v1", "ReplicationController", "replicationcontrollers"),
    ("", "v1", "Pod", "pods"),
    ("batch.volcano.sh", "v1alpha1", "Job", "jobs"),
];

fn resource((group, version, kind, plural): (&str, &str, &str, &str)) -> ApiResource {
    let api_version = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version,
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}

/// Every workload of `namespace` (all when `None`) that is not made by another one listed here
/// (a controller owner: a Deployment's ReplicaSets, a Job's pods), with its `apiVersion` and
/// `kind` set (list items may lack them).
///
/// # Errors
/// [`ApiError`] for a failed or late list.
pub async fn workloads(cluster: &Cluster, namespace: Option<&str>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for kind in KINDS {
        let r = resource(kind);
        for mut object in cluster.objects(&r, namespace).await? {
            let owned = object
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| refs.iter().any(|o| o.get("controller").and_then(Value::as_bool) == Some(true)));
            if owned {
                continue;
            }
            object["apiVersion"] = r.api_version.clone().into();
            object["kind"] = r.kind.clone().into();
            out.push(object);
        }
    }
    Ok(out)
}

/// One row per workload that names our resources: `converts` with the templates it would get and
/// what each asks, or `refused` with the webhook's message. Returns how many are refused.
///
/// # Errors
/// When `out` fails.
pub fn write_report(
    workloads: &[Value],
    flavours: &[CompatSettings],
    facts: &ClassFacts,
    out: &mut dyn Write,
) -> std::io::Result<usize> {
    let mut table = Table::new(&["NAMESPACE", "KIND", "NAME", "RESULT", "DETAIL"]);
    let (mut rows, mut refused) = (0, 0);
    for object in workloads {
        let field = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or_default().to_owned();
        let (result, detail) = match convert_object(object, flavours, facts) {
            Outcome::Unchanged => continue,
            Outcome::Refused(message) => {
                refused += 1;
                ("refused".to_owned(), message)
            }
            Outcome::Converted { templates, warnings, .. } => {
                let mut detail = templates.iter().map(asks).collect::<Vec<_>>().join("; ");
                if !warnings.is_empty() {
                    detail.push_str(&format!(" (warning: {})", warnings.join("; ")));
                }
                ("converts".to_owned(), detail)
            }
        };
        rows += 1;
        table.row(vec![field("/metadata/namespace"), field("/kind"), field("/metadata/name"), result, detail]);
    }
    if rows == 0 {
        writeln!(out, "No workload names HAMi's or Volcano's GPU resources.")?;
    } else {
        table.write(out)?;
    }
    Ok(refused)
}

/// `<template>: <count> x (memory, cores)` for each request of a ResourceClaimTemplate; a
/// prioritized list (a memory percentage) as its first choice and how many there are.
fn asks(template: &Value) -> String {
    let name = template.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let requests = template.pointer("/spec/spec/devices/requests").and_then(Value::as_array).cloned().unwrap_or_default();
    let described: Vec<String> = requests
        .iter()
        .map(|r| match r.get("firstAvailable").and_then(Value::as_array) {
            Some(options) => format!("{} (or {} other models)", share(&options[0]), options.len().saturating_sub(1)),
            None => share(&r["exactly"]),
        })
        .collect();
    format!("{name}: {}", described.join(" + "))
}

fn share(request: &Value) -> String {
    let count = request.get("count").and_then(Value::as_i64).unwrap_or(1);
    let capacity = &request["capacity"]["requests"];
    let memory = capacity.get("memory").and_then(Value::as_str).map_or_else(
        || "whole card".to_owned(),
        |m| {
            vgpu_scheduling::Quantity::parse(m)
                .map_or_else(|_| m.to_owned(), |q| q.with_format(vgpu_scheduling::Format::BinarySI).to_string())
        },
    );
    let cores = capacity.get("cores").and_then(Value::as_str).map_or_else(|| "all cores".to_owned(), |c| format!("{c} cores"));
    format!("{count} x ({memory}, {cores})")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;
    use vgpu_scheduling::compat::{CardModel, FlavourOptions, flavours};

    use super::*;

    #[test]
    fn the_report_lists_what_converts_and_what_is_refused_and_nothing_else() {
        let pod = |name: &str, limits: Value, privileged: bool| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
                   "spec": {"containers": [{"name": "c", "image": "i", "securityContext": {"privileged": privileged},
                                            "resources": {"limits": limits}}]}})
        };
        let workloads = [
            pod("shared", json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}), false),
            pod("whole", json!({"volcano.sh/vgpu-number": "1"}), false),
            pod("root", json!({"nvidia.com/gpu": "1"}), true),
            pod("plain", json!({"cpu": "1"}), false),
        ];
        let facts = ClassFacts::new([CardModel { product_name: "Tesla T4".into(), memory_bytes: 15 << 30 }], 1);
        let mut out = Vec::new();
        let refused = write_report(&workloads, &flavours(None, &FlavourOptions::default()), &facts, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(refused, 1, "{text}");
        let line = |name: &str| text.lines().find(|l| l.split_whitespace().nth(2) == Some(name)).map(str::to_owned);
        assert!(
            line("shared").unwrap().contains("converts") && line("shared").unwrap().contains("1 x (3000Mi, 30 cores)"),
            "{text}"
        );
        assert!(line("whole").unwrap().contains("1 x (whole card, all cores)"), "{text}");
        assert!(line("root").unwrap().contains("refused") && line("root").unwrap().contains("privileged"), "{text}");
        assert!(line("plain").is_none(), "{text}");
        let mut none = Vec::new();
        write_report(&workloads[3..], &flavours(None, &FlavourOptions::default()), &facts, &mut none).unwrap();
        assert!(String::from_utf8(none).unwrap().starts_with("No workload"));
    }
}
