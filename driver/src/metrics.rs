//! Prometheus metrics: per-device capacity, allocation and health (also under HAMi DRA's monitor
//! names so existing dashboards work), prepared claims, and prepare/unprepare latency and errors.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use vgpu_scheduling::device::{CAPACITY_CORES, CAPACITY_MEMORY, CAPACITY_SHARES};
use vgpu_scheduling::{Attribute, Health};

use crate::plugin::state::StateSnapshot;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric the driver exports, in one registry made at start.
pub struct Metrics {
    node: String,
    registry: Registry,
    capacity: Family<Labels, FloatGauge>,
    allocated: Family<Labels, FloatGauge>,
    healthy: Family<Labels, FloatGauge>,
    prepared: Gauge,
    hami_memory_limit: Family<Labels, FloatGauge>,
    hami_memory_allocated: Family<Labels, FloatGauge>,
    hami_core_limit: Family<Labels, FloatGauge>,
    hami_core_allocated: Family<Labels, FloatGauge>,
    claim_allocated: Family<Labels, FloatGauge>,
    hami_vgpu_memory: Family<Labels, FloatGauge>,
    hami_vgpu_core: Family<Labels, FloatGauge>,
    overcommitted: Family<Labels, Gauge>,
    /// Prepare latency by result (`ok`, `error`).
    pub prepare_seconds: Family<Labels, Histogram>,
    /// Unprepare latency by result.
    pub unprepare_seconds: Family<Labels, Histogram>,
    /// Prepare failures by reason.
    pub prepare_errors: Family<Labels, Counter>,
    /// ResourceSlice writes by operation (`apply`, `delete`) and result.
    pub slice_writes: Family<Labels, Counter>,
    /// Restarts of the API watches (slices, pods).
    pub watch_restarts: Family<Labels, Counter>,
    /// Events of this node's pod watch.
    pub pod_events: Counter,
    /// Claims read ahead, by result (`used` by a prepare, `missed`: a prepare read the API,
    /// `not_ours`: read and dropped).
    pub claim_prefetch: Family<Labels, Counter>,
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

impl Metrics {
    /// Registers every family for `node`.
    pub fn new(node: String) -> Self {
        let mut registry = Registry::default();
        let m = Self {
            node,
            capacity: Family::default(),
            allocated: Family::default(),
            healthy: Family::default(),
            prepared: Gauge::default(),
            hami_memory_limit: Family::default(),
            hami_memory_allocated: Family::default(),
            hami_core_limit: Family::default(),
            hami_core_allocated: Family::default(),
            claim_allocated: Family::default(),
            hami_vgpu_memory: Family::default(),
            hami_vgpu_core: Family::default(),
            overcommitted: Family::default(),
            prepare_seconds: Family::new_with_constructor(histogram),
            unprepare_seconds: Family::new_with_constructor(histogram),
            prepare_errors: Family::default(),
            slice_writes: Family::default(),
            watch_restarts: Family::default(),
            pod_events: Counter::default(),
            claim_prefetch: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "vgpu_dra_device_capacity",
            "Capacity a device publishes (memory in bytes, cores in percent, shares)",
            m.capacity.clone(),
        );
        registry.register("vgpu_dra_device_allocated", "Capacity taken by prepared claims", m.allocated.clone());
        registry.register("vgpu_dra_device_healthy", "1 when the device is healthy", m.healthy.clone());
        registry.register("vgpu_dra_prepared_claims", "Claims prepared on this node", m.prepared.clone());
        registry.register("hami_dra_gpu_memory_limit_bytes", "HAMi DRA compatible: device memory", m.hami_memory_limit.clone());
        registry.register(
            "hami_dra_gpu_memory_allocated_bytes",
            "HAMi DRA compatible: memory allocated",
            m.hami_memory_allocated.clone(),
        );
        registry.register(
            "hami_dra_gpu_core_limit_ratio",
            "HAMi DRA compatible: cores of the device, 1 = one card",
            m.hami_core_limit.clone(),
        );
        registry.register(
            "hami_dra_gpu_core_allocated_ratio",
            "HAMi DRA compatible: cores allocated, 1 = one card",
            m.hami_core_allocated.clone(),
        );
        registry.register(
            "vgpu_dra_claim_allocated",
            "Capacity one prepared claim takes of a device, with the pod it is reserved for",
            m.claim_allocated.clone(),
        );
        registry.register(
            "hami_dra_vgpu_memory_allocated_bytes",
            "HAMi DRA compatible: memory allocated to a pod's share of a device",
            m.hami_vgpu_memory.clone(),
        );
        registry.register(
            "hami_dra_vgpu_core_allocated_ratio",
            "HAMi DRA compatible: cores allocated to a pod's share of a device, 1 = one card",
            m.hami_vgpu_core.clone(),
        );
        registry.register(
            "vgpu_dra_prepare_duration_seconds",
            "NodePrepareResources latency per claim",
            m.prepare_seconds.clone(),
        );
        registry.register(
            "vgpu_dra_unprepare_duration_seconds",
            "NodeUnprepareResources latency per claim",
            m.unprepare_seconds.clone(),
        );
        registry.register(
            "vgpu_dra_device_overcommitted",
            "1 for a device capacity that prepared claims take more of than the device has (after a restart with a smaller configuration); the device admits nothing new",
            m.overcommitted.clone(),
        );
        registry.register("vgpu_dra_prepare_errors", "Claims whose prepare failed, by reason", m.prepare_errors.clone());
        registry.register("vgpu_dra_slice_writes", "ResourceSlice writes by operation and result", m.slice_writes.clone());
        registry.register("vgpu_dra_watch_restarts", "Restarts of API watches, by resource", m.watch_restarts.clone());
        registry.register("vgpu_dra_pod_events", "Events of the watch of this node's pods", m.pod_events.clone());
        registry.register(
            "vgpu_dra_claim_prefetch",
            "Claims read ahead for this node's pods: used by a prepare, missed (the prepare read the API), or not ours",
            m.claim_prefetch.clone(),
        );
        Self { registry, ..m }
    }

