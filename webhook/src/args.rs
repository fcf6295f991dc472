//! The `vgpu-dra webhook` flags; every one has an environment twin, parsing has no side effects.

use std::net::SocketAddr;
use std::path::PathBuf;

use vgpu_scheduling::Quantity;
use vgpu_scheduling::compat::{CardModel, DEFAULT_CPU_REQUEST, VOLCANO_SCHEDULER};

/// Arguments of `vgpu-dra webhook`.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Address the HTTPS admission endpoint listens on.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Kubeconfig file; in-cluster configuration when absent.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the certificate Secret (the release namespace, excluded from admission, so
    /// there is no default: a wrong one would exclude a namespace of workloads).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Secret holding the webhook's CA and serving certificate.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_SECRET", default_value = "vgpu-dra-webhook-tls")]
    pub secret_name: String,
    /// Where the certificate comes from: `self-signed` (a CA made here, kept and renewed in
    /// `--secret-name`) or `secret` (`--secret-name` is written by cert-manager or another
    /// issuer with `ca.crt`, `tls.crt` and `tls.key`, and never written here).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_CERT_SOURCE", value_enum, default_value_t = CertificateSource::SelfSigned)]
    pub certificate_source: CertificateSource,
    /// Days a self-signed CA and serving certificate are valid (1-3650); they are renewed when
    /// a third is left.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_CERT_VALIDITY_DAYS", default_value_t = 365,
          value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub certificate_validity_days: u32,
    /// Seconds between re-reads of the certificate Secret (at least 1): a changed one is
    /// registered and served without a restart; a self-signed one due for renewal is renewed.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_CERT_CHECK_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub certificate_check_seconds: u64,
    /// Name of the MutatingWebhookConfiguration (and of its webhook, with a `.vgpu-dra.io` suffix
    /// where it has no dot).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_NAME", default_value = "vgpu-dra-webhook")]
    pub webhook_name: String,
    /// Service in `--namespace` the API server calls (port 443, path /mutate-pods).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_SERVICE", conflicts_with = "url", required_unless_present = "url")]
    pub service_name: Option<String>,
    /// URL the API server calls instead of a Service, e.g. `https://127.0.0.1:8443/mutate-pods`.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_URL")]
    pub url: Option<String>,
    /// HAMi device configuration file (resource names and defaults); HAMi's defaults when absent.
    #[arg(long, env = "VGPU_DRA_CONFIG")]
    pub config: Option<PathBuf>,
    /// DeviceClass of the converted requests [default: the driver name].
    #[arg(long, env = "VGPU_DRA_DEVICE_CLASS")]
    pub device_class: Option<String>,
    /// DeviceClass of the converted MIG requests (`nvidia.com/vgpu-mode: mig`,
    /// `nvidia.com/mig-<profile>`): the driver's dynamic-MIG devices [default: mig.<device class>].
    #[arg(long, env = "VGPU_DRA_MIG_DEVICE_CLASS")]
    pub mig_device_class: Option<String>,
    /// DRA driver name whose ResourceSlices and attributes the claims use [default: the config
    /// file's driverName, else hami-core-gpu.project-hami.io].
    #[arg(long, env = "VGPU_DRA_DRIVER_NAME")]
    pub driver_name: Option<String>,
    /// `timeoutSeconds` of the webhook registration (1-30).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_TIMEOUT", default_value_t = 10, value_parser = clap::value_parser!(i32).range(1..=30))]
    pub timeout_seconds: i32,
    /// Namespaces whose pods and Jobs are never sent to the webhook (comma-separated); the
    /// webhook's own namespace is always added, so it can restart whatever happens.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_EXCLUDED_NAMESPACES", value_delimiter = ',', default_value = "kube-system", value_parser = parse_namespace)]
    pub excluded_namespaces: Vec<String>,
    /// ClusterRole that owns the webhook configuration, so deleting it (helm uninstall) deletes
    /// the configuration; none when absent.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_OWNER_CLUSTER_ROLE")]
    pub owner_cluster_role: Option<String>,
    /// Also convert Volcano Jobs (`batch.volcano.sh/v1alpha1`) at admission.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_VOLCANO_JOBS", default_value_t = true, action = clap::ArgAction::Set)]
    pub volcano_jobs: bool,
    /// Scheduler names Volcano serves (vc-scheduler's `--scheduler-name`), comma-separated. A
    /// converted pod of one of them that requests nothing else gets `--volcano-cpu-request`; a
    /// Volcano Job that names no scheduler is taken to get the first, as Volcano's webhook gives
    /// it.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_VOLCANO_SCHEDULER_NAMES", value_delimiter = ',', default_value = VOLCANO_SCHEDULER,
          value_parser = parse_scheduler_name)]
    pub volcano_scheduler_names: Vec<String>,
    /// CPU request added to the first GPU container of a converted pod of Volcano's scheduler
    /// that requests no CPU, memory or other resource besides its claims: Volcano counts no
    /// claim, and schedules a pod that requests nothing as a best-effort task (no gang, no queue
    /// capability), where under HAMi its GPU resources made it request something. `0` adds none.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_VOLCANO_CPU_REQUEST", default_value = DEFAULT_CPU_REQUEST, value_parser = parse_cpu_request)]
    pub volcano_cpu_request: Quantity,
    /// Deny a pod that no node published at this moment can hold (more cards than the largest
    /// node, more memory than the largest card). Off: it is admitted with a warning and waits,
    /// as under HAMi, until a node that fits joins (an autoscaler adds one only for a pending
    /// pod).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_STRICT_FIT", default_value_t = false, action = clap::ArgAction::Set)]
    pub strict_fit: bool,
    /// A pod without `vgpu-mode` asking one card and a memory amount may get a MIG instance when
    /// no share fits on the node (HAMi's fit between the modes); off: shares only.
    #[arg(long, env = "VGPU_DRA_WEBHOOK_UNANNOTATED_MIG", default_value_t = false, action = clap::ArgAction::Set)]
    pub unannotated_mig: bool,
    /// Card models the cluster may have without a node publishing them now, as
    /// `PRODUCT NAME=MEMORY` (`NVIDIA A100-SXM4-80GB=81920Mi`; `;`-separated or repeated): a
    /// memory percentage is expressed for these too, so its pod waits for such a node.
    #[arg(long = "card-model", env = "VGPU_DRA_WEBHOOK_CARD_MODELS", value_delimiter = ';', value_parser = CardModel::parse)]
    pub card_models: Vec<CardModel>,
    /// Charge every ResourceClaim on the driver's classes to its namespace's ResourceQuotas on
    /// HAMi's keys (`nvidia.com/gpu`, `gpumem`, `gpucores` and Volcano's, bare, `requests.` or
    /// `limits.`), refusing one that would pass a limit (docs/quotas.md).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_QUOTAS", default_value_t = true, action = clap::ArgAction::Set)]
    pub quotas: bool,
    /// Address of the plain-HTTP metrics and health endpoint; none when absent.
    #[arg(long, env = "VGPU_DRA_METRICS_ADDRESS")]
    pub metrics_address: Option<SocketAddr>,
    /// PEM file of the CAs of the client certificate the API server presents (its admission
    /// configuration's kubeconfig): a client without a certificate of theirs is refused before
    /// any review is read. Absent: any client that reaches the port may send reviews (a warning
    /// says so at start).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Names the client certificate must carry, as its subject common name or a DNS subject
    /// alternative name (comma-separated or repeated), so that another certificate of a shared
    /// CA is refused; none: any certificate of `--client-ca-file`.
    #[arg(long = "client-name", env = "VGPU_DRA_WEBHOOK_CLIENT_NAMES", value_delimiter = ',', requires = "client_ca_file",
          value_parser = parse_client_name)]
    pub client_names: Vec<String>,
    /// Who writes the MutatingWebhookConfiguration: `full` (this process, all of it: get, create
    /// and patch of it), `registrar` (this process writes all of it but the caBundle, then exits:
    /// the chart's registration Job) or `ca-bundle` (this process serves and keeps only the
    /// caBundle of the configuration the registrar made: get and patch of it).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_REGISTRATION", value_enum, default_value_t = RegistrationMode::Full)]
    pub registration: RegistrationMode,
}

