//! Pod networking for a [`crate::node::Node`] started with
//! [`NodeOptions::pod_network`](crate::node::NodeOptions): what a chart's pods need of a cluster's
//! network, made of network namespaces and loopback only, so nothing of the machine's own network
//! changes.
//!
//! - The node gets a network namespace of its own, held by containerd (the kubelet joins it): a
//!   bridge `cni0` ([`GATEWAY`] in [`POD_CIDR`]) and its loopback. Host-network pods share it.
//! - Each other pod gets a veth pair from [`CNI_PLUGIN`]: one end in the pod as `eth0` with an
//!   address of [`POD_CIDR`] and a default route through the bridge, the other on the bridge. So
//!   the kubelet's probes reach pod addresses, and pods reach each other.
//! - Pods reach the API server as in a cluster, through the `kubernetes` Service's address
//!   ([`API_SERVICE_IP`]`:443`, which the kubelet gives them as `KUBERNETES_SERVICE_HOST`): the
//!   node's loopback carries that address and a [`Relay`] in this process forwards its
//!   connections to the API server on the machine's loopback. The kubelet's own server URL
//!   (`127.0.0.1:<port>`) is relayed the same way. No kube-proxy: no other Service address
//!   routes.
//! - The API server reaches pods (webhooks behind a Service, resolved to their endpoints by
//!   `--enable-aggregator-routing`) and the kubelet (`logs`, `exec`) through its egress selector:
//!   the `cluster` egress is an HTTP CONNECT proxy on a unix socket ([`EgressProxy`]) that
//!   connects from inside the node's namespace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail, ensure};

/// The pods' addresses.
pub const POD_CIDR: &str = "10.244.0.0/16";
/// The bridge's address: the pods' default route.
pub const GATEWAY: &str = "10.244.0.1";
/// The `kubernetes` Service's cluster IP: the first address of the plane's
/// `--service-cluster-ip-range` (10.0.0.0/24), which the API server's certificate names.
pub const API_SERVICE_IP: &str = "10.0.0.1";

/// The node's CNI plugin: `ADD` moves one end of a new veth pair into the pod as `CNI_IFNAME`,
/// with an address derived from the sandbox's random ID (first two bytes, each 1-254, so never
/// the network's, the bridge's or the broadcast address), and puts the other end on `cni0`;
/// `DEL` removes the pair (deleting one end deletes both). containerd keeps pod namespaces under
/// `/var/run/netns`, where `ip` finds them by name.
pub const CNI_PLUGIN: &str = r#"#!/bin/sh
cat >/dev/null
id="$CNI_CONTAINERID"
host="vd$(echo "$id" | cut -c1-12)"
fail() { printf '{"cniVersion":"1.0.0","code":100,"msg":"%s"}' "$1"; exit 1; }
case "$CNI_COMMAND" in
ADD)
	case "$(dirname "$CNI_NETNS")" in /run/netns|/var/run/netns) ;; *) fail "pod namespace $CNI_NETNS is not under /run/netns" ;; esac
	ns="$(basename "$CNI_NETNS")"
	a=$(( $(printf '%d' "0x$(echo "$id" | cut -c1-2)") % 254 + 1 ))
	b=$(( $(printf '%d' "0x$(echo "$id" | cut -c3-4)") % 254 + 1 ))
	addr="10.244.$a.$b"
	ip link add name "$host" type veth peer name "$CNI_IFNAME" netns "$ns" 2>&1 >/dev/null || fail "creating veth $host"
	ip link set "$host" master cni0 up || fail "attaching $host to cni0"
	ip -n "$ns" addr add "$addr/16" dev "$CNI_IFNAME" || fail "addressing $CNI_IFNAME"
	ip -n "$ns" link set "$CNI_IFNAME" up || fail "bringing $CNI_IFNAME up"
	ip -n "$ns" route add default via 10.244.0.1 || fail "routing through 10.244.0.1"
	printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","sandbox":"%s"}],"ips":[{"address":"%s/16","gateway":"10.244.0.1","interface":0}]}' \
		"$CNI_IFNAME" "$CNI_NETNS" "$addr"
	;;
DEL) ip link del "$host" >/dev/null 2>&1 || true ;;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
esac
"#;

/// Shell lines, run in the node's new network namespace before containerd starts: loopback up
/// with the `kubernetes` Service's address, and the bridge.
pub fn namespace_setup() -> Vec<String> {
    vec![
        "ip link set lo up".to_owned(),
        format!("ip addr add {API_SERVICE_IP}/32 dev lo"),
        "ip link add name cni0 type bridge".to_owned(),
        format!("ip addr add {GATEWAY}/16 dev cni0"),
        "ip link set cni0 up".to_owned(),
    ]
}

/// kube-apiserver's egress selector configuration: the `cluster` egress (Services' endpoints,
/// kubelets) through the HTTP CONNECT proxy at `socket`.
pub fn egress_selector_config(socket: &Path) -> String {
    format!(
        "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
        socket.display()
    )
}

/// Runs `f` on a thread that has joined the network namespace of process `pid`; sockets it
/// creates belong to that namespace for their whole life.
///
/// # Errors
/// When the namespace cannot be joined, or `f` fails.
pub fn in_namespace<T: Send + 'static>(pid: u32, f: impl FnOnce() -> anyhow::Result<T> + Send + 'static) -> anyhow::Result<T> {
    std::thread::spawn(move || {
        join_namespace(pid)?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("a thread in the node's network namespace panicked"))?
}

fn join_namespace(pid: u32) -> anyhow::Result<()> {
    let path = format!("/proc/{pid}/ns/net");
    let ns = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    // setns: it changes only the calling thread's namespace.
    rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
        .with_context(|| format!("joining the network namespace {path}"))
}

/// A connection [`splice`] can copy both ways: a second handle, and a half close.
trait Duplex: Read + Write + Send + Sized + 'static {
    fn second(&self) -> std::io::Result<Self>;
    fn close_write(&self);
}

