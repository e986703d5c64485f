//! The peer port: Raft traffic (`cairn.v1.Raft`) and the cluster API (`cairn.v1.Cluster`)
//! between nodes, every call authenticated by the cluster secret.
//!
//! [`PeerClient`] is both openraft's transport (it implements `cairn_raft::PeerTransport`)
//! and the client of the cluster API: followers forward writes and ask the leader for read
//! indexes through it. openraft's messages and Cairn's commands travel as bytes encoded by
//! `cairn_raft::codec`, the same encoding as the Raft log.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cairn_core::command::{Command, Outcome};
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::cluster_client::ClusterClient;
use cairn_proto::cairn_v1::raft_client::RaftClient;
use cairn_raft::codec::{decode, decode_append_entries, encode, encode_append_entries};
use cairn_raft::{MemberAddr, PeerTransport, RaftError as CairnRaftError, RpcResult, TypeConfig};
use futures::future::BoxFuture;
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use crate::forward::{ForwardStreams, ForwardedReplies, StreamError};
use crate::listeners::ConnectionInfo;
use crate::state::NodeState;
use crate::tls::Material;
use cairn_proto::CLUSTER_SECRET_HEADER as SECRET_HEADER;
use rustls_pki_types::CertificateDer;

/// Largest peer message, either way. A Raft entry holds at most 8 MiB of commands; an
/// AppendEntries over this size is split by openraft (we answer `PayloadTooLarge`).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How long a peer connection may take to establish.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of cluster-API calls between nodes (a forwarded write's is set by the server
/// from its leader wait, see `ServeConfig::forward_timeout`).
pub const CLUSTER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the leader answers a forwarded command.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardReply {
    /// The command was applied (or rejected by the state machine: a conflict is an outcome).
    Outcome(Outcome),
    /// The receiver does not lead; nothing was proposed.
    NotLeader {
        /// The leader it knows of.
        leader_id: Option<u64>,
        /// Its address.
        leader_addr: Option<String>,
    },
    /// The receiver leads but could not replicate; the command may or may not be applied.
    Unavailable(String),
}

/// The node the peer services work on, set once storage and Raft are up.
pub type PeerReady = Arc<OnceLock<Arc<NodeState>>>;

/// The channels to peers, and the TLS they were made with.
#[derive(Default)]
struct Channels {
    by_addr: HashMap<String, Channel>,
    tls: Option<DialTls>,
}

/// The TLS peers are dialled with.
struct DialTls {
    config: ClientTlsConfig,
    /// The node's certificate material, watched for renewals (`None`: fixed, as for
    /// `cairn cluster`).
    renewals: Option<watch::Receiver<Arc<Material>>>,
}

impl Channels {
    /// The TLS for a new channel. After a renewal the cached channels are dropped, so the
    /// next call to each peer dials it with the new certificate; calls and forwarding
    /// streams in progress finish on the connection they have.
    fn current_tls(&mut self) -> Option<ClientTlsConfig> {
        let tls = self.tls.as_mut()?;
        if let Some(material) = &mut tls.renewals
            && material.has_changed().unwrap_or(false)
            && let Some(renewed) = material.borrow_and_update().peer_client_tls()
        {
            tls.config = renewed;
            self.by_addr.clear();
        }
        Some(tls.config.clone())
    }
}

/// Client of other nodes' peer ports; openraft's transport.
pub struct PeerClient {
    secret: Option<MetadataValue<tonic::metadata::Ascii>>,
    local_ip: Option<IpAddr>,
    channels: Mutex<Channels>,
    streams: ForwardStreams,
    snapshot_chunks_sent: Option<prometheus::IntCounter>,
    /// How long a forwarded write waits for the leader's answer.
    forward_timeout: Duration,
}

impl std::fmt::Debug for PeerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerClient").finish_non_exhaustive()
    }
}

impl PeerClient {
    /// A client sending `secret` (none: peers must not require one). With `local_ip`,
    /// connections leave from that address: a node listening for peers on one interface
    /// of a multi-homed host talks to them from it too, so firewalls and peers see the
    /// address the node advertises.
    pub fn new(secret: Option<&str>, local_ip: Option<IpAddr>) -> Result<Self, String> {
        let secret = secret
            .map(|s| {
                s.parse()
                    .map_err(|_| "the cluster secret must be printable ASCII".to_string())
            })
            .transpose()?;
        Ok(PeerClient {
            secret,
            local_ip,
            channels: Mutex::new(Channels::default()),
            streams: ForwardStreams::default(),
            snapshot_chunks_sent: None,
            forward_timeout: CLUSTER_CALL_TIMEOUT,
        })
    }

