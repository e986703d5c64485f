//! Starting and stopping a node: listeners first (health says NOT_SERVING), then storage
//! and Raft, then SERVING; on shutdown the reverse, letting in-flight requests finish.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cairn_proto::cairn_v1::backup_server::BackupServer;
use cairn_proto::cairn_v1::boundaries_server::BoundariesServer;
use cairn_proto::cairn_v1::cluster_server::ClusterServer;
use cairn_proto::cairn_v1::raft_server::RaftServer;
use cairn_proto::cairn_v1::tokens_server::TokensServer;
use cairn_proto::orisun::admin_server::AdminServer;
use cairn_proto::orisun::event_store_server::EventStoreServer;
use cairn_raft::{Formation, NoPeers, NodeOptions, PeerTransport, RaftNode};
use cairn_store::StoreOptions;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::admin::AdminService;
use crate::admission::{Admission, DiskFloor, WriteBudget};
use crate::auth::Authenticator;
use crate::backup::BackupService;
use crate::bootstrap;
use crate::boundaries::BoundariesService;
use crate::config::ServeConfig;
use crate::event_store::EventStoreService;
use crate::grpc_layer::GrpcLayer;
use crate::http::{HttpState, router};
use crate::listeners::{Acceptor, ConnectionLimits, grpc_server, serve_http};
use crate::metrics::Metrics;
use crate::peer::{
    Claims, ClusterIdentity, ClusterService, MAX_PEER_MESSAGE_BYTES, PeerClient, PeerNode,
    PeerReady, RaftService, SecretCheck,
};
use crate::router::Router;
use crate::state::{NodeState, Ready};
use crate::tls::TlsPort;
use crate::tokens::TokensService;

/// Time peers get to close their connections to a stopping node.
const PEER_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Services whose health is reported (plus the server as a whole, "").
const HEALTH_SERVICES: [&str; 3] = ["", "orisun.EventStore", "orisun.Admin"];

