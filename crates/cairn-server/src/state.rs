//! The node's shared state, handed to every service once storage and Raft are up.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use cairn_core::Error;
use cairn_core::boundary::{BoundaryInfo, validate_boundary_name};
use cairn_core::command::{Command, Outcome};
use cairn_raft::coalesce::Coalescer;
use cairn_raft::{RaftError, RaftNode};
use cairn_store::Store;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::peer::{ForwardReply, PeerClient};

/// Pause before asking again when the node a call was forwarded to no longer leads and
/// names no successor yet.
const LEADER_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Everything a request handler needs.
pub struct NodeState {
    /// The Raft node and its store.
    pub raft: RaftNode,
    /// Credentials and tokens.
    pub auth: Authenticator,
    /// Metric families.
    pub metrics: Arc<Metrics>,
    /// Validated configuration.
    pub config: ServeConfig,
    /// Random id of this process start (GetServerInfo.node_id).
    pub process_id: String,
    /// Cancelled when the node shuts down (ends subscriptions).
    pub shutdown: CancellationToken,
    /// Open subscriptions and how far behind they are.
    pub subscriptions: Arc<crate::subscription::Registry>,
    /// Other nodes' peer ports: forwarding, read indexes, membership calls.
    pub peers: Arc<PeerClient>,
    /// Read indexes asked of the leader (by its peer address): concurrent reads on this
    /// follower share one call, each waiting for a call that started after it arrived.
    pub leader_read_indexes: Coalescer<String, Result<Option<u64>, tonic::Status>>,
    /// Bytes of writes this node holds at once (its own callers' and, leading, its
    /// followers' forwarded ones).
    pub write_budget: WriteBudget,
    /// The free space writes leave on the data directory's filesystem.
    pub disk_floor: DiskFloor,
}

/// How long a reading of the data directory's free space is trusted.
const FREE_SPACE_TTL_MILLIS: u64 = 100;

/// Refuses writes while the data directory's filesystem has less than a floor of free
/// space, so that RocksDB never meets ENOSPC on this node's own writes (a storage error
/// stops Raft: the node would have to restart). Reads go on. RocksDB's own SstFileManager
/// would do it inside the engine, but the Rust binding does not expose it.
#[derive(Debug)]
pub struct DiskFloor {
    path: std::path::PathBuf,
    floor_bytes: u64,
    /// Milliseconds since `epoch` of the last reading, and the free bytes it found.
    read_at_millis: std::sync::atomic::AtomicU64,
    free_bytes: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
}

impl DiskFloor {
    /// A floor of `floor_bytes` (0: none) on the filesystem holding `path`.
    pub fn new(path: std::path::PathBuf, floor_bytes: u64) -> Self {
        DiskFloor {
            path,
            floor_bytes,
            read_at_millis: std::sync::atomic::AtomicU64::new(0),
            free_bytes: std::sync::atomic::AtomicU64::new(u64::MAX),
            epoch: std::time::Instant::now(),
        }
    }

    fn free_bytes(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let read_at = self.read_at_millis.load(Relaxed);
        if read_at != 0 && now.saturating_sub(read_at) < FREE_SPACE_TTL_MILLIS {
            return self.free_bytes.load(Relaxed);
        }
        let free = match rustix::fs::statvfs(&self.path) {
            Ok(fs) => fs.f_bavail.saturating_mul(fs.f_frsize),
            Err(e) => {
                // Unknown is not full: RocksDB reports a real ENOSPC itself.
                tracing::warn!(
                    "failed to read the free space of {}: {e}",
                    self.path.display()
                );
                u64::MAX
            }
        };
        self.free_bytes.store(free, Relaxed);
        self.read_at_millis.store(now.max(1), Relaxed);
        free
    }

    /// RESOURCE_EXHAUSTED while the filesystem is below the floor.
    pub fn check(&self) -> Result<(), Error> {
        if self.floor_bytes == 0 {
            return Ok(());
        }
        self.check_room(0)
    }

