//! Cairn on openraft: the type configuration, the RocksDB log store, the state-machine
//! adapter over `cairn-store`, and node bootstrap.
//!
//! Every state change goes through [`RaftNode::write`] (openraft `client_write`), so the
//! leader's log order is the linearization order of every CCC check, on one node or many.

// openraft's storage traits require its `StorageError` (224 bytes) as the error type; our
// helpers return it unboxed so `?` flows into the trait methods without conversions.
#![allow(clippy::result_large_err)]

mod codec;
mod log_store;
mod network;
mod node;
mod state_machine;

pub use log_store::LogStore;
pub use network::SingleNodeNetwork;
pub use node::{
    DEFAULT_MAX_INFLIGHT_BATCHES, DEFAULT_SNAPSHOT_EVERY_BYTES, DEFAULT_SNAPSHOT_EVERY_ENTRIES,
    HeadWatch, LEADERSHIP_TIMEOUT, NodeOptions, RaftNode,
};
pub use state_machine::StateMachine;

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
}

/// An observer that ignores everything (tests, tools).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl RaftObserver for NoObserver {
    fn proposed(&self, _commands: usize, _overlapping: bool) {}
    fn applied(&self, _entries: usize, _elapsed: Duration) {}
    fn snapshot_built(&self) {}
    fn snapshot_installed(&self) {}
}

use std::time::Duration;

use cairn_core::command::{Command, Outcome};

openraft::declare_raft_types!(
    /// Cairn's openraft type configuration.
    pub TypeConfig:
        D = Command,
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
    /// Initialising the group failed.
    #[error("failed to initialise the raft group: {0}")]
    Initialize(String),
    /// Timed out waiting for the node to become ready.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
}

impl From<RaftError> for cairn_core::Error {
    fn from(e: RaftError) -> Self {
        match e {
            RaftError::NoLeader(_) | RaftError::Fatal(_) | RaftError::Timeout(_) => {
                cairn_core::Error::Unavailable(e.to_string())
            }
            RaftError::Store(_)
            | RaftError::Storage(_)
            | RaftError::Config(_)
            | RaftError::Initialize(_) => cairn_core::Error::Internal(e.to_string()),
        }
    }
}
