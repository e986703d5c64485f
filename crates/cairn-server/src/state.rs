//! The node's shared context, handed to every service once storage and Raft are up. It
//! holds what the services share and decides nothing: where a write goes is the
//! [`Router`]'s business, the peer port's is [`crate::peer`].

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use cairn_core::Error;
use cairn_core::boundary::{BoundaryInfo, validate_boundary_name};
use cairn_raft::RaftNode;
use cairn_store::Store;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::peer::PeerClient;
use crate::router::Router;

/// Everything a request handler needs.
pub struct NodeState {
    /// The Raft node and its store.
    pub raft: RaftNode,
    /// Where writes and linearizable reads go.
    pub router: Arc<Router>,
    /// Other nodes' peer ports, for status and membership calls.
    pub peers: Arc<PeerClient>,
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
    /// The group this node belongs to (see [`crate::peer::identity`]).
    pub identity: crate::peer::ClusterIdentity,
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
                self.router.read_barrier().await?;
                self.active_boundary(name)
            }
            found => found,
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
