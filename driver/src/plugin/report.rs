//! What the metrics report of the plugin's state: a snapshot read at once, and the device
//! figures set from it at each scrape.

use std::collections::BTreeMap;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use vgpu_scheduling::device::{CAPACITY_CORES, CAPACITY_MEMORY, CAPACITY_SHARES};
use vgpu_scheduling::{Attribute, Consumption, DeviceName, Health, PublishedDevice, Quantity};

use super::claim::ClaimRef;
use crate::metrics::{FloatGauge, Labels, labels};

/// One prepared share, as the metrics see it.
#[derive(Debug, Clone)]
pub struct ShareUsage {
    /// The claim.
    pub claim: ClaimRef,
    /// The pod (in the claim's namespace) the claim is reserved for, when known.
    pub pod: Option<String>,
    /// The device the share is on.
    pub device: DeviceName,
    /// What the share consumes.
    pub consumption: vgpu_scheduling::Amounts,
}

/// Everything the metrics report, read at once: metrics depend on this, not on the state.
#[derive(Debug, Clone, Default)]
pub struct StateSnapshot {
    /// Devices published now.
    pub published: Vec<PublishedDevice>,
    /// Device -> capacity -> used by prepared claims.
    pub usage: BTreeMap<DeviceName, vgpu_scheduling::Consumption>,
    /// Every prepared share.
    pub shares: Vec<ShareUsage>,
    /// How many claims are prepared.
    pub prepared: usize,
    /// Devices whose prepared shares take more than they have, with the capacity.
    pub overcommitted: Vec<(DeviceName, String)>,
}

/// The devices' figures: capacity, allocation and health per device and per prepared share, under
/// vgpu-dra's names and HAMi DRA's monitor names (so existing dashboards work), set from a
/// [`StateSnapshot`] just before each scrape.
pub struct DeviceReport {
    node: String,
    pub(crate) capacity: Family<Labels, FloatGauge>,
    pub(crate) allocated: Family<Labels, FloatGauge>,
    pub(crate) healthy: Family<Labels, FloatGauge>,
    pub(crate) prepared: Gauge,
    pub(crate) hami_memory_limit: Family<Labels, FloatGauge>,
    pub(crate) hami_memory_allocated: Family<Labels, FloatGauge>,
    pub(crate) hami_core_limit: Family<Labels, FloatGauge>,
    pub(crate) hami_core_allocated: Family<Labels, FloatGauge>,
    pub(crate) claim_allocated: Family<Labels, FloatGauge>,
    pub(crate) hami_vgpu_memory: Family<Labels, FloatGauge>,
    pub(crate) hami_vgpu_core: Family<Labels, FloatGauge>,
    pub(crate) overcommitted: Family<Labels, Gauge>,
}

/// A quantity as the float a gauge takes; absent is 0.
fn value(q: Option<&Quantity>) -> f64 {
    q.map_or(0.0, |q| q.nanos() as f64 / 1e9)
}

impl DeviceReport {
    /// Registers every family for `node`.
    pub fn register(registry: &mut Registry, node: String) -> Self {
        let r = Self {
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
        };
        let families: [(&str, &str, &Family<Labels, FloatGauge>); 10] = [
            ("vgpu_dra_device_capacity", "Capacity a device publishes (memory in bytes, cores in percent, shares)", &r.capacity),
            ("vgpu_dra_device_allocated", "Capacity taken by prepared claims", &r.allocated),
            ("vgpu_dra_device_healthy", "1 when the device is healthy", &r.healthy),
            ("hami_dra_gpu_memory_limit_bytes", "HAMi DRA compatible: device memory", &r.hami_memory_limit),
            ("hami_dra_gpu_memory_allocated_bytes", "HAMi DRA compatible: memory allocated", &r.hami_memory_allocated),
            ("hami_dra_gpu_core_limit_ratio", "HAMi DRA compatible: cores of the device, 1 = one card", &r.hami_core_limit),
            ("hami_dra_gpu_core_allocated_ratio", "HAMi DRA compatible: cores allocated, 1 = one card", &r.hami_core_allocated),
            (
                "vgpu_dra_claim_allocated",
                "Capacity one prepared claim takes of a device, with the pod it is reserved for",
                &r.claim_allocated,
            ),
            (
                "hami_dra_vgpu_memory_allocated_bytes",
                "HAMi DRA compatible: memory allocated to a pod's share of a device",
                &r.hami_vgpu_memory,
            ),
            (
                "hami_dra_vgpu_core_allocated_ratio",
                "HAMi DRA compatible: cores allocated to a pod's share of a device, 1 = one card",
                &r.hami_vgpu_core,
            ),
        ];
        for (name, help, family) in families {
            registry.register(name, help, family.clone());
        }
        registry.register("vgpu_dra_prepared_claims", "Claims prepared on this node", r.prepared.clone());
        registry.register(
            "vgpu_dra_device_overcommitted",
            "1 for a device capacity that prepared claims take more of than the device has (after a restart with a smaller configuration); the device admits nothing new",
            r.overcommitted.clone(),
        );
        r
    }

