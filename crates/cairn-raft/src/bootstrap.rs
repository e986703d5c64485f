//! Starting a node: open storage, start openraft over the given transport, and form a new
//! group when this node is the one to do it. Joining, leading and the start-up writes are
//! the callers' business: a node is useful as soon as openraft runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cairn_store::{Store, StoreOptions};
use openraft::{BasicNode, Config, SnapshotPolicy};

use crate::heads::HeadWatch;
use crate::log_store::LogStore;
use crate::network::{Network, PeerTransport};
use crate::node::RaftNode;
use crate::proposer::Proposer;
use crate::standing::{self, Standing};
use crate::state_machine::StateMachine;
use crate::{Raft, RaftError, RaftObserver};

/// Default: build a snapshot (and allow purging the log) every this many applied entries.
pub const DEFAULT_SNAPSHOT_EVERY_ENTRIES: u64 = 20_000;
/// Default: also build one after this many bytes of proposed commands, so a log of large
/// entries (seeding writes 1,000 events per entry) is purged long before the entry count
/// says so.
pub const DEFAULT_SNAPSHOT_EVERY_BYTES: u64 = 1024 * 1024 * 1024;
/// Default: log entries kept behind a snapshot, so a briefly lagging follower needs no
/// snapshot.
pub const DEFAULT_LOG_ENTRIES_KEPT: u64 = 1_000;
/// Interval between attempts to open a locked data directory.
const LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// Time a follower allows a leader to send one snapshot chunk and install the last one.
const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(30);

/// Raft timing. Elections start after a random timeout in `[election_min, election_max]`
/// without a heartbeat; the leader sends one every `heartbeat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftTiming {
    /// Leader heartbeat interval.
    pub heartbeat: Duration,
    /// Shortest election timeout.
    pub election_min: Duration,
    /// Longest election timeout.
    pub election_max: Duration,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat: Duration::from_millis(250),
            election_min: Duration::from_millis(1000),
            election_max: Duration::from_millis(2000),
        }
    }
}

/// How a node without Raft state comes to belong to a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Formation {
    /// Form a one-node group of this node (`cairn serve` without peers).
    Alone,
    /// A member of a group of several. Without Raft state it starts
    /// [`crate::Standing::Undecided`]: whether it forms a new group
    /// ([`RaftNode::form_new_group`]) or rejoins one ([`RaftNode::begin_rejoin`]) is for the
    /// caller, which can ask the other members, to find out.
    Member,
}

/// How to run the node's Raft group.
#[derive(Clone)]
pub struct NodeOptions {
    /// Raft node id.
    pub node_id: u64,
    /// Data directory (RocksDB under `db/`, snapshots under `snapshots/`).
    pub data_dir: PathBuf,
    /// Address peers use to reach this node.
    pub advertise_addr: String,
    /// What to do when the data directory holds no Raft state yet. Ignored on restart: the
    /// persisted membership is used.
    pub formation: Formation,
    /// Carries Raft messages to peers.
    pub transport: Arc<dyn PeerTransport>,
    /// Heartbeat and election timeouts.
    pub timing: RaftTiming,
    /// Snapshot policy: entries between snapshots.
    pub snapshot_every_entries: u64,
    /// Snapshot policy: approximate command bytes between snapshots (whichever of the two
    /// comes first).
    pub snapshot_every_bytes: u64,
    /// Log entries kept behind the last snapshot (a follower further behind than this
    /// catches up by snapshot install).
    pub log_entries_kept: u64,
    /// RocksDB tuning.
    pub store: StoreOptions,
    /// How long to wait for the data directory while another process holds it (e.g. the
    /// previous instance of this node is still shutting down).
    pub lock_wait: Duration,
    /// Receives apply and snapshot events (metrics).
    pub observer: Arc<dyn RaftObserver>,
    /// Batch entries the proposer keeps in flight (≥ 1).
    pub max_inflight_batches: usize,
    /// Keep log entries on disk until the archive holds them ([`LogStore::hold_for_archive`]).
    pub archive_hold: bool,
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("node_id", &self.node_id)
            .field("data_dir", &self.data_dir)
            .field("advertise_addr", &self.advertise_addr)
            .field("formation", &self.formation)
            .field("timing", &self.timing)
            .field("snapshot_every_entries", &self.snapshot_every_entries)
            .field("snapshot_every_bytes", &self.snapshot_every_bytes)
            .field("log_entries_kept", &self.log_entries_kept)
            .field("lock_wait", &self.lock_wait)
            .field("max_inflight_batches", &self.max_inflight_batches)
            .finish_non_exhaustive()
    }
}

