//! The webhook's own TLS: a self-made CA and a serving certificate signed by it, kept in a Secret
//! so every replica serves the same certificate and the registration's `caBundle` stays valid.
//! No cert-manager needed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// Secret key of the CA certificate (PEM).
pub const CA_KEY: &str = "ca.crt";
/// Secret key of the serving certificate (PEM).
pub const CERT_KEY: &str = "tls.crt";
/// Secret key of the serving certificate's private key (PEM).
pub const KEY_KEY: &str = "tls.key";

/// Errors of certificate creation, storage and loading.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen refused the parameters or could not sign.
    #[error("generating the webhook certificate")]
    Generate(#[source] rcgen::Error),
    /// Creating or replacing the Secret failed for another reason than a concurrent write.
    #[error("writing Secret {namespace}/{name}")]
    Create {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Reading back the Secret another replica made failed.
    #[error("reading Secret {namespace}/{name}")]
    Read {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// An API call took longer than its timeout.
    #[error("{what} Secret {namespace}/{name}: no answer from the API server within {timeout:?}")]
    Timeout {
        /// The step.
        what: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The Secret lacks a key or holds no valid PEM under it.
    #[error("Secret {name}: {key} is missing or not valid PEM")]
    BadSecret {
        /// Name.
        name: String,
        /// The key.
        key: &'static str,
    },
    /// rustls refused the certificate and key.
    #[error("building the TLS server configuration")]
    Config(#[source] rustls::Error),
}

/// A CA and a serving certificate signed by it, PEM-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct CertBundle {
    /// The CA certificate: the registration's `caBundle`.
    pub ca_pem: String,
    /// The serving certificate.
    pub cert_pem: String,
    /// The serving certificate's private key.
    pub key_pem: String,
}

impl std::fmt::Debug for CertBundle {
    // The private key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertBundle").field("ca_pem", &self.ca_pem).finish_non_exhaustive()
    }
}

impl CertBundle {
    /// A new CA and a serving certificate for `names` (DNS names or IP addresses), signed by it.
    /// The CA's key is dropped: nothing else is ever signed with it.
    ///
    /// # Errors
    /// [`TlsError::Generate`] for a name that is neither a DNS name nor an IP address.
    pub fn generate(names: &[String]) -> Result<Self, TlsError> {
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(TlsError::Generate)?;
        ca.distinguished_name.push(DnType::CommonName, "vgpu-dra webhook CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate().map_err(TlsError::Generate)?;
        let ca_cert = ca.self_signed(&ca_key).map_err(TlsError::Generate)?;
        let issuer = Issuer::new(ca, ca_key);

        let mut leaf = CertificateParams::new(names.to_vec()).map_err(TlsError::Generate)?;
        let common = names.first().map_or("vgpu-dra-webhook", String::as_str);
        leaf.distinguished_name.push(DnType::CommonName, common);
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate().map_err(TlsError::Generate)?;
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(TlsError::Generate)?;
        Ok(Self { ca_pem: ca_cert.pem(), cert_pem: leaf_cert.pem(), key_pem: leaf_key.serialize_pem() })
    }

    /// The bundle as a Secret `namespace/name` of type `kubernetes.io/tls` plus `ca.crt`.
    pub fn to_secret(&self, namespace: &str, name: &str) -> Secret {
        let data = [(CA_KEY, &self.ca_pem), (CERT_KEY, &self.cert_pem), (KEY_KEY, &self.key_pem)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect::<BTreeMap<_, _>>();
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "vgpu-dra".to_owned())])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(data),
            ..Default::default()
        }
    }

    /// The bundle a Secret holds.
    ///
    /// # Errors
    /// [`TlsError::BadSecret`] naming the first missing or unreadable key.
    pub fn from_secret(secret: &Secret) -> Result<Self, TlsError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let get = |key: &'static str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .filter(|s| s.contains("-----BEGIN "))
                .ok_or_else(|| TlsError::BadSecret { name: name.clone(), key })
        };
        Ok(Self { ca_pem: get(CA_KEY)?, cert_pem: get(CERT_KEY)?, key_pem: get(KEY_KEY)? })
    }

    /// Whether the serving certificate chains to the CA and is valid now for every one of
    /// `names`: a Secret left by an install with other names (or an expired one) is replaced.
    pub fn covers(&self, names: &[String]) -> bool {
        let (Ok(ca), Ok(leaf)) =
            (CertificateDer::from_pem_slice(self.ca_pem.as_bytes()), CertificateDer::from_pem_slice(self.cert_pem.as_bytes()))
        else {
            return false;
        };
        let mut roots = rustls::RootCertStore::empty();
        if roots.add(ca).is_err() {
            return false;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let Ok(verifier) = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build() else {
            return false;
        };
        let now = UnixTime::now();
        names.iter().all(|name| {
            ServerName::try_from(name.as_str()).is_ok_and(|n| verifier.verify_server_cert(&leaf, &[], &n, &[], now).is_ok())
        })
    }

    /// A rustls server configuration serving this certificate over HTTP/1.1 on the process-wide
    /// crypto provider.
    ///
    /// # Errors
    /// [`TlsError::BadSecret`] when the PEM does not parse, [`TlsError::Config`] when rustls
    /// refuses the pair.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let bad = |key| TlsError::BadSecret { name: "(certificate bundle)".into(), key };
        let certs =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(|_| bad(CERT_KEY))?;
        if certs.is_empty() {
            return Err(bad(CERT_KEY));
        }
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|_| bad(KEY_KEY))?;
        let mut config =
            rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).map_err(TlsError::Config)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The names the serving certificate is made for: the URL's host, or the Service's DNS names.
