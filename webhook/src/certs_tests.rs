#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

use super::*;
use crate::tls::{CERT_KEY, KEY_KEY};
const DAY: Duration = Duration::from_secs(86_400);
const TIMEOUT: Duration = Duration::from_secs(5);
const SECRET: &str = "/api/v1/namespaces/ns/secrets/tls";
const SECRETS: &str = "/api/v1/namespaces/ns/secrets";

/// What the fake API server holds and was asked.
#[derive(Default)]
struct Stored {
    secret: Option<Secret>,
    version: u64,
    calls: Vec<String>,
}

impl Stored {
    fn put(&mut self, mut secret: Secret) -> Vec<u8> {
        self.version += 1;
        secret.metadata.resource_version = Some(self.version.to_string());
        let body = serde_json::to_vec(&secret).unwrap();
        self.secret = Some(secret);
        body
    }

    /// Secrets of namespace `ns` with a resourceVersion: create, get, replace (a stale version
    /// is a conflict, as on a real API server).
    fn answer(&mut self, method: &http::Method, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        match (method.as_str(), path, &self.secret) {
            ("GET", SECRET, Some(secret)) => (200, serde_json::to_vec(secret).unwrap()),
            ("GET", SECRET, None) => status(404, "NotFound"),
            ("POST", SECRETS, Some(_)) => status(409, "AlreadyExists"),
            ("POST", SECRETS, None) => (201, self.put(serde_json::from_slice(body).unwrap())),
            ("PUT", SECRET, Some(stored)) => {
                let secret: Secret = serde_json::from_slice(body).unwrap();
                if secret.metadata.resource_version != stored.metadata.resource_version {
                    return status(409, "Conflict");
                }
                (200, self.put(secret))
            }
            _ => status(404, "NotFound"),
        }
    }
}

fn status(code: u16, reason: &str) -> (u16, Vec<u8>) {
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": reason});
    (code, serde_json::to_vec(&status).unwrap())
}

/// An API server holding at most one Secret, `ns/tls`, shared by the clients it makes.
#[derive(Clone, Default)]
struct FakeApi {
    stored: Arc<Mutex<Stored>>,
    /// Writes wait here until this many arrived: replicas that all read before any writes.
    writers: Option<Arc<tokio::sync::Barrier>>,
    hang: bool,
}

impl FakeApi {
    fn holding(bundle: Option<&CertBundle>) -> Self {
        let api = Self::default();
        if let Some(bundle) = bundle {
            api.store(bundle);
        }
        api
    }

    /// Writes `bundle` as someone else would (another replica, cert-manager).
    fn store(&self, bundle: &CertBundle) {
        self.stored.lock().unwrap().put(bundle.to_secret("ns", "tls"));
    }

    fn stored(&self) -> Option<CertBundle> {
        self.stored.lock().unwrap().secret.as_ref().map(|s| CertBundle::from_secret(s).unwrap())
    }

    fn calls(&self) -> Vec<String> {
        self.stored.lock().unwrap().calls.clone()
    }

    fn writes(&self) -> usize {
        self.calls().iter().filter(|c| !c.starts_with("GET ")).count()
    }

    fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let api = api.clone();
            async move {
                let (method, path) = (request.method().clone(), request.uri().path().to_owned());
                let body = request.into_body().collect_bytes().await.unwrap();
                api.stored.lock().unwrap().calls.push(format!("{method} {path}"));
                if api.hang {
                    std::future::pending::<()>().await;
                }
                if let (false, Some(writers)) = (method == http::Method::GET, &api.writers) {
                    writers.wait().await;
                }
                let (code, body) = api.stored.lock().unwrap().answer(&method, &path, &body);
                let response = http::Response::builder().status(code).body(kube::client::Body::from(body)).unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    fn secret(&self, mode: Mode) -> CertSecret {
        CertSecret::new(self.client(), "ns", "tls", mode, TIMEOUT)
    }
}

fn names() -> Vec<String> {
    vec!["wh.ns.svc".to_owned()]
}

fn self_signed() -> Mode {
    Mode::SelfSigned { names: names(), validity: 365 * DAY }
}

fn external() -> Mode {
    Mode::External { names: names() }
}

/// Made `days_ago` with a year's validity.
fn made(days_ago: u32) -> CertBundle {
    CertBundle::generate_at(&names(), 365 * DAY, SystemTime::now() - days_ago * DAY).unwrap()
}

#[tokio::test]
async fn a_bundle_in_the_renewal_window_is_renewed_and_keeps_the_old_ca() {
    let old = made(250);
    let api = FakeApi::holding(Some(&old));
    let new = api.secret(self_signed()).current().await.unwrap();
    assert_ne!(new.cert_pem, old.cert_pem);
    assert_eq!(api.stored().unwrap(), new);
    assert_eq!(api.calls(), [format!("GET {SECRET}"), format!("PUT {SECRET}")]);
    let cas = new.ca_certificates();
    assert_eq!(cas.len(), 2);
    assert_ne!(cas[0], old.ca_certificates()[0], "the new CA comes first");
    assert_eq!(cas[1], old.ca_certificates()[0]);
    // Either caBundle trusts either certificate while replicas switch.
    assert!(new.covers(&names()));
    assert!(CertBundle { cert_pem: old.cert_pem.clone(), ..new.clone() }.covers(&names()));
    let left = new.validity().unwrap().not_after.duration_since(SystemTime::now()).unwrap();
    assert!(left > 364 * DAY && left <= 365 * DAY, "{left:?}");
}

#[tokio::test]
async fn an_expired_earlier_ca_is_dropped_at_renewal() {
    let (current, expired) = (made(250), made(400));
    let stored = CertBundle { ca_pem: format!("{}{}", current.ca_pem, expired.ca_pem), ..current.clone() };
    let api = FakeApi::holding(Some(&stored));
    let new = api.secret(self_signed()).current().await.unwrap();
    assert_eq!(new.ca_certificates().len(), 2, "{:?}", new.ca_certificates());
    assert_eq!(new.ca_certificates()[1], current.ca_certificates()[0]);
    assert!(!new.ca_pem.contains(expired.ca_certificates()[0]));
}

#[tokio::test]
async fn a_bundle_outside_the_window_is_kept_and_one_for_other_names_replaced() {
    let kept = made(200);
    let api = FakeApi::holding(Some(&kept));
    assert_eq!(api.secret(self_signed()).current().await.unwrap(), kept);
    assert_eq!(api.calls(), [format!("GET {SECRET}")]);

    let mode = Mode::SelfSigned { names: vec!["other.ns.svc".into()], validity: 365 * DAY };
    let replaced = api.secret(mode).current().await.unwrap();
    assert!(replaced.covers(&["other.ns.svc".into()]) && replaced != kept);
    assert_eq!(api.writes(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_silent_api_server_is_a_timeout_not_a_hang() {
    let api = FakeApi { hang: true, ..FakeApi::default() };
    let err = api.secret(self_signed()).current().await.unwrap_err();
    assert_eq!(err.to_string(), "reading Secret ns/tls: no answer from the API server within 5s");
}

/// Registers a CA bundle, as run.rs does with the webhook configuration.
type Register = Box<dyn FnMut(String) -> std::future::Ready<Result<(), std::io::Error>> + Send>;
/// The CA bundles a replica registered.
type Registered = Arc<Mutex<Vec<String>>>;

/// A replica serving `served`, recording the CA bundles it registers; the first `fail_first`
/// registrations fail.
fn replica(
    api: &FakeApi,
    mode: Mode,
    served: &CertBundle,
    fail_first: usize,
) -> (Keeper<Register>, Arc<ServingCert>, Registered) {
    let serving = ServingCert::new(served.certified_key().unwrap());
    let registered = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&registered);
    let register: Register = Box::new(move |ca: String| {
        let mut seen = seen.lock().unwrap();
        seen.push(ca);
        std::future::ready(if seen.len() <= fail_first { Err(std::io::Error::other("the API server is away")) } else { Ok(()) })
    });
    (Keeper::new(api.secret(mode), Arc::clone(&serving), served.clone(), register), serving, registered)
}

fn leaf(bundle: &CertBundle) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(bundle.cert_pem.as_bytes()).unwrap()
}

#[tokio::test]
async fn replicas_racing_a_renewal_serve_the_secret_written_first() {
    crate::install_crypto_provider();
    // Both read the old Secret (or none) before either writes.
    for old in [Some(made(250)), None] {
        let api = FakeApi { writers: Some(Arc::new(tokio::sync::Barrier::new(2))), ..FakeApi::holding(old.as_ref()) };
        let start = old.clone().unwrap_or_else(|| made(0));
        let (mut a, serving_a, registered_a) = replica(&api, self_signed(), &start, 0);
        let (mut b, serving_b, registered_b) = replica(&api, self_signed(), &start, 0);
        let (changed_a, changed_b) = tokio::join!(a.check(), b.check());
        assert!(changed_a.unwrap() && changed_b.unwrap());
        let winner = api.stored().unwrap();
        for (serving, registered) in [(serving_a, registered_a), (serving_b, registered_b)] {
            assert_eq!(serving.current().cert[0], leaf(&winner));
            assert_eq!(*registered.lock().unwrap(), std::slice::from_ref(&winner.ca_pem));
        }
        let calls = api.calls();
        assert_eq!(api.writes(), 2, "{calls:?}");
        assert_eq!(calls.iter().filter(|c| c.starts_with("GET")).count(), 3, "the loser reads the winner's back: {calls:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_external_secret_is_waited_for_and_never_written() {
    crate::install_crypto_provider();
    let api = FakeApi::default();
    let secret = api.secret(external());
    let cancel = CancellationToken::new();
    let waiting = tokio::spawn({
        let (secret, cancel) = (secret.clone(), cancel.clone());
        async move { secret.initial(&cancel, &Readiness::not_ready("test")).await }
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!waiting.is_finished());
    let theirs = made(0);
    api.store(&theirs);
    let appeared = tokio::time::Instant::now();
    assert_eq!(waiting.await.unwrap().unwrap(), Some(theirs.clone()));
    assert!(appeared.elapsed() <= WAIT_MAX, "polled at most {WAIT_MAX:?} apart: {:?}", appeared.elapsed());
    // 0, 1, 3, 7, 15, 25, 35, 45, 55 s, then once it is there.
    assert_eq!(api.calls().len(), 10, "{:?}", api.calls());

    // Changed by its issuer: served after registering; expired or gone: never rewritten here.
    let (mut keeper, serving, registered) = replica(&api, external(), &theirs, 0);
    assert!(!keeper.check().await.unwrap());
    let renewed = made(0);
    api.store(&renewed);
    assert!(keeper.check().await.unwrap());
    assert_eq!(serving.current().cert[0], leaf(&renewed));
    assert_eq!(*registered.lock().unwrap(), std::slice::from_ref(&renewed.ca_pem));
    api.store(&made(400));
    assert!(keeper.check().await.unwrap(), "an expired certificate is still the issuer's to renew");
    api.stored.lock().unwrap().secret = None;
    assert_eq!(keeper.check().await.unwrap_err().to_string(), "Secret ns/tls does not exist");
    assert_eq!(api.writes(), 0, "{:?}", api.calls());

    // Stopped while waiting.
    let waiting = tokio::spawn({
        let (secret, cancel) = (secret.clone(), cancel.clone());
        async move { secret.initial(&cancel, &Readiness::not_ready("test")).await }
    });
    tokio::time::sleep(Duration::from_secs(30)).await;
    cancel.cancel();
    assert_eq!(waiting.await.unwrap().unwrap(), None);
    assert_eq!(api.writes(), 0, "{:?}", api.calls());
}

/// A change made to a stored Secret.
type Corrupt = Box<dyn Fn(&mut Secret)>;

/// The ways a Secret's certificate and key can be unusable, each applied to a stored bundle.
fn corruptions() -> Vec<(&'static str, Corrupt)> {
    let set = |key: &'static str, text: String| -> Corrupt {
        Box::new(move |s: &mut Secret| {
            s.data.as_mut().unwrap().insert(key.to_owned(), k8s_openapi::ByteString(text.clone().into_bytes()));
        })
    };
    vec![
        ("the key of another certificate", set(KEY_KEY, made(0).key_pem)),
        ("a key that is not one", set(KEY_KEY, "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n".into())),
        ("a certificate that is not one", set(CERT_KEY, "-----BEGIN CERTIFICATE-----\nbm90\n-----END CERTIFICATE-----\n".into())),
        ("no key", Box::new(|s: &mut Secret| drop(s.data.as_mut().unwrap().remove(KEY_KEY)))),
        ("no CA", Box::new(|s: &mut Secret| drop(s.data.as_mut().unwrap().remove(CA_KEY)))),
    ]
}

#[tokio::test]
async fn an_unusable_self_signed_secret_is_replaced_not_a_crash_loop() {
    crate::install_crypto_provider();
    for (what, corrupt) in corruptions() {
        let good = made(10);
        let api = FakeApi::holding(Some(&good));
        corrupt(api.stored.lock().unwrap().secret.as_mut().unwrap());
        // What every replica starts with, and what the check of a running one reads.
        let replaced = api.secret(self_signed()).initial(&CancellationToken::new(), &Readiness::not_ready("t")).await;
        let replaced = replaced.unwrap_or_else(|e| panic!("{what}: {e}")).unwrap();
        assert!(replaced.certified_key().is_ok(), "{what}: the new bundle serves");
        assert!(replaced.covers(&names()), "{what}");
        assert_eq!(api.writes(), 1, "{what}: replaced once: {:?}", api.calls());
        assert_eq!(api.stored().unwrap(), replaced, "{what}");
        // The CA replicas may still be serving a certificate of stays trusted.
        if what != "no CA" {
            assert!(replaced.ca_certificates().contains(&good.ca_certificates()[0]), "{what}: the old CA is kept");
        }
        // Read again, it is kept.
        assert_eq!(api.secret(self_signed()).current().await.unwrap(), replaced, "{what}");
        assert_eq!(api.writes(), 1, "{what}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unusable_external_secret_is_waited_for_not_ready_and_never_written() {
    crate::install_crypto_provider();
    for (what, corrupt) in corruptions() {
        let api = FakeApi::holding(Some(&made(0)));
        corrupt(api.stored.lock().unwrap().secret.as_mut().unwrap());
        let readiness = Readiness::not_ready("starting");
        let waiting = tokio::spawn({
            let (secret, readiness) = (api.secret(external()), readiness.clone());
            async move { secret.initial(&CancellationToken::new(), &readiness).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "{what}: no exit, no crash loop");
        let reason = readiness.reason().unwrap_or_default();
        assert!(reason.starts_with("the certificate Secret ns/tls is not usable ("), "{what}: {reason}");
        assert!(reason.ends_with("waiting for its issuer to fix it"), "{what}: {reason}");
        // The issuer fixes it: served, and nothing was ever written here.
        let fixed = made(0);
        api.store(&fixed);
        assert_eq!(waiting.await.unwrap().unwrap(), Some(fixed), "{what}");
        assert_eq!(api.writes(), 0, "{what}: the issuer's Secret is never written here: {:?}", api.calls());
    }
}

#[tokio::test(start_paused = true)]
async fn the_check_loop_registers_before_it_serves_and_retries_a_failure() {
    crate::install_crypto_provider();
    let (old, new) = (made(0), made(0));
    let api = FakeApi::holding(Some(&old));
    // The first registration fails: the old certificate stays served until one succeeds.
    let (keeper, serving, registered) = replica(&api, self_signed(), &old, 1);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(keeper.run(Duration::from_secs(300), cancel.clone()));
    tokio::time::sleep(Duration::from_secs(301)).await;
    assert!(registered.lock().unwrap().is_empty(), "nothing changed");
    api.store(&new);
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(registered.lock().unwrap().len(), 1);
    assert_eq!(serving.current().cert[0], leaf(&old), "not served before the API server trusts its CA");
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(*registered.lock().unwrap(), [new.ca_pem.clone(), new.ca_pem.clone()]);
    assert_eq!(serving.current().cert[0], leaf(&new));
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(1), task).await.unwrap().unwrap();
    assert_eq!(api.writes(), 0, "a fresh self-signed Secret is kept");
}

/// A TLS client trusting only the CAs of `ca_pem`.
fn client_trusting(ca_pem: &str) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    TlsConnector::from(Arc::new(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()))
}

async fn connect(address: std::net::SocketAddr, ca_pem: &str) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(address).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio::time::timeout(TIMEOUT, client_trusting(ca_pem).connect(name, tcp)).await?
}

/// `GET /healthz` on a kept-alive connection.
async fn healthz(stream: &mut tokio_rustls::client::TlsStream<TcpStream>) -> String {
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let mut text = Vec::new();
    while !text.ends_with(b"\r\n\r\nok") {
        let mut chunk = [0; 1024];
        let n = tokio::time::timeout(TIMEOUT, stream.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "closed after {}", String::from_utf8_lossy(&text));
        text.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(text).unwrap()
}

#[tokio::test]
async fn the_resolver_serves_the_new_certificate_after_a_swap() {
    crate::install_crypto_provider();
    let loopback = vec!["127.0.0.1".to_owned()];
    let (old, new) = (CertBundle::generate(&loopback, DAY).unwrap(), CertBundle::generate(&loopback, DAY).unwrap());
    let serving = ServingCert::new(old.certified_key().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
    let cancel = CancellationToken::new();
    let refusals = crate::server::Refusals::new(crate::metrics::Metrics::unregistered());
    let server = tokio::spawn(crate::server::serve_tls(listener, serving.server_config(None), router, refusals, cancel.clone()));

    let mut before = connect(address, &old.ca_pem).await.unwrap();
    assert!(healthz(&mut before).await.starts_with("HTTP/1.1 200"));
    assert!(connect(address, &new.ca_pem).await.is_err(), "the new CA does not sign what is served yet");

    serving.swap(new.certified_key().unwrap());
    let mut after = connect(address, &new.ca_pem).await.unwrap();
    assert_eq!(after.get_ref().1.peer_certificates().unwrap()[0], leaf(&new));
    assert!(healthz(&mut after).await.starts_with("HTTP/1.1 200"));
    assert!(connect(address, &old.ca_pem).await.is_err(), "the old certificate is no longer served");
    // The connection made before the swap is not dropped.
    assert!(healthz(&mut before).await.starts_with("HTTP/1.1 200"));

    cancel.cancel();
    drop((before, after));
    server.await.unwrap();
}
