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
pub mod convert;
pub mod convert_live;
pub mod fit;
pub mod live;
pub mod quota_usage;
pub mod requests;
pub mod table;
pub mod taint_rules;
pub mod usage;
pub mod why;
pub mod why_text;

#[cfg(test)]
mod test_fixtures;

use std::io::{Read, Write};
use std::path::PathBuf;

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
    /// Instead of cards: what this namespace's claims hold of each GPU quota key of its
    /// ResourceQuotas (`nvidia.com/gpu`, `gpumem`, `gpucores`, in HAMi's units), beside the limit.
    #[arg(short = 'n', long, conflicts_with = "node")]
    pub namespace: Option<String>,
    /// Output format [default: a table].
    #[arg(short = 'o', long, env = "VGPU_DRA_OUTPUT", value_enum)]
    pub output: Option<UsageFormat>,
    /// Also show what the claims' processes use now (memory of their limits, SM utilisation),
    /// from the node drivers' metrics, read through the API server's pod proxy (needs `get` of
    /// `pods/proxy` in the drivers' namespace).
    #[arg(long)]
    pub live: bool,
    /// The node drivers' pods, for `--live`.
    #[arg(long, default_value = "app.kubernetes.io/name=vgpu-dra,app.kubernetes.io/component!=webhook")]
    pub driver_selector: String,
    /// Read the live figures from these metrics URLs instead (each a driver's `/metrics`, for
    /// example through `kubectl port-forward`); implies `--live`.
    #[arg(long = "metrics", value_name = "URL")]
    pub metrics: Vec<String>,
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

