//! Raft networking for a one-node group.
//!
//! A single-node group never sends a Raft RPC: the node is the whole quorum. openraft still
//! needs a network factory type, so this one reports every peer as unreachable, which is the
//! truth for a group that has no peers. The multi-node transport (`cairn.v1.Raft` over gRPC)
//! replaces it when peers are configured.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};

use crate::TypeConfig;

/// Network of a group without peers.
#[derive(Debug, Clone, Default)]
pub struct SingleNodeNetwork;

/// Connection to a peer that does not exist.
#[derive(Debug)]
pub struct NoPeer {
    target: u64,
}

impl NoPeer {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<u64, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&AnyError::error(format!(
            "node {} is not reachable: this node runs a single-node group",
            self.target
        ))))
    }
}

impl RaftNetworkFactory<TypeConfig> for SingleNodeNetwork {
    type Network = NoPeer;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Self::Network {
        NoPeer { target }
    }
}

impl RaftNetwork<TypeConfig> for NoPeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.unreachable())
    }
}