/// Who writes the MutatingWebhookConfiguration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RegistrationMode {
    /// The webhook writes all of it and keeps its caBundle current.
    Full,
    /// Write all of it but the caBundle, then exit (a separate, short-lived identity).
    Registrar,
    /// Serve, keeping only the caBundle of the configuration the registrar made.
    CaBundle,
}

/// A client name: non-empty, no blanks.
fn parse_client_name(value: &str) -> Result<String, String> {
    let name = value.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("{value:?}: a client name is a common name or DNS name without blanks"));
    }
    Ok(name.to_owned())
}

/// A namespace name as the API would accept it, so a typo is refused at start rather than
/// silently excluding nothing.
fn parse_namespace(value: &str) -> Result<String, String> {
    vgpu_scheduling::Namespace::new(value.trim()).map(|n| n.as_str().to_owned()).map_err(|e| e.to_string())
}

/// A scheduler name: non-empty, as a pod's `schedulerName` must be to be Volcano's.
fn parse_scheduler_name(value: &str) -> Result<String, String> {
    let name = value.trim();
    if name.is_empty() {
        return Err("a scheduler name cannot be empty".into());
    }
    Ok(name.to_owned())
}

/// A CPU quantity of 0 (none) or at least 1m, the smallest step of a CPU request.
fn parse_cpu_request(value: &str) -> Result<Quantity, String> {
    let q = Quantity::parse(value.trim()).map_err(|e| e.to_string())?;
    let milli = Quantity::parse("1m").map_err(|e| e.to_string())?;
    if q.is_negative() || (!q.is_zero() && q < milli) {
        return Err(format!("{value}: the CPU request must be 0 (none) or at least 1m"));
    }
    Ok(q)
}

