//! Forwarding streams: a follower's writes reach the leader over one long-lived
//! `ForwardStream` per leader instead of one call each.
//!
//! Why: a unary call per forwarded write costs an HTTP/2 stream, its headers both ways and
//! a pass through the peer server's layers on each side, and under load that was a large
//! share of what a cluster spends per write beyond a single node. On a stream, every
//! command waiting when the follower writes travels in one message, and every outcome the
//! leader has ready when it writes travels back in one message (the outcomes of one Raft
//! batch usually complete together).
//!
//! Delivery is the same as a unary call's: a command sent and not answered may or may not
//! be applied (the caller reports that as UNAVAILABLE); a command never sent is retried on
//! a fresh stream. A leader that does not know `ForwardStream` (an older version, during a
//! rolling upgrade) answers UNIMPLEMENTED and the follower falls back to unary calls to it.
//!
//! This is the follower's side; the leader's is [`super::forward_server`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_core::command::Command;
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::cluster_client::ClusterClient;
use cairn_raft::codec::{decode, encode};
use futures::stream::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Request, Status};

use super::{CLUSTER_CALL_TIMEOUT, ForwardReply, PeerClient};

/// Most commands (or outcomes) one stream message carries; matches the leader's largest
/// Raft batch, so one message never holds more than one batch can take.
pub const MAX_COMMANDS_PER_MESSAGE: usize = 1024;
/// Bytes of commands after which a message is sent without taking more (a single command
/// larger than this still goes, alone). Well under the peer port's message limit.
pub const MAX_BYTES_PER_MESSAGE: usize = 8 * 1024 * 1024;
/// A stream with nothing in flight for this long is closed: leadership may have moved on
/// and the old leader need not keep it.
pub const IDLE_STREAM: Duration = Duration::from_secs(60);
/// How long opening a stream may take (a paused leader accepts the connection and never
/// answers); the writes queued meanwhile then fail as a unary call's would.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a leader that refused a stream (an older version) gets unary calls before a
/// stream is tried again.
pub const RETRY_REFUSED_STREAMS: Duration = Duration::from_secs(60);

/// Why a command did not get an outcome over a stream.
#[derive(Debug)]
pub enum StreamError {
    /// The command was never sent (the stream ended first): it may be sent again. Carries
    /// the encoded command back.
    NotSent(Vec<u8>),
    /// The leader does not serve forwarding streams; nothing was sent.
    Unsupported(Vec<u8>),
    /// The command was sent and no outcome came back: it may or may not be applied.
    Lost(Status),
}

type Outcome = Result<ForwardReply, StreamError>;
/// A read index (`None`: the node asked does not lead), or why there is none.
pub type ReadIndex = Result<Option<u64>, Status>;

/// What a caller asks of the leader over a stream.
enum Ask {
    /// Run an encoded command.
    Forward(Vec<u8>),
    /// Confirm a read index.
    ReadIndex,
}

impl Ask {
    /// What goes back to the caller of a request never sent: its command, to send again.
    fn unsent(self) -> Vec<u8> {
        match self {
            Ask::Forward(command) => command,
            Ask::ReadIndex => Vec::new(),
        }
    }
}

/// Where a caller waits for its answer.
enum Caller {
    Forward(oneshot::Sender<Outcome>),
    ReadIndex(oneshot::Sender<Result<ReadIndex, StreamError>>),
}

impl Caller {
    fn is_closed(&self) -> bool {
        match self {
            Caller::Forward(reply) => reply.is_closed(),
            Caller::ReadIndex(reply) => reply.is_closed(),
        }
    }

