//! The log archive: committed entries shipped in segments, and their replay onto a
//! restored backup up to an exact position.
//!
//! A segment holds a run of consecutive committed entries exactly as the Raft log stores
//! them (so a segment replays through the same state-machine code as the log does, plans
//! and all). Its layout: [`SEGMENT_MAGIC`], the cluster id (length-prefixed), the first
//! and last index, then per entry its index, its length and its bytes, and last the
//! SHA-256 of everything before it. Committed entries are the same on every member (Raft's
//! log matching), so segments that two leaders shipped for overlapping ranges agree, and a
//! reader takes each index once.
//!
//! Replay ([`replay`]) applies entries after a backup's applied index and stops before the
//! first write of the target boundary that has an event after the target position. A
//! write is never split: a position inside a write is refused. Writes that one log entry
//! committed together are divisible: a batch entry holds its commands in order, a planned
//! entry its rows in plan order, so the restore keeps the writes the entry ordered before
//! the cut, to whichever boundary, and none after.

use cairn_core::Position;
use cairn_core::command::{Append, Command, PlannedAppends};
use cairn_store::{RowCut, Store, StoreError};
use openraft::{Entry, EntryPayload, LogId};
use sha2::{Digest, Sha256};

use crate::TypeConfig;
use crate::codec::decode;
use crate::state_machine::{AppliedMarker, apply_entries_whole, marker_of};

/// First bytes of every segment (format 1).
pub const SEGMENT_MAGIC: &[u8; 16] = b"CAIRN-SEGMENT-1\n";
/// Suffix of segment names.
pub const SEGMENT_SUFFIX: &str = ".seg";

/// Why an archive could not be read or replayed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A segment's bytes are not a segment, or not the one its name says.
    #[error("segment {name} is damaged: {detail}")]
    Damaged {
        /// The segment's name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The archive misses entries the replay needs.
    #[error(
        "the archive has no entry {missing}: {detail}; restore from a base backup taken after it"
    )]
    Gap {
        /// The first index missing.
        missing: u64,
        /// Where the archive goes on, or that it ends.
        detail: String,
    },
    /// The position is inside a write: restoring it would split the write.
    #[error(
        "position {position} is inside the write {first}..{last} of boundary {boundary}: a restore keeps or drops a write whole; give {last} (with the write) or a position before {first} (without it)"
    )]
    SplitsWrite {
        /// The boundary.
        boundary: String,
        /// The requested position, `COMMIT:PREPARE`.
        position: String,
        /// The write's first event, `COMMIT:PREPARE`.
        first: String,
        /// The write's last event.
        last: String,
    },
    /// The base backup already holds events after the position.
    #[error(
        "the backup already holds events of boundary {boundary} after {position} (its last is {last}): restore from an older backup"
    )]
    BackupTooNew {
        /// The boundary.
        boundary: String,
        /// The requested position.
        position: String,
        /// The boundary's last event in the backup.
        last: String,
    },
    /// The archive ends before it shows that every event up to the position is in it.
    #[error(
        "the archive ends at log index {archived_through} and boundary {boundary}'s last archived event is {last}, before {position}: events up to {position} may have been committed but not archived yet (try again once the archive has caught up, or give a position up to {last})"
    )]
    NotArchived {
        /// The boundary.
        boundary: String,
        /// The requested position.
        position: String,
        /// The boundary's last event the archive holds (`none` if it has none).
        last: String,
        /// The last index replayed.
        archived_through: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Applying an entry failed.
    #[error("failed to apply archived entry {index}: {detail}")]
    Apply {
        /// The entry.
        index: u64,
        /// Why.
        detail: String,
    },
}

/// A run of entries as a segment holds them: index and the bytes the log stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The cluster that committed the entries.
    pub cluster_id: String,
    /// `(index, encoded entry)`, consecutive.
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// The name of a segment holding `first..=last`: zero-padded, so names sort by index.
pub fn segment_name(first: u64, last: u64) -> String {
    format!("{first:020}-{last:020}{SEGMENT_SUFFIX}")
}

/// The range a segment name stands for; `None` for a name that is not a segment's.
pub fn parse_segment_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    let (first, last) = stem.split_once('-')?;
    if first.len() != 20 || last.len() != 20 {
        return None;
    }
    let (first, last) = (first.parse().ok()?, last.parse().ok()?);
    (first <= last).then_some((first, last))
}

fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