    /// RESOURCE_EXHAUSTED unless `bytes` more would leave the floor free (without a floor:
    /// unless they fit at all).
    pub fn check_room(&self, bytes: u64) -> Result<(), Error> {
        let free = self.free_bytes();
        if free < self.floor_bytes.saturating_add(bytes) {
            if bytes > 0 {
                return Err(Error::ResourceExhausted(format!(
                    "the data directory's filesystem has {} MiB free; {} MiB more are needed (and {} MiB kept free, --min-free-disk-mb)",
                    free / (1024 * 1024),
                    bytes.div_ceil(1024 * 1024),
                    self.floor_bytes / (1024 * 1024)
                )));
            }
            return Err(Error::ResourceExhausted(format!(
                "the data directory's filesystem has {} MiB free, below the {} MiB this node keeps (--min-free-disk-mb); nothing was written, and writes resume once space is freed",
                free / (1024 * 1024),
                self.floor_bytes / (1024 * 1024)
            )));
        }
        Ok(())
    }
}

/// Bounds the bytes of writes a node holds at once: every queue a write waits in (the
/// proposer's, the forwarding stream's, a leader's forwarded writes) holds a reservation
/// taken before it, so their sum stays below the budget however many clients write.
#[derive(Debug)]
pub struct WriteBudget {
    kib: Arc<tokio::sync::Semaphore>,
    total_kib: u32,
}

/// A write's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct WriteReservation {
    _permits: tokio::sync::OwnedSemaphorePermit,
}

impl WriteBudget {
    /// A budget of `bytes` (counted in KiB, rounded up).
    pub fn new(bytes: usize) -> Self {
        let total_kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS as u32);
        WriteBudget {
            kib: Arc::new(tokio::sync::Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    /// Reserves room for a command of about `bytes`, or RESOURCE_EXHAUSTED at once.
    pub fn reserve(&self, bytes: usize) -> Result<WriteReservation, Error> {
        let kib = u32::try_from(bytes.div_ceil(1024).max(1))
            .unwrap_or(u32::MAX)
            .min(self.total_kib);
        self.kib
            .clone()
            .try_acquire_many_owned(kib)
            .map(|permits| WriteReservation { _permits: permits })
            .map_err(|_| {
                Error::ResourceExhausted(format!(
                    "this node holds {} MiB of writes waiting to commit (--max-write-bytes-in-flight); nothing was written, retry after a pause",
                    self.total_kib / 1024
                ))
            })
    }
}

/// The read-index calls a follower makes to the leader, shared as [`Coalescer`] says.
pub fn leader_read_indexes(
    peers: Arc<PeerClient>,
) -> Coalescer<String, Result<Option<u64>, tonic::Status>> {
    Coalescer::spawn(move |addr: String| {
        let peers = peers.clone();
        async move { peers.read_index(&addr).await }
    })
}

impl std::fmt::Debug for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeState")
            .field("process_id", &self.process_id)
            .finish_non_exhaustive()
    }
}

/// Set once the node can serve; services answer UNAVAILABLE before that.
pub type Ready = Arc<OnceLock<Arc<NodeState>>>;

