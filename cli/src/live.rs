//! `usage --live`: what the claims' processes really use, from the node monitors' metrics
//! (`hami_vgpu_memory_used_bytes`, `hami_vgpu_memory_limit_bytes`,
//! `hami_container_device_utilization_ratio`, see docs/metrics.md), read from each driver pod
//! through the API server's pod proxy, or from metrics URLs given by hand (`kubectl
//! port-forward`). Parsing is pure; the reads have deadlines.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::Serialize;

/// One claim's use of one card, as its node's monitor last read it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimUse {
    /// The claim's namespace.
    pub namespace: String,
    /// The pod using it ("" when the monitor does not know it yet).
    pub pod: String,
    /// The claim.
    pub claim_uid: String,
    /// The card.
    pub device_uuid: String,
    /// Device memory in use, bytes.
    pub used: u64,
    /// The claim's limit on that card, bytes.
    pub limit: u64,
    /// SM utilisation, percent of the card.
    pub sm_percent: f64,
}

/// What one driver's page says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// The nodes whose cards the page describes (from `vgpu_dra_device_capacity{node}`): their
    /// cards get figures, zero where nothing runs.
    pub nodes: BTreeSet<String>,
    /// Each claim's use per card.
    pub uses: Vec<ClaimUse>,
}

impl Page {
    /// Adds `other`'s nodes and uses.
    pub fn merge(&mut self, other: Page) {
        self.nodes.extend(other.nodes);
        self.uses.extend(other.uses);
    }
}

const CAPACITY: &str = "vgpu_dra_device_capacity";
const USED: &str = "hami_vgpu_memory_used_bytes";
const LIMIT: &str = "hami_vgpu_memory_limit_bytes";
const SM: &str = "hami_container_device_utilization_ratio";

/// The label pairs of `{k="v",...}`, with Prometheus's escapes (`\\`, `\"`, `\n`).
fn labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if rest.is_empty() {
            return Some(out);
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.insert(key.trim().to_owned(), value);
        rest = &after[end + 1..];
    }
}

/// The nodes and every claim's use found in a metrics page; other lines are ignored.
pub fn parse(text: &str) -> Page {
    let mut uses: BTreeMap<(String, String), ClaimUse> = BTreeMap::new();
    let mut nodes = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = line.split_once('{') else { continue };
        if ![USED, LIMIT, SM, CAPACITY].contains(&name) {
            continue;
        }
        let Some((label_text, value)) = rest.rsplit_once('}') else { continue };
        let (Some(l), Ok(value)) = (labels(label_text), value.trim().parse::<f64>()) else { continue };
        let get = |k: &str| l.get(k).cloned().unwrap_or_default();
        if name == CAPACITY {
            nodes.insert(get("node"));
            continue;
        }
        let key = (get("claim_uid"), get("device_uuid"));
        if key.0.is_empty() || key.1.is_empty() {
            continue;
        }
        let entry = uses.entry(key.clone()).or_insert_with(|| ClaimUse {
            namespace: get("namespace"),
            pod: get("pod"),
            claim_uid: key.0,
            device_uuid: key.1,
            used: 0,
            limit: 0,
            sm_percent: 0.0,
        });
        // Gauges of whole bytes, written as floats.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bytes = value.max(0.0) as u64;
        match name {
            USED => entry.used = bytes,
            LIMIT => entry.limit = bytes,
            _ => entry.sm_percent = value.max(0.0),
        }
    }
    nodes.remove("");
    Page { nodes, uses: uses.into_values().collect() }
}

/// Why a page of metrics was not read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// Not a plain `http://host:port/path` URL.
    #[error("--metrics {0}: give an http:// URL (for example through `kubectl port-forward`)")]
    Url(String),
    /// The endpoint did not answer well in time.
    #[error("reading {url}: {reason}")]
    Read {
        /// The URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

/// One GET of `url` (plain HTTP, as the drivers serve their metrics), with `timeout` on each
/// step.
///
/// # Errors
/// [`LiveError`] for another scheme, no answer, or a status other than 200.
pub fn get(url: &str, timeout: Duration) -> Result<String, LiveError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| LiveError::Url(url.to_owned()))?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let read = |reason: String| LiveError::Read { url: url.to_owned(), reason };
    let address = host.to_socket_addrs().map_err(|e| read(e.to_string()))?.next().ok_or_else(|| read("no address".into()))?;
    let mut stream = TcpStream::connect_timeout(&address, timeout).map_err(|e| read(e.to_string()))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| read(e.to_string()))?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| read(e.to_string()))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|e| read(e.to_string()))?;
    let mut response = Vec::new();
    // A metrics page of 1,000 claims is a few MiB; stop well past that.
    stream.take(64 << 20).read_to_end(&mut response).map_err(|e| read(e.to_string()))?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| read("no HTTP body".into()))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1).is_none_or(|code| code != "200") {
        return Err(read(status.to_owned()));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drivers_page_gives_each_claims_use_per_card() {
        let page = r#"# HELP hami_vgpu_memory_used_bytes vGPU device memory usage in bytes
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{namespace="ns",pod="p",container="main",claim_uid="u-1",vdevice_index="0",device_uuid="GPU-a"} 1073741824
hami_vgpu_memory_limit_bytes{namespace="ns",pod="p",container="main",claim_uid="u-1",vdevice_index="0",device_uuid="GPU-a"} 4294967296
hami_container_device_utilization_ratio{namespace="ns",pod="p",container="main",claim_uid="u-1",vdevice_index="0",device_uuid="GPU-a"} 37
hami_vgpu_memory_used_bytes{namespace="ns",pod="we\"ird,pod",container="",claim_uid="u-2",vdevice_index="0",device_uuid="GPU-a"} 5
vgpu_dra_prepared_claims 2
vgpu_dra_device_capacity{node="n1",device="hami-gpu-0",uuid="GPU-a",capacity="memory"} 1
hami_vgpu_memory_used_bytes{claim_uid="",device_uuid="GPU-a"} 9
not a metric line {
"#;
        let page = parse(page);
        assert_eq!(page.nodes.iter().collect::<Vec<_>>(), ["n1"]);
        let uses = page.uses;
        assert_eq!(uses.len(), 2, "{uses:?}");
        assert_eq!(
            uses[0],
            ClaimUse {
                namespace: "ns".into(),
                pod: "p".into(),
                claim_uid: "u-1".into(),
                device_uuid: "GPU-a".into(),
                used: 1 << 30,
                limit: 4 << 30,
                sm_percent: 37.0,
            }
        );
        assert_eq!(uses[1].pod, "we\"ird,pod");
        assert_eq!(uses[1].used, 5);
    }

    #[test]
    fn only_plain_http_urls_are_read() {
        assert!(matches!(get("https://x:1/metrics", Duration::from_secs(1)), Err(LiveError::Url(_))));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for reply in ["HTTP/1.0 200 OK\r\n\r\nhello", "HTTP/1.0 404 Not Found\r\n\r\n"] {
                let (mut s, _) = listener.accept().unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 512];
                while !request.ends_with(b"\r\n\r\n") {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "the request ended early");
                    request.extend_from_slice(&buf[..n]);
                }
                s.write_all(reply.as_bytes()).unwrap();
            }
        });
        assert_eq!(get(&format!("http://127.0.0.1:{port}/metrics"), Duration::from_secs(5)).unwrap(), "hello");
        let e = get(&format!("http://127.0.0.1:{port}/metrics"), Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("404"), "{e}");
    }
}
