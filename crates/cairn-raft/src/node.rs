//! A running node: proposes through the proposer while it leads, serves linearizable reads,
//! and reports its view of the group.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cairn_core::command::{Command, Outcome};
use cairn_store::Store;
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError as OpenRaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};

use crate::coalesce::Coalescer;
use crate::heads::HeadWatch;
use crate::log_store::LogStore;
use crate::proposer::Proposer;
use crate::standing::{self, RejoinProgress, Standing};
use crate::{Raft, RaftError};

/// A member of the group: its Raft id and the address peers use to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Raft node id.
    pub id: u64,
    /// Peer address.
    pub addr: String,
}

/// What a node currently is in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It leads.
    Leader,
    /// A voter following a leader (or waiting for one).
    Follower,
    /// A voter campaigning.
    Candidate,
    /// It replicates but does not vote.
    Learner,
    /// It is stopping.
    Shutdown,
}

impl Role {
    /// Lower-case name (status output, metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
        }
    }
}

/// A node's view of its group, from openraft's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// This node.
    pub node_id: u64,
    /// Its role.
    pub role: Role,
    /// Current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader: Option<Member>,
    /// Voting members.
    pub voters: Vec<Member>,
    /// Non-voting members.
    pub learners: Vec<Member>,
    /// Index of the last entry in this node's log.
    pub last_log_index: u64,
    /// Index of the last entry applied to its state machine.
    pub applied_index: u64,
    /// On the leader: each follower's highest replicated index.
    pub matched: BTreeMap<u64, u64>,
}

/// A node's place in the membership a node has seen, by [`RaftNode::member_addr`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberAddr {
    /// A voter or learner, with its peer address.
    Member(String),
    /// Not in the membership.
    NotAMember,
    /// This node has seen no membership yet (it has still to form or join a group).
    NoMembership,
}

/// A running Raft node with its store. Cheap to clone.
#[derive(Clone)]
pub struct RaftNode {
    raft: Raft,
    store: Store,
    heads: HeadWatch,
    node_id: u64,
    proposer: Arc<Proposer>,
    /// The leader's id as last reported by openraft (0: none known). Every write asks
    /// whether this node leads; an atomic answers without touching openraft's metrics
    /// channel, which the Raft core rewrites on every log change.
    current_leader: Arc<AtomicU64>,
    /// The same, for tasks that act on leadership changes (updated after the atomic).
    leader_changes: tokio::sync::watch::Receiver<u64>,
    /// Confirmed read indexes, one quorum round for every read waiting when it starts.
    read_indexes: Coalescer<(), Result<u64, Arc<RaftError>>>,
    /// Whether this node takes part in elections.
    standing: Arc<tokio::sync::watch::Sender<Standing>>,
    /// Where the rejoin marker lives.
    data_dir: PathBuf,
    /// While this node does not vote: the one candidate an operator let it vote for (0:
    /// none), see [`RaftNode::allow_vote_for`].
    allowed_candidate: Arc<AtomicU64>,
    /// The log, for the archiver (openraft owns another handle to it).
    log: LogStore,
}

impl std::fmt::Debug for RaftNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftNode")
            .field("node_id", &self.node_id)
            .finish()
    }
}

fn member(id: u64, node: Option<&BasicNode>) -> Option<Member> {
    node.map(|n| Member {
        id,
        addr: n.addr.clone(),
    })
}

