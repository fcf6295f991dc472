//! The `vgpu-dra` binary: parse the command line, run the subcommand, map errors to exit codes.

use std::process::ExitCode;

use clap::Parser;
use vgpu_dra::cli::{Cli, Command, UsageError, inventory, mig_check, prepare_preview};
use vgpu_dra::daemon;

fn main() -> ExitCode {
    vgpu_dra::install_crypto_provider();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Inventory(args) => inventory(args, &mut std::io::stdout().lock()),
        Command::KubeletPlugin(args) => daemon::run(args),
        Command::PreparePreview(args) => prepare_preview(args, &mut std::io::stdout().lock()),
        Command::Webhook(args) => vgpu_dra_webhook::run(args).map_err(anyhow::Error::from),
        Command::Usage(args) => vgpu_dra_cli::usage(args, &mut std::io::stdout().lock()).map_err(anyhow::Error::from),
        Command::Why(args) => {
            vgpu_dra_cli::why(args, &mut std::io::stdout().lock(), &mut std::io::stderr()).map_err(anyhow::Error::from)
        }
        Command::Convert(args) => {
            vgpu_dra_cli::convert(args, &mut std::io::stdout().lock(), &mut std::io::stderr()).map_err(anyhow::Error::from)
        }
        Command::MigCheck(args) => mig_check(args, &mut std::io::stdout().lock()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<UsageError>() => {
            eprintln!("vgpu-dra: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("vgpu-dra: {e:#}");
            ExitCode::FAILURE
        }
    }
}