impl Segment {
    /// The segment's bytes. `entries` must not be empty.
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self.entries.iter().map(|(_, e)| e.len() + 12).sum();
        let mut out = Vec::with_capacity(size + 96 + self.cluster_id.len());
        out.extend_from_slice(SEGMENT_MAGIC);
        out.extend_from_slice(&(self.cluster_id.len() as u32).to_be_bytes());
        out.extend_from_slice(self.cluster_id.as_bytes());
        push_u64(&mut out, self.entries.first().map_or(0, |e| e.0));
        push_u64(&mut out, self.entries.last().map_or(0, |e| e.0));
        for (index, bytes) in &self.entries {
            push_u64(&mut out, *index);
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(bytes);
        }
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        out
    }

    /// Reads a segment called `name` (its range must be the one the name says).
    pub fn decode(name: &str, bytes: &[u8]) -> Result<Segment, ArchiveError> {
        let damaged = |detail: &str| ArchiveError::Damaged {
            name: name.to_string(),
            detail: detail.to_string(),
        };
        let (body, digest) = bytes
            .split_at_checked(bytes.len().saturating_sub(32))
            .ok_or_else(|| damaged("shorter than its checksum"))?;
        if digest.len() != 32 || Sha256::digest(body).as_slice() != digest {
            return Err(damaged("its SHA-256 does not match (cut off or changed)"));
        }
        let mut rest = body
            .strip_prefix(SEGMENT_MAGIC.as_slice())
            .ok_or_else(|| damaged("not a Cairn segment of format 1"))?;
        let mut take = |n: usize| -> Result<&[u8], ArchiveError> {
            let (head, tail) = rest
                .split_at_checked(n)
                .ok_or_else(|| damaged("truncated"))?;
            rest = tail;
            Ok(head)
        };
        let u32_of = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap_or_default());
        let u64_of = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or_default());
        let id_len = u32_of(take(4)?) as usize;
        let cluster_id = String::from_utf8(take(id_len)?.to_vec())
            .map_err(|_| damaged("cluster id is not UTF-8"))?;
        let first = u64_of(take(8)?);
        let last = u64_of(take(8)?);
        let mut entries = Vec::new();
        let mut expected = first;
        while let Ok(index) = take(8) {
            let index = u64_of(index);
            let len = u32_of(take(4)?) as usize;
            if index != expected {
                return Err(damaged(&format!("entry {index} where {expected} belongs")));
            }
            entries.push((index, take(len)?.to_vec()));
            expected += 1;
        }
        if entries.is_empty()
            || expected - 1 != last
            || parse_segment_name(name).is_some_and(|range| range != (first, last))
        {
            return Err(damaged(&format!(
                "holds {first}..{} where its name or header says {first}..={last}",
                expected.saturating_sub(1)
            )));
        }
        Ok(Segment {
            cluster_id,
            entries,
        })
    }
}

/// Where a point-in-time restore stops: every event of `boundary` at or before
/// `position`, none after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The boundary the position is of.
    pub boundary: String,
    /// The last position restored.
    pub position: Position,
}

/// How a replay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// Entries applied (whole or in part).
    pub entries: u64,
    /// The last entry applied (whole or in part); the backup's when none was.
    pub last_index: u64,
    /// The target boundary's last event after the replay (`None`: it has none).
    pub last_event: Option<Position>,
}

fn pos(p: Position) -> String {
    format!("{}:{}", p.commit, p.prepare)
}

/// Whether a write of `target.boundary` from `head` (its next prepare) to `new_head` lies
/// after the target: `false` if every event is at or before it, `true` if every event is
/// after it, an error if the target lies inside it.
fn crosses(target: &Target, head: u64, new_head: u64) -> Result<bool, ArchiveError> {
    let (first, last) = (
        Position::new(new_head as i64, head as i64),
        Position::new(new_head as i64, new_head as i64 - 1),
    );
    if last <= target.position {
        Ok(false)
    } else if first <= target.position {
        Err(ArchiveError::SplitsWrite {
            boundary: target.boundary.clone(),
            position: pos(target.position),
            first: pos(first),
            last: pos(last),
        })
    } else {
        Ok(true)
    }
}

/// The target boundary's id and head (next prepare), if it exists yet.
fn target_head(store: &Store, target: &Target) -> Option<(u32, u64)> {
    store.with_catalog(|c| {
        c.active_boundary(&target.boundary)
            .map(|b| (b.id, c.head(b.id)))
    })
}

/// The target boundary's last event: a boundary of `n` events ends at `n:n-1` (positions
/// are dense and a write's commit is its last prepare + 1).
fn last_event(store: &Store, target: &Target) -> Option<Position> {
    target_head(store, target)
        .filter(|(_, head)| *head > 0)
        .map(|(_, head)| Position::new(head as i64, head as i64 - 1))
}

