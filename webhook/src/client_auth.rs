//! Who may send reviews: with `--client-ca-file`, only a client whose certificate chains to that
//! CA and, when `--client-name`s are given, whose subject common name or a DNS subject
//! alternative name is one of them. That is the certificate kube-apiserver presents to webhooks
//! through its admission configuration; a pod that reaches the port has none, so its forged
//! reviews are refused in the TLS handshake, before any handler runs (and before any template is
//! created for them). [`refusal`] says why a handshake was refused, for the metric and the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme};

use crate::tls::{SEQUENCE, VERSION, tlv};

/// Why the client authentication could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientAuthError {
    /// The CA file cannot be read.
    #[error("reading the client CA file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no certificate, or one that does not parse.
    #[error("{path}: no PEM certificate, or one that does not parse")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// rustls refused a CA, or could not build the verifier from them.
    #[error("{path}: not usable as client CAs")]
    Verifier {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

/// The client certificate verifier of the admission endpoint.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    verifier: Arc<dyn ClientCertVerifier>,
}

impl ClientAuth {
    /// Clients with a certificate signed by a CA of the PEM file `path` and, unless `names` is
    /// empty, naming one of `names` (common name or DNS SAN, ASCII case ignored). Reads the file:
    /// call it before the runtime starts.
    ///
    /// # Errors
    /// [`ClientAuthError`] when the file cannot be read or holds no usable CA.
    pub fn from_file(path: &Path, names: &[String]) -> Result<Self, ClientAuthError> {
        let pem = std::fs::read(path).map_err(|source| ClientAuthError::Read { path: path.to_owned(), source })?;
        Self::build(&pem, names, path)
    }

    /// [`ClientAuth::from_file`] with the file's text.
    ///
    /// # Errors
    /// [`ClientAuthError`] when the text holds no usable CA.
    pub fn from_pem(pem: &[u8], names: &[String]) -> Result<Self, ClientAuthError> {
        Self::build(pem, names, Path::new("(client CA)"))
    }

    fn build(pem: &[u8], names: &[String], path: &Path) -> Result<Self, ClientAuthError> {
        let path = path.to_owned();
        let cas = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().unwrap_or_default();
        if cas.is_empty() {
            return Err(ClientAuthError::NoCertificate { path });
        }
        let mut roots = rustls::RootCertStore::empty();
        let (_, rejected) = roots.add_parsable_certificates(cas);
        if rejected > 0 || roots.is_empty() {
            return Err(ClientAuthError::NoCertificate { path });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|source| ClientAuthError::Verifier { path, source })?;
        let names = names.iter().map(|n| n.to_ascii_lowercase()).collect();
        Ok(Self { verifier: Arc::new(NamedClients { inner, names }) })
    }

    /// The verifier for a rustls server configuration.
    pub fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(&self.verifier)
    }
}

/// A CA verifier that also wants one of `names` in the certificate.
#[derive(Debug)]
struct NamedClients {
    inner: Arc<dyn ClientCertVerifier>,
    /// Lower-case; empty: any certificate of the CA.
    names: Vec<String>,
}

/// A client certificate of the CA that names none of the allowed clients.
#[derive(Debug, thiserror::Error)]
#[error("the client certificate names {presented:?}, none of the allowed clients (--client-name)")]
pub struct NameNotAllowed {
    /// Its common names and DNS names.
    pub presented: Vec<String>,
}

impl ClientCertVerifier for NamedClients {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        if self.names.is_empty() {
            return Ok(verified);
        }
        // Read only once the signature chain holds: the bytes come from the CA's holder.
        let presented = identities(end_entity).ok_or(rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if presented.iter().any(|p| self.names.iter().any(|n| n.eq_ignore_ascii_case(p))) {
            return Ok(verified);
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(NameNotAllowed { presented })))))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Why a client was refused in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It presented no certificate.
    NoCertificate,
    /// Its certificate does not chain to the client CA, or is expired or unusable for clients.
    UntrustedCertificate,
    /// Its certificate is the CA's but names no allowed client.
    NameNotAllowed,
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoCertificate => "no_certificate",
            Self::UntrustedCertificate => "untrusted_certificate",
            Self::NameNotAllowed => "name_not_allowed",
        }
    }
}

