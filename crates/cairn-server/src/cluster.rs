//! The cluster API's logic: a node's status, and membership changes, which any node
//! accepts and the leader carries out.

use std::time::Duration;

use cairn_core::{Error, Query};
use cairn_proto::cairn_v1 as pb;
use cairn_raft::{ClusterView, RaftError, Role};
use cairn_store::{Direction, PageLimit, ReadStart};

use crate::peer::ClusterCalls;
use crate::state::NodeState;

/// Time after the leaders' lease has lapsed before the target campaigns (clock skew).
const LEASE_MARGIN: Duration = Duration::from_millis(50);
/// How long a leadership transfer may take before it is reported as failed.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

fn members(view: &ClusterView) -> Vec<pb::Member> {
    let voters = view.voters.iter().map(|m| (m, true));
    let learners = view.learners.iter().map(|m| (m, false));
    voters
        .chain(learners)
        .map(|(m, voter)| pb::Member {
            node_id: m.id,
            address: m.addr.clone(),
            voter,
        })
        .collect()
}

/// The index a majority of voters has stored, as the leader sees it (elsewhere: what this
/// node has applied, which the commit index is at least).
fn committed_index(view: &ClusterView) -> u64 {
    if view.role != Role::Leader {
        return view.applied_index;
    }
    let mut matched: Vec<u64> = view
        .voters
        .iter()
        .map(|m| {
            if m.id == view.node_id {
                view.last_log_index
            } else {
                view.matched.get(&m.id).copied().unwrap_or(0)
            }
        })
        .collect();
    matched.sort_unstable_by(|a, b| b.cmp(a));
    matched.get(matched.len() / 2).copied().unwrap_or(0)
}

/// This node's view of the cluster and the last position of every boundary it has applied.
pub async fn status(node: &NodeState) -> Result<pb::StatusResponse, Error> {
    let view = node.raft.view();
    let boundaries = node
        .blocking(|store| {
            let boundaries: Vec<(String, u32, bool)> = store.with_catalog(|c| {
                c.boundaries
                    .values()
                    .map(|b| (b.name.clone(), b.id, b.idempotent_event_ids))
                    .collect()
            });
            boundaries
                .into_iter()
                .map(|(name, id, idempotent_event_ids)| {
                    let last = store.read_events(
                        id,
                        &Query::default(),
                        ReadStart::Edge,
                        Direction::Desc,
                        PageLimit::events(1),
                    )?;
                    let (commit, prepare) = last
                        .first()
                        .map_or((-1, -1), |e| (e.position.commit, e.position.prepare));
                    Ok(pb::BoundaryHead {
                        name,
                        commit_position: commit,
                        prepare_position: prepare,
                        idempotent_event_ids,
                    })
                })
                .collect()
        })
        .await?;
    Ok(pb::StatusResponse {
        node_id: view.node_id,
        role: view.role.as_str().to_string(),
        term: view.term,
        leader_id: view.leader.as_ref().map_or(0, |l| l.id),
        leader_address: view
            .leader
            .as_ref()
            .map(|l| l.addr.clone())
            .unwrap_or_default(),
        committed_index: committed_index(&view),
        applied_index: view.applied_index,
        last_log_index: view.last_log_index,
        members: members(&view),
        followers: view
            .matched
            .iter()
            .filter(|(id, _)| **id != view.node_id)
            .map(|(id, matched)| pb::FollowerProgress {
                node_id: *id,
                matched_index: *matched,
            })
            .collect(),
        boundaries,
        version: crate::event_store::VERSION.to_string(),
        standing: node.raft.standing().as_str().to_string(),
        cluster_id: node.identity.id().unwrap_or_default(),
    })
}

fn membership(node: &NodeState) -> pb::MembershipResponse {
    let view = node.raft.view();
    pb::MembershipResponse {
        members: members(&view),
        last_log_index: view.last_log_index,
    }
}

fn remote(status: tonic::Status) -> Error {
    cairn_proto::from_status(&status)
}

/// A membership change, carried out by the leader.
enum Change {
    AddLearner { id: u64, address: String },
    Rejoin { id: u64, address: String },
    Promote(u64),
    Remove(u64),
}

