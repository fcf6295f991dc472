//! `vgpu-dra webhook`: configuration without side effects, then bind, certificate, registration,
//! serve until SIGTERM/SIGINT, drain; or, as the registration Job (`--registration=registrar`),
//! register and exit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vgpu_scheduling::compat::{FlavourOptions, VolcanoSettings, flavours};
use vgpu_scheduling::compat::{job_match_condition, pod_match_condition};
use vgpu_scheduling::config::DEFAULT_DRIVER_NAME;
use vgpu_scheduling::{CompatSettings, DeviceConfig, DeviceConfigError};

use crate::admit::Admitter;
use crate::args::{CertificateSource, RegistrationMode};
use crate::certs::{CertSecret, Keeper, Mode, ServingCert};
use crate::claims::ClaimAdmitter;
use crate::client_auth::{ClientAuth, ClientAuthError};
use crate::kube_cluster::KubeCluster;
use crate::metrics::Metrics;
use crate::registration::{self, Endpoint, Registration, RegistrationError};
use crate::server::{Readiness, Refusals};
use crate::tls::{self, TlsError};
use crate::{WebhookArgs, server};

/// Bound on every API call at startup and per admission.
const API_TIMEOUT: Duration = Duration::from_secs(5);
/// How long listed ResourceSlices are reused.
const SLICE_CACHE: Duration = Duration::from_secs(10);
/// The longest pause between tries to register the caBundle while the configuration is missing.
const REGISTER_RETRY_MAX: Duration = Duration::from_secs(10);

