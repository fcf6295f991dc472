//! What the monitor exports: each claim's usage per card under HAMi DRA's names and labels
//! (Project-HAMi/k8s-dra-driver `cmd/hami-core-monitor/metrics.go`), and behind a setting under
//! HAMi's legacy names and labels (HAMi `cmd/vGPUmonitor/metrics.go`, `--legacy-metrics`), so
//! HAMi's WebUI and dashboards work unchanged; and the monitor's own health.
//!
//! The usage series are not kept as families of gauges (a label set of owned strings per series
//! and family: about 10 MiB for 1,000 claims with both name sets): each tick's figures replace one
//! snapshot, and a collector writes every series from it when scraped. A claim that is no longer
//! prepared is simply absent from the next snapshot, and the series are bounded by the prepared
//! claims times their cards (at most 16). HAMi's `hami_container_device_memory_bytes` /
//! `Device_memory_desc_of_container` are left out: they carry byte counts as label values, a new
//! series at every allocation.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{Labels, histogram};
use crate::monitor::region::DeviceUsage;

/// Whose series: a claim's card, with the pod and containers using it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesKey {
    /// The claim's namespace.
    pub namespace: String,
    /// The pod using the claim ("" until known).
    pub pod: String,
    /// Its containers using the claim, joined with "," ("" until known): one region serves them
    /// all, so their usage is one figure.
    pub container: String,
    /// The claim.
    pub claim_uid: String,
    /// The card's index inside the container (HAMi-core's device index).
    pub index: usize,
    /// The card.
    pub uuid: String,
}

/// One card's figures for one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CardFigures {
    /// What the region says is in use.
    pub usage: DeviceUsage,
    /// The limit the driver wrote into the claim's spec, in bytes.
    pub limit: u64,
    /// Seconds since the region's last kernel launch, when it recorded one.
    pub since_last_kernel: Option<u64>,
}

/// HAMi DRA's labels of a series.
struct DraLabels<'a>(&'a SeriesKey, &'a str);

impl EncodeLabelSet for DraLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let k = self.0;
        [
            ("namespace", k.namespace.as_str()),
            ("pod", &k.pod),
            ("container", &k.container),
            ("claim_uid", &k.claim_uid),
            ("vdevice_index", self.1),
            ("device_uuid", &k.uuid),
        ]
        .encode(encoder)
    }
}

/// HAMi's legacy labels of a series, with the constant `zone` its dashboards select on.
struct LegacyLabels<'a>(&'a SeriesKey, &'a str);

impl EncodeLabelSet for LegacyLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let k = self.0;
        [
            ("podnamespace", k.namespace.as_str()),
            ("podname", &k.pod),
            ("ctrname", &k.container),
            ("vdeviceid", self.1),
            ("deviceuuid", &k.uuid),
            ("zone", "vGPU"),
        ]
        .encode(encoder)
    }
}

type Value = fn(&CardFigures) -> Option<u64>;

/// HAMi DRA's usage families (`cmd/hami-core-monitor/metrics.go`).
const DRA: [(&str, &str, Value); 7] = [
    ("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes", |f| Some(f.usage.total)),
    ("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes", |f| Some(f.limit)),
    ("hami_container_device_utilization_ratio", "Container device SM utilization ratio", |f| Some(f.usage.sm_util)),
    ("hami_vgpu_memory_context_bytes", "Container device memory context size in bytes", |f| Some(f.usage.context)),
    ("hami_vgpu_memory_module_bytes", "Container device memory module size in bytes", |f| Some(f.usage.module)),
    ("hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes", |f| Some(f.usage.data)),
    ("hami_container_last_kernel_elapsed_seconds", "Seconds since last kernel execution in container", |f| f.since_last_kernel),
];

/// HAMi's legacy names of the same (`cmd/vGPUmonitor/metrics.go`, `--legacy-metrics`).
const LEGACY: [(&str, &str, Value); 4] = [
    ("vGPU_device_memory_usage_in_bytes", "vGPU device usage", |f| Some(f.usage.total)),
    ("vGPU_device_memory_limit_in_bytes", "vGPU device limit", |f| Some(f.limit)),
    ("Device_utilization_desc_of_container", "Container device utilization description", |f| Some(f.usage.sm_util)),
    ("Device_last_kernel_of_container", "Container device last kernel description", |f| f.since_last_kernel),
];

/// The last tick's figures.
type Snapshot = Arc<Mutex<Arc<Vec<(SeriesKey, CardFigures)>>>>;

/// Writes the usage series from the last snapshot at each scrape.
#[derive(Debug)]
struct UsageCollector {
    snapshot: Snapshot,
    legacy: bool,
}

impl Collector for UsageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // The scrape holds the snapshot, not the lock: a tick replaces it meanwhile.
        let rows = self.snapshot.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let indexes: Vec<String> = rows.iter().map(|(k, _)| k.index.to_string()).collect();
        write_families(&mut encoder, &rows, &indexes, &DRA, DraLabels)?;
        if self.legacy {
            write_families(&mut encoder, &rows, &indexes, &LEGACY, LegacyLabels)?;
        }
        Ok(())
    }
}

