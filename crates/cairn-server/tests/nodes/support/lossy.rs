//! A loopback gRPC proxy that loses calls: it relays HTTP/2 requests to a node's client
//! port and, for some SaveEventsV2 calls, closes the client's connection — half of the time
//! the moment the node's response headers arrive (the node has decided the write: committed
//! it, or refused it), half of the time before the request reaches the node (nothing
//! happened). The client cannot tell these apart: the ambiguous failure of the seed's
//! "Idempotency & Retry", produced on demand, with both of its possible truths.
//!
//! Or, in [`LossyProxy::holding_first_save`], the third truth: the first SaveEventsV2 call
//! is lost to the client but not to the node, which gets it late — just before the next
//! SaveEventsV2 call, after the client has looked for it and not found it (a write stuck
//! in a forwarding queue or a leader's log that commits after all).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use rand::Rng;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The call whose replies the proxy loses.
const SAVE: &str = "/orisun.EventStore/SaveEventsV2";

/// What the proxy did, for a test's verdict.
#[derive(Debug, Default)]
pub struct Counts {
    /// SaveEventsV2 calls relayed.
    pub saves: AtomicU64,
    /// Of those, replies lost (the client's connection closed on their headers).
    pub lost: AtomicU64,
    /// Of those, requests lost (the connection closed before the node saw them).
    pub unsent: AtomicU64,
}

/// Which calls the proxy loses.
#[derive(Clone, Copy)]
enum Mode {
    /// Each SaveEventsV2 call with this probability (its request or its reply, evenly).
    Lossy(f64),
    /// The first SaveEventsV2 call, relayed late.
    HoldFirstSave,
}

/// A request the proxy holds back: its head and body.
struct Held {
    parts: http::request::Parts,
    body: Vec<Bytes>,
    trailers: Option<http::HeaderMap>,
}

#[derive(Default)]
struct HeldSave {
    taken: std::sync::atomic::AtomicBool,
    request: Mutex<Option<Held>>,
}

/// A running proxy; stops when dropped.
pub struct LossyProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The node's client port (changes when the node restarts).
    upstream: Arc<Mutex<SocketAddr>>,
    /// What it did.
    pub counts: Arc<Counts>,
    task: JoinHandle<()>,
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LossyProxy {
    /// Proxies to `upstream`, losing each SaveEventsV2 call with probability `loss` (its
    /// request or its reply, evenly).
    pub async fn start(upstream: SocketAddr, loss: f64) -> LossyProxy {
        LossyProxy::with_mode(upstream, Mode::Lossy(loss)).await
    }

    /// Proxies to `upstream`, closing the client's connection on its first SaveEventsV2
    /// call before the node sees it, and relaying that call to the node just before the
    /// next SaveEventsV2 call (whose reply the client gets as usual).
    pub async fn holding_first_save(upstream: SocketAddr) -> LossyProxy {
        LossyProxy::with_mode(upstream, Mode::HoldFirstSave).await
    }

    async fn with_mode(upstream: SocketAddr, mode: Mode) -> LossyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let upstream = Arc::new(Mutex::new(upstream));
        let counts = Arc::new(Counts::default());
        let task = tokio::spawn(accept(listener, upstream.clone(), counts.clone(), mode));
        LossyProxy {
            addr,
            upstream,
            counts,
            task,
        }
    }

    /// Points the proxy at the node's new client port (after a restart).
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|p| p.into_inner()) = upstream;
    }

    /// The endpoint a client uses.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn accept(
    listener: TcpListener,
    upstream: Arc<Mutex<SocketAddr>>,
    counts: Arc<Counts>,
    mode: Mode,
) {
    let held = Arc::new(HeldSave::default());
    while let Ok((inbound, _)) = listener.accept().await {
        let target = *upstream.lock().unwrap_or_else(|p| p.into_inner());
        let calls = Calls {
            counts: counts.clone(),
            mode,
            held: held.clone(),
        };
        tokio::spawn(relay_connection(inbound, target, calls));
    }
}

/// What every call of the proxy shares.
#[derive(Clone)]
struct Calls {
    counts: Arc<Counts>,
    mode: Mode,
    held: Arc<HeldSave>,
}

