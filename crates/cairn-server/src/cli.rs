//! The `cairn` command line: parse, set up logging, run the subcommand.
//!
//! All of it lives in the library, not in `main.rs`: async code and generic setup (tracing,
//! clap) are compiled once here instead of being instantiated again in the binary crate,
//! which made the binary alone take two minutes of an optimised build.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::config::{Cli, Command, LogFormat};

fn init_tracing(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_new(filter).with_context(|| format!("invalid --log filter {filter:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("failed to install the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        result = tokio::signal::ctrl_c() => {
            result.context("failed to install the SIGINT handler")?;
            Ok("SIGINT")
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            init_tracing(args.log_format, &args.log)?;
            let config = args.validate()?;
            let server = crate::start(config).await.context("failed to start")?;
            let signal = shutdown_signal().await?;
            tracing::info!("received {signal}");
            server
                .shutdown()
                .await
                .context("failed to shut down cleanly")?;
        }
    }
    Ok(())
}

/// Runs `cairn` with the process's arguments; errors are printed with their causes.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("Error: failed to start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}
