use std::path::PathBuf;
use std::time::Duration;

use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_dra_proto::registration::registration_server::{Registration, RegistrationServer};
use vgpu_dra_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

use super::*;

const FRAME_DATA: u8 = 0x0;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const FRAME_WINDOW_UPDATE: u8 = 0x8;
const FLAG_ACK: u8 = 0x1;
const PROTOCOL_ERROR: u32 = 0x1;
/// What grpc-go sends as `:authority` when the kubelet dials a bare socket path.
const GRPC_GO_AUTHORITY: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.example.com-reg.sock";

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// A registration service that always answers.
struct Answering;

#[tonic::async_trait]
impl Registration for Answering {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo { name: "shim-test".into(), ..Default::default() }))
    }
    async fn notify_registration_status(
        &self,
        _: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Splits what follows the preface into (type, flags, stream, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
        out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    out
}

fn get_info_headers(authority: &str) -> Headers {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pluginregistration.Registration/GetInfo"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn encode(headers: &Headers) -> Vec<u8> {
    Encoder::new().encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// A client connection's bytes: preface, empty SETTINGS, then `frames`.
fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(FRAME_SETTINGS, 0, 0, &[]));
    out.extend(frames.concat());
    out
}

/// One unary `GetInfo` call on stream 1 with `authority`: its HEADERS and an empty message.
fn get_info_call(authority: &str) -> Vec<u8> {
    connection(&[
        frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &encode(&get_info_headers(authority))),
        frame(FRAME_DATA, FLAG_END_STREAM, 1, &[0; 5]),
    ])
}

/// Runs a client's bytes through the rewriting; returns what reached the server and the
/// error that ended it (the end of `input` is `UnexpectedEof`).
async fn rewrite(input: &[u8]) -> (Vec<u8>, io::Error) {
    let mut out = Vec::new();
    let end = rewrite_client_frames(&mut &input[..], &mut out).await.unwrap_err();
    (out, end)
}

/// What a server answered on stream 1, or how it ended the connection.
#[derive(Debug, Default)]
struct Answer {
    headers: Vec<(String, String)>,
    data: usize,
    reset: Option<u32>,
    goaway: Option<u32>,
    closed: bool,
}

impl Answer {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// A registration server behind the shim on a socket in `dir`.
fn serve_shimmed(dir: &Path) -> PathBuf {
    let path = dir.join("reg.sock");
    let incoming = bind(&path).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder().add_service(RegistrationServer::new(Answering)).serve_with_incoming(incoming),
    );
    path
}