/// Why the node could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not be bound.
    #[error("failed to listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// OS error.
        source: std::io::Error,
    },
    /// Metric registration failed.
    #[error("failed to register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// Reflection descriptors are broken.
    #[error("failed to build gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// Raft or storage failed to start or stop.
    #[error(transparent)]
    Raft(#[from] cairn_raft::RaftError),
    /// The cluster secret is not usable in a gRPC header.
    #[error("invalid cluster secret: {0}")]
    Secret(String),
    /// The start-up state (token key, admin user, boundaries) never arrived.
    #[error("failed to bootstrap: {0}")]
    Bootstrap(cairn_core::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// A restored data directory cannot start as it was asked to.
    #[error("{0}")]
    Restore(String),
    /// The cluster id in the data directory cannot be read or kept.
    #[error(transparent)]
    Identity(#[from] crate::peer::identity::IdentityError),
    /// The data directory cannot be created or is not private.
    #[error(transparent)]
    DataDir(#[from] crate::data_dir::DataDirError),
    /// The password-check threads could not be started.
    #[error("failed to start the password-check threads: {0}")]
    Threads(std::io::Error),
    /// The public default admin password on a node others can reach.
    #[error("{0}")]
    DefaultPassword(String),
    /// The TLS files cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// A server task panicked.
    #[error("server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// How long a stopping leader may take to archive its last entries.
const ARCHIVE_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// A running node.
pub struct RunningServer {
    /// Bound gRPC address.
    pub grpc_addr: SocketAddr,
    /// Bound HTTP address.
    pub http_addr: SocketAddr,
    /// Bound peer address (clustered nodes only).
    pub peer_addr: Option<SocketAddr>,
    node: Arc<NodeState>,
    peer: Option<PeerServer>,
    formation_task: Option<JoinHandle<()>>,
    health: HealthReporter,
    serving: Arc<AtomicBool>,
    grpc_stop: CancellationToken,
    http_stop: CancellationToken,
    grpc_task: JoinHandle<Result<(), tonic::transport::Error>>,
    http_task: JoinHandle<()>,
    metrics_task: JoinHandle<()>,
    bootstrap_task: JoinHandle<()>,
    /// The archiver and what stops it (`--archive-to`).
    archive: Option<(CancellationToken, JoinHandle<()>)>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("grpc_addr", &self.grpc_addr)
            .field("http_addr", &self.http_addr)
            .finish_non_exhaustive()
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    for service in HEALTH_SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

/// How often Raft metrics are sampled into the registry.
const RAFT_METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// Samples Raft metrics periodically (following every change would cost work per write).
fn spawn_raft_metrics(node: Arc<NodeState>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let rx = node.raft.raft().metrics();
        let mut last_leader = None;
        let mut tick = tokio::time::interval(RAFT_METRICS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let m = rx.borrow().clone();
            let metrics = &node.metrics;
            metrics.raft_term.set(m.current_term as i64);
            metrics
                .raft_is_leader
                .set(i64::from(m.current_leader == Some(m.id)));
            if m.current_leader != last_leader {
                if m.current_leader.is_some() {
                    metrics.raft_leader_changes.inc();
                }
                last_leader = m.current_leader;
            }
            metrics
                .raft_last_log_index
                .set(m.last_log_index.unwrap_or(0) as i64);
            metrics
                .raft_applied_index
                .set(m.last_applied.map_or(0, |l| l.index) as i64);
            metrics
                .raft_snapshot_index
                .set(m.snapshot.map_or(0, |l| l.index) as i64);
            // Only a leader tracks its peers; followers export no lag series.
            metrics.replication_lag.reset();
            metrics.raft_committed_index.reset();
            if let Some(replication) = &m.replication {
                // Committed = the index a majority of voters has stored.
                let mut matched: Vec<u64> = m
                    .membership_config
                    .membership()
                    .voter_ids()
                    .map(|id| {
                        replication
                            .get(&id)
                            .and_then(|l| l.map(|l| l.index))
                            .unwrap_or(0)
                    })
                    .collect();
                matched.sort_unstable_by(|a, b| b.cmp(a));
                if let Some(committed) = matched.get(matched.len() / 2) {
                    metrics
                        .raft_committed_index
                        .with_label_values(&[&m.id.to_string()])
                        .set(*committed as i64);
                }
                if let Some(last) = m.last_log_index {
                    for (peer, matched) in replication {
                        let matched = matched.map_or(0, |l| l.index);
                        metrics
                            .replication_lag
                            .with_label_values(&[&peer.to_string()])
                            .set(last.saturating_sub(matched) as i64);
                    }
                }
            }
        }
    })
}

/// A boxed future. The entry points below return one instead of being `async fn`: a
/// crate that awaits an `async fn` compiles its whole state machine again (the node's
/// start-up future is large), so every test crate and the binary paid minutes of
/// optimised compile time for a copy of the server. Boxed, it is compiled once, here.
pub type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Starts a node on the configured addresses and returns once it serves.
pub fn start(config: ServeConfig) -> Boxed<Result<RunningServer, ServerError>> {
    Box::pin(async move {
        let grpc_listener = bind(config.listen).await?;
        let http_listener = bind(config.http_listen).await?;
        serve_on(config, grpc_listener, http_listener).await
    })
}

/// The peer port's server.
struct PeerServer {
    stop: CancellationToken,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Serves `cairn.v1.Raft` and `cairn.v1.Cluster` on `listener`, every call checked against
/// the cluster secret; both answer UNAVAILABLE until `ready` is set.
fn spawn_peer_server(
    listener: TcpListener,
    secret: &str,
    tls: Option<TlsPort>,
    ready: PeerReady,
    limits: &ConnectionLimits,
    metrics: &Metrics,
) -> PeerServer {
    let check = SecretCheck::new(Some(secret));
    let stop = CancellationToken::new();
    let raft = tonic::service::interceptor::InterceptedService::new(
        RaftServer::new(RaftService::new(ready.clone()))
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES),
        check.clone(),
    );
    let cluster = tonic::service::interceptor::InterceptedService::new(
        ClusterServer::new(ClusterService::new(ready, stop.clone()))
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES),
        check,
    );
    let mut acceptor = Acceptor::new(
        listener,
        "peer",
        limits.max_peer_connections,
        Some(metrics.connections_refused.with_label_values(&["peer"])),
    );
    if let Some(tls) = tls {
        acceptor = acceptor.with_tls(
            tls,
            Some(metrics.tls_handshake_failures.with_label_values(&["peer"])),
        );
    }
    let task = tokio::spawn(
        grpc_server(limits)
            .add_service(raft)
            .add_service(cluster)
            .serve_with_incoming_shutdown(acceptor.into_stream(), stop.clone().cancelled_owned()),
    );
    PeerServer { stop, task }
}

/// A first start stores the admin password the flags give: with the public default, only
/// on a node nobody else can reach, or when told it is a development machine. Later starts
/// are not refused (the flag no longer matters, and an upgrade must not stop a running
/// cluster); they warn while the stored password is the default.
fn refuse_default_password(config: &ServeConfig, client_addr: SocketAddr) -> Result<(), String> {
    if config.admin_password != crate::config::defaults::ADMIN_PASSWORD
        || config.allow_default_password
    {
        return Ok(());
    }
    let exposure = if config.cluster.is_some() {
        "clustered"
    } else if !client_addr.ip().is_loopback() {
        "listening on a non-loopback address"
    } else {
        return Ok(());
    };
    let first_start = std::fs::read_dir(&config.data_dir).map_or(true, |mut d| d.next().is_none());
    if !first_start {
        return Ok(());
    }
    Err(format!(
        "refusing the first start of a node that is {exposure} with the public default admin \
         password \"{}\": set --admin-password (or CAIRN_ADMIN_PASSWORD), or pass \
         --allow-default-password on a development machine",
        crate::config::defaults::ADMIN_PASSWORD
    ))
}

/// The client-facing ports' TLS, loaded and watched for renewals.
struct ClientTls {
    material: tokio::sync::watch::Receiver<Arc<crate::tls::Material>>,
    http: bool,
    handshake_timeout: std::time::Duration,
}

/// Loads certificate files (a start-up error when they cannot be used) and starts their
/// reloader.
fn watched_tls(
    files: &crate::tls::TlsFiles,
    reload_interval: std::time::Duration,
    metrics: &Metrics,
) -> Result<tokio::sync::watch::Receiver<Arc<crate::tls::Material>>, crate::tls::TlsError> {
    let material = crate::tls::Material::load(files)?;
    Ok(crate::tls::spawn_reloader(
        files.clone(),
        material,
        reload_interval,
        crate::tls::TlsMetrics {
            expiry: metrics.tls_certificate_expiry.clone(),
            reloads: metrics.tls_reloads.clone(),
        },
    ))
}

fn client_tls(
    config: Option<&crate::tls::TlsConfig>,
    metrics: &Metrics,
) -> Result<Option<ClientTls>, crate::tls::TlsError> {
    let Some(config) = config else {
        return Ok(None);
    };
    Ok(Some(ClientTls {
        material: watched_tls(&config.files, config.reload_interval, metrics)?,
        http: config.http,
        handshake_timeout: config.handshake_timeout,
    }))
}

/// Starts a node on already-bound listeners (the configured addresses are ignored) and
/// returns once it serves. Clients may connect as soon as this is called: until storage
/// and Raft are up, health reports NOT_SERVING and other calls UNAVAILABLE.
pub fn start_on(
    config: ServeConfig,
    grpc_listener: TcpListener,
    http_listener: TcpListener,
) -> Boxed<Result<RunningServer, ServerError>> {
    Box::pin(serve_on(config, grpc_listener, http_listener))
}

async fn serve_on(
    config: ServeConfig,
    grpc_listener: TcpListener,
    http_listener: TcpListener,
) -> Result<RunningServer, ServerError> {
    let metrics = Arc::new(Metrics::new()?);
    let ready: Ready = Arc::new(OnceLock::new());
    let serving = Arc::new(AtomicBool::new(false));

    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            addr: config.http_listen,
            source,
        })?;
    refuse_default_password(&config, grpc_addr).map_err(ServerError::DefaultPassword)?;

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;
    // Reflection describes the Orisun services, Cairn's client-port extensions, the error
    // details Cairn's statuses carry, and health (grpcurl needs the health
    // schema to call it); the reflection services add their own descriptors.
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cairn_proto::ORISUN_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(cairn_proto::CAIRN_CLIENT_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(cairn_proto::ERROR_DETAILS_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cairn_proto::ORISUN_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(cairn_proto::CAIRN_CLIENT_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(cairn_proto::ERROR_DETAILS_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let max = config.max_message_bytes;
    // A page stops at the event that reaches the byte budget, so a response is below the
    // budget plus one event (at most a whole request, for events stored before a lower
    // --max-event-bytes) plus protobuf framing.
    let max_reply = config
        .max_response_bytes
        .saturating_mul(2)
        .saturating_add(max);
    let event_store = EventStoreServer::new(EventStoreService::new(ready.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max_reply)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    let admin = AdminServer::new(AdminService::new(ready.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max_reply)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);

    let boundaries = BoundariesServer::new(BoundariesService::new(ready.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max_reply)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    let tokens = TokensServer::new(TokensService::new(ready.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max_reply);
    let backup = BackupServer::new(BackupService::new(ready.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(crate::backup::MAX_BACKUP_MESSAGE_BYTES);

    let limits = config.connection_limits;
    let tls = client_tls(config.tls.as_ref(), &metrics)?;
    let peer_tls = match config.cluster.as_ref().and_then(|c| c.tls.as_ref()) {
        Some(peer) => Some((
            watched_tls(&peer.files, peer.reload_interval, &metrics)?,
            peer.handshake_timeout,
        )),
        None => None,
    };
    let peer_port_tls = match &peer_tls {
        Some((material, handshake_timeout)) => Some(TlsPort::new(
            material.clone(),
            crate::tls::ALPN_GRPC,
            true,
            *handshake_timeout,
        )?),
        None => None,
    };
    let grpc_stop = CancellationToken::new();
    let mut client_acceptor = Acceptor::new(
        grpc_listener,
        "client",
        limits.max_connections,
        Some(metrics.connections_refused.with_label_values(&["client"])),
    );
    if let Some(tls) = &tls {
        client_acceptor = client_acceptor.with_tls(
            TlsPort::new(
                tls.material.clone(),
                crate::tls::ALPN_GRPC,
                true,
                tls.handshake_timeout,
            )?,
            Some(
                metrics
                    .tls_handshake_failures
                    .with_label_values(&["client"]),
            ),
        );
    }
    let http_tls = match &tls {
        Some(tls) if tls.http => Some(TlsPort::new(
            tls.material.clone(),
            crate::tls::ALPN_HTTP,
            false,
            tls.handshake_timeout,
        )?),
        _ => None,
    };
    let grpc_task = tokio::spawn(
        grpc_server(&limits)
            .layer(GrpcLayer::new(ready.clone(), metrics.clone()))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(event_store)
            .add_service(admin)
            .add_service(boundaries)
            .add_service(tokens)
            .add_service(backup)
            .serve_with_incoming_shutdown(
                client_acceptor.into_stream(),
                grpc_stop.clone().cancelled_owned(),
            ),
    );
    let http_stop = CancellationToken::new();
    let http_state = HttpState {
        ready: ready.clone(),
        metrics: metrics.clone(),
        serving: serving.clone(),
    };
    let mut http_acceptor = Acceptor::new(
        http_listener,
        "HTTP",
        limits.max_http_connections,
        Some(metrics.connections_refused.with_label_values(&["http"])),
    );
    if let Some(port) = http_tls {
        http_acceptor = http_acceptor.with_tls(
            port,
            Some(metrics.tls_handshake_failures.with_label_values(&["http"])),
        );
    }
    let http_task = tokio::spawn(serve_http(
        http_acceptor,
        router(http_state),
        limits.http_header_read_timeout,
        http_stop.clone(),
    ));
    let peer_ready: PeerReady = Arc::new(OnceLock::new());
    let peer_listener = match &config.cluster {
        Some(cluster) => match bind(cluster.peer_listen).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                grpc_stop.cancel();
                http_stop.cancel();
                let _ = grpc_task.await;
                let _ = http_task.await;
                return Err(e);
            }
        },
        None => None,
    };
    let peer_addr = peer_listener.as_ref().and_then(|l| l.local_addr().ok());
    let peer = match (&config.cluster, peer_listener) {
        (Some(cluster), Some(listener)) => Some(spawn_peer_server(
            listener,
            &cluster.secret,
            peer_port_tls,
            peer_ready.clone(),
            &limits,
            &metrics,
        )),
        _ => None,
    };
    // Empty when the node runs alone.
    let peer_addr_text = peer_addr.map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(%grpc_addr, %http_addr, peer_addr = %peer_addr_text, "listening; opening storage");

    let started = async {
        crate::data_dir::prepare(&config.data_dir, config.allow_insecure_permissions)?;
        // A backup checkpoint a dead process left behind pins files nobody will stream.
        crate::backup::clear_staging(&config.data_dir).map_err(|source| {
            crate::data_dir::DataDirError::Io {
                what: "remove the stale backup checkpoints in",
                path: config.data_dir.display().to_string(),
                source,
            }
        })?;
        crate::backup::load_last_success(&config.data_dir, &metrics);
        let identity = ClusterIdentity::load(&config.data_dir)?;
        if config
            .data_dir
            .join(crate::backup::RESTORED_MARKER)
            .exists()
        {
            crate::backup::check_restored_start(&config).map_err(ServerError::Restore)?;
        }
        let (peers, transport, formation) = match &config.cluster {
            Some(cluster) => {
                let local_ip = Some(cluster.peer_listen.ip()).filter(|ip| !ip.is_unspecified());
                let peers = Arc::new(
                    PeerClient::new(Some(&cluster.secret), local_ip)
                        .map_err(ServerError::Secret)?
                        .with_tls(peer_tls.as_ref().map(|(material, _)| material.clone()))
                        .counting_snapshot_chunks(metrics.snapshot_chunks_sent.clone())
                        .counting_forward_messages(metrics.forward_message_writes.clone())
                        .forwarding_within(config.forward_timeout())
                        .with_identity(identity.clone()),
                );
                let transport: Arc<dyn PeerTransport> = peers.clone();
                (peers, transport, Formation::Member)
            }
            None => {
                let peers = Arc::new(PeerClient::new(None, None).map_err(ServerError::Secret)?);
                let transport: Arc<dyn PeerTransport> = Arc::new(NoPeers);
                (peers, transport, Formation::Alone)
            }
        };
        let alone = formation == Formation::Alone;
        let raft = RaftNode::start(NodeOptions {
            node_id: config.node_id,
            data_dir: config.data_dir.clone(),
            advertise_addr: config.advertise_addr.clone(),
            formation,
            transport,
            timing: config.timing,
            snapshot_every_entries: config.snapshot_every_entries,
            snapshot_every_bytes: config.snapshot_every_bytes,
            log_entries_kept: config.raft_log_kept,
            store: StoreOptions {
                block_cache_bytes: config.block_cache_bytes,
                memtable_bytes: config.memtable_bytes,
            },
            lock_wait: config.lock_wait,
            observer: metrics.clone(),
            max_inflight_batches: config.max_inflight_batches,
            archive_hold: config.archive.is_some(),
        })
        .await?;
        if alone {
            // A group of one is formed (or was, by an older version) by this node alone.
            identity.form()?;
        }
        let passwords = crate::password::PasswordChecks::start(config.password_limits)
            .map_err(ServerError::Threads)?;
        let admission = Arc::new(Admission {
            budget: WriteBudget::new(config.max_write_bytes_in_flight),
            floor: DiskFloor::new(config.data_dir.clone(), config.min_free_disk_bytes),
        });
        let router = Arc::new(Router::new(
            raft.clone(),
            peers.clone(),
            admission.clone(),
            metrics.clone(),
            &config,
        ));
        let node = Arc::new(NodeState {
            auth: Authenticator::new(
                raft.store().clone(),
                crate::auth::TokenLifetime {
                    ttl: config.token_ttl,
                    max_age: config.token_max_age,
                },
                passwords,
            ),
            raft: raft.clone(),
            router: router.clone(),
            peers,
            metrics: metrics.clone(),
            config: config.clone(),
            process_id: uuid::Uuid::new_v4().to_string(),
            shutdown: CancellationToken::new(),
            subscriptions: Arc::new(crate::subscription::Registry::new(
                config.max_subscriptions,
                config.max_subscriptions_per_user,
            )),
            identity: identity.clone(),
        });
        // Peers reach Raft from here on: a new member must take part in elections and
        // receive the log before it can serve.
        let _ = peer_ready.set(PeerNode {
            raft,
            claims: Claims::new(&config),
            admission,
            leader: router,
            cluster: node.clone(),
            identity,
        });
        let formation_task = crate::formation::spawn(node.clone());
        let bootstrap_task = bootstrap::spawn(node.clone());
        if let Err(e) = bootstrap::wait_until_ready(&node).await {
            bootstrap_task.abort();
            if let Some(formation) = formation_task {
                formation.abort();
            }
            if let Err(e) = node.raft.shutdown().await {
                tracing::warn!("failed to stop raft after a failed start: {e}");
            }
            return Err(ServerError::Bootstrap(e));
        }
        if let Err(e) = crate::backup::seal_restored(&node).await {
            bootstrap_task.abort();
            if let Err(e) = node.raft.shutdown().await {
                tracing::warn!("failed to stop raft after a failed start: {e}");
            }
            return Err(ServerError::Restore(e));
        }
        bootstrap::warn_if_default_admin_password(&node).await;
        Ok::<_, ServerError>((node, bootstrap_task, formation_task))
    }
    .await;
    let (node, bootstrap_task, formation_task) = match started {
        Ok(started) => started,
        Err(e) => {
            grpc_stop.cancel();
            http_stop.cancel();
            let _ = grpc_task.await;
            let _ = http_task.await;
            if let Some(peer) = peer {
                peer.stop.cancel();
                let _ = peer.task.await;
            }
            return Err(e);
        }
    };
    let metrics_task = spawn_raft_metrics(node.clone());
    let archive = config.archive.clone().map(|archive| {
        let stop = CancellationToken::new();
        let task = crate::archive::spawn(node.clone(), archive, stop.clone());
        (stop, task)
    });
    // Ends when the node shuts down.
    crate::subscription::spawn_renewals(node.clone());
    // The slot is set exactly once, here.
    let _ = ready.set(node.clone());
    serving.store(true, Ordering::Release);
    set_health(&health, ServingStatus::Serving).await;
    tracing::info!(
        %grpc_addr,
        %http_addr,
        peer_addr = %peer_addr_text,
        data_dir = %config.data_dir.display(),
        node_id = config.node_id,
        "cairn is serving"
    );
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        peer_addr,
        node,
        peer,
        formation_task,
        health,
        serving,
        grpc_stop,
        http_stop,
        grpc_task,
        http_task,
        metrics_task,
        bootstrap_task,
        archive,
    })
}

impl RunningServer {
    /// The node's shared state (tests, tools).
    pub fn node(&self) -> &Arc<NodeState> {
        &self.node
    }

    /// Resolves with the reason once Raft stops on its own (a storage error): the node can
    /// no longer write or catch up, and its process should exit so that it is restarted.
    pub fn fatal(&self) -> Boxed<String> {
        let node = self.node.clone();
        Box::pin(async move { node.raft.stopped().await })
    }

    /// Graceful shutdown: report NOT_SERVING, end subscriptions, stop accepting, let
    /// in-flight requests finish (up to the grace period), hand leadership to a caught-up
    /// voter when leading, stop Raft, sync and close RocksDB.
    pub fn shutdown(self) -> Boxed<Result<(), ServerError>> {
        Box::pin(self.shut_down())
    }

    async fn shut_down(self) -> Result<(), ServerError> {
        tracing::info!("shutting down");
        self.serving.store(false, Ordering::Release);
        set_health(&self.health, ServingStatus::NotServing).await;
        self.node.shutdown.cancel();
        self.grpc_stop.cancel();
        let grace = self.node.config.shutdown_grace;
        let mut grpc_task = self.grpc_task;
        match tokio::time::timeout(grace, &mut grpc_task).await {
            Ok(joined) => joined??,
            Err(_) => {
                tracing::warn!(
                    "in-flight requests did not finish within {}s; cutting them off",
                    grace.as_secs()
                );
                grpc_task.abort();
            }
        }
        self.http_stop.cancel();
        self.http_task.await?;
        if let Some((stop, mut task)) = self.archive {
            // The writes just drained are committed: ship them while this node leads.
            stop.cancel();
            if tokio::time::timeout(ARCHIVE_SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
            {
                tracing::warn!(
                    "the archive did not take the last entries within {}s; the next leader ships them",
                    ARCHIVE_SHUTDOWN_GRACE.as_secs()
                );
                task.abort();
            }
        }
        self.metrics_task.abort();
        self.bootstrap_task.abort();
        if let Some(formation) = self.formation_task {
            formation.abort();
        }
        // The peer port still serves: Raft can elect the successor before this node stops.
        match crate::cluster::step_down(&self.node).await {
            Ok(Some(successor)) => tracing::info!("handed leadership to node {successor}"),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "failed to hand over leadership before stopping (the others elect a leader after their election timeout): {e}"
            ),
        }
        self.node.raft.shutdown().await?;
        if let Some(peer) = self.peer {
            peer.stop.cancel();
            let mut task = peer.task;
            match tokio::time::timeout(PEER_SHUTDOWN_GRACE, &mut task).await {
                Ok(joined) => {
                    if let Err(e) = joined? {
                        tracing::warn!("peer server ended with an error: {e}");
                    }
                }
                // Peers hold their connections open; they reconnect to the next instance.
                Err(_) => task.abort(),
            }
        }
        tracing::info!("shut down cleanly");
        Ok(())
    }
}
