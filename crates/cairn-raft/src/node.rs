//! Starting a node: open storage, start openraft, form or rejoin the group.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::command::{Applied, Command, Outcome};
use cairn_store::{Store, StoreOptions};
use openraft::error::{ClientWriteError, RaftError as OpenRaftError};
use openraft::raft::ClientWriteResponse;
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::log_store::LogStore;
use crate::network::SingleNodeNetwork;
use crate::state_machine::StateMachine;
use crate::{Raft, RaftError, RaftObserver};

/// Default: build a snapshot (and allow purging the log) every this many applied entries.
pub const DEFAULT_SNAPSHOT_EVERY_ENTRIES: u64 = 20_000;
/// Default: also build one after this many bytes of proposed commands, so a log of large
/// entries (seeding writes 1,000 events per entry) is purged long before the entry count
/// says so.
pub const DEFAULT_SNAPSHOT_EVERY_BYTES: u64 = 1024 * 1024 * 1024;
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
    /// Snapshot policy: approximate command bytes between snapshots (whichever of the two
    /// comes first).
    pub snapshot_every_bytes: u64,
    /// RocksDB tuning.
    pub store: StoreOptions,
    /// How long to wait for the data directory while another process holds it (e.g. the
    /// previous instance of this node is still shutting down).
    pub lock_wait: Duration,
    /// Receives apply and snapshot events (metrics).
    pub observer: Arc<dyn RaftObserver>,
    /// Batch entries the proposer keeps in flight (≥ 1).
    pub max_inflight_batches: usize,
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("node_id", &self.node_id)
            .field("data_dir", &self.data_dir)
            .field("advertise_addr", &self.advertise_addr)
            .field("snapshot_every_entries", &self.snapshot_every_entries)
            .field("snapshot_every_bytes", &self.snapshot_every_bytes)
            .field("lock_wait", &self.lock_wait)
            .field("max_inflight_batches", &self.max_inflight_batches)
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

/// Largest number of commands folded into one Raft entry.
pub const MAX_BATCH_COMMANDS: usize = 1024;
/// Largest approximate size of the commands folded into one Raft entry.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Default number of batch entries proposed and not yet applied. While one is, small
/// commands accumulate into the next batch; only a batch of at least
/// [`PIPELINE_MIN_BATCH_BYTES`] is proposed alongside (see [`run_proposer`]).
pub const DEFAULT_MAX_INFLIGHT_BATCHES: usize = 2;
/// Smallest batch proposed while another is still in flight. Below it, waiting for the
/// running batch and folding more commands into one entry is cheaper (every entry has a
/// fixed cost in openraft, the log and the state machine: two small batches in flight
/// measured 20% slower than one for single-event writes); above it, appending and syncing
/// the next batch while the state machine applies the previous one keeps both cores busy.
pub const PIPELINE_MIN_BATCH_BYTES: usize = 64 * 1024;
/// Commands waiting for the proposer before writers are made to wait.
const PROPOSER_QUEUE: usize = 16 * 1024;

type Reply = oneshot::Sender<Result<Outcome, RaftError>>;
/// A command on its way to the proposer, with its reply channel and approximate size.
type Queued = (Command, Reply, usize);

/// Turns a Raft write failure into the error each waiting caller gets.
fn write_error(e: &OpenRaftError<u64, ClientWriteError<u64, BasicNode>>) -> RaftError {
    match e {
        OpenRaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            RaftError::NoLeader(format!("leader is {:?}", f.leader_id))
        }
        OpenRaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            RaftError::Fatal(e.to_string())
        }
        OpenRaftError::Fatal(f) => RaftError::Fatal(f.to_string()),
    }
}

