//! Starting and stopping a node: listeners first (health says NOT_SERVING), then storage
//! and Raft, then SERVING; on shutdown the reverse, letting in-flight requests finish.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cairn_core::command::Command;
use cairn_proto::orisun::admin_server::AdminServer;
use cairn_proto::orisun::event_store_server::EventStoreServer;
use cairn_raft::{NodeOptions, RaftNode};
use cairn_store::StoreOptions;
use rand::RngCore;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::admin::{AdminService, create_user};
use crate::auth::Authenticator;
use crate::config::{ServeConfig, defaults};
use crate::event_store::EventStoreService;
use crate::grpc_layer::GrpcLayer;
use crate::http::{HttpState, router};
use crate::metrics::Metrics;
use crate::state::{NodeState, Ready};

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
    /// Bootstrap (token key, admin user, boundaries) failed.
    #[error("failed to bootstrap: {0}")]
    Bootstrap(cairn_core::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// A server task panicked.
    #[error("server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A running node.
pub struct RunningServer {
    /// Bound gRPC address.
    pub grpc_addr: SocketAddr,
    /// Bound HTTP address.
    pub http_addr: SocketAddr,
    node: Arc<NodeState>,
    health: HealthReporter,
    serving: Arc<AtomicBool>,
    grpc_stop: CancellationToken,
    http_stop: CancellationToken,
    grpc_task: JoinHandle<Result<(), tonic::transport::Error>>,
    http_task: JoinHandle<std::io::Result<()>>,
    metrics_task: JoinHandle<()>,
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

/// Description of the admin boundary in the catalog.
const ADMIN_BOUNDARY_DESCRIPTION: &str = "admin boundary (B5): Orisun clients read it in their start-up health check; Cairn keeps its catalog outside boundaries, so it holds only what clients write";
/// Description of a boundary declared with `--boundaries`.
const DECLARED_BOUNDARY_DESCRIPTION: &str = "declared in server configuration";

/// Idempotent start-up writes: the token key, the bootstrap admin, the admin boundary and
/// the configured boundaries.
async fn bootstrap(node: &NodeState) -> Result<(), cairn_core::Error> {
    let mut key = vec![0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    node.execute(Command::InitTokenKey { key }).await?;
    let config = &node.config;
    create_user(
        node,
        "Administrator".to_string(),
        config.admin_username.clone(),
        config.admin_password.clone(),
        &["ADMIN".to_string()],
        true,
    )
    .await?;
    if config.admin_password == defaults::ADMIN_PASSWORD {
        tracing::warn!(
            "THE ADMIN PASSWORD IS THE PUBLIC DEFAULT \"{}\": set --admin-password / CAIRN_ADMIN_PASSWORD before exposing this node",
            defaults::ADMIN_PASSWORD
        );
    }
    let admin = std::iter::once((&config.admin_boundary, ADMIN_BOUNDARY_DESCRIPTION));
    let declared = config
        .boundaries
        .iter()
        .filter(|name| **name != config.admin_boundary)
        .map(|name| (name, DECLARED_BOUNDARY_DESCRIPTION));
    for (name, description) in admin.chain(declared) {
        node.execute(Command::CreateBoundary {
            name: name.clone(),
            description: description.to_string(),
            placement: None,
            existed_before_catalog: false,
            idempotent_event_ids: false,
            if_absent: true,
        })
        .await?;
    }
    Ok(())
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

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;
    // Reflection describes the Orisun services and health (grpcurl needs the health
    // schema to call it); the reflection services add their own descriptors.
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cairn_proto::ORISUN_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cairn_proto::ORISUN_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let max = config.max_message_bytes;
    let event_store = EventStoreServer::new(EventStoreService::new(ready.clone()))
        .max_decoding_message_size(max)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    let admin = AdminServer::new(AdminService::new(ready.clone()))
        .max_decoding_message_size(max)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);

    let grpc_stop = CancellationToken::new();
    let grpc_task = tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .layer(GrpcLayer::new(ready.clone(), metrics.clone()))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(event_store)
            .add_service(admin)
            .serve_with_incoming_shutdown(
                // serve_with_incoming ignores the builder's TCP settings: without NODELAY,
                // Nagle holds a response's trailing frames for the client's delayed ACK (40 ms).
                TcpListenerStream::new(grpc_listener).map(|accepted| {
                    accepted.inspect(|stream| {
                        if let Err(e) = stream.set_nodelay(true) {
                            tracing::warn!("failed to set TCP_NODELAY on a client connection: {e}");
                        }
                    })
                }),
                grpc_stop.clone().cancelled_owned(),
            ),
    );
    let http_stop = CancellationToken::new();
    let http_state = HttpState {
        ready: ready.clone(),
        metrics: metrics.clone(),
        serving: serving.clone(),
    };
    let http_task = tokio::spawn(
        axum::serve(http_listener, router(http_state))
            .with_graceful_shutdown(http_stop.clone().cancelled_owned())
            .into_future(),
    );
    tracing::info!(%grpc_addr, %http_addr, "listening; opening storage");

    let started = async {
        let raft = RaftNode::start(NodeOptions {
            node_id: config.node_id,
            data_dir: config.data_dir.clone(),
            advertise_addr: config.advertise_addr.clone(),
            snapshot_every_entries: config.snapshot_every_entries,
            snapshot_every_bytes: config.snapshot_every_bytes,
            store: StoreOptions {
                block_cache_bytes: config.block_cache_bytes,
                memtable_bytes: config.memtable_bytes,
            },
            lock_wait: config.lock_wait,
            observer: metrics.clone(),
            max_inflight_batches: config.max_inflight_batches,
        })
        .await?;
        let node = Arc::new(NodeState {
            auth: Authenticator::new(raft.store().clone(), config.token_ttl),
            raft,
            metrics: metrics.clone(),
            config: config.clone(),
            process_id: uuid::Uuid::new_v4().to_string(),
            shutdown: CancellationToken::new(),
            subscriptions: Default::default(),
        });
        bootstrap(&node).await.map_err(ServerError::Bootstrap)?;
        Ok::<_, ServerError>(node)
    }
    .await;
    let node = match started {
        Ok(node) => node,
        Err(e) => {
            grpc_stop.cancel();
            http_stop.cancel();
            let _ = grpc_task.await;
            let _ = http_task.await;
            return Err(e);
        }
    };
    let metrics_task = spawn_raft_metrics(node.clone());
    // The slot is set exactly once, here.
    let _ = ready.set(node.clone());
    serving.store(true, Ordering::Release);
    set_health(&health, ServingStatus::Serving).await;
    tracing::info!(
        %grpc_addr,
        %http_addr,
        data_dir = %config.data_dir.display(),
        node_id = config.node_id,
        "cairn is serving"
    );
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        node,
        health,
        serving,
        grpc_stop,
        http_stop,
        grpc_task,
        http_task,
        metrics_task,
    })
}

impl RunningServer {
    /// The node's shared state (tests, tools).
    pub fn node(&self) -> &Arc<NodeState> {
        &self.node
    }

    /// Graceful shutdown: report NOT_SERVING, end subscriptions, stop accepting, let
    /// in-flight requests finish (up to the grace period), stop Raft, sync and close RocksDB.
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
        if let Err(e) = self.http_task.await? {
            tracing::warn!("HTTP server ended with an error: {e}");
        }
        self.metrics_task.abort();
        self.node.raft.shutdown().await?;
        tracing::info!("shut down cleanly");
        Ok(())
    }
}
