//! Command line and environment configuration (`cairn --help`).
//!
//! Every flag has an environment variable `CAIRN_*` and a named default; [`ServeArgs`] is
//! validated into a [`ServeConfig`] that is passed down explicitly (no globals).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cairn_core::boundary::validate_boundary_name;
use clap::{Parser, Subcommand, ValueEnum};

/// Smallest accepted `--snapshot-every-bytes`.
pub const MIN_SNAPSHOT_EVERY_BYTES: u64 = 64 * 1024;
/// Smallest accepted `--memtable-mb`.
pub const MIN_MEMTABLE_MB: usize = 1;
/// Largest accepted `--memtable-mb`.
pub const MAX_MEMTABLE_MB: usize = 4096;

/// Named defaults, so docs, flags and tests agree.
pub mod defaults {
    /// Data directory.
    pub const DATA_DIR: &str = "./data";
    /// Client gRPC listen address (Orisun's port).
    pub const LISTEN: &str = "0.0.0.0:5005";
    /// HTTP listen address for /healthz, /readyz, /metrics.
    pub const HTTP_LISTEN: &str = "0.0.0.0:9464";
    /// Boundaries created at start-up.
    pub const BOUNDARIES: &str = "default";
    /// The admin boundary, always present (B5); Orisun's default name.
    pub const ADMIN_BOUNDARY: &str = "orisun_admin";
    /// Bootstrap admin user name.
    pub const ADMIN_USERNAME: &str = "admin";
    /// Bootstrap admin password: a warning is logged while it is in use.
    pub const ADMIN_PASSWORD: &str = "changeit";
    /// Raft node id.
    pub const NODE_ID: u64 = 1;
    /// Session token lifetime, sliding (A1).
    pub const TOKEN_TTL_SECS: u64 = 24 * 60 * 60;
    /// Largest accepted request message.
    pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
    /// Raft snapshot interval in log entries.
    pub const SNAPSHOT_EVERY_ENTRIES: u64 = cairn_raft::DEFAULT_SNAPSHOT_EVERY_ENTRIES;
    /// Raft snapshot interval in bytes of proposed commands.
    pub const SNAPSHOT_EVERY_BYTES: u64 = cairn_raft::DEFAULT_SNAPSHOT_EVERY_BYTES;
    /// RocksDB block cache.
    pub const BLOCK_CACHE_MB: usize = 256;
    /// RocksDB memtable per column family.
    pub const MEMTABLE_MB: usize = 64;
    /// Batch entries in flight in the proposer.
    pub const MAX_INFLIGHT_BATCHES: usize = cairn_raft::DEFAULT_MAX_INFLIGHT_BATCHES;
    /// Time allowed for another process to release the data directory at start-up.
    pub const LOCK_WAIT_SECS: u64 = 30;
    /// Time allowed for in-flight requests to finish at shutdown.
    pub const SHUTDOWN_GRACE_SECS: u64 = 30;
    /// Subscription lease lifetime (S1).
    pub const LEASE_TTL_SECS: u64 = 15;
    /// Subscription lease renewal interval (S1).
    pub const LEASE_RENEW_SECS: u64 = 5;
}

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
    /// Run a node: a one-node Raft group serving the Orisun API.
    Serve(Box<ServeArgs>),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Flags of `cairn serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Directory holding the node's RocksDB database and snapshots (created if missing).
    #[arg(long, env = "CAIRN_DATA_DIR", default_value = defaults::DATA_DIR)]
    pub data_dir: PathBuf,

    /// Address of the client gRPC API (Orisun protocol).
    #[arg(long, env = "CAIRN_LISTEN", default_value = defaults::LISTEN)]
    pub listen: SocketAddr,

    /// Address of the HTTP endpoints /healthz, /readyz and /metrics.
    #[arg(long, env = "CAIRN_HTTP_LISTEN", default_value = defaults::HTTP_LISTEN)]
    pub http_listen: SocketAddr,

    /// Comma-separated boundaries to create at start-up if missing.
    #[arg(long, env = "CAIRN_BOUNDARIES", default_value = defaults::BOUNDARIES, value_delimiter = ',')]
    pub boundaries: Vec<String>,

    /// The admin boundary, created at start-up and always ACTIVE: stock Orisun clients read
    /// it in their start-up health check (Orisun's ORISUN_ADMIN_BOUNDARY). Cairn keeps its
    /// own catalog elsewhere, so it holds only what clients write to it.
    #[arg(long, env = "CAIRN_ADMIN_BOUNDARY", default_value = defaults::ADMIN_BOUNDARY)]
    pub admin_boundary: String,

    /// User name of the bootstrap ADMIN user (created when no user has that name).
    #[arg(long, env = "CAIRN_ADMIN_USERNAME", default_value = defaults::ADMIN_USERNAME)]
    pub admin_username: String,

    /// Password of the bootstrap ADMIN user. Change it: the default is public.
    #[arg(long, env = "CAIRN_ADMIN_PASSWORD", default_value = defaults::ADMIN_PASSWORD, hide_env_values = true)]
    pub admin_password: String,

    /// Raft node id of this node (unique within its group, ≥ 1).
    #[arg(long, env = "CAIRN_NODE_ID", default_value_t = defaults::NODE_ID)]
    pub node_id: u64,

    /// Address other nodes use to reach this one (defaults to --listen).
    #[arg(long, env = "CAIRN_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,

    /// Lifetime of session tokens in seconds; each authenticated response extends it.
    #[arg(long, env = "CAIRN_TOKEN_TTL_SECS", default_value_t = defaults::TOKEN_TTL_SECS)]
    pub token_ttl_secs: u64,

    /// Largest request message accepted, in bytes; larger ones get OUT_OF_RANGE.
    #[arg(long, env = "CAIRN_MAX_MESSAGE_BYTES", default_value_t = defaults::MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,

    /// Build a Raft snapshot (which lets the log be truncated) every this many entries.
    #[arg(long, env = "CAIRN_SNAPSHOT_EVERY_ENTRIES", default_value_t = defaults::SNAPSHOT_EVERY_ENTRIES)]
    pub snapshot_every_entries: u64,

    /// Also build one after this many bytes of proposed commands (whichever comes first),
    /// so logs of large entries are truncated in time.
    #[arg(long, env = "CAIRN_SNAPSHOT_EVERY_BYTES", default_value_t = defaults::SNAPSHOT_EVERY_BYTES)]
    pub snapshot_every_bytes: u64,

    /// Raft batch entries in flight: concurrent writes arriving meanwhile are folded into the
    /// next entry. Beyond the first, only batches of at least 64 KiB go while others are in
    /// flight (large writes overlap disk and apply work; small ones batch the most). 1 turns
    /// that overlap off.
    #[arg(long, env = "CAIRN_MAX_INFLIGHT_BATCHES", default_value_t = defaults::MAX_INFLIGHT_BATCHES)]
    pub max_inflight_batches: usize,

    /// RocksDB block cache size in MiB.
    #[arg(long, env = "CAIRN_BLOCK_CACHE_MB", default_value_t = defaults::BLOCK_CACHE_MB)]
    pub block_cache_mb: usize,

    /// RocksDB memtable size per column family in MiB: larger means fewer, bigger flushes
    /// and less compaction, at the cost of memory (events, tags and the Raft log each fill
    /// one) and a longer replay after a crash.
    #[arg(long, env = "CAIRN_MEMTABLE_MB", default_value_t = defaults::MEMTABLE_MB)]
    pub memtable_mb: usize,

    /// Seconds to wait at start-up while another process holds the data directory.
    #[arg(long, env = "CAIRN_LOCK_WAIT_SECS", default_value_t = defaults::LOCK_WAIT_SECS)]
    pub lock_wait_secs: u64,

    /// Seconds in-flight requests get to finish on SIGTERM/SIGINT before they are cut off.
    #[arg(long, env = "CAIRN_SHUTDOWN_GRACE_SECS", default_value_t = defaults::SHUTDOWN_GRACE_SECS)]
    pub shutdown_grace_secs: u64,

    /// Log format.
    #[arg(long, env = "CAIRN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter (tracing EnvFilter syntax, e.g. "info,cairn_server=debug").
    #[arg(long, env = "CAIRN_LOG", default_value = "info,openraft=warn")]
    pub log: String,
}

/// Validated serve configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Data directory.
    pub data_dir: PathBuf,
    /// gRPC address.
    pub listen: SocketAddr,
    /// HTTP address.
    pub http_listen: SocketAddr,
    /// Boundaries to ensure at start-up.
    pub boundaries: Vec<String>,
    /// The admin boundary (B5), also ensured at start-up.
    pub admin_boundary: String,
    /// Bootstrap admin name.
    pub admin_username: String,
    /// Bootstrap admin password.
    pub admin_password: String,
    /// Raft node id.
    pub node_id: u64,
    /// Advertised address.
    pub advertise_addr: String,
    /// Token TTL.
    pub token_ttl: Duration,
    /// Max request size.
    pub max_message_bytes: usize,
    /// Snapshot interval.
    pub snapshot_every_entries: u64,
    /// Snapshot interval in bytes of proposed commands.
    pub snapshot_every_bytes: u64,
    /// Block cache bytes.
    pub block_cache_bytes: usize,
    /// Memtable bytes per column family.
    pub memtable_bytes: usize,
    /// Proposer batches in flight.
    pub max_inflight_batches: usize,
    /// Wait for a locked data directory.
    pub lock_wait: Duration,
    /// Shutdown grace.
    pub shutdown_grace: Duration,
    /// Subscription lease TTL.
    pub lease_ttl: Duration,
    /// Subscription lease renewal interval.
    pub lease_renew: Duration,
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ServeArgs {
    /// Validates the flags.
    pub fn validate(self) -> Result<ServeConfig, ConfigError> {
        let mut boundaries: Vec<String> = self
            .boundaries
            .into_iter()
            .map(|b| b.trim().to_string())
            .filter(|b| !b.is_empty())
            .collect();
        boundaries.sort();
        boundaries.dedup();
        for b in &boundaries {
            validate_boundary_name(b).map_err(|e| ConfigError(format!("--boundaries: {e}")))?;
        }
        let admin_boundary = self.admin_boundary.trim().to_string();
        validate_boundary_name(&admin_boundary)
            .map_err(|e| ConfigError(format!("--admin-boundary: {e}")))?;
        if self.admin_username.is_empty() {
            return Err(ConfigError("--admin-username must not be empty".into()));
        }
        if self.admin_password.is_empty() {
            return Err(ConfigError("--admin-password must not be empty".into()));
        }
        if self.node_id == 0 {
            return Err(ConfigError("--node-id must be ≥ 1".into()));
        }
        if self.token_ttl_secs == 0 {
            return Err(ConfigError("--token-ttl-secs must be ≥ 1".into()));
        }
        if self.max_message_bytes < 1024 {
            return Err(ConfigError("--max-message-bytes must be ≥ 1024".into()));
        }
        if self.snapshot_every_entries == 0 {
            return Err(ConfigError("--snapshot-every-entries must be ≥ 1".into()));
        }
        if self.snapshot_every_bytes < MIN_SNAPSHOT_EVERY_BYTES {
            return Err(ConfigError(format!(
                "--snapshot-every-bytes must be ≥ {MIN_SNAPSHOT_EVERY_BYTES} (a snapshot per write would stall the node)"
            )));
        }
        if self.max_inflight_batches == 0 {
            return Err(ConfigError("--max-inflight-batches must be ≥ 1".into()));
        }
        if self.block_cache_mb == 0 {
            return Err(ConfigError("--block-cache-mb must be ≥ 1".into()));
        }
        if !(MIN_MEMTABLE_MB..=MAX_MEMTABLE_MB).contains(&self.memtable_mb) {
            return Err(ConfigError(format!(
                "--memtable-mb must be between {MIN_MEMTABLE_MB} and {MAX_MEMTABLE_MB}"
            )));
        }
        let advertise_addr = self
            .advertise_addr
            .unwrap_or_else(|| self.listen.to_string());
        Ok(ServeConfig {
            data_dir: self.data_dir,
            listen: self.listen,
            http_listen: self.http_listen,
            boundaries,
            admin_boundary,
            admin_username: self.admin_username,
            admin_password: self.admin_password,
            node_id: self.node_id,
            advertise_addr,
            token_ttl: Duration::from_secs(self.token_ttl_secs),
            max_message_bytes: self.max_message_bytes,
            snapshot_every_entries: self.snapshot_every_entries,
            snapshot_every_bytes: self.snapshot_every_bytes,
            block_cache_bytes: self.block_cache_mb * 1024 * 1024,
            memtable_bytes: self.memtable_mb * 1024 * 1024,
            max_inflight_batches: self.max_inflight_batches,
            lock_wait: Duration::from_secs(self.lock_wait_secs),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            lease_ttl: Duration::from_secs(defaults::LEASE_TTL_SECS),
            lease_renew: Duration::from_secs(defaults::LEASE_RENEW_SECS),
        })
    }
}

impl ServeConfig {
    /// A configuration for tests and embedding: loopback, ephemeral ports.
    pub fn for_test(data_dir: PathBuf) -> ServeConfig {
        ServeConfig {
            data_dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            boundaries: vec![defaults::BOUNDARIES.to_string()],
            admin_boundary: defaults::ADMIN_BOUNDARY.to_string(),
            admin_username: defaults::ADMIN_USERNAME.to_string(),
            admin_password: defaults::ADMIN_PASSWORD.to_string(),
            node_id: defaults::NODE_ID,
            advertise_addr: "127.0.0.1:0".to_string(),
            token_ttl: Duration::from_secs(defaults::TOKEN_TTL_SECS),
            max_message_bytes: defaults::MAX_MESSAGE_BYTES,
            snapshot_every_entries: defaults::SNAPSHOT_EVERY_ENTRIES,
            snapshot_every_bytes: defaults::SNAPSHOT_EVERY_BYTES,
            block_cache_bytes: 32 * 1024 * 1024,
            memtable_bytes: defaults::MEMTABLE_MB * 1024 * 1024,
            max_inflight_batches: defaults::MAX_INFLIGHT_BATCHES,
            lock_wait: Duration::from_secs(defaults::LOCK_WAIT_SECS),
            shutdown_grace: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(defaults::LEASE_TTL_SECS),
            lease_renew: Duration::from_secs(defaults::LEASE_RENEW_SECS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServeConfig, String> {
        let mut argv = vec!["cairn", "serve"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let Command::Serve(args) = cli.command;
        args.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!(c.listen.to_string(), "0.0.0.0:5005");
        assert_eq!(c.http_listen.to_string(), "0.0.0.0:9464");
        assert_eq!(c.boundaries, vec!["default"]);
        assert_eq!(c.admin_boundary, "orisun_admin");
        assert_eq!(c.admin_username, "admin");
        assert_eq!(c.data_dir, PathBuf::from("./data"));
    }

    #[test]
    fn boundaries_are_validated_and_deduplicated() {
        let c = parse(&["--boundaries", "b,a,b"]).expect("valid");
        assert_eq!(c.boundaries, vec!["a", "b"]);
        assert!(parse(&["--boundaries", "1bad"]).is_err());
        assert!(parse(&["--admin-boundary", "9bad-name"]).is_err());
        assert_eq!(
            parse(&["--admin-boundary", "ops"])
                .expect("valid")
                .admin_boundary,
            "ops"
        );
        assert!(parse(&["--node-id", "0"]).is_err());
    }

    #[test]
    fn snapshot_triggers_are_bounded() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!(c.snapshot_every_bytes, 1024 * 1024 * 1024);
        assert!(parse(&["--snapshot-every-bytes", "65535"]).is_err());
        let c = parse(&["--snapshot-every-bytes", "65536"]).expect("the minimum is valid");
        assert_eq!(c.snapshot_every_bytes, MIN_SNAPSHOT_EVERY_BYTES);
        assert!(parse(&["--snapshot-every-entries", "0"]).is_err());
        assert!(parse(&["--memtable-mb", "0"]).is_err());
        assert!(parse(&["--memtable-mb", "4097"]).is_err());
    }
}
