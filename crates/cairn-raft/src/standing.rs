//! Whether this node may vote and campaign.
//!
//! Raft's safety rests on a voter remembering what it stored and whom it voted for. A node
//! whose disk was wiped remembers neither: if it votes, a candidate that lacks acknowledged
//! writes can win with it (W acked by {1, 2}; 1 is wiped, 2 crashes; 1 votes for 3, which
//! never had W), and two wiped nodes of three elect each other over empty logs. So a node
//! with no Raft state does not vote until it knows that is safe:
//! - **Undecided**: it was started as one of a new group's initial members and has not yet
//!   heard from every one of them. If every member answers with an empty log, the group is
//!   new and it votes from then on; if any member has a log, this node lost its state.
//! - **Rejoining**: it lost its state (or joins with `--join`). It refuses votes and never
//!   campaigns until a leader has made it a learner, it has caught up, and a committed
//!   membership makes it a voter again: from then on its log holds everything committed
//!   before that membership, like any learner's that was promoted. A marker file keeps the
//!   node rejoining across restarts until then.
//! - **Voting**: everything else (a node with its Raft state, a new group's member).

use std::path::{Path, PathBuf};

use openraft::BasicNode;
use openraft::RaftMetrics;

use crate::RaftError;

/// The marker file (in the data directory) of a node that is rejoining.
pub(crate) const REJOIN_MARKER: &str = "rejoining";

/// Whether this node takes part in elections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// It votes and campaigns.
    Voting,
    /// A new group's member without Raft state that has not heard from every initial
    /// member yet: it neither votes nor campaigns.
    Undecided,
    /// It lost its state (or joins): it neither votes nor campaigns until a committed
    /// membership makes it a voter after one that made it a learner.
    Rejoining,
}

impl Standing {
    /// Lower-case name (status output, metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            Standing::Voting => "voting",
            Standing::Undecided => "undecided",
            Standing::Rejoining => "rejoining",
        }
    }
}

pub(crate) fn marker_path(data_dir: &Path) -> PathBuf {
    data_dir.join(REJOIN_MARKER)
}

fn marker_error(path: &Path, e: std::io::Error) -> RaftError {
    RaftError::Standing(format!("{}: {e}", path.display()))
}

/// Writes the marker durably (file and directory entry) before anything else happens, so
/// a crash from here on restarts the node as rejoining.
pub(crate) fn write_marker(data_dir: &Path) -> Result<(), RaftError> {
    let path = marker_path(data_dir);
    let file = std::fs::File::create(&path).map_err(|e| marker_error(&path, e))?;
    file.sync_all().map_err(|e| marker_error(&path, e))?;
    sync_dir(data_dir).map_err(|e| marker_error(data_dir, e))
}

/// Removes the marker durably: once it is gone the node votes after a restart.
pub(crate) fn remove_marker(data_dir: &Path) -> Result<(), RaftError> {
    let path = marker_path(data_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(marker_error(&path, e)),
    }
    sync_dir(data_dir).map_err(|e| marker_error(data_dir, e))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// How a committed membership places a rejoining node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// No committed membership yet, or one that is not yet known committed here.
    Unknown,
    /// Not a member.
    Absent,
    /// A learner.
    Learner,
    /// A voter (in either half of a joint configuration).
    Voter,
}

/// Where the membership this node has *applied* (so committed: a membership entry still in
/// the log may be truncated by the next leader) puts node `id`.
pub(crate) fn committed_placement(m: &RaftMetrics<u64, BasicNode>, id: u64) -> Placement {
    let Some(membership_log_id) = m.membership_config.log_id() else {
        return Placement::Unknown;
    };
    let applied = m.last_applied.map_or(0, |l| l.index);
    // The effective membership is the last one in the log; once applied it is committed.
    if membership_log_id.index > applied {
        return Placement::Unknown;
    }
    let membership = m.membership_config.membership();
    if membership.voter_ids().any(|v| v == id) {
        Placement::Voter
    } else if membership.get_node(&id).is_some() {
        Placement::Learner
    } else {
        Placement::Absent
    }
}

/// Follows a rejoining node's committed memberships: it may vote again once one made it a
/// voter after one had made it a learner. The first voter membership it applies is usually
/// the one it lost its state in (from the leader's snapshot), which proves nothing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RejoinProgress {
    learner_seen: bool,
}

impl RejoinProgress {
    /// Takes in the current placement; true once the node may vote again.
    pub(crate) fn observe(&mut self, placement: Placement) -> bool {
        match placement {
            Placement::Learner => {
                self.learner_seen = true;
                false
            }
            Placement::Voter => self.learner_seen,
            Placement::Unknown | Placement::Absent => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejoining_node_votes_only_after_a_learner_then_voter_membership() {
        let mut progress = RejoinProgress::default();
        // The leader's snapshot still lists it as the voter it was before it lost its disk.
        assert!(!progress.observe(Placement::Unknown));
        assert!(!progress.observe(Placement::Voter));
        assert!(!progress.observe(Placement::Absent));
        assert!(!progress.observe(Placement::Voter));
        // The leader demoted it; then promoted it once it caught up.
        assert!(!progress.observe(Placement::Learner));
        assert!(!progress.observe(Placement::Learner));
        assert!(progress.observe(Placement::Voter));
    }

    #[test]
    fn the_marker_survives_until_removed_and_removing_twice_is_fine() {
        let dir = tempfile::tempdir().expect("temp dir");
        write_marker(dir.path()).expect("write");
        assert!(marker_path(dir.path()).exists());
        remove_marker(dir.path()).expect("remove");
        assert!(!marker_path(dir.path()).exists());
        remove_marker(dir.path()).expect("remove again");
    }
}
