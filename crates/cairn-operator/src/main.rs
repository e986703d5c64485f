//! `cairn-operator`: the Kubernetes operator for Cairn.

use std::sync::Arc;

use anyhow::Context as _;
use cairn_operator::controller::{self, Context};
use cairn_operator::validate::OperatorDefaults;
use clap::{Parser, Subcommand};

/// The image of Boundaries that do not name one: the Cairn release this operator ships with.
const DEFAULT_CAIRN_IMAGE: &str = concat!("ghcr.io/cairn-db/cairn:", env!("CARGO_PKG_VERSION"));

/// The Kubernetes operator for Cairn: Boundary resources become Raft clusters of cairn nodes.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the Boundary CustomResourceDefinition as YAML (what deploy/crds/ holds):
    /// `cairn-operator crd | kubectl apply -f -`.
    Crd {
        /// Print the field reference generated from the CRD's schema instead, as Markdown
        /// (what docs/boundary-reference.md holds).
        #[arg(long)]
        markdown: bool,
    },
    /// Reconcile Boundaries against the cluster of the usual kube config (in-cluster, or
    /// `KUBECONFIG` / ~/.kube/config). Run one replica: leader election is not built yet.
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Image for Boundaries whose spec names none.
    #[arg(long, env = "CAIRN_OPERATOR_CAIRN_IMAGE", default_value = DEFAULT_CAIRN_IMAGE)]
    cairn_image: String,

    /// Watch only this namespace (default: every namespace).
    #[arg(long, env = "CAIRN_OPERATOR_NAMESPACE")]
    namespace: Option<String>,

    /// Log level: error, warn, info, debug or trace.
    #[arg(long, env = "CAIRN_OPERATOR_LOG", default_value = "info")]
    log: tracing::Level,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd { markdown: false } => print!("{}", cairn_operator::crd_yaml()?),
        Command::Crd { markdown: true } => print!("{}", cairn_operator::reference::markdown()),
        Command::Run(args) => run(args)?,
    }
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .json()
        .with_max_level(args.log)
        .init();
    let runtime = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("failed to read the kube config")?;
        let context = Context::discover(
            client,
            OperatorDefaults {
                image: args.cairn_image,
            },
        )
        .await
        .context("failed to reach the API server")?;
        tracing::info!(
            namespace = args.namespace.as_deref().unwrap_or("(all)"),
            "reconciling Boundaries"
        );
        controller::run(Arc::new(context), args.namespace).await;
        Ok(())
    })
}