    /// Dials peers with mutual TLS from `material` (its CA verifies them, its certificate
    /// is ours); `None`: plaintext.
    pub fn with_tls(self, material: Option<watch::Receiver<Arc<Material>>>) -> Self {
        let tls = material.and_then(|mut material| {
            let config = material.borrow_and_update().peer_client_tls()?;
            Some(DialTls {
                config,
                renewals: Some(material),
            })
        });
        self.channels.lock().unwrap_or_else(|p| p.into_inner()).tls = tls;
        self
    }

    /// Dials peers with `config` (`cairn cluster`).
    pub fn with_fixed_tls(self, config: ClientTlsConfig) -> Self {
        self.channels.lock().unwrap_or_else(|p| p.into_inner()).tls = Some(DialTls {
            config,
            renewals: None,
        });
        self
    }

    /// Waits `timeout` for the leader's answer to a forwarded write (default
    /// [`CLUSTER_CALL_TIMEOUT`]): the server sets it above the leader's own bound.
    pub fn forwarding_within(mut self, timeout: Duration) -> Self {
        self.forward_timeout = timeout;
        self
    }

    /// Counts the snapshot chunks this client sends.
    pub fn counting_snapshot_chunks(mut self, counter: prometheus::IntCounter) -> Self {
        self.snapshot_chunks_sent = Some(counter);
        self
    }

    /// Records the writes of each forwarding-stream message in `histogram`.
    pub fn counting_forward_messages(mut self, histogram: prometheus::Histogram) -> Self {
        self.streams = ForwardStreams::counting(histogram);
        self
    }

