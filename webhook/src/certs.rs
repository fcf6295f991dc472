//! Keeping the serving certificate current: the certificate Secret ([`CertSecret`]: made and
//! renewed here, or waited for and read when cert-manager writes it), the certificate the HTTPS
//! server presents ([`ServingCert`], swapped in place without a restart), and the periodic check
//! that ties them together ([`Keeper`]).
//!
//! A renewal goes: write the Secret (its `ca.crt` holding the new CA and the earlier ones still
//! valid), register the new `ca.crt` as the webhook's `caBundle`, then serve the new certificate.
//! Every replica re-reads the Secret, so one that did not renew follows within one check; the
//! registration keeps the CAs already registered that are still valid (`registration`), so a
//! replica still serving an older certificate stays trusted meanwhile.
//!
//! A self-signed Secret that is gone, unreadable, or whose key is corrupt or does not match its
//! certificate is replaced (with a warning naming the problem) rather than failing every
//! replica's start. An external Secret (cert-manager's) is never written: while it is unusable the
//! webhook waits, not ready, and says why.

use std::future::Future;
use std::sync::{Arc, RwLock};

use std::time::{Duration, SystemTime};
use vgpu_dra_runtime::sync::{read, write};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use crate::client_auth::ClientAuth;
use crate::server::Readiness;
use crate::tls::{CA_KEY, CertBundle, TlsError, secret_text};

/// The longest pause between reads while waiting for an external Secret.
const WAIT_MAX: Duration = Duration::from_secs(10);

/// Where the certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Made here: a CA and a serving certificate for `names`, valid for `validity`, renewed
    /// when a third is left.
    SelfSigned {
        /// The names the serving certificate covers.
        names: Vec<String>,
        /// How long a new CA and certificate are valid.
        validity: Duration,
    },
    /// Written by someone else (cert-manager); never written here.
    External {
        /// The names the certificate should cover (a mismatch is only logged: the issuer's
        /// configuration is its owner's to fix).
        names: Vec<String>,
    },
}

/// The certificate Secret and how it is kept: every API call on it is bounded by `timeout`.
#[derive(Clone)]
pub struct CertSecret {
    api: Api<Secret>,
    namespace: String,
    name: String,
    mode: Mode,
    timeout: Duration,
}

impl std::fmt::Debug for CertSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl CertSecret {
    /// Secret `namespace/name`, kept as `mode` says.
    pub fn new(client: kube::Client, namespace: &str, name: &str, mode: Mode, timeout: Duration) -> Self {
        let api = Api::namespaced(client, namespace);
        Self { api, namespace: namespace.to_owned(), name: name.to_owned(), mode, timeout }
    }

    /// The bundle to start with: self-signed, the stored one (made, renewed or replaced first
    /// when needed); external, the Secret once it exists and is usable, `readiness` saying
    /// meanwhile what is wrong with it. `None` when `cancel` fires first.
    ///
    /// # Errors
    /// [`TlsError`] when the API fails or times out (self-signed).
    pub async fn initial(&self, cancel: &CancellationToken, readiness: &Readiness) -> Result<Option<CertBundle>, TlsError> {
        match &self.mode {
            Mode::SelfSigned { names, validity } => self.ensure(names, *validity).await.map(Some),
            Mode::External { .. } => {
                let bundle = self.wait(cancel, readiness).await;
                if let Some(bundle) = &bundle {
                    self.warn_unless_covered(bundle);
                }
                Ok(bundle)
            }
        }
    }

    /// The bundle the Secret holds now; self-signed, renewed first when due.
    ///
    /// # Errors
    /// [`TlsError`] when the API fails or times out, or the Secret is missing or incomplete.
    pub async fn current(&self) -> Result<CertBundle, TlsError> {
        match &self.mode {
            Mode::SelfSigned { names, validity } => self.ensure(names, *validity).await,
            Mode::External { .. } => match self.read().await? {
                Some(secret) => CertBundle::from_secret(&secret),
                None => Err(TlsError::Missing { namespace: self.namespace.clone(), name: self.name.clone() }),
            },
        }
    }

