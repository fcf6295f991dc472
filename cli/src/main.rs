//! `kubectl-vgpu`: on PATH, kubectl runs it as `kubectl vgpu ...`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vgpu_dra_cli::{ConvertArgs, UsageArgs, WhyArgs, convert, usage, why};

/// Who uses which shared GPU, and why a pod waits for one.
#[derive(Debug, Parser)]
#[command(name = "kubectl vgpu", bin_name = "kubectl vgpu", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One row per card: memory, cores and shares allocated of the total, health, and the
    /// pods holding shares (-o wide); totals per node and for the cluster.
    Usage(UsageArgs),
    /// For each claim of POD: where it went and its limits, or what stops each card.
    Why(WhyArgs),
    /// Manifests written for HAMi or Volcano's vGPU plugin (-f), converted as the webhook
    /// converts them; without -f, the cluster's workloads that still use those resources.
    Convert(ConvertArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = std::io::stdout().lock();
    let result = match &cli.command {
        Command::Usage(args) => usage(args, &mut out),
        Command::Why(args) => why(args, &mut out, &mut std::io::stderr()),
        Command::Convert(args) => convert(args, &mut out, &mut std::io::stderr()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Each layer's message names its own step; the causes follow, as kubectl prints them.
            let mut message = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                // Some of kube's errors print their cause themselves: say it once.
                let text = c.to_string();
                if !message.contains(&text) {
                    message.push_str(&format!(": {text}"));
                }
                cause = c.source();
            }
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
