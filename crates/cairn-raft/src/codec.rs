//! Serialisation of openraft values stored in RocksDB (log entries, vote, applied marker).
//!
//! postcard: compact and fast, which matters because every log entry is encoded once when
//! appended and decoded once more when openraft hands it to the state machine. Every value
//! starts with a format byte so that a future encoding can coexist with this one and an
//! unknown one is reported instead of misread.

use openraft::raft::AppendEntriesRequest;
use openraft::{EntryPayload, LogId, Vote};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::TypeConfig;

type Entry = openraft::Entry<TypeConfig>;

/// Format byte of postcard-encoded values.
const POSTCARD_V1: u8 = 1;

/// Why a stored value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// postcard failed.
    #[error("postcard: {0}")]
    Postcard(#[from] postcard::Error),
    /// The value was written in an encoding this version does not know.
    #[error("unknown encoding {0:#04x} (written by another Cairn version?)")]
    UnknownFormat(u8),
    /// The value is empty.
    #[error("empty value")]
    Empty,
}

/// Encodes a value.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![POSTCARD_V1];
    out.extend_from_slice(&postcard::to_allocvec(value)?);
    Ok(out)
}

/// postcard's index of `EntryPayload::Normal` (variants: Blank, Normal, Membership).
const NORMAL_PAYLOAD: u8 = 1;

/// Encodes a log entry: the same bytes as [`encode`], but a proposal's command is encoded
/// once and copied after that (see [`crate::Proposal`]).
pub fn encode_entry(entry: &Entry) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![POSTCARD_V1];
    write_entry(&mut out, entry)?;
    Ok(out)
}

fn write_entry(out: &mut Vec<u8>, entry: &Entry) -> Result<(), CodecError> {
    match &entry.payload {
        EntryPayload::Normal(proposal) => {
            write(out, &entry.log_id)?;
            out.push(NORMAL_PAYLOAD);
            out.extend_from_slice(proposal.encoded()?);
        }
        EntryPayload::Blank | EntryPayload::Membership(_) => write(out, entry)?,
    }
    Ok(())
}

fn write<T: Serialize>(out: &mut Vec<u8>, value: &T) -> Result<(), CodecError> {
    let taken = std::mem::take(out);
    *out = postcard::to_extend(value, taken)?;
    Ok(())
}

fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Encodes an AppendEntries request: the same bytes as [`encode`], with each entry's
/// command copied from its proposal's remembered encoding.
pub fn encode_append_entries(
    rpc: &AppendEntriesRequest<TypeConfig>,
) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![POSTCARD_V1];
    // Field order of openraft's struct (its derived serialisation).
    write(&mut out, &rpc.vote)?;
    write(&mut out, &rpc.prev_log_id)?;
    push_varint(&mut out, rpc.entries.len() as u64);
    for entry in &rpc.entries {
        write_entry(&mut out, entry)?;
    }
    write(&mut out, &rpc.leader_commit)?;
    Ok(out)
}

/// Decodes what [`encode_append_entries`] (or [`encode`]) made of an AppendEntries request;
/// each proposal remembers the bytes it was decoded from, so the follower's log append
/// copies them instead of encoding the command again.
pub fn decode_append_entries(bytes: &[u8]) -> Result<AppendEntriesRequest<TypeConfig>, CodecError> {
    let rest = match bytes.split_first() {
        Some((&POSTCARD_V1, rest)) => rest,
        Some((&other, _)) => return Err(CodecError::UnknownFormat(other)),
        None => return Err(CodecError::Empty),
    };
    let (vote, rest) = postcard::take_from_bytes::<Vote<u64>>(rest)?;
    let (prev_log_id, rest) = postcard::take_from_bytes::<Option<LogId<u64>>>(rest)?;
    let (count, mut rest) = postcard::take_from_bytes::<usize>(rest)?;
    // Each entry is at least a few bytes: a count beyond the input is a corrupt message.
    let mut entries = Vec::with_capacity(count.min(rest.len()));
    for _ in 0..count {
        let (entry, after) = postcard::take_from_bytes::<Entry>(rest)?;
        if let EntryPayload::Normal(proposal) = &entry.payload {
            // The command's bytes follow the log id and the payload's variant, a varint:
            // one byte as postcard writes it, but a peer's may be longer (0x81 0x00 is 1
            // too), and remembering from the wrong offset would log another command.
            let (_, payload) = postcard::take_from_bytes::<LogId<u64>>(rest)?;
            let (_, command) = postcard::take_from_bytes::<u32>(payload)?;
            if let Some(command) = command.get(..command.len().saturating_sub(after.len())) {
                proposal.remember(command);
            }
        }
        entries.push(entry);
        rest = after;
    }
    let (leader_commit, _) = postcard::take_from_bytes::<Option<LogId<u64>>>(rest)?;
    Ok(AppendEntriesRequest {
        vote,
        prev_log_id,
        entries,
        leader_commit,
    })
}

