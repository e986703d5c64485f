//! Where a write or a linearizable read goes: the router asks Raft who leads, then
//! proposes here, forwards over the peer port, or waits for an election. It is also what a
//! leader does with the writes and read-index requests its followers forward
//! ([`Leader`]), so a write is admitted, bounded and answered the same way wherever its
//! client called.
//!
//! Delivery: a write is sent at most once to a node that may propose it. It is sent again
//! only after an answer that says nothing was proposed (the node did not lead), so nothing
//! is applied twice; a write whose fate is unknown is answered UNAVAILABLE "may or may not
//! be applied".

use std::sync::Arc;
use std::time::Duration;

use cairn_core::Error;
use cairn_core::command::{Applied, Command, Outcome};
use cairn_raft::coalesce::Coalescer;
use cairn_raft::{Member, RaftError, RaftNode};
use futures::future::BoxFuture;

use crate::admission::Admission;
use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::peer::{ForwardReply, Leader, PeerClient};

/// Pause before routing again when the node a call went to no longer leads and names no
/// successor yet, or while this node's view of its own leadership is changing.
const LEADER_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Where a call goes, as Raft sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node leads: propose (or confirm the read) here.
    Here,
    /// Another node leads: send it there.
    Leader(Member),
    /// No leader is known (an election is under way).
    NoLeader,
    /// Raft names this node as leader but it does not take writes yet (it has just won
    /// or just lost): look again in a moment.
    Settling,
}

/// Routes this node's writes and reads, and runs what followers forward to it.
pub struct Router {
    raft: RaftNode,
    peers: Arc<PeerClient>,
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
    /// Read indexes asked of the leader (by its peer address): concurrent reads on this
    /// follower share one call, each waiting for a call that started after it arrived.
    read_indexes: Coalescer<String, Result<Option<u64>, tonic::Status>>,
    leader_wait: Duration,
    /// The leader's bound on a write it proposes.
    write_bound: Duration,
    /// A follower's bound on a write it forwards (longer, so the leader's answer comes
    /// back rather than this node's guess).
    client_write_bound: Duration,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("node_id", &self.raft.node_id())
            .finish_non_exhaustive()
    }
}

impl Router {
    /// The router of the node running `raft`, reaching other nodes through `peers`.
    pub fn new(
        raft: RaftNode,
        peers: Arc<PeerClient>,
        admission: Arc<Admission>,
        metrics: Arc<Metrics>,
        config: &ServeConfig,
    ) -> Self {
        let read_indexes = {
            let peers = peers.clone();
            Coalescer::spawn(move |addr: String| {
                let peers = peers.clone();
                async move { peers.read_index(&addr).await }
            })
        };
        Router {
            raft,
            peers,
            admission,
            metrics,
            read_indexes,
            leader_wait: config.leader_wait,
            write_bound: config.write_bound(),
            client_write_bound: config.client_write_bound(),
        }
    }

    /// Where a call made now goes.
    pub fn route(&self) -> Route {
        if self.raft.is_leader() {
            return Route::Here;
        }
        match self.raft.leader() {
            Some(leader) if leader.id == self.raft.node_id() => Route::Settling,
            Some(leader) => Route::Leader(leader),
            None => Route::NoLeader,
        }
    }