    /// The text exposition, with device figures from `state` (read at once, just before).
    pub fn render(&self, state: &StateSnapshot) -> String {
        let usage = &state.usage;
        self.prepared.set(i64::try_from(state.prepared).unwrap_or(i64::MAX));
        for f in [
            &self.capacity,
            &self.allocated,
            &self.healthy,
            &self.hami_memory_limit,
            &self.hami_memory_allocated,
            &self.hami_core_limit,
            &self.hami_core_allocated,
            &self.claim_allocated,
            &self.hami_vgpu_memory,
            &self.hami_vgpu_core,
        ] {
            f.clear();
        }
        self.overcommitted.clear();
        for (device, capacity) in &state.overcommitted {
            let l = vec![
                ("node".to_owned(), self.node.clone()),
                ("device".to_owned(), device.to_string()),
                ("capacity".to_owned(), capacity.clone()),
            ];
            self.overcommitted.get_or_create(&l).set(1);
        }
        let shares = &state.shares;
        for d in &state.published {
            let index = match d.attributes.get("index") {
                Some(Attribute::Int(i)) => i.to_string(),
                _ => d.minor.to_string(),
            };
            let base = vec![
                ("node".to_owned(), self.node.clone()),
                ("device".to_owned(), d.name.to_string()),
                ("uuid".to_owned(), d.uuid.clone()),
            ];
            let hami = vec![
                ("node".to_owned(), self.node.clone()),
                ("device_uuid".to_owned(), d.uuid.clone()),
                ("device_index".to_owned(), index),
                ("device_name".to_owned(), d.name.to_string()),
                (
                    "device_type".to_owned(),
                    match d.attributes.get("productName") {
                        Some(Attribute::String(s)) => s.clone(),
                        _ => String::new(),
                    },
                ),
            ];
            let used = usage.get(&d.name);
            let value = |q: Option<&vgpu_scheduling::Quantity>| q.map_or(0.0, |q| q.nanos() as f64 / 1e9);
            for name in [CAPACITY_MEMORY, CAPACITY_CORES, CAPACITY_SHARES] {
                let mut l = base.clone();
                l.push(("capacity".to_owned(), name.to_owned()));
                self.capacity.get_or_create(&l).set(value(d.capacity.get(name).map(|c| &c.value)));
                self.allocated.get_or_create(&l).set(value(used.and_then(|u| u.get(name))));
            }
            self.healthy.get_or_create(&base).set(if d.health == Health::Healthy { 1.0 } else { 0.0 });
            self.hami_memory_limit.get_or_create(&hami).set(value(d.capacity.get(CAPACITY_MEMORY).map(|c| &c.value)));
            self.hami_memory_allocated.get_or_create(&hami).set(value(used.and_then(|u| u.get(CAPACITY_MEMORY))));
            self.hami_core_limit.get_or_create(&hami).set(value(d.capacity.get(CAPACITY_CORES).map(|c| &c.value)) / 100.0);
            self.hami_core_allocated.get_or_create(&hami).set(value(used.and_then(|u| u.get(CAPACITY_CORES))) / 100.0);
            for share in shares.iter().filter(|s| s.device == d.name) {
                let pod = share.pod.clone().unwrap_or_default();
                for name in [CAPACITY_MEMORY, CAPACITY_CORES, CAPACITY_SHARES] {
                    let mut l = base.clone();
                    l.extend([
                        ("capacity".to_owned(), name.to_owned()),
                        ("namespace".to_owned(), share.claim.namespace.to_string()),
                        ("claim".to_owned(), share.claim.name.to_string()),
                        ("pod".to_owned(), pod.clone()),
                    ]);
                    self.claim_allocated.get_or_create(&l).set(value(share.consumption.get(name)));
                }
                let mut l = hami.clone();
                l.extend([("pod_name".to_owned(), pod), ("pod_namespace".to_owned(), share.claim.namespace.to_string())]);
                self.hami_vgpu_memory.get_or_create(&l).set(value(share.consumption.get(CAPACITY_MEMORY)));
                self.hami_vgpu_core.get_or_create(&l).set(value(share.consumption.get(CAPACITY_CORES)) / 100.0);
            }
        }
        self.encode()
    }