/// Carries `change` out here if this node leads, else on the leader; while no leader is
/// known (an election, e.g. right after the leader removed itself) waits up to the leader
/// wait for one.
async fn change_membership(
    node: &NodeState,
    change: Change,
) -> Result<pb::MembershipResponse, Error> {
    let deadline = tokio::time::Instant::now() + node.config.leader_wait;
    loop {
        let local = match &change {
            Change::AddLearner { id, address } => node.raft.add_learner(*id, address.clone()).await,
            Change::Rejoin { id, address } => node.raft.make_learner(*id, address.clone()).await,
            Change::Promote(id) => node.raft.promote(*id).await,
            Change::Remove(id) => node.raft.remove(*id).await,
        };
        match local {
            Ok(()) => return Ok(membership(node)),
            Err(RaftError::ForwardToLeader {
                leader_id: Some(leader),
                leader_addr: Some(addr),
            }) if leader != node.raft.node_id() => return on_leader(node, &addr, change).await,
            Err(RaftError::ForwardToLeader { .. }) => {
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                if node.raft.wait_for_leader(remaining).await.is_err() {
                    return Err(Error::Unavailable(format!(
                        "no leader to carry out the membership change within {} ms",
                        node.config.leader_wait.as_millis()
                    )));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn on_leader(
    node: &NodeState,
    addr: &str,
    change: Change,
) -> Result<pb::MembershipResponse, Error> {
    let mut leader = node.peers.cluster(addr).map_err(remote)?;
    let reply = match change {
        Change::AddLearner { id, address } => {
            leader
                .add_learner(node.peers.cluster_request(pb::AddLearnerRequest {
                    node_id: id,
                    address,
                }))
                .await
        }
        Change::Rejoin { id, address } => {
            leader
                .rejoin(node.peers.cluster_request(pb::RejoinRequest {
                    node_id: id,
                    address,
                }))
                .await
        }
        Change::Promote(id) => {
            leader
                .promote(
                    node.peers
                        .cluster_request(pb::PromoteRequest { node_id: id }),
                )
                .await
        }
        Change::Remove(id) => {
            leader
                .remove_node(
                    node.peers
                        .cluster_request(pb::RemoveNodeRequest { node_id: id }),
                )
                .await
        }
    };
    reply.map(|r| r.into_inner()).map_err(remote)
}

fn require_id_and_address(who: &str, id: u64, address: &str) -> Result<(), Error> {
    if id == 0 || address.is_empty() {
        return Err(Error::invalid(format!(
            "{who} needs a node id ≥ 1 and an address"
        )));
    }
    Ok(())
}

/// With peer TLS, a node is added at `address` only once it proved to be there: dialled
/// at that address, it presented a certificate of the cluster CA naming its host (the TLS
/// handshake checks both) and said it is node `id`. Without it, a holder of any
/// certificate of the CA (or of another member's) could put an address of its choosing
/// into the membership. Every node the request passes checks, the leader included.
async fn proven(node: &NodeState, id: u64, address: &str) -> Result<(), Error> {
    if node.config.cluster.as_ref().is_none_or(|c| c.tls.is_none()) {
        return Ok(());
    }
    let status = node.peers.status(address).await.map_err(|status| {
        Error::Unavailable(format!(
            "node {id} cannot be added at {address}: dialled there, it did not answer with a \
             certificate of the cluster CA naming that host: {}",
            status.message()
        ))
    })?;
    if status.node_id != id {
        return Err(Error::FailedPrecondition(format!(
            "node {id} cannot be added at {address}: the node there is node {}",
            status.node_id
        )));
    }
    Ok(())
}

/// Adds a learner (on the leader; elsewhere the call goes to the leader).
pub async fn add_learner(
    node: &NodeState,
    id: u64,
    address: String,
) -> Result<pb::MembershipResponse, Error> {
    require_id_and_address("a learner", id, &address)?;
    crate::backup::refuse_members_while_sealing(node)?;
    proven(node, id, &address).await?;
    change_membership(node, Change::AddLearner { id, address }).await
}

/// Makes a node that lost its Raft state a learner (on the leader; elsewhere the call goes
/// to the leader): a voter is demoted, a node that is not a member added.
pub async fn rejoin(
    node: &NodeState,
    id: u64,
    address: String,
) -> Result<pb::MembershipResponse, Error> {
    require_id_and_address("a rejoining node", id, &address)?;
    crate::backup::refuse_members_while_sealing(node)?;
    if id == node.raft.node_id() {
        return Err(Error::invalid(
            "a node cannot carry out its own rejoin: ask another member",
        ));
    }
    proven(node, id, &address).await?;
    change_membership(node, Change::Rejoin { id, address }).await
}

/// Promotes a learner to voter.
pub async fn promote(node: &NodeState, id: u64) -> Result<pb::MembershipResponse, Error> {
    change_membership(node, Change::Promote(id)).await
}

/// Removes a node from the membership.
pub async fn remove(node: &NodeState, id: u64) -> Result<pb::MembershipResponse, Error> {
    let view = node.raft.view();
    if !view.voters.iter().chain(&view.learners).any(|m| m.id == id) {
        return Err(Error::NotFound(format!("node {id} is not a member")));
    }
    if view.voters.len() == 1 && view.voters[0].id == id {
        return Err(Error::FailedPrecondition(format!(
            "node {id} is the only voter: removing it would leave no quorum"
        )));
    }
    change_membership(node, Change::Remove(id)).await
}

/// Hands leadership to voter `id` once it has every entry: the leader stops its heartbeats
/// and the target starts an election, which it wins because its log is as long as anyone's
/// and it campaigns first.
pub async fn transfer_leader(node: &NodeState, id: u64) -> Result<u64, Error> {
    let view = node.raft.view();
    if view.role != Role::Leader {
        let leader = view
            .leader
            .ok_or_else(|| Error::Unavailable("no leader to transfer from".into()))?;
        return node
            .peers
            .cluster(&leader.addr)
            .map_err(remote)?
            .transfer_leader(
                node.peers
                    .cluster_request(pb::TransferLeaderRequest { node_id: id }),
            )
            .await
            .map(|r| r.into_inner().leader_id)
            .map_err(remote);
    }
    if id == view.node_id {
        return Ok(id);
    }
    let target = view
        .voters
        .iter()
        .find(|m| m.id == id)
        .ok_or_else(|| Error::FailedPrecondition(format!("node {id} is not a voter")))?
        .clone();
    let matched = view.matched.get(&id).copied().unwrap_or(0);
    if matched < view.last_log_index {
        return Err(Error::FailedPrecondition(format!(
            "node {id} has replicated up to {matched} of {}: wait until it has caught up",
            view.last_log_index
        )));
    }
    // Followers refuse to vote while the leader's lease (the longest election timeout
    // since its last message) runs, so the leader falls silent first, and the target
    // campaigns as soon as the leases have lapsed, before any other follower's timer fires.
    let _silent = HeartbeatsOff::start(node.raft.raft());
    hand_over(node, id, &target.addr).await
}

/// Holds a leader's heartbeats off and turns them back on when dropped: the transfer's
/// caller may give up first (its RPC cancelled at the deadline drops this future), and a
/// leader left silent would have an idle group re-elect every election timeout (review
/// finding 8).
struct HeartbeatsOff(cairn_raft::Raft);

impl HeartbeatsOff {
    fn start(raft: &cairn_raft::Raft) -> Self {
        raft.runtime_config().heartbeat(false);
        HeartbeatsOff(raft.clone())
    }
}

impl Drop for HeartbeatsOff {
    fn drop(&mut self) {
        self.0.runtime_config().heartbeat(true);
    }
}

/// How long a leader that is shutting down waits for a voter to catch up before handing over.
const STEP_DOWN_CATCH_UP: Duration = Duration::from_secs(2);

/// On shutdown: a leader hands leadership to its best-replicated voter, so the cluster does
/// not wait out an election timeout (and a restarted pod does not simply win again). Returns
/// the new leader, or `None` when this node does not lead or leads alone.
pub async fn step_down(node: &NodeState) -> Result<Option<u64>, Error> {
    let deadline = tokio::time::Instant::now() + STEP_DOWN_CATCH_UP;
    loop {
        let view = node.raft.view();
        if view.role != Role::Leader {
            return Ok(None);
        }
        let best = view
            .voters
            .iter()
            .filter(|m| m.id != view.node_id)
            .map(|m| (view.matched.get(&m.id).copied().unwrap_or(0), m.id))
            .max();
        match best {
            None => return Ok(None),
            Some((matched, id)) if matched >= view.last_log_index => {
                return transfer_leader(node, id).await.map(Some);
            }
            Some((matched, id)) if tokio::time::Instant::now() >= deadline => {
                return Err(Error::Unavailable(format!(
                    "no voter caught up within {}s (node {id} has {matched} of {})",
                    STEP_DOWN_CATCH_UP.as_secs(),
                    view.last_log_index
                )));
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn hand_over(node: &NodeState, id: u64, addr: &str) -> Result<u64, Error> {
    tokio::time::sleep(node.config.timing.election_max + LEASE_MARGIN).await;
    node.peers
        .cluster(addr)
        .map_err(remote)?
        .elect(node.peers.cluster_request(pb::ElectRequest {}))
        .await
        .map_err(remote)?;
    let deadline = tokio::time::Instant::now() + TRANSFER_TIMEOUT;
    let mut metrics = node.raft.raft().server_metrics();
    loop {
        let leader = metrics.borrow().current_leader;
        match leader {
            Some(leader) if leader == id => return Ok(id),
            Some(other) if other != node.raft.node_id() => {
                return Err(Error::Unavailable(format!(
                    "node {other} won the election instead of node {id}; the cluster has a leader, retry the transfer if it matters"
                )));
            }
            _ => {}
        }
        match tokio::time::timeout_at(deadline, metrics.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Error::Unavailable("raft stopped".into())),
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "node {id} did not take over within {}s (writes during the transfer keep the current leader's lease alive)",
                    TRANSFER_TIMEOUT.as_secs()
                )));
            }
        }
    }
}

/// The peer port's `cairn.v1.Cluster` calls, answered by this module.
#[tonic::async_trait]
impl ClusterCalls for NodeState {
    async fn status(&self) -> Result<pb::StatusResponse, Error> {
        status(self).await
    }

    async fn add_learner(&self, id: u64, address: String) -> Result<pb::MembershipResponse, Error> {
        add_learner(self, id, address).await
    }

    async fn rejoin(&self, id: u64, address: String) -> Result<pb::MembershipResponse, Error> {
        rejoin(self, id, address).await
    }

    async fn promote(&self, id: u64) -> Result<pb::MembershipResponse, Error> {
        promote(self, id).await
    }

    async fn remove(&self, id: u64) -> Result<pb::MembershipResponse, Error> {
        remove(self, id).await
    }

    async fn transfer_leader(&self, id: u64) -> Result<u64, Error> {
        transfer_leader(self, id).await
    }
}
