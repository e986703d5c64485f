//! How a clustered node without Raft state comes to take part in its group, without ever
//! voting on a log it has lost (see [`cairn_raft::Standing`]).
//!
//! - One of a new group's initial members asks every other one for its log. Only when all
//!   of them answer with an empty log is the group new: the node votes from then on and the
//!   lowest member initialises the group. A single member with a log means this node lost
//!   its state: it rejoins. Until one or the other is known, it waits and does not vote, so
//!   a wiped node never helps elect a leader and two wiped nodes never form a majority over
//!   empty logs.
//! - A rejoining node asks any member to make it a learner (the leader demotes it if it
//!   was a voter), catches up, and asks to be a voter again; Raft votes once a committed
//!   membership made it a voter after one made it a learner.
//! - A node started with `--join` does the same but stays a learner until someone promotes
//!   it (`cairn cluster promote`, the operator).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::cairn_v1 as pb;
use cairn_raft::Standing;
use tokio::task::JoinHandle;

use crate::config::Membership;
use crate::state::NodeState;

/// Pause between rounds of asking members (for their logs, to be made a learner).
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How often a node still waiting says so, and on whom.
const NOTICE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a rejoining learner waits to catch up before it asks again (a snapshot of a
/// large state takes a while; asking again only learns the leader's newer last index).
const CATCH_UP_WAIT: Duration = Duration::from_secs(60);
/// How long a promoted node waits to apply its promotion before it asks again.
const PROMOTION_WAIT: Duration = Duration::from_secs(10);

/// What the members of a new group said about their logs so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Some members have not answered yet (their ids).
    Waiting(Vec<u64>),
    /// Every member has an empty log: the group is new.
    New,
    /// This member has a log: the group exists and this node lost its state.
    Exists(u64),
}

/// Decides from the last log index each other initial member reported (absent: no answer
/// yet). One log settles it at once; an empty group needs every answer, because the one
/// member that does not answer may be the only one left with the group's log.
pub fn decide(members: &[u64], answers: &BTreeMap<u64, u64>) -> Found {
    if let Some((id, _)) = answers.iter().find(|(_, last)| **last > 0) {
        return Found::Exists(*id);
    }
    let waiting: Vec<u64> = members
        .iter()
        .copied()
        .filter(|id| !answers.contains_key(id))
        .collect();
    if waiting.is_empty() {
        Found::New
    } else {
        Found::Waiting(waiting)
    }
}

/// Starts what a node in its standing needs to take part in its group; `None` when it
/// already votes (or runs alone).
pub fn spawn(node: Arc<NodeState>) -> Option<JoinHandle<()>> {
    let membership = node.config.cluster.as_ref()?.membership.clone();
    let standing = node.raft.standing();
    if standing == Standing::Voting {
        return None;
    }
    let own = node.raft.node_id();
    Some(tokio::spawn(async move {
        let (targets, promote) = match &membership {
            Membership::Initial(members) => {
                let others: Vec<String> = members
                    .iter()
                    .filter(|(id, _)| **id != own)
                    .map(|(_, addr)| addr.clone())
                    .collect();
                if standing == Standing::Undecided {
                    match find_out(&node, members).await {
                        Found::New => {
                            // The member that initialises names the group; the others take
                            // the name from its first message.
                            if members.keys().next() == Some(&own)
                                && let Err(e) = node.identity.form()
                            {
                                tracing::error!("failed to name the new raft group: {e}");
                                return;
                            }
                            if let Err(e) = node.raft.form_new_group(members).await {
                                tracing::error!("failed to form the new raft group: {e}");
                            }
                            return;
                        }
                        Found::Exists(_) | Found::Waiting(_) => {}
                    }
                }
                (others, true)
            }
            Membership::Join(targets) => (targets.clone(), false),
        };
        if let Err(e) = node.raft.begin_rejoin() {
            // Without the marker a restart would vote on what it lost: do not go on.
            tracing::error!("failed to start rejoining the group: {e}");
            return;
        }
        rejoin(&node, &targets, promote).await;
    }))
}

