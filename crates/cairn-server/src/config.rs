//! Command line and environment configuration (`cairn --help`).
//!
//! Every flag has an environment variable `CAIRN_*` and a named default; [`ServeArgs`] is
//! validated into a [`ServeConfig`] that is passed down explicitly (no globals).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cairn_core::boundary::validate_boundary_name;
use clap::ValueEnum;

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
    /// Client gRPC listen address (Orisun's port). Loopback: a bare `cairn serve` (with
    /// the default admin password) is reachable from this machine only.
    pub const LISTEN: &str = "127.0.0.1:5005";
    /// HTTP listen address for /healthz, /readyz, /metrics (loopback, as the client port).
    pub const HTTP_LISTEN: &str = "127.0.0.1:9464";
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
    /// A session's longest life from its password login, however busy it is.
    pub const TOKEN_MAX_AGE_SECS: u64 = 7 * 24 * 60 * 60;
    /// Largest accepted request message.
    pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
    /// Raft snapshot interval in log entries.
    pub const SNAPSHOT_EVERY_ENTRIES: u64 = cairn_raft::DEFAULT_SNAPSHOT_EVERY_ENTRIES;
    /// Raft snapshot interval in bytes of proposed commands.
    pub const SNAPSHOT_EVERY_BYTES: u64 = cairn_raft::DEFAULT_SNAPSHOT_EVERY_BYTES;
    /// Raft log entries kept behind a snapshot.
    pub const RAFT_LOG_KEPT: u64 = cairn_raft::DEFAULT_LOG_ENTRIES_KEPT;
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
    /// Peer port (Raft and the cluster API) of a clustered node.
    pub const PEER_LISTEN: &str = "0.0.0.0:5006";
    /// Leader heartbeat interval.
    pub const RAFT_HEARTBEAT_MS: u64 = 250;
    /// Shortest election timeout (the longest is twice this).
    pub const RAFT_ELECTION_TIMEOUT_MS: u64 = 1000;
    /// How long a call waits for a leader (during an election) before UNAVAILABLE.
    pub const LEADER_WAIT_MS: u64 = 10_000;
    /// Free space writes leave on the data directory's filesystem, MiB: room for a
    /// memtable flush, a compaction's output and a snapshot's checkpoint of a small store.
    pub const MIN_FREE_DISK_MB: u64 = 256;
    /// Open subscriptions per user per node.
    pub const MAX_SUBSCRIPTIONS_PER_USER: usize = 64;
    /// Open subscriptions per node.
    pub const MAX_SUBSCRIPTIONS: usize = 4096;
    /// Bytes of writes a node holds at once (requests waiting for Raft or the leader).
    pub const MAX_WRITE_BYTES_IN_FLIGHT: usize = 512 * 1024 * 1024;
    /// How often the archiving leader ships a segment of new committed entries: the
    /// longest an acknowledged write waits for the archive (plus the upload).
    pub const ARCHIVE_INTERVAL_SECS: u64 = 5;
    /// Largest archive segment, MiB (a backlog goes up in several).
    pub const ARCHIVE_SEGMENT_MIB: u64 = 16;
    /// Log entries a node keeps for an archive that does not take them (unreachable,
    /// refusing) before it lets them go and the archive gets a gap.
    pub const ARCHIVE_MAX_HELD_ENTRIES: u64 = 1_000_000;
}

