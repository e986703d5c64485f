//! Step five of a reconcile: the Raft membership follows the StatefulSet, one change at a
//! time. Pure: [`plan`] decides from the leader's view of the cluster, and the controller
//! carries the decision out and looks again on its next pass.
//!
//! A pod's Raft node id is its ordinal + 1 (`cairn serve --node-id-from-hostname`). Growing:
//! the StatefulSet grows first, each new pod joins by itself as a learner (it is not among
//! `--initial-members`), and is promoted here once caught up. Shrinking: the nodes beyond the
//! wanted count leave the membership first, highest id first, leadership handed away first if
//! they lead; only then does the StatefulSet shrink, so no voter is ever stopped while it
//! still counts towards a quorum.

use std::collections::BTreeMap;

use crate::build::node_id;

/// A follower this close to the leader's last log index counts as caught up.
pub const CAUGHT_UP_LAG: u64 = 64;

/// One member as the leader reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewMember {
    /// Raft node id.
    pub node_id: u64,
    /// False for a learner.
    pub voter: bool,
}

/// The leader's view of the cluster (`cairn.v1.Cluster/Status` on the leader).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The leader's node id.
    pub leader_id: u64,
    /// The current configuration.
    pub members: Vec<ViewMember>,
    /// The leader's last log index.
    pub last_log_index: u64,
    /// Each follower's (voter or learner) highest replicated index.
    pub matched: BTreeMap<u64, u64>,
}

impl ClusterView {
    fn caught_up(&self, node_id: u64) -> bool {
        node_id == self.leader_id
            || self
                .matched
                .get(&node_id)
                .is_some_and(|m| m.saturating_add(CAUGHT_UP_LAG) >= self.last_log_index)
    }

    fn voters(&self) -> impl Iterator<Item = u64> + '_ {
        self.members.iter().filter(|m| m.voter).map(|m| m.node_id)
    }
}

/// One membership change, sent to the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Make a caught-up learner a voter.
    Promote(u64),
    /// Take a node out of the membership.
    Remove(u64),
    /// Hand leadership to this caught-up voter (the leader is about to be removed).
    TransferLeader(u64),
}

/// What to do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The change to make, if one is due and safe.
    pub change: Option<Change>,
    /// How many pods the StatefulSet runs: never fewer than the members need.
    pub pods: i32,
    /// True when the voters are exactly the wanted nodes, there are no learners, and the
    /// StatefulSet runs exactly them.
    pub settled: bool,
}

