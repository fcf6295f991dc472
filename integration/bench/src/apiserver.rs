//! What the API server itself says a run cost it: CPU time and memory from /proc, and the watch
//! events it sent and the watches it holds, from its own Prometheus metrics. These are the
//! figures that show whether a driver's cost grows with the cluster: a driver that watches every
//! claim makes the server send each claim event once per node.

use std::collections::BTreeMap;

use anyhow::Context;
use kube::Client;
use serde::Serialize;

/// The API server's CPU time and resident memory now, and its peak so far.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServerUsage {
    /// User plus system CPU seconds since it started.
    pub cpu_seconds: f64,
    /// Resident memory now, in MiB.
    pub rss_mib: f64,
    /// The most resident memory it has held (VmHWM), in MiB.
    pub peak_rss_mib: f64,
}

/// Reads the API server's usage from /proc.
pub fn usage(pid: u32) -> anyhow::Result<ServerUsage> {
    let now = crate::procfs::sample(pid)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("process {pid}"))?;
    let peak_kib = kib_field(&status, "VmHWM:").context("no VmHWM")?;
    Ok(ServerUsage { cpu_seconds: now.cpu_seconds, rss_mib: now.rss_mib, peak_rss_mib: peak_kib / 1024.0 })
}

fn kib_field(status: &str, name: &str) -> Option<f64> {
    status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok())
}

/// Watch traffic by resource (`resourceclaims`, `resourceslices`, ...), from one scrape.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WatchTraffic {
    /// Events sent to watchers since the server started (`apiserver_watch_events_total`).
    pub events: BTreeMap<String, f64>,
    /// Watches open now (`apiserver_longrunning_requests` with verb WATCH).
    pub watches: BTreeMap<String, f64>,
}

impl WatchTraffic {
    /// Scrapes the server's `/metrics` through `client` (an admin may read them).
    pub async fn scrape(client: &Client) -> anyhow::Result<Self> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = tokio::time::timeout(std::time::Duration::from_secs(30), client.request_text(request))
            .await
            .context("the API server's /metrics did not answer in 30 s")??;
        Ok(Self::parse(&text))
    }

    /// Reads the two metric families from Prometheus text; other lines are ignored.
    pub fn parse(text: &str) -> Self {
        let mut out = Self::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let label = |key: &str| {
                labels.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix("=\"")?.split('"').next().map(str::to_owned))
            };
            // The resource is `resource` in recent releases; older ones said `kind`.
            let resource = || label("resource").or_else(|| label("kind")).unwrap_or_else(|| "-".into());
            match name {
                "apiserver_watch_events_total" => *out.events.entry(resource()).or_default() += value,
                "apiserver_longrunning_requests" if label("verb").as_deref() == Some("WATCH") => {
                    *out.watches.entry(resource()).or_default() += value;
                }
                _ => {}
            }
        }
        out
    }

    /// Events sent for `resource` since `before` was scraped.
    pub fn events_since(&self, before: &Self, resource: &str) -> f64 {
        self.events.get(resource).copied().unwrap_or(0.0) - before.events.get(resource).copied().unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::WatchTraffic;

    #[test]
    fn reads_events_and_watches_by_resource() {
        let text = "# HELP apiserver_watch_events_total x\n\
apiserver_watch_events_total{group=\"resource.k8s.io\",resource=\"resourceclaims\",version=\"v1\"} 120\n\
apiserver_watch_events_total{group=\"resource.k8s.io\",resource=\"resourceclaims\",version=\"v1beta2\"} 3\n\
apiserver_watch_events_total{group=\"\",kind=\"pods\",version=\"v1\"} 7\n\
apiserver_longrunning_requests{component=\"apiserver\",group=\"resource.k8s.io\",resource=\"resourceslices\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 101\n\
apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"exec\",verb=\"CONNECT\",version=\"v1\"} 2\n\
apiserver_watch_events_sizes_bucket{le=\"1024\",resource=\"pods\"} 99\n";
        let t = WatchTraffic::parse(text);
        assert_eq!(t.events.get("resourceclaims"), Some(&123.0));
        assert_eq!(t.events.get("pods"), Some(&7.0));
        assert_eq!(t.watches.get("resourceslices"), Some(&101.0));
        assert_eq!(t.watches.get("pods"), None, "CONNECT is not a watch");
        let before = WatchTraffic::parse("apiserver_watch_events_total{resource=\"resourceclaims\"} 20\n");
        assert_eq!(t.events_since(&before, "resourceclaims"), 103.0);
        assert_eq!(t.events_since(&before, "nothing"), 0.0);
    }
}
