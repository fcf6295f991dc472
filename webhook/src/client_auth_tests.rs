#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::certs::ServingCert;
use crate::metrics::Metrics;
use crate::server::Refusals;
use crate::tls::CertBundle;

/// A CA that issues client certificates.
struct ClientCa {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl ClientCa {
    fn new(name: &str) -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, name);
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = ca.self_signed(&key).unwrap();
        Self { pem: cert.pem(), issuer: Issuer::new(ca, key) }
    }

    /// A certificate with common name `cn` and DNS names `dns`, for `usage`.
    fn issue(&self, cn: &str, dns: &[&str], usage: ExtendedKeyUsagePurpose) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let mut leaf = CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>()).unwrap();
        leaf.distinguished_name.push(DnType::OrganizationName, "system:masters");
        leaf.distinguished_name.push(DnType::CommonName, cn);
        leaf.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &self.issuer).unwrap();
        (cert.der().clone(), PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
    }
}

#[test]
fn identities_are_the_common_names_and_dns_names() {
    let ca = ClientCa::new("test CA");
    let (cert, _) = ca.issue(
        "kube-apiserver",
        &["apiserver.example.com", "10.0.0.1", "kube.example.com"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    // The IP address SAN is no DNS name; the organization is no common name.
    assert_eq!(identities(&cert).unwrap(), ["kube-apiserver", "apiserver.example.com", "kube.example.com"]);
    let (bare, _) = ca.issue("only-cn", &[], ExtendedKeyUsagePurpose::ClientAuth);
    assert_eq!(identities(&bare).unwrap(), ["only-cn"]);
    let ca_der = CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap();
    assert_eq!(identities(&ca_der).unwrap(), ["test CA"]);
    for cut in [0, 1, 10, 100, cert.len() / 2] {
        assert_eq!(identities(&cert[..cut]), None, "cut at {cut}");
    }
}

#[test]
fn a_file_without_a_ca_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ca.crt");
    std::fs::write(&path, "not a certificate\n").unwrap();
    let err = ClientAuth::from_file(&path, &[]).unwrap_err();
    assert_eq!(err.to_string(), format!("{}: no PEM certificate, or one that does not parse", path.display()));
    let err = ClientAuth::from_file(&dir.path().join("missing"), &[]).unwrap_err();
    assert!(matches!(err, ClientAuthError::Read { .. }), "{err}");
    std::fs::write(&path, ClientCa::new("x").pem).unwrap();
    assert!(ClientAuth::from_file(&path, &["kube-apiserver".into()]).is_ok());
}

/// An admission endpoint on loopback with `auth`, counting the requests that reach a handler.
struct Endpoint {
    address: std::net::SocketAddr,
    server_ca: String,
    handled: Arc<AtomicUsize>,
    metrics: Metrics,
    cancel: CancellationToken,
}

async fn endpoint(auth: Option<&ClientAuth>) -> Endpoint {
    crate::install_crypto_provider();
    let bundle = CertBundle::generate(&["127.0.0.1".to_owned()], Duration::from_secs(86_400)).unwrap();
    let serving = ServingCert::new(bundle.certified_key().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&handled);
    let router = axum::Router::new().route(
        "/mutate-pods",
        axum::routing::post(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { "reviewed" }
        }),
    );
    let metrics = Metrics::unregistered();
    let cancel = CancellationToken::new();
    let config = serving.server_config(auth);
    tokio::spawn(crate::server::serve_tls(listener, config, router, Refusals::new(metrics.clone()), cancel.clone()));
    Endpoint { address, server_ca: bundle.ca_pem, handled, metrics, cancel }
}