/// Arguments of `convert`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConvertArgs {
    /// Manifests to convert (YAML or JSON, several documents or a List; `-` is standard input),
    /// printed converted, the ResourceClaimTemplates they name after them. Without one, the
    /// cluster's workloads that still name HAMi's or Volcano's resources are listed instead.
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<PathBuf>,
    /// The device configuration the webhook is given (HAMi's `device-config.yaml`,
    /// volcano-vgpu-device-plugin's, or vgpu-dra's own).
    #[arg(long, env = "VGPU_DRA_CONFIG")]
    pub config: Option<PathBuf>,
    /// The cards to convert against, as the driver's `--mock-gpus` (`2xTesla T4:15Gi`) [default:
    /// with -f none, so counts and memory are not checked; against a cluster, its
    /// ResourceSlices].
    #[arg(long)]
    pub mock_gpus: Option<String>,
    /// As the webhook's `--card-model`: `PRODUCT NAME=MEMORY`, `;`-separated or repeated.
    #[arg(long = "card-model", value_delimiter = ';', value_parser = vgpu_scheduling::compat::CardModel::parse)]
    pub card_models: Vec<vgpu_scheduling::compat::CardModel>,
    /// As the webhook's `--strict-fit`: refuse what no card or node known can hold.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub strict_fit: bool,
    /// The DeviceClass of converted requests [default: the driver name].
    #[arg(long)]
    pub device_class: Option<String>,
    /// As the webhook's `--mig-device-class`: the DeviceClass of converted MIG requests
    /// [default: mig.<device class>].
    #[arg(long)]
    pub mig_device_class: Option<String>,
    /// As the webhook's `--unannotated-mig`: a pod without vgpu-mode may get a MIG instance
    /// when no share fits.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub unannotated_mig: bool,
    /// Against the cluster: the workloads of every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Against the cluster: this namespace [default: the kubeconfig context's].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
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
    /// An input of `convert` cannot be read.
    #[error("{0}")]
    Input(String),
    /// `convert` found objects the webhook would refuse (each named on standard error).
    #[error("{0} object(s) would be refused by the webhook")]
    Refused(usize),
    /// The async runtime could not start.
    #[error("starting the runtime")]
    Runtime(#[source] std::io::Error),
    /// A metrics URL cannot be read.
    #[error(transparent)]
    Live(#[from] live::LiveError),
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
    if let Some(namespace) = &args.namespace {
        let (quotas, claims, slices) = runtime()?.block_on(async {
            let cluster = api::Cluster::connect(&args.cluster).await?;
            Ok::<_, ApiError>((cluster.quotas(namespace).await?, cluster.claims(Some(namespace)).await?, cluster.slices().await?))
        })?;
        let rows = quota_usage::rows(&quotas, &claims, &slices, &args.cluster.driver_name);
        quota_usage::write(namespace, &rows, out)?;
        return Ok(());
    }
    let live_from_pods = args.live && args.metrics.is_empty();
    let (slices, claims, pages, rules) = runtime()?.block_on(async {
        let cluster = api::Cluster::connect(&args.cluster).await?;
        let slices = cluster.slices().await?;
        let claims = cluster.claims(None).await?;
        let pages = if live_from_pods { cluster.driver_metrics(&args.driver_selector).await? } else { Vec::new() };
        let rules = cluster.taint_rules().await;
        Ok::<_, ApiError>((slices, claims, pages, rules))
    })?;
    let mut report = usage_report(&slices, &claims, &args.cluster.driver_name, args.node.as_deref())?;
    match rules {
        Ok(rules) => usage::add_taint_rules(&mut report, &slices, &args.cluster.driver_name, &rules)?,
        Err(e) => eprintln!("warning: DeviceTaintRules not read, HEALTH shows the devices' own taints only: {e}"),
    }
    if args.live || !args.metrics.is_empty() {
        let timeout = std::time::Duration::from_secs(args.cluster.request_timeout.max(1));
        let mut seen = live::Page::default();
        for url in &args.metrics {
            seen.merge(live::parse(&live::get(url, timeout)?));
        }
        for (pod, page) in pages {
            match page {
                Ok(text) => seen.merge(live::parse(&text)),
                // One node's driver out of reach leaves its cards at "-", not the whole report.
                Err(e) => eprintln!("warning: driver pod {pod}: {e}"),
            }
        }
        usage::add_live(&mut report, &slices, &args.cluster.driver_name, &seen)?;
    }
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
    let (pod, slices, classes, claims, partial, events, rounding) = runtime()?.block_on(async {
        let cluster = api::Cluster::connect(&args.cluster).await?;
        let namespace = args.namespace.clone().unwrap_or_else(|| cluster.default_namespace.clone());
        let pod = cluster.pod(&namespace, &args.pod).await?;
        // Why a claim is missing is told only in events; without them the report still stands.
        let events = cluster.pod_events(&namespace, &args.pod).await.unwrap_or_default();
        let mut slices = cluster.slices().await?;
        // An administrator's DeviceTaintRules taint devices as the scheduler sees them; a user
        // who may not list them gets the slices' own taints only.
        taint_rules::apply(&mut slices, &cluster.taint_rules().await.unwrap_or_default());
        let classes = cluster.classes().await?;
        let rounding = cluster.rounding().await?;
        let (claims, partial) = match cluster.claims(None).await {
            Err(e) if e.is_forbidden() => (cluster.claims(Some(&namespace)).await?, true),
            other => (other?, false),
        };
        Ok::<_, ApiError>((pod, slices, classes, claims, partial, events, rounding))
    })?;
    if partial {
        writeln!(
            warnings,
            "warning: ResourceClaims of other namespaces cannot be listed; what they take of the cards is not counted"
        )?;
    }
    let inputs = why::WhyInputs {
        pod: &pod,
        claims: &claims,
        slices: &slices,
        classes: &classes,
        driver: &args.cluster.driver_name,
        rounding,
    };
    let mut report = why_report(&inputs)?;
    why::explain_missing(&mut report, &events);
    match args.output {
        None => why_text::write_text(&report, out)?,
        Some(WhyFormat::Json) => write_structured(&report, false, out)?,
        Some(WhyFormat::Yaml) => write_structured(&report, true, out)?,
    }
    Ok(())
}

/// The name sets and card facts `convert` converts with: `--config`, then `--mock-gpus` (or
/// `slices` of a cluster) and `--card-model`.
fn convert_inputs(
    args: &ConvertArgs,
    slices: Option<&[k8s_openapi::api::resource::v1::ResourceSlice]>,
) -> Result<(Vec<vgpu_scheduling::CompatSettings>, vgpu_scheduling::ClassFacts), CliError> {
    use vgpu_scheduling::compat::{FlavourOptions, flavours};
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| CliError::Input(format!("reading {}: {e}", path.display())))?;
            Some(
                vgpu_scheduling::DeviceConfig::parse(&path.display().to_string(), &text)
                    .map_err(|e| CliError::Input(e.to_string()))?,
            )
        }
        None => None,
    };
    let named = config.as_ref().is_some_and(|c| c.driver_name.is_some());
    let options = FlavourOptions {
        driver: (!named).then(|| args.cluster.driver_name.clone()),
        device_class: args.device_class.clone(),
        volcano: vgpu_scheduling::compat::VolcanoSettings::default(),
        strict_fit: args.strict_fit,
        mig_device_class: args.mig_device_class.clone(),
        unannotated_mig: args.unannotated_mig,
    };
    let sets = flavours(config.as_ref(), &options);
    let driver = sets.first().map(|s| s.driver.clone()).unwrap_or_default();
    let facts = match (&args.mock_gpus, slices) {
        (Some(spec), _) => {
            let cards = vgpu_scheduling::mock::parse_spec(spec).map_err(|e| CliError::Input(e.to_string()))?;
            let inventory = vgpu_scheduling::mock::inventory("preview", &cards);
            let sharing = vgpu_scheduling::SharingConfig {
                device_split_count: config.as_ref().and_then(|c| c.device_split_count).unwrap_or(10),
                memory_scaling: config.as_ref().and_then(|c| c.memory_scaling).unwrap_or(vgpu_scheduling::Ratio::ONE),
                core_scaling: config.as_ref().and_then(|c| c.core_scaling).unwrap_or(vgpu_scheduling::Ratio::ONE),
                ..vgpu_scheduling::SharingConfig::default()
            };
            vgpu_scheduling::ClassFacts::from_devices(&vgpu_scheduling::publish(&inventory, &sharing))
        }
        (None, Some(slices)) => vgpu_scheduling::ClassFacts::from_slices(slices, &driver),
        (None, None) => vgpu_scheduling::ClassFacts::default(),
    };
    Ok((sets, facts.with_models(args.card_models.iter().cloned())))
}

