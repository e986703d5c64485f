//! The seam between openraft and whatever carries Raft messages between nodes.
//!
//! openraft's `RaftNetwork` is generic and async, so it cannot be a trait object; a node
//! takes a [`PeerTransport`] instead (an `Arc<dyn …>` in `NodeOptions`), and [`Network`]
//! adapts it. The gRPC transport of `cairn-server` plugs in here, and so can a test's
//! fault-injecting one. [`NoPeers`] is the transport of a one-node group, which never sends
//! a Raft message: the node is the whole quorum.

use std::sync::Arc;

use futures::future::BoxFuture;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};

use crate::TypeConfig;

/// Result of a Raft RPC to a peer.
pub type RpcResult<T, E = RaftError<u64>> = Result<T, RPCError<u64, BasicNode, E>>;

/// Carries openraft's three RPCs to peer `target`, whose membership entry is `node`.
pub trait PeerTransport: Send + Sync + 'static {
    /// AppendEntries (also heartbeats).
    fn append_entries(
        &self,
        target: u64,
        node: &BasicNode,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> BoxFuture<'static, RpcResult<AppendEntriesResponse<u64>>>;

    /// RequestVote.
    fn vote(
        &self,
        target: u64,
        node: &BasicNode,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> BoxFuture<'static, RpcResult<VoteResponse<u64>>>;

    /// One chunk of a snapshot (openraft splits snapshots into chunks and sends them in
    /// order).
    fn install_snapshot(
        &self,
        target: u64,
        node: &BasicNode,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> BoxFuture<
        'static,
        RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>,
    >;
}

/// openraft's network factory over a [`PeerTransport`].
#[derive(Clone)]
pub struct Network {
    transport: Arc<dyn PeerTransport>,
}

impl Network {
    /// A factory handing out links over `transport`.
    pub fn new(transport: Arc<dyn PeerTransport>) -> Self {
        Network { transport }
    }
}

/// openraft's client for one peer.
pub struct PeerLink {
    target: u64,
    node: BasicNode,
    transport: Arc<dyn PeerTransport>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerLink;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerLink {
        PeerLink {
            target,
            node: node.clone(),
            transport: self.transport.clone(),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        self.transport
            .append_entries(self.target, &self.node, rpc, option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> {
        self.transport
            .install_snapshot(self.target, &self.node, rpc, option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>> {
        self.transport
            .vote(self.target, &self.node, rpc, option)
            .await
    }
}

/// The transport of a group without peers: every peer is unreachable, which is the truth.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPeers;

fn unreachable<E: std::error::Error>(target: u64) -> RPCError<u64, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(format!(
        "node {target} is not reachable: this node runs without a peer transport"
    ))))
}

impl PeerTransport for NoPeers {
    fn append_entries(
        &self,
        target: u64,
        _node: &BasicNode,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> BoxFuture<'static, RpcResult<AppendEntriesResponse<u64>>> {
        Box::pin(async move { Err(unreachable(target)) })
    }

    fn vote(
        &self,
        target: u64,
        _node: &BasicNode,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> BoxFuture<'static, RpcResult<VoteResponse<u64>>> {
        Box::pin(async move { Err(unreachable(target)) })
    }

    fn install_snapshot(
        &self,
        target: u64,
        _node: &BasicNode,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> BoxFuture<
        'static,
        RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>,
    > {
        Box::pin(async move { Err(unreachable(target)) })
    }
}