    /// The stored bundle, or a new one when there is none or it must be renewed. Replicas racing
    /// here all end with the one Secret written first: a create or replace that loses the race
    /// reads the winner's back.
    async fn ensure(&self, names: &[String], validity: Duration) -> Result<CertBundle, TlsError> {
        let now = SystemTime::now();
        let existing = self.read().await?;
        let earlier_cas = match &existing {
            Some(secret) => match CertBundle::from_secret(secret) {
                Ok(bundle) => match (bundle.certified_key(), bundle.renewal_reason(names, validity, now)) {
                    (Ok(_), None) => return Ok(bundle),
                    // Every replica would fail to serve it: replaced, not a crash loop.
                    (Err(e), _) => {
                        tracing::warn!(secret = %self, error = crate::error_chain(&e),
                            "replacing the certificate Secret: its key is unreadable or does not match its certificate");
                        bundle.ca_pem
                    }
                    (Ok(_), Some(reason)) => {
                        let not_after = bundle.validity().map(|v| v.not_after);
                        tracing::info!(secret = %self, ?names, ?not_after, reason, "renewing the webhook certificate");
                        bundle.ca_pem
                    }
                },
                Err(e) => {
                    tracing::warn!(error = crate::error_chain(&e), "replacing the unreadable certificate Secret");
                    secret_text(secret, CA_KEY).unwrap_or_default()
                }
            },
            None => String::new(),
        };
        // Key generation is CPU work of a few milliseconds, fine on the runtime.
        let bundle = CertBundle::generate_at(names, validity, now)?.with_earlier_cas(&earlier_cas, now);
        let mut secret = bundle.to_secret(&self.namespace, &self.name);
        let written = match existing {
            Some(old) => {
                // The resourceVersion makes a concurrent replace by another replica a conflict.
                secret.metadata.resource_version = old.metadata.resource_version;
                tokio::time::timeout(self.timeout, self.api.replace(&self.name, &PostParams::default(), &secret)).await
            }
            None => tokio::time::timeout(self.timeout, self.api.create(&PostParams::default(), &secret)).await,
        };
        match written.map_err(|_| self.timed_out("writing"))? {
            Ok(_) => Ok(bundle),
            Err(kube::Error::Api(s)) if s.code == 409 => match self.read().await? {
                Some(secret) => CertBundle::from_secret(&secret),
                None => Err(TlsError::Missing { namespace: self.namespace.clone(), name: self.name.clone() }),
            },
            Err(source) => Err(TlsError::Create { namespace: self.namespace.clone(), name: self.name.clone(), source }),
        }
    }

    /// The external Secret once it exists and holds a certificate and a key that serve, read
    /// again after a pause growing to [`WAIT_MAX`]; `None` when `cancel` fires first. Each new
    /// reason to wait is logged once and is `readiness`'s reason meanwhile.
    async fn wait(&self, cancel: &CancellationToken, readiness: &Readiness) -> Option<CertBundle> {
        let mut pause = Duration::from_secs(1);
        let mut told = None;
        loop {
            let why = match self.read().await {
                Ok(Some(secret)) => match CertBundle::from_secret(&secret).and_then(|b| b.certified_key().map(|_| b)) {
                    Ok(bundle) => return Some(bundle),
                    // Its issuer's to fix: never rewritten here.
                    Err(e) => format!(
                        "the certificate Secret {self} is not usable ({}); waiting for its issuer to fix it",
                        crate::error_chain(&e)
                    ),
                },
                Ok(None) => format!("waiting for the certificate Secret {self} (--certificate-source=secret)"),
                // The API server may be starting too: keep waiting, and say why.
                Err(e) => format!("waiting for the certificate Secret: {}", crate::error_chain(&e)),
            };
            if told.as_ref() != Some(&why) {
                if why.starts_with("the certificate Secret") {
                    tracing::warn!(secret = %self, "{why}");
                } else {
                    tracing::info!(secret = %self, "{why}");
                }
                readiness.set_not_ready(why.clone());
                told = Some(why);
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(WAIT_MAX);
        }
    }

    /// Logs an external bundle that the API server will refuse; it is served all the same, as
    /// fixing it is up to its issuer. Called once per bundle, not at every check.
    fn warn_unless_covered(&self, bundle: &CertBundle) {
        if let Mode::External { names } = &self.mode
            && !bundle.covers(names)
        {
            tracing::warn!(secret = %self, ?names, "the certificate in the Secret does not cover these names, does not chain to its ca.crt, or is not valid now; the API server will refuse it");
        }
    }

    async fn read(&self) -> Result<Option<Secret>, TlsError> {
        tokio::time::timeout(self.timeout, self.api.get_opt(&self.name))
            .await
            .map_err(|_| self.timed_out("reading"))?
            .map_err(|source| TlsError::Read { namespace: self.namespace.clone(), name: self.name.clone(), source })
    }

    fn timed_out(&self, what: &'static str) -> TlsError {
        TlsError::Timeout { what, namespace: self.namespace.clone(), name: self.name.clone(), timeout: self.timeout }
    }
}

impl std::fmt::Display for CertSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The certificate the HTTPS server presents. Each handshake asks for the current one, so a
/// swap takes effect at the next connection; connections already open keep theirs.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    /// Serving `key` until swapped.
    pub fn new(key: Arc<CertifiedKey>) -> Arc<Self> {
        Arc::new(Self { current: RwLock::new(key) })
    }