    /// The (lazily connecting, shared) channel to `addr`.
    fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let tls = channels.current_tls();
        if let Some(channel) = channels.by_addr.get(addr) {
            return Ok(channel.clone());
        }
        let bad = |e: &dyn std::fmt::Display| {
            Status::invalid_argument(format!("bad peer address {addr:?}: {e}"))
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint =
            Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| bad(&e))?;
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).map_err(|e| bad(&e))?;
        }
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .local_address(self.local_ip)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = endpoint.connect_lazy();
        channels.by_addr.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    fn request<T>(&self, message: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(timeout);
        if let Some(secret) = &self.secret {
            request.metadata_mut().insert(SECRET_HEADER, secret.clone());
        }
        request
    }

    fn raft(&self, addr: &str) -> Result<RaftClient<Channel>, Status> {
        Ok(RaftClient::new(self.channel(addr)?)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES))
    }

    /// The cluster API of the node at `addr`.
    pub fn cluster(&self, addr: &str) -> Result<ClusterClient<Channel>, Status> {
        Ok(ClusterClient::new(self.channel(addr)?)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES))
    }

    /// A cluster-API request carrying the secret.
    pub fn cluster_request<T>(&self, message: T) -> Request<T> {
        self.request(message, CLUSTER_CALL_TIMEOUT)
    }

    /// The status of the node at `addr` (its log, role and view of the membership).
    pub async fn status(&self, addr: &str) -> Result<pb::StatusResponse, Status> {
        let request = self.cluster_request(pb::StatusRequest {});
        let response = self.cluster(addr)?.status(request).await?;
        Ok(response.into_inner())
    }

    /// Runs `command` on the node at `addr`, which should be the leader: on the forwarding
    /// stream to it (see [`crate::forward`]), or with a call of its own when it serves none.
    pub async fn forward(&self, addr: &str, command: &Command) -> Result<ForwardReply, Status> {
        let bytes = encode(command)
            .map_err(|e| Status::internal(format!("failed to encode a command: {e}")))?;
        let streamed = self.on_stream(addr, bytes, |bytes| {
            self.streams.forward(
                addr,
                bytes,
                || self.cluster(addr),
                self.secret.as_ref(),
                self.forward_timeout,
            )
        });
        let bytes = match streamed.await {
            Ok(answer) => return answer,
            Err(unsent) => unsent,
        };
        let reply = self
            .cluster(addr)?
            .forward(self.request(pb::ForwardRequest { command: bytes }, self.forward_timeout))
            .await?
            .into_inner();
        decode(&reply.reply)
            .map_err(|e| Status::internal(format!("undecodable forwarding reply: {e}")))
    }

    /// Whether writes go to the leader at `addr` one call each (it serves no forwarding
    /// streams).
    pub fn forwards_by_call(&self, addr: &str) -> bool {
        self.streams.unsupported(addr)
    }

    /// The read index of the leader at `addr`; `None` when that node does not lead. Asked
    /// on the forwarding stream to it, or with a call of its own when it serves none.
    pub async fn read_index(&self, addr: &str) -> Result<Option<u64>, Status> {
        let streamed = self.on_stream(addr, Vec::new(), |_| {
            self.streams.read_index(
                addr,
                || self.cluster(addr),
                self.secret.as_ref(),
                CLUSTER_CALL_TIMEOUT,
            )
        });
        if let Ok(answer) = streamed.await {
            return answer.and_then(|index| index);
        }
        let reply = self
            .cluster(addr)?
            .read_index(self.cluster_request(pb::ReadIndexRequest {}))
            .await?
            .into_inner();
        Ok((!reply.not_leader).then_some(reply.index))
    }

    /// Asks (with `ask`) on the forwarding stream to `addr`, once more on a fresh stream if
    /// the first ended before sending. `Err` hands back what was not sent, to go in a call
    /// of its own: the leader serves no streams, or two in a row ended.
    async fn on_stream<T, F>(
        &self,
        addr: &str,
        mut unsent: Vec<u8>,
        ask: impl Fn(Vec<u8>) -> F,
    ) -> Result<Result<T, Status>, Vec<u8>>
    where
        F: std::future::Future<Output = Result<T, StreamError>>,
    {
        if self.streams.unsupported(addr) {
            return Err(unsent);
        }
        for _ in 0..2 {
            match ask(unsent).await {
                Ok(answer) => return Ok(Ok(answer)),
                Err(StreamError::NotSent(back)) => unsent = back,
                Err(StreamError::Unsupported(back)) => return Err(back),
                Err(StreamError::Lost(status)) => return Ok(Err(status)),
            }
        }
        Err(unsent)
    }

    fn raft_call<Resp, E>(
        &self,
        target: u64,
        node: &BasicNode,
        encoded: Result<Vec<u8>, cairn_raft::codec::CodecError>,
        option: &RPCOption,
        call: RaftCall,
    ) -> BoxFuture<'static, RpcResult<Resp, E>>
    where
        Resp: serde::de::DeserializeOwned + Send + 'static,
        E: std::error::Error + serde::de::DeserializeOwned + Send + 'static,
    {
        let client = self.raft(&node.addr);
        let request = encoded.map(|data| self.request(pb::RaftPayload { data }, option.hard_ttl()));
        Box::pin(async move {
            let request = request.map_err(|e| network(&e))?;
            if let RaftCall::AppendEntries { entries } = call
                && entries > 1
                && request.get_ref().data.len() > MAX_PEER_MESSAGE_BYTES
            {
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint((entries / 2).max(1)),
                ));
            }
            let mut client = client.map_err(|e| unreachable(&e))?;
            let response = match call {
                RaftCall::AppendEntries { .. } => client.append_entries(request).await,
                RaftCall::Vote => client.vote(request).await,
                RaftCall::InstallSnapshot => client.install_snapshot(request).await,
            }
            .map_err(|status| match status.code() {
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => unreachable(&status),
                _ => network(&status),
            })?;
            let result: Result<Resp, E> =
                decode(&response.into_inner().data).map_err(|e| network(&e))?;
            result.map_err(|e| RPCError::RemoteError(RemoteError::new(target, e)))
        })
    }
}

/// Which Raft RPC a payload is for.
#[derive(Clone, Copy)]
enum RaftCall {
    AppendEntries { entries: u64 },
    Vote,
    InstallSnapshot,
}

fn unreachable<E: std::error::Error + 'static, F: std::error::Error>(
    e: &E,
) -> RPCError<u64, BasicNode, F> {
    RPCError::Unreachable(Unreachable::new(e))
}

fn network<E: std::error::Error + 'static, F: std::error::Error>(
    e: &E,
) -> RPCError<u64, BasicNode, F> {
    RPCError::Network(NetworkError::new(e))
}

