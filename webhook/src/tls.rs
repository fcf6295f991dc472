//! The webhook's certificates: a CA and a serving certificate made here (finite validity, renewed
//! when a third is left), or read from a Secret another issuer wrote; what a Secret holds and
//! whether it must be replaced. Pure logic: [`crate::certs`] reads and writes the Secret, serves
//! the certificate and reloads it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;

/// Secret key of the CA certificates (PEM; the newest first).
pub const CA_KEY: &str = "ca.crt";
/// Secret key of the serving certificate (PEM).
pub const CERT_KEY: &str = "tls.crt";
/// Secret key of the serving certificate's private key (PEM).
pub const KEY_KEY: &str = "tls.key";

/// How far back certificates are dated, so an API server whose clock is behind ours accepts them.
const CLOCK_SKEW: Duration = Duration::from_secs(3600);
/// At most this many earlier CAs are kept in `ca.crt`: renewals come at two thirds of the
/// validity, so normally one earlier CA is still valid; the bound only stops a renewal loop
/// (replicas disagreeing on the names) from growing the Secret.
const MAX_EARLIER_CAS: usize = 4;

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
    /// Reading the Secret failed.
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
    /// The Secret does not exist (an external one was deleted, or the one written is gone).
    #[error("Secret {namespace}/{name} does not exist")]
    Missing {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The Secret lacks a key or holds no valid PEM under it.
    #[error("Secret {name}: {key} is missing or not valid PEM")]
    BadSecret {
        /// `namespace/name`.
        name: String,
        /// The key.
        key: &'static str,
    },
    /// rustls refused the private key, or it does not match the serving certificate.
    #[error("loading the serving certificate's key")]
    Key(#[source] rustls::Error),
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Its `notBefore`.
    pub not_before: SystemTime,
    /// Its `notAfter`.
    pub not_after: SystemTime,
}

impl Validity {
    /// The validity written in a DER certificate; `None` when it does not parse.
    pub fn of(der: &[u8]) -> Option<Self> {
        let (SEQUENCE, certificate, _) = tlv(der)? else { return None };
        let (SEQUENCE, tbs, _) = tlv(certificate)? else { return None };
        // tbsCertificate: [0] version (optional), serialNumber, signature, issuer, validity, ...
        let (tag, _, mut rest) = tlv(tbs)?;
        if tag == VERSION {
            rest = tlv(rest)?.2; // the serial number
        }
        rest = tlv(rest)?.2; // signature algorithm
        rest = tlv(rest)?.2; // issuer
        let (SEQUENCE, validity, _) = tlv(rest)? else { return None };
        let (before_tag, before, rest) = tlv(validity)?;
        let (after_tag, after, _) = tlv(rest)?;
        Some(Self { not_before: asn1_time(before_tag, before)?, not_after: asn1_time(after_tag, after)? })
    }

    /// Whether less than a third of the validity is left at `now` (or it is over).
    pub fn renewal_due(&self, now: SystemTime) -> bool {
        let span = self.not_after.duration_since(self.not_before).unwrap_or_default();
        let left = self.not_after.duration_since(now).unwrap_or_default();
        left < span / 3
    }
}

pub(crate) const SEQUENCE: u8 = 0x30;
pub(crate) const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element: its tag, its content and what follows it.
pub(crate) fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // Long form: the low bits count the length bytes that follow.
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        (bytes.iter().fold(0usize, |len, b| (len << 8) | usize::from(*b)), rest)
    };
    (rest.len() >= len).then(|| {
        let (content, rest) = rest.split_at(len);
        (tag, content, rest)
    })
}

