//! Test harness: real Cairn servers on `127.0.0.1:0` with temporary data directories, and
//! tonic clients generated from `proto/orisun`.

use std::time::Duration;

use base64::Engine;
use cairn_proto::cairn_v1::boundaries_client::BoundariesClient;
use cairn_proto::cairn_v1::tokens_client::TokensClient;
use cairn_proto::orisun as pb;
use cairn_proto::orisun::admin_client::AdminClient;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use cairn_server::{RunningServer, ServeConfig};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic::{Request, Status};

pub use cairn_proto::{cairn_v1, orisun};

pub mod pki;

/// Default admin credentials of a test server.
pub const ADMIN: (&str, &str) = ("admin", "changeit");

/// Adds credentials to every request.
#[derive(Clone)]
pub struct Credentials {
    header: Option<(&'static str, MetadataValue<tonic::metadata::Ascii>)>,
}

impl Credentials {
    /// HTTP Basic.
    pub fn basic(user: &str, password: &str) -> Self {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Credentials {
            header: Some((
                "authorization",
                format!("Basic {encoded}").parse().expect("ascii header"),
            )),
        }
    }

    /// A session token.
    pub fn token(token: &str) -> Self {
        Credentials {
            header: Some(("x-auth-token", token.parse().expect("ascii token"))),
        }
    }

    /// Nothing.
    pub fn none() -> Self {
        Credentials { header: None }
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some((name, value)) = &self.header {
            request.metadata_mut().insert(*name, value.clone());
        }
        Ok(request)
    }
}

/// Clients of one server with one set of credentials.
#[derive(Clone)]
pub struct Client {
    /// EventStore.
    pub es: EventStoreClient<InterceptedService<Channel, Credentials>>,
    /// Admin.
    pub admin: AdminClient<InterceptedService<Channel, Credentials>>,
    /// Cairn's boundary extensions (`cairn.v1.Boundaries`).
    pub boundaries: BoundariesClient<InterceptedService<Channel, Credentials>>,
    /// Cairn's session-token key administration (`cairn.v1.Tokens`).
    pub tokens: TokensClient<InterceptedService<Channel, Credentials>>,
}

/// A server under test.
pub struct TestServer {
    server: Option<RunningServer>,
    /// Data directory (kept until drop).
    pub dir: tempfile::TempDir,
    /// gRPC address.
    pub addr: std::net::SocketAddr,
    /// HTTP address.
    pub http_addr: std::net::SocketAddr,
    channel: Channel,
    tls: Option<ClientTlsConfig>,
}

/// A channel to the gRPC port at `addr`: plaintext, or TLS with `tls` (the server's
/// certificate must name 127.0.0.1).
pub async fn connect(
    addr: std::net::SocketAddr,
    tls: Option<&ClientTlsConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Channel::from_shared(format!("{scheme}://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    endpoint.connect().await
}

impl TestServer {
    /// Starts a server with the test defaults (boundary `default`).
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    /// Starts a server after adjusting its configuration.
    pub async fn start_with(adjust: impl FnOnce(&mut ServeConfig)) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(dir, adjust).await
    }

    /// Starts a server on an existing data directory.
    pub async fn start_in(
        dir: tempfile::TempDir,
        adjust: impl FnOnce(&mut ServeConfig),
    ) -> TestServer {
        Self::start_over(dir, None, adjust).await
    }

    /// Starts a server whose clients connect with `tls` (`None`: plaintext); `adjust`
    /// gives the server its TLS files.
    pub async fn start_over(
        dir: tempfile::TempDir,
        tls: Option<ClientTlsConfig>,
        adjust: impl FnOnce(&mut ServeConfig),
    ) -> TestServer {
        let mut config = ServeConfig::for_test(dir.path().join("data"));
        adjust(&mut config);
        let server = cairn_server::start(config).await.expect("server starts");
        let addr = server.grpc_addr;
        let http_addr = server.http_addr;
        let channel = connect(addr, tls.as_ref()).await.expect("connect");
        TestServer {
            server: Some(server),
            dir,
            addr,
            http_addr,
            channel,
            tls,
        }
    }

    /// The running server.
    pub fn server(&self) -> &RunningServer {
        self.server.as_ref().expect("running")
    }

    /// A client with the given credentials over a shared connection.
    pub fn client_with(&self, credentials: Credentials) -> Client {
        Client {
            es: EventStoreClient::with_interceptor(self.channel.clone(), credentials.clone())
                .max_decoding_message_size(64 * 1024 * 1024),
            admin: AdminClient::with_interceptor(self.channel.clone(), credentials.clone()),
            boundaries: BoundariesClient::with_interceptor(
                self.channel.clone(),
                credentials.clone(),
            ),
            tokens: TokensClient::with_interceptor(self.channel.clone(), credentials),
        }
    }

    /// A client authenticated as the bootstrap admin.
    pub fn client(&self) -> Client {
        self.client_with(Credentials::basic(ADMIN.0, ADMIN.1))
    }

    /// A client on its own new connection (for concurrency tests).
    pub async fn new_connection(&self, credentials: Credentials) -> Client {
        let channel = connect(self.addr, self.tls.as_ref())
            .await
            .expect("connect");
        Client {
            es: EventStoreClient::with_interceptor(channel.clone(), credentials.clone()),
            admin: AdminClient::with_interceptor(channel.clone(), credentials.clone()),
            boundaries: BoundariesClient::with_interceptor(channel.clone(), credentials.clone()),
            tokens: TokensClient::with_interceptor(channel, credentials),
        }
    }

    /// The shared channel (for health and reflection clients).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Graceful shutdown; returns the data directory for a restart.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("clean shutdown");
        }
        self.dir
    }

