//! `kubectl vgpu`: who uses which shared GPU, and why a pod waits for one.
//!
//! A kubectl plugin (binary `kubectl-vgpu`; also `vgpu-dra usage` and `vgpu-dra why`) that reads
//! ResourceSlices, ResourceClaims, DeviceClasses and a pod with the user's kubeconfig and explains
//! them with the scheduling crate's arithmetic: the request policy rounding kube-scheduler applies,
//! exact quantities (never floats), the HAMi-core limits the node driver derives. It reads only;
//! it changes nothing in the cluster, and it is not the scheduler: where it cannot evaluate a
//! selector it says so instead of guessing.

pub mod allocations;
pub mod api;
pub mod cards;
pub mod cel;
pub mod fit;
pub mod requests;
pub mod table;
pub mod usage;
pub mod why;
pub mod why_text;

#[cfg(test)]
mod test_fixtures;

use std::io::Write;

use clap::ValueEnum;
use serde::Serialize;

pub use api::{ApiError, ClusterArgs};
pub use usage::{UsageReport, usage_report};
pub use why::{WhyReport, why_report};

/// Output formats of `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageFormat {
    /// The table with the pods holding shares.
    Wide,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Output formats of `why`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WhyFormat {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Arguments of `usage`.
#[derive(Debug, Clone, clap::Args)]
pub struct UsageArgs {
    /// Only this node's cards.
    #[arg(long, env = "VGPU_DRA_USAGE_NODE")]
    pub node: Option<String>,
    /// Output format [default: a table].
    #[arg(short = 'o', long, env = "VGPU_DRA_OUTPUT", value_enum)]
    pub output: Option<UsageFormat>,
    /// The cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Arguments of `why`.
#[derive(Debug, Clone, clap::Args)]
pub struct WhyArgs {
    /// The pod.
    pub pod: String,
    /// The pod's namespace [default: the kubeconfig context's].
    #[arg(short = 'n', long, env = "VGPU_DRA_NAMESPACE")]
    pub namespace: Option<String>,
    /// Output format [default: text].
    #[arg(short = 'o', long, env = "VGPU_DRA_OUTPUT", value_enum)]
    pub output: Option<WhyFormat>,
    /// The cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// A failed command; the message says which step.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Talking to the API server failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The objects read do not make a usage report.
    #[error(transparent)]
    Usage(#[from] usage::UsageError),
    /// The objects read do not make a why report.
    #[error(transparent)]
    Why(#[from] why::WhyError),
    /// The async runtime could not start.
    #[error("starting the runtime")]
    Runtime(#[source] std::io::Error),
    /// Writing the output failed.
    #[error("writing the output")]
    Write(#[from] std::io::Error),
    /// JSON encoding failed.
    #[error("encoding JSON")]
    Json(#[from] serde_json::Error),
    /// YAML encoding failed.
    #[error("encoding YAML")]
    Yaml(#[from] serde_saphyr::SerializeError),
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    // rustls needs one process-wide crypto provider; ring is the one the workspace builds.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(CliError::Runtime)
}

fn write_structured<T: Serialize>(value: &T, yaml: bool, out: &mut dyn Write) -> Result<(), CliError> {
    if yaml {
        out.write_all(serde_saphyr::to_string(value)?.as_bytes())?;
    } else {
        serde_json::to_writer_pretty(&mut *out, value)?;
        writeln!(out)?;
    }
    Ok(())
}

/// `usage`: one list of slices and one of claims (all namespaces), then the report on `out`.
///
/// # Errors
/// [`CliError`] naming the step that failed.
pub fn usage(args: &UsageArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (slices, claims) = runtime()?.block_on(async {
        let cluster = api::Cluster::connect(&args.cluster).await?;
        let slices = cluster.slices().await?;
        let claims = cluster.claims(None).await?;
        Ok::<_, ApiError>((slices, claims))
    })?;
    let report = usage_report(&slices, &claims, &args.cluster.driver_name, args.node.as_deref())?;
    match args.output {
        None => usage::write_table(&report, false, out)?,
        Some(UsageFormat::Wide) => usage::write_table(&report, true, out)?,
        Some(UsageFormat::Json) => write_structured(&report, false, out)?,
        Some(UsageFormat::Yaml) => write_structured(&report, true, out)?,
    }
    Ok(())
}

/// `why POD`: the pod, one list of slices, of DeviceClasses and of claims, then the report on
/// `out`. Claims are listed in all namespaces, since every claim on a card takes room from it;
/// where that is forbidden, only the pod's namespace is read and `warnings` says the figures
/// leave out the others.
///
/// # Errors
/// [`CliError`] naming the step that failed; a missing pod is [`ApiError::PodNotFound`].
pub fn why(args: &WhyArgs, out: &mut dyn Write, warnings: &mut dyn Write) -> Result<(), CliError> {
    let (pod, slices, classes, claims, partial) = runtime()?.block_on(async {
        let cluster = api::Cluster::connect(&args.cluster).await?;
        let namespace = args.namespace.clone().unwrap_or_else(|| cluster.default_namespace.clone());
        let pod = cluster.pod(&namespace, &args.pod).await?;
        let slices = cluster.slices().await?;
        let classes = cluster.classes().await?;
        let (claims, partial) = match cluster.claims(None).await {
            Err(e) if e.is_forbidden() => (cluster.claims(Some(&namespace)).await?, true),
            other => (other?, false),
        };
        Ok::<_, ApiError>((pod, slices, classes, claims, partial))
    })?;
    if partial {
        writeln!(
            warnings,
            "warning: ResourceClaims of other namespaces cannot be listed; what they take of the cards is not counted"
        )?;
    }
    let inputs =
        why::WhyInputs { pod: &pod, claims: &claims, slices: &slices, classes: &classes, driver: &args.cluster.driver_name };
    let report = why_report(&inputs)?;
    match args.output {
        None => why_text::write_text(&report, out)?,
        Some(WhyFormat::Json) => write_structured(&report, false, out)?,
        Some(WhyFormat::Yaml) => write_structured(&report, true, out)?,
    }
    Ok(())
}
