//! The node's ports and what any client may hold on them (review H5).
//!
//! tonic leaves HTTP/2 unbounded (no `SETTINGS_MAX_CONCURRENT_STREAMS`, hyper's guard
//! against floods of locally reset streams switched off) and axum reads request headers
//! for as long as a client cares to send them. Every port here has a connection cap
//! (beyond it a connection is accepted and closed at once, so the client fails fast instead
//! of hanging in the kernel's backlog), accept errors (EMFILE) pause the loop instead of
//! spinning it, gRPC connections get a stream cap, the reset-flood guard and keepalive
//! pings, and the HTTP port a header read timeout.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Pause after a failed accept (out of file descriptors, most often) before the next.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
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

/// An accepted connection holding one of its port's connection slots until it closes.
pub struct Connection {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// Accepts connections on one port, up to `max` open at once.
pub struct Acceptor {
    listener: TcpListener,
    kind: &'static str,
    slots: Arc<Semaphore>,
    refused: Option<prometheus::IntCounter>,
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
        }
    }

    /// The next connection with a free slot. Never fails: accept errors are logged and
    /// retried after a pause, connections beyond the cap are closed.
    pub async fn accept(&mut self) -> (Connection, SocketAddr) {
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
            return (
                Connection {
                    stream,
                    _slot: slot,
                },
                addr,
            );
        }
    }

    /// The connections as a stream, for tonic's `serve_with_incoming`.
    pub fn into_stream(self) -> impl Stream<Item = std::io::Result<Connection>> + Send + 'static {
        futures::stream::unfold(self, |mut acceptor| async move {
            let (connection, _) = acceptor.accept().await;
            Some((Ok(connection), acceptor))
        })
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
        let connection = tokio::select! {
            _ = stop.cancelled() => break,
            (connection, _) = acceptor.accept() => connection,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let stop = stop.clone();
        connections.spawn(async move {
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
