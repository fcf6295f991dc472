//! Prometheus metrics: the registry every component registers its own families in when the
//! daemon is built, and the helpers they share. Each component owns its counters (the kubelet
//! calls in `plugin::kubelet::service`, the read ahead in `plugin::api::node_pods`, slice writes
//! in `publisher`, the devices' figures in `plugin::report`); this module knows none of them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A label set: `labels(&[("result", "ok")])`.
pub type Labels = Vec<(String, String)>;
/// A gauge of fractional values (bytes, ratios).
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// The registry, once every component has registered in it.
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// Wraps the registry the components registered in.
    pub fn new(registry: Registry) -> Self {
        Self { registry }
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

/// Restarts of the API watches, one family for every watch, by resource.
#[derive(Clone, Default)]
pub struct WatchRestarts(Family<Labels, Counter>);

impl WatchRestarts {
    /// Registers the family.
    pub fn register(registry: &mut Registry) -> Self {
        let this = Self::default();
        registry.register("vgpu_dra_watch_restarts", "Restarts of API watches, by resource", this.0.clone());
        this
    }

    /// The counter of the watch of `resource`.
    pub fn of(&self, resource: &str) -> Counter {
        self.0.get_or_create(&labels(&[("resource", resource)])).clone()
    }
}

/// A latency histogram from 0.5 ms to about 4 s.
pub fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// Label set helper: `labels(&[("result", "ok")])`.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}