    /// Creates a user and returns its id.
    pub async fn create_user(&self, username: &str, password: &str, roles: &[&str]) -> String {
        let user = self
            .client()
            .admin
            .create_user(pb::CreateUserRequest {
                name: username.to_string(),
                username: username.to_string(),
                password: password.to_string(),
                roles: roles.iter().map(|r| r.to_string()).collect(),
            })
            .await
            .expect("create user")
            .into_inner()
            .user
            .expect("user");
        user.user_id
    }

    /// Creates a boundary.
    pub async fn create_boundary(&self, name: &str) {
        self.client()
            .admin
            .create_boundary(pb::CreateBoundaryRequest {
                name: name.to_string(),
                ..Default::default()
            })
            .await
            .expect("create boundary");
    }
}

/// An event to save with `data` JSON text.
/// The repository's root. Cargo sets `CARGO_MANIFEST_DIR` for the test processes it runs;
/// the compile-time value is only a fallback, since a test binary built in another checkout
/// sharing the target directory would otherwise read that checkout's files.
pub fn repo_root() -> std::path::PathBuf {
    let manifest =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    std::path::Path::new(&manifest).join("..")
}

pub fn event(event_type: &str, data: &str) -> pb::EventToSave {
    pb::EventToSave {
        event_id: uuid::Uuid::now_v7().to_string(),
        event_type: event_type.to_string(),
        data: data.to_string(),
        metadata: String::new(),
    }
}

/// A wire position.
pub fn pos(commit: i64, prepare: i64) -> pb::Position {
    pb::Position {
        commit_position: commit,
        prepare_position: prepare,
    }
}

/// `(-1,-1)`.
pub fn none_pos() -> pb::Position {
    pos(-1, -1)
}

/// A criterion from (key, value) pairs.
pub fn criterion(tags: &[(&str, &str)]) -> pb::Criterion {
    pb::Criterion {
        tags: tags
            .iter()
            .map(|(k, v)| pb::Tag {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
    }
}

/// A query from criteria.
pub fn query(criteria: Vec<pb::Criterion>) -> pb::Query {
    pb::Query { criteria }
}

/// An observation.
pub fn observe(q: pb::Query, p: pb::Position) -> pb::ConsistencyObservation {
    pb::ConsistencyObservation {
        query: Some(q),
        position: Some(p),
    }
}

impl Client {
    /// SaveEventsV2.
    pub async fn save(
        &mut self,
        boundary: &str,
        events: Vec<pb::EventToSave>,
        consistency: Vec<pb::ConsistencyObservation>,
    ) -> Result<pb::WriteResult, Status> {
        self.es
            .save_events_v2(pb::SaveEventsV2Request {
                boundary: boundary.to_string(),
                events,
                consistency,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// GetEvents.
    pub async fn read(
        &mut self,
        boundary: &str,
        q: Option<pb::Query>,
        from: Option<pb::Position>,
        count: u32,
        direction: pb::Direction,
    ) -> Result<Vec<pb::Event>, Status> {
        self.es
            .get_events(pb::GetEventsRequest {
                query: q,
                from_position: from,
                count,
                direction: direction as i32,
                boundary: boundary.to_string(),
            })
            .await
            .map(|r| r.into_inner().events)
    }

    /// Every event of a boundary, ascending.
    pub async fn read_all(&mut self, boundary: &str) -> Vec<pb::Event> {
        self.read(boundary, None, None, 10_000, pb::Direction::Asc)
            .await
            .expect("read all")
    }

    /// GetLatestByCriteria.
    pub async fn latest(
        &mut self,
        boundary: &str,
        criteria: Vec<pb::Criterion>,
    ) -> Result<pb::GetLatestByCriteriaResponse, Status> {
        self.es
            .get_latest_by_criteria(pb::GetLatestByCriteriaRequest {
                boundary: boundary.to_string(),
                criteria,
            })
            .await
            .map(|r| r.into_inner())
    }
}

/// `(commit, prepare)` of a wire position.
pub fn pair(p: &Option<pb::Position>) -> (i64, i64) {
    let p = p.as_ref().expect("position present");
    (p.commit_position, p.prepare_position)
}

/// `GET path` over plain HTTP/1.1; returns the whole response (status line, headers, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}
