//! Connections with credentials: one Basic login per connection, then the session token the
//! server returned (`x-auth-token`), so the benchmark measures requests, not password hashing.

use std::path::Path;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use base64::Engine;
use cairn_proto::orisun as pb;
use cairn_proto::orisun::admin_client::AdminClient;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
#[cfg(feature = "tls")]
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tonic::transport::{Channel, Endpoint};

use crate::direct::DirectChannel;

/// How to reach the servers.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// gRPC endpoints.
    pub endpoints: Vec<String>,
    /// User.
    pub user: String,
    /// Password.
    pub password: String,
    /// TLS material for https:// endpoints.
    pub tls: TlsFiles,
    /// How scenario requests reach the server.
    pub transport: Transport,
}

/// PEM contents of the TLS files, read once.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// CA that signed the servers' certificates (default: the system's roots).
    pub ca: Option<Vec<u8>>,
    /// Client certificate chain and its key, for servers that require one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Reads the given files, naming the one that cannot be read.
    pub fn read(ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> anyhow::Result<TlsFiles> {
        let read = |path: &Path| {
            std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))
        };
        Ok(TlsFiles {
            ca: ca.map(read).transpose()?,
            identity: match identity {
                Some((cert, key)) => Some((read(cert)?, read(key)?)),
                None => None,
            },
        })
    }

    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }
}

impl ConnectOptions {
    /// TLS is chosen by the endpoint's scheme; TLS files with an http:// endpoint are a
    /// mistake to report, not a reason to send the password in clear.
    pub fn check_schemes(&self) -> anyhow::Result<()> {
        if self.tls.is_empty() {
            return Ok(());
        }
        match self.endpoints.iter().find(|e| !e.starts_with("https://")) {
            Some(plain) => {
                anyhow::bail!("TLS files were given, but {plain} is not an https:// endpoint")
            }
            None => Ok(()),
        }
    }
}

/// How scenario requests reach the server (setup and admin calls always use tonic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// `direct` for plaintext endpoints, `tonic` with TLS.
    Auto,
    /// The lean unary caller over h2 (plaintext only): the least client CPU per request,
    /// so more of a shared machine is left to the server under test.
    Direct,
    /// tonic's generated client (any endpoint).
    Tonic,
}

/// Adds the current credentials to each request.
#[derive(Clone)]
pub struct Auth {
    header: Arc<RwLock<(&'static str, AsciiMetadataValue)>>,
}

impl Interceptor for Auth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let (name, value) = self
            .header
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        request.metadata_mut().insert(name, value);
        Ok(request)
    }
}

impl Auth {
    /// Switches to a session token returned by the server.
    pub fn adopt_token(&self, metadata: &MetadataMap) {
        if let Some(token) = metadata.get("x-auth-token") {
            *self.header.write().unwrap_or_else(|p| p.into_inner()) =
                ("x-auth-token", token.clone());
        }
    }
}

type Svc = InterceptedService<Channel, Auth>;

/// How long to keep trying to reach an endpoint that refuses connections.
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long to wait for a node that reports it is still starting.
const STARTUP_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One connection (HTTP/2 channel) with its clients.
#[derive(Clone)]
pub struct Connection {
    /// Admin.
    pub admin: AdminClient<Svc>,
    /// The EventStore calls scenarios make, over the chosen transport.
    pub calls: Calls,
}

/// The EventStore calls the scenarios make, over the transport chosen by `--transport`.
#[derive(Clone)]
pub enum Calls {
    /// Lean unary calls straight over h2 (a second connection to the same endpoint).
    Direct(DirectChannel),
    /// tonic's client on the connection's channel.
    Tonic(EventStoreClient<Svc>),
}

impl Calls {
    /// SaveEventsV2.
    pub async fn save_events_v2(
        &mut self,
        request: pb::SaveEventsV2Request,
    ) -> Result<pb::WriteResult, tonic::Status> {
        match self {
            Calls::Direct(d) => d.unary("/orisun.EventStore/SaveEventsV2", &request).await,
            Calls::Tonic(c) => Ok(c.save_events_v2(request).await?.into_inner()),
        }
    }