/// POSTs a review as a client presenting `identity`; the status line, or the error.
async fn post(
    endpoint: &Endpoint,
    identity: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(endpoint.server_ca.as_bytes()).unwrap()).unwrap();
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder.with_client_auth_cert(vec![cert], key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let exchange = async {
        let tcp = TcpStream::connect(endpoint.address).await?;
        let mut tls = connector.connect(ServerName::try_from("127.0.0.1").unwrap(), tcp).await?;
        // TLS 1.3: a refused client certificate shows at the first read, not in connect.
        tls.write_all(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}").await?;
        let mut text = String::new();
        tls.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok(text)) if !text.is_empty() => Ok(text.lines().next().unwrap_or_default().to_owned()),
        Ok(Ok(_)) => Err("closed without an answer".to_owned()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// Waits for the server side of a refusal to be counted.
async fn counted(metrics: &Metrics, reason: &'static str, want: u64) {
    for _ in 0..100 {
        if metrics.refused_clients(reason) >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metrics.refused_clients(reason), want, "{reason}");
}

/// Only a certificate of the client CA naming an allowed client reaches a handler; every other
/// client is refused in the handshake and counted by why.
#[tokio::test]
async fn only_the_api_servers_certificate_reaches_a_handler() {
    let (ours, theirs) = (ClientCa::new("API server client CA"), ClientCa::new("someone else's CA"));
    let names = ["kube-apiserver".to_owned(), "apiserver.example.com".to_owned()];
    let auth = ClientAuth::from_pem(ours.pem.as_bytes(), &names).unwrap();
    let endpoint = endpoint(Some(&auth)).await;
    let client = ExtendedKeyUsagePurpose::ClientAuth;
    let cases: Vec<(&str, Option<_>, Option<Refusal>)> = vec![
        ("no certificate", None, Some(Refusal::NoCertificate)),
        (
            "another CA's certificate of the right name",
            Some(theirs.issue("kube-apiserver", &[], client.clone())),
            Some(Refusal::UntrustedCertificate),
        ),
        (
            "the CA's certificate of another name",
            Some(ours.issue("alice", &["alice.example.com"], client.clone())),
            Some(Refusal::NameNotAllowed),
        ),
        (
            "the CA's server certificate",
            Some(ours.issue("kube-apiserver", &[], ExtendedKeyUsagePurpose::ServerAuth)),
            Some(Refusal::UntrustedCertificate),
        ),
        ("the name as common name", Some(ours.issue("kube-apiserver", &[], client.clone())), None),
        ("the name as DNS name, case aside", Some(ours.issue("x", &["APIServer.example.com"], client.clone())), None),
    ];
    let mut want = std::collections::HashMap::new();
    let mut handled = 0;
    for (case, identity, refused) in cases {
        let answer = post(&endpoint, identity).await;
        match refused {
            Some(reason) => {
                assert!(answer.is_err(), "{case}: answered {answer:?}");
                *want.entry(reason.label()).or_insert(0) += 1;
            }
            None => {
                assert_eq!(answer.as_deref(), Ok("HTTP/1.1 200 OK"), "{case}");
                handled += 1;
            }
        }
        assert_eq!(endpoint.handled.load(Ordering::SeqCst), handled, "{case}: a refused client reached a handler");
        for (reason, n) in &want {
            counted(&endpoint.metrics, reason, *n).await;
        }
    }
    endpoint.cancel.cancel();
}

#[tokio::test]
async fn without_names_any_certificate_of_the_ca_is_taken_and_without_a_ca_anyone() {
    let ours = ClientCa::new("dedicated CA");
    let auth = ClientAuth::from_pem(ours.pem.as_bytes(), &[]).unwrap();
    let endpoint = endpoint(Some(&auth)).await;
    let identity = ours.issue("whoever", &[], ExtendedKeyUsagePurpose::ClientAuth);
    assert_eq!(post(&endpoint, Some(identity)).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    assert!(post(&endpoint, None).await.is_err());
    endpoint.cancel.cancel();
    // No --client-ca-file: no certificate asked, the handler reached (the binary warns at start).
    let open = self::endpoint(None).await;
    assert_eq!(post(&open, None).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    assert_eq!(open.handled.load(Ordering::SeqCst), 1);
    open.cancel.cancel();
}
