//! The peer port's services: `cairn.v1.Raft` hands peers' messages to openraft, and
//! `cairn.v1.Cluster` answers status, membership changes and followers' forwarded writes.
//! Every call carries the cluster secret; with peer TLS a Raft message is also taken only
//! from the member its certificate names.
//!
//! Both work on a [`PeerNode`]: Raft itself, and what the layers above this module provide
//! ([`Leader`] for forwarded writes and read indexes, [`ClusterCalls`] for the group's
//! changes), so nothing here reaches up into the node's services.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use cairn_core::Error;
use cairn_core::command::Command;
use cairn_proto::CLUSTER_SECRET_HEADER as SECRET_HEADER;
use cairn_proto::cairn_v1 as pb;
use cairn_raft::codec::{decode, decode_append_entries, encode};
use cairn_raft::{MemberAddr, RaftNode, TypeConfig};
use openraft::raft::{InstallSnapshotRequest, VoteRequest};
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status};

use super::forward_server::{ForwardedReplies, Leader};
use crate::admission::Admission;
use crate::config::{Membership, ServeConfig};
use crate::listeners::ConnectionInfo;
use crate::rpc::starting;

/// The calls of `cairn.v1.Cluster` that describe or change the group, answered by the
/// node's cluster module (they need its storage and its peer client).
#[tonic::async_trait]
pub trait ClusterCalls: Send + Sync + 'static {
    /// This node's view of the group and the head of every boundary.
    async fn status(&self) -> Result<pb::StatusResponse, Error>;
    /// Adds a new node as a learner.
    async fn add_learner(&self, id: u64, address: String) -> Result<pb::MembershipResponse, Error>;
    /// Makes a member that lost its state a learner again.
    async fn rejoin(&self, id: u64, address: String) -> Result<pb::MembershipResponse, Error>;
    /// Makes a learner a voter.
    async fn promote(&self, id: u64) -> Result<pb::MembershipResponse, Error>;
    /// Removes a member.
    async fn remove(&self, id: u64) -> Result<pb::MembershipResponse, Error>;
    /// Hands leadership to voter `id`; the new leader's id.
    async fn transfer_leader(&self, id: u64) -> Result<u64, Error>;
}

/// What the peer services work on once storage and Raft are up.
pub struct PeerNode {
    /// Raft, for its messages, votes and elections.
    pub raft: RaftNode,
    /// Who may send Raft messages.
    pub claims: Claims,
    /// The write limits (an installed snapshot needs room on disk too).
    pub admission: Arc<Admission>,
    /// Runs what followers forward.
    pub leader: Arc<dyn Leader>,
    /// Status and membership changes.
    pub cluster: Arc<dyn ClusterCalls>,
    /// The group this node belongs to: Raft messages of another are refused.
    pub identity: super::ClusterIdentity,
}

/// The node the peer services work on, set once storage and Raft are up.
pub type PeerReady = Arc<OnceLock<PeerNode>>;

/// Who may send Raft messages: with peer TLS, only the member a message claims to come
/// from (see [`Claims::check`]); without it, anyone holding the cluster secret.
#[derive(Debug, Clone, Default)]
pub struct Claims {
    tls: bool,
    initial_members: Option<BTreeMap<u64, String>>,
}

impl Claims {
    /// The claims a node configured by `config` accepts.
    pub fn new(config: &ServeConfig) -> Self {
        let cluster = config.cluster.as_ref();
        Claims {
            tls: cluster.is_some_and(|c| c.tls.is_some()),
            initial_members: match cluster.map(|c| &c.membership) {
                Some(Membership::Initial(members)) => Some(members.clone()),
                _ => None,
            },
        }
    }