impl RaftNode {
    // Called once, by `RaftNode::start`, with the parts it has just opened.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        raft: Raft,
        store: Store,
        heads: HeadWatch,
        node_id: u64,
        proposer: Proposer,
        standing: Standing,
        data_dir: PathBuf,
        log: LogStore,
    ) -> Self {
        let current_leader = Arc::new(AtomicU64::new(0));
        // Server metrics change with leadership and membership only, not per entry.
        let mut server = raft.server_metrics();
        let published = current_leader.clone();
        let (changes, leader_changes) = tokio::sync::watch::channel(0);
        tokio::spawn(async move {
            loop {
                let leader = server.borrow_and_update().current_leader.unwrap_or(0);
                published.store(leader, Ordering::Release);
                changes.send_replace(leader);
                if server.changed().await.is_err() {
                    return;
                }
            }
        });
        let read_indexes = {
            let raft = raft.clone();
            Coalescer::spawn(move |()| {
                let raft = raft.clone();
                async move {
                    raft.get_read_log_id()
                        .await
                        .map(|(read, _applied)| read.map_or(0, |l| l.index))
                        .map_err(|e| Arc::new(Self::read_error(e)))
                }
            })
        };
        let node = RaftNode {
            raft,
            store,
            heads,
            node_id,
            proposer: Arc::new(proposer),
            current_leader,
            leader_changes,
            read_indexes,
            standing: Arc::new(tokio::sync::watch::Sender::new(standing)),
            data_dir,
            allowed_candidate: Arc::new(AtomicU64::new(0)),
            log,
        };
        node.raft
            .runtime_config()
            .elect(standing == Standing::Voting);
        if standing == Standing::Rejoining {
            node.spawn_rejoin_watch();
        }
        node
    }

    /// Whether this node takes part in elections (see [`Standing`]).
    pub fn standing(&self) -> Standing {
        *self.standing.borrow()
    }

    /// The same, changing as the node's standing does.
    pub fn watch_standing(&self) -> tokio::sync::watch::Receiver<Standing> {
        self.standing.subscribe()
    }

    /// True while this node may grant votes: a node that lost its state must not.
    pub fn may_vote(&self) -> bool {
        self.standing() == Standing::Voting
    }

    /// True when this node may grant `candidate` its vote: always while it votes, else only
    /// the candidate an operator named with [`RaftNode::allow_vote_for`].
    pub fn may_vote_for(&self, candidate: u64) -> bool {
        self.may_vote()
            || (candidate != 0 && self.allowed_candidate.load(Ordering::Acquire) == candidate)
    }

    /// Recovery after a majority of voters lost their state, on the operator's word: this
    /// node, which does not vote, may vote for `candidate`, a survivor whose log becomes the
    /// group's (writes acknowledged only by the nodes that lost their state are gone). It
    /// then rejoins like any node that lost its state. Refused on a node that votes.
    pub fn allow_vote_for(&self, candidate: u64) -> Result<Standing, RaftError> {
        let standing = self.standing();
        if standing == Standing::Voting {
            return Err(RaftError::Membership(format!(
                "node {} has its raft state and votes as usual: nothing to allow",
                self.node_id
            )));
        }
        if candidate == 0 || candidate == self.node_id {
            return Err(RaftError::Membership(format!(
                "the candidate must be another member, not {candidate}"
            )));
        }
        self.allowed_candidate.store(candidate, Ordering::Release);
        tracing::warn!(
            node_id = self.node_id,
            candidate,
            "an operator let this node, which lost its raft state, vote for node {candidate}: its log becomes the group's"
        );
        Ok(standing)
    }

    /// An undecided node heard from every initial member that none has a log: the group is
    /// new. It votes from now on, and the lowest member initialises the group.
    pub async fn form_new_group(&self, members: &BTreeMap<u64, String>) -> Result<(), RaftError> {
        if self.standing() != Standing::Undecided {
            return Ok(());
        }
        self.standing.send_replace(Standing::Voting);
        self.raft.runtime_config().elect(true);
        if members.keys().next() == Some(&self.node_id) {
            crate::bootstrap::initialise(&self.raft, members).await?;
        }
        Ok(())
    }

    /// Snapshots what this node has applied and purges its log up to the snapshot, waiting
    /// up to `timeout` for both; returns the snapshot's index. A member that joins later
    /// can then only catch up by installing the snapshot. A state machine restored from a
    /// backup needs this before it has peers: it holds data that no entry of its (new) log
    /// produced, so a member replaying that log from its start would miss all of it.
    pub async fn seal_log_behind_snapshot(&self, timeout: Duration) -> Result<u64, RaftError> {
        // What is applied once this node leads and has applied its own term's first entry
        // (the group it formed is new: it is its only voter).
        let me = self.node_id;
        self.raft
            .wait(Some(timeout))
            .metrics(
                |m| m.current_leader == Some(me) && m.state == ServerState::Leader,
                "this node to lead its new group",
            )
            .await
            .map_err(|_| RaftError::Timeout("this node to lead its new group"))?;
        let applied = self.read_index().await?;
        self.wait_applied(applied, timeout).await?;
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        let built = self
            .raft
            .wait(Some(timeout))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= applied),
                "a snapshot of the applied state",
            )
            .await
            .map_err(|_| RaftError::Timeout("a snapshot of the applied state"))?
            .snapshot
            .map_or(0, |s| s.index);
        self.raft
            .trigger()
            .purge_log(built)
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        self.raft
            .wait(Some(timeout))
            .metrics(
                |m| m.purged.is_some_and(|p| p.index >= built),
                "the log purged up to the snapshot",
            )
            .await
            .map_err(|_| RaftError::Timeout("the log purged up to the snapshot"))?;
        Ok(built)
    }

    /// A node without its Raft state learnt that the group has a log (or it joins): it stays
    /// out of elections until a leader has made it a learner and then a voter again. The
    /// marker is on disk before this returns, so a restart keeps it out too.
    pub fn begin_rejoin(&self) -> Result<(), RaftError> {
        if self.standing() == Standing::Rejoining {
            return Ok(());
        }
        standing::write_marker(&self.data_dir)?;
        self.raft.runtime_config().elect(false);
        self.standing.send_replace(Standing::Rejoining);
        tracing::warn!(
            node_id = self.node_id,
            "this node has no raft state but the group has a log: it does not vote until the leader has made it a learner and then a voter again"
        );
        self.spawn_rejoin_watch();
        Ok(())
    }

    /// Watches the committed membership of a rejoining node and lets it vote once the
    /// leader made it a voter after a learner.
    fn spawn_rejoin_watch(&self) {
        let node = self.clone();
        tokio::spawn(async move {
            let mut metrics = node.raft.metrics();
            let mut progress = RejoinProgress::default();
            loop {
                let placement =
                    standing::committed_placement(&metrics.borrow_and_update(), node.node_id);
                if progress.observe(placement) {
                    match standing::remove_marker(&node.data_dir) {
                        Ok(()) => {
                            node.allowed_candidate.store(0, Ordering::Release);
                            node.standing.send_replace(Standing::Voting);
                            node.raft.runtime_config().elect(true);
                            tracing::info!(
                                node_id = node.node_id,
                                "rejoined as a voter: this node votes again"
                            );
                        }
                        // Still out of elections: safe, and the next start looks again.
                        Err(e) => tracing::error!(
                            node_id = node.node_id,
                            "failed to end the rejoin, the node stays out of elections: {e}"
                        ),
                    }
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Proposes a command and waits until it is committed and applied. Concurrent calls
    /// are folded into shared log entries by the proposer. On a node that does not lead,
    /// [`RaftError::ForwardToLeader`] names the leader: nothing was proposed.
    pub async fn write(&self, command: Command) -> Result<Outcome, RaftError> {
        if matches!(command, Command::Batch(_) | Command::Planned(_)) {
            // Only the proposer makes these: a batch or a plan from elsewhere (a peer's
            // forwarded command) would skip the checks each command gets.
            return Ok(Err(cairn_core::Error::invalid(
                "batches and planned writes are made by the leader's proposer, not sent to it",
            )));
        }
        if !self.is_leader() {
            return Err(self.forward_to_leader());
        }
        self.proposer.submit(command).await
    }

    /// True while this node believes it leads (the next write may still learn otherwise).
    pub fn is_leader(&self) -> bool {
        self.current_leader.load(Ordering::Acquire) == self.node_id
    }

    /// True once this node belongs to a group's membership (voter or learner).
    pub fn is_member(&self) -> bool {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&self.node_id)
            .is_some()
    }

    /// Where node `id` stands in the newest membership this node has seen (voters and
    /// learners alike).
    pub fn member_addr(&self, id: u64) -> MemberAddr {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        if membership.nodes().next().is_none() {
            return MemberAddr::NoMembership;
        }
        match membership.get_node(&id) {
            Some(node) => MemberAddr::Member(node.addr.clone()),
            None => MemberAddr::NotAMember,
        }
    }

    /// The id of the leader this node knows of (0: none), changing as leadership moves;
    /// [`RaftNode::is_leader`] agrees with it by the time a change is seen.
    pub fn watch_leader(&self) -> tokio::sync::watch::Receiver<u64> {
        self.leader_changes.clone()
    }

    /// The leader this node knows of, with its peer address.
    pub fn leader(&self) -> Option<Member> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let id = m.current_leader?;
        member(id, m.membership_config.membership().get_node(&id))
    }

    fn forward_to_leader(&self) -> RaftError {
        let leader = self.leader();
        RaftError::ForwardToLeader {
            leader_id: leader.as_ref().map(|l| l.id),
            leader_addr: leader.map(|l| l.addr),
        }
    }

    /// This node's view of the group.
    pub fn view(&self) -> ClusterView {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let voter_ids: Vec<u64> = membership.voter_ids().collect();
        let mut voters = Vec::new();
        let mut learners = Vec::new();
        for (id, node) in membership.nodes() {
            let entry = Member {
                id: *id,
                addr: node.addr.clone(),
            };
            if voter_ids.contains(id) {
                voters.push(entry);
            } else {
                learners.push(entry);
            }
        }
        let role = match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        };
        ClusterView {
            node_id: self.node_id,
            role,
            term: m.current_term,
            leader: m
                .current_leader
                .and_then(|id| member(id, membership.get_node(&id))),
            voters,
            learners,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            matched: m
                .replication
                .as_ref()
                .map(|r| {
                    r.iter()
                        .map(|(id, log)| (*id, log.map_or(0, |l| l.index)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Waits up to `timeout` until some node leads, and returns it.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<Member, RaftError> {
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader() {
                return Ok(leader);
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(RaftError::Fatal("raft stopped".into())),
                Err(_) => return Err(RaftError::Timeout("a leader")),
            }
        }
    }

    /// On the leader: waits until this node has applied everything committed when the call
    /// started, after confirming with a quorum that it still leads (linearizable reads).
    /// Elsewhere: [`RaftError::ForwardToLeader`]; see [`RaftNode::read_index`].
    pub async fn read_barrier(&self) -> Result<(), RaftError> {
        let index = self.read_index().await?;
        // Usually applied already: a borrow answers that, where openraft's wait would clone
        // the whole metrics struct first.
        let applied = self
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |l| l.index);
        if applied >= index {
            return Ok(());
        }
        // The caller bounds the whole read; this wait only ends early on shutdown.
        self.wait_applied(index, READ_APPLY_WAIT).await
    }

    /// On the leader: the log index a linearizable read must wait for, after confirming
    /// with a quorum that this node still leads; concurrent reads share one confirmation
    /// round (see [`Coalescer`]). A follower asks the leader for it, then waits with
    /// [`RaftNode::wait_applied`] until it has applied that far.
    pub async fn read_index(&self) -> Result<u64, RaftError> {
        match self.read_indexes.call(()).await {
            Some(result) => result.map_err(|e| e.for_another_caller()),
            None => Err(RaftError::Fatal("raft stopped".into())),
        }
    }

    fn read_error(e: OpenRaftError<u64, CheckIsLeaderError<u64, BasicNode>>) -> RaftError {
        match e {
            OpenRaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => {
                RaftError::ForwardToLeader {
                    leader_id: f.leader_id,
                    leader_addr: f.leader_node.map(|n| n.addr),
                }
            }
            OpenRaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)) => {
                RaftError::NoLeader(format!("this node cannot confirm that it leads: {q}"))
            }
            OpenRaftError::Fatal(f) => RaftError::Fatal(f.to_string()),
        }
    }

    /// Waits up to `timeout` until this node has applied the entry at `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), RaftError> {
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "a linearizable read")
            .await
            .map(|_| ())
            .map_err(|e| match e {
                openraft::metrics::WaitError::Timeout(..) => {
                    RaftError::Timeout("this node to apply the read index")
                }
                openraft::metrics::WaitError::ShuttingDown => {
                    RaftError::Fatal("raft is shutting down".into())
                }
            })
    }

    /// On the leader: adds `id` at `addr` as a learner (it replicates, it does not vote) and
    /// returns once the change is committed; replication to it starts at once.
    pub async fn add_learner(&self, id: u64, addr: String) -> Result<(), RaftError> {
        self.raft
            .add_learner(id, BasicNode { addr }, false)
            .await
            .map(|_| ())
            .map_err(membership_error)
    }

    /// On the leader: makes node `id`, which lost its state, a learner: a voter is demoted
    /// (its place kept, so replication to it goes on), a stranger added. Returns once the
    /// change is committed.
    pub async fn make_learner(&self, id: u64, addr: String) -> Result<(), RaftError> {
        let view = self.view();
        if view.voters.iter().any(|m| m.id == id) {
            self.change(ChangeMembers::RemoveVoters(BTreeSet::from([id])), true)
                .await
        } else if view.learners.iter().any(|m| m.id == id) {
            Ok(())
        } else {
            self.add_learner(id, addr).await
        }
    }

    /// On the leader: makes learner `id` a voter.
    pub async fn promote(&self, id: u64) -> Result<(), RaftError> {
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
    }

    /// On the leader: removes `id` from the group, voter or learner.
    pub async fn remove(&self, id: u64) -> Result<(), RaftError> {
        let is_voter = self.view().voters.iter().any(|m| m.id == id);
        if is_voter {
            // Without `retain`, a removed voter leaves the membership entirely.
            self.change(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                .await
        } else {
            self.change(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
        }
    }

    /// A membership change; `retain` keeps removed voters as learners.
    async fn change(
        &self,
        change: ChangeMembers<u64, BasicNode>,
        retain: bool,
    ) -> Result<(), RaftError> {
        self.raft
            .change_membership(change, retain)
            .await
            .map(|_| ())
            .map_err(membership_error)
    }

    /// The Raft log (the archiver reads committed entries from it).
    pub fn log_store(&self) -> &LogStore {
        &self.log
    }

    /// The last log index this node has applied (hence committed).
    pub fn applied_index(&self) -> u64 {
        self.raft
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |id| id.index)
    }

    /// The state machine's store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Head watch channels.
    pub fn heads(&self) -> &HeadWatch {
        &self.heads
    }

    /// The openraft handle (metrics).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// This node's Raft id.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Why Raft stopped on its own, if it did: a storage error applying an entry or
    /// writing the log (a full disk, a failing one). Such a node can neither write nor
    /// catch up; it must be restarted.
    pub fn fatal(&self) -> Option<String> {
        self.raft
            .metrics()
            .borrow()
            .running_state
            .as_ref()
            .err()
            .map(|e| e.to_string())
    }

    /// Resolves with the reason once Raft has stopped on its own (never, while it runs).
    pub async fn stopped(&self) -> String {
        // The server metrics change with leadership and membership only, and end when the
        // Raft core stops (a fatal error ends it). The full metrics change several times
        // per write, and the caller waits on the process's main thread: each change woke
        // it, a futex round trip and a context switch per write.
        let mut server = self.raft.server_metrics();
        loop {
            server.borrow_and_update();
            if let Some(fatal) = self.fatal() {
                return fatal;
            }
            if server.changed().await.is_err() {
                return self.fatal().unwrap_or_else(|| "raft stopped".to_string());
            }
        }
    }

    /// Stops openraft, flushes memtables and syncs the WAL.
    pub async fn shutdown(&self) -> Result<(), RaftError> {
        self.proposer.stop();
        self.raft
            .shutdown()
            .await
            .map_err(|e| RaftError::Fatal(format!("raft shutdown failed: {e}")))?;
        let store = self.store.clone();
        // Flushing memtables makes the next start fast: nothing to replay from the WAL.
        tokio::task::spawn_blocking(move || store.flush().and_then(|()| store.sync_wal()))
            .await
            .map_err(|e| RaftError::Fatal(format!("wal sync task failed: {e}")))??;
        Ok(())
    }
}

fn membership_error(e: OpenRaftError<u64, ClientWriteError<u64, BasicNode>>) -> RaftError {
    match e {
        OpenRaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            RaftError::ForwardToLeader {
                leader_id: f.leader_id,
                leader_addr: f.leader_node.map(|n| n.addr),
            }
        }
        OpenRaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            RaftError::Membership(e.to_string())
        }
        OpenRaftError::Fatal(f) => RaftError::Fatal(f.to_string()),
    }
}

/// How long a leader's read waits for its own state machine to reach the read index; the
/// read's caller has a tighter bound of its own.
const READ_APPLY_WAIT: Duration = Duration::from_secs(3600);