/// Smallest accepted `--cluster-secret` length.
pub const MIN_CLUSTER_SECRET_LEN: usize = 16;

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

    /// Comma-separated boundaries to create at start-up if missing, with idempotent event
    /// ids (X1): a write that repeats an earlier write's event ids and events unchanged gets
    /// that write's result and stores nothing; any other reuse of a stored id is refused
    /// with ALREADY_EXISTS. The option is fixed when a boundary is created: naming an
    /// existing plain boundary here only logs a warning. Empty by default.
    #[arg(long, env = "CAIRN_IDEMPOTENT_BOUNDARIES", value_delimiter = ',')]
    pub idempotent_boundaries: Vec<String>,

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

    /// Take the node id from the hostname instead of --node-id: a StatefulSet pod is named
    /// `<set>-<ordinal>`, and its node id is the ordinal + 1 (`$HOSTNAME`, else the kernel's
    /// hostname).
    #[arg(long, env = "CAIRN_NODE_ID_FROM_HOSTNAME")]
    pub node_id_from_hostname: bool,

    /// Address (host:port) other nodes use to reach this node's peer port. Defaults to this
    /// node's entry in --initial-members; required with --join.
    #[arg(long, env = "CAIRN_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,

    /// Peer port for Raft and the cluster API, used only in a cluster [default: 0.0.0.0:5006].
    #[arg(long, env = "CAIRN_PEER_LISTEN")]
    pub peer_listen: Option<SocketAddr>,

    /// The members of a new cluster, `id=host:port` of each peer port, this node included,
    /// e.g. "1=cairn-0:5006,2=cairn-1:5006,3=cairn-2:5006". On an empty data directory
    /// the node asks every member for its log: when all are empty the lowest id forms the
    /// cluster; when one has a log this node lost its state and rejoins without voting
    /// until it is a voter again. Restarts use the membership stored in the data directory.
    #[arg(
        long,
        env = "CAIRN_INITIAL_MEMBERS",
        value_delimiter = ',',
        conflicts_with = "join"
    )]
    pub initial_members: Vec<String>,

    /// Peer address (host:port) of any member of a running cluster: on first start this node
    /// asks it to add this node as a learner (promote it with `cairn cluster promote`).
    #[arg(long, env = "CAIRN_JOIN")]
    pub join: Option<String>,

    /// Shared secret every peer call carries (at least 16 characters). Required in a cluster;
    /// prefer --cluster-secret-file.
    #[arg(
        long,
        env = "CAIRN_CLUSTER_SECRET",
        hide_env_values = true,
        conflicts_with = "cluster_secret_file"
    )]
    pub cluster_secret: Option<String>,

    /// File holding the cluster secret (surrounding whitespace ignored), e.g. a mounted
    /// Kubernetes Secret.
    #[arg(long, env = "CAIRN_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,

    /// PEM certificate chain (leaf first) of this node on the peer port: it serves it, and
    /// presents it as its client certificate when it dials peers. Its SANs must name the
    /// host of --advertise-addr: peers accept Raft messages claiming to come from this
    /// node only with a certificate that names its advertised host. With --peer-tls-key
    /// and --peer-tls-ca the peer port speaks only mutual TLS. Re-read every
    /// --tls-reload-secs.
    #[arg(long, env = "CAIRN_PEER_TLS_CERT", requires_all = ["peer_tls_key", "peer_tls_ca"])]
    pub peer_tls_cert: Option<PathBuf>,

    /// PEM private key of --peer-tls-cert.
    #[arg(long, env = "CAIRN_PEER_TLS_KEY", requires = "peer_tls_cert")]
    pub peer_tls_key: Option<PathBuf>,

    /// PEM certificate of the cluster's CA: every peer's certificate (as server and as
    /// client) must chain to it.
    #[arg(long, env = "CAIRN_PEER_TLS_CA", requires = "peer_tls_cert")]
    pub peer_tls_ca: Option<PathBuf>,

    /// Let a cluster member whose peer port is not loopback-only run its peer traffic in
    /// plaintext (no --peer-tls-cert). Development only: the cluster secret, every event
    /// and every password hash then cross the network readable by anyone on the path.
    #[arg(long, env = "CAIRN_ALLOW_PLAINTEXT_PEERS")]
    pub allow_plaintext_peers: bool,

    /// Raft leader heartbeat interval in milliseconds.
    #[arg(long, env = "CAIRN_RAFT_HEARTBEAT_MS", default_value_t = defaults::RAFT_HEARTBEAT_MS)]
    pub raft_heartbeat_ms: u64,

    /// Shortest Raft election timeout in milliseconds (a random one up to twice this is
    /// used): how long followers wait without a heartbeat before electing a new leader.
    #[arg(long, env = "CAIRN_RAFT_ELECTION_TIMEOUT_MS", default_value_t = defaults::RAFT_ELECTION_TIMEOUT_MS)]
    pub raft_election_timeout_ms: u64,

    /// How long a write or linearizable read waits for a leader (e.g. during an election)
    /// before answering UNAVAILABLE, in milliseconds. A leader gives one write twice this
    /// to commit; a follower waits that and 2 s more for a forwarded one.
    #[arg(long, env = "CAIRN_LEADER_WAIT_MS", default_value_t = defaults::LEADER_WAIT_MS)]
    pub leader_wait_ms: u64,

    /// Lifetime of session tokens in seconds; each authenticated response extends it (up to
    /// --token-max-age-secs).
    #[arg(long, env = "CAIRN_TOKEN_TTL_SECS", default_value_t = defaults::TOKEN_TTL_SECS)]
    pub token_ttl_secs: u64,

    /// Longest life of a session in seconds, counted from the password login that began
    /// it: tokens handed out on later responses never outlive it, so a stolen token dies
    /// by then however often it is used. The client then logs in with its password again.
    #[arg(long, env = "CAIRN_TOKEN_MAX_AGE_SECS", default_value_t = defaults::TOKEN_MAX_AGE_SECS)]
    pub token_max_age_secs: u64,

    /// Largest request message accepted, in bytes; larger ones get OUT_OF_RANGE.
    #[arg(long, env = "CAIRN_MAX_MESSAGE_BYTES", default_value_t = defaults::MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,

    /// Largest event accepted, in bytes (its id, type, data and metadata as sent); a larger
    /// one is INVALID_ARGUMENT. The default is KurrentDB's largest append: a read page holds
    /// its events in memory and every event travels to every replica in one Raft entry.
    #[arg(long, env = "CAIRN_MAX_EVENT_BYTES", default_value_t = cairn_core::limits::DEFAULT_MAX_EVENT_BYTES)]
    pub max_event_bytes: usize,

    /// Byte budget of one read response (a GetEvents page, a subscription page): the page
    /// ends with the event that reaches it (at least one event), and the client continues
    /// from the last event it received. Keep the budget plus --max-event-bytes below what
    /// clients accept in one message (stock gRPC clients: 4 MiB).
    #[arg(long, env = "CAIRN_MAX_RESPONSE_BYTES", default_value_t = cairn_core::limits::DEFAULT_MAX_RESPONSE_BYTES)]
    pub max_response_bytes: usize,

    /// Open subscriptions one user may hold on this node; the next is RESOURCE_EXHAUSTED.
    #[arg(long, env = "CAIRN_MAX_SUBSCRIPTIONS_PER_USER", default_value_t = defaults::MAX_SUBSCRIPTIONS_PER_USER)]
    pub max_subscriptions_per_user: usize,

    /// Open subscriptions on this node, all users together; the next is RESOURCE_EXHAUSTED.
    #[arg(long, env = "CAIRN_MAX_SUBSCRIPTIONS", default_value_t = defaults::MAX_SUBSCRIPTIONS)]
    pub max_subscriptions: usize,

    /// Bytes of writes this node holds at once: waiting for Raft, forwarded to the leader,
    /// or (on the leader) forwarded to it by followers. A write beyond them is answered
    /// RESOURCE_EXHAUSTED at once, nothing written: retry after a pause.
    #[arg(long, env = "CAIRN_MAX_WRITE_BYTES_IN_FLIGHT", default_value_t = defaults::MAX_WRITE_BYTES_IN_FLIGHT)]
    pub max_write_bytes_in_flight: usize,

    /// Free space, in MiB, that writes leave on the data directory's filesystem: below it
    /// a write is answered RESOURCE_EXHAUSTED (reads go on), so that the disk never fills
    /// under RocksDB (which would stop the node). 0 turns the floor off.
    #[arg(long, env = "CAIRN_MIN_FREE_DISK_MB", default_value_t = defaults::MIN_FREE_DISK_MB)]
    pub min_free_disk_mb: u64,

    /// Build a Raft snapshot (which lets the log be truncated) every this many entries.
    #[arg(long, env = "CAIRN_SNAPSHOT_EVERY_ENTRIES", default_value_t = defaults::SNAPSHOT_EVERY_ENTRIES)]
    pub snapshot_every_entries: u64,

    /// Also build one after this many bytes of proposed commands (whichever comes first),
    /// so logs of large entries are truncated in time.
    #[arg(long, env = "CAIRN_SNAPSHOT_EVERY_BYTES", default_value_t = defaults::SNAPSHOT_EVERY_BYTES)]
    pub snapshot_every_bytes: u64,

    /// Raft log entries kept behind the latest snapshot: a follower further behind than
    /// this catches up by receiving the snapshot instead of the log.
    #[arg(long, env = "CAIRN_RAFT_LOG_KEPT", default_value_t = defaults::RAFT_LOG_KEPT)]
    pub raft_log_kept: u64,

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

    /// Threads that check and hash passwords (argon2id, ~19 MiB and tens of milliseconds
    /// each) [default: the number of cores]. They are the only ones that do: a flood of
    /// wrong passwords cannot take the threads storage reads run on.
    #[arg(long, env = "CAIRN_PASSWORD_CHECK_THREADS")]
    pub password_check_threads: Option<usize>,

    /// Password checks that may wait for a thread; beyond them a login is answered
    /// RESOURCE_EXHAUSTED at once [default: 4 per password-check thread].
    #[arg(long, env = "CAIRN_PASSWORD_CHECK_QUEUE")]
    pub password_check_queue: Option<usize>,

    /// Open connections the client port accepts; beyond them a new connection is closed
    /// at once (`cairn_connections_refused_total{port="client"}`).
    #[arg(long, env = "CAIRN_MAX_CONNECTIONS", default_value_t = crate::listeners::defaults::MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Open connections the peer port accepts.
    #[arg(long, env = "CAIRN_MAX_PEER_CONNECTIONS", default_value_t = crate::listeners::defaults::MAX_PEER_CONNECTIONS)]
    pub max_peer_connections: usize,

    /// Open connections the HTTP port (/metrics, probes) accepts.
    #[arg(long, env = "CAIRN_MAX_HTTP_CONNECTIONS", default_value_t = crate::listeners::defaults::MAX_HTTP_CONNECTIONS)]
    pub max_http_connections: usize,

    /// Concurrent HTTP/2 streams (calls and subscriptions) per connection, announced to
    /// clients in SETTINGS_MAX_CONCURRENT_STREAMS.
    #[arg(long, env = "CAIRN_MAX_STREAMS_PER_CONNECTION", default_value_t = crate::listeners::defaults::MAX_STREAMS_PER_CONNECTION)]
    pub max_streams_per_connection: u32,

    /// Seconds between HTTP/2 keepalive pings on the client and peer ports; a connection
    /// whose peer does not answer within --keepalive-timeout-secs is closed.
    #[arg(long, env = "CAIRN_KEEPALIVE_INTERVAL_SECS", default_value_t = crate::listeners::defaults::KEEPALIVE_INTERVAL_SECS)]
    pub keepalive_interval_secs: u64,

    /// Seconds a keepalive ping may go unanswered.
    #[arg(long, env = "CAIRN_KEEPALIVE_TIMEOUT_SECS", default_value_t = crate::listeners::defaults::KEEPALIVE_TIMEOUT_SECS)]
    pub keepalive_timeout_secs: u64,

    /// Seconds an HTTP-port client has to send a request's headers.
    #[arg(long, env = "CAIRN_HTTP_HEADER_READ_TIMEOUT_SECS", default_value_t = crate::listeners::defaults::HTTP_HEADER_READ_TIMEOUT_SECS)]
    pub http_header_read_timeout_secs: u64,

    /// PEM certificate chain (leaf first) the client port serves: with --tls-key, the
    /// client port speaks only TLS. Its SANs must name the addresses clients dial. Re-read
    /// every --tls-reload-secs: a renewed file reaches new connections, open ones keep
    /// theirs.
    #[arg(long, env = "CAIRN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "CAIRN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates of client certificates: with it, the client port requires every
    /// client to present a certificate that chains to one of them (mutual TLS). Users still
    /// authenticate with a password or token on top.
    #[arg(long, env = "CAIRN_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve the HTTP port (/metrics, probes) over TLS too, with --tls-cert's certificate
    /// and no client certificate asked for. Off by default: Prometheus and kubelet probes
    /// then need `scheme: https`.
    #[arg(long, env = "CAIRN_HTTP_TLS", requires = "tls_cert")]
    pub http_tls: bool,

    /// Seconds between checks of the TLS files for a renewed certificate.
    #[arg(long, env = "CAIRN_TLS_RELOAD_SECS", default_value_t = crate::tls::defaults::RELOAD_SECS)]
    pub tls_reload_secs: u64,

    /// Seconds a client has to complete its TLS handshake.
    #[arg(long, env = "CAIRN_TLS_HANDSHAKE_TIMEOUT_SECS", default_value_t = crate::tls::defaults::HANDSHAKE_TIMEOUT_SECS)]
    pub tls_handshake_timeout_secs: u64,

    /// Allow the first start of a clustered node, or of one whose client port listens on a
    /// non-loopback address, with the public default admin password. Development only:
    /// anyone who can reach the node can then administer it.
    #[arg(long, env = "CAIRN_ALLOW_DEFAULT_PASSWORD")]
    pub allow_default_password: bool,

    /// Start even if the data directory is accessible to other users (it holds password
    /// hashes and the token-signing key). Without it, such a directory owned by this user
    /// is made private at start-up, and one owned by another user is refused.
    #[arg(long, env = "CAIRN_ALLOW_INSECURE_PERMISSIONS")]
    pub allow_insecure_permissions: bool,

    /// Archive every committed log entry to this directory or s3://BUCKET/PREFIX, for
    /// restores to a position (`cairn restore --to-position`). Give it to every member: the
    /// leader ships segments, the others keep their log until it is archived, so a new
    /// leader takes over where the old one stopped.
    #[arg(long, env = "CAIRN_ARCHIVE_TO")]
    pub archive_to: Option<String>,

    /// Seconds between archive segments: the longest a committed write waits to be
    /// archived, plus the upload (the recovery point objective of a lost cluster).
    #[arg(long, env = "CAIRN_ARCHIVE_INTERVAL_SECS", default_value_t = defaults::ARCHIVE_INTERVAL_SECS,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub archive_interval_secs: u64,

    /// Largest archive segment in MiB (1 to 1024); a backlog goes up in several.
    #[arg(long, env = "CAIRN_ARCHIVE_SEGMENT_MIB", default_value_t = defaults::ARCHIVE_SEGMENT_MIB,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub archive_segment_mib: u64,

    /// Log entries kept for an archive that does not take them before they are let go
    /// (the archive then has a gap until the next base backup). Disk: up to this many
    /// entries of the Raft log.
    #[arg(long, env = "CAIRN_ARCHIVE_MAX_HELD_ENTRIES", default_value_t = defaults::ARCHIVE_MAX_HELD_ENTRIES,
          value_parser = clap::value_parser!(u64).range(1000..))]
    pub archive_max_held_entries: u64,

    /// On the first start only (an empty data directory), restore this backup first and
    /// serve it as a new cluster: DEST/NAME, or DEST for its newest complete backup (as
    /// `cairn restore --from`). For a group's first member: a node that joins ignores it
    /// (it copies the state from the group), a non-empty data directory too.
    #[arg(long, env = "CAIRN_RESTORE_FROM")]
    pub restore_from: Option<String>,

    /// With --restore-from: replay the archive up to this position (`COMMIT:PREPARE` or
    /// `end`), as `cairn restore --to-position`.
    #[arg(long, env = "CAIRN_RESTORE_TO_POSITION", requires_all = ["restore_from", "restore_archive_from"])]
    pub restore_to_position: Option<String>,

    /// The boundary whose position --restore-to-position is.
    #[arg(long, env = "CAIRN_RESTORE_BOUNDARY", requires = "restore_to_position")]
    pub restore_boundary: Option<String>,

    /// The archive to replay for --restore-to-position (the source cluster's --archive-to).
    #[arg(
        long,
        env = "CAIRN_RESTORE_ARCHIVE_FROM",
        requires = "restore_to_position"
    )]
    pub restore_archive_from: Option<String>,

    #[command(flatten)]
    pub s3: crate::backup_target::S3Args,

    /// Log format.
    #[arg(long, env = "CAIRN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter: comma-separated `target=level` directives and a default level, e.g.
    /// "info,cairn_server=debug,openraft=warn".
    #[arg(long, env = "CAIRN_LOG", default_value = "info,openraft=warn")]
    pub log: String,
}

