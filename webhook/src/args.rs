//! The `vgpu-dra webhook` flags; every one has an environment twin, parsing has no side effects.

use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// DRA driver name whose ResourceSlices and attributes the claims use [default: the config
    /// file's driverName, else hami-core-gpu.project-hami.io].
    #[arg(long, env = "VGPU_DRA_DRIVER_NAME")]
    pub driver_name: Option<String>,
    /// `timeoutSeconds` of the webhook registration (1-30).
    #[arg(long, env = "VGPU_DRA_WEBHOOK_TIMEOUT", default_value_t = 10, value_parser = clap::value_parser!(i32).range(1..=30))]
    pub timeout_seconds: i32,
    /// Address of the plain-HTTP metrics and health endpoint; none when absent.
    #[arg(long, env = "VGPU_DRA_METRICS_ADDRESS")]
    pub metrics_address: Option<SocketAddr>,
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
}
