//! Command-line interface: every flag has an environment twin; parsing has no side effects.

use std::io::Write;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use vgpu_scheduling::{DriverName, SharingConfig, publish};

use crate::discovery::DeviceSource;
use crate::discovery::mock::{MockSource, parse_spec};
use crate::slices::{PoolIdentity, build_slices};

/// vgpu-dra: share NVIDIA GPUs between pods through Kubernetes DRA, with HAMi-core limits.
#[derive(Debug, Parser)]
#[command(name = "vgpu-dra", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the ResourceSlices this node would publish, without a cluster.
    Inventory(InventoryArgs),
}

/// Output formats.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Arguments of `vgpu-dra inventory`.
#[derive(Debug, clap::Args)]
pub struct InventoryArgs {
    /// The node the slices are for (also the pool name).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Mock GPUs instead of NVML: `[COUNTx]PRODUCT:MEMORY,...`, e.g. `1xTesla T4:15Gi`.
    #[arg(long, env = "VGPU_DRA_MOCK_GPUS")]
    pub mock_gpus: String,
    /// DRA driver name.
    #[arg(long, env = "VGPU_DRA_DRIVER_NAME", default_value = vgpu_scheduling::config::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// Shares one card can hold at once (HAMi deviceSplitCount).
    #[arg(long, env = "VGPU_DRA_DEVICE_SPLIT_COUNT", default_value_t = 10)]
    pub device_split_count: u32,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: OutputFormat,
}

/// A failure the user caused: printed as one line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A `v1` `List`, the shape `kubectl get -o yaml` prints for several objects.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<T> {
    api_version: &'static str,
    kind: &'static str,
    items: Vec<T>,
}

/// `vgpu-dra inventory`: the slices as a `v1` `List`, written to `out`.
///
/// # Errors
/// [`UsageError`] for bad arguments; other errors for failed output.
pub fn inventory(args: &InventoryArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cards = parse_spec(&args.mock_gpus).map_err(|e| UsageError(e.to_string()))?;
    let driver = DriverName::new(args.driver_name.clone()).map_err(|e| UsageError(format!("--driver-name: {e}")))?;
    let config =
        SharingConfig { driver_name: driver.clone(), device_split_count: args.device_split_count, ..SharingConfig::default() };
    config.validate().map_err(|e| UsageError(format!("--device-split-count: {}", e.reason)))?;
    let inventory = MockSource::new(&args.node_name, cards).inventory()?;
    let pool = PoolIdentity { driver, node_name: args.node_name.clone(), node_uid: None, generation: 1 };
    let slices = build_slices(&pool, &publish(&inventory, &config));
    let items: Vec<serde_json::Value> = slices
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s)?;
            // k8s-openapi leaves the type fields to the client; a printed object needs them.
            if let Some(obj) = v.as_object_mut() {
                obj.insert("apiVersion".into(), "resource.k8s.io/v1".into());
                obj.insert("kind".into(), "ResourceSlice".into());
            }
            Ok(v)
        })
        .collect::<Result<_, serde_json::Error>>()?;
    let list = List { api_version: "v1", kind: "List", items };
    match args.output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &list)?;
            writeln!(out)?;
        }
        OutputFormat::Yaml => out.write_all(serde_saphyr::to_string(&list)?.as_bytes())?,
    }
    Ok(())
}
