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

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use cairn_core::command::Command;
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::cluster_client::ClusterClient;
use cairn_raft::codec::{decode, encode};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use std::future::Future;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::peer::{ForwardReply, leader_read_index, run_forwarded};
use crate::state::NodeState;
use cairn_proto::CLUSTER_SECRET_HEADER as SECRET_HEADER;

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
        secret: Option<&MetadataValue<Ascii>>,
        timeout: Duration,
    ) -> Outcome {
        let (reply, outcome) = oneshot::channel();
        let queue = self
            .stream_to(addr, client, secret)
            .map_err(StreamError::Lost)?;
        let asked = queue.send((Ask::Forward(command), Caller::Forward(reply)));
        answer_within(timeout, asked, outcome).await
    }

    /// Asks the leader at `addr` for a read index on its stream, waiting up to `timeout`.
    pub async fn read_index(
        &self,
        addr: &str,
        client: impl FnOnce() -> Result<ClusterClient<Channel>, Status>,
        secret: Option<&MetadataValue<Ascii>>,
        timeout: Duration,
    ) -> Result<ReadIndex, StreamError> {
        let (reply, answer) = oneshot::channel();
        let queue = self
            .stream_to(addr, client, secret)
            .map_err(StreamError::Lost)?;
        let asked = queue.send((Ask::ReadIndex, Caller::ReadIndex(reply)));
        answer_within(timeout, asked, answer).await
    }

    /// The queue of the open stream to `addr`, or of a new one.
    fn stream_to(
        &self,
        addr: &str,
        client: impl FnOnce() -> Result<ClusterClient<Channel>, Status>,
        secret: Option<&MetadataValue<Ascii>>,
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
        tokio::spawn(stream.run(client, secret.cloned(), waiting));
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
        secret: Option<MetadataValue<Ascii>>,
        mut waiting: mpsc::UnboundedReceiver<Queued>,
    ) {
        // Unbounded: what it holds is bounded by the callers waiting, and a bounded send
        // could stall this task while the leader waits for it to read replies.
        let (outgoing, to_send) = mpsc::unbounded_channel::<pb::ForwardStreamRequest>();
        let mut request = Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(
            to_send,
        ));
        if let Some(secret) = secret {
            request.metadata_mut().insert(SECRET_HEADER, secret);
        }
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

/// The leader's side of a forwarding stream: runs each command as it arrives and answers
/// with every outcome ready at each write. Driven by the HTTP/2 stream itself, so no task
/// of its own.
pub struct ForwardedReplies {
    leader: Arc<dyn Leader>,
    inbound: tonic::Streaming<pb::ForwardStreamRequest>,
    inbound_done: bool,
    running: FuturesUnordered<BoxFuture<'static, Answered>>,
    stopping: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl ForwardedReplies {
    /// Serves the commands arriving on `inbound` until the follower closes it or `stop` is
    /// cancelled: then it answers what it has taken and ends, so a stopping peer server is
    /// not held open by streams followers would otherwise keep forever.
    pub fn new(
        leader: Arc<dyn Leader>,
        inbound: tonic::Streaming<pb::ForwardStreamRequest>,
        stop: CancellationToken,
    ) -> Self {
        ForwardedReplies {
            leader,
            inbound,
            inbound_done: false,
            running: FuturesUnordered::new(),
            stopping: Box::pin(stop.cancelled_owned()),
        }
    }
}

/// What the leader's side of a stream asks of the node.
pub trait Leader: Send + Sync + 'static {
    /// Runs a forwarded command.
    fn run(&self, command: Command) -> BoxFuture<'static, ForwardReply>;
    /// A read index confirmed after the call: `None` when this node does not lead, `Err`
    /// with the reason when it cannot confirm one.
    fn read_index(&self) -> BoxFuture<'static, Result<Option<u64>, String>>;
}

impl Leader for Arc<NodeState> {
    fn run(&self, command: Command) -> BoxFuture<'static, ForwardReply> {
        let node = self.clone();
        Box::pin(async move { run_forwarded(&node, command).await })
    }

    fn read_index(&self) -> BoxFuture<'static, Result<Option<u64>, String>> {
        let node = self.clone();
        Box::pin(async move { leader_read_index(&node).await.map_err(|e| e.to_string()) })
    }
}

/// One finished request of a stream.
enum Answered {
    Forward(pb::ForwardedReply),
    ReadIndex(pb::ReadIndexReply),
}

