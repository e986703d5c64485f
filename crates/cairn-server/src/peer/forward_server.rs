//! The leader's side of a forwarding stream (the follower's is
//! [`super::forward_client`]): what arrives is handed to a [`Leader`], which the layer
//! above this module provides, and each outcome goes back as soon as it is ready.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cairn_core::command::Command;
use cairn_proto::cairn_v1 as pb;
use cairn_raft::codec::{decode, encode};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use std::future::Future;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::Status;

use super::ForwardReply;
use super::forward_client::MAX_COMMANDS_PER_MESSAGE;

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

/// What a leader does with what followers hand it, on a stream or in a call of its own.
pub trait Leader: Send + Sync + 'static {
    /// Runs a forwarded command.
    fn run(self: Arc<Self>, command: Command) -> BoxFuture<'static, ForwardReply>;
    /// A read index confirmed after the call: `None` when this node does not lead, `Err`
    /// with the reason when it cannot confirm one.
    fn read_index(self: Arc<Self>) -> BoxFuture<'static, Result<Option<u64>, cairn_core::Error>>;
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
        Err(error) => reply.error = error.to_string(),
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