/// Why the webhook could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `RUST_LOG` does not parse.
    #[error("not a valid log filter")]
    LogFilter(#[from] vgpu_dra_runtime::logging::LogFilterError),
    /// The device configuration file cannot be read.
    #[error("reading {path}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The device configuration file is invalid.
    #[error(transparent)]
    Config(#[from] DeviceConfigError),
    /// `--url` is not an https URL with a host.
    #[error("--url {0:?} must be an https:// URL with a host")]
    Url(String),
    /// The kubeconfig cannot be read or used.
    #[error("loading the kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// No client configuration could be inferred.
    #[error("inferring the Kubernetes client configuration")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built.
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
    /// The tokio runtime could not start.
    #[error("starting the runtime")]
    Runtime(#[source] std::io::Error),
    /// A listen address could not be bound.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// The certificate could not be made, stored or loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The webhook could not be registered.
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    /// The client CA file is unusable.
    #[error(transparent)]
    ClientAuth(#[from] ClientAuthError),
    /// The metrics server failed.
    #[error("serving metrics")]
    Metrics(#[source] std::io::Error),
}

/// Runs the webhook until SIGTERM or SIGINT; a second signal exits at once.
///
/// # Errors
/// [`RunError`] for bad flags or files, an unreachable API server at startup, or a port in use.
pub fn run(args: &WebhookArgs) -> Result<(), RunError> {
    crate::install_crypto_provider();
    vgpu_dra_runtime::logging::init(false)?;
    let flavours = settings(args)?;
    let endpoint = endpoint(args)?;
    // Files are read before the runtime starts: no blocking I/O on it.
    let kubeconfig = match &args.kubeconfig {
        Some(path) => Some(kube::config::Kubeconfig::read_from(path).map_err(RunError::Kubeconfig)?),
        None => None,
    };
    let client_auth = match &args.client_ca_file {
        Some(path) => Some(ClientAuth::from_file(path, &args.client_names)?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(RunError::Runtime)?;
    if args.registration == RegistrationMode::Registrar {
        return runtime.block_on(register_only(args, &flavours, endpoint, kubeconfig));
    }
    runtime.block_on(serve(args, flavours, endpoint, kubeconfig, client_auth))
}

/// The configuration the flags describe, with `ca_bundle`.
fn registration_of(
    args: &WebhookArgs,
    flavours: &[CompatSettings],
    endpoint: Endpoint,
    ca_bundle: Option<String>,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> Registration {
    Registration {
        name: args.webhook_name.clone(),
        endpoint,
        ca_bundle,
        match_condition: any_of(flavours, pod_match_condition),
        job_match_condition: args.volcano_jobs.then(|| any_of(flavours, job_match_condition)),
        claim_match_condition: args.quotas.then(|| registration::claim_match_condition(&quota_classes(flavours))),
        owner,
        excluded_namespaces: excluded_namespaces(args),
        timeout_seconds: args.timeout_seconds,
    }
}

/// The registration Job: writes the configuration, all of it but the caBundle, and exits.
async fn register_only(
    args: &WebhookArgs,
    flavours: &[CompatSettings],
    endpoint: Endpoint,
    kubeconfig: Option<kube::config::Kubeconfig>,
) -> Result<(), RunError> {
    let client = client(kubeconfig).await?;
    let owner = match &args.owner_cluster_role {
        Some(role) => Some(registration::cluster_role_owner(client.clone(), role, API_TIMEOUT).await?),
        None => None,
    };
    let registration = registration_of(args, flavours, endpoint, None, owner);
    registration.apply(client, API_TIMEOUT).await?;
    tracing::info!(webhook = registration.webhook_name(), "registered; the webhook keeps its caBundle");
    Ok(())
}

/// The name sets the webhook converts, HAMi's first and then Volcano's
/// ([`vgpu_scheduling::compat::flavours`]), with the flags and the device configuration file.
///
/// # Errors
/// [`RunError::ReadConfig`] or [`RunError::Config`] for the file.
pub fn settings(args: &WebhookArgs) -> Result<Vec<CompatSettings>, RunError> {
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| RunError::ReadConfig { path: path.clone(), source })?;
            Some(DeviceConfig::parse(&path.display().to_string(), &text)?)
        }
        None => None,
    };
    let options = FlavourOptions {
        driver: args.driver_name.clone(),
        device_class: args.device_class.clone(),
        volcano: VolcanoSettings {
            scheduler_names: args.volcano_scheduler_names.clone(),
            cpu_request: Some(args.volcano_cpu_request).filter(|q| !q.is_zero()),
        },
        strict_fit: args.strict_fit,
        mig_device_class: args.mig_device_class.clone(),
        unannotated_mig: args.unannotated_mig,
    };
    Ok(flavours(config.as_ref(), &options))
}

/// The routes answering the API server: pods and Volcano Jobs converted with `flavours`, and,
/// with `--quotas`, claims checked against their namespace's GPU quotas.
fn admission(args: &WebhookArgs, flavours: Vec<CompatSettings>, client: kube::Client, metrics: &Metrics) -> axum::Router {
    let driver = flavours.first().map(|f| f.driver.clone()).unwrap_or_else(|| DEFAULT_DRIVER_NAME.to_owned());
    let cluster = KubeCluster::new(client, &driver, API_TIMEOUT, SLICE_CACHE)
        .with_card_models(&args.card_models)
        .with_ledger_namespace(&args.namespace);
    let deadline = answer_within(args.timeout_seconds);
    let claims = args.quotas.then(|| {
        let keys = vgpu_scheduling::quota::quota_keys(&flavours);
        Arc::new(ClaimAdmitter::new(cluster.clone(), keys, quota_classes(&flavours), metrics.clone(), deadline))
    });
    let mut flavours = flavours.into_iter();
    let mut admitter = Admitter::new(flavours.next().unwrap_or_default(), cluster, metrics.clone());
    for more in flavours {
        admitter = admitter.with_flavour(more);
    }
    server::admission_router(Arc::new(admitter.with_deadline(deadline)), claims)
}

/// The DeviceClasses whose claims are charged to namespace quotas: those the name sets convert
/// to, the MIG class included (a MIG instance is charged as a whole card until the quota charge
/// knows profiles, so MIG is never a way around a quota).
fn quota_classes(flavours: &[CompatSettings]) -> Vec<String> {
    vgpu_scheduling::compat::device_classes(flavours)
}

/// One `matchConditions` expression true for an object any of `flavours` converts.
fn any_of(flavours: &[CompatSettings], condition: fn(&CompatSettings) -> String) -> String {
    match flavours {
        [one] => condition(one),
        many => many.iter().map(|f| format!("({})", condition(f))).collect::<Vec<_>>().join(" || "),
    }
}

/// Where the certificate comes from, for the serving `names`.
fn cert_mode(args: &WebhookArgs, names: Vec<String>) -> Mode {
    match args.certificate_source {
        CertificateSource::SelfSigned => {
            Mode::SelfSigned { names, validity: Duration::from_secs(u64::from(args.certificate_validity_days) * 86_400) }
        }
        CertificateSource::Secret => Mode::External { names },
    }
}

fn endpoint(args: &WebhookArgs) -> Result<Endpoint, RunError> {
    match (&args.url, &args.service_name) {
        (Some(url), _) => {
            let uri: http::Uri = url.parse().map_err(|_| RunError::Url(url.clone()))?;
            if uri.scheme_str() != Some("https") || uri.host().is_none() {
                return Err(RunError::Url(url.clone()));
            }
            Ok(Endpoint::Url(url.clone()))
        }
        (None, Some(name)) => Ok(Endpoint::Service { name: name.clone(), namespace: args.namespace.clone() }),
        // clap requires one of them.
        (None, None) => Err(RunError::Url(String::new())),
    }
}

async fn client(kubeconfig: Option<kube::config::Kubeconfig>) -> Result<kube::Client, RunError> {
    let config = match kubeconfig {
        Some(k) => kube::Config::from_custom_kubeconfig(k, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(RunError::Kubeconfig)?,
        None => kube::Config::infer().await.map_err(RunError::Infer)?,
    };
    kube::Client::try_from(config).map_err(RunError::Client)
}

async fn serve(
    args: &WebhookArgs,
    flavours: Vec<CompatSettings>,
    endpoint: Endpoint,
    kubeconfig: Option<kube::config::Kubeconfig>,
    client_auth: Option<ClientAuth>,
) -> Result<(), RunError> {
    let client = client(kubeconfig).await?;
    let listener = TcpListener::bind(args.listen).await.map_err(|e| RunError::Bind(args.listen, e))?;
    let metrics_listener = match args.metrics_address {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| RunError::Bind(addr, e))?),
        None => None,
    };
    if client_auth.is_none() {
        tracing::warn!(
            "no --client-ca-file: any client that reaches the admission port may send reviews, not only the API server"
        );
    }

    // Made before the certificate: waiting for an external Secret stops on a signal, and the
    // readiness probe says meanwhile what it waits for.
    let cancel = CancellationToken::new();
    tokio::spawn(watch_signals(cancel.clone()));
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let readiness = Readiness::not_ready("starting: no serving certificate yet");
    let metrics_server = metrics_listener.map(|l| {
        tracing::info!(address = ?l.local_addr().ok(), "serving metrics");
        let router = server::metrics_router(Arc::new(registry), readiness.clone());
        tokio::spawn(server::serve_plain(l, router, cancel.clone()))
    });

    let names = serving_names(&endpoint);
    let secret = CertSecret::new(client.clone(), &args.namespace, &args.secret_name, cert_mode(args, names), API_TIMEOUT);
    let Some(bundle) = secret.initial(&cancel, &readiness).await? else {
        tracing::info!("stopped while waiting for the certificate Secret");
        return finish(None, None, metrics_server, &cancel).await;
    };
    let serving = ServingCert::new(bundle.certified_key()?);
    let tls_config = serving.server_config(client_auth.as_ref());

    let owner = match (&args.owner_cluster_role, args.registration) {
        (Some(role), RegistrationMode::Full) => Some(registration::cluster_role_owner(client.clone(), role, API_TIMEOUT).await?),
        _ => None,
    };
    let registration = registration_of(args, &flavours, endpoint, Some(bundle.ca_pem.clone()), owner);
    let router = admission(args, flavours, client.clone(), &metrics);
    let https = tokio::spawn(server::serve_tls(listener, tls_config, router, Refusals::new(metrics), cancel.clone()));

    // Registered once the listener accepts, so the API server's first call finds it.
    let mode = args.registration;
    if let Err(e) = register_at_start(&registration, mode, &client, &readiness, &cancel).await {
        cancel.cancel();
        return Err(e.into());
    }
    readiness.set_ready();
    tracing::info!(address = %args.listen, webhook = registration.webhook_name(), "admission webhook serving");
    // A changed Secret is registered (the same configuration with its ca.crt) before it is served.
    let register = move |ca_bundle: String| {
        let (registration, client) = (Registration { ca_bundle: Some(ca_bundle), ..registration.clone() }, client.clone());
        async move {
            match mode {
                RegistrationMode::CaBundle => registration.apply_ca_bundle(client, API_TIMEOUT).await,
                _ => registration.apply(client, API_TIMEOUT).await,
            }
        }
    };
    let keeper = Keeper::new(secret, serving, bundle, register);
    let every = Duration::from_secs(args.certificate_check_seconds);
    let certificate_checks = tokio::spawn(keeper.run(every, cancel.clone()));
    finish(Some(https), Some(certificate_checks), metrics_server, &cancel).await
}

/// The names the serving certificate must carry for the API server to reach `endpoint`.
fn serving_names(endpoint: &Endpoint) -> Vec<String> {
    match endpoint {
        Endpoint::Url(url) => tls::serving_names(url.parse::<http::Uri>().ok().as_ref().and_then(http::Uri::host), None),
        Endpoint::Service { name, namespace } => tls::serving_names(None, Some((name, namespace))),
    }
}

/// How long a review may take: a second before the API server gives up (its `timeoutSeconds`),
/// so the client reads why.
fn answer_within(timeout_seconds: i32) -> Duration {
    Duration::from_secs(u64::from(timeout_seconds.unsigned_abs()))
        .saturating_sub(Duration::from_secs(1))
        .max(Duration::from_millis(500))
}

/// Registers as `mode` says: the whole configuration at once (a failure stops the start), or
/// only the caBundle, trying until it is written. While the registration Job has not made the
/// configuration yet (at install the Job and the webhook start together) nothing calls the
/// webhook, so it is ready meanwhile (`helm install --wait` waits for it, not for the Job);
/// while the configuration exists but cannot take this CA, it is not.
async fn register_at_start(
    registration: &Registration,
    mode: RegistrationMode,
    client: &kube::Client,
    readiness: &Readiness,
    cancel: &CancellationToken,
) -> Result<(), RegistrationError> {
    if mode != RegistrationMode::CaBundle {
        return registration.apply(client.clone(), API_TIMEOUT).await;
    }
    let mut pause = Duration::from_secs(1);
    let mut told = None;
    loop {
        let (why, ready) = match registration.apply_ca_bundle(client.clone(), API_TIMEOUT).await {
            Ok(()) => return Ok(()),
            Err(e @ RegistrationError::NotRegistered { .. }) => (crate::error_chain(&e), true),
            Err(e) => (crate::error_chain(&e), false),
        };
        if told.as_ref() != Some(&why) {
            if ready {
                tracing::info!(reason = why, "serving; the caBundle is registered once the registration Job has run");
                readiness.set_ready();
            } else {
                tracing::warn!(error = why, "registering the caBundle; trying again");
                readiness.set_not_ready(format!("registering the caBundle: {why}"));
            }
            told = Some(why);
        }
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(REGISTER_RETRY_MAX);
    }
}

/// Waits for the server tasks once the HTTPS server stopped (cancellation or failure).
async fn finish(
    https: Option<tokio::task::JoinHandle<()>>,
    certificate_checks: Option<tokio::task::JoinHandle<()>>,
    metrics_server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    cancel: &CancellationToken,
) -> Result<(), RunError> {
    let https_done = match https {
        Some(task) => task.await,
        None => Ok(()),
    };
    cancel.cancel();
    if let Some(task) = certificate_checks
        && let Err(e) = task.await
    {
        tracing::error!(error = %e, "the certificate check task failed");
    }
    if let Err(e) = https_done {
        tracing::error!(error = %e, "the HTTPS server task failed");
    }
    if let Some(task) = metrics_server {
        match task.await {
            Ok(result) => result.map_err(RunError::Metrics)?,
            Err(e) => tracing::error!(error = %e, "the metrics server task failed"),
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// The configured namespaces plus the webhook's own, each once.
fn excluded_namespaces(args: &WebhookArgs) -> Vec<String> {
    let mut names = args.excluded_namespaces.clone();
    names.push(args.namespace.clone());
    names.sort();
    names.dedup();
    names
}

async fn watch_signals(cancel: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM; stopping");
            return cancel.cancel();
        }
    };
    for count in 0.. {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        if count > 0 {
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        }
        tracing::info!("signal received: draining");
        cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;
    use crate::args::Cli;

    #[test]
    fn hamis_device_config_names_the_resources_and_flags_name_the_class() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device-config.yaml");
        std::fs::write(&path, "nvidia:\n  resourceCountName: example.com/gpu\n  defaultMem: 2048\n").unwrap();
        let cli = Cli::try_parse_from([
            "x",
            "--url=https://127.0.0.1:1/mutate-pods",
            "--namespace=vgpu",
            &format!("--config={}", path.display()),
            "--device-class=shared-gpus",
        ])
        .unwrap();
        let flavours = settings(&cli.args).unwrap();
        let s = &flavours[0];
        assert_eq!((s.count_resource.as_str(), s.default_memory_mib), ("example.com/gpu", 2048));
        assert_eq!((s.device_class.as_str(), s.driver.as_str()), ("shared-gpus", DEFAULT_DRIVER_NAME));
        assert!(pod_match_condition(s).contains("example.com/gpu"));
        assert_eq!(s.volcano, VolcanoSettings::default());
        // HAMi's file names HAMi's set only: Volcano's keeps its names, and the class.
        let v = &flavours[1];
        assert_eq!((v.count_resource.as_str(), v.default_memory_mib), ("volcano.sh/vgpu-number", 0));
        assert_eq!(v.device_class, "shared-gpus");
        // The MIG class follows the class, for both sets, and both are charged to quotas.
        assert!(flavours.iter().all(|f| f.mig_device_class == "mig.shared-gpus"), "{flavours:?}");
        assert_eq!(quota_classes(&flavours), ["shared-gpus", "mig.shared-gpus"]);
    }

    #[test]
    fn the_mig_class_is_a_flag() {
        let base = ["x", "--url=https://127.0.0.1:1/mutate-pods", "--namespace=vgpu"];
        let flavours = settings(&Cli::try_parse_from(base).unwrap().args).unwrap();
        assert!(flavours.iter().all(|f| f.mig_device_class == format!("mig.{DEFAULT_DRIVER_NAME}")));
        let named = settings(&Cli::try_parse_from([&base[..], &["--mig-device-class=mig-gpus"]].concat()).unwrap().args).unwrap();
        assert!(named.iter().all(|f| f.mig_device_class == "mig-gpus"), "{named:?}");
        let classes = quota_classes(&named);
        assert_eq!(classes, [DEFAULT_DRIVER_NAME, "mig-gpus"]);
        assert!(registration::claim_match_condition(&classes).contains(r#""mig-gpus""#));
        // A pod without vgpu-mode gets shares only unless asked, in both name sets.
        assert!(flavours.iter().all(|f| !f.unannotated_mig));
        let either = settings(&Cli::try_parse_from([&base[..], &["--unannotated-mig=true"]].concat()).unwrap().args).unwrap();
        assert!(either.iter().all(|f| f.unannotated_mig), "{either:?}");
    }

    /// Issue 39, item 1: one install converts both sets; each form of file renames its own.
    #[test]
    fn both_name_sets_are_converted_and_each_file_renames_its_own() {
        let base = ["x", "--url=https://127.0.0.1:1/mutate-pods", "--namespace=vgpu"];
        let flavours = settings(&Cli::try_parse_from(base).unwrap().args).unwrap();
        let counts: Vec<&str> = flavours.iter().map(|f| f.count_resource.as_str()).collect();
        assert_eq!(counts, ["nvidia.com/gpu", "volcano.sh/vgpu-number"]);
        let condition = any_of(&flavours, pod_match_condition);
        assert!(condition.contains("nvidia.com/gpumem") && condition.contains("volcano.sh/vgpu-memory"), "{condition}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("volcano-vgpu.yaml");
        std::fs::write(&path, include_str!("../../scheduling/testdata/volcano-device-config.yaml")).unwrap();
        let config = format!("--config={}", path.display());
        let flavours = settings(&Cli::try_parse_from([&base[..], &[config.as_str()]].concat()).unwrap().args).unwrap();
        let counts: Vec<&str> = flavours.iter().map(|f| f.count_resource.as_str()).collect();
        assert_eq!(counts, ["nvidia.com/gpu", "volcano.sh/vgpu-number"], "volcano-vgpu's file leaves HAMi's names alone");
    }

    #[test]
    fn volcano_flags_set_the_volcano_settings() {
        let base = ["x", "--url=https://127.0.0.1:1/mutate-pods", "--namespace=vgpu"];
        let parse = |extra: &[&str]| {
            let flavours = settings(&Cli::try_parse_from([&base[..], extra].concat()).unwrap().args).unwrap();
            assert!(flavours.iter().all(|f| f.volcano == flavours[0].volcano), "every set gets the flags");
            flavours[0].volcano.clone()
        };
        let set = parse(&["--volcano-scheduler-names=vc-a,vc-b", "--volcano-cpu-request=5m"]);
        assert_eq!(set.scheduler_names, ["vc-a", "vc-b"]);
        assert_eq!(set.cpu_request.map(|q| q.to_string()).as_deref(), Some("5m"));
        // 0 turns the request off.
        assert_eq!(parse(&["--volcano-cpu-request=0"]).cpu_request, None);
    }

    #[test]
    fn a_url_must_be_https_with_a_host() {
        for bad in ["http://127.0.0.1:1/mutate-pods", "/mutate-pods"] {
            let cli = Cli::try_parse_from(["x", "--namespace=vgpu", "--url", bad]).unwrap();
            assert!(matches!(endpoint(&cli.args), Err(RunError::Url(_))), "{bad}");
        }
    }
}