impl PeerTransport for PeerClient {
    fn append_entries(
        &self,
        target: u64,
        node: &BasicNode,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> BoxFuture<'static, RpcResult<AppendEntriesResponse<u64>>> {
        let entries = rpc.entries.len() as u64;
        self.raft_call(
            target,
            node,
            encode_append_entries(&rpc),
            &option,
            RaftCall::AppendEntries { entries },
        )
    }

    fn vote(
        &self,
        target: u64,
        node: &BasicNode,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> BoxFuture<'static, RpcResult<VoteResponse<u64>>> {
        self.raft_call(target, node, encode(&rpc), &option, RaftCall::Vote)
    }

    fn install_snapshot(
        &self,
        target: u64,
        node: &BasicNode,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> BoxFuture<
        'static,
        RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>,
    > {
        if let Some(counter) = &self.snapshot_chunks_sent {
            counter.inc();
        }
        self.raft_call(
            target,
            node,
            encode(&rpc),
            &option,
            RaftCall::InstallSnapshot,
        )
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
            Some(_) => Err(cairn_proto::to_status(cairn_core::Error::Unauthenticated(
                "wrong cluster secret".to_string(),
            ))),
            None => Err(cairn_proto::to_status(cairn_core::Error::Unauthenticated(
                format!("peer calls need the cluster secret in {SECRET_HEADER}"),
            ))),
        }
    }
}

fn starting() -> Status {
    cairn_proto::to_status(cairn_core::Error::Unavailable(
        crate::rpc::NODE_STARTING.to_string(),
    ))
}

/// A candidate asked a node that does not vote (it lost its state, or does not know yet
/// whether its group is new): no vote, as from a node that is down.
fn not_voting(node: &NodeState) -> Status {
    Status::unavailable(format!(
        "node {} is {} and does not vote: {}",
        node.raft.node_id(),
        node.raft.standing().as_str(),
        "a node without its raft state votes only once the group has made it a voter again"
    ))
}

fn denied<T>(why: String) -> Result<T, Status> {
    Err(cairn_proto::to_status(cairn_core::Error::PermissionDenied(
        why,
    )))
}