    /// GetEvents.
    pub async fn get_events(
        &mut self,
        request: pb::GetEventsRequest,
    ) -> Result<pb::GetEventsResponse, tonic::Status> {
        match self {
            Calls::Direct(d) => d.unary("/orisun.EventStore/GetEvents", &request).await,
            Calls::Tonic(c) => Ok(c.get_events(request).await?.into_inner()),
        }
    }

    /// GetLatestByCriteria.
    pub async fn get_latest_by_criteria(
        &mut self,
        request: pb::GetLatestByCriteriaRequest,
    ) -> Result<pb::GetLatestByCriteriaResponse, tonic::Status> {
        match self {
            Calls::Direct(d) => {
                d.unary("/orisun.EventStore/GetLatestByCriteria", &request)
                    .await
            }
            Calls::Tonic(c) => Ok(c.get_latest_by_criteria(request).await?.into_inner()),
        }
    }
}

fn needs_tls(endpoint: &str) -> bool {
    endpoint.starts_with("https://")
}

#[cfg(feature = "tls")]
fn tls(ep: Endpoint, options: &ConnectOptions) -> anyhow::Result<Endpoint> {
    let mut config = match &options.tls.ca {
        Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    if let Some((cert, key)) = &options.tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    Ok(ep.tls_config(config)?)
}

#[cfg(not(feature = "tls"))]
fn tls(ep: Endpoint, _options: &ConnectOptions) -> anyhow::Result<Endpoint> {
    anyhow::bail!(
        "{} needs TLS, and this cairn-bench was built without it: \
         cargo build --release -p cairn-bench --features tls",
        ep.uri()
    )
}

async fn channel(options: &ConnectOptions, endpoint: &str) -> anyhow::Result<Channel> {
    let mut ep = Endpoint::from_shared(endpoint.to_string())
        .with_context(|| format!("invalid endpoint {endpoint:?}"))?
        .tcp_nodelay(true);
    if needs_tls(endpoint) {
        ep = tls(ep, options)?;
    }
    // A server that was just started may not listen yet: retry briefly.
    let deadline = std::time::Instant::now() + CONNECT_WAIT;
    loop {
        match ep.connect().await {
            Ok(channel) => return Ok(channel),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("failed to connect to {endpoint}")),
        }
    }
}

impl Connection {
    /// Opens connection number `index` (endpoints are used round-robin) and logs in.
    pub async fn open(options: &ConnectOptions, index: usize) -> anyhow::Result<Connection> {
        let endpoint = &options.endpoints[index % options.endpoints.len()];
        let channel = channel(options, endpoint).await?;
        let basic = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", options.user, options.password));
        let auth = Auth {
            header: Arc::new(RwLock::new((
                "authorization",
                format!("Basic {basic}")
                    .parse()
                    .context("credentials are not ASCII")?,
            ))),
        };
        let mut es = EventStoreClient::with_interceptor(channel.clone(), auth.clone())
            .max_decoding_message_size(256 * 1024 * 1024);
        let admin = AdminClient::with_interceptor(channel, auth.clone());
        // A node that is still starting answers UNAVAILABLE: wait for it, within reason.
        let deadline = std::time::Instant::now() + STARTUP_WAIT;
        let pong = loop {
            match es.ping(pb::PingRequest {}).await {
                Ok(pong) => break pong,
                Err(status)
                    if status.code() == tonic::Code::Unavailable
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                Err(status) => {
                    return Err(status).with_context(|| format!("login to {endpoint} failed"));
                }
            }
        };
        auth.adopt_token(pong.metadata());
        let calls = match (options.transport, needs_tls(endpoint)) {
            (Transport::Direct, true) => {
                anyhow::bail!("--transport direct speaks plaintext only; {endpoint} needs TLS")
            }
            (Transport::Tonic, _) | (Transport::Auto, true) => Calls::Tonic(es.clone()),
            (Transport::Direct | Transport::Auto, false) => {
                Calls::Direct(DirectChannel::connect(endpoint, auth.header.clone()).await?)
            }
        };
        Ok(Connection { admin, calls })
    }
}
