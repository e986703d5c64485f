//! `cairn`: run a Cairn node.

// glibc malloc showed up at ~12% of server CPU in the write-path profile (fragmented
// small allocations across worker threads); mimalloc's per-thread heaps cut that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;
use cairn_server::config::{Cli, Command, LogFormat};
use clap::Parser;
use tracing_subscriber::EnvFilter;

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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            init_tracing(args.log_format, &args.log)?;
            let config = args.validate()?;
            let server = cairn_server::start(config)
                .await
                .context("failed to start")?;
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