    /// The certificate a peer call's connection presented, when the peer port has TLS (it
    /// chained to the cluster CA in the handshake); `Ok(None)` when the port is plaintext.
    fn peer_certificate<'c>(
        &self,
        connection: Option<&'c ConnectionInfo>,
    ) -> Result<Option<&'c CertificateDer<'static>>, Status> {
        if !self.tls {
            return Ok(None);
        }
        match connection
            .and_then(|c| c.client_certificates.as_ref())
            .and_then(|chain| chain.first())
        {
            Some(leaf) => Ok(Some(leaf)),
            None => denied("peer calls need a certificate of the cluster CA".to_string()),
        }
    }

    /// With peer TLS, a Raft message is taken only from the member it claims to come from:
    /// the certificate must name the host of that member's peer address, as a server
    /// certificate names the host its clients dial. A node that has seen no membership yet
    /// (it is still forming or joining) looks the member up in its --initial-members; one
    /// that knows neither takes any certificate of the cluster CA, which is what a group it
    /// is about to join presents.
    fn check(
        &self,
        raft: &RaftNode,
        connection: Option<&ConnectionInfo>,
        claimed: Option<u64>,
    ) -> Result<(), Status> {
        let Some(leaf) = self.peer_certificate(connection)? else {
            return Ok(());
        };
        let Some(claimed) = claimed else {
            return denied("a raft message must name the member it comes from".to_string());
        };
        let addr = match raft.member_addr(claimed) {
            MemberAddr::Member(addr) => addr,
            MemberAddr::NotAMember => {
                return denied(format!("node {claimed} is not a member of this group"));
            }
            MemberAddr::NoMembership => {
                match self.initial_members.as_ref().and_then(|m| m.get(&claimed)) {
                    Some(addr) => addr.clone(),
                    None => return Ok(()),
                }
            }
        };
        crate::tls::certificate_names(leaf, crate::config::peer_host(&addr)).or_else(|why| {
            denied(format!(
                "the peer's certificate does not name node {claimed}, whose address is {addr}: {why}"
            ))
        })
    }
}

/// Compares the presented secret with ours in time independent of both their contents
/// and their lengths: digests of equal length, compared in constant time.
fn secret_matches(presented: &[u8], expected: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let presented = Sha256::digest(presented);
    let expected = Sha256::digest(expected);
    presented.ct_eq(&expected).into()
}

/// Rejects peer calls without the cluster secret (when one is configured).
#[derive(Clone)]
pub struct SecretCheck {
    secret: Option<Arc<[u8]>>,
}

impl SecretCheck {
    /// A check for `secret` (none: every call is let in).
    pub fn new(secret: Option<&str>) -> Self {
        SecretCheck {
            secret: secret.map(|s| Arc::from(s.as_bytes())),
        }
    }
}

impl tonic::service::Interceptor for SecretCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.secret else {
            return Ok(request);
        };
        match request.metadata().get(SECRET_HEADER) {
            Some(presented) if secret_matches(presented.as_bytes(), expected) => Ok(request),
            Some(_) => Err(cairn_proto::to_status(Error::Unauthenticated(
                "wrong cluster secret".to_string(),
            ))),
            None => Err(cairn_proto::to_status(Error::Unauthenticated(format!(
                "peer calls need the cluster secret in {SECRET_HEADER}"
            )))),
        }
    }
}

/// A candidate asked a node that does not vote (it lost its state, or does not know yet
/// whether its group is new): no vote, as from a node that is down.
fn not_voting(raft: &RaftNode) -> Status {
    Status::unavailable(format!(
        "node {} is {} and does not vote: {}",
        raft.node_id(),
        raft.standing().as_str(),
        "a node without its raft state votes only once the group has made it a voter again"
    ))
}

/// The cluster id a peer's message names (see [`super::identity`]).
fn presented_cluster_id<T>(request: &Request<T>) -> Option<String> {
    request
        .metadata()
        .get(super::identity::CLUSTER_ID_HEADER)
        .map(|v| v.to_str().unwrap_or("(not text)").to_string())
}

fn denied<T>(why: String) -> Result<T, Status> {
    Err(cairn_proto::to_status(Error::PermissionDenied(why)))
}

fn node_of(ready: &PeerReady) -> Result<&PeerNode, Status> {
    ready.get().ok_or_else(starting)
}

fn payload<T: Serialize>(value: &T) -> Result<tonic::Response<pb::RaftPayload>, Status> {
    encode(value)
        .map(|data| tonic::Response::new(pb::RaftPayload { data }))
        .map_err(|e| Status::internal(format!("failed to encode a raft response: {e}")))
}

fn decoded<T: serde::de::DeserializeOwned>(request: Request<pb::RaftPayload>) -> Result<T, Status> {
    decoded_with(request, decode)
}

