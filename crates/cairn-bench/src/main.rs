//! `cairn-bench`: reproduces the orisun-bench scenarios (and Cairn's own) against any
//! Orisun-compatible endpoint and writes the anchor CSV columns plus a JSON report.

// The load generator shares the machine with the node under test, so its allocator costs
// count too: glibc malloc was ~12% of the node's CPU on the write path, mimalloc cuts that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod client;
mod direct;
mod report;
mod runner;
mod scenario;
mod seed;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;

use crate::client::Connection;
use crate::report::Report;
use crate::scenario::Scenario;

/// Named defaults.
mod defaults {
    pub const ENDPOINTS: &str = "http://127.0.0.1:5005";
    pub const USER: &str = "admin";
    pub const PASSWORD: &str = "changeit";
    pub const BOUNDARY: &str = "bench";
    pub const SEED_EVENTS: u64 = 1_000_000;
    pub const SEED_BATCH: usize = 1_000;
    pub const CLIENTS: &str = "1,4,16,64,256";
    pub const WARMUP_SECS: u64 = 5;
    pub const DURATION_SECS: u64 = 30;
    pub const BACKGROUND_CLIENTS: usize = 4;
    pub const HOT_CONTEXTS: u64 = 100;
    pub const CONNECTIONS: usize = 1;
}

/// Load generator for Orisun-compatible event stores (Cairn, Orisun).
#[derive(Debug, Parser)]
#[command(name = "cairn-bench", version, about)]
struct Args {
    /// Comma-separated gRPC endpoints; clients are spread over them round-robin.
    #[arg(long, env = "CAIRN_BENCH_ENDPOINTS", default_value = defaults::ENDPOINTS, value_delimiter = ',')]
    endpoints: Vec<String>,

    /// User name (Basic login once per connection, then session tokens).
    #[arg(long, env = "CAIRN_BENCH_USER", default_value = defaults::USER)]
    user: String,

    /// Password.
    #[arg(long, env = "CAIRN_BENCH_PASSWORD", default_value = defaults::PASSWORD, hide_env_values = true)]
    password: String,

    /// PEM file of the CA that signed the servers' certificates, for https:// endpoints
    /// (default: the system's roots).
    #[arg(long, alias = "ca-cert", env = "CAIRN_BENCH_TLS_CA")]
    tls_ca: Option<PathBuf>,

    /// PEM certificate chain to present to servers that require client certificates
    /// (`cairn serve --tls-client-ca`); needs --tls-key.
    #[arg(long, env = "CAIRN_BENCH_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "CAIRN_BENCH_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Boundary to benchmark (created if missing).
    #[arg(long, env = "CAIRN_BENCH_BOUNDARY", default_value = defaults::BOUNDARY)]
    boundary: String,

    /// Events the boundary must hold before scenarios run (seeded if fewer).
    #[arg(long, env = "CAIRN_BENCH_SEED_EVENTS", default_value_t = defaults::SEED_EVENTS)]
    seed_events: u64,

    /// Events per seeding write.
    #[arg(long, env = "CAIRN_BENCH_SEED_BATCH", default_value_t = defaults::SEED_BATCH)]
    seed_batch: usize,

    /// Scenarios to run, comma-separated (default: all, in the anchor order).
    #[arg(long, env = "CAIRN_BENCH_SCENARIOS", value_delimiter = ',')]
    scenarios: Vec<Scenario>,

    /// Concurrent clients per run, comma-separated.
    #[arg(long, env = "CAIRN_BENCH_CLIENTS", default_value = defaults::CLIENTS, value_delimiter = ',')]
    clients: Vec<usize>,

    /// Seconds of load before measuring.
    #[arg(long, env = "CAIRN_BENCH_WARMUP_SECS", default_value_t = defaults::WARMUP_SECS)]
    warmup_secs: u64,