/// Replays archived `entries` (in index order, overlaps allowed) onto `store`, a restored
/// backup, up to `target` (everything when `None`).
pub fn replay(
    store: &Store,
    entries: impl IntoIterator<Item = Result<(u64, Vec<u8>), ArchiveError>>,
    target: Option<&Target>,
) -> Result<Replayed, ArchiveError> {
    let mut marker = marker_of(store)?;
    if let Some(target) = target
        && let Some(last) = last_event(store, target)
        && last > target.position
    {
        return Err(ArchiveError::BackupTooNew {
            boundary: target.boundary.clone(),
            position: pos(target.position),
            last: pos(last),
        });
    }
    let resume = |m: &AppliedMarker| -> u64 {
        match m.in_progress {
            Some((id, _)) => id.index,
            None => m.last_applied.map_or(0, |id| id.index) + 1,
        }
    };
    let mut replayed = Replayed {
        entries: 0,
        last_index: resume(&marker) - 1,
        last_event: None,
    };
    for item in entries {
        let (index, bytes) = item?;
        let next = resume(&marker);
        if index < next {
            continue;
        }
        if index > next {
            return Err(ArchiveError::Gap {
                missing: next,
                detail: format!("the archive goes on at {index}"),
            });
        }
        let entry: Entry<TypeConfig> = decode(&bytes).map_err(|e| ArchiveError::Apply {
            index,
            detail: format!("it does not decode: {e}"),
        })?;
        if entry.log_id.index != index {
            return Err(ArchiveError::Apply {
                index,
                detail: format!("it holds entry {}", entry.log_id.index),
            });
        }
        replayed.entries += 1;
        replayed.last_index = index;
        let stopped = match target {
            Some(target) => apply_up_to(store, entry, &mut marker, target)?,
            None => {
                apply_entries_whole(store, vec![entry], &mut marker)?;
                false
            }
        };
        if stopped {
            replayed.last_event = target.and_then(|t| last_event(store, t));
            return Ok(replayed);
        }
    }
    replayed.last_event = target.and_then(|t| last_event(store, t));
    if let Some(target) = target
        && replayed.last_event != Some(target.position)
    {
        return Err(ArchiveError::NotArchived {
            boundary: target.boundary.clone(),
            position: pos(target.position),
            last: replayed.last_event.map_or_else(|| "none".to_string(), pos),
            archived_through: replayed.last_index,
        });
    }
    Ok(replayed)
}

/// Applies `entry`, or the part of it before the target's cut; `true` when the cut was in
/// it (the replay is over).
fn apply_up_to(
    store: &Store,
    entry: Entry<TypeConfig>,
    marker: &mut AppliedMarker,
    target: &Target,
) -> Result<bool, ArchiveError> {
    let log_id = entry.log_id;
    let EntryPayload::Normal(proposal) = &entry.payload else {
        apply_entries_whole(store, vec![entry], marker)?;
        return Ok(false);
    };
    match proposal.command() {
        Command::Planned(plan) if marker.state_token() == plan.base => {
            let Some(cut) = planned_cut(store, plan, target)? else {
                apply_entries_whole(store, vec![entry], marker)?;
                return Ok(false);
            };
            marker.applied(log_id, plan.token);
            let bytes = crate::codec::encode(&*marker).map_err(|e| apply_failed(log_id, e))?;
            store.apply_rows_cut(&plan.rows.0, cut, &bytes)?;
            Ok(true)
        }
        Command::Batch(commands) => apply_commands_up_to(store, log_id, commands, marker, target),
        Command::Append(_) => apply_commands_up_to(
            store,
            log_id,
            std::slice::from_ref(proposal.command()),
            marker,
            target,
        ),
        _ => {
            apply_entries_whole(store, vec![entry], marker)?;
            Ok(false)
        }
    }
}

/// Where a plan that holds must be cut for `target`: before the first of its writes to the
/// target boundary that lies after the target (`None`: the whole plan is restored).
fn planned_cut(
    store: &Store,
    plan: &PlannedAppends,
    target: &Target,
) -> Result<Option<RowCut>, ArchiveError> {
    let Some((bid, _)) = target_head(store, target) else {
        return Ok(None);
    };
    // The plan's heads say where the boundary ends: rows are decoded only for a plan that
    // reaches past the target.
    let reaches_past = plan.heads.iter().any(|&(b, new_head)| {
        b == bid && Position::new(new_head as i64, new_head as i64 - 1) > target.position
    });
    if !reaches_past {
        return Ok(None);
    }
    for (first, commit) in store.planned_writes(&plan.rows.0, bid)? {
        if crosses(target, first, commit)? {
            return Ok(Some(RowCut { bid, limit: first }));
        }
    }
    Ok(None)
}