/// Asks every other initial member for its log until [`decide`] can tell.
async fn find_out(node: &NodeState, members: &BTreeMap<u64, String>) -> Found {
    let own = node.raft.node_id();
    let others: Vec<u64> = members.keys().copied().filter(|id| *id != own).collect();
    let mut answers = BTreeMap::new();
    let mut notice = tokio::time::Instant::now() + NOTICE_INTERVAL;
    loop {
        for id in &others {
            if answers.contains_key(id) {
                continue;
            }
            if let Ok(status) = node.peers.status(&members[id]).await {
                answers.insert(*id, status.last_log_index);
            }
        }
        match decide(&others, &answers) {
            Found::Waiting(waiting) => {
                if tokio::time::Instant::now() >= notice {
                    notice += NOTICE_INTERVAL;
                    tracing::info!(
                        ?waiting,
                        "no raft state here: waiting for every initial member to answer before forming the group (one that does not may hold the group's log)"
                    );
                }
                tokio::time::sleep(RETRY_INTERVAL).await;
            }
            Found::New => {
                tracing::info!("every initial member has an empty log: forming a new group");
                return Found::New;
            }
            Found::Exists(id) => {
                tracing::warn!(
                    member = id,
                    "no raft state here, but member {id} has the group's log: this node lost its state and rejoins"
                );
                return Found::Exists(id);
            }
        }
    }
}

/// Asks members in turn to make this node a learner, catches up, and (when `promote`) asks
/// to be a voter again, until Raft counts it as one.
async fn rejoin(node: &NodeState, targets: &[String], promote: bool) {
    let own = node.raft.node_id();
    let address = node.config.advertise_addr.clone();
    for target in targets.iter().cycle() {
        if node.raft.standing() == Standing::Voting {
            return;
        }
        let request = node.peers.cluster_request(pb::RejoinRequest {
            node_id: own,
            address: address.clone(),
        });
        let made_learner = match node.peers.cluster(target) {
            Ok(mut client) => client.rejoin(request).await.map(|r| r.into_inner()),
            Err(status) => Err(status),
        };
        let caught_up_at = match made_learner {
            Ok(reply) => reply.last_log_index,
            Err(status) => {
                tracing::warn!(
                    %target,
                    "failed to be made a learner, retrying in {}s: {}",
                    RETRY_INTERVAL.as_secs(),
                    status.message()
                );
                tokio::time::sleep(RETRY_INTERVAL).await;
                continue;
            }
        };
        tracing::info!(%target, caught_up_at, "a learner now: catching up");
        if let Err(e) = node.raft.wait_applied(caught_up_at, CATCH_UP_WAIT).await {
            tracing::info!("still catching up ({e}); asking the group again");
            continue;
        }
        if !promote {
            tracing::info!(%target, node_id = own, "joined the cluster as a learner");
            return;
        }
        let request = node
            .peers
            .cluster_request(pb::PromoteRequest { node_id: own });
        let promoted = match node.peers.cluster(target) {
            Ok(mut client) => client.promote(request).await.map(|_| ()),
            Err(status) => Err(status),
        };
        if let Err(status) = promoted {
            tracing::warn!(%target, "failed to be made a voter again, retrying: {}", status.message());
            tokio::time::sleep(RETRY_INTERVAL).await;
            continue;
        }
        let mut standing = node.raft.watch_standing();
        let voting = standing.wait_for(|s| *s == Standing::Voting);
        if tokio::time::timeout(PROMOTION_WAIT, voting).await.is_err() {
            tracing::info!("the promotion has not reached this node yet; asking the group again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_new_only_when_every_other_member_has_an_empty_log() {
        let members = [2, 3];
        assert_eq!(
            decide(&members, &BTreeMap::new()),
            Found::Waiting(vec![2, 3])
        );
        // One empty answer is not enough: node 3 may be the one with the group's log.
        assert_eq!(
            decide(&members, &BTreeMap::from([(2, 0)])),
            Found::Waiting(vec![3])
        );
        assert_eq!(
            decide(&members, &BTreeMap::from([(2, 0), (3, 0)])),
            Found::New
        );
    }

    #[test]
    fn one_member_with_a_log_means_this_node_lost_its_state() {
        assert_eq!(
            decide(&[2, 3], &BTreeMap::from([(3, 41)])),
            Found::Exists(3)
        );
        assert_eq!(
            decide(&[2, 3], &BTreeMap::from([(2, 0), (3, 7)])),
            Found::Exists(3)
        );
        // A group of one has nobody to ask.
        assert_eq!(decide(&[], &BTreeMap::new()), Found::New);
    }
}