    fn fail(self, error: StreamError) {
        // A caller that gave up waiting does not need its answer.
        match self {
            Caller::Forward(reply) => {
                let _ = reply.send(Err(error));
            }
            Caller::ReadIndex(reply) => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// A request queued for a stream, with its caller.
type Queued = (Ask, Caller);
/// Leaders that refused a stream, by address, with when they did.
type Unsupported = Arc<Mutex<HashMap<String, Instant>>>;
/// The open streams by leader address: each stream's id and queue.
type OpenStreams = Arc<Mutex<HashMap<String, (u64, mpsc::UnboundedSender<Queued>)>>>;

/// A follower's forwarding streams, one per leader address.
#[derive(Default)]
pub struct ForwardStreams {
    open: OpenStreams,
    unsupported: Unsupported,
    next_stream: AtomicU64,
    message_writes: Option<prometheus::Histogram>,
}

impl ForwardStreams {
    /// Streams that record the writes of each message they send in `histogram`.
    pub fn counting(histogram: prometheus::Histogram) -> Self {
        ForwardStreams {
            message_writes: Some(histogram),
            ..ForwardStreams::default()
        }
    }

    /// How many streams are open (for tests).
    #[cfg(test)]
    pub(super) fn open_streams(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether the leader at `addr` answered, less than [`RETRY_REFUSED_STREAMS`] ago,
    /// that it serves no forwarding streams.
    pub fn unsupported(&self, addr: &str) -> bool {
        let mut refused = self.unsupported.lock().unwrap_or_else(|p| p.into_inner());
        match refused.get(addr) {
            Some(when) if when.elapsed() < RETRY_REFUSED_STREAMS => true,
            Some(_) => {
                // It may have been upgraded in place since: try a stream again.
                refused.remove(addr);
                false
            }
            None => false,
        }
    }

    /// Sends `command` (encoded) on the stream to `addr`, opening one if needed, and waits
    /// up to `timeout` for its outcome.
    pub async fn forward(
        &self,
        addr: &str,
        command: Vec<u8>,
        client: impl FnOnce() -> Result<ClusterClient<Channel>, Status>,
        headers: impl FnOnce() -> MetadataMap,
        timeout: Duration,
    ) -> Outcome {
        let (reply, outcome) = oneshot::channel();
        let queue = self
            .stream_to(addr, client, headers)
            .map_err(StreamError::Lost)?;
        let asked = queue.send((Ask::Forward(command), Caller::Forward(reply)));
        answer_within(timeout, asked, outcome).await
    }

    /// Asks the leader at `addr` for a read index on its stream, waiting up to `timeout`.
    pub async fn read_index(
        &self,
        addr: &str,
        client: impl FnOnce() -> Result<ClusterClient<Channel>, Status>,
        headers: impl FnOnce() -> MetadataMap,
        timeout: Duration,
    ) -> Result<ReadIndex, StreamError> {
        let (reply, answer) = oneshot::channel();
        let queue = self
            .stream_to(addr, client, headers)
            .map_err(StreamError::Lost)?;
        let asked = queue.send((Ask::ReadIndex, Caller::ReadIndex(reply)));
        answer_within(timeout, asked, answer).await
    }

    /// The queue of the open stream to `addr`, or of a new one.
    fn stream_to(
        &self,
        addr: &str,
        client: impl FnOnce() -> Result<ClusterClient<Channel>, Status>,
        headers: impl FnOnce() -> MetadataMap,
    ) -> Result<mpsc::UnboundedSender<Queued>, Status> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, queue)) = open.get(addr)
            && !queue.is_closed()
        {
            return Ok(queue.clone());
        }
        let client = client()?;
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (queue, waiting) = mpsc::unbounded_channel();
        open.insert(addr.to_string(), (id, queue.clone()));
        let stream = StreamTask {
            addr: addr.to_string(),
            id,
            open: self.open.clone(),
            unsupported: self.unsupported.clone(),
            message_writes: self.message_writes.clone(),
        };
        tokio::spawn(stream.run(client, headers(), waiting));
        Ok(queue)
    }
}

/// The answer to a request queued (`asked`) on a stream, waited for up to `timeout`.
async fn answer_within<T>(
    timeout: Duration,
    asked: Result<(), mpsc::error::SendError<Queued>>,
    answer: oneshot::Receiver<Result<T, StreamError>>,
) -> Result<T, StreamError> {
    if let Err(mpsc::error::SendError((ask, _))) = asked {
        // The stream ended before taking it: nothing was sent.
        return Err(StreamError::NotSent(ask.unsent()));
    }
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(StreamError::Lost(Status::unavailable(
            "the forwarding stream ended without an answer",
        ))),
        Err(_) => Err(StreamError::Lost(Status::deadline_exceeded(format!(
            "no answer from the leader within {} ms",
            timeout.as_millis()
        )))),
    }
}