/// `convert`: with `-f`, the files converted on `out` (warnings and refusals on `messages`, as
/// `warning:` and `error:` lines; nothing on `out` when anything is refused); without, the
/// cluster's workloads that name HAMi's or Volcano's resources, as a table.
///
/// # Errors
/// [`CliError::Refused`] when the webhook would refuse something; another [`CliError`] for an
/// unreadable input or a failed API call.
pub fn convert(args: &ConvertArgs, out: &mut dyn Write, messages: &mut dyn Write) -> Result<(), CliError> {
    if args.files.is_empty() {
        let (workloads, slices) = runtime()?.block_on(async {
            let cluster = api::Cluster::connect(&args.cluster).await?;
            let namespace =
                (!args.all_namespaces).then(|| args.namespace.clone().unwrap_or_else(|| cluster.default_namespace.clone()));
            let workloads = convert_live::workloads(&cluster, namespace.as_deref()).await?;
            let slices = if args.mock_gpus.is_some() { Vec::new() } else { cluster.slices().await? };
            Ok::<_, ApiError>((workloads, slices))
        })?;
        let (sets, facts) = convert_inputs(args, Some(&slices))?;
        convert_live::write_report(&workloads, &sets, &facts, out)?;
        return Ok(());
    }
    let (sets, facts) = convert_inputs(args, None)?;
    let mut docs = Vec::new();
    for path in &args.files {
        let text = if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(|e| CliError::Input(format!("reading standard input: {e}")))?;
            text
        } else {
            std::fs::read_to_string(path).map_err(|e| CliError::Input(format!("reading {}: {e}", path.display())))?
        };
        docs.extend(convert::documents(&text).map_err(|e| CliError::Input(format!("{}: {e}", path.display())))?);
    }
    let preview = convert::preview(docs, &sets, &facts);
    for (who, warning) in &preview.warnings {
        writeln!(messages, "warning: {who}: {warning}")?;
    }
    for (who, refusal) in &preview.refusals {
        writeln!(messages, "error: {who}: {refusal}")?;
    }
    if !preview.refusals.is_empty() {
        return Err(CliError::Refused(preview.refusals.len()));
    }
    let all: Vec<&serde_json::Value> = preview.documents.iter().chain(&preview.templates).collect();
    for (i, doc) in all.iter().enumerate() {
        if i > 0 {
            writeln!(out, "---")?;
        }
        out.write_all(serde_saphyr::to_string(doc)?.as_bytes())?;
    }
    Ok(())
}