/// Hands each caller its outcome once the entry carrying its command is applied.
fn distribute(
    result: Result<ClientWriteResponse<crate::TypeConfig>, RaftError>,
    mut replies: Vec<Reply>,
    batched: bool,
) {
    match result {
        Ok(response) if !batched => {
            if let Some(reply) = replies.pop() {
                let _ = reply.send(Ok(response.data));
            }
        }
        Ok(ClientWriteResponse {
            data: Ok(Applied::Batch(outcomes)),
            ..
        }) if outcomes.len() == replies.len() => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller that gave up waiting does not need its outcome.
                let _ = reply.send(Ok(outcome));
            }
        }
        Ok(other) => {
            tracing::error!(
                "a batch entry produced an unexpected outcome: {:?}",
                other.data
            );
            for reply in replies {
                let _ = reply.send(Err(RaftError::Fatal(
                    "a batch entry produced an unexpected outcome".to_string(),
                )));
            }
        }
        Err(e) => {
            let message = e.to_string();
            let unavailable = matches!(e, RaftError::NoLeader(_));
            for reply in replies {
                let _ = reply.send(Err(if unavailable {
                    RaftError::NoLeader(message.clone())
                } else {
                    RaftError::Fatal(message.clone())
                }));
            }
        }
    }
}

/// Approximate bytes of the commands sent to the proposer and not yet folded into a batch.
/// Writers add to it and wake the proposer once it crosses [`PIPELINE_MIN_BATCH_BYTES`]:
/// one atomic add per command instead of one task wake-up.
#[derive(Default)]
struct Backlog {
    bytes: AtomicUsize,
    large: Notify,
}

impl Backlog {
    fn add(&self, bytes: usize) {
        let before = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if before < PIPELINE_MIN_BATCH_BYTES && before + bytes >= PIPELINE_MIN_BATCH_BYTES {
            self.large.notify_one();
        }
    }