/// The certificate a peer call's connection presented, when the peer port has TLS (it
/// chained to the cluster CA in the handshake); `Ok(None)` when the port is plaintext.
fn peer_certificate<'c>(
    node: &NodeState,
    connection: Option<&'c ConnectionInfo>,
) -> Result<Option<&'c CertificateDer<'static>>, Status> {
    if node.config.cluster.as_ref().is_none_or(|c| c.tls.is_none()) {
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

/// With peer TLS, a Raft message is taken only from the member it claims to come from: the
/// certificate must name the host of that member's peer address, as a server certificate
/// names the host its clients dial. A node that has seen no membership yet (it is still
/// forming or joining) looks the member up in its --initial-members; one that knows
/// neither takes any certificate of the cluster CA, which is what a group it is about to
/// join presents.
fn check_claim(
    node: &NodeState,
    connection: Option<&ConnectionInfo>,
    claimed: Option<u64>,
) -> Result<(), Status> {
    let Some(leaf) = peer_certificate(node, connection)? else {
        return Ok(());
    };
    let Some(claimed) = claimed else {
        return denied("a raft message must name the member it comes from".to_string());
    };
    let initial = || match node.config.cluster.as_ref().map(|c| &c.membership) {
        Some(crate::config::Membership::Initial(members)) => members.get(&claimed).cloned(),
        _ => None,
    };
    let addr = match node.raft.member_addr(claimed) {
        MemberAddr::Member(addr) => addr,
        MemberAddr::NotAMember => {
            return denied(format!("node {claimed} is not a member of this group"));
        }
        MemberAddr::NoMembership => match initial() {
            Some(addr) => addr,
            None => return Ok(()),
        },
    };
    crate::tls::certificate_names(leaf, crate::config::peer_host(&addr)).or_else(|why| {
        denied(format!(
            "the peer's certificate does not name node {claimed}, whose address is {addr}: {why}"
        ))
    })
}

fn node_of(ready: &PeerReady) -> Result<Arc<NodeState>, Status> {
    ready.get().cloned().ok_or_else(starting)
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
        let rpc = decoded_with(request, decode_append_entries)?;
        check_claim(&node, connection.as_ref(), rpc.vote.leader_id().voted_for())?;
        payload(&node.raft.raft().append_entries(rpc).await)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<tonic::Response<pb::RaftPayload>, Status> {
        let node = node_of(&self.ready)?;
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let rpc: VoteRequest<u64> = decoded(request)?;
        check_claim(&node, connection.as_ref(), rpc.vote.leader_id().voted_for())?;
        if !node
            .raft
            .may_vote_for(rpc.vote.leader_id().voted_for().unwrap_or(0))
        {
            return Err(not_voting(&node));
        }
        payload(&node.raft.raft().vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<tonic::Response<pb::RaftPayload>, Status> {
        let node = node_of(&self.ready)?;
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let rpc: InstallSnapshotRequest<TypeConfig> = decoded(request)?;
        check_claim(&node, connection.as_ref(), rpc.vote.leader_id().voted_for())?;
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
        if let Err(full) = node.disk_floor.check_room(received.saturating_mul(2)) {
            return Err(cairn_proto::to_status(full));
        }
        payload(&node.raft.raft().install_snapshot(rpc).await)
    }
}

/// What a leader answers for a command it was handed.
pub async fn run_forwarded(node: &NodeState, command: Command) -> ForwardReply {
    // Nothing proposed: a definite rejection the follower passes on to its client.
    let floor = if command.is_upkeep() {
        Ok(())
    } else {
        node.disk_floor.check()
    };
    let reserved = floor.and_then(|()| node.write_budget.reserve(command.approx_bytes()));
    let _reserved = match reserved {
        Ok(reserved) => reserved,
        Err(full) => return ForwardReply::Outcome(Err(full)),
    };
    // Bounded like the leader's own writes, and below the follower's wait for this
    // answer: the follower learns "unknown" from the leader, not from its own clock.
    let bound = node.config.write_bound();
    let written = match tokio::time::timeout(bound, node.raft.write(command)).await {
        Ok(written) => written,
        Err(_) => {
            return ForwardReply::Unavailable(format!(
                "the write was not committed within {} ms (is a majority of the cluster reachable?); it may or may not be applied",
                bound.as_millis()
            ));
        }
    };
    match written {
        Ok(outcome) => ForwardReply::Outcome(outcome),
        Err(CairnRaftError::ForwardToLeader {
            leader_id,
            leader_addr,
        }) => ForwardReply::NotLeader {
            leader_id,
            leader_addr,
        },
        Err(e) => {
            tracing::warn!("failed to replicate a forwarded command: {e}");
            ForwardReply::Unavailable(e.to_string())
        }
    }
}

/// A read index a leader answers a follower with: `None` when it does not lead (any more).
pub async fn leader_read_index(node: &NodeState) -> Result<Option<u64>, cairn_core::Error> {
    match node.raft.read_index().await {
        Ok(index) => Ok(Some(index)),
        Err(CairnRaftError::ForwardToLeader { .. }) => Ok(None),
        Err(e) => Err(e.into()),
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
        crate::cluster::status(&node)
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
        crate::cluster::add_learner(&node, req.node_id, req.address)
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
        crate::cluster::rejoin(&node, req.node_id, req.address)
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
        crate::cluster::promote(&node, request.into_inner().node_id)
            .await
            .map(tonic::Response::new)
            .map_err(cairn_proto::to_status)
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<tonic::Response<pb::MembershipResponse>, Status> {
        let node = node_of(&self.ready)?;
        crate::cluster::remove(&node, request.into_inner().node_id)
            .await
            .map(tonic::Response::new)
            .map_err(cairn_proto::to_status)
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<tonic::Response<pb::TransferLeaderResponse>, Status> {
        let node = node_of(&self.ready)?;
        crate::cluster::transfer_leader(&node, request.into_inner().node_id)
            .await
            .map(|leader_id| tonic::Response::new(pb::TransferLeaderResponse { leader_id }))
            .map_err(cairn_proto::to_status)
    }

    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<tonic::Response<pb::ForwardResponse>, Status> {
        let node = node_of(&self.ready)?;
        let command: Command = decode(&request.into_inner().command)
            .map_err(|e| Status::invalid_argument(format!("undecodable command: {e}")))?;
        let reply = run_forwarded(&node, command).await;
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
        Ok(tonic::Response::new(ForwardedReplies::new(
            Arc::new(node),
            request.into_inner(),
            self.stop.clone(),
        )))
    }

    async fn read_index(
        &self,
        _request: Request<pb::ReadIndexRequest>,
    ) -> Result<tonic::Response<pb::ReadIndexResponse>, Status> {
        let node = node_of(&self.ready)?;
        let index = leader_read_index(&node)
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
            return Err(not_voting(&node));
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