/// Where the webhook's certificate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CertificateSource {
    /// A CA made by the webhook, kept and renewed in the Secret.
    SelfSigned,
    /// A Secret written by someone else (cert-manager), read and reloaded only.
    Secret,
}

/// A command line of only these flags, for tests of this crate.
#[cfg(test)]
#[derive(Debug, clap::Parser)]
pub(crate) struct Cli {
    /// The flags.
    #[command(flatten)]
    pub(crate) args: WebhookArgs,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;

    #[test]
    fn url_or_service_is_required_and_exclusive() {
        let ok = Cli::try_parse_from(["x", "--namespace=vgpu", "--url", "https://127.0.0.1:1/mutate-pods"]).unwrap();
        assert_eq!(ok.args.listen.port(), 8443);
        assert!(Cli::try_parse_from(["x", "--namespace=vgpu"]).is_err());
        assert!(Cli::try_parse_from(["x", "--namespace=vgpu", "--url", "https://a/", "--service-name", "s"]).is_err());
        assert!(Cli::try_parse_from(["x", "--namespace=vgpu", "--service-name", "s", "--timeout-seconds", "31"]).is_err());
    }

    #[test]
    fn certificate_flags_have_defaults_and_bounds() {
        let base = ["x", "--namespace=vgpu", "--service-name=s"];
        let parse = |extra: &[&str]| Cli::try_parse_from(base.iter().chain(extra)).map(|c| c.args);
        let default = parse(&[]).unwrap();
        assert_eq!(default.certificate_source, CertificateSource::SelfSigned);
        assert_eq!((default.certificate_validity_days, default.certificate_check_seconds), (365, 300));
        let set =
            parse(&["--certificate-source=secret", "--certificate-validity-days=1", "--certificate-check-seconds=1"]).unwrap();
        assert_eq!(set.certificate_source, CertificateSource::Secret);
        assert_eq!((set.certificate_validity_days, set.certificate_check_seconds), (1, 1));
        assert_eq!(parse(&["--certificate-validity-days=3650"]).unwrap().certificate_validity_days, 3650);
        for bad in [
            "--certificate-validity-days=0",
            "--certificate-validity-days=3651",
            "--certificate-check-seconds=0",
            "--certificate-source=cert-manager",
        ] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn excluded_namespaces_are_a_checked_list() {
        let base = ["x", "--namespace=vgpu", "--service-name=s"];
        let default = Cli::try_parse_from(base).unwrap();
        assert_eq!(default.args.excluded_namespaces, ["kube-system"]);
        assert!(default.args.volcano_jobs);
        let set =
            Cli::try_parse_from([&base[..], &["--excluded-namespaces=kube-system,monitoring", "--volcano-jobs=false"]].concat())
                .unwrap();
        assert_eq!(set.args.excluded_namespaces, ["kube-system", "monitoring"]);
        assert!(!set.args.volcano_jobs);
        let err = Cli::try_parse_from([&base[..], &["--excluded-namespaces=kube-system,Bad_NS"]].concat()).unwrap_err();
        assert!(err.to_string().contains("Bad_NS"), "{err}");
    }

    #[test]
    fn client_auth_and_registration_flags() {
        let base = ["x", "--namespace=vgpu", "--service-name=s"];
        let parse = |extra: &[&str]| Cli::try_parse_from([&base[..], extra].concat()).map(|c| c.args);
        let default = parse(&[]).unwrap();
        assert_eq!((default.client_ca_file, default.client_names.len()), (None, 0));
        assert_eq!(default.registration, RegistrationMode::Full);
        let set = parse(&[
            "--client-ca-file=/etc/ca.crt",
            "--client-name=kube-apiserver,apiserver.example.com",
            "--client-name=other",
            "--registration=ca-bundle",
        ])
        .unwrap();
        assert_eq!(set.client_ca_file.as_deref(), Some(std::path::Path::new("/etc/ca.crt")));
        assert_eq!(set.client_names, ["kube-apiserver", "apiserver.example.com", "other"]);
        assert_eq!(set.registration, RegistrationMode::CaBundle);
        assert_eq!(parse(&["--registration=registrar"]).unwrap().registration, RegistrationMode::Registrar);
        for bad in [
            &["--client-name=kube-apiserver"][..],
            &["--client-ca-file=/ca", "--client-name=a,,b"],
            &["--client-ca-file=/ca", "--client-name=a b"],
            &["--registration=self"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn volcano_flags_have_defaults_and_bounds() {
        let base = ["x", "--namespace=vgpu", "--service-name=s"];
        let parse = |extra: &[&str]| Cli::try_parse_from([&base[..], extra].concat()).map(|c| c.args);
        let default = parse(&[]).unwrap();
        assert_eq!(default.volcano_scheduler_names, ["volcano"]);
        assert_eq!(default.volcano_cpu_request.to_string(), "1m");
        let set = parse(&["--volcano-scheduler-names=volcano,vc-batch", "--volcano-cpu-request=0.05"]).unwrap();
        assert_eq!(set.volcano_scheduler_names, ["volcano", "vc-batch"]);
        assert_eq!(set.volcano_cpu_request.to_string(), "50m");
        assert!(parse(&["--volcano-cpu-request=0"]).unwrap().volcano_cpu_request.is_zero());
        for bad in [
            "--volcano-cpu-request=500u",
            "--volcano-cpu-request=-1m",
            "--volcano-cpu-request=lots",
            "--volcano-scheduler-names=a,,b",
        ] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn fit_flags_default_to_waiting_and_name_card_models() {
        let base = ["x", "--namespace=vgpu", "--service-name=s"];
        let parse = |extra: &[&str]| Cli::try_parse_from([&base[..], extra].concat()).map(|c| c.args);
        let default = parse(&[]).unwrap();
        assert!(!default.strict_fit, "waiting, as HAMi, unless asked");
        assert!(default.card_models.is_empty());
        let set = parse(&["--strict-fit=true", "--card-model=NVIDIA A100-SXM4-80GB=80Gi;Tesla T4=15Gi", "--card-model=L4=24Gi"])
            .unwrap();
        assert!(set.strict_fit);
        let names: Vec<&str> = set.card_models.iter().map(|m| m.product_name.as_str()).collect();
        assert_eq!(names, ["NVIDIA A100-SXM4-80GB", "Tesla T4", "L4"]);
        assert_eq!(set.card_models[1].memory_bytes, 15 << 30);
        let e = parse(&["--card-model=Tesla T4"]).unwrap_err().to_string();
        assert!(e.contains("NAME=MEMORY"), "{e}");
    }
}