pub fn serving_names(url_host: Option<&str>, service: Option<(&str, &str)>) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(host) = url_host {
        // An IPv6 host comes bracketed out of a URL.
        names.push(host.trim_start_matches('[').trim_end_matches(']').to_owned());
    }
    if let Some((name, namespace)) = service {
        names.extend([
            format!("{name}.{namespace}.svc"),
            format!("{name}.{namespace}.svc.cluster.local"),
            format!("{name}.{namespace}"),
            name.to_owned(),
        ]);
    }
    names
}

/// The bundle in Secret `namespace/name`, made now if there is none or the one there does not
/// cover `names`. Replicas racing here all end with the one Secret written first: a create or
/// replace that loses the race reads the winner's back.
///
/// # Errors
/// [`TlsError`] when generating, creating, replacing or reading back fails or times out.
pub async fn ensure_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
    names: &[String],
    timeout: Duration,
) -> Result<CertBundle, TlsError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let at = SecretAt { api: &api, namespace, name, timeout };
    let existing = at.read().await?;
    let resource_version = match &existing {
        Some(secret) => match CertBundle::from_secret(secret) {
            Ok(bundle) if bundle.covers(names) => return Ok(bundle),
            Ok(_) => {
                tracing::info!(
                    namespace,
                    secret = name,
                    ?names,
                    "the stored certificate does not cover these names; replacing it"
                );
                secret.metadata.resource_version.clone()
            }
            Err(e) => {
                tracing::warn!(error = %e, "replacing the unreadable certificate Secret");
                secret.metadata.resource_version.clone()
            }
        },
        None => None,
    };
    // Key generation is CPU work of a few milliseconds, fine on the runtime at startup.
    let bundle = CertBundle::generate(names)?;
    let mut secret = bundle.to_secret(namespace, name);
    let written = if existing.is_some() {
        // The resourceVersion makes a concurrent replace by another replica a conflict.
        secret.metadata.resource_version = resource_version;
        tokio::time::timeout(timeout, api.replace(name, &PostParams::default(), &secret)).await
    } else {
        tokio::time::timeout(timeout, api.create(&PostParams::default(), &secret)).await
    };
    match written.map_err(|_| at.timed_out("writing"))? {
        Ok(_) => Ok(bundle),
        Err(kube::Error::Api(s)) if s.code == 409 => match at.read().await? {
            Some(secret) => CertBundle::from_secret(&secret),
            None => Err(TlsError::BadSecret { name: name.to_owned(), key: CA_KEY }),
        },
        Err(source) => Err(TlsError::Create { namespace: namespace.to_owned(), name: name.to_owned(), source }),
    }
}

/// The Secret's coordinates for reads with a timeout.
struct SecretAt<'a> {
    api: &'a Api<Secret>,
    namespace: &'a str,
    name: &'a str,
    timeout: Duration,
}