/// Opens the store, waiting up to `lock_wait` while another process holds the directory.
async fn open_store(opts: &NodeOptions) -> Result<Store, RaftError> {
    let deadline = tokio::time::Instant::now() + opts.lock_wait;
    let mut warned = false;
    loop {
        let db_dir = opts.data_dir.join("db");
        let store_opts = opts.store.clone();
        let opened = tokio::task::spawn_blocking(move || Store::open(&db_dir, &store_opts))
            .await
            .map_err(|e| RaftError::Fatal(format!("storage open task failed: {e}")))?;
        match opened {
            Ok(store) => return Ok(store),
            Err(e) if e.is_locked() && tokio::time::Instant::now() < deadline => {
                if !warned {
                    tracing::warn!(
                        "data directory {} is locked by another process; waiting up to {}s for it",
                        opts.data_dir.display(),
                        opts.lock_wait.as_secs()
                    );
                    warned = true;
                }
                tokio::time::sleep(LOCK_RETRY_INTERVAL).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn raft_config(opts: &NodeOptions) -> Result<Config, RaftError> {
    let millis = |d: Duration| d.as_millis() as u64;
    Ok(Config {
        cluster_name: "cairn".to_string(),
        heartbeat_interval: millis(opts.timing.heartbeat),
        election_timeout_min: millis(opts.timing.election_min),
        election_timeout_max: millis(opts.timing.election_max),
        install_snapshot_timeout: millis(SNAPSHOT_CHUNK_TIMEOUT),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(opts.snapshot_every_entries),
        max_in_snapshot_log_to_keep: opts.log_entries_kept,
        // A follower further behind than what the log keeps after a snapshot catches up
        // from the snapshot.
        replication_lag_threshold: opts.snapshot_every_entries + opts.log_entries_kept,
        ..Config::default()
    }
    .validate()?)
}

/// Forms a new group of `members` (node id → peer address).
pub(crate) async fn initialise(
    raft: &Raft,
    members: &BTreeMap<u64, String>,
) -> Result<(), RaftError> {
    let nodes: BTreeMap<u64, BasicNode> = members
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    raft.initialize(nodes)
        .await
        .map_err(|e| RaftError::Initialize(e.to_string()))?;
    let ids: Vec<u64> = members.keys().copied().collect();
    tracing::info!(members = ?ids, "initialised a new raft group");
    Ok(())
}

impl RaftNode {
    /// Opens storage and starts openraft. A node alone without Raft state initialises a new
    /// group; any other node without it starts [`Standing::Undecided`], out of elections,
    /// until the caller learns whether the group is new ([`RaftNode::form_new_group`]) or
    /// has a log this node lost ([`RaftNode::begin_rejoin`]). A node with its state, or one
    /// that was rejoining when it stopped, goes on as it was. Returns as soon as openraft
    /// runs: whether and when this node leads is for the caller to watch.
    pub async fn start(opts: NodeOptions) -> Result<RaftNode, RaftError> {
        let store = open_store(&opts).await?;
        let heads = HeadWatch::default();
        let log_store = LogStore::new(store.db().clone())
            .map_err(|e| RaftError::Fatal(format!("failed to start the raft log syncer: {e}")))?;
        if opts.archive_hold {
            log_store.hold_for_archive();
        }
        let log = log_store.clone();
        let sm = StateMachine::new(
            store.clone(),
            opts.data_dir.join("snapshots"),
            heads.clone(),
            opts.observer.clone(),
        )?;
        let raft = Raft::new(
            opts.node_id,
            Arc::new(raft_config(&opts)?),
            Network::new(opts.transport.clone()),
            log_store,
            sm,
        )
        .await
        .map_err(|e| RaftError::Fatal(e.to_string()))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        let rejoining = standing::marker_path(&opts.data_dir).exists();
        let standing = match (&opts.formation, initialized, rejoining) {
            // A group of one has no one to lose writes to.
            (Formation::Alone, true, _) => Standing::Voting,
            (_, _, true) => Standing::Rejoining,
            (_, true, false) => Standing::Voting,
            (Formation::Alone, false, false) => {
                let alone = BTreeMap::from([(opts.node_id, opts.advertise_addr.clone())]);
                initialise(&raft, &alone).await?;
                Standing::Voting
            }
            (Formation::Member, false, false) => {
                tracing::info!(
                    node_id = opts.node_id,
                    "no raft state yet: this node does not vote until it knows whether the group is new"
                );
                Standing::Undecided
            }
        };
        let proposer = Proposer::spawn(
            raft.clone(),
            store.clone(),
            opts.observer.clone(),
            opts.max_inflight_batches,
            opts.snapshot_every_bytes,
        );
        Ok(RaftNode::new(
            raft,
            store,
            heads,
            opts.node_id,
            proposer,
            standing,
            opts.data_dir.clone(),
            log,
        ))
    }
}
