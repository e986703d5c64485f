//! `cairn-operator`: the Kubernetes operator for Cairn.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use cairn_operator::leader::LeaseConfig;
use cairn_operator::serve::{self, RunOptions};
use cairn_operator::validate::{OperatorDefaults, OperatorPods};
use clap::{ArgAction, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

/// The image of Boundaries that do not name one: the Cairn release this operator ships with.
const DEFAULT_CAIRN_IMAGE: &str = concat!("ghcr.io/cairn-db/cairn:", env!("CARGO_PKG_VERSION"));

/// The Kubernetes operator for Cairn: Boundary resources become Raft clusters of cairn nodes.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the `run` variant costs nothing.
#[allow(clippy::large_enum_variant)]
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
    /// `KUBECONFIG` / ~/.kube/config). Several replicas may run: they elect a leader on a
    /// Lease and only the leader reconciles.
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

    /// Where `/healthz` and `/metrics` are served.
    #[arg(long, env = "CAIRN_OPERATOR_HTTP_LISTEN", default_value = DEFAULT_HTTP_LISTEN)]
    http_listen: SocketAddr,

    /// Elect a leader among the operator's replicas on a coordination.k8s.io Lease; only
    /// the leader reconciles. `false` only when exactly one replica can ever run.
    #[arg(long, env = "CAIRN_OPERATOR_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    leader_elect: bool,

    /// Name of the leader Lease.
    #[arg(long, env = "CAIRN_OPERATOR_LEASE_NAME", default_value = DEFAULT_LEASE_NAME)]
    lease_name: String,

    /// Namespace of the leader Lease: the operator's own (`POD_NAMESPACE`, which the chart
    /// sets), else the kube config's default namespace.
    #[arg(long, env = "CAIRN_OPERATOR_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,

    /// This replica's name in the Lease: the pod's name (`POD_NAME`, which the chart sets),
    /// else the host name with a random suffix.
    #[arg(long, env = "CAIRN_OPERATOR_IDENTITY")]
    identity: Option<String>,

    /// How long the Lease holds without renewal: a standby takes over this long after the
    /// leader stopped renewing (at once when the leader released it on shutdown).
    #[arg(long, env = "CAIRN_OPERATOR_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,

    /// How long the leader keeps failing to renew before it stops (and exits to be
    /// restarted); below the lease duration.
    #[arg(long, env = "CAIRN_OPERATOR_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,

    /// How often the leader renews and standbys try to acquire; below the renew deadline.
    #[arg(long, env = "CAIRN_OPERATOR_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,

    /// Give every Boundary a NetworkPolicy: its peer port (Raft, the cluster secret) only
    /// from its own pods and from pods in the operator's namespace (POD_NAMESPACE) carrying
    /// --pod-labels. Off when the operator runs outside the cluster: it could not reach
    /// the peer ports through such a policy.
    #[arg(long, env = "CAIRN_OPERATOR_NETWORK_POLICY", default_value_t = false, action = ArgAction::Set, requires = "pod_labels")]
    network_policy: bool,

    /// Labels of the operator's own pods, `key=value,key=value` (the chart sets them).
    #[arg(long, env = "CAIRN_OPERATOR_POD_LABELS", value_parser = parse_labels)]
    pod_labels: Option<BTreeMap<String, String>>,
}

/// `key=value,key=value`, each key and value non-empty.
fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(|pair| match pair.trim().split_once('=') {
            Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("{pair:?} is not key=value")),
        })
        .collect()
}

/// The HTTP side port (the same port a Cairn node serves its metrics on).
const DEFAULT_HTTP_LISTEN: &str = "0.0.0.0:9464";
/// The leader Lease's name unless the chart names it after the release.
const DEFAULT_LEASE_NAME: &str = "cairn-operator";

/// `15s`, `500ms`, `2m`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (say 15s, 500ms or 2m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{text:?} is not a duration (say 15s, 500ms or 2m)"));
    }
    Ok(Duration::from_secs_f64(value * scale))
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
        let election = if args.leader_elect {
            let config = LeaseConfig {
                name: args.lease_name,
                namespace: args
                    .lease_namespace
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .unwrap_or_else(|| client.default_namespace().to_string()),
                identity: args.identity.unwrap_or_else(default_identity),
                lease_duration: args.lease_duration,
                renew_deadline: args.renew_deadline,
                retry_period: args.retry_period,
            };
            Some(config.validate()?)
        } else {
            None
        };
        let network_policy = match (args.network_policy, args.pod_labels) {
            (true, Some(labels)) => Some(OperatorPods {
                namespace: std::env::var("POD_NAMESPACE").context(
                    "--network-policy needs POD_NAMESPACE, the operator's own namespace",
                )?,
                labels,
            }),
            _ => None,
        };
        let options = RunOptions {
            defaults: OperatorDefaults {
                image: args.cairn_image,
                network_policy,
            },
            namespace: args.namespace,
            election,
        };
        let listener = serve::bind(args.http_listen).await?;
        tracing::info!(http = %args.http_listen, "serving /healthz and /metrics");
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        serve::run(client, options, listener, shutdown).await?;
        Ok(())
    })
}

/// The pod's name, or (outside Kubernetes) the host's with a random suffix, so two
/// processes on one machine never share an identity.
fn default_identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME") {
        return pod;
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cairn-operator".into());
    let suffix: u32 = rand::random();
    format!("{host}-{suffix:08x}")
}

/// Cancels `shutdown` on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn stop_on_signal(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!("failed to listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("stopping: finishing reconciles under way, releasing the Lease");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn pod_labels_are_key_value_pairs() {
        assert_eq!(
            parse_labels("app.kubernetes.io/name=cairn, app.kubernetes.io/instance=ops"),
            Ok(BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "cairn".to_string()),
                ("app.kubernetes.io/instance".to_string(), "ops".to_string()),
            ]))
        );
        assert!(parse_labels("name").is_err());
        assert!(parse_labels("=x").is_err());
        assert!(parse_labels("a=1,").is_err());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