/// Decodes a value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        Some((&POSTCARD_V1, rest)) => Ok(postcard::from_bytes(rest)?),
        Some((&other, _)) => Err(CodecError::UnknownFormat(other)),
        None => Err(CodecError::Empty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<Entry> {
        use openraft::{CommittedLeaderId, Membership};
        use std::collections::{BTreeMap, BTreeSet};
        let log_id = |index| LogId::new(CommittedLeaderId::new(3, 1), index);
        let batch = Command::Batch(
            (0..200)
                .map(|i| Command::DropIndex {
                    boundary: format!("b{i}"),
                    name: "n".repeat(i % 9),
                })
                .collect(),
        );
        let single = Command::DropIndex {
            boundary: "orders".into(),
            name: "by_customer".into(),
        };
        let nodes: BTreeMap<u64, openraft::BasicNode> =
            [(1, openraft::BasicNode::new("a:1"))].into();
        vec![
            Entry {
                log_id: log_id(1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(2),
                payload: EntryPayload::Normal(batch.into()),
            },
            Entry {
                log_id: log_id(300),
                payload: EntryPayload::Membership(Membership::new(
                    vec![BTreeSet::from([1])],
                    nodes,
                )),
            },
            Entry {
                log_id: log_id(1 << 40),
                payload: EntryPayload::Normal(single.into()),
            },
        ]
    }

    #[test]
    fn entries_encode_to_the_same_bytes_with_or_without_a_remembered_encoding() {
        for entry in entries() {
            let generic = encode(&entry).expect("encode");
            assert_eq!(encode_entry(&entry).expect("first"), generic);
            // Now remembered (Normal payloads): copied, still the same bytes.
            assert_eq!(encode_entry(&entry).expect("second"), generic);
            let back: Entry = decode(&generic).expect("decode");
            assert_eq!(back, entry);
        }
    }

    #[test]
    fn append_entries_encode_and_decode_as_the_generic_codec_does() {
        for entries in [entries(), Vec::new()] {
            let rpc = AppendEntriesRequest::<TypeConfig> {
                vote: Vote::new_committed(3, 1),
                prev_log_id: (!entries.is_empty())
                    .then(|| LogId::new(openraft::CommittedLeaderId::new(2, 2), 99)),
                entries,
                leader_commit: Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 5)),
            };
            let generic = encode(&rpc).expect("encode");
            assert_eq!(encode_append_entries(&rpc).expect("encode"), generic);
            let decoded = decode_append_entries(&generic).expect("decode");
            let expected: AppendEntriesRequest<TypeConfig> = decode(&generic).expect("decode");
            assert_eq!(decoded.vote, expected.vote);
            assert_eq!(decoded.prev_log_id, expected.prev_log_id);
            assert_eq!(decoded.leader_commit, expected.leader_commit);
            assert_eq!(decoded.entries, expected.entries);
            for entry in &decoded.entries {
                if let EntryPayload::Normal(proposal) = &entry.payload {
                    assert!(proposal.is_encoded(), "remembered from the message");
                    assert_eq!(
                        proposal.encoded().expect("bytes"),
                        postcard::to_allocvec(proposal.command())
                            .expect("encode")
                            .as_slice()
                    );
                }
            }
            // Re-encoding what was decoded gives the message back.
            assert_eq!(encode_append_entries(&decoded).expect("encode"), generic);
        }
        assert!(decode_append_entries(&[]).is_err());
        assert!(decode_append_entries(&[1, 0xff, 0xff]).is_err());
    }

    #[test]
    fn a_payload_variant_spelled_in_two_bytes_remembers_the_command_it_decoded() {
        // Found by fuzz/raft_codecs: postcard reads 0x81 0x00 as variant 1 (Normal).
        let command = Command::DropIndex {
            boundary: "b".into(),
            name: "n".into(),
        };
        let mut bytes = vec![POSTCARD_V1];
        bytes.extend(postcard::to_allocvec(&Vote::<u64>::new_committed(3, 1)).expect("vote"));
        bytes.extend([0, 1]); // no prev_log_id; one entry
        bytes.extend(
            postcard::to_allocvec(&LogId::new(openraft::CommittedLeaderId::new(3, 1), 7))
                .expect("log id"),
        );
        bytes.extend([0x81, 0x00]);
        bytes.extend(postcard::to_allocvec(&command).expect("command"));
        bytes.push(0); // no leader_commit
        let rpc = decode_append_entries(&bytes).expect("decodes");
        let EntryPayload::Normal(proposal) = &rpc.entries[0].payload else {
            panic!("not a normal entry: {:?}", rpc.entries[0]);
        };
        assert_eq!(proposal.command(), &command);
        assert_eq!(
            decode::<Entry>(&encode_entry(&rpc.entries[0]).expect("encode")).expect("decode"),
            rpc.entries[0],
            "the log would hold another command"
        );
    }
    use cairn_core::command::{Append, Command};
    use cairn_core::event::{NewEvent, RawEvent};
    use cairn_core::{Criterion, Observation, Position, Query};

    #[test]
    fn commands_round_trip() {
        let event = NewEvent::validate(
            RawEvent {
                event_id: "e".into(),
                event_type: "T".into(),
                data: r#"{"n":9007199254740993,"s":"x"}"#.into(),
                metadata: String::new(),
            },
            0,
        )
        .expect("valid");
        let command = Command::Batch(vec![Command::Append(Append {
            boundary: "b".into(),
            observations: vec![Observation {
                query: Query::of([Criterion::of([("s", "x")])]),
                position: Position::NONE,
            }],
            events: vec![event],
            at_unix_nanos: 42,
        })]);
        let bytes = encode(&command).expect("encode");
        assert_eq!(decode::<Command>(&bytes).expect("decode"), command);
        assert!(matches!(
            decode::<Command>(b"{}"),
            Err(CodecError::UnknownFormat(b'{'))
        ));
    }

    #[test]
    fn planned_rows_round_trip_and_encode_as_a_plain_byte_vector_would() {
        use cairn_core::command::{Bytes, PlannedAppends};
        let rows: Vec<u8> = (0..=255).chain(0..40).collect();
        let planned = Command::Planned(PlannedAppends {
            base: 1 << 127 | 5,
            token: u128::from(u64::MAX) << 64 | 3,
            heads: vec![(1, 42), (7, 1 << 40)],
            rows: Bytes(rows.clone()),
        });
        let bytes = encode(&planned).expect("encode");
        assert_eq!(decode::<Command>(&bytes).expect("decode"), planned);
        assert_eq!(
            postcard::to_allocvec(&Bytes(rows.clone())).expect("bytes"),
            postcard::to_allocvec(&rows).expect("vec"),
            "the same bytes as a Vec<u8>"
        );
    }

    #[test]
    fn commands_added_later_leave_the_numbers_of_the_older_ones_alone() {
        // Entries already in logs and snapshots name their command by postcard's variant
        // number: a new command goes last, and these stay what they were when written.
        let number = |command: &Command| encode(command).expect("encode")[1];
        assert_eq!(number(&Command::InitTokenKey { key: vec![] }), 9);
        assert_eq!(number(&Command::Batch(vec![])), 10);
        let rotate = Command::RotateTokenKey {
            key: vec![3; 32],
            grace_nanos: 60_000_000_000,
            at_unix_nanos: 1_800_000_000_000_000_000,
        };
        assert_eq!(number(&rotate), 12);
        let bytes = encode(&rotate).expect("encode");
        assert_eq!(decode::<Command>(&bytes).expect("decode"), rotate);
    }
}
