//! Serving gRPC on unix sockets to the kubelet.
//!
//! The kubelet's plugin watcher dials the registration socket with a bare path as gRPC target, so
//! grpc-go sends that path, percent-encoded (`%2Fvar%2Flib%2Fkubelet%2F...`), as the HTTP/2
//! `:authority`. hyper's `h2`, under tonic, rejects such a request as malformed
//! (`PROTOCOL_ERROR`, Kubernetes issue 109081; only some kubelet clients were fixed). So each
//! accepted connection runs through a small shim that re-encodes client header blocks with a
//! loopback authority; everything else passes through byte for byte.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::ReceiverStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// The smallest maximum frame size every HTTP/2 peer accepts.
const MAX_FRAME: usize = 16_384;
/// Larger header blocks than this are refused rather than buffered.
const MAX_HEADER_BLOCK: usize = 1 << 20;

/// One accepted connection, as tonic's server sees it.
#[derive(Debug)]
pub struct ShimmedConnection(DuplexStream);

impl tonic::transport::server::Connected for ShimmedConnection {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for ShimmedConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ShimmedConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Binds `path` (replacing a stale socket file) and returns the stream of shimmed connections
/// for `tonic::transport::Server::serve_with_incoming`. Must be called inside a tokio runtime.
///
/// # Errors
/// When the socket cannot be bound.
pub fn bind(path: &Path) -> io::Result<ReceiverStream<io::Result<ShimmedConnection>>> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let conn = match listener.accept().await {
                Ok((stream, _)) => Ok(shim(stream)),
                Err(e) => Err(e),
            };
            if tx.send(conn).await.is_err() {
                break;
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// Wires `client` to a new in-memory connection, fixing client header blocks on the way in.
fn shim(client: UnixStream) -> ShimmedConnection {
    let (server_side, ours) = tokio::io::duplex(64 * 1024);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut ours_read, mut ours_write) = tokio::io::split(ours);
    tokio::spawn(async move {
        if let Err(e) = rewrite_client_frames(&mut client_read, &mut ours_write).await {
            tracing::debug!(error = %e, "gRPC client connection ended");
        }
        let _ = ours_write.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut ours_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    ShimmedConnection(server_side)
}

/// Copies HTTP/2 frames from `from` to `to`, re-encoding every request header block.
async fn rewrite_client_frames<R, W>(from: &mut R, to: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    // A header block being collected: stream, END_STREAM flag, fragments so far.
    let mut pending: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        from.read_exact(&mut head).await?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        let fragment = match kind {
            FRAME_HEADERS => {
                let fragment = header_fragment(&payload, flags)?;
                pending = Some((stream, flags & FLAG_END_STREAM, fragment.to_vec()));
                true
            }
            FRAME_CONTINUATION => {
                let Some((_, _, block)) = pending.as_mut() else {
                    return Err(invalid("CONTINUATION without HEADERS"));
                };
                block.extend_from_slice(&payload);
                true
            }
            _ => false,
        };
        if !fragment {
            to.write_all(&head).await?;
            to.write_all(&payload).await?;
            continue;
        }
        if pending.as_ref().is_some_and(|(_, _, b)| b.len() > MAX_HEADER_BLOCK) {
            return Err(invalid("header block too large"));
        }
        if flags & FLAG_END_HEADERS == 0 {
            continue;
        }
        let Some((stream, end_stream, block)) = pending.take() else { continue };
        let headers = decoder.decode(&block).map_err(|e| invalid(&format!("HPACK: {e}")))?;
        let fixed: Vec<(Vec<u8>, Vec<u8>)> = headers
            .into_iter()
            .map(|(name, value)| {
                // On a unix socket the authority names nothing; grpc-go sends the
                // percent-encoded socket path, which h2 refuses.
                if name == b":authority" { (name, b"localhost".to_vec()) } else { (name, value) }
            })
            .collect();
        let encoded = encoder.encode(fixed.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        write_header_block(to, stream, end_stream, &encoded).await?;
    }
}

/// The header block fragment of a HEADERS payload, without padding and priority fields.
fn header_fragment(payload: &[u8], flags: u8) -> io::Result<&[u8]> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & FLAG_PADDED != 0 {
        let pad = usize::from(*payload.first().ok_or_else(|| invalid("empty padded HEADERS"))?);
        start = 1;
        end = end.checked_sub(pad).ok_or_else(|| invalid("padding longer than frame"))?;
    }
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end).ok_or_else(|| invalid("HEADERS frame too short"))
}

/// Writes `block` as one HEADERS frame and as many CONTINUATION frames as it needs.
async fn write_header_block<W: AsyncWrite + Unpin>(to: &mut W, stream: u32, end_stream: u8, block: &[u8]) -> io::Result<()> {
    let chunks: Vec<&[u8]> = if block.is_empty() { vec![block] } else { block.chunks(MAX_FRAME).collect() };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { FRAME_HEADERS } else { FRAME_CONTINUATION };
        let mut flags = if i == 0 { end_stream } else { 0 };
        if i == last {
            flags |= FLAG_END_HEADERS;
        }
        let len = u32::try_from(chunk.len()).map_err(|_| invalid("frame too large"))?.to_be_bytes();
        let id = stream.to_be_bytes();
        to.write_all(&[len[1], len[2], len[3], kind, flags, id[0], id[1], id[2], id[3]]).await?;
        to.write_all(chunk).await?;
    }
    Ok(())
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
#[path = "uds_tests.rs"]
mod tests;