fn apply_failed(log_id: LogId<u64>, e: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::Apply {
        index: log_id.index,
        detail: e.to_string(),
    }
}

/// Applies the commands of an entry one by one, each append to the target boundary
/// planned first to see whether its events would go past the target; `true` when one
/// would (it and everything after it are left out).
fn apply_commands_up_to(
    store: &Store,
    log_id: LogId<u64>,
    commands: &[Command],
    marker: &mut AppliedMarker,
    target: &Target,
) -> Result<bool, ArchiveError> {
    let done = match marker.in_progress {
        Some((id, n)) if id == log_id => n.min(commands.len()),
        _ => 0,
    };
    for (i, command) in commands.iter().enumerate().skip(done) {
        if let Command::Append(append) = command
            && append.boundary == target.boundary
            && let Some((bid, head)) = target_head(store, target)
            && let Some(new_head) = planned_head(store, append, bid)?
            && crosses(target, head, new_head)?
        {
            marker.applied_unplanned(log_id);
            let bytes = crate::codec::encode(&*marker).map_err(|e| apply_failed(log_id, e))?;
            store.apply_marker(&bytes)?;
            return Ok(true);
        }
        let last = i + 1 == commands.len();
        if last {
            marker.applied_unplanned(log_id);
        } else {
            marker.in_progress = Some((log_id, i + 1));
        }
        let bytes = crate::codec::encode(&*marker).map_err(|e| apply_failed(log_id, e))?;
        match command {
            Command::Append(append) => {
                store.apply_appends(&[append], &bytes)?;
            }
            command => {
                // A refused command (its outcome) wrote nothing, as when it was applied.
                let _outcome = store.apply(command, &bytes)?;
            }
        }
    }
    if commands.is_empty() {
        marker.applied_unplanned(log_id);
        let bytes = crate::codec::encode(&*marker).map_err(|e| apply_failed(log_id, e))?;
        store.apply_marker(&bytes)?;
    }
    Ok(false)
}

/// The target boundary's head once `append` is applied, if it writes events.
fn planned_head(store: &Store, append: &Append, bid: u32) -> Result<Option<u64>, ArchiveError> {
    let Some(run) = store.plan_appends(&[append], &[])? else {
        return Ok(None);
    };
    Ok(run
        .heads
        .iter()
        .find(|(b, _)| *b == bid)
        .map(|(_, head)| *head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment() -> Segment {
        Segment {
            cluster_id: "c1".into(),
            entries: vec![
                (7, b"seven".to_vec()),
                (8, Vec::new()),
                (9, b"nine".to_vec()),
            ],
        }
    }

    #[test]
    fn a_segment_reads_back_as_written_and_any_damage_is_refused() {
        let name = segment_name(7, 9);
        assert_eq!(parse_segment_name(&name), Some((7, 9)));
        let bytes = segment().encode();
        assert_eq!(Segment::decode(&name, &bytes).expect("decode"), segment());
        for cut in 0..bytes.len() {
            assert!(
                Segment::decode(&name, &bytes[..cut]).is_err(),
                "{cut} bytes decoded"
            );
        }
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert!(Segment::decode(&name, &flipped).is_err());
        let err = Segment::decode(&segment_name(7, 10), &bytes).expect_err("renamed");
        assert!(err.to_string().contains("7..9"), "{err}");
    }

    #[test]
    fn only_zero_padded_ranges_are_segment_names() {
        assert_eq!(
            parse_segment_name("00000000000000000001-00000000000000000001.seg"),
            Some((1, 1))
        );
        assert_eq!(parse_segment_name("1-2.seg"), None);
        assert_eq!(parse_segment_name("progress.json"), None);
        assert_eq!(
            parse_segment_name("00000000000000000002-00000000000000000001.seg"),
            None
        );
    }

    #[test]
    fn a_write_is_kept_whole_dropped_whole_or_refused() {
        let target = Target {
            boundary: "b".into(),
            position: Position::new(5, 4),
        };
        // The write 2..=4 (commit 5) ends at the target: kept.
        assert!(!crosses(&target, 2, 5).expect("kept"));
        // The write 5..=6 (commit 7) starts after it: dropped.
        assert!(crosses(&target, 5, 7).expect("dropped"));
        // A target inside the write 3..=5 (commit 6)? (6,3) > (5,4): all after, dropped.
        assert!(crosses(&target, 3, 6).expect("after"));
        let inside = Target {
            boundary: "b".into(),
            position: Position::new(8, 6),
        };
        let err = crosses(&inside, 5, 8).expect_err("split");
        assert!(err.to_string().contains("write 8:5..8:7"), "{err}");
    }
}
