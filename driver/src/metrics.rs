//! Prometheus metrics: the registry every component registers its own families in when the
//! daemon is built, and the helpers they share. Each component owns its counters (the kubelet
//! calls in `plugin::kubelet::service`, the read ahead in `plugin::api::node_pods`, slice writes
//! in `publisher`, the devices' figures in `plugin::report`); this module knows none of them.

use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
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

/// `vgpu_dra_fsyncs_total`: the fsyncs this process made of its durable files and directories
/// (checkpoint, CDI specs, claim and host files), read from the writers' own counts at each
/// scrape. The benchmark divides its rise by the claims prepared.
#[derive(Debug)]
pub struct Fsyncs;

impl Fsyncs {
    /// Registers the family.
    pub fn register(registry: &mut Registry) {
        registry.register_collector(Box::new(Self));
    }

    /// The count now.
    pub fn now() -> u64 {
        crate::fsutil::fsyncs() + cdi_spec::fsyncs()
    }
}

impl Collector for Fsyncs {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let help = "fsyncs of the driver's durable files and directories (checkpoint, CDI specs, claim and host files)";
        let metric = encoder.encode_descriptor("vgpu_dra_fsyncs", help, None, MetricType::Counter)?;
        ConstCounter::new(Self::now()).encode(metric)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scraped() -> u64 {
        let mut registry = Registry::default();
        Fsyncs::register(&mut registry);
        let text = Metrics::new(registry).encode();
        let line = text.lines().find(|l| l.starts_with("vgpu_dra_fsyncs_total ")).expect("the family is exposed");
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a count")
    }

    #[test]
    fn fsyncs_count_the_file_and_its_directory_of_every_durable_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let before = scraped();
        crate::fsutil::write_atomically(&dir.path().join("f"), b"x", 0o644).expect("write");
        crate::fsutil::remove_durably(&dir.path().join("f")).expect("remove");
        // Other tests write meanwhile: at least the file, its rename and its removal.
        assert!(scraped() >= before + 3);
    }
}