    /// Seconds measured per run.
    #[arg(long, env = "CAIRN_BENCH_DURATION_SECS", default_value_t = defaults::DURATION_SECS)]
    duration_secs: u64,

    /// Readers running beside the writers of write-unconditional-1-with-readers.
    #[arg(long, env = "CAIRN_BENCH_BACKGROUND_CLIENTS", default_value_t = defaults::BACKGROUND_CLIENTS)]
    background_clients: usize,

    /// Contexts command-cycle clients pick from (fewer = more contention, more retries).
    #[arg(long, env = "CAIRN_BENCH_HOT_CONTEXTS", default_value_t = defaults::HOT_CONTEXTS)]
    hot_contexts: u64,

    /// HTTP/2 connections per endpoint, shared by the clients of a run (0 = one per
    /// client).
    #[arg(long, env = "CAIRN_BENCH_CONNECTIONS", default_value_t = defaults::CONNECTIONS)]
    connections: usize,

    /// How scenario requests travel: `direct` (a lean gRPC caller over one h2 connection,
    /// plaintext only; the least load-generator CPU per request), `tonic` (tonic's client),
    /// `auto` (direct unless TLS).
    #[arg(long, env = "CAIRN_BENCH_TRANSPORT", value_enum, default_value_t = client::Transport::Auto)]
    transport: client::Transport,

    /// Write the anchor-format CSV here.
    #[arg(long, env = "CAIRN_BENCH_CSV")]
    csv: Option<PathBuf>,

    /// Write the JSON report (every figure, errors by code, retries) here.
    #[arg(long, env = "CAIRN_BENCH_JSON")]
    json: Option<PathBuf>,

    /// Hide the progress bar.
    #[arg(long, env = "CAIRN_BENCH_QUIET")]
    quiet: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.endpoints.is_empty() {
        bail!("--endpoints is empty");
    }
    if args.clients.is_empty() || args.clients.contains(&0) {
        bail!("--clients must list positive numbers");
    }
    if args.seed_batch == 0 || args.seed_batch > 10_000 {
        bail!("--seed-batch must be between 1 and 10000");
    }
    let scenarios = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios.clone()
    };
    let connect = client::ConnectOptions {
        endpoints: args.endpoints.clone(),
        user: args.user.clone(),
        password: args.password.clone(),
        tls: client::TlsFiles::read(
            args.tls_ca.as_deref(),
            args.tls_cert.as_deref().zip(args.tls_key.as_deref()),
        )?,
        transport: args.transport,
    };
    connect.check_schemes()?;
    let admin = Connection::open(&connect, 0)
        .await
        .context("failed to connect")?;
    let contexts = seed::ensure(
        &admin,
        &args.boundary,
        args.seed_events,
        args.seed_batch,
        &connect,
        !args.quiet,
    )
    .await
    .context("failed to seed the boundary")?;
    eprintln!(
        "boundary {} holds {} events; {} seeded contexts",
        args.boundary, contexts.events, contexts.contexts
    );

    let settings = runner::Settings {
        boundary: args.boundary.clone(),
        warmup: Duration::from_secs(args.warmup_secs),
        duration: Duration::from_secs(args.duration_secs),
        background_clients: args.background_clients,
        seeded_contexts: contexts.contexts,
        hot_contexts: args.hot_contexts.max(1),
        progress: !args.quiet,
        connections: args.connections,
    };
    let mut report = Report::default();
    for scenario in &scenarios {
        for &clients in &args.clients {
            let result = runner::run(&connect, *scenario, clients, &settings)
                .await
                .with_context(|| format!("{} with {clients} clients failed", scenario.name()))?;
            eprintln!("{}", result.summary());
            report.results.push(result);
            if let Some(path) = &args.csv {
                report.write_csv(path)?;
            }
            if let Some(path) = &args.json {
                report.write_json(path)?;
            }
        }
    }
    if args.csv.is_none() {
        print!("{}", report.csv());
    }
    Ok(())
}