    fn take(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Commands folded so far into the next batch entry.
#[derive(Default)]
struct PendingBatch {
    commands: Vec<(Command, Reply)>,
    bytes: usize,
}

impl PendingBatch {
    fn push(&mut self, (command, reply, bytes): Queued, backlog: &Backlog) {
        backlog.take(bytes);
        self.bytes += bytes;
        self.commands.push((command, reply));
    }

    fn is_full(&self) -> bool {
        self.commands.len() >= MAX_BATCH_COMMANDS || self.bytes >= MAX_BATCH_BYTES
    }

    /// Folds in every command already waiting, up to the batch limits.
    fn fill_from(&mut self, queue: &mut mpsc::Receiver<Queued>, backlog: &Backlog) {
        while !self.is_full() {
            match queue.try_recv() {
                Ok(next) => self.push(next, backlog),
                Err(_) => break,
            }
        }
    }
}

/// The proposer: the one task that submits commands to Raft. Commands that arrive while
/// earlier batches are in flight are folded into one `Command::Batch` entry, so a burst of
/// concurrent writes costs one log append, one fsync and one apply pass (group commit).
/// openraft 0.9 runs its engine once per client write, so batching must happen here.
///
/// With nothing in flight a batch goes at once; while one is in flight, the next goes only
/// once it holds [`PIPELINE_MIN_BATCH_BYTES`] (and fewer than `max_inflight` are out), so
/// large writes pipeline and small ones keep the largest group commits.
async fn run_proposer(
    raft: Raft,
    mut queue: mpsc::Receiver<Queued>,
    backlog: Arc<Backlog>,
    observer: Arc<dyn RaftObserver>,
    max_inflight: usize,
    snapshot_every_bytes: u64,
) {
    let max_inflight = max_inflight.max(1);
    let in_flight = Arc::new(Semaphore::new(max_inflight));
    let finished = Arc::new(Notify::new());
    let mut proposed_since_snapshot: u64 = 0;
    let mut pending = PendingBatch::default();
    loop {
        if pending.commands.is_empty() {
            let Some(first) = queue.recv().await else {
                return;
            };
            pending.push(first, &backlog);
        }
        pending.fill_from(&mut queue, &backlog);
        let idle = in_flight.available_permits() == max_inflight;
        let permit = if idle || pending.bytes >= PIPELINE_MIN_BATCH_BYTES {
            in_flight.clone().try_acquire_owned().ok()
        } else {
            None
        };
        let Some(permit) = permit else {
            // Wait for a batch to finish, or for the queue to hold enough to make this batch
            // large enough to go alongside. Writers signal the latter (see `Backlog`), so
            // the proposer is not woken for every small command.
            tokio::select! {
                () = finished.notified() => {}
                () = backlog.large.notified() => {}
            }
            continue;
        };
        proposed_since_snapshot += pending.bytes as u64;
        if proposed_since_snapshot >= snapshot_every_bytes {
            proposed_since_snapshot = 0;
            // openraft's own policy counts entries only; a snapshot lets it purge the log.
            // It is built from what is applied by then, so it trails this batch slightly.
            if let Err(e) = raft.trigger().snapshot().await {
                tracing::warn!("failed to trigger a size-based snapshot: {e}");
            }
        }
        observer.proposed(pending.commands.len(), !idle);
        propose(&raft, std::mem::take(&mut pending), permit, &finished).await;
    }
}

/// A proposed batch's in-flight slot. Dropping it frees the slot, then wakes the proposer,
/// whichever way the batch ends.
struct InFlightSlot {
    permit: Option<OwnedSemaphorePermit>,
    finished: Arc<Notify>,
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        // The slot must be free before the proposer looks at it again.
        drop(self.permit.take());
        self.finished.notify_one();
    }
}

/// Submits one batch entry; a spawned task hands out the outcomes once it is applied, then
/// frees its in-flight slot.
async fn propose(
    raft: &Raft,
    batch: PendingBatch,
    permit: OwnedSemaphorePermit,
    finished: &Arc<Notify>,
) {
    let slot = InFlightSlot {
        permit: Some(permit),
        finished: finished.clone(),
    };
    let batched = batch.commands.len() > 1;
    let (commands, replies): (Vec<Command>, Vec<Reply>) = batch.commands.into_iter().unzip();
    let command = if batched {
        Command::Batch(commands)
    } else {
        commands
            .into_iter()
            .next()
            .unwrap_or(Command::Batch(Vec::new()))
    };
    match raft.client_write_ff(command).await {
        Ok(pending) => {
            tokio::spawn(async move {
                let result = match pending.await {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(e)) => Err(write_error(&OpenRaftError::APIError(e))),
                    Err(_) => Err(RaftError::Fatal("raft dropped a proposal".to_string())),
                };
                drop(slot);
                distribute(result, replies, batched);
            });
        }
        Err(fatal) => {
            drop(slot);
            distribute(Err(RaftError::Fatal(fatal.to_string())), replies, batched);
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
    proposer: mpsc::Sender<Queued>,
    backlog: Arc<Backlog>,
    proposer_task: Arc<tokio::task::JoinHandle<()>>,
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
        let log_store = LogStore::new(store.db().clone())
            .map_err(|e| RaftError::Fatal(format!("failed to start the raft log syncer: {e}")))?;
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
        let (proposer, queue) = mpsc::channel(PROPOSER_QUEUE);
        let backlog = Arc::new(Backlog::default());
        let proposer_task = Arc::new(tokio::spawn(run_proposer(
            raft.clone(),
            queue,
            backlog.clone(),
            opts.observer.clone(),
            opts.max_inflight_batches,
            opts.snapshot_every_bytes.max(1),
        )));
        let node = RaftNode {
            raft,
            store,
            heads,
            node_id: opts.node_id,
            proposer,
            backlog,
            proposer_task,
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

    /// Proposes a command and waits until it is committed and applied. Concurrent calls
    /// are folded into shared log entries by the proposer.
    pub async fn write(&self, command: Command) -> Result<Outcome, RaftError> {
        let (reply, outcome) = oneshot::channel();
        let bytes = command.approx_bytes();
        self.backlog.add(bytes);
        self.proposer
            .send((command, reply, bytes))
            .await
            .map_err(|_| RaftError::Fatal("the proposer has stopped".to_string()))?;
        outcome
            .await
            .map_err(|_| RaftError::Fatal("the proposer dropped a command".to_string()))?
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

    /// Stops openraft, flushes memtables and syncs the WAL.
    pub async fn shutdown(&self) -> Result<(), RaftError> {
        self.proposer_task.abort();
        self.raft
            .shutdown()
            .await
            .map_err(|e| RaftError::Fatal(format!("raft shutdown failed: {e}")))?;
        let store = self.store.clone();
        // Flushing memtables makes the next start fast: nothing to replay from the WAL.
        tokio::task::spawn_blocking(move || store.flush().and_then(|()| store.sync_wal()))
            .await
            .map_err(|e| RaftError::Fatal(format!("wal sync task failed: {e}")))??;
        Ok(())
    }
}