    /// Replicates a command and returns its outcome (conflicts included). On a follower the
    /// command goes to the leader over the peer port and its outcome comes back. Waits up
    /// to the configured leader wait while no leader is known.
    pub async fn propose(&self, command: Command) -> Result<Outcome, Error> {
        let _admitted = self.admission.admit(&command)?;
        let timer = self.metrics.raft_write_duration.start_timer();
        // A leader cut off from its majority keeps proposing until it learns of its
        // successor: bound the wait, the outcome is then unknown to us.
        let bound = if self.raft.is_leader() {
            self.write_bound
        } else {
            self.client_write_bound
        };
        let outcome = match tokio::time::timeout(bound, self.propose_routed(command)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Error::Unavailable(format!(
                "the write was not committed within {} ms (is a majority of the cluster reachable?); it may or may not be applied",
                bound.as_millis()
            ))),
        };
        timer.observe_duration();
        outcome
    }

    /// Proposes and flattens: a domain rejection becomes the error.
    pub async fn execute(&self, command: Command) -> Result<Applied, Error> {
        self.propose(command).await?
    }

    async fn propose_routed(&self, command: Command) -> Result<Outcome, Error> {
        let deadline = tokio::time::Instant::now() + self.leader_wait;
        loop {
            let leader = match self.route() {
                // The common case, and always on a lone node: the command moves into the
                // proposer, uncopied.
                Route::Here => {
                    return match self.raft.write(command).await {
                        Ok(outcome) => Ok(outcome),
                        Err(RaftError::ForwardToLeader { .. }) => Err(Error::Unavailable(
                            "this node stopped leading before it proposed the write; nothing was applied, retry".into(),
                        )),
                        Err(e) => {
                            tracing::warn!("failed to replicate a command: {e}");
                            Err(e.into())
                        }
                    };
                }
                Route::Leader(leader) => leader,
                Route::NoLeader => {
                    self.wait_for_a_leader(deadline).await?;
                    continue;
                }
                Route::Settling => {
                    self.pause_before_routing_again(deadline).await?;
                    continue;
                }
            };
            match self.peers.forward(&leader.addr, &command).await {
                Ok(ForwardReply::Outcome(outcome)) => {
                    let result = if outcome.is_ok() {
                        "applied"
                    } else {
                        "rejected"
                    };
                    self.count_forwarded(result);
                    return Ok(outcome);
                }
                // It lost leadership before proposing: route again, to its successor.
                Ok(ForwardReply::NotLeader { .. }) => {
                    self.pause_before_routing_again(deadline).await?;
                }
                Ok(ForwardReply::Unavailable(message)) => {
                    self.count_forwarded("unavailable");
                    return Err(Error::Unavailable(format!(
                        "the leader (node {}) could not replicate the write, which may or may not be applied: {message}",
                        leader.id
                    )));
                }
                Err(status) => {
                    self.count_forwarded("unavailable");
                    tracing::warn!(
                        "failed to forward a write to the leader, node {} at {}: {status}",
                        leader.id,
                        leader.addr
                    );
                    return Err(Error::Unavailable(format!(
                        "lost contact with the leader (node {}) while forwarding the write, which may or may not be applied: {}",
                        leader.id,
                        status.message()
                    )));
                }
            }
        }
    }

    fn count_forwarded(&self, result: &str) {
        self.metrics
            .forwarded_writes
            .with_label_values(&[result])
            .inc();
    }

    /// Linearizable read barrier: returns once this node has applied everything committed
    /// before the call. The leader confirms its leadership with a quorum; a follower asks
    /// the leader for its read index and waits until it has applied that far.
    pub async fn read_barrier(&self) -> Result<(), Error> {
        let bound = self.leader_wait * 2;
        match tokio::time::timeout(bound, self.linearize()).await {
            Ok(result) => result,
            Err(_) => Err(Error::Unavailable(format!(
                "could not confirm a linearizable read within {} ms: is a majority of the cluster reachable?",
                bound.as_millis()
            ))),
        }
    }

    async fn linearize(&self) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + self.leader_wait;
        loop {
            let leader = match self.route() {
                Route::Here => match self.raft.read_barrier().await {
                    Ok(()) => return Ok(()),
                    // Lost leadership meanwhile; a read retried changes nothing.
                    Err(RaftError::ForwardToLeader { .. }) => {
                        self.pause_before_routing_again(deadline).await?;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
                Route::Leader(leader) => leader,
                Route::NoLeader => {
                    self.wait_for_a_leader(deadline).await?;
                    continue;
                }
                Route::Settling => {
                    self.pause_before_routing_again(deadline).await?;
                    continue;
                }
            };
            let timer = self.metrics.read_index_wait.start_timer();
            let asked = self.read_indexes.call(leader.addr.clone()).await;
            let index = match asked
                .unwrap_or_else(|| Err(tonic::Status::unavailable("the node is shutting down")))
            {
                Ok(Some(index)) => index,
                // The node named has lost leadership: ask its successor.
                Ok(None) => {
                    timer.stop_and_discard();
                    self.pause_before_routing_again(deadline).await?;
                    continue;
                }
                Err(status) => {
                    timer.stop_and_discard();
                    return Err(Error::Unavailable(format!(
                        "failed to get a read index from the leader (node {}): {}",
                        leader.id,
                        status.message()
                    )));
                }
            };
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let applied = self.raft.wait_applied(index, remaining).await;
            timer.observe_duration();
            return applied.map_err(Error::from);
        }
    }

    /// Waits for an election to name a leader, then a moment more: a node just deposed may
    /// still be named until its successor's first heartbeat.
    async fn pause_before_routing_again(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<(), Error> {
        self.wait_for_a_leader(deadline).await?;
        tokio::time::sleep(LEADER_RETRY_PAUSE).await;
        Ok(())
    }

    /// Waits until some node leads, or answers UNAVAILABLE at `deadline`.
    async fn wait_for_a_leader(&self, deadline: tokio::time::Instant) -> Result<(), Error> {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            return Err(self.no_leader());
        }
        match self.raft.wait_for_leader(remaining).await {
            Ok(_) => Ok(()),
            Err(RaftError::Timeout(_)) => Err(self.no_leader()),
            Err(e) => Err(e.into()),
        }
    }

    fn no_leader(&self) -> Error {
        Error::Unavailable(format!(
            "no leader was elected within {} ms: a majority of the cluster is unreachable from node {}",
            self.leader_wait.as_millis(),
            self.raft.node_id()
        ))
    }

    /// What this node, leading, answers for a command a follower handed it.
    async fn run_forwarded(&self, command: Command) -> ForwardReply {
        // Nothing proposed: a definite rejection the follower passes on to its client.
        let _admitted = match self.admission.admit(&command) {
            Ok(admitted) => admitted,
            Err(full) => return ForwardReply::Outcome(Err(full)),
        };
        // Bounded like the leader's own writes, and below the follower's wait for this
        // answer: the follower learns "unknown" from the leader, not from its own clock.
        let bound = self.write_bound;
        let written = match tokio::time::timeout(bound, self.raft.write(command)).await {
            Ok(written) => written,
            Err(_) => {
                return ForwardReply::Unavailable(format!(
                    "the write was not committed within {} ms (is a majority of the cluster reachable?); it may or may not be applied",
                    bound.as_millis()
                ));
            }
        };
        match written {
            Ok(outcome) => ForwardReply::Outcome(outcome),
            Err(RaftError::ForwardToLeader {
                leader_id,
                leader_addr,
            }) => ForwardReply::NotLeader {
                leader_id,
                leader_addr,
            },
            Err(e) => {
                tracing::warn!("failed to replicate a forwarded command: {e}");
                ForwardReply::Unavailable(e.to_string())
            }
        }
    }
}

impl Leader for Router {
    fn run(self: Arc<Self>, command: Command) -> BoxFuture<'static, ForwardReply> {
        Box::pin(async move { self.run_forwarded(command).await })
    }

    fn read_index(self: Arc<Self>) -> BoxFuture<'static, Result<Option<u64>, Error>> {
        Box::pin(async move {
            match self.raft.read_index().await {
                Ok(index) => Ok(Some(index)),
                Err(RaftError::ForwardToLeader { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }
}
