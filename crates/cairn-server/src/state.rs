//! The node's shared state, handed to every service once storage and Raft are up.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use cairn_core::Error;
use cairn_core::boundary::{BoundaryInfo, validate_boundary_name};
use cairn_core::command::{Command, Outcome};
use cairn_raft::RaftNode;
use cairn_store::Store;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::ServeConfig;
use crate::metrics::Metrics;

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

    /// Replicates a command and returns its outcome.
    pub async fn propose(&self, command: Command) -> Result<Outcome, Error> {
        let timer = self.metrics.raft_write_duration.start_timer();
        let outcome = self.raft.write(command).await.map_err(|e| {
            tracing::warn!("failed to replicate command: {e}");
            Error::from(e)
        });
        timer.observe_duration();
        outcome
    }

    /// Proposes and flattens: a domain rejection becomes the error.
    pub async fn execute(&self, command: Command) -> Result<cairn_core::command::Applied, Error> {
        self.propose(command).await?
    }

    /// Linearizable read barrier.
    pub async fn read_barrier(&self) -> Result<(), Error> {
        self.raft.read_barrier().await.map_err(Error::from)
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