/// Confirms one read index.
async fn read_index_for(leader: Arc<dyn Leader>, id: u64) -> Answered {
    let mut reply = pb::ReadIndexReply {
        id,
        ..Default::default()
    };
    match leader.read_index().await {
        Ok(Some(index)) => reply.index = index,
        Ok(None) => reply.not_leader = true,
        Err(error) => reply.error = error,
    }
    Answered::ReadIndex(reply)
}

/// Runs one forwarded command to its encoded reply.
async fn run_one(leader: Arc<dyn Leader>, forwarded: pb::ForwardedCommand) -> Answered {
    let reply = match decode::<Command>(&forwarded.command) {
        Ok(command) => leader.run(command).await,
        Err(e) => ForwardReply::Outcome(Err(cairn_core::Error::invalid(format!(
            "undecodable forwarded command: {e}"
        )))),
    };
    let reply = encode(&reply).unwrap_or_else(|e| {
        tracing::error!("failed to encode a forwarding reply: {e}");
        // The follower cannot decode this and reports the outcome as unknown.
        Vec::new()
    });
    Answered::Forward(pb::ForwardedReply {
        id: forwarded.id,
        reply,
    })
}

impl Stream for ForwardedReplies {
    type Item = Result<pb::ForwardStreamResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if !this.inbound_done && this.stopping.as_mut().poll(cx).is_ready() {
            // Commands the follower sent after this are never read: it reports them as
            // unknown, and they are not applied.
            this.inbound_done = true;
        }
        while !this.inbound_done {
            match this.inbound.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    for forwarded in message.commands {
                        this.running
                            .push(Box::pin(run_one(this.leader.clone(), forwarded)));
                    }
                    for id in message.read_indexes {
                        this.running
                            .push(Box::pin(read_index_for(this.leader.clone(), id)));
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    // The follower's end is gone: nobody is left to answer. Commands already
                    // proposed still apply; the follower reported them as unknown.
                    tracing::warn!("a follower's forwarding stream failed: {status}");
                    return Poll::Ready(None);
                }
                Poll::Ready(None) => this.inbound_done = true,
                Poll::Pending => break,
            }
        }
        let mut response = pb::ForwardStreamResponse::default();
        while response.replies.len() + response.read_indexes.len() < MAX_COMMANDS_PER_MESSAGE {
            match this.running.poll_next_unpin(cx) {
                Poll::Ready(Some(Answered::Forward(reply))) => response.replies.push(reply),
                Poll::Ready(Some(Answered::ReadIndex(reply))) => response.read_indexes.push(reply),
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        if !response.replies.is_empty() || !response.read_indexes.is_empty() {
            return Poll::Ready(Some(Ok(response)));
        }
        if this.inbound_done && this.running.is_empty() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cairn_core::command::Append;
    use cairn_proto::cairn_v1::cluster_server::{Cluster, ClusterServer};
    use tonic::Response;

    use crate::peer::PeerClient;

    /// How the fake leader treats forwarding streams.
    #[derive(Clone, Copy, PartialEq)]
    enum Streams {
        /// Answers each message's commands in reverse order, in one message.
        Served,
        /// Knows no `ForwardStream` (an older version).
        Unknown,
        /// Fails the stream as soon as a message arrives, answering nothing.
        Broken,
        /// Serves it as a leader does ([`ForwardedReplies`]); a command for a boundary
        /// named "slow…" is answered only once the leader is stopping.
        Real,
    }

    /// A leader whose every outcome names the command's boundary, so each caller can tell
    /// its own outcome from another's.
    #[derive(Clone)]
    struct FakeLeader {
        streams: Arc<Mutex<Streams>>,
        opened: Arc<AtomicUsize>,
        unary: Arc<AtomicUsize>,
        started: Arc<AtomicUsize>,
        stop: CancellationToken,
    }

    /// The leader behind [`Streams::Real`]: read index 7 while not stopping.
    impl Leader for FakeLeader {
        fn run(&self, command: Command) -> BoxFuture<'static, ForwardReply> {
            self.started.fetch_add(1, Ordering::SeqCst);
            let stop = self.stop.clone();
            Box::pin(async move {
                let Command::Append(append) = command else {
                    return ForwardReply::Unavailable("unexpected".into());
                };
                if append.boundary.starts_with("slow") {
                    stop.cancelled().await;
                }
                ForwardReply::Unavailable(append.boundary)
            })
        }

        fn read_index(&self) -> BoxFuture<'static, Result<Option<u64>, String>> {
            let stopping = self.stop.is_cancelled();
            Box::pin(async move { if stopping { Ok(None) } else { Ok(Some(7)) } })
        }
    }

    fn outcome_of(command: &[u8]) -> Vec<u8> {
        let reply = match decode::<Command>(command) {
            Ok(Command::Append(append)) => ForwardReply::Unavailable(append.boundary),
            other => ForwardReply::Unavailable(format!("unexpected {other:?}")),
        };
        encode(&reply).expect("encodable")
    }

    fn unimplemented<T>() -> Result<Response<T>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    #[tonic::async_trait]
    impl Cluster for FakeLeader {
        type ForwardStreamStream =
            Pin<Box<dyn Stream<Item = Result<pb::ForwardStreamResponse, Status>> + Send>>;

        async fn forward_stream(
            &self,
            request: Request<tonic::Streaming<pb::ForwardStreamRequest>>,
        ) -> Result<Response<Self::ForwardStreamStream>, Status> {
            let mode = *self.streams.lock().expect("lock");
            if mode == Streams::Unknown {
                return Err(Status::unimplemented("no forwarding streams here"));
            }
            self.opened.fetch_add(1, Ordering::SeqCst);
            if mode == Streams::Real {
                let replies = ForwardedReplies::new(
                    Arc::new(self.clone()),
                    request.into_inner(),
                    self.stop.clone(),
                );
                return Ok(Response::new(Box::pin(replies)));
            }
            let replies = request.into_inner().map(move |message| {
                let message = message?;
                if mode == Streams::Broken {
                    return Err(Status::internal("broken on purpose"));
                }
                let replies = message
                    .commands
                    .iter()
                    .rev()
                    .map(|c| pb::ForwardedReply {
                        id: c.id,
                        reply: outcome_of(&c.command),
                    })
                    .collect();
                Ok(pb::ForwardStreamResponse {
                    replies,
                    read_indexes: Vec::new(),
                })
            });
            Ok(Response::new(Box::pin(replies)))
        }

        async fn forward(
            &self,
            request: Request<pb::ForwardRequest>,
        ) -> Result<Response<pb::ForwardResponse>, Status> {
            self.unary.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(pb::ForwardResponse {
                reply: outcome_of(&request.into_inner().command),
            }))
        }

        async fn status(
            &self,
            _: Request<pb::StatusRequest>,
        ) -> Result<Response<pb::StatusResponse>, Status> {
            unimplemented()
        }
        async fn add_learner(
            &self,
            _: Request<pb::AddLearnerRequest>,
        ) -> Result<Response<pb::MembershipResponse>, Status> {
            unimplemented()
        }
        async fn promote(
            &self,
            _: Request<pb::PromoteRequest>,
        ) -> Result<Response<pb::MembershipResponse>, Status> {
            unimplemented()
        }
        async fn rejoin(
            &self,
            _: Request<pb::RejoinRequest>,
        ) -> Result<Response<pb::MembershipResponse>, Status> {
            unimplemented()
        }
        async fn allow_vote(
            &self,
            _: Request<pb::AllowVoteRequest>,
        ) -> Result<Response<pb::AllowVoteResponse>, Status> {
            unimplemented()
        }
        async fn remove_node(
            &self,
            _: Request<pb::RemoveNodeRequest>,
        ) -> Result<Response<pb::MembershipResponse>, Status> {
            unimplemented()
        }
        async fn transfer_leader(
            &self,
            _: Request<pb::TransferLeaderRequest>,
        ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
            unimplemented()
        }
        async fn read_index(
            &self,
            _: Request<pb::ReadIndexRequest>,
        ) -> Result<Response<pb::ReadIndexResponse>, Status> {
            unimplemented()
        }
        async fn elect(
            &self,
            _: Request<pb::ElectRequest>,
        ) -> Result<Response<pb::ElectResponse>, Status> {
            unimplemented()
        }
    }

    async fn fake_leader(streams: Streams) -> (FakeLeader, String) {
        let leader = FakeLeader {
            streams: Arc::new(Mutex::new(streams)),
            opened: Arc::new(AtomicUsize::new(0)),
            unary: Arc::new(AtomicUsize::new(0)),
            started: Arc::new(AtomicUsize::new(0)),
            stop: CancellationToken::new(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let server = tonic::transport::Server::builder()
            .add_service(ClusterServer::new(leader.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        (leader, addr)
    }

    fn command(boundary: &str) -> Command {
        Command::Append(Append {
            boundary: boundary.into(),
            observations: vec![],
            events: vec![],
            at_unix_nanos: 0,
        })
    }

    fn named(reply: Result<ForwardReply, Status>) -> String {
        match reply {
            Ok(ForwardReply::Unavailable(name)) => name,
            other => panic!("expected the fake's outcome, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn concurrent_forwards_share_one_stream_and_each_gets_its_own_outcome() {
        let (leader, addr) = fake_leader(Streams::Served).await;
        let peers = Arc::new(PeerClient::new(None, None).expect("client"));
        let calls = (0..64).map(|i| {
            let (peers, addr) = (peers.clone(), addr.clone());
            tokio::spawn(
                async move { named(peers.forward(&addr, &command(&format!("b{i}"))).await) },
            )
        });
        let names = futures::future::join_all(calls).await;
        for (i, name) in names.into_iter().enumerate() {
            assert_eq!(name.expect("task"), format!("b{i}"));
        }
        assert_eq!(
            leader.opened.load(Ordering::SeqCst),
            1,
            "one stream for all"
        );
        assert_eq!(leader.unary.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_leader_without_streams_gets_one_call_per_write() {
        let (leader, addr) = fake_leader(Streams::Unknown).await;
        let peers = PeerClient::new(None, None).expect("client");
        assert_eq!(
            named(peers.forward(&addr, &command("first")).await),
            "first"
        );
        assert_eq!(
            named(peers.forward(&addr, &command("second")).await),
            "second"
        );
        assert_eq!(leader.unary.load(Ordering::SeqCst), 2);
        assert!(
            peers.forwards_by_call(&addr),
            "the leader is remembered as one without streams"
        );
    }

    #[tokio::test]
    async fn a_broken_stream_leaves_its_writes_unknown_and_the_next_write_opens_another() {
        let (leader, addr) = fake_leader(Streams::Broken).await;
        let peers = PeerClient::new(None, None).expect("client");
        let lost = peers
            .forward(&addr, &command("lost"))
            .await
            .expect_err("no outcome came back");
        assert!(
            lost.message().contains("broke before the outcome arrived"),
            "{lost:?}"
        );
        assert_eq!(
            leader.unary.load(Ordering::SeqCst),
            0,
            "a sent write is never sent again"
        );
        *leader.streams.lock().expect("lock") = Streams::Served;
        assert_eq!(named(peers.forward(&addr, &command("next")).await), "next");
        assert_eq!(leader.opened.load(Ordering::SeqCst), 2);
    }

    /// Waits up to five seconds for `condition`.
    async fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !condition() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn the_leader_answers_each_command_when_ready_and_a_stopping_leader_ends_the_stream() {
        let (leader, addr) = fake_leader(Streams::Real).await;
        let peers = Arc::new(PeerClient::new(None, None).expect("client"));
        let streams = Arc::new(ForwardStreams::default());
        let send = |name: &str| {
            let (peers, streams, addr) = (peers.clone(), streams.clone(), addr.clone());
            let command = encode(&command(name)).expect("encodable");
            async move {
                let outcome = streams
                    .forward(
                        &addr,
                        command,
                        || peers.cluster(&addr),
                        None,
                        Duration::from_secs(10),
                    )
                    .await;
                match outcome {
                    Ok(ForwardReply::Unavailable(name)) => name,
                    other => panic!("expected the fake's outcome, got {other:?}"),
                }
            }
        };
        let slow = tokio::spawn(send("slow"));
        eventually("the slow command to start", || {
            leader.started.load(Ordering::SeqCst) == 1
        })
        .await;
        assert_eq!(
            send("fast").await,
            "fast",
            "not held up behind the slow one"
        );
        let index = streams
            .read_index(
                &addr,
                || peers.cluster(&addr),
                None,
                Duration::from_secs(10),
            )
            .await
            .expect("answered");
        assert_eq!(
            index.expect("confirmed"),
            Some(7),
            "read indexes share the stream"
        );
        leader.stop.cancel();
        assert_eq!(
            slow.await.expect("task"),
            "slow",
            "what it took is answered"
        );
        eventually("the stream to end", || {
            streams.open.lock().expect("lock").is_empty()
        })
        .await;
        assert_eq!(leader.opened.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn read_indexes_go_on_the_stream_or_one_call_each_to_a_leader_without_streams() {
        let (leader, addr) = fake_leader(Streams::Real).await;
        let peers = PeerClient::new(None, None).expect("client");
        assert_eq!(peers.read_index(&addr).await.expect("answered"), Some(7));
        assert_eq!(leader.opened.load(Ordering::SeqCst), 1);
        leader.stop.cancel();
        // The fake's unary ReadIndex is unimplemented: that answer proves the call went
        // there once the stream was refused.
        let (old, old_addr) = fake_leader(Streams::Unknown).await;
        let refused = peers.read_index(&old_addr).await.expect_err("fake refuses");
        assert_eq!(refused.code(), tonic::Code::Unimplemented);
        assert!(peers.forwards_by_call(&old_addr));
        assert_eq!(old.opened.load(Ordering::SeqCst), 0);
    }
}
