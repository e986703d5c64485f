//! Dialling other nodes' peer ports: one lazily connected channel per peer address,
//! redialled with the new certificate after a renewal; openraft's transport.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_proto::CLUSTER_SECRET_HEADER as SECRET_HEADER;
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::cluster_client::ClusterClient;
use cairn_proto::cairn_v1::raft_client::RaftClient;
use cairn_raft::codec::{decode, encode, encode_append_entries};
use cairn_raft::{PeerTransport, RpcResult, TypeConfig};
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
use tokio::sync::watch;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use super::forward_client::ForwardStreams;
use super::identity::{CLUSTER_ID_HEADER, ClusterIdentity};
use super::{CLUSTER_CALL_TIMEOUT, MAX_PEER_MESSAGE_BYTES};
use crate::tls::Material;

/// How long a peer connection may take to establish.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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
    pub(super) secret: Option<MetadataValue<tonic::metadata::Ascii>>,
    local_ip: Option<IpAddr>,
    channels: Mutex<Channels>,
    pub(super) streams: ForwardStreams,
    snapshot_chunks_sent: Option<prometheus::IntCounter>,
    /// How long a forwarded write waits for the leader's answer.
    pub(super) forward_timeout: Duration,
    /// The group this node belongs to, named on every call (`None`: a tool's client).
    identity: Option<ClusterIdentity>,
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
            identity: None,
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

    /// Names this node's cluster on every call, once it has an id (see
    /// [`super::identity`]).
    pub fn with_identity(mut self, identity: ClusterIdentity) -> Self {
        self.identity = Some(identity);
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

    /// What every peer call carries: the cluster secret, and the cluster id once known.
    pub(super) fn headers(&self) -> MetadataMap {
        let mut headers = MetadataMap::new();
        if let Some(secret) = &self.secret {
            headers.insert(SECRET_HEADER, secret.clone());
        }
        // Ids are hex digits: always a valid header value.
        if let Some(id) = self.identity.as_ref().and_then(ClusterIdentity::id)
            && let Ok(value) = id.parse()
        {
            headers.insert(CLUSTER_ID_HEADER, value);
        }
        headers
    }

    pub(super) fn request<T>(&self, message: T, timeout: Duration) -> Request<T> {
        let mut request =
            Request::from_parts(self.headers(), tonic::Extensions::default(), message);
        request.set_timeout(timeout);
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