/// Continuous archiving (`--archive-to`).
#[derive(Debug, Clone)]
pub struct ArchiveConfig {
    /// Where segments go (below `<cluster id>/`).
    pub to: crate::backup_target::Location,
    /// Time between segments.
    pub interval: Duration,
    /// Largest segment, bytes.
    pub segment_bytes: usize,
    /// Entries held for the archive at most.
    pub max_held_entries: u64,
}

/// A restore on the first start (`--restore-from`).
#[derive(Debug, Clone)]
pub struct StartFromBackup {
    /// The backup, or the location whose newest backup is restored.
    pub from: String,
    /// Where to replay the archive to.
    pub to_position: Option<String>,
    /// The boundary of `to_position`.
    pub boundary: Option<String>,
    /// The archive replayed.
    pub archive_from: Option<String>,
    /// How to reach a bucket.
    pub s3: crate::backup_target::S3Args,
}

/// Validated serve configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// A backup to restore on the first start, if any.
    pub restore: Option<StartFromBackup>,
    /// Continuous archiving, if on.
    pub archive: Option<ArchiveConfig>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// gRPC address.
    pub listen: SocketAddr,
    /// HTTP address.
    pub http_listen: SocketAddr,
    /// Boundaries to ensure at start-up (plain ones; see `idempotent_boundaries`).
    pub boundaries: Vec<String>,
    /// Boundaries to ensure at start-up with idempotent event ids (X1); none of them is
    /// also in `boundaries`.
    pub idempotent_boundaries: Vec<String>,
    /// The admin boundary (B5), also ensured at start-up.
    pub admin_boundary: String,
    /// Bootstrap admin name.
    pub admin_username: String,
    /// Bootstrap admin password.
    pub admin_password: String,
    /// Raft node id.
    pub node_id: u64,
    /// Advertised peer address (alone: informational).
    pub advertise_addr: String,
    /// Peer port and formation; `None` runs the node alone.
    pub cluster: Option<ClusterConfig>,
    /// Raft timing.
    pub timing: cairn_raft::RaftTiming,
    /// Wait for a leader before UNAVAILABLE.
    pub leader_wait: Duration,
    /// Token TTL.
    pub token_ttl: Duration,
    /// A session's longest life from its password login.
    pub token_max_age: Duration,
    /// Max request size.
    pub max_message_bytes: usize,
    /// Largest event.
    pub max_event_bytes: usize,
    /// Byte budget of a read response.
    pub max_response_bytes: usize,
    /// Subscriptions per user on this node.
    pub max_subscriptions_per_user: usize,
    /// Subscriptions on this node.
    pub max_subscriptions: usize,
    /// Bytes of writes held at once.
    pub max_write_bytes_in_flight: usize,
    /// Free-space floor of the data directory's filesystem (0: none).
    pub min_free_disk_bytes: u64,
    /// Keep a data directory others can access.
    pub allow_insecure_permissions: bool,
    /// Whether a first start may store the default admin password on an exposed node.
    pub allow_default_password: bool,
    /// Snapshot interval.
    pub snapshot_every_entries: u64,
    /// Snapshot interval in bytes of proposed commands.
    pub snapshot_every_bytes: u64,
    /// Log entries kept behind a snapshot.
    pub raft_log_kept: u64,
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
    /// Password-check threads and queue.
    pub password_limits: crate::password::PasswordLimits,
    /// Connection and HTTP/2 limits of the ports.
    pub connection_limits: crate::listeners::ConnectionLimits,
    /// TLS of the client (and optionally HTTP) port; `None`: plaintext.
    pub tls: Option<crate::tls::TlsConfig>,
}