/// Nanoseconds since the Unix epoch (the leader's clock stamped into commands).
pub fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl NodeState {
    /// The store.
    pub fn store(&self) -> &Store {
        self.raft.store()
    }

    /// The ACTIVE boundary `name`: INVALID_ARGUMENT for a malformed name (B1, checked
    /// first), FAILED_PRECONDITION for an unknown or inactive one (B2).
    pub fn active_boundary(&self, name: &str) -> Result<BoundaryInfo, Error> {
        validate_boundary_name(name)?;
        self.store()
            .with_catalog(|c| c.active_boundary(name).cloned())
            .ok_or_else(|| Error::BoundaryNotActive(name.to_string()))
    }

    /// The active boundary `name`, for a write. A boundary created through another node
    /// may not have reached this one yet: before refusing, pass the read barrier (which
    /// brings this node's catalog up to everything committed) and look again.
    pub async fn active_boundary_for_write(&self, name: &str) -> Result<BoundaryInfo, Error> {
        match self.active_boundary(name) {
            Err(Error::BoundaryNotActive(_)) => {
                self.read_barrier().await?;
                self.active_boundary(name)
            }
            found => found,
        }
    }

    /// Replicates a command and returns its outcome. On a follower the command goes to the
    /// leader over the peer port and its outcome (conflicts included) comes back. Waits up
    /// to the configured leader wait while no leader is known; a command is retried only
    /// when the node it went to did not propose it, so nothing is applied twice.
    pub async fn propose(&self, command: Command) -> Result<Outcome, Error> {
        if !command.is_upkeep() {
            self.disk_floor.check()?;
        }
        let _reserved = self.write_budget.reserve(command.approx_bytes())?;
        let timer = self.metrics.raft_write_duration.start_timer();
        // A leader cut off from its majority keeps proposing until it learns of its
        // successor: bound the wait, the outcome is then unknown to us.
        // On a follower the forwarded write has its own, longer, bound (the leader's and a
        // margin), so the leader's answer comes back rather than this one.
        let bound = if self.raft.is_leader() {
            self.config.write_bound()
        } else {
            self.config.client_write_bound()
        };
        let outcome = match tokio::time::timeout(bound, self.propose_anywhere(command)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Error::Unavailable(format!(
                "the write was not committed within {} ms (is a majority of the cluster reachable?); it may or may not be applied",
                bound.as_millis()
            ))),
        };
        timer.observe_duration();
        outcome
    }

    async fn propose_anywhere(&self, command: Command) -> Result<Outcome, Error> {
        // The common case, on the leader (and always on a lone node): no copy of the command.
        if self.raft.is_leader() {
            return match self.raft.write(command).await {
                Ok(outcome) => Ok(outcome),
                Err(RaftError::ForwardToLeader { .. }) => Err(Error::Unavailable(
                    "this node stopped leading before it proposed the write; nothing was applied, retry".into(),
                )),
                Err(e) => {
                    tracing::warn!("failed to replicate a command: {e}");
                    Err(e.into())
                }
            };
        }
        let deadline = tokio::time::Instant::now() + self.config.leader_wait;
        loop {
            let (leader_id, leader_addr) = match self.raft.write(command.clone()).await {
                Err(RaftError::ForwardToLeader {
                    leader_id,
                    leader_addr,
                }) => (leader_id, leader_addr),
                Err(e) => {
                    tracing::warn!("failed to replicate a command: {e}");
                    return Err(e.into());
                }
                Ok(outcome) => return Ok(outcome),
            };
            match (leader_id, leader_addr) {
                (Some(id), Some(addr)) if id != self.raft.node_id() => {
                    match self.peers.forward(&addr, &command).await {
                        Ok(ForwardReply::Outcome(outcome)) => {
                            let result = if outcome.is_ok() {
                                "applied"
                            } else {
                                "rejected"
                            };
                            self.metrics
                                .forwarded_writes
                                .with_label_values(&[result])
                                .inc();
                            return Ok(outcome);
                        }
                        // It lost leadership before proposing: ask whoever leads now.
                        Ok(ForwardReply::NotLeader { .. }) => {
                            self.wait_for_a_leader(deadline).await?;
                            tokio::time::sleep(LEADER_RETRY_PAUSE).await;
                        }
                        Ok(ForwardReply::Unavailable(message)) => {
                            self.metrics
                                .forwarded_writes
                                .with_label_values(&["unavailable"])
                                .inc();
                            return Err(Error::Unavailable(format!(
                                "the leader (node {id}) could not replicate the write, which may or may not be applied: {message}"
                            )));
                        }
                        Err(status) => {
                            self.metrics
                                .forwarded_writes
                                .with_label_values(&["unavailable"])
                                .inc();
                            tracing::warn!(
                                "failed to forward a write to the leader, node {id} at {addr}: {status}"
                            );
                            return Err(Error::Unavailable(format!(
                                "lost contact with the leader (node {id}) while forwarding the write, which may or may not be applied: {}",
                                status.message()
                            )));
                        }
                    }
                }
                _ => self.wait_for_a_leader(deadline).await?,
            }
        }
    }

    /// Waits until some node leads, or answers UNAVAILABLE at `deadline`.
    async fn wait_for_a_leader(&self, deadline: tokio::time::Instant) -> Result<(), Error> {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            return Err(self.no_leader());
        }
        match self.raft.wait_for_leader(remaining).await {
            Ok(_) => Ok(()),
            Err(RaftError::Timeout(_)) => Err(self.no_leader()),
            Err(e) => Err(e.into()),
        }
    }

    fn no_leader(&self) -> Error {
        Error::Unavailable(format!(
            "no leader was elected within {} ms: a majority of the cluster is unreachable from node {}",
            self.config.leader_wait.as_millis(),
            self.raft.node_id()
        ))
    }

    /// Proposes and flattens: a domain rejection becomes the error.
    pub async fn execute(&self, command: Command) -> Result<cairn_core::command::Applied, Error> {
        self.propose(command).await?
    }

    /// Linearizable read barrier: returns once this node has applied everything committed
    /// before the call. The leader confirms its leadership with a quorum; a follower asks
    /// the leader for its read index and waits until it has applied that far.
    pub async fn read_barrier(&self) -> Result<(), Error> {
        let bound = self.config.leader_wait * 2;
        match tokio::time::timeout(bound, self.linearize()).await {
            Ok(result) => result,
            Err(_) => Err(Error::Unavailable(format!(
                "could not confirm a linearizable read within {} ms: is a majority of the cluster reachable?",
                bound.as_millis()
            ))),
        }
    }

    async fn linearize(&self) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + self.config.leader_wait;
        loop {
            let (leader_id, leader_addr) = match self.raft.read_barrier().await {
                Ok(()) => return Ok(()),
                Err(RaftError::ForwardToLeader {
                    leader_id,
                    leader_addr,
                }) => (leader_id, leader_addr),
                Err(e) => return Err(e.into()),
            };
            match (leader_id, leader_addr) {
                (Some(id), Some(addr)) if id != self.raft.node_id() => {
                    let timer = self.metrics.read_index_wait.start_timer();
                    let asked = self.leader_read_indexes.call(addr).await;
                    let index = match asked.unwrap_or_else(|| {
                        Err(tonic::Status::unavailable("the node is shutting down"))
                    }) {
                        Ok(Some(index)) => index,
                        // The node named has lost leadership: ask its successor.
                        Ok(None) => {
                            timer.stop_and_discard();
                            self.wait_for_a_leader(deadline).await?;
                            tokio::time::sleep(LEADER_RETRY_PAUSE).await;
                            continue;
                        }
                        Err(status) => {
                            timer.stop_and_discard();
                            return Err(Error::Unavailable(format!(
                                "failed to get a read index from the leader (node {id}): {}",
                                status.message()
                            )));
                        }
                    };
                    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let applied = self.raft.wait_applied(index, remaining).await;
                    timer.observe_duration();
                    return applied.map_err(Error::from);
                }
                _ => self.wait_for_a_leader(deadline).await?,
            }
        }
    }

    /// Runs blocking store work off the async threads.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T, Error>
    where
        F: FnOnce(&Store) -> Result<T, cairn_store::StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let store = self.store().clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| Error::internal(format!("storage task failed: {e}")))?
            .map_err(|e| {
                tracing::error!("storage read failed: {e}");
                Error::from(e)
            })
    }
}
