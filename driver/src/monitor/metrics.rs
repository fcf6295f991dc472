//! What the monitor exports: each claim's usage per card under HAMi DRA's names and labels
//! (Project-HAMi/k8s-dra-driver `cmd/hami-core-monitor/metrics.go`), and behind a setting under
//! HAMi's legacy names and labels (HAMi `cmd/vGPUmonitor/metrics.go`, `--legacy-metrics`), so
//! HAMi's WebUI and dashboards work unchanged; and the monitor's own health.
//!
//! Series are set once per tick and removed when their claim is no longer prepared, so their
//! number is bounded by the prepared claims times their cards (at most 16). HAMi's
//! `hami_container_device_memory_bytes` / `Device_memory_desc_of_container` are left out: they
//! carry byte counts as label values, a new series at every allocation.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use vgpu_scheduling::Uid;

use crate::metrics::{FloatGauge, Labels, histogram, labels};
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

impl SeriesKey {
    fn dra(&self) -> Labels {
        labels(&[
            ("namespace", &self.namespace),
            ("pod", &self.pod),
            ("container", &self.container),
            ("claim_uid", &self.claim_uid),
            ("vdevice_index", &self.index.to_string()),
            ("device_uuid", &self.uuid),
        ])
    }

    fn legacy(&self) -> Labels {
        labels(&[
            ("podnamespace", &self.namespace),
            ("podname", &self.pod),
            ("ctrname", &self.container),
            ("vdeviceid", &self.index.to_string()),
            ("deviceuuid", &self.uuid),
            // HAMi's monitor adds this constant label; its dashboards select on it.
            ("zone", "vGPU"),
        ])
    }
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

#[derive(Clone, Default)]
struct Families {
    used: Family<Labels, FloatGauge>,
    limit: Family<Labels, FloatGauge>,
    utilization: Family<Labels, FloatGauge>,
    context: Family<Labels, FloatGauge>,
    module: Family<Labels, FloatGauge>,
    buffer: Family<Labels, FloatGauge>,
    last_kernel: Family<Labels, FloatGauge>,
}

impl Families {
    fn set(&self, l: &Labels, f: &CardFigures, with_breakdown: bool) {
        #[allow(clippy::cast_precision_loss)] // Byte counts as Prometheus floats, as HAMi exports them.
        let as_f = |v: u64| v as f64;
        self.used.get_or_create(l).set(as_f(f.usage.total));
        self.limit.get_or_create(l).set(as_f(f.limit));
        self.utilization.get_or_create(l).set(as_f(f.usage.sm_util));
        if with_breakdown {
            self.context.get_or_create(l).set(as_f(f.usage.context));
            self.module.get_or_create(l).set(as_f(f.usage.module));
            self.buffer.get_or_create(l).set(as_f(f.usage.data));
        }
        match f.since_last_kernel {
            Some(s) => {
                self.last_kernel.get_or_create(l).set(as_f(s));
            }
            None => {
                self.last_kernel.remove(l);
            }
        }
    }