/// How a clustered node finds its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Membership {
    /// Form (or, after the first start, rejoin) the group of these members.
    Initial(BTreeMap<u64, String>),
    /// Ask a member at one of these peer addresses (tried in turn) to add this node as a
    /// learner.
    Join(Vec<String>),
}

/// The peer side of a clustered node.
#[derive(Clone)]
pub struct ClusterConfig {
    /// Peer port.
    pub peer_listen: SocketAddr,
    /// How the node comes to belong to a group.
    pub membership: Membership,
    /// Shared secret of peer calls.
    pub secret: String,
    /// Mutual TLS of the peer port and of the calls to peers; `None`: plaintext.
    pub tls: Option<PeerTls>,
}

/// The peer port's mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTls {
    /// This node's certificate and key, and the cluster CA (`client_ca`).
    pub files: crate::tls::TlsFiles,
    /// Interval between checks of the files for a renewal.
    pub reload_interval: Duration,
    /// Time a peer has to complete its handshake.
    pub handshake_timeout: Duration,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("peer_listen", &self.peer_listen)
            .field("membership", &self.membership)
            .field("secret", &"<redacted>")
            .field("tls", &self.tls)
            .finish()
    }
}

/// Parses `--initial-members`: `id=host:port`, ids ≥ 1 and unique, addresses unique.
pub fn parse_members(entries: &[String]) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut members = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let bad = |why: &str| {
            ConfigError(format!(
                "--initial-members: {entry:?} {why} (expected id=host:port, e.g. 1=cairn-0:5006)"
            ))
        };
        let (id, addr) = entry.split_once('=').ok_or_else(|| bad("has no '='"))?;
        let id: u64 = id.trim().parse().map_err(|_| bad("has no numeric id"))?;
        if id == 0 {
            return Err(bad("has id 0 (ids start at 1)"));
        }
        let addr = addr.trim();
        validate_peer_addr(addr).map_err(|why| bad(&why))?;
        if members.values().any(|a: &String| a == addr) {
            return Err(bad("repeats another member's address"));
        }
        if members.insert(id, addr.to_string()).is_some() {
            return Err(bad("repeats another member's id"));
        }
    }
    Ok(members)
}

/// The cluster secret from the flag or the file (surrounding whitespace ignored), checked:
/// at least [`MIN_CLUSTER_SECRET_LEN`] printable ASCII characters. `None` when neither is set.
pub fn cluster_secret(
    secret: Option<&str>,
    file: Option<&std::path::Path>,
) -> Result<Option<String>, ConfigError> {
    let secret = match (secret, file) {
        (Some(secret), _) => secret.to_string(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("--cluster-secret-file {}: {e}", path.display())))?
            .trim()
            .to_string(),
        (None, None) => return Ok(None),
    };
    if secret.len() < MIN_CLUSTER_SECRET_LEN {
        return Err(ConfigError(format!(
            "the cluster secret must have at least {MIN_CLUSTER_SECRET_LEN} characters"
        )));
    }
    if !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError(
            "the cluster secret must be printable ASCII without spaces".into(),
        ));
    }
    Ok(Some(secret))
}