impl SecretAt<'_> {
    async fn read(&self) -> Result<Option<Secret>, TlsError> {
        tokio::time::timeout(self.timeout, self.api.get_opt(self.name))
            .await
            .map_err(|_| self.timed_out("reading"))?
            .map_err(|source| TlsError::Read { namespace: self.namespace.to_owned(), name: self.name.to_owned(), source })
    }

    fn timed_out(&self, what: &'static str) -> TlsError {
        TlsError::Timeout { what, namespace: self.namespace.to_owned(), name: self.name.to_owned(), timeout: self.timeout }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn generated_bundle_round_trips_through_a_secret_and_serves() {
        crate::install_crypto_provider();
        let names = serving_names(Some("127.0.0.1"), Some(("vgpu-dra-webhook", "vgpu")));
        assert_eq!(names[1], "vgpu-dra-webhook.vgpu.svc");
        let bundle = CertBundle::generate(&names).unwrap();
        assert!(bundle.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(bundle.ca_pem, bundle.cert_pem);
        let secret = bundle.to_secret("vgpu", "tls");
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(CertBundle::from_secret(&secret).unwrap(), bundle);
        bundle.server_config().unwrap();
        assert!(!format!("{bundle:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn the_serving_certificate_covers_its_names_and_no_other() {
        let names = serving_names(Some("[::1]"), Some(("wh", "ns")));
        let bundle = CertBundle::generate(&names).unwrap();
        assert!(bundle.covers(&names), "{names:?}");
        assert!(!bundle.covers(&["other.ns.svc".into()]));
        let other = CertBundle::generate(&names).unwrap();
        let mixed = CertBundle { ca_pem: other.ca_pem, ..bundle };
        assert!(!mixed.covers(&names), "a certificate of another CA");
    }

    #[test]
    fn a_secret_without_the_key_is_refused_by_name() {
        let mut secret = CertBundle::generate(&["x".into()]).unwrap().to_secret("n", "s");
        secret.data.as_mut().unwrap().remove(KEY_KEY);
        let err = CertBundle::from_secret(&secret).unwrap_err();
        assert_eq!(err.to_string(), "Secret s: tls.key is missing or not valid PEM");
    }

    type Calls = Arc<std::sync::Mutex<Vec<String>>>;

    /// An API server answering the `n`th call with `answer(method, n)`: a status code and
    /// whether the body is `stored` (else a Status); `hang` never answers.
    fn fake_api(stored: &CertBundle, hang: bool, answer: fn(&str, usize) -> (u16, bool)) -> (kube::Client, Calls) {
        let calls = Calls::default();
        let mut secret = stored.to_secret("ns", "tls");
        secret.metadata.resource_version = Some("7".into());
        let secret = serde_json::to_vec(&secret).unwrap();
        let seen = Arc::clone(&calls);
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (calls, secret) = (Arc::clone(&seen), secret.clone());
            async move {
                let (method, n) = {
                    let mut calls = calls.lock().unwrap();
                    calls.push(format!("{} {}", request.method(), request.uri().path()));
                    (request.method().to_string(), calls.len() - 1)
                };
                if hang {
                    std::future::pending::<()>().await;
                }
                let (code, stored) = answer(&method, n);
                let body = if stored {
                    secret
                } else {
                    let reason = if code == 404 { "NotFound" } else { "AlreadyExists" };
                    serde_json::to_vec(&serde_json::json!({"kind": "Status", "code": code, "reason": reason})).unwrap()
                };
                let response = http::Response::builder().status(code).body(kube::client::Body::from(body)).unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        (kube::Client::new(service, "default"), calls)
    }

    const SECRET: &str = "/api/v1/namespaces/ns/secrets/tls";

    #[tokio::test]
    async fn a_replica_that_loses_the_race_serves_the_winners_certificate() {
        let names = vec!["wh.ns.svc".to_owned()];
        let theirs = CertBundle::generate(&names).unwrap();
        // Not there, then there when we create it: another replica won.
        let (client, calls) = fake_api(&theirs, false, |method, n| match (method, n) {
            ("GET", 0) => (404, false),
            ("POST", _) => (409, false),
            _ => (200, true),
        });
        let ours = ensure_secret(client, "ns", "tls", &names, Duration::from_secs(5)).await.unwrap();
        assert_eq!(ours, theirs);
        assert_eq!(
            *calls.lock().unwrap(),
            [format!("GET {SECRET}"), "POST /api/v1/namespaces/ns/secrets".into(), format!("GET {SECRET}")]
        );
    }

    #[tokio::test]
    async fn a_stored_certificate_for_other_names_is_replaced() {
        let old = CertBundle::generate(&["old.ns.svc".into()]).unwrap();
        let (client, calls) = fake_api(&old, false, |_, _| (200, true));
        let names = vec!["wh.ns.svc".to_owned()];
        let new = ensure_secret(client, "ns", "tls", &names, Duration::from_secs(5)).await.unwrap();
        assert!(new.covers(&names) && new != old);
        assert_eq!(*calls.lock().unwrap(), [format!("GET {SECRET}"), format!("PUT {SECRET}")]);
        // One that covers them is kept.
        let (client, calls) = fake_api(&old, false, |_, _| (200, true));
        let kept = ensure_secret(client, "ns", "tls", &["old.ns.svc".into()], Duration::from_secs(5)).await.unwrap();
        assert_eq!(kept, old);
        assert_eq!(calls.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_api_server_is_a_timeout_not_a_hang() {
        let theirs = CertBundle::generate(&["x".into()]).unwrap();
        let (client, _) = fake_api(&theirs, true, |_, _| (200, true));
        let err = ensure_secret(client, "ns", "tls", &["x".into()], Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(err.to_string(), "reading Secret ns/tls: no answer from the API server within 5s");
    }
}