/// A peer's Raft message decoded by `decode` (INVALID_ARGUMENT when it cannot be).
fn decoded_with<T>(
    request: Request<pb::RaftPayload>,
    decode: impl FnOnce(&[u8]) -> Result<T, cairn_raft::codec::CodecError>,
) -> Result<T, Status> {
    decode(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

/// `cairn.v1.Raft`: hands peers' messages to openraft.
#[derive(Clone)]
pub struct RaftService {
    ready: PeerReady,
}

impl RaftService {
    /// Answers UNAVAILABLE until `ready` is set.
    pub fn new(ready: PeerReady) -> Self {
        RaftService { ready }
    }
}

#[tonic::async_trait]
impl pb::raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<tonic::Response<pb::RaftPayload>, Status> {
        let node = node_of(&self.ready)?;
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let cluster_id = presented_cluster_id(&request);
        let rpc = decoded_with(request, decode_append_entries)?;
        node.claims.check(
            &node.raft,
            connection.as_ref(),
            rpc.vote.leader_id().voted_for(),
        )?;
        node.identity.admit(cluster_id.as_deref())?;
        payload(&node.raft.raft().append_entries(rpc).await)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<tonic::Response<pb::RaftPayload>, Status> {
        let node = node_of(&self.ready)?;
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let cluster_id = presented_cluster_id(&request);
        let rpc: VoteRequest<u64> = decoded(request)?;
        node.claims.check(
            &node.raft,
            connection.as_ref(),
            rpc.vote.leader_id().voted_for(),
        )?;
        node.identity.admit(cluster_id.as_deref())?;
        if !node
            .raft
            .may_vote_for(rpc.vote.leader_id().voted_for().unwrap_or(0))
        {
            return Err(not_voting(&node.raft));
        }
        payload(&node.raft.raft().vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<tonic::Response<pb::RaftPayload>, Status> {
        let node = node_of(&self.ready)?;
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let cluster_id = presented_cluster_id(&request);
        let rpc: InstallSnapshotRequest<TypeConfig> = decoded(request)?;
        node.claims.check(
            &node.raft,
            connection.as_ref(),
            rpc.vote.leader_id().voted_for(),
        )?;
        node.identity.admit(cluster_id.as_deref())?;
        // The id becomes a file name (review M4).
        if !cairn_raft::valid_snapshot_id(&rpc.meta.snapshot_id) {
            return Err(Status::invalid_argument(format!(
                "snapshot id {:?} is not letters, digits and dashes (at most {} bytes)",
                rpc.meta.snapshot_id,
                cairn_raft::MAX_SNAPSHOT_ID_BYTES
            )));
        }
        // Installing needs room for what arrives, unpacked, and copied into the database:
        // a chunk that would not leave that (and the floor) is refused before it is
        // written, and the leader sends it again later.
        let received = rpc.offset.saturating_add(rpc.data.len() as u64);
        if let Err(full) = node.admission.floor.check_room(received.saturating_mul(2)) {
            return Err(cairn_proto::to_status(full));
        }
        payload(&node.raft.raft().install_snapshot(rpc).await)
    }
}

/// `cairn.v1.Cluster`: status, membership, and the calls nodes make to each other.
#[derive(Clone)]
pub struct ClusterService {
    ready: PeerReady,
    stop: CancellationToken,
}

impl ClusterService {
    /// Answers UNAVAILABLE until `ready` is set. Forwarding streams end once `stop` is
    /// cancelled (the peer server is stopping) and their commands are answered.
    pub fn new(ready: PeerReady, stop: CancellationToken) -> Self {
        ClusterService { ready, stop }
    }
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<tonic::Response<pb::StatusResponse>, Status> {
        let node = node_of(&self.ready)?;
        node.cluster
            .status()
            .await
            .map(tonic::Response::new)
            .map_err(cairn_proto::to_status)
    }

    async fn add_learner(
        &self,
        request: Request<pb::AddLearnerRequest>,
    ) -> Result<tonic::Response<pb::MembershipResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        node.cluster
            .add_learner(req.node_id, req.address)
            .await
            .map(tonic::Response::new)
            .map_err(cairn_proto::to_status)
    }

    async fn rejoin(
        &self,
        request: Request<pb::RejoinRequest>,
    ) -> Result<tonic::Response<pb::MembershipResponse>, Status> {
        let node = node_of(&self.ready)?;
        let req = request.into_inner();
        node.cluster
            .rejoin(req.node_id, req.address)
            .await
            .map(tonic::Response::new)
            .map_err(cairn_proto::to_status)
    }

    async fn allow_vote(
        &self,
        request: Request<pb::AllowVoteRequest>,
    ) -> Result<tonic::Response<pb::AllowVoteResponse>, Status> {
        let node = node_of(&self.ready)?;
        node.raft
            .allow_vote_for(request.into_inner().candidate_id)
            .map(|standing| {
                tonic::Response::new(pb::AllowVoteResponse {
                    standing: standing.as_str().to_string(),
                })
            })
            .map_err(|e| cairn_proto::to_status(e.into()))
    }

    async fn promote(
        &self,
        request: Request<pb::PromoteRequest>,
    ) -> Result<tonic::Response<pb::MembershipResponse>, Status> {
        let node = node_of(&self.ready)?;
        node.cluster
            .promote(request.into_inner().node_id)
            .await
            .map(tonic::Response::new)
            .map_err(cairn_proto::to_status)
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<tonic::Response<pb::MembershipResponse>, Status> {
        let node = node_of(&self.ready)?;
        node.cluster
            .remove(request.into_inner().node_id)
            .await
            .map(tonic::Response::new)
            .map_err(cairn_proto::to_status)
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<tonic::Response<pb::TransferLeaderResponse>, Status> {
        let node = node_of(&self.ready)?;
        node.cluster
            .transfer_leader(request.into_inner().node_id)
            .await
            .map(|leader_id| tonic::Response::new(pb::TransferLeaderResponse { leader_id }))
            .map_err(cairn_proto::to_status)
    }

    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<tonic::Response<pb::ForwardResponse>, Status> {
        let node = node_of(&self.ready)?;
        node.identity
            .admit_forwarded(presented_cluster_id(&request).as_deref())?;
        let command: Command = decode(&request.into_inner().command)
            .map_err(|e| Status::invalid_argument(format!("undecodable command: {e}")))?;
        let reply = node.leader.clone().run(command).await;
        encode(&reply)
            .map(|reply| tonic::Response::new(pb::ForwardResponse { reply }))
            .map_err(|e| Status::internal(format!("failed to encode a forwarding reply: {e}")))
    }

    type ForwardStreamStream = ForwardedReplies;

    async fn forward_stream(
        &self,
        request: Request<tonic::Streaming<pb::ForwardStreamRequest>>,
    ) -> Result<tonic::Response<Self::ForwardStreamStream>, Status> {
        let node = node_of(&self.ready)?;
        node.identity
            .admit_forwarded(presented_cluster_id(&request).as_deref())?;
        Ok(tonic::Response::new(ForwardedReplies::new(
            node.leader.clone(),
            request.into_inner(),
            self.stop.clone(),
        )))
    }

    async fn read_index(
        &self,
        request: Request<pb::ReadIndexRequest>,
    ) -> Result<tonic::Response<pb::ReadIndexResponse>, Status> {
        let node = node_of(&self.ready)?;
        node.identity
            .admit_forwarded(presented_cluster_id(&request).as_deref())?;
        let index = node
            .leader
            .clone()
            .read_index()
            .await
            .map_err(cairn_proto::to_status)?;
        Ok(tonic::Response::new(pb::ReadIndexResponse {
            index: index.unwrap_or(0),
            not_leader: index.is_none(),
        }))
    }

    async fn elect(
        &self,
        _request: Request<pb::ElectRequest>,
    ) -> Result<tonic::Response<pb::ElectResponse>, Status> {
        let node = node_of(&self.ready)?;
        if !node.raft.may_vote() {
            return Err(not_voting(&node.raft));
        }
        node.raft
            .raft()
            .trigger()
            .elect()
            .await
            .map(|()| tonic::Response::new(pb::ElectResponse {}))
            .map_err(|e| Status::unavailable(format!("failed to start an election: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_comparison_needs_every_byte() {
        assert!(secret_matches(b"s3cret", b"s3cret"));
        assert!(!secret_matches(b"s3cres", b"s3cret"));
        assert!(!secret_matches(b"s3cre", b"s3cret"));
        assert!(!secret_matches(b"", b"s3cret"));
    }

    #[test]
    fn peer_calls_without_the_secret_are_refused() {
        use tonic::service::Interceptor;
        let mut check = SecretCheck::new(Some("s3cret"));
        assert!(check.call(Request::new(())).is_err());
        let mut wrong = Request::new(());
        wrong
            .metadata_mut()
            .insert(SECRET_HEADER, "nope".parse().expect("ascii"));
        assert_eq!(
            check.call(wrong).expect_err("wrong secret").code(),
            tonic::Code::Unauthenticated
        );
        let mut right = Request::new(());
        right
            .metadata_mut()
            .insert(SECRET_HEADER, "s3cret".parse().expect("ascii"));
        assert!(check.call(right).is_ok());
        assert!(SecretCheck::new(None).call(Request::new(())).is_ok());
    }
}