/// A peer address must be `host:port` with a port.
/// The host of a peer address `host:port` (an IPv6 host keeps its brackets); the whole
/// text when it has no port.
pub fn peer_host(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

fn validate_peer_addr(addr: &str) -> Result<(), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| "has no port".to_string())?;
    if host.is_empty() {
        return Err("has no host".to_string());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("has a bad port {port:?}")),
    }
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ServeArgs {
    /// Validates the flags.
    pub fn validate(self) -> Result<ServeConfig, ConfigError> {
        let node_id = if self.node_id_from_hostname {
            let hostname = std::env::var("HOSTNAME")
                .ok()
                .filter(|h| !h.is_empty())
                .or_else(|| {
                    std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .ok()
                        .map(|h| h.trim().to_string())
                })
                .ok_or_else(|| {
                    ConfigError("--node-id-from-hostname: this host has no hostname".into())
                })?;
            node_id_from_hostname(&hostname)?
        } else {
            self.node_id
        };
        let (cluster, advertise_addr) = self.cluster_config(node_id)?;
        let idempotent_boundaries =
            boundary_list(self.idempotent_boundaries, "--idempotent-boundaries")?;
        let mut boundaries = boundary_list(self.boundaries, "--boundaries")?;
        boundaries.retain(|b| !idempotent_boundaries.contains(b));
        let admin_boundary = self.admin_boundary.trim().to_string();
        validate_boundary_name(&admin_boundary)
            .map_err(|e| ConfigError(format!("--admin-boundary: {e}")))?;
        if self.admin_username.is_empty() {
            return Err(ConfigError("--admin-username must not be empty".into()));
        }
        if self.admin_password.is_empty() {
            return Err(ConfigError("--admin-password must not be empty".into()));
        }
        if node_id == 0 {
            return Err(ConfigError("--node-id must be ≥ 1".into()));
        }
        if self.token_ttl_secs == 0 {
            return Err(ConfigError("--token-ttl-secs must be ≥ 1".into()));
        }
        if self.token_max_age_secs == 0 {
            return Err(ConfigError("--token-max-age-secs must be ≥ 1".into()));
        }
        if self.max_message_bytes < 1024 {
            return Err(ConfigError("--max-message-bytes must be ≥ 1024".into()));
        }
        if self.max_event_bytes < 1024 || self.max_event_bytes > self.max_message_bytes {
            return Err(ConfigError(format!(
                "--max-event-bytes must be between 1024 and --max-message-bytes ({})",
                self.max_message_bytes
            )));
        }
        if self.max_response_bytes < self.max_event_bytes {
            return Err(ConfigError(
                "--max-response-bytes must be at least --max-event-bytes (a page holds at least one event)".into(),
            ));
        }
        for (flag, value) in [
            (
                "--max-subscriptions-per-user",
                self.max_subscriptions_per_user,
            ),
            ("--max-subscriptions", self.max_subscriptions),
        ] {
            if value == 0 {
                return Err(ConfigError(format!("{flag} must be ≥ 1")));
            }
        }
        if self.max_write_bytes_in_flight < self.max_message_bytes {
            return Err(ConfigError(
                "--max-write-bytes-in-flight must be at least --max-message-bytes (one largest write must fit)".into(),
            ));
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
        if self.raft_heartbeat_ms == 0 {
            return Err(ConfigError("--raft-heartbeat-ms must be ≥ 1".into()));
        }
        if self.raft_election_timeout_ms <= self.raft_heartbeat_ms {
            return Err(ConfigError(
                "--raft-election-timeout-ms must exceed --raft-heartbeat-ms (followers would elect between heartbeats)"
                    .into(),
            ));
        }
        let timing = cairn_raft::RaftTiming {
            heartbeat: Duration::from_millis(self.raft_heartbeat_ms),
            election_min: Duration::from_millis(self.raft_election_timeout_ms),
            election_max: Duration::from_millis(2 * self.raft_election_timeout_ms),
        };
        let advertise_addr = advertise_addr.unwrap_or_else(|| self.listen.to_string());
        let mut password_limits = crate::password::PasswordLimits::for_this_machine();
        if let Some(threads) = self.password_check_threads {
            if threads == 0 {
                return Err(ConfigError("--password-check-threads must be ≥ 1".into()));
            }
            password_limits.workers = threads;
            password_limits.queue = 4 * threads;
        }
        if let Some(queue) = self.password_check_queue {
            password_limits.queue = queue;
        }
        for (flag, value) in [
            ("--max-connections", self.max_connections),
            ("--max-peer-connections", self.max_peer_connections),
            ("--max-http-connections", self.max_http_connections),
            (
                "--max-streams-per-connection",
                self.max_streams_per_connection as usize,
            ),
            (
                "--keepalive-interval-secs",
                self.keepalive_interval_secs as usize,
            ),
            (
                "--keepalive-timeout-secs",
                self.keepalive_timeout_secs as usize,
            ),
            (
                "--http-header-read-timeout-secs",
                self.http_header_read_timeout_secs as usize,
            ),
            ("--tls-reload-secs", self.tls_reload_secs as usize),
            (
                "--tls-handshake-timeout-secs",
                self.tls_handshake_timeout_secs as usize,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError(format!("{flag} must be ≥ 1")));
            }
        }
        let connection_limits = crate::listeners::ConnectionLimits {
            max_connections: self.max_connections,
            max_peer_connections: self.max_peer_connections,
            max_http_connections: self.max_http_connections,
            max_streams_per_connection: self.max_streams_per_connection,
            keepalive_interval: Duration::from_secs(self.keepalive_interval_secs),
            keepalive_timeout: Duration::from_secs(self.keepalive_timeout_secs),
            http_header_read_timeout: Duration::from_secs(self.http_header_read_timeout_secs),
        };
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(crate::tls::TlsConfig {
                files: crate::tls::TlsFiles {
                    role: crate::tls::TlsRole::Client,
                    cert,
                    key,
                    client_ca: self.tls_client_ca,
                },
                http: self.http_tls,
                reload_interval: Duration::from_secs(self.tls_reload_secs),
                handshake_timeout: Duration::from_secs(self.tls_handshake_timeout_secs),
            }),
            (None, None) => None,
            _ => {
                return Err(ConfigError("--tls-cert and --tls-key go together".into()));
            }
        };
        let archive = match &self.archive_to {
            Some(to) => Some(ArchiveConfig {
                to: crate::backup_target::Location::parse(to, &self.s3)
                    .map_err(|e| ConfigError(format!("--archive-to: {e:#}")))?,
                interval: Duration::from_secs(self.archive_interval_secs),
                segment_bytes: usize::try_from(self.archive_segment_mib * 1024 * 1024)
                    .unwrap_or(usize::MAX),
                max_held_entries: self.archive_max_held_entries,
            }),
            None => None,
        };
        let restore = match self.restore_from {
            Some(from) => {
                if let Some(Membership::Initial(members)) = cluster.as_ref().map(|c| &c.membership)
                    && members.len() > 1
                {
                    return Err(ConfigError(
                        "--restore-from starts a new group of one from a backup: --initial-members must name only this node (the others join it and copy its state)".into(),
                    ));
                }
                Some(StartFromBackup {
                    from,
                    to_position: self.restore_to_position,
                    boundary: self.restore_boundary,
                    archive_from: self.restore_archive_from,
                    s3: self.s3.clone(),
                })
            }
            None => None,
        };
        Ok(ServeConfig {
            restore,
            archive,
            data_dir: self.data_dir,
            listen: self.listen,
            http_listen: self.http_listen,
            boundaries,
            idempotent_boundaries,
            admin_boundary,
            admin_username: self.admin_username,
            admin_password: self.admin_password,
            node_id,
            advertise_addr,
            cluster,
            timing,
            leader_wait: Duration::from_millis(self.leader_wait_ms),
            token_ttl: Duration::from_secs(self.token_ttl_secs),
            token_max_age: Duration::from_secs(self.token_max_age_secs),
            max_message_bytes: self.max_message_bytes,
            max_event_bytes: self.max_event_bytes,
            max_response_bytes: self.max_response_bytes,
            max_subscriptions_per_user: self.max_subscriptions_per_user,
            max_subscriptions: self.max_subscriptions,
            max_write_bytes_in_flight: self.max_write_bytes_in_flight,
            min_free_disk_bytes: self.min_free_disk_mb.saturating_mul(1024 * 1024),
            allow_insecure_permissions: self.allow_insecure_permissions,
            allow_default_password: self.allow_default_password,
            snapshot_every_entries: self.snapshot_every_entries,
            snapshot_every_bytes: self.snapshot_every_bytes,
            raft_log_kept: self.raft_log_kept,
            block_cache_bytes: self.block_cache_mb * 1024 * 1024,
            memtable_bytes: self.memtable_mb * 1024 * 1024,
            max_inflight_batches: self.max_inflight_batches,
            lock_wait: Duration::from_secs(self.lock_wait_secs),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            lease_ttl: Duration::from_secs(defaults::LEASE_TTL_SECS),
            lease_renew: Duration::from_secs(defaults::LEASE_RENEW_SECS),
            password_limits,
            connection_limits,
            tls,
        })
    }
}

