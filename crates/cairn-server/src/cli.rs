//! The `cairn` command line: parse, set up logging, run the subcommand.
//!
//! All of it lives in the library, not in `main.rs`: async code and generic setup (tracing,
//! clap) are compiled once here instead of being instantiated again in the binary crate,
//! which made the binary alone take two minutes of an optimised build.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt;
use tracing_subscriber::prelude::*;

use crate::config::LogFormat;

/// How long a node whose Raft stopped may take to shut down before it exits anyway.
const FATAL_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Cairn: a replicated event database for Command Context Consistency, speaking the Orisun
/// gRPC protocol.
#[derive(Debug, Parser)]
#[command(name = "cairn", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node: alone (the default, a one-node Raft group) or as a member of a cluster
    /// (--initial-members or --join), serving the Orisun API.
    Serve(Box<crate::config::ServeArgs>),
    /// Inspect and change a running cluster through any member's peer port.
    Cluster(crate::cluster_cli::ClusterArgs),
    /// Rotate the session-token key, or see its state, through any node's client port.
    Tokens(crate::tokens_cli::TokensArgs),
    /// Take an online backup of a running node, or list and verify backups.
    Backup(crate::backup_cli::BackupArgs),
    /// Turn a backup into the data directory of a new one-node cluster.
    Restore(crate::backup_cli::RestoreArgs),
}

/// Installs the log output. The filter is `target=level` directives with an optional
/// default level ("info,openraft=warn"): tracing's `Targets`, which needs no regex engine
/// (`EnvFilter`'s would add a minute to a cold build for span and field filters we do not
/// use).
fn init_tracing(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let targets: Targets = filter
        .parse()
        .with_context(|| format!("invalid --log filter {filter:?}"))?;
    let registry = tracing_subscriber::registry().with(targets);
    match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
    }
    .context("failed to install the log output")
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
            crate::backup_cli::restore_on_first_start(&config).await?;
            let server = crate::start(config).await.context("failed to start")?;
            let fatal = server.fatal();
            tokio::select! {
                signal = shutdown_signal() => tracing::info!("received {}", signal?),
                why = fatal => {
                    // A zombie that answers probes helps nobody: stop, exit non-zero, and let
                    // the supervisor (Kubernetes, systemd) restart the process, which replays
                    // its log (docs/operations.md, "Storage errors").
                    tracing::error!("raft stopped on a storage error, exiting: {why}");
                    match tokio::time::timeout(FATAL_SHUTDOWN_WAIT, server.shutdown()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(
                            "failed to shut down cleanly after the storage error: {e}"
                        ),
                        Err(_) => tracing::warn!(
                            "shutting down after the storage error took over {}s; exiting anyway",
                            FATAL_SHUTDOWN_WAIT.as_secs()
                        ),
                    }
                    anyhow::bail!("raft stopped on a storage error: {why}");
                }
            }
            server
                .shutdown()
                .await
                .context("failed to shut down cleanly")?;
        }
        Command::Cluster(args) => crate::cluster_cli::run(args).await?,
        Command::Tokens(args) => crate::tokens_cli::run(args).await?,
        Command::Backup(args) => crate::backup_cli::run(args).await?,
        Command::Restore(args) => crate::backup_cli::restore(args).await?,
    }
    Ok(())
}

/// Runs `cairn` with the process's arguments; errors are printed with their causes.
pub fn main() -> ExitCode {
    // Before any file is created: the data directory holds password hashes and the
    // token-signing key (0600 files, 0700 directories).
    crate::data_dir::private_umask();
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