/// Every family of `families`, one series per row that has a value, labelled by `labels`.
fn write_families<'a, L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    rows: &'a [(SeriesKey, CardFigures)],
    indexes: &'a [String],
    families: &[(&str, &str, Value)],
    labels: fn(&'a SeriesKey, &'a str) -> L,
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in families {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for ((key, f), index) in rows.iter().zip(indexes) {
            if let Some(v) = value(f) {
                ConstGauge::new(v).encode(metric.encode_family(&labels(key, index))?)?;
            }
        }
    }
    Ok(())
}

/// The monitor's metric families.
#[derive(Clone)]
pub struct MonitorMetrics {
    snapshot: Snapshot,
    /// Regions skipped as bad, by reason.
    pub bad_regions: Family<Labels, Counter>,
    /// Fields written into regions, by field.
    pub writes: Family<Labels, Counter>,
    /// Claims blocked (launches waiting) after the last tick.
    pub blocked: Gauge,
    /// Claims allowed past their SM limit on an idle card after the last tick.
    pub bursting: Gauge,
    /// How long a tick took.
    pub tick: Histogram,
}

impl MonitorMetrics {
    /// Registers the families; HAMi's legacy names too when `legacy`.
    pub fn register(registry: &mut Registry, legacy: bool) -> Self {
        let this = Self {
            snapshot: Arc::default(),
            bad_regions: Family::default(),
            writes: Family::default(),
            blocked: Gauge::default(),
            bursting: Gauge::default(),
            tick: histogram(),
        };
        registry.register_collector(Box::new(UsageCollector { snapshot: this.snapshot.clone(), legacy }));
        registry.register(
            "vgpu_dra_monitor_bad_regions",
            "Claims' HAMi-core regions skipped as unusable, by reason",
            this.bad_regions.clone(),
        );
        registry.register(
            "vgpu_dra_monitor_region_writes",
            "Feedback fields written into HAMi-core regions, by field",
            this.writes.clone(),
        );
        registry.register(
            "vgpu_dra_monitor_blocked_claims",
            "Claims whose kernel launches wait for a higher priority",
            this.blocked.clone(),
        );
        registry.register(
            "vgpu_dra_monitor_bursting_claims",
            "Claims allowed past their SM limit on an idle card",
            this.bursting.clone(),
        );
        registry.register(
            "vgpu_dra_monitor_tick_seconds",
            "Time of one monitor tick over every prepared claim",
            this.tick.clone(),
        );
        this
    }

    /// Makes this tick's figures the ones scraped; the series of claims and cards not in them
    /// are gone.
    pub fn show(&self, figures: Vec<(SeriesKey, CardFigures)>) {
        *self.snapshot.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(figures);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(claim: &str, pod: &str) -> SeriesKey {
        SeriesKey {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "main".into(),
            claim_uid: claim.into(),
            index: 0,
            uuid: "GPU-a".into(),
        }
    }

    fn figures(used: u64) -> CardFigures {
        CardFigures {
            usage: DeviceUsage { total: used, sm_util: 30, ..Default::default() },
            limit: 4 << 30,
            since_last_kernel: Some(3),
        }
    }

    fn encode(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn both_name_sets_carry_their_labels_and_go_with_their_claim() {
        let mut registry = Registry::default();
        let m = MonitorMetrics::register(&mut registry, true);
        m.show(vec![(key("u-1", "p1"), figures(1 << 30)), (key("u-2", "p2"), figures(2 << 30))]);
        let text = encode(&registry);
        assert!(
            text.contains(r#"hami_vgpu_memory_used_bytes{namespace="ns",pod="p1",container="main",claim_uid="u-1",vdevice_index="0",device_uuid="GPU-a"} 1073741824"#),
            "{text}"
        );
        assert!(
            text.contains(r#"vGPU_device_memory_limit_in_bytes{podnamespace="ns",podname="p2",ctrname="main",vdeviceid="0",deviceuuid="GPU-a",zone="vGPU"} 4294967296"#),
            "{text}"
        );
        assert!(text.contains(r#"Device_utilization_desc_of_container{podnamespace="ns",podname="p1""#), "{text}");
        // u-2 is unprepared; u-1's pod became known under a new label set.
        m.show(vec![(key("u-1", "p1-renamed"), figures(1 << 30))]);
        let text = encode(&registry);
        assert!(!text.contains("u-2") && !text.contains("podname=\"p2\""), "{text}");
        assert!(!text.contains("pod=\"p1\""), "the old series of u-1 stays: {text}");
        assert!(text.contains("pod=\"p1-renamed\""), "{text}");
    }

    #[test]
    fn legacy_names_are_absent_unless_asked_for() {
        let mut registry = Registry::default();
        let m = MonitorMetrics::register(&mut registry, false);
        m.show(vec![(key("u-1", "p1"), figures(1))]);
        let text = encode(&registry);
        assert!(!text.contains("vGPU_device_memory") && text.contains("hami_vgpu_memory_used_bytes"), "{text}");
    }
}