impl ServeArgs {
    /// The peer side, when --initial-members or --join make this node a cluster member;
    /// and the advertised peer address.
    fn cluster_config(
        &self,
        node_id: u64,
    ) -> Result<(Option<ClusterConfig>, Option<String>), ConfigError> {
        let members = parse_members(&self.initial_members)?;
        let membership = match (&self.join, members.is_empty()) {
            (Some(_), false) => {
                return Err(ConfigError(
                    "--join and --initial-members exclude each other".into(),
                ));
            }
            (Some(join), true) => {
                validate_peer_addr(join)
                    .map_err(|why| ConfigError(format!("--join {join:?} {why}")))?;
                Membership::Join(vec![join.clone()])
            }
            // A StatefulSet pod beyond the members the cluster was formed with (scaled up
            // later) shares their pod template: it joins through them as a learner.
            (None, false) if !members.contains_key(&node_id) && self.advertise_addr.is_some() => {
                Membership::Join(members.values().cloned().collect())
            }
            (None, false) => Membership::Initial(members),
            (None, true) => {
                for (flag, set) in [
                    ("--peer-listen", self.peer_listen.is_some()),
                    ("--cluster-secret", self.cluster_secret.is_some()),
                    ("--cluster-secret-file", self.cluster_secret_file.is_some()),
                    ("--peer-tls-cert", self.peer_tls_cert.is_some()),
                ] {
                    if set {
                        return Err(ConfigError(format!(
                            "{flag} needs --initial-members or --join (without them the node runs alone)"
                        )));
                    }
                }
                return Ok((None, self.advertise_addr.clone()));
            }
        };
        let advertise_addr = match (&membership, &self.advertise_addr) {
            (_, Some(addr)) => {
                validate_peer_addr(addr)
                    .map_err(|why| ConfigError(format!("--advertise-addr {addr:?} {why}")))?;
                addr.clone()
            }
            (Membership::Initial(members), None) => members
                .get(&node_id)
                .cloned()
                .ok_or_else(|| {
                    ConfigError(format!(
                        "--initial-members has no entry for this node (--node-id {node_id}); add it, or set --advertise-addr to join through them"
                    ))
                })?,
            (Membership::Join(_), None) => {
                return Err(ConfigError(
                    "--join needs --advertise-addr: the address peers dial to reach this node".into(),
                ));
            }
        };
        if let Membership::Initial(members) = &membership {
            match members.get(&node_id) {
                None => {
                    return Err(ConfigError(format!(
                        "--initial-members must include this node (--node-id {node_id})"
                    )));
                }
                Some(addr) if *addr != advertise_addr => {
                    return Err(ConfigError(format!(
                        "--advertise-addr {advertise_addr} differs from this node's --initial-members entry {addr}"
                    )));
                }
                Some(_) => {}
            }
        }
        let secret = cluster_secret(self.cluster_secret.as_deref(), self.cluster_secret_file.as_deref())?
            .ok_or_else(|| {
                ConfigError(
                    "a cluster member needs --cluster-secret or --cluster-secret-file (peers authenticate each other with it)"
                        .into(),
                )
            })?;
        let peer_listen = match self.peer_listen {
            Some(addr) => addr,
            None => defaults::PEER_LISTEN
                .parse()
                .map_err(|e| ConfigError(format!("bad default peer address: {e}")))?,
        };
        let tls = match (&self.peer_tls_cert, &self.peer_tls_key, &self.peer_tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(PeerTls {
                files: crate::tls::TlsFiles {
                    role: crate::tls::TlsRole::Peer,
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: Some(ca.clone()),
                },
                reload_interval: Duration::from_secs(self.tls_reload_secs),
                handshake_timeout: Duration::from_secs(self.tls_handshake_timeout_secs),
            }),
            (None, None, None) => None,
            _ => {
                return Err(ConfigError(
                    "--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together".into(),
                ));
            }
        };
        if tls.is_none() && !peer_listen.ip().is_loopback() && !self.allow_plaintext_peers {
            return Err(ConfigError(format!(
                "the peer port {peer_listen} is reachable from other machines, and peer traffic \
                 carries the cluster secret, every event and the users' password hashes: give \
                 it mutual TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca; see \
                 docs/security.md#peer-tls), listen on loopback (--peer-listen 127.0.0.1:5006), \
                 or pass --allow-plaintext-peers on a development machine"
            )));
        }
        Ok((
            Some(ClusterConfig {
                peer_listen,
                membership,
                secret,
                tls,
            }),
            Some(advertise_addr),
        ))
    }
}

/// The node id of a StatefulSet pod: its ordinal (after the hostname's last `-`) + 1.
fn node_id_from_hostname(hostname: &str) -> Result<u64, ConfigError> {
    hostname
        .rsplit_once('-')
        .and_then(|(_, ordinal)| ordinal.parse::<u64>().ok())
        .and_then(|ordinal| ordinal.checked_add(1))
        .ok_or_else(|| {
            ConfigError(format!(
                "--node-id-from-hostname: hostname {hostname:?} does not end in -<ordinal> like a StatefulSet pod's"
            ))
        })
}

/// A flag's boundary names: trimmed, validated, sorted, without duplicates.
fn boundary_list(names: Vec<String>, flag: &str) -> Result<Vec<String>, ConfigError> {
    let mut names: Vec<String> = names
        .into_iter()
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect();
    names.sort();
    names.dedup();
    for b in &names {
        validate_boundary_name(b).map_err(|e| ConfigError(format!("{flag}: {e}")))?;
    }
    Ok(names)
}

/// How much longer a follower waits for a forwarded write than the leader's own bound on
/// it, so that the leader's answer (committed, refused, or "not within the bound") arrives
/// rather than the follower's guess.
pub const FORWARD_REPLY_MARGIN: Duration = Duration::from_secs(2);

impl ServeConfig {
    /// The longest a leader waits for one write to commit (its own or a forwarded one)
    /// before it answers that the outcome is unknown: a leader cut off from its majority
    /// keeps proposing until it hears of its successor.
    pub fn write_bound(&self) -> Duration {
        self.leader_wait * 2
    }

    /// How long a follower waits for the leader's answer to a forwarded write: longer than
    /// [`ServeConfig::write_bound`], so the leader always answers first.
    pub fn forward_timeout(&self) -> Duration {
        self.write_bound() + FORWARD_REPLY_MARGIN
    }