impl Duplex for TcpStream {
    fn second(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn second(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

/// Copies both ways between two connections until both sides have closed; each side's end of
/// stream is passed on as a half close, as TLS's close_notify and HTTP/2's GOAWAY expect.
fn splice<A: Duplex, B: Duplex>(a: A, b: B) {
    let (Ok(a2), Ok(b2)) = (a.second(), b.second()) else { return };
    std::thread::spawn(move || pump(a2, b2));
    pump(b, a);
}

fn pump<F: Duplex, T: Duplex>(mut from: F, mut to: T) {
    let _ = std::io::copy(&mut from, &mut to);
    to.close_write();
}

/// Accept loops that stop when the owner drops.
struct Loops {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Loops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Forwards connections made to addresses inside the node's network namespace to addresses on
/// the machine (the API server), until dropped.
pub struct Relay {
    _loops: Loops,
}

impl Relay {
    /// Listens on each `(inside, target)`'s `inside` in the namespace of process `pid` and
    /// forwards every connection to `target`, dialed from the machine's namespace.
    ///
    /// # Errors
    /// When the namespace cannot be joined or an address cannot be bound.
    pub fn start(pid: u32, routes: &[(SocketAddr, SocketAddr)]) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for &(inside, target) in routes {
            let listener = in_namespace(pid, move || {
                let l = TcpListener::bind(inside).with_context(|| format!("binding {inside} in the node's namespace"))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })?;
            let stop = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || {
                accept_loop(
                    &stop,
                    || listener.accept().map(|(c, _)| c),
                    move |conn| {
                        conn.set_nonblocking(false)?;
                        let upstream = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
                        std::thread::spawn(move || splice(conn, upstream));
                        Ok(())
                    },
                );
            }));
        }
        Ok(Self { _loops: Loops { stop, threads } })
    }
}

fn accept_loop<C>(
    stop: &AtomicBool,
    mut accept: impl FnMut() -> std::io::Result<C>,
    mut handle: impl FnMut(C) -> std::io::Result<()>,
) {
    while !stop.load(Ordering::SeqCst) {
        match accept() {
            Ok(conn) => {
                if let Err(e) = handle(conn) {
                    eprintln!("pod network: dropping a connection: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                eprintln!("pod network: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// kube-apiserver's `cluster` egress: an HTTP CONNECT proxy on a unix socket whose connections
/// are dialed from inside the node's network namespace, until dropped.
pub struct EgressProxy {
    socket: PathBuf,
    _loops: Loops,
}

impl EgressProxy {
    /// Serves `socket` for the namespace of process `pid`.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn start(pid: u32, socket: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let loop_stop = Arc::clone(&stop);
        // The accepting thread joins the namespace, so every connection it dials is made there.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let joined = join_namespace(pid);
            let ok = joined.is_ok();
            let _ = ready_tx.send(joined);
            if ok {
                accept_loop(&loop_stop, || listener.accept().map(|(c, _)| c), connect_for);
            }
        });
        ready_rx.recv().context("the egress proxy's thread ended")??;
        Ok(Self { socket: socket.to_owned(), _loops: Loops { stop, threads: vec![thread] } })
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Reads one `CONNECT host:port` request, dials it from this thread's namespace, answers, and
/// splices the two connections on a thread of their own.
fn connect_for(mut client: UnixStream) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    let target = match read_connect(&mut client) {
        Ok(t) => t,
        Err(e) => {
            let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            return Err(std::io::Error::other(e.to_string()));
        }
    };
    let addr: SocketAddr = match target.parse() {
        Ok(a) => a,
        Err(_) => {
            let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            return Err(std::io::Error::other(format!("CONNECT to {target}: not an IP address and port")));
        }
    };
    match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(upstream) => {
            client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
            client.set_read_timeout(None)?;
            std::thread::spawn(move || splice(upstream, client));
            Ok(())
        }
        Err(e) => {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
            Err(std::io::Error::other(format!("dialing {addr} in the node's namespace: {e}")))
        }
    }
}

/// The target of a `CONNECT` request, read up to the end of its headers (and no further, so no
/// byte of the tunnel is lost).
fn read_connect(stream: &mut impl Read) -> anyhow::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        ensure!(head.len() < 8192, "CONNECT request headers over 8 KiB");
        if stream.read(&mut byte)? == 0 {
            bail!("connection closed before the end of the CONNECT request");
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("CONNECT"), Some(target)) => Ok(target.to_owned()),
        _ => bail!("not a CONNECT request: {line:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_request_names_its_target_and_leaves_the_tunnel_alone() {
        let mut input: &[u8] = b"CONNECT 10.244.3.4:8443 HTTP/1.1\r\nHost: 10.244.3.4:8443\r\n\r\nTLS";
        assert_eq!(read_connect(&mut input).unwrap(), "10.244.3.4:8443");
        assert_eq!(input, b"TLS");
    }

    #[test]
    fn other_requests_and_short_ones_are_refused() {
        let mut get: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        assert!(read_connect(&mut get).is_err());
        let mut short: &[u8] = b"CONNECT 1.2.3.4:1 HTTP/1.1\r\n";
        assert!(read_connect(&mut short).is_err());
    }

    #[test]
    fn the_egress_configuration_names_the_socket_for_cluster_traffic() {
        let text = egress_selector_config(Path::new("/tmp/x/egress.sock"));
        assert!(text.contains("- name: cluster"), "{text}");
        assert!(text.contains("udsName: /tmp/x/egress.sock"), "{text}");
        assert!(text.contains("proxyProtocol: HTTPConnect"), "{text}");
    }
}