/// Decides the next step towards `wanted` voters (nodes 1..=wanted) given the pods the
/// StatefulSet runs now and the leader's view, if the operator could get one.
pub fn plan(wanted: i32, running_pods: i32, view: Option<&ClusterView>) -> Plan {
    let Some(view) = view else {
        // Without a leader nothing may leave: keep every pod that may still be a voter.
        return Plan {
            change: None,
            pods: wanted.max(running_pods),
            settled: false,
        };
    };
    let wanted_ids = 1..=node_id(wanted - 1);
    let is_wanted = |id: u64| wanted_ids.contains(&id);
    let highest_member = view.members.iter().map(|m| m.node_id).max().unwrap_or(0);
    let pods = wanted.max(i32::try_from(highest_member).unwrap_or(i32::MAX));

    let promote = view
        .members
        .iter()
        .filter(|m| !m.voter && is_wanted(m.node_id) && view.caught_up(m.node_id))
        .map(|m| m.node_id)
        .min();
    let unwanted = view
        .members
        .iter()
        .filter(|m| !is_wanted(m.node_id))
        .max_by_key(|m| m.node_id);
    let change = if let Some(learner) = promote {
        Some(Change::Promote(learner))
    } else if !is_wanted(view.leader_id) {
        // Hand over before removing the leader: the best-replicated wanted voter takes it.
        view.voters()
            .filter(|id| is_wanted(*id) && view.caught_up(*id))
            .max_by_key(|id| (view.matched.get(id).copied().unwrap_or(0), u64::MAX - id))
            .map(Change::TransferLeader)
    } else if let Some(member) = unwanted {
        // A voter leaves only when the ones that stay are enough and all caught up: the new
        // configuration's quorum must be reachable the moment it takes effect.
        let staying: Vec<u64> = view.voters().filter(|id| *id != member.node_id).collect();
        let safe = !member.voter
            || (staying.len() >= usize::try_from(wanted).unwrap_or(usize::MAX)
                && staying.iter().all(|id| view.caught_up(*id)));
        safe.then_some(Change::Remove(member.node_id))
    } else {
        None
    };

    let voters: Vec<u64> = view.voters().collect();
    let settled = change.is_none()
        && view.members.iter().all(|m| m.voter)
        && voters.len() == usize::try_from(wanted).unwrap_or(0)
        && voters.iter().all(|id| is_wanted(*id))
        && pods == wanted
        && running_pods == wanted;
    Plan {
        change,
        pods,
        settled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(leader: u64, voters: &[u64], learners: &[u64], lag: &[(u64, u64)]) -> ClusterView {
        let last = 1000;
        let mut matched: BTreeMap<u64, u64> = voters
            .iter()
            .chain(learners)
            .filter(|id| **id != leader)
            .map(|id| (*id, last))
            .collect();
        for (id, behind) in lag {
            matched.insert(*id, last - behind);
        }
        ClusterView {
            leader_id: leader,
            members: voters
                .iter()
                .map(|id| ViewMember {
                    node_id: *id,
                    voter: true,
                })
                .chain(learners.iter().map(|id| ViewMember {
                    node_id: *id,
                    voter: false,
                }))
                .collect(),
            last_log_index: last,
            matched,
        }
    }

    #[test]
    fn a_formed_cluster_is_settled() {
        let plan = plan(3, 3, Some(&view(2, &[1, 2, 3], &[], &[])));
        assert_eq!(
            plan,
            Plan {
                change: None,
                pods: 3,
                settled: true
            }
        );
        assert_eq!(node_id(0), 1);
        assert_eq!(node_id(4), 5);
    }

    #[test]
    fn without_a_view_nothing_changes_and_no_pod_goes() {
        assert_eq!(
            plan(3, 0, None),
            Plan {
                change: None,
                pods: 3,
                settled: false
            }
        );
        assert_eq!(plan(3, 5, None).pods, 5, "shrinking waits for a leader");
        assert_eq!(plan(5, 3, None).pods, 5, "growing does not");
    }

    #[test]
    fn growing_promotes_caught_up_learners_lowest_first() {
        // Pods 4 and 5 are asked for; until they have joined there is nothing to do.
        let forming = plan(5, 5, Some(&view(1, &[1, 2, 3], &[], &[])));
        assert_eq!(
            (forming.change, forming.pods, forming.settled),
            (None, 5, false)
        );
        let joined = view(1, &[1, 2, 3], &[4, 5], &[(4, 10), (5, 1000)]);
        assert_eq!(plan(5, 5, Some(&joined)).change, Some(Change::Promote(4)));
        let behind = view(1, &[1, 2, 3], &[4, 5], &[(4, 500), (5, 900)]);
        assert_eq!(plan(5, 5, Some(&behind)).change, None, "not caught up");
        let half = view(1, &[1, 2, 3, 4], &[5], &[]);
        assert_eq!(plan(5, 5, Some(&half)).change, Some(Change::Promote(5)));
        assert!(plan(5, 5, Some(&view(3, &[1, 2, 3, 4, 5], &[], &[]))).settled);
    }

    #[test]
    fn shrinking_removes_the_highest_first_and_keeps_their_pods_until_then() {
        let five = view(1, &[1, 2, 3, 4, 5], &[], &[]);
        let first = plan(3, 5, Some(&five));
        assert_eq!((first.change, first.pods), (Some(Change::Remove(5)), 5));
        let four = view(1, &[1, 2, 3, 4], &[], &[]);
        let second = plan(3, 5, Some(&four));
        assert_eq!((second.change, second.pods), (Some(Change::Remove(4)), 4));
        let three = plan(3, 5, Some(&view(1, &[1, 2, 3], &[], &[])));
        assert_eq!((three.change, three.pods, three.settled), (None, 3, false));
        let done = plan(3, 3, Some(&view(1, &[1, 2, 3], &[], &[])));
        assert!(done.settled);
    }

    #[test]
    fn a_leader_that_must_leave_hands_over_first() {
        let led_by_five = view(5, &[1, 2, 3, 4, 5], &[], &[(1, 200), (3, 2)]);
        // Node 2 has everything; node 3 is nearly there; node 1 is behind.
        assert_eq!(
            plan(3, 5, Some(&led_by_five)).change,
            Some(Change::TransferLeader(2))
        );
        let nobody_ready = view(5, &[1, 2, 3, 4, 5], &[], &[(1, 200), (2, 200), (3, 200)]);
        assert_eq!(plan(3, 5, Some(&nobody_ready)).change, None);
    }

    #[test]
    fn a_voter_leaves_only_when_the_staying_voters_suffice_and_are_caught_up() {
        let lagging = view(1, &[1, 2, 3, 4, 5], &[], &[(2, 300)]);
        assert_eq!(plan(3, 5, Some(&lagging)).change, None);
        // Node 2 is a learner and behind: voter 4 leaving would leave two voters.
        let learner_two = view(1, &[1, 3, 4], &[2], &[(2, 300)]);
        assert_eq!(plan(3, 4, Some(&learner_two)).change, None);
        let caught_up_two = view(1, &[1, 3, 4], &[2], &[]);
        assert_eq!(
            plan(3, 4, Some(&caught_up_two)).change,
            Some(Change::Promote(2))
        );
    }

    #[test]
    fn an_unwanted_learner_is_removed_without_conditions() {
        let joined_late = view(1, &[1, 2, 3], &[4], &[(4, 900), (2, 900)]);
        assert_eq!(
            plan(3, 4, Some(&joined_late)).change,
            Some(Change::Remove(4))
        );
    }

    #[test]
    fn one_replica_is_settled_alone() {
        let alone = ClusterView {
            leader_id: 1,
            members: vec![ViewMember {
                node_id: 1,
                voter: true,
            }],
            last_log_index: 7,
            matched: BTreeMap::new(),
        };
        assert!(plan(1, 1, Some(&alone)).settled);
    }
}