/// Sends `bytes` to the socket at `path` and reads until stream 1 ends or the connection does.
async fn call(path: &Path, bytes: &[u8]) -> Answer {
    let mut conn = UnixStream::connect(path).await.unwrap();
    conn.write_all(bytes).await.unwrap();
    let mut decoder = Decoder::new();
    let mut answer = Answer::default();
    let read = async {
        loop {
            let mut head = [0u8; 9];
            if conn.read_exact(&mut head).await.is_err() {
                answer.closed = true;
                return;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if conn.read_exact(&mut payload).await.is_err() {
                answer.closed = true;
                return;
            }
            let (kind, flags, stream) = (head[3], head[4], u32::from_be_bytes([head[5], head[6], head[7], head[8]]));
            let code = |at: usize| u32::from_be_bytes([payload[at], payload[at + 1], payload[at + 2], payload[at + 3]]);
            match kind {
                FRAME_SETTINGS if flags & FLAG_ACK == 0 => {
                    // A connection the shim has closed refuses the ACK.
                    answer.closed = conn.write_all(&frame(FRAME_SETTINGS, FLAG_ACK, 0, &[])).await.is_err();
                    if answer.closed {
                        return;
                    }
                }
                // The server's header blocks here are small: one frame each.
                FRAME_HEADERS if stream == 1 => {
                    for (n, v) in decoder.decode(&payload).unwrap() {
                        answer.headers.push((String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()));
                    }
                    if flags & FLAG_END_STREAM != 0 {
                        return;
                    }
                }
                FRAME_DATA if stream == 1 => answer.data += len,
                FRAME_RST_STREAM if stream == 1 => {
                    answer.reset = Some(code(0));
                    return;
                }
                FRAME_GOAWAY => {
                    answer.goaway = Some(code(4));
                    return;
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.expect("the server neither answered nor closed in 10 s");
    answer
}

#[tokio::test]
async fn a_call_with_grpc_gos_socket_path_authority_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_shimmed(dir.path());
    for authority in [GRPC_GO_AUTHORITY, "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock", "localhost"] {
        let answer = call(&path, &get_info_call(authority)).await;
        assert_eq!(answer.get(":status"), Some("200"), "{authority}: {answer:?}");
        assert_eq!(answer.get("grpc-status"), Some("0"), "{authority}: {answer:?}");
        assert!(answer.data > 5, "{authority}: no PluginInfo in {answer:?}");
    }
}

/// The reason for the shim: the same call without it is refused. Should h2 ever accept such
/// an authority, this fails and the shim can go.
#[tokio::test]
async fn without_the_shim_h2_refuses_grpc_gos_authority() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.sock");
    let incoming = UnixListenerStream::new(UnixListener::bind(&path).unwrap());
    tokio::spawn(
        tonic::transport::Server::builder().add_service(RegistrationServer::new(Answering)).serve_with_incoming(incoming),
    );
    let answer = call(&path, &get_info_call(GRPC_GO_AUTHORITY)).await;
    assert_eq!(answer.reset, Some(PROTOCOL_ERROR), "not refused as malformed without the shim: {answer:?}");
}

#[tokio::test]
async fn a_normal_request_passes_unchanged() {
    let headers = get_info_headers("localhost");
    let window = frame(FRAME_WINDOW_UPDATE, 0, 0, &1000u32.to_be_bytes());
    let data = frame(FRAME_DATA, FLAG_END_STREAM, 1, &[0; 5]);
    let input = connection(&[window.clone(), frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &encode(&headers)), data.clone()]);
    let (out, end) = rewrite(&input).await;
    assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof, "{end}");
    assert_eq!(&out[..PREFACE.len()], PREFACE);
    let got = frames(&out[PREFACE.len()..]);
    let want = frames(&input[PREFACE.len()..]);
    assert_eq!(got.len(), want.len());
    // Frames other than header blocks are copied byte for byte, in order.
    for i in [0, 1, 3] {
        assert_eq!(got[i], want[i]);
    }
    let (kind, flags, stream, block) = &got[2];
    assert_eq!((*kind, *flags, *stream), (FRAME_HEADERS, FLAG_END_HEADERS, 1));
    assert_eq!(Decoder::new().decode(block).unwrap(), headers);
}

#[tokio::test]
async fn the_authority_is_rewritten_and_nothing_else() {
    let (out, _) = rewrite(&get_info_call(GRPC_GO_AUTHORITY)).await;
    let got = frames(&out[PREFACE.len()..]);
    assert_eq!(Decoder::new().decode(&got[1].3).unwrap(), get_info_headers("localhost"));
}

#[tokio::test]
async fn padding_priority_and_continuations_are_reassembled() {
    let headers = get_info_headers(GRPC_GO_AUTHORITY);
    let block = encode(&headers);
    let (first, rest) = block.split_at(block.len() / 2);
    // PADDED: pad length, fragment, padding. PRIORITY: 4 bytes of dependency and a weight.
    let mut payload = vec![3, 0, 0, 0, 0, 15];
    payload.extend_from_slice(first);
    payload.extend_from_slice(&[0; 3]);
    let input = connection(&[
        frame(FRAME_HEADERS, FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM, 3, &payload),
        frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 3, rest),
    ]);
    let (out, end) = rewrite(&input).await;
    assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof, "{end}");
    let got = frames(&out[PREFACE.len()..]);
    assert_eq!(got.len(), 2, "{got:?}");
    let (kind, flags, stream, block) = &got[1];
    assert_eq!((*kind, *flags, *stream), (FRAME_HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS, 3));
    assert_eq!(Decoder::new().decode(block).unwrap(), get_info_headers("localhost"));
}