/// The task that owns one forwarding stream.
struct StreamTask {
    addr: String,
    id: u64,
    open: OpenStreams,
    unsupported: Unsupported,
    message_writes: Option<prometheus::Histogram>,
}

impl StreamTask {
    async fn run(
        self,
        mut client: ClusterClient<Channel>,
        headers: MetadataMap,
        mut waiting: mpsc::UnboundedReceiver<Queued>,
    ) {
        // Unbounded: what it holds is bounded by the callers waiting, and a bounded send
        // could stall this task while the leader waits for it to read replies.
        let (outgoing, to_send) = mpsc::unbounded_channel::<pb::ForwardStreamRequest>();
        // The secret and the cluster id, as on every peer call: a leader of another
        // cluster (one restored from this one's backup) refuses the stream.
        let request = Request::from_parts(
            headers,
            tonic::Extensions::default(),
            tokio_stream::wrappers::UnboundedReceiverStream::new(to_send),
        );
        let opened = tokio::time::timeout(OPEN_TIMEOUT, client.forward_stream(request))
            .await
            .unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "the leader did not accept a forwarding stream within {} ms",
                    OPEN_TIMEOUT.as_millis()
                )))
            });
        let mut inbound = match opened {
            Ok(response) => response.into_inner(),
            Err(status) => {
                let unsupported = status.code() == tonic::Code::Unimplemented;
                if unsupported {
                    tracing::info!(
                        "the leader at {} does not serve forwarding streams; forwarding with one call per write",
                        self.addr
                    );
                    self.unsupported
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(self.addr.clone(), Instant::now());
                } else {
                    tracing::warn!(
                        "failed to open a forwarding stream to the leader at {}: {status}",
                        self.addr
                    );
                }
                self.close(waiting, HashMap::new(), &status, |command| {
                    if unsupported {
                        StreamError::Unsupported(command)
                    } else {
                        StreamError::Lost(status.clone())
                    }
                });
                return;
            }
        };
        let mut in_flight: HashMap<u64, Caller> = HashMap::new();
        let mut next_id: u64 = 0;
        let idle = tokio::time::sleep(IDLE_STREAM);
        tokio::pin!(idle);
        let lost = loop {
            tokio::select! {
                first = waiting.recv() => {
                    // None: every handle is gone (the node is shutting down).
                    let Some(first) = first else {
                        break Status::unavailable("the node is shutting down");
                    };
                    let message = take_waiting(first, &mut waiting, &mut in_flight, &mut next_id);
                    if message.commands.is_empty() && message.read_indexes.is_empty() {
                        continue;
                    }
                    if let Some(histogram) = &self.message_writes {
                        histogram.observe(message.commands.len() as f64);
                    }
                    if outgoing.send(message).is_err() {
                        break Status::unavailable("the forwarding stream closed");
                    }
                    idle.as_mut().reset(tokio::time::Instant::now() + IDLE_STREAM);
                }
                reply = inbound.next() => match reply {
                    Some(Ok(response)) => answer(response, &mut in_flight),
                    Some(Err(status)) => {
                        tracing::warn!("the forwarding stream to the leader at {} failed: {status}", self.addr);
                        break status;
                    }
                    None => break Status::unavailable("the leader closed the forwarding stream"),
                },
                () = &mut idle, if in_flight.is_empty() => {
                    break Status::unavailable("the forwarding stream was idle");
                }
            }
        };
        drop(outgoing);
        self.close(waiting, in_flight, &lost, StreamError::NotSent);
    }

    /// Stops taking requests: those sent get `Lost`, those still queued get `unsent`.
    fn close(
        &self,
        mut waiting: mpsc::UnboundedReceiver<Queued>,
        in_flight: HashMap<u64, Caller>,
        lost: &Status,
        unsent: impl Fn(Vec<u8>) -> StreamError,
    ) {
        {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            if open.get(&self.addr).is_some_and(|(id, _)| *id == self.id) {
                open.remove(&self.addr);
            }
        }
        waiting.close();
        while let Ok((ask, caller)) = waiting.try_recv() {
            caller.fail(unsent(ask.unsent()));
        }
        for (_, caller) in in_flight {
            caller.fail(StreamError::Lost(Status::unavailable(format!(
                "the forwarding stream to the leader broke before the outcome arrived: {}",
                lost.message()
            ))));
        }
    }
}

