//! Forwarding streams end to end: a follower's [`PeerClient`] and [`ForwardStreams`]
//! against a test leader serving `cairn.v1.Cluster` on a real port, either as a leader
//! does ([`ForwardedReplies`]) or as an older or broken one would.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::command::{Append, Command};
use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::cluster_server::{Cluster, ClusterServer};
use cairn_raft::codec::{decode, encode};
use futures::future::BoxFuture;
use futures::stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::forward_client::ForwardStreams;
use super::{ForwardReply, ForwardedReplies, Leader, PeerClient};

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
    fn run(self: Arc<Self>, command: Command) -> BoxFuture<'static, ForwardReply> {
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

    fn read_index(self: Arc<Self>) -> BoxFuture<'static, Result<Option<u64>, cairn_core::Error>> {
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
        tokio::spawn(async move { named(peers.forward(&addr, &command(&format!("b{i}"))).await) })
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
                    MetadataMap::new,
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
            MetadataMap::new,
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
    eventually("the stream to end", || streams.open_streams() == 0).await;
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