/// An X.509 time: UTCTime `YYMMDDHHMMSSZ` (years 1950-2049) or GeneralizedTime `YYYYMMDDHHMMSSZ`.
fn asn1_time(tag: u8, content: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(content).ok()?.strip_suffix('Z')?;
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    let (year, at) = match (tag, text.len()) {
        (UTC_TIME, 12) => (number(0..2).map(|y| if y >= 50 { 1900 + y } else { 2000 + y })?, 2),
        (GENERALIZED_TIME, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let field = |i: usize| number(at + 2 * i..at + 2 * i + 2);
    let (month, day, hour, minute, second) = (field(0)?, field(1)?, field(2)?, field(3)?, field(4)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let seconds = days_since_epoch(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let offset = Duration::from_secs(seconds.unsigned_abs());
    if seconds >= 0 { UNIX_EPOCH.checked_add(offset) } else { UNIX_EPOCH.checked_sub(offset) }
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian calendar.
fn days_since_epoch(year: i64, month: i64, day: i64) -> i64 {
    // Count years from March, so the leap day is the last day of its year, in 400-year cycles
    // of 146097 days; 719468 is the number of days from 0000-03-01 to 1970-01-01.
    let year = if month <= 2 { year - 1 } else { year };
    let cycle = year.div_euclid(400);
    let year_of_cycle = year - cycle * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_cycle = year_of_cycle * 365 + year_of_cycle / 4 - year_of_cycle / 100 + day_of_year;
    cycle * 146_097 + day_of_cycle - 719_468
}

/// At most this many CAs are registered as a `caBundle`: the bundle being registered (at most
/// [`MAX_EARLIER_CAS`] + 1) and registered ones still valid, the newest first.
const MAX_REGISTERED_CAS: usize = 8;

/// The `caBundle` to register for `ours` (a Secret's `ca.crt`) when `registered` is registered
/// now: every CA of `ours`, in its order, then the CAs of `registered` not among them that are
/// still valid at `now`, the newest first, up to `MAX_REGISTERED_CAS` in all. So a write never
/// drops a CA a replica may still be serving a certificate of, whatever Secret that replica read
/// (a renewal, a replaced or deleted Secret, an issuer's new CA); expired and unreadable ones go.
pub fn merge_ca_bundles(ours: &str, registered: &str, now: SystemTime) -> String {
    let mine = pem_certificates(ours);
    let mut seen = mine.clone();
    let mut theirs: Vec<(SystemTime, &str)> = pem_certificates(registered)
        .into_iter()
        .filter(|block| {
            let new = !seen.contains(block);
            seen.push(block);
            new
        })
        .filter_map(|block| {
            let validity = CertificateDer::from_pem_slice(block.as_bytes()).ok().and_then(|der| Validity::of(&der))?;
            (validity.not_after > now).then_some((validity.not_before, block))
        })
        .collect();
    theirs.sort_by_key(|(not_before, _)| std::cmp::Reverse(*not_before));
    let room = MAX_REGISTERED_CAS.saturating_sub(mine.len());
    mine.iter().copied().chain(theirs.into_iter().take(room).map(|(_, block)| block)).map(|block| format!("{block}\n")).collect()
}

/// The PEM blocks of certificates in `text`, each with its BEGIN and END lines.
fn pem_certificates(text: &str) -> Vec<&str> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else { break };
        let end = start + len + END.len();
        blocks.push(&rest[start..end]);
        rest = &rest[end..];
    }
    blocks
}

/// The certificates of a PEM text, in order; `None` when one does not parse or there is none.
fn der_certificates(text: &str) -> Option<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(text.as_bytes()).collect::<Result<Vec<_>, _>>().ok()?;
    (!certs.is_empty()).then_some(certs)
}

/// Dates `params` from `now` less [`CLOCK_SKEW`] to `now` plus `validity`, in whole seconds.
fn set_validity(params: &mut CertificateParams, now: SystemTime, validity: Duration) {
    let since_epoch = |t: SystemTime| Duration::from_secs(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs());
    // rcgen's date type, reached through its own helper so this crate needs no `time` dependency.
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + since_epoch(now.checked_sub(CLOCK_SKEW).unwrap_or(UNIX_EPOCH));
    params.not_after = epoch + since_epoch(now.checked_add(validity).unwrap_or(now));
}

/// CA certificates (PEM, the newest first), a serving certificate signed by one of them
/// (followed by any intermediates) and its private key.
#[derive(Clone, PartialEq, Eq)]
pub struct CertBundle {
    /// The CA certificates: the registration's `caBundle`.
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
    /// A new CA and a serving certificate for `names` (DNS names or IP addresses), signed by it,
    /// both valid for `validity` from now (and an hour before, for clocks behind ours).
    /// The CA's key is dropped: nothing else is ever signed with it.
    ///
    /// # Errors
    /// [`TlsError::Generate`] for a name that is neither a DNS name nor an IP address.
    pub fn generate(names: &[String], validity: Duration) -> Result<Self, TlsError> {
        Self::generate_at(names, validity, SystemTime::now())
    }

    /// [`CertBundle::generate`] as if the time were `now`.
    ///
    /// # Errors
    /// [`TlsError::Generate`] for a name that is neither a DNS name nor an IP address.
    pub fn generate_at(names: &[String], validity: Duration, now: SystemTime) -> Result<Self, TlsError> {
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(TlsError::Generate)?;
        // Each CA gets its own name: a `ca.crt` holds several while replicas switch.
        let made = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        ca.distinguished_name.push(DnType::CommonName, format!("vgpu-dra webhook CA {made}"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        set_validity(&mut ca, now, validity);
        let ca_key = KeyPair::generate().map_err(TlsError::Generate)?;
        let ca_cert = ca.self_signed(&ca_key).map_err(TlsError::Generate)?;
        let issuer = Issuer::new(ca, ca_key);

        let mut leaf = CertificateParams::new(names.to_vec()).map_err(TlsError::Generate)?;
        let common = names.first().map_or("vgpu-dra-webhook", String::as_str);
        leaf.distinguished_name.push(DnType::CommonName, common);
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        set_validity(&mut leaf, now, validity);
        let leaf_key = KeyPair::generate().map_err(TlsError::Generate)?;
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(TlsError::Generate)?;
        Ok(Self { ca_pem: ca_cert.pem(), cert_pem: leaf_cert.pem(), key_pem: leaf_key.serialize_pem() })
    }

    /// This bundle with the CAs of `earlier` (a former `ca.crt`) appended that are still valid at
    /// `now` and not already here, so an API server given either `caBundle` trusts either
    /// serving certificate. Expired and unreadable ones are dropped.
    #[must_use]
    pub fn with_earlier_cas(mut self, earlier: &str, now: SystemTime) -> Self {
        let mut kept = pem_certificates(&self.ca_pem).into_iter().map(str::to_owned).collect::<Vec<_>>();
        let still_valid = |block: &&str| {
            CertificateDer::from_pem_slice(block.as_bytes())
                .ok()
                .and_then(|der| Validity::of(&der))
                .is_some_and(|v| v.not_after > now)
        };
        for block in pem_certificates(earlier).into_iter().filter(still_valid).take(MAX_EARLIER_CAS) {
            if !kept.iter().any(|k| k == block) {
                kept.push(block.to_owned());
            }
        }
        self.ca_pem = kept.iter().map(|block| format!("{block}\n")).collect();
        self
    }

    /// The CA certificates in `ca.crt`, each as a PEM block, the newest first.
    pub fn ca_certificates(&self) -> Vec<&str> {
        pem_certificates(&self.ca_pem)
    }

    /// When the serving certificate is valid; `None` when it does not parse.
    pub fn validity(&self) -> Option<Validity> {
        Validity::of(der_certificates(&self.cert_pem)?.first()?)
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
    /// [`TlsError::BadSecret`] naming the Secret and the first missing or unreadable key.
    pub fn from_secret(secret: &Secret) -> Result<Self, TlsError> {
        let name = match (&secret.metadata.namespace, &secret.metadata.name) {
            (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
            (_, name) => name.clone().unwrap_or_default(),
        };
        let get = |key: &'static str| {
            secret_text(secret, key)
                .filter(|s| s.contains("-----BEGIN "))
                .ok_or_else(|| TlsError::BadSecret { name: name.clone(), key })
        };
        Ok(Self { ca_pem: get(CA_KEY)?, cert_pem: get(CERT_KEY)?, key_pem: get(KEY_KEY)? })
    }

    /// Whether the serving certificate chains to one of the CAs and is valid now for every one
    /// of `names`: a Secret left by an install with other names (or an expired one) is replaced.
    pub fn covers(&self, names: &[String]) -> bool {
        self.covers_at(names, SystemTime::now())
    }

    /// [`CertBundle::covers`] at `now`.
    pub fn covers_at(&self, names: &[String], now: SystemTime) -> bool {
        let (Some(cas), Some(chain)) = (der_certificates(&self.ca_pem), der_certificates(&self.cert_pem)) else {
            return false;
        };
        let mut roots = rustls::RootCertStore::empty();
        if cas.into_iter().any(|ca| roots.add(ca).is_err()) {
            return false;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let Ok(verifier) = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build() else {
            return false;
        };
        let Some((leaf, intermediates)) = chain.split_first() else { return false };
        let now = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap_or_default());
        names.iter().all(|name| {
            ServerName::try_from(name.as_str())
                .is_ok_and(|n| verifier.verify_server_cert(leaf, intermediates, &n, &[], now).is_ok())
        })
    }

    /// Why this self-signed bundle must be replaced at `now`, or `None` to keep it: it does not
    /// cover `names` or chain to its CA, less than a third of its validity is left, or it
    /// outlives `validity` (an older install, or the flag lowered).
    pub fn renewal_reason(&self, names: &[String], validity: Duration, now: SystemTime) -> Option<&'static str> {
        if !self.covers_at(names, now) {
            return Some("it does not cover the serving names, chain to the stored CA, or is not valid now");
        }
        let Some(valid) = self.validity() else { return Some("its validity does not parse") };
        if valid.renewal_due(now) {
            return Some("less than a third of its validity is left");
        }
        // The hour of slack absorbs clocks of replicas that differ a little.
        if valid.not_after > now + validity + CLOCK_SKEW {
            return Some("it is valid for longer than --certificate-validity-days");
        }
        None
    }

    /// The serving certificate (with any intermediates) and its key, as rustls serves them.
    ///
    /// # Errors
    /// [`TlsError::BadSecret`] when the PEM does not parse, [`TlsError::Key`] when rustls
    /// refuses the key or it does not match the certificate.
    pub fn certified_key(&self) -> Result<Arc<CertifiedKey>, TlsError> {
        let bad = |key| TlsError::BadSecret { name: "(certificate bundle)".into(), key };
        let chain = der_certificates(&self.cert_pem).ok_or_else(|| bad(CERT_KEY))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|_| bad(KEY_KEY))?;
        let provider = rustls::crypto::ring::default_provider();
        CertifiedKey::from_der(chain, key, &provider).map(Arc::new).map_err(TlsError::Key)
    }
}

/// The text under `key` of a Secret.
pub(crate) fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret.data.as_ref().and_then(|d| d.get(key)).and_then(|b| String::from_utf8(b.0.clone()).ok())
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

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