/// One message of every command waiting (up to the message limits), each given an id and
/// its caller recorded as in flight.
fn take_waiting(
    first: Queued,
    waiting: &mut mpsc::UnboundedReceiver<Queued>,
    in_flight: &mut HashMap<u64, Caller>,
    next_id: &mut u64,
) -> pb::ForwardStreamRequest {
    // Callers that timed out left their entries behind.
    in_flight.retain(|_, caller| !caller.is_closed());
    let mut message = pb::ForwardStreamRequest::default();
    let mut bytes = 0;
    let mut next = Some(first);
    while let Some((ask, caller)) = next.take() {
        // A caller that gave up (timed out while the stream opened) has answered "may or
        // may not be applied"; not sending its command is one of those outcomes.
        if caller.is_closed() {
            next = waiting.try_recv().ok();
            continue;
        }
        *next_id += 1;
        in_flight.insert(*next_id, caller);
        match ask {
            Ask::Forward(command) => {
                bytes += command.len();
                message.commands.push(pb::ForwardedCommand {
                    id: *next_id,
                    command,
                });
            }
            Ask::ReadIndex => message.read_indexes.push(*next_id),
        }
        if message.commands.len() + message.read_indexes.len() >= MAX_COMMANDS_PER_MESSAGE
            || bytes >= MAX_BYTES_PER_MESSAGE
        {
            break;
        }
        next = waiting.try_recv().ok();
    }
    message
}

/// Hands each answer of `response` to its caller.
fn answer(response: pb::ForwardStreamResponse, in_flight: &mut HashMap<u64, Caller>) {
    // A caller that gave up waiting does not need its answer: sends to it are ignored.
    for reply in response.replies {
        if let Some(Caller::Forward(caller)) = in_flight.remove(&reply.id) {
            let outcome = decode(&reply.reply).map_err(|e| {
                StreamError::Lost(Status::internal(format!(
                    "undecodable forwarding reply: {e}"
                )))
            });
            let _ = caller.send(outcome);
        }
    }
    for reply in response.read_indexes {
        if let Some(Caller::ReadIndex(caller)) = in_flight.remove(&reply.id) {
            let index = if reply.error.is_empty() {
                Ok((!reply.not_leader).then_some(reply.index))
            } else {
                Err(Status::unavailable(reply.error))
            };
            let _ = caller.send(Ok(index));
        }
    }
}

impl PeerClient {
    /// Runs `command` on the node at `addr`, which should be the leader: on the forwarding
    /// stream to it (see the module docs), or with a call of its own when it serves none.
    pub async fn forward(&self, addr: &str, command: &Command) -> Result<ForwardReply, Status> {
        let bytes = encode(command)
            .map_err(|e| Status::internal(format!("failed to encode a command: {e}")))?;
        let streamed = self.on_stream(addr, bytes, |bytes| {
            self.streams.forward(
                addr,
                bytes,
                || self.cluster(addr),
                || self.headers(),
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
                || self.headers(),
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
}