/// The client's fault in a failed server handshake, if it was about its certificate.
pub fn refusal(error: &std::io::Error) -> Option<Refusal> {
    let tls = error.get_ref()?.downcast_ref::<rustls::Error>()?;
    match tls {
        rustls::Error::NoCertificatesPresented => Some(Refusal::NoCertificate),
        rustls::Error::InvalidCertificate(CertificateError::Other(other))
            if other.0.downcast_ref::<NameNotAllowed>().is_some() =>
        {
            Some(Refusal::NameNotAllowed)
        }
        rustls::Error::InvalidCertificate(_) => Some(Refusal::UntrustedCertificate),
        _ => None,
    }
}

/// OID 2.5.4.3, the common name, as DER content.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// OID 2.5.29.17, subject alternative names.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
const OID: u8 = 0x06;
const SET: u8 = 0x31;
const OCTET_STRING: u8 = 0x04;
const EXTENSIONS: u8 = 0xa3;
/// `dNSName [2] IA5String` of a GeneralName.
const DNS_NAME: u8 = 0x82;
/// The string types a common name comes in: UTF8String, PrintableString, IA5String.
const STRINGS: [u8; 3] = [0x0c, 0x13, 0x16];

/// The subject common names and DNS subject alternative names of a DER certificate; `None`
/// when it does not parse that far.
pub fn identities(der: &[u8]) -> Option<Vec<String>> {
    let (SEQUENCE, certificate, _) = tlv(der)? else { return None };
    let (SEQUENCE, tbs, _) = tlv(certificate)? else { return None };
    // tbsCertificate: [0] version, serialNumber, signature, issuer, validity, subject,
    // subjectPublicKeyInfo, [1] [2] unique IDs, [3] extensions.
    let (tag, _, mut rest) = tlv(tbs)?;
    if tag == VERSION {
        rest = tlv(rest)?.2; // the serial number
    }
    for _ in 0..3 {
        rest = tlv(rest)?.2; // signature algorithm, issuer, validity
    }
    let (SEQUENCE, subject, after) = tlv(rest)? else { return None };
    let mut names = common_names(subject)?;
    let mut rest = tlv(after)?.2; // subjectPublicKeyInfo
    while let Some((tag, content, next)) = tlv(rest) {
        if tag == EXTENSIONS {
            names.extend(dns_names(content)?);
        }
        rest = next;
    }
    Some(names)
}

/// The common names of an X.501 Name (the content of its SEQUENCE).
fn common_names(mut name: &[u8]) -> Option<Vec<String>> {
    let mut names = Vec::new();
    while !name.is_empty() {
        let (SET, mut set, next) = tlv(name)? else { return None };
        while !set.is_empty() {
            let (SEQUENCE, attribute, after) = tlv(set)? else { return None };
            let (OID, oid, value) = tlv(attribute)? else { return None };
            let (kind, text, _) = tlv(value)?;
            if oid == COMMON_NAME && STRINGS.contains(&kind) {
                names.push(String::from_utf8(text.to_vec()).ok()?);
            }
            set = after;
        }
        name = next;
    }
    Some(names)
}

/// The DNS names of the subject alternative name extension among `[3] { SEQUENCE OF Extension }`.
fn dns_names(explicit: &[u8]) -> Option<Vec<String>> {
    let (SEQUENCE, mut extensions, _) = tlv(explicit)? else { return None };
    let mut names = Vec::new();
    while !extensions.is_empty() {
        let (SEQUENCE, extension, next) = tlv(extensions)? else { return None };
        let (OID, oid, mut rest) = tlv(extension)? else { return None };
        if oid == SUBJECT_ALT_NAME {
            // critical BOOLEAN DEFAULT FALSE, then the value.
            let (mut tag, mut value, _) = tlv(rest)?;
            if tag != OCTET_STRING {
                rest = tlv(rest)?.2;
                (tag, value, _) = tlv(rest)?;
            }
            if tag != OCTET_STRING {
                return None;
            }
            let (SEQUENCE, mut general, _) = tlv(value)? else { return None };
            while !general.is_empty() {
                let (tag, text, after) = tlv(general)?;
                if tag == DNS_NAME {
                    names.push(String::from_utf8(text.to_vec()).ok()?);
                }
                general = after;
            }
        }
        extensions = next;
    }
    Some(names)
}

#[cfg(test)]
#[path = "client_auth_tests.rs"]
mod tests;