/// One client connection, relayed over one connection to the node. Closing it (dropping
/// the server side) is how a reply gets lost.
async fn relay_connection(inbound: TcpStream, target: SocketAddr, calls: Calls) {
    let Ok(outbound) = TcpStream::connect(target).await else {
        // The node is down: the client sees its connection closed, as with no proxy.
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let Ok((send, node_connection)) = h2::client::handshake(outbound).await else {
        return;
    };
    let node_task = tokio::spawn(node_connection);
    let Ok(mut client_connection) = h2::server::handshake(inbound).await else {
        node_task.abort();
        return;
    };
    let close = CancellationToken::new();
    loop {
        let next = tokio::select! {
            next = client_connection.accept() => next,
            _ = close.cancelled() => break,
        };
        let Some(Ok((request, respond))) = next else {
            break;
        };
        let (send, close, calls) = (send.clone(), close.clone(), calls.clone());
        tokio::spawn(async move {
            let _ = relay_call(request, respond, send, close, calls).await;
        });
    }
    // Dropping the connection closes the client's socket with calls in flight.
    drop(client_connection);
    node_task.abort();
}

async fn relay_call(
    request: http::Request<RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    send: h2::client::SendRequest<Bytes>,
    close: CancellationToken,
    calls: Calls,
) -> Result<(), h2::Error> {
    let save = request.uri().path() == SAVE;
    let counts = &calls.counts;
    if save {
        counts.saves.fetch_add(1, Ordering::Relaxed);
    }
    let (lose, before) = match calls.mode {
        Mode::Lossy(loss) => {
            let mut rng = rand::thread_rng();
            (save && rng.gen_bool(loss), rng.gen_bool(0.5))
        }
        Mode::HoldFirstSave if save => {
            if !calls.held.taken.swap(true, Ordering::SeqCst) {
                let held = hold(request).await?;
                *calls.held.request.lock().unwrap_or_else(|p| p.into_inner()) = Some(held);
                counts.unsent.fetch_add(1, Ordering::Relaxed);
                close.cancel();
                return Ok(());
            }
            let late = calls
                .held
                .request
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(late) = late {
                relay_late(late, send.clone()).await?;
            }
            (false, false)
        }
        Mode::HoldFirstSave => (false, false),
    };
    if lose && before {
        counts.unsent.fetch_add(1, Ordering::Relaxed);
        close.cancel();
        return Ok(());
    }
    let (parts, body) = request.into_parts();
    let mut send = send.ready().await?;
    let (response, mut upstream) =
        send.send_request(http::Request::from_parts(parts, ()), false)?;
    copy_body(body, &mut upstream).await?;
    let response = response.await?;
    if lose {
        counts.lost.fetch_add(1, Ordering::Relaxed);
        close.cancel();
        return Ok(());
    }
    let (parts, body) = response.into_parts();
    let end = body.is_end_stream();
    let mut downstream = respond.send_response(http::Response::from_parts(parts, ()), end)?;
    if end {
        return Ok(());
    }
    copy_body(body, &mut downstream).await
}

/// Reads a request whole, to relay it later.
async fn hold(request: http::Request<RecvStream>) -> Result<Held, h2::Error> {
    let (parts, mut body) = request.into_parts();
    let mut chunks = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        chunks.push(chunk);
    }
    let trailers = body.trailers().await?;
    Ok(Held {
        parts,
        body: chunks,
        trailers,
    })
}

/// Sends a held request to the node and waits for the whole of its reply, which nobody
/// reads: the client gave up on it long ago.
async fn relay_late(held: Held, send: h2::client::SendRequest<Bytes>) -> Result<(), h2::Error> {
    let mut send = send.ready().await?;
    let (response, mut upstream) =
        send.send_request(http::Request::from_parts(held.parts, ()), false)?;
    for chunk in held.body {
        upstream.send_data(chunk, false)?;
    }
    match held.trailers {
        Some(trailers) => upstream.send_trailers(trailers)?,
        None => upstream.send_data(Bytes::new(), true)?,
    }
    let mut body = response.await?.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    body.trailers().await?;
    Ok(())
}

/// Relays a body's data frames and trailers (or its end).
async fn copy_body(mut body: RecvStream, to: &mut SendStream<Bytes>) -> Result<(), h2::Error> {
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        to.send_data(chunk, false)?;
    }
    match body.trailers().await? {
        Some(trailers) => to.send_trailers(trailers),
        None => to.send_data(Bytes::new(), true),
    }
}
