//! Starting a node: open storage, start openraft, form or rejoin the group.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::command::{Command, Outcome};
use cairn_store::{Store, StoreOptions};
use openraft::error::{ClientWriteError, RaftError as OpenRaftError};
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::sync::watch;

use crate::log_store::LogStore;
use crate::network::SingleNodeNetwork;
use crate::state_machine::StateMachine;
use crate::{Raft, RaftError, RaftObserver};

/// Default: build a snapshot (and allow purging the log) every this many applied entries.
pub const DEFAULT_SNAPSHOT_EVERY_ENTRIES: u64 = 20_000;
/// Log entries kept behind a snapshot, so a briefly lagging follower needs no snapshot.
pub const LOG_ENTRIES_KEPT_AFTER_SNAPSHOT: u64 = 1_000;
/// Interval between attempts to open a locked data directory.
const LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// How long start-up waits for this node to lead its one-node group.
pub const LEADERSHIP_TIMEOUT: Duration = Duration::from_secs(30);

/// How to run the node's Raft group.
#[derive(Clone)]
pub struct NodeOptions {
    /// Raft node id.
    pub node_id: u64,
    /// Data directory (RocksDB under `db/`, snapshots under `snapshots/`).
    pub data_dir: PathBuf,
    /// Address peers would use to reach this node.
    pub advertise_addr: String,
    /// Snapshot policy: entries between snapshots.
    pub snapshot_every_entries: u64,
    /// RocksDB tuning.
    pub store: StoreOptions,
    /// How long to wait for the data directory while another process holds it (e.g. the
    /// previous instance of this node is still shutting down).
    pub lock_wait: Duration,
    /// Receives apply and snapshot events (metrics).
    pub observer: Arc<dyn RaftObserver>,
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("node_id", &self.node_id)
            .field("data_dir", &self.data_dir)
            .field("advertise_addr", &self.advertise_addr)
            .field("snapshot_every_entries", &self.snapshot_every_entries)
            .field("lock_wait", &self.lock_wait)
            .finish_non_exhaustive()
    }
}

/// Per-boundary `watch` channels of the head (number of events), so subscriptions sleep
/// until their boundary grows instead of polling.
#[derive(Clone, Default)]
pub struct HeadWatch {
    senders: Arc<Mutex<HashMap<u32, watch::Sender<u64>>>>,
}

impl HeadWatch {
    /// A receiver for boundary `bid`, starting at its current head.
    pub fn subscribe(&self, store: &Store, bid: u32) -> watch::Receiver<u64> {
        let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        // Drop channels nobody listens to any more.
        senders.retain(|_, s| s.receiver_count() > 0);
        senders
            .entry(bid)
            .or_insert_with(|| watch::channel(store.event_count(bid)).0)
            .subscribe()
    }

    /// Publishes boundary `name`'s head after an apply.
    pub fn publish(&self, store: &Store, name: &str) {
        let Some(bid) = store.with_catalog(|c| c.boundaries.get(name).map(|b| b.id)) else {
            return;
        };
        let senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = senders.get(&bid) {
            sender.send_replace(store.event_count(bid));
        }
    }

    /// Publishes every head (after a snapshot install replaced the state).
    pub fn publish_all(&self, store: &Store) {
        let senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        for (bid, sender) in senders.iter() {
            sender.send_replace(store.event_count(*bid));
        }
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

/// A running Raft node with its store.
#[derive(Clone)]
pub struct RaftNode {
    raft: Raft,
    store: Store,
    heads: HeadWatch,
    node_id: u64,
}

impl std::fmt::Debug for RaftNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftNode")
            .field("node_id", &self.node_id)
            .finish()
    }
}

impl RaftNode {
    /// Opens storage and starts openraft. On first start the node initialises a one-node
    /// group; on restart it reuses the persisted membership. Returns once it leads.
    pub async fn start(opts: NodeOptions) -> Result<RaftNode, RaftError> {
        let store = open_store(&opts).await?;
        let heads = HeadWatch::default();
        let log_store = LogStore::new(store.db().clone());
        let sm = StateMachine::new(
            store.clone(),
            opts.data_dir.join("snapshots"),
            heads.clone(),
            opts.observer.clone(),
        )?;
        let config = Config {
            cluster_name: "cairn".to_string(),
            heartbeat_interval: 250,
            election_timeout_min: 1000,
            election_timeout_max: 2000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(opts.snapshot_every_entries),
            max_in_snapshot_log_to_keep: LOG_ENTRIES_KEPT_AFTER_SNAPSHOT,
            ..Config::default()
        }
        .validate()?;
        let raft = Raft::new(
            opts.node_id,
            Arc::new(config),
            SingleNodeNetwork,
            log_store,
            sm,
        )
        .await
        .map_err(|e| RaftError::Fatal(e.to_string()))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        if !initialized {
            let members = BTreeMap::from([(
                opts.node_id,
                BasicNode {
                    addr: opts.advertise_addr.clone(),
                },
            )]);
            raft.initialize(members)
                .await
                .map_err(|e| RaftError::Initialize(e.to_string()))?;
            tracing::info!(
                node_id = opts.node_id,
                "initialised a new one-node raft group"
            );
        }
        let node = RaftNode {
            raft,
            store,
            heads,
            node_id: opts.node_id,
        };
        node.raft
            .wait(Some(LEADERSHIP_TIMEOUT))
            .current_leader(opts.node_id, "this node leads its group")
            .await
            .map_err(|_| RaftError::Timeout("leadership"))?;
        // Everything committed before the restart is applied before we serve.
        node.read_barrier().await?;
        Ok(node)
    }

    /// Proposes a command and waits until it is committed and applied.
    pub async fn write(&self, command: Command) -> Result<Outcome, RaftError> {
        match self.raft.client_write(command).await {
            Ok(response) => Ok(response.data),
            Err(OpenRaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(RaftError::NoLeader(format!("leader is {:?}", f.leader_id)))
            }
            Err(OpenRaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(RaftError::Fatal(e.to_string()))
            }
            Err(OpenRaftError::Fatal(f)) => Err(RaftError::Fatal(f.to_string())),
        }
    }

    /// Waits until this node has applied everything committed when the call started
    /// (linearizable reads).
    pub async fn read_barrier(&self) -> Result<(), RaftError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(OpenRaftError::APIError(e)) => Err(RaftError::NoLeader(e.to_string())),
            Err(OpenRaftError::Fatal(f)) => Err(RaftError::Fatal(f.to_string())),
        }
    }

    /// The state machine store (reads).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Head watch channels.
    pub fn heads(&self) -> &HeadWatch {
        &self.heads
    }

    /// The openraft handle (metrics).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// This node's Raft id.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Stops openraft and flushes the WAL.
    pub async fn shutdown(&self) -> Result<(), RaftError> {
        self.raft
            .shutdown()
            .await
            .map_err(|e| RaftError::Fatal(format!("raft shutdown failed: {e}")))?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.sync_wal())
            .await
            .map_err(|e| RaftError::Fatal(format!("wal sync task failed: {e}")))??;
        Ok(())
    }
}