    /// The longest any node takes over one client write: finding a leader, then the
    /// forwarded write.
    pub fn client_write_bound(&self) -> Duration {
        self.leader_wait + self.forward_timeout()
    }

    /// A configuration for tests and embedding: loopback, ephemeral ports.
    pub fn for_test(data_dir: PathBuf) -> ServeConfig {
        ServeConfig {
            restore: None,
            archive: None,
            data_dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            boundaries: vec![defaults::BOUNDARIES.to_string()],
            idempotent_boundaries: Vec::new(),
            admin_boundary: defaults::ADMIN_BOUNDARY.to_string(),
            admin_username: defaults::ADMIN_USERNAME.to_string(),
            admin_password: defaults::ADMIN_PASSWORD.to_string(),
            node_id: defaults::NODE_ID,
            advertise_addr: "127.0.0.1:0".to_string(),
            cluster: None,
            timing: cairn_raft::RaftTiming::default(),
            leader_wait: Duration::from_millis(defaults::LEADER_WAIT_MS),
            token_ttl: Duration::from_secs(defaults::TOKEN_TTL_SECS),
            token_max_age: Duration::from_secs(defaults::TOKEN_MAX_AGE_SECS),
            max_message_bytes: defaults::MAX_MESSAGE_BYTES,
            max_event_bytes: cairn_core::limits::DEFAULT_MAX_EVENT_BYTES,
            max_response_bytes: cairn_core::limits::DEFAULT_MAX_RESPONSE_BYTES,
            max_subscriptions_per_user: defaults::MAX_SUBSCRIPTIONS_PER_USER,
            max_subscriptions: defaults::MAX_SUBSCRIPTIONS,
            max_write_bytes_in_flight: defaults::MAX_WRITE_BYTES_IN_FLIGHT,
            // Tests run wherever the temporary directory is; a floor there would make the
            // suite fail on a nearly full disk for reasons that are not the test's.
            min_free_disk_bytes: 0,
            allow_insecure_permissions: false,
            // Tests log in with the default credentials, on clustered nodes too.
            allow_default_password: true,
            snapshot_every_entries: defaults::SNAPSHOT_EVERY_ENTRIES,
            snapshot_every_bytes: defaults::SNAPSHOT_EVERY_BYTES,
            raft_log_kept: defaults::RAFT_LOG_KEPT,
            block_cache_bytes: 32 * 1024 * 1024,
            memtable_bytes: defaults::MEMTABLE_MB * 1024 * 1024,
            max_inflight_batches: defaults::MAX_INFLIGHT_BATCHES,
            lock_wait: Duration::from_secs(defaults::LOCK_WAIT_SECS),
            shutdown_grace: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(defaults::LEASE_TTL_SECS),
            lease_renew: Duration::from_secs(defaults::LEASE_RENEW_SECS),
            password_limits: crate::password::PasswordLimits::for_this_machine(),
            connection_limits: crate::listeners::ConnectionLimits::default(),
            tls: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<ServeConfig, String> {
        let mut argv = vec!["cairn", "serve"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Serve(args) => args.validate().map_err(|e| e.to_string()),
            Command::Cluster(_) | Command::Tokens(_) | Command::Backup(_) | Command::Restore(_) => {
                Err("not serve".to_string())
            }
        }
    }

    #[test]
    fn a_restore_on_start_is_for_a_group_of_one() {
        let with = |extra: &[&str]| {
            let mut args = vec![
                "--restore-from",
                "/backups",
                "--cluster-secret",
                SECRET,
                "--allow-plaintext-peers",
            ];
            args.extend_from_slice(extra);
            parse(&args)
        };
        let three = with(&[
            "--node-id",
            "1",
            "--initial-members",
            "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003",
        ])
        .expect_err("three initial members");
        assert!(three.contains("only this node"), "{three}");
        // A StatefulSet's later pods share the flags and join: they ignore it.
        let joiner = with(&[
            "--node-id",
            "2",
            "--initial-members",
            "1=127.0.0.1:7001",
            "--advertise-addr",
            "127.0.0.1:7002",
        ])
        .expect("a joiner accepts the flag");
        assert!(matches!(
            joiner.cluster.as_ref().map(|c| &c.membership),
            Some(Membership::Join(_))
        ));
        let first = with(&["--node-id", "1", "--initial-members", "1=127.0.0.1:7001"])
            .expect("the group's first member");
        assert_eq!(first.restore.map(|r| r.from).as_deref(), Some("/backups"));
        let positioned = parse(&["--restore-to-position", "5:4"]).expect_err("needs the rest");
        assert!(positioned.contains("--restore-from"), "{positioned}");
    }

    #[test]
    fn a_follower_waits_longer_for_a_forwarded_write_than_the_leader_takes_over_it() {
        for wait in ["1", "10000", "60000"] {
            let config = parse(&["--leader-wait-ms", wait]).expect("valid");
            assert_eq!(config.write_bound(), config.leader_wait * 2);
            assert!(config.forward_timeout() > config.write_bound(), "{wait}");
            assert!(
                config.client_write_bound() > config.forward_timeout(),
                "{wait}"
            );
        }
        let defaults = parse(&[]).expect("valid");
        assert_eq!(
            [
                defaults.write_bound(),
                defaults.forward_timeout(),
                defaults.client_write_bound()
            ],
            [20, 22, 32].map(Duration::from_secs),
            "the figures docs/replication.md gives"
        );
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!(c.listen.to_string(), "127.0.0.1:5005");
        assert_eq!(c.http_listen.to_string(), "127.0.0.1:9464");
        assert!(!c.allow_default_password);
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
        let c = parse(&["--boundaries", "a,b", "--idempotent-boundaries", "c,b,c"]).expect("valid");
        assert_eq!(c.boundaries, vec!["a"]);
        assert_eq!(c.idempotent_boundaries, vec!["b", "c"]);
        assert!(parse(&["--idempotent-boundaries", "ok,no-dash"]).is_err());
        assert!(parse(&[]).expect("valid").idempotent_boundaries.is_empty());
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

    #[test]
    fn tls_needs_a_certificate_and_its_key() {
        assert!(parse(&[]).expect("defaults").tls.is_none());
        for partial in [
            &["--tls-cert", "c.pem"][..],
            &["--tls-key", "k.pem"],
            &["--tls-client-ca", "ca.pem"],
            &["--http-tls"],
        ] {
            assert!(parse(partial).is_err(), "{partial:?} alone");
        }
        let c = parse(&["--tls-cert", "c.pem", "--tls-key", "k.pem", "--http-tls"])
            .expect("a pair is enough");
        let tls = c.tls.expect("TLS on");
        assert_eq!(tls.files.cert, PathBuf::from("c.pem"));
        assert_eq!(tls.files.client_ca, None);
        assert!(tls.http);
        assert_eq!(
            tls.reload_interval,
            Duration::from_secs(crate::tls::defaults::RELOAD_SECS)
        );
        let zero = [
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-reload-secs",
            "0",
        ];
        assert!(parse(&zero).is_err());
    }

    const SECRET: &str = "0123456789abcdef";

    #[test]
    fn without_peers_the_node_runs_alone() {
        let c = parse(&[]).expect("defaults are valid");
        assert!(c.cluster.is_none());
        assert_eq!(c.timing, cairn_raft::RaftTiming::default());
        let err = parse(&["--cluster-secret", SECRET]).expect_err("secret alone");
        assert!(err.contains("needs --initial-members or --join"), "{err}");
        assert!(parse(&["--peer-listen", "127.0.0.1:7000"]).is_err());
    }

    #[test]
    fn a_peer_port_off_loopback_needs_peer_tls() {
        let cluster = ["--initial-members", "1=a:5006", "--cluster-secret", SECRET];
        let err = parse(&cluster).expect_err("plaintext on 0.0.0.0");
        assert!(
            err.contains("--peer-tls-cert") && err.contains("--allow-plaintext-peers"),
            "{err}"
        );
        let on = |extra: &[&str]| parse(&[&cluster[..], extra].concat());
        let loopback = on(&["--peer-listen", "127.0.0.1:5006"]).expect("loopback");
        assert_eq!(loopback.cluster.expect("clustered").tls, None);
        on(&["--allow-plaintext-peers"]).expect("allowed for development");
        let tls = [
            "--peer-tls-cert",
            "n.crt",
            "--peer-tls-key",
            "n.key",
            "--peer-tls-ca",
            "ca.crt",
        ];
        let peer = on(&tls)
            .expect("mutual TLS")
            .cluster
            .expect("clustered")
            .tls
            .expect("on");
        assert_eq!(peer.files.role, crate::tls::TlsRole::Peer);
        assert_eq!(peer.files.client_ca, Some(PathBuf::from("ca.crt")));
        for partial in [&tls[..4], &tls[2..], &[tls[0], tls[1], tls[4], tls[5]][..]] {
            assert!(on(partial).is_err(), "{partial:?} alone");
        }
        let alone = parse(&tls).expect_err("peer TLS without a cluster");
        assert!(
            alone.contains("needs --initial-members or --join"),
            "{alone}"
        );
    }

    #[test]
    fn initial_members_form_a_cluster() {
        let members = "1=a:5006,2=b:5006,3=c:5006";
        let c = parse(&[
            "--allow-plaintext-peers",
            "--node-id",
            "2",
            "--initial-members",
            members,
            "--cluster-secret",
            SECRET,
        ])
        .expect("valid");
        let cluster = c.cluster.expect("clustered");
        assert_eq!(c.advertise_addr, "b:5006");
        assert_eq!(cluster.peer_listen.to_string(), defaults::PEER_LISTEN);
        let Membership::Initial(m) = cluster.membership else {
            panic!("initial members expected");
        };
        assert_eq!(m.len(), 3);
        assert_eq!(m[&3], "c:5006");
        // This node must be a member, with its own address.
        let err = parse(&[
            "--allow-plaintext-peers",
            "--node-id",
            "4",
            "--initial-members",
            members,
            "--cluster-secret",
            SECRET,
        ])
        .expect_err("not a member");
        assert!(err.contains("no entry for this node"), "{err}");
        // ... unless it says where peers reach it: then it joins through the members.
        let c = parse(&[
            "--allow-plaintext-peers",
            "--node-id",
            "4",
            "--initial-members",
            members,
            "--cluster-secret",
            SECRET,
            "--advertise-addr",
            "d:5006",
        ])
        .expect("a later member");
        assert_eq!(
            c.cluster.expect("clustered").membership,
            Membership::Join(vec!["a:5006".into(), "b:5006".into(), "c:5006".into()])
        );
        let err = parse(&[
            "--allow-plaintext-peers",
            "--node-id",
            "1",
            "--initial-members",
            members,
            "--cluster-secret",
            SECRET,
            "--advertise-addr",
            "z:5006",
        ])
        .expect_err("advertise differs");
        assert!(err.contains("differs"), "{err}");
        // A secret is required and must be long enough.
        let err = parse(&["--initial-members", members]).expect_err("no secret");
        assert!(err.contains("--cluster-secret"), "{err}");
        assert!(parse(&["--initial-members", members, "--cluster-secret", "short"]).is_err());
    }

    #[test]
    fn a_stateful_set_pod_takes_its_node_id_from_its_ordinal() {
        assert_eq!(node_id_from_hostname("orders-0").ok(), Some(1));
        assert_eq!(node_id_from_hostname("orders-eu-4").ok(), Some(5));
        for bad in [
            "orders",
            "orders-",
            "orders-x",
            "orders-18446744073709551615",
        ] {
            let err = node_id_from_hostname(bad).expect_err(bad).0;
            assert!(err.contains("-<ordinal>"), "{bad}: {err}");
        }
    }

    #[test]
    fn malformed_members_are_named() {
        for (bad, why) in [
            ("1=a:5006,1=b:5006", "repeats another member's id"),
            ("1=a:5006,2=a:5006", "repeats another member's address"),
            ("0=a:5006", "id 0"),
            ("x=a:5006", "no numeric id"),
            ("1=a", "no port"),
            ("1=a:0", "bad port"),
            ("1", "no '='"),
        ] {
            let err =
                parse(&["--initial-members", bad, "--cluster-secret", SECRET]).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn joining_needs_an_advertised_address() {
        let err = parse(&[
            "--allow-plaintext-peers",
            "--node-id",
            "4",
            "--join",
            "a:5006",
            "--cluster-secret",
            SECRET,
        ])
        .expect_err("no advertise");
        assert!(err.contains("--advertise-addr"), "{err}");
        let c = parse(&[
            "--allow-plaintext-peers",
            "--node-id",
            "4",
            "--join",
            "a:5006",
            "--cluster-secret",
            SECRET,
            "--advertise-addr",
            "d:5006",
        ])
        .expect("valid");
        assert_eq!(
            c.cluster.expect("clustered").membership,
            Membership::Join(vec!["a:5006".to_string()])
        );
        assert!(parse(&["--initial-members", "1=a:5006", "--join", "a:5006"]).is_err());
    }

    #[test]
    fn the_secret_can_come_from_a_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("secret");
        std::fs::write(&path, format!("{SECRET}\n")).expect("write");
        let c = parse(&[
            "--allow-plaintext-peers",
            "--initial-members",
            "1=a:5006",
            "--cluster-secret-file",
            path.to_str().expect("utf-8"),
        ])
        .expect("valid");
        assert_eq!(c.cluster.expect("clustered").secret, SECRET);
        let err = parse(&[
            "--allow-plaintext-peers",
            "--initial-members",
            "1=a:5006",
            "--cluster-secret-file",
            "/nonexistent/x",
        ])
        .expect_err("missing file");
        assert!(err.contains("/nonexistent/x"), "{err}");
    }

    #[test]
    fn election_timeouts_must_exceed_heartbeats() {
        assert!(
            parse(&[
                "--raft-heartbeat-ms",
                "500",
                "--raft-election-timeout-ms",
                "500"
            ])
            .is_err()
        );
        let c = parse(&[
            "--raft-heartbeat-ms",
            "50",
            "--raft-election-timeout-ms",
            "300",
        ])
        .expect("valid");
        assert_eq!(c.timing.election_max, Duration::from_millis(600));
    }
}
