//! Admission metrics: `vgpu_dra_webhook_admissions_total{outcome}`,
//! `vgpu_dra_webhook_denials_total{reason}`, `vgpu_dra_webhook_admission_duration_seconds{outcome}`
//! and `vgpu_dra_webhook_refused_clients_total{reason}` (TLS clients refused for their certificate).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How an admission ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The pod was converted.
    Converted,
    /// The pod needed no conversion.
    Unchanged,
    /// The pod was denied by the conversion rules.
    Denied,
    /// The cluster could not be asked or written (templates, slices): the pod was refused.
    Error,
    /// The review could not be read.
    Invalid,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::Converted => "converted",
            Self::Unchanged => "unchanged",
            Self::Denied => "denied",
            Self::Error => "error",
            Self::Invalid => "invalid",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    namespace: String,
    quota: String,
    key: String,
}

/// The webhook's metrics; cheap to clone (shared counters).
#[derive(Debug, Clone)]
pub struct Metrics {
    admissions: Family<OutcomeLabels, Counter>,
    denials: Family<ReasonLabels, Counter>,
    duration: Family<OutcomeLabels, Histogram>,
    refused: Family<ReasonLabels, Counter>,
    claims: Family<OutcomeLabels, Counter>,
    quota_used: Family<QuotaLabels, Gauge>,
    quota_limit: Family<QuotaLabels, Gauge>,
}

impl Metrics {
    /// Metrics registered in `registry` under the `vgpu_dra_webhook` prefix.
    pub fn new(registry: &mut Registry) -> Self {
        let this = Self::unregistered();
        let sub = registry.sub_registry_with_prefix("vgpu_dra_webhook");
        sub.register("admissions", "Pod admissions by outcome", this.admissions.clone());
        sub.register("denials", "Pods denied by the HAMi conversion rules, by reason", this.denials.clone());
        sub.register("admission_duration_seconds", "Time to answer an admission review", this.duration.clone());
        sub.register(
            "refused_clients",
            "TLS clients refused before any review was read: no client certificate, one of another CA, or of another name",
            this.refused.clone(),
        );
        sub.register("claim_admissions", "ResourceClaim admissions (the GPU quota check) by outcome", this.claims.clone());
        sub.register(
            "quota_used",
            "What a namespace's claims on the driver's classes hold of a GPU quota key, in HAMi's units, as of its last check",
            this.quota_used.clone(),
        );
        sub.register(
            "quota_limit",
            "The hard limit of a GPU quota key, in HAMi's units, as of its last check",
            this.quota_limit.clone(),
        );
        this
    }

    /// Metrics counted but exposed nowhere (tests).
    pub fn unregistered() -> Self {
        Self {
            admissions: Family::default(),
            denials: Family::default(),
            // 1 ms .. ~4 s: a review lists slices and creates templates, bounded by API timeouts.
            duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 13))),
            refused: Family::default(),
            claims: Family::default(),
            quota_used: Family::default(),
            quota_limit: Family::default(),
        }
    }

    /// Counts one ResourceClaim admission.
    pub fn observe_claim(&self, outcome: Outcome) {
        self.claims.get_or_create(&OutcomeLabels { outcome: outcome.label() }).inc();
    }

    /// Records what `namespace` holds of `key` of `quota` and its limit.
    pub fn quota(&self, namespace: &str, quota: &str, key: &str, used: u64, limit: u64) {
        let labels = QuotaLabels { namespace: namespace.to_owned(), quota: quota.to_owned(), key: key.to_owned() };
        self.quota_used.get_or_create(&labels).set(i64::try_from(used).unwrap_or(i64::MAX));
        self.quota_limit.get_or_create(&labels).set(i64::try_from(limit).unwrap_or(i64::MAX));
    }

    /// Counts one admission.
    pub fn observe(&self, outcome: Outcome, seconds: f64) {
        let labels = OutcomeLabels { outcome: outcome.label() };
        self.admissions.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(seconds);
    }

    /// Counts one denial by its reason (`CompatError::reason`).
    pub fn denied(&self, reason: &'static str) {
        self.denials.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts one client refused in the TLS handshake, by `reason` (`client_auth::Refusal::label`).
    pub fn refused_client(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Clients refused for `reason` (tests and diagnostics).
    pub fn refused_clients(&self, reason: &'static str) -> u64 {
        self.refused.get_or_create(&ReasonLabels { reason }).get()
    }

    /// Denials counted with `reason` (tests and diagnostics).
    pub fn denials(&self, reason: &'static str) -> u64 {
        self.denials.get_or_create(&ReasonLabels { reason }).get()
    }

    /// Admissions counted with `outcome` (tests and diagnostics).
    pub fn admissions(&self, outcome: Outcome) -> u64 {
        self.admissions.get_or_create(&OutcomeLabels { outcome: outcome.label() }).get()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn counters_are_exposed_under_the_prefix() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics.observe(Outcome::Denied, 0.002);
        metrics.denied("privileged");
        metrics.refused_client("no_certificate");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("vgpu_dra_webhook_admissions_total{outcome=\"denied\"} 1"), "{text}");
        assert!(text.contains("vgpu_dra_webhook_denials_total{reason=\"privileged\"} 1"), "{text}");
        assert!(text.contains("vgpu_dra_webhook_admission_duration_seconds_count{outcome=\"denied\"} 1"), "{text}");
        assert!(text.contains("vgpu_dra_webhook_refused_clients_total{reason=\"no_certificate\"} 1"), "{text}");
    }
}
