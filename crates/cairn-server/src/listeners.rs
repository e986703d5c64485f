//! The node's ports and what any client may hold on them (review H5).
//!
//! tonic leaves HTTP/2 unbounded (no `SETTINGS_MAX_CONCURRENT_STREAMS`, hyper's guard
//! against floods of locally reset streams switched off) and axum reads request headers
//! for as long as a client cares to send them. Every port here has a connection cap
//! (beyond it a connection is accepted and closed at once, so the client fails fast instead
//! of hanging in the kernel's backlog), accept errors (EMFILE) pause the loop instead of
//! spinning it, gRPC connections get a stream cap, the reset-flood guard and keepalive
//! pings, and the HTTP port a header read timeout. A port with TLS runs each handshake in
//! a task of its own, bounded by a timeout, holding the connection's slot.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::tls::TlsPort;

/// Pause after a failed accept (out of file descriptors, most often) before the next.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Connections whose handshake completed and that the server has yet to take.
const HANDSHAKES_QUEUED: usize = 64;
/// Streams a client may have reset by the server (refused, malformed) on one connection
/// before it gets GOAWAY (ENHANCE_YOUR_CALM): hyper's own default, which tonic turns off.
pub const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// Streams a client may reset before the server accepted them (the "rapid reset" flood)
/// before GOAWAY: h2's default, set explicitly.
pub const MAX_PENDING_ACCEPT_RESETS: usize = 20;

/// Named defaults of the connection limits.
pub mod defaults {
    /// Open client-port connections.
    pub const MAX_CONNECTIONS: usize = 4096;
    /// Open peer-port connections (a handful per peer, plus `cairn cluster` calls).
    pub const MAX_PEER_CONNECTIONS: usize = 256;
    /// Open HTTP-port connections (probes, scrapes).
    pub const MAX_HTTP_CONNECTIONS: usize = 256;
    /// Concurrent HTTP/2 streams per client connection (and calls in progress).
    pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
    /// Seconds between HTTP/2 keepalive pings on an idle connection.
    pub const KEEPALIVE_INTERVAL_SECS: u64 = 30;
    /// Seconds a keepalive ping may go unanswered before the connection is closed.
    pub const KEEPALIVE_TIMEOUT_SECS: u64 = 20;
    /// Seconds an HTTP client has to send a request's headers.
    pub const HTTP_HEADER_READ_TIMEOUT_SECS: u64 = 10;
}

/// Connection limits of the node's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open client-port connections.
    pub max_connections: usize,
    /// Open peer-port connections.
    pub max_peer_connections: usize,
    /// Open HTTP-port connections.
    pub max_http_connections: usize,
    /// Concurrent streams per HTTP/2 connection.
    pub max_streams_per_connection: u32,
    /// HTTP/2 keepalive ping interval.
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
    /// Time an HTTP client has to send a request's headers.
    pub http_header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: defaults::MAX_CONNECTIONS,
            max_peer_connections: defaults::MAX_PEER_CONNECTIONS,
            max_http_connections: defaults::MAX_HTTP_CONNECTIONS,
            max_streams_per_connection: defaults::MAX_STREAMS_PER_CONNECTION,
            keepalive_interval: Duration::from_secs(defaults::KEEPALIVE_INTERVAL_SECS),
            keepalive_timeout: Duration::from_secs(defaults::KEEPALIVE_TIMEOUT_SECS),
            http_header_read_timeout: Duration::from_secs(defaults::HTTP_HEADER_READ_TIMEOUT_SECS),
        }
    }
}

/// A tonic server builder with the HTTP/2 limits set.
pub fn grpc_server(limits: &ConnectionLimits) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // The stream cap bounds a connection's calls in progress too: tower's per-connection
        // concurrency limit on top would only add a semaphore to every call.
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
}

/// What a connection carries: bytes as they come, or TLS.
enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// What a request learns of its connection (in its extensions, for the gRPC ports).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The client's address.
    pub remote_addr: Option<SocketAddr>,
    /// The certificate chain the client presented (mutual TLS), leaf first.
    pub client_certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// An accepted connection holding one of its port's connection slots until it closes.
pub struct Connection {
    transport: Transport,
    info: ConnectionInfo,
    _slot: OwnedSemaphorePermit,
}

