//! What a peer sends this node and what its Raft log holds (cairn-raft's codec): the
//! zero-copy AppendEntries decoder must agree with postcard's generic one on every input,
//! and whatever decodes (AppendEntries, InstallSnapshot, Vote, a Command) re-encodes to
//! bytes that decode to the same value. A snapshot id that passes validation names a file
//! inside the snapshot directory, whatever the bytes.
#![no_main]

use std::path::{Component, Path};

use cairn_core::command::Command;
use cairn_raft::TypeConfig;
use cairn_raft::codec::{decode, decode_append_entries, encode, encode_append_entries};
use libfuzzer_sys::fuzz_target;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Every encoded value starts with this format byte (codec.rs).
const POSTCARD_V1: u8 = 1;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    // Half the inputs get the format byte for free, so the fuzzer spends its time past it.
    let owned;
    let bytes = if kind & 0x80 == 0 {
        owned = [&[POSTCARD_V1], body].concat();
        &owned[..]
    } else {
        body
    };
    match kind % 5 {
        0 => append_entries(bytes),
        1 => {
            if let Some(rpc) = round_trip::<InstallSnapshotRequest<TypeConfig>>(bytes) {
                snapshot_id_stays_inside(&rpc.meta.snapshot_id);
            }
        }
        2 => {
            round_trip::<VoteRequest<u64>>(bytes);
        }
        3 => {
            if let Some(command) = round_trip::<Command>(bytes) {
                let again: Command = decode(&encode(&command).expect("encode")).expect("decode");
                assert_eq!(again, command);
                let _ = command.approx_bytes();
            }
        }
        _ => {
            if let Ok(id) = std::str::from_utf8(body) {
                snapshot_id_stays_inside(id);
            }
        }
    }
});

fn append_entries(bytes: &[u8]) {
    let generic = decode::<AppendEntriesRequest<TypeConfig>>(bytes);
    let fast = decode_append_entries(bytes);
    let rpc = match (generic, fast) {
        (Ok(generic), Ok(fast)) => {
            assert_same(&fast, &generic);
            fast
        }
        (Err(_), Err(_)) => return,
        (generic, fast) => panic!("decoders disagree: generic {generic:?}, zero-copy {fast:?}"),
    };
    // The leader's encoder (each command copied from the bytes it was decoded from) makes a
    // message that decodes to the same request, through either decoder.
    let again = encode_append_entries(&rpc).expect("encode");
    assert_same(
        &decode_append_entries(&again).expect("zero-copy decode"),
        &rpc,
    );
    assert_same(
        &decode::<AppendEntriesRequest<TypeConfig>>(&again).expect("generic decode"),
        &rpc,
    );
}

fn assert_same(a: &AppendEntriesRequest<TypeConfig>, b: &AppendEntriesRequest<TypeConfig>) {
    assert_eq!(a.vote, b.vote);
    assert_eq!(a.prev_log_id, b.prev_log_id);
    assert_eq!(a.leader_commit, b.leader_commit);
    assert_eq!(a.entries, b.entries);
}

/// Decodes `bytes`; what decodes encodes to bytes that decode and encode to the same bytes.
fn round_trip<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let value: T = decode(bytes).ok()?;
    let encoded = encode(&value).expect("what decoded encodes");
    let again: T = decode(&encoded).expect("what was encoded decodes");
    assert_eq!(
        encode(&again).expect("encode"),
        encoded,
        "not a fixed point"
    );
    Some(value)
}

fn snapshot_id_stays_inside(id: &str) {
    if !cairn_raft::valid_snapshot_id(id) {
        return;
    }
    let dir = Path::new("/var/lib/cairn/snapshots");
    for name in [
        format!("{id}.pack"),
        format!("{id}.pack.tmp"),
        id.to_owned(),
    ] {
        let path = dir.join(&name);
        assert_eq!(path.parent(), Some(dir), "{id:?} leaves the directory");
        assert!(
            path.strip_prefix(dir)
                .expect("under dir")
                .components()
                .all(|c| matches!(c, Component::Normal(_))),
            "{id:?} is not a plain file name"
        );
    }
}