    /// The certificate and key served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        // A panic elsewhere while holding the lock cannot leave a half-written Arc behind.
        Arc::clone(&read(&self.current))
    }

    /// Serves `key` from the next handshake on.
    pub fn swap(&self, key: Arc<CertifiedKey>) {
        *write(&self.current) = key;
    }

    /// A rustls server configuration (HTTP/1.1, the process-wide crypto provider) presenting
    /// whatever this serves at the time of each handshake, and, with `client_auth`, refusing a
    /// client without a certificate it accepts.
    pub fn server_config(self: &Arc<Self>, client_auth: Option<&ClientAuth>) -> Arc<rustls::ServerConfig> {
        let resolver: Arc<dyn ResolvesServerCert> = Arc::clone(self) as _;
        let builder = rustls::ServerConfig::builder();
        let builder = match client_auth {
            Some(auth) => builder.with_client_cert_verifier(auth.verifier()),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Why a certificate check changed nothing; `E` is the registration's error.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError<E: std::error::Error + 'static> {
    /// The Secret could not be read, renewed or used.
    #[error(transparent)]
    Secret(#[from] TlsError),
    /// The API server did not take the new `caBundle`; the old certificate stays served, since
    /// the new one would not be trusted.
    #[error("registering the webhook with the new CA bundle")]
    Register(#[source] E),
}

/// The periodic certificate check of one replica: it knows what it serves and how to register
/// a CA bundle (`register` gets the new `ca.crt`; run.rs applies the registration with it).
pub struct Keeper<R> {
    secret: CertSecret,
    serving: Arc<ServingCert>,
    served: CertBundle,
    register: R,
}

impl<R> std::fmt::Debug for Keeper<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").field("secret", &self.secret).field("served", &self.served).finish_non_exhaustive()
    }
}

impl<R, F, E> Keeper<R>
where
    R: FnMut(String) -> F,
    F: Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    /// A check of `secret` for a replica serving `served` through `serving`.
    pub fn new(secret: CertSecret, serving: Arc<ServingCert>, served: CertBundle, register: R) -> Self {
        Self { secret, serving, served, register }
    }

    /// Reads (self-signed: renews when due) the Secret; when it holds another bundle than the
    /// one served, registers its `ca.crt` and then serves it. Whether anything changed.
    ///
    /// # Errors
    /// [`ReloadError`] when the Secret cannot be read or used, or the registration fails; the
    /// served certificate is unchanged then.
    pub async fn check(&mut self) -> Result<bool, ReloadError<E>> {
        let bundle = self.secret.current().await?;
        if bundle == self.served {
            return Ok(false);
        }
        // A key that does not load is refused before the API server is told to trust its CA.
        let key = bundle.certified_key()?;
        self.secret.warn_unless_covered(&bundle);
        (self.register)(bundle.ca_pem.clone()).await.map_err(ReloadError::Register)?;
        self.serving.swap(key);
        let not_after = bundle.validity().map(|v| v.not_after);
        tracing::info!(secret = %self.secret, ?not_after, cas = bundle.ca_certificates().len(), "serving the certificate now in the Secret");
        self.served = bundle;
        Ok(true)
    }

    /// [`Keeper::check`] every `every` until `cancel`; a failed check is logged and tried again
    /// at the next one.
    pub async fn run(mut self, every: Duration, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let checked = tokio::select! {
                () = cancel.cancelled() => return,
                checked = self.check() => checked,
            };
            if let Err(e) = checked {
                tracing::warn!(error = crate::error_chain(&e), retry_in = ?every, "certificate check failed; serving the current certificate");
            }
        }
    }
}

#[cfg(test)]
#[path = "certs_tests.rs"]
mod tests;