    fn remove(&self, l: &Labels) {
        for family in [&self.used, &self.limit, &self.utilization, &self.context, &self.module, &self.buffer, &self.last_kernel] {
            family.remove(l);
        }
    }
}

/// The monitor's metric families.
#[derive(Clone)]
pub struct MonitorMetrics {
    dra: Families,
    legacy: Option<Families>,
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
    /// Series set at the previous tick, per claim.
    shown: std::sync::Arc<std::sync::Mutex<BTreeMap<Uid, BTreeSet<SeriesKeyOwned>>>>,
}

/// A series key as stored between ticks.
type SeriesKeyOwned = (String, String, String, String, usize, String);

fn owned(k: &SeriesKey) -> SeriesKeyOwned {
    (k.namespace.clone(), k.pod.clone(), k.container.clone(), k.claim_uid.clone(), k.index, k.uuid.clone())
}

fn from_owned(o: &SeriesKeyOwned) -> SeriesKey {
    SeriesKey {
        namespace: o.0.clone(),
        pod: o.1.clone(),
        container: o.2.clone(),
        claim_uid: o.3.clone(),
        index: o.4,
        uuid: o.5.clone(),
    }
}

impl MonitorMetrics {
    /// Registers the families; HAMi's legacy names too when `legacy`.
    pub fn register(registry: &mut Registry, legacy: bool) -> Self {
        let dra = Families::default();
        let per_card = [
            ("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes", &dra.used),
            ("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes", &dra.limit),
            ("hami_container_device_utilization_ratio", "Container device SM utilization ratio", &dra.utilization),
            ("hami_vgpu_memory_context_bytes", "Container device memory context size in bytes", &dra.context),
            ("hami_vgpu_memory_module_bytes", "Container device memory module size in bytes", &dra.module),
            ("hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes", &dra.buffer),
            ("hami_container_last_kernel_elapsed_seconds", "Seconds since last kernel execution in container", &dra.last_kernel),
        ];
        for (name, help, family) in per_card {
            registry.register(name, help, family.clone());
        }
        let legacy = legacy.then(|| {
            let old = Families::default();
            let names = [
                ("vGPU_device_memory_usage_in_bytes", "vGPU device usage", &old.used),
                ("vGPU_device_memory_limit_in_bytes", "vGPU device limit", &old.limit),
                ("Device_utilization_desc_of_container", "Container device utilization description", &old.utilization),
                ("Device_last_kernel_of_container", "Container device last kernel description", &old.last_kernel),
            ];
            for (name, help, family) in names {
                registry.register(name, help, family.clone());
            }
            old
        });
        let this = Self {
            dra,
            legacy,
            bad_regions: Family::default(),
            writes: Family::default(),
            blocked: Gauge::default(),
            bursting: Gauge::default(),
            tick: histogram(),
            shown: std::sync::Arc::default(),
        };
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

    /// Sets this tick's figures and removes the series of claims and cards no longer shown.
    pub fn show(&self, figures: &[(SeriesKey, CardFigures)]) {
        let mut now: BTreeMap<Uid, BTreeSet<SeriesKeyOwned>> = BTreeMap::new();
        for (key, f) in figures {
            self.dra.set(&key.dra(), f, true);
            if let Some(legacy) = &self.legacy {
                legacy.set(&key.legacy(), f, false);
            }
            if let Ok(uid) = Uid::new(&key.claim_uid) {
                now.entry(uid).or_default().insert(owned(key));
            }
        }
        let mut shown = self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (uid, keys) in shown.iter() {
            let kept = now.get(uid);
            for gone in keys.iter().filter(|k| kept.is_none_or(|kept| !kept.contains(*k))) {
                let key = from_owned(gone);
                self.dra.remove(&key.dra());
                if let Some(legacy) = &self.legacy {
                    legacy.remove(&key.legacy());
                }
            }
        }
        *shown = now;
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
        m.show(&[(key("u-1", "p1"), figures(1 << 30)), (key("u-2", "p2"), figures(2 << 30))]);
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
        m.show(&[(key("u-1", "p1-renamed"), figures(1 << 30))]);
        let text = encode(&registry);
        assert!(!text.contains("u-2") && !text.contains("podname=\"p2\""), "{text}");
        assert!(!text.contains("pod=\"p1\""), "the old series of u-1 stays: {text}");
        assert!(text.contains("pod=\"p1-renamed\""), "{text}");
    }

    #[test]
    fn legacy_names_are_absent_unless_asked_for() {
        let mut registry = Registry::default();
        let m = MonitorMetrics::register(&mut registry, false);
        m.show(&[(key("u-1", "p1"), figures(1))]);
        let text = encode(&registry);
        assert!(!text.contains("vGPU_device_memory") && text.contains("hami_vgpu_memory_used_bytes"), "{text}");
    }
}
