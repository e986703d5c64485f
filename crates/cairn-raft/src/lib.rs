//! Cairn on openraft: the type configuration, the RocksDB log store, the state-machine
//! adapter over `cairn-store`, and node bootstrap.
//!
//! Every state change goes through [`RaftNode::write`] (openraft `client_write`), so the
//! leader's log order is the linearization order of every CCC check, on one node or many.

// openraft's storage traits require its `StorageError` (224 bytes) as the error type; our
// helpers return it unboxed so `?` flows into the trait methods without conversions.
#![allow(clippy::result_large_err)]

pub mod archive;
mod bootstrap;
pub mod coalesce;
pub mod codec;
mod heads;
mod log_store;
mod network;
mod node;
mod planner;
mod proposal;
mod proposer;
mod standing;
mod state_machine;

pub use bootstrap::{
    DEFAULT_LOG_ENTRIES_KEPT, DEFAULT_SNAPSHOT_EVERY_BYTES, DEFAULT_SNAPSHOT_EVERY_ENTRIES,
    Formation, NodeOptions, RaftTiming,
};
pub use heads::HeadWatch;
pub use log_store::LogStore;
pub use network::{Network, NoPeers, PeerLink, PeerTransport, RpcResult};
pub use node::{ClusterView, Member, MemberAddr, RaftNode, Role};
pub use proposal::Proposal;
pub use proposer::DEFAULT_MAX_INFLIGHT_BATCHES;
pub use standing::Standing;
pub use state_machine::{MAX_SNAPSHOT_ID_BYTES, StateMachine, applied_position, valid_snapshot_id};

/// Receives state-machine events, so the server can export metrics without this crate
/// knowing about Prometheus.
pub trait RaftObserver: Send + Sync + 'static {
    /// The proposer submitted one log entry folding `commands` writes; `overlapping` when
    /// another entry was still in flight (large writes pipelining).
    fn proposed(&self, commands: usize, overlapping: bool);
    /// A batch of `entries` committed entries was applied in `elapsed`.
    fn applied(&self, entries: usize, elapsed: Duration);
    /// A snapshot was built.
    fn snapshot_built(&self);
    /// A snapshot received from the leader was installed.
    fn snapshot_installed(&self);
    /// An entry planned by its leader was applied: its rows written (`held`), or nothing
    /// (the state had changed since the plan; the leader proposes its writes again).
    fn plan_applied(&self, held: bool);
}

/// An observer that ignores everything (tests, tools).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl RaftObserver for NoObserver {
    fn proposed(&self, _commands: usize, _overlapping: bool) {}
    fn applied(&self, _entries: usize, _elapsed: Duration) {}
    fn snapshot_built(&self) {}
    fn snapshot_installed(&self) {}
    fn plan_applied(&self, _held: bool) {}
}

use std::time::Duration;

use cairn_core::command::Outcome;

openraft::declare_raft_types!(
    /// Cairn's openraft type configuration.
    pub TypeConfig:
        D = Proposal,
        R = Outcome,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft handle type.
pub type Raft = openraft::Raft<TypeConfig>;
/// openraft's storage error for our node id.
pub type StorageError = openraft::StorageError<u64>;

/// Errors of the Raft layer.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// The state machine's storage failed.
    #[error(transparent)]
    Store(#[from] cairn_store::StoreError),
    /// openraft's storage layer failed.
    #[error("raft storage: {0}")]
    Storage(#[from] StorageError),
    /// openraft rejected its configuration.
    #[error("invalid raft configuration: {0}")]
    Config(#[from] openraft::ConfigError),
    /// openraft stopped (fatal error or shutdown).
    #[error("raft stopped: {0}")]
    Fatal(String),
    /// No leader is known; retry later.
    #[error("no leader: {0}")]
    NoLeader(String),
    /// This node does not lead. The command was not applied here and never will be, so the
    /// leader (when one is known) may take it.
    #[error("{}", forward_message(*.leader_id, .leader_addr.as_deref()))]
    ForwardToLeader {
        /// The leader's node id, if known.
        leader_id: Option<u64>,
        /// The leader's peer address, if known.
        leader_addr: Option<String>,
    },
    /// A membership change was refused (unknown learner, change in progress, …).
    #[error("membership change refused: {0}")]
    Membership(String),
    /// Initialising the group failed.
    #[error("failed to initialise the raft group: {0}")]
    Initialize(String),
    /// Timed out waiting for the node to become ready.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// The marker that keeps a node that lost its state from voting could not be written
    /// or removed.
    #[error("failed to record whether this node may vote: {0}")]
    Standing(String),
}

fn forward_message(leader_id: Option<u64>, leader_addr: Option<&str>) -> String {
    match (leader_id, leader_addr) {
        (Some(id), Some(addr)) => format!("this node does not lead: node {id} at {addr} does"),
        (Some(id), None) => format!("this node does not lead: node {id} does"),
        (None, _) => "this node does not lead and no leader is known yet".to_string(),
    }
}

impl RaftError {
    /// The same failure for another caller waiting on the same batch (storage errors are
    /// not `Clone`; their text is what the caller needs).
    pub(crate) fn for_another_caller(&self) -> RaftError {
        match self {
            RaftError::ForwardToLeader {
                leader_id,
                leader_addr,
            } => RaftError::ForwardToLeader {
                leader_id: *leader_id,
                leader_addr: leader_addr.clone(),
            },
            RaftError::NoLeader(m) => RaftError::NoLeader(m.clone()),
            RaftError::Timeout(what) => RaftError::Timeout(what),
            other => RaftError::Fatal(other.to_string()),
        }
    }
}

impl From<RaftError> for cairn_core::Error {
    fn from(e: RaftError) -> Self {
        match e {
            RaftError::NoLeader(_)
            | RaftError::ForwardToLeader { .. }
            | RaftError::Fatal(_)
            | RaftError::Timeout(_) => cairn_core::Error::Unavailable(e.to_string()),
            RaftError::Membership(m) => cairn_core::Error::FailedPrecondition(m),
            RaftError::Store(_)
            | RaftError::Storage(_)
            | RaftError::Config(_)
            | RaftError::Initialize(_)
            | RaftError::Standing(_) => cairn_core::Error::Internal(e.to_string()),
        }
    }
}