    /// Sets every figure from `state` (read at once, just before); series of devices and shares
    /// gone since the last scrape disappear.
    pub fn update(&self, state: &StateSnapshot) {
        self.prepared.set(i64::try_from(state.prepared).unwrap_or(i64::MAX));
        for f in self.float_families() {
            f.clear();
        }
        self.overcommitted.clear();
        for (device, capacity) in &state.overcommitted {
            let l = labels(&[("node", &self.node), ("device", device.as_str()), ("capacity", capacity)]);
            self.overcommitted.get_or_create(&l).set(1);
        }
        for d in &state.published {
            self.device(d, state.usage.get(&d.name), state.shares.iter().filter(|s| s.device == d.name));
        }
    }

    /// Every gauge family of fractional values, to clear before a scrape.
    pub(crate) fn float_families(&self) -> [&Family<Labels, FloatGauge>; 10] {
        [
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
        ]
    }

    /// One device's figures and those of its shares.
    fn device<'a>(&self, d: &PublishedDevice, used: Option<&Consumption>, shares: impl Iterator<Item = &'a ShareUsage>) {
        let base = labels(&[("node", &self.node), ("device", d.name.as_str()), ("uuid", &d.uuid)]);
        let hami = self.hami_labels(d);
        let used = |name: &str| value(used.and_then(|u| u.get(name)));
        let capacity = |name: &str| value(d.capacity.get(name).map(|c| &c.value));
        for name in [CAPACITY_MEMORY, CAPACITY_CORES, CAPACITY_SHARES] {
            let mut l = base.clone();
            l.push(("capacity".to_owned(), name.to_owned()));
            self.capacity.get_or_create(&l).set(capacity(name));
            self.allocated.get_or_create(&l).set(used(name));
        }
        self.healthy.get_or_create(&base).set(if d.health == Health::Healthy { 1.0 } else { 0.0 });
        self.hami_memory_limit.get_or_create(&hami).set(capacity(CAPACITY_MEMORY));
        self.hami_memory_allocated.get_or_create(&hami).set(used(CAPACITY_MEMORY));
        self.hami_core_limit.get_or_create(&hami).set(capacity(CAPACITY_CORES) / 100.0);
        self.hami_core_allocated.get_or_create(&hami).set(used(CAPACITY_CORES) / 100.0);
        for share in shares {
            self.share(share, &base, &hami);
        }
    }

    /// HAMi's labels of a device: its UUID, index, name and product.
    fn hami_labels(&self, d: &PublishedDevice) -> Labels {
        let product = match d.attributes.get("productName") {
            Some(Attribute::String(s)) => s.clone(),
            _ => String::new(),
        };
        labels(&[
            ("node", &self.node),
            ("device_uuid", &d.uuid),
            ("device_index", &d.index().to_string()),
            ("device_name", d.name.as_str()),
            ("device_type", &product),
        ])
    }

    /// One prepared share's figures, under the device's labels `base` and `hami`.
    fn share(&self, share: &ShareUsage, base: &Labels, hami: &Labels) {
        let pod = share.pod.clone().unwrap_or_default();
        let namespace = share.claim.namespace.to_string();
        for name in [CAPACITY_MEMORY, CAPACITY_CORES, CAPACITY_SHARES] {
            let mut l = base.clone();
            l.extend(labels(&[
                ("capacity", name),
                ("namespace", &namespace),
                ("claim", share.claim.name.as_str()),
                ("pod", &pod),
            ]));
            self.claim_allocated.get_or_create(&l).set(value(share.consumption.get(name)));
        }
        let mut l = hami.clone();
        l.extend(labels(&[("pod_name", &pod), ("pod_namespace", &namespace)]));
        self.hami_vgpu_memory.get_or_create(&l).set(value(share.consumption.get(CAPACITY_MEMORY)));
        self.hami_vgpu_core.get_or_create(&l).set(value(share.consumption.get(CAPACITY_CORES)) / 100.0);
    }
}