    /// The text exposition of the registry as it stands.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// Label set helper: `labels(&[("result", "ok")])`.
pub fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exposed() {
        let m = Metrics::new("n1".into());
        m.prepare_seconds.get_or_create(&labels(&[("result", "ok")])).observe(0.001);
        m.unprepare_seconds.get_or_create(&labels(&[("result", "ok")])).observe(0.001);
        m.slice_writes.get_or_create(&labels(&[("op", "apply"), ("result", "ok")])).inc();
        let text = m.encode();
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
        let m = Metrics::new("n1".into());
        let l = labels(&[("x", "y")]);
        for f in [
            &m.capacity,
            &m.allocated,
            &m.healthy,
            &m.hami_memory_limit,
            &m.hami_memory_allocated,
            &m.hami_core_limit,
            &m.hami_core_allocated,
            &m.claim_allocated,
            &m.hami_vgpu_memory,
            &m.hami_vgpu_core,
        ] {
            f.get_or_create(&l).set(1.0);
        }
        m.overcommitted.get_or_create(&l).set(1);
        m.prepared.set(1);
        m.prepare_seconds.get_or_create(&l).observe(0.001);
        m.unprepare_seconds.get_or_create(&l).observe(0.001);
        for c in [&m.prepare_errors, &m.slice_writes, &m.watch_restarts, &m.claim_prefetch] {
            c.get_or_create(&l).inc();
        }
        let exposed: std::collections::BTreeSet<String> = m
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
}
