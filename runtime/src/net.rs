//! Sockets we serve on.

/// Sends each write at once. An answer goes out as more than one write (TLS records, headers and
/// body), and with Nagle's algorithm the last one waits for the client's delayed ACK: 40 ms on
/// Linux, which was the p99 of concurrent admissions.
pub fn no_delay(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
}