macro_rules! on_transport {
    ($self:ident, $stream:ident => $body:expr) => {
        match &mut $self.transport {
            Transport::Plain($stream) => $body,
            Transport::Tls($stream) => $body,
        }
    };
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        on_transport!(self, stream => Pin::new(stream).poll_read(cx, buf))
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        on_transport!(self, stream => Pin::new(stream).poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        on_transport!(self, stream => Pin::new(stream).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        on_transport!(self, stream => Pin::new(stream).poll_shutdown(cx))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        on_transport!(self, stream => Pin::new(stream).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.transport {
            Transport::Plain(stream) => stream.is_write_vectored(),
            Transport::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

/// A connection accepted on a TLS port whose handshake has yet to happen.
pub struct Handshake {
    stream: TcpStream,
    addr: SocketAddr,
    slot: OwnedSemaphorePermit,
    acceptor: tokio_rustls::TlsAcceptor,
    timeout: Duration,
    kind: &'static str,
    failures: Option<prometheus::IntCounter>,
}

impl Handshake {
    /// Runs the handshake; `None` (logged, counted) when it fails or times out.
    pub async fn complete(self) -> Option<Connection> {
        let failed = |why: String| {
            if let Some(failures) = &self.failures {
                failures.inc();
            }
            // Scanners and plaintext clients are routine on an open port: not a warning.
            tracing::debug!(addr = %self.addr, "TLS handshake on the {} port failed: {why}", self.kind);
            None
        };
        let stream =
            match tokio::time::timeout(self.timeout, self.acceptor.accept(self.stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return failed(e.to_string()),
                Err(_) => return failed(format!("no handshake within {:?}", self.timeout)),
            };
        let client_certificates = stream
            .get_ref()
            .1
            .peer_certificates()
            .map(|chain| Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect()));
        Some(Connection {
            transport: Transport::Tls(Box::new(stream)),
            info: ConnectionInfo {
                remote_addr: Some(self.addr),
                client_certificates,
            },
            _slot: self.slot,
        })
    }
}

/// An accepted connection: ready, or waiting for its TLS handshake.
pub enum Accepted {
    /// A plaintext connection.
    Ready(Connection),
    /// A TLS connection before its handshake.
    Handshake(Box<Handshake>),
}

impl Accepted {
    /// The connection, after its handshake if it needs one.
    pub async fn establish(self) -> Option<Connection> {
        match self {
            Accepted::Ready(connection) => Some(connection),
            Accepted::Handshake(handshake) => handshake.complete().await,
        }
    }
}

/// Accepts connections on one port, up to `max` open at once.
pub struct Acceptor {
    listener: TcpListener,
    kind: &'static str,
    slots: Arc<Semaphore>,
    refused: Option<prometheus::IntCounter>,
    tls: Option<(TlsPort, Option<prometheus::IntCounter>)>,
}

impl Acceptor {
    /// An acceptor for `listener` (`kind` names the port in logs); `refused` counts the
    /// connections closed at the cap.
    pub fn new(
        listener: TcpListener,
        kind: &'static str,
        max: usize,
        refused: Option<prometheus::IntCounter>,
    ) -> Self {
        Acceptor {
            listener,
            kind,
            slots: Arc::new(Semaphore::new(max)),
            refused,
            tls: None,
        }
    }

    /// Speaks only TLS from now on; `failures` counts failed handshakes.
    pub fn with_tls(mut self, tls: TlsPort, failures: Option<prometheus::IntCounter>) -> Self {
        self.tls = Some((tls, failures));
        self
    }

    /// The next connection with a free slot. Never fails: accept errors are logged and
    /// retried after a pause, connections beyond the cap are closed. Cancel-safe.
    pub async fn accept(&mut self) -> Accepted {
        loop {
            let (stream, addr) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(
                        "failed to accept a {} connection (retrying in {} ms): {e}",
                        self.kind,
                        ACCEPT_ERROR_PAUSE.as_millis()
                    );
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                if let Some(refused) = &self.refused {
                    refused.inc();
                }
                tracing::debug!(%addr, "refused a {} connection: the port is at its connection limit", self.kind);
                continue;
            };
            // Without NODELAY, Nagle holds a response's trailing frames for the peer's
            // delayed ACK (40 ms); `serve_with_incoming` ignores the builder's setting.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::warn!(
                    "failed to set TCP_NODELAY on a {} connection: {e}",
                    self.kind
                );
            }
            return match &mut self.tls {
                None => Accepted::Ready(Connection {
                    transport: Transport::Plain(stream),
                    info: ConnectionInfo {
                        remote_addr: Some(addr),
                        client_certificates: None,
                    },
                    _slot: slot,
                }),
                Some((tls, failures)) => Accepted::Handshake(Box::new(Handshake {
                    stream,
                    addr,
                    slot,
                    acceptor: tls.acceptor(),
                    timeout: tls.handshake_timeout,
                    kind: self.kind,
                    failures: failures.clone(),
                })),
            };
        }
    }

    /// The connections as a stream, for tonic's `serve_with_incoming`. Handshakes run in
    /// tasks of their own, so a client that stalls in one holds up nobody else; the
    /// listener closes when the stream is dropped.
    pub fn into_stream(self) -> impl Stream<Item = std::io::Result<Connection>> + Send + 'static {
        let (done_tx, done_rx) = tokio::sync::mpsc::channel::<Connection>(HANDSHAKES_QUEUED);
        futures::stream::unfold(
            (self, done_tx, done_rx),
            |(mut acceptor, done_tx, mut done_rx)| async move {
                loop {
                    tokio::select! {
                        Some(connection) = done_rx.recv() => {
                            return Some((Ok(connection), (acceptor, done_tx, done_rx)));
                        }
                        accepted = acceptor.accept() => match accepted {
                            Accepted::Ready(connection) => {
                                return Some((Ok(connection), (acceptor, done_tx, done_rx)));
                            }
                            Accepted::Handshake(handshake) => {
                                let done_tx = done_tx.clone();
                                tokio::spawn(async move {
                                    if let Some(connection) = handshake.complete().await {
                                        // Fails only when the server stopped: the
                                        // connection closes.
                                        let _ = done_tx.send(connection).await;
                                    }
                                });
                            }
                        },
                    }
                }
            },
        )
    }
}

/// Serves `router` over HTTP/1.1 on `acceptor` until `stop`, then lets open requests finish.
pub async fn serve_http(
    mut acceptor: Acceptor,
    router: axum::Router,
    header_read_timeout: Duration,
    stop: CancellationToken,
) {
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = acceptor.accept() => accepted,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let stop = stop.clone();
        connections.spawn(async move {
            let Some(connection) = accepted.establish().await else {
                return;
            };
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let served =
                builder.serve_connection(hyper_util::rt::TokioIo::new(connection), service);
            tokio::pin!(served);
            let result = tokio::select! {
                result = served.as_mut() => result,
                _ = stop.cancelled() => {
                    served.as_mut().graceful_shutdown();
                    served.await
                }
            };
            if let Err(e) = result {
                tracing::debug!("HTTP connection ended: {e}");
            }
        });
    }
    connections.close();
    connections.wait().await;
}