#[tokio::test]
async fn a_large_header_block_is_sent_in_frames_the_server_accepts() {
    let mut headers = get_info_headers(GRPC_GO_AUTHORITY);
    headers.push((b"x-large".to_vec(), vec![b'a'; 40_000]));
    let block = encode(&headers);
    let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
    let last = chunks.len() - 1;
    let input: Vec<Vec<u8>> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let end = if i == last { FLAG_END_HEADERS } else { 0 };
            if i == 0 { frame(FRAME_HEADERS, end, 5, c) } else { frame(FRAME_CONTINUATION, end, 5, c) }
        })
        .collect();
    let (out, _) = rewrite(&connection(&input)).await;
    let got = frames(&out[PREFACE.len()..]);
    let blocks = &got[1..];
    assert!(blocks.len() > 1, "{} frames", blocks.len());
    let mut joined = Vec::new();
    for (i, (kind, flags, stream, payload)) in blocks.iter().enumerate() {
        assert!(payload.len() <= MAX_FRAME);
        assert_eq!(*stream, 5);
        assert_eq!(*kind, if i == 0 { FRAME_HEADERS } else { FRAME_CONTINUATION });
        assert_eq!(*flags & FLAG_END_HEADERS != 0, i == blocks.len() - 1);
        joined.extend_from_slice(payload);
    }
    headers[3].1 = b"localhost".to_vec();
    assert_eq!(Decoder::new().decode(&joined).unwrap(), headers);
}

#[tokio::test]
async fn malformed_frames_end_the_connection_with_invalid_data() {
    let block = encode(&get_info_headers(GRPC_GO_AUTHORITY));
    let huge: Vec<Vec<u8>> = std::iter::once(frame(FRAME_HEADERS, 0, 1, &block))
        .chain((0..=MAX_HEADER_BLOCK / MAX_FRAME).map(|_| frame(FRAME_CONTINUATION, 0, 1, &[0; MAX_FRAME])))
        .collect();
    let cases: [(&str, Vec<Vec<u8>>); 6] = [
        ("CONTINUATION without HEADERS", vec![frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, &block)]),
        ("padding longer than frame", vec![frame(FRAME_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[200, 1, 2])]),
        ("empty padded HEADERS", vec![frame(FRAME_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[])]),
        ("HEADERS frame too short", vec![frame(FRAME_HEADERS, FLAG_PRIORITY | FLAG_END_HEADERS, 1, &[0, 0])]),
        // An indexed field far past the static and dynamic tables.
        ("HPACK", vec![frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &[0xff, 0xff, 0xff, 0x0f])]),
        ("header block too large", huge),
    ];
    for (what, bad) in cases {
        let (out, end) = rewrite(&connection(&bad)).await;
        assert_eq!(end.kind(), io::ErrorKind::InvalidData, "{what}: {end}");
        assert!(end.to_string().contains(what), "{what}: {end}");
        // Nothing of the bad block reaches the server: only the preface and SETTINGS.
        assert_eq!(frames(&out[PREFACE.len()..]).len(), 1, "{what}");
    }
}

#[tokio::test]
async fn a_malformed_frame_closes_the_connection_instead_of_hanging_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_shimmed(dir.path());
    let answer = call(&path, &connection(&[frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82])])).await;
    assert!(answer.headers.is_empty(), "{answer:?}");
    assert!(answer.closed || answer.goaway.is_some(), "{answer:?}");
    // The listener still serves the next connection.
    let answer = call(&path, &get_info_call(GRPC_GO_AUTHORITY)).await;
    assert_eq!(answer.get("grpc-status"), Some("0"), "{answer:?}");
}
