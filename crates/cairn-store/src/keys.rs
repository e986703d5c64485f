//! Key and value encodings. Integers are big-endian so that RocksDB's byte order is the
//! numeric order: iterating `events` by key is iterating by prepare position.

use cairn_core::Position;
use cairn_core::event::StoredEvent;
use sha2::{Digest, Sha256};

use crate::StoreError;

/// `events`: boundary id · prepare.
pub fn event_key(bid: u32, prepare: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&bid.to_be_bytes());
    k[4..].copy_from_slice(&prepare.to_be_bytes());
    k
}

/// Prepare position of an `events` key.
pub fn prepare_of_event_key(key: &[u8]) -> Result<u64, StoreError> {
    let tail: [u8; 8] = key
        .get(4..12)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| StoreError::corrupt("events", "key shorter than 12 bytes"))?;
    Ok(u64::from_be_bytes(tail))
}

/// Tag keys and values longer than this are indexed by their SHA-256 digest: a posting-list
/// key then stays short however large the payload field, which keeps memtable inserts,
/// comparisons, flushes and compactions cheap (a 200-byte string field would otherwise be
/// copied into every one of its rows). Matching stays exact up to a SHA-256 collision.
pub const MAX_VERBATIM_TAG_BYTES: usize = 64;
/// Length byte that marks a digest instead of verbatim bytes. Verbatim lengths are at most
/// `MAX_VERBATIM_TAG_BYTES`, so the two encodings never coincide.
const DIGEST_MARKER: u8 = u8::MAX;
/// Bytes of a SHA-256 digest.
const DIGEST_BYTES: usize = 32;
/// Bytes of the prepare position that ends every posting-list row.
pub const PREPARE_BYTES: usize = 8;
/// Shortest posting-list prefix: a one-byte boundary id and two empty parts.
pub const MIN_TAG_PREFIX_BYTES: usize = 3;

/// Writes `n` as LEB128 into `buf`: 7 bits per byte, high bit set on all but the last.
/// Prefix-free, so a varint followed by anything decodes unambiguously.
pub(crate) fn varint(mut n: u64, buf: &mut [u8; MAX_VARINT_BYTES]) -> &[u8] {
    let mut len = 0;
    while n >= 0x80 {
        buf[len] = (n as u8) | 0x80;
        n >>= 7;
        len += 1;
    }
    buf[len] = n as u8;
    &buf[..=len]
}

/// Reads one LEB128 value off the front of `bytes`; returns it and what follows.
pub(crate) fn split_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut n = 0u64;
    for (i, b) in bytes.iter().enumerate() {
        if i >= MAX_VARINT_BYTES || (i == MAX_VARINT_BYTES - 1 && *b > 1) {
            // Longer than any u64, or a tenth byte carrying bits beyond the 64th.
            return None;
        }
        n |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((n, &bytes[i + 1..]));
        }
    }
    None
}

fn push_tag_part(k: &mut Vec<u8>, part: &str) {
    if part.len() > MAX_VERBATIM_TAG_BYTES {
        k.push(DIGEST_MARKER);
        k.extend_from_slice(&Sha256::digest(part.as_bytes()));
    } else {
        k.push(part.len() as u8);
        k.extend_from_slice(part.as_bytes());
    }
}

/// `tags` posting-list prefix: varint boundary id · len+key · len+value, each length one
/// byte (long parts as digests, see [`MAX_VERBATIM_TAG_BYTES`]). Every row under it ends with
/// the prepare position of a matching event. Posting lists are most of what the store
/// writes, flushes and compacts (five or more rows per event), so every byte of a row key
/// counts: this encoding is prefix-free (no list's prefix starts another list's row) with a
/// third less overhead than fixed-width lengths.
pub fn tag_prefix(bid: u32, key: &str, value: &str) -> Vec<u8> {
    let part = |s: &str| {
        1 + if s.len() > MAX_VERBATIM_TAG_BYTES {
            DIGEST_BYTES
        } else {
            s.len()
        }
    };
    // Room for the prepare position, so a row key can be completed in place.
    let mut k = Vec::with_capacity(5 + part(key) + part(value) + PREPARE_BYTES);
    k.extend_from_slice(varint(u64::from(bid), &mut [0; MAX_VARINT_BYTES]));
    push_tag_part(&mut k, key);
    push_tag_part(&mut k, value);
    k
}

/// Appends a prepare position to a posting-list prefix.
pub fn with_prepare(prefix: &[u8], prepare: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + PREPARE_BYTES);
    k.extend_from_slice(prefix);
    push_prepare(&mut k, prepare);
    k
}

/// Turns a posting-list prefix into the row key of `prepare`, in place.
pub fn push_prepare(prefix: &mut Vec<u8>, prepare: u64) {
    prefix.extend_from_slice(&prepare.to_be_bytes());
}

/// Prepare position at the end of a `tags` key.
pub fn prepare_suffix(key: &[u8]) -> Result<u64, StoreError> {
    let n = key.len();
    let tail: [u8; PREPARE_BYTES] = key
        .get(n.saturating_sub(PREPARE_BYTES)..)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| StoreError::corrupt("tags", "key shorter than 8 bytes"))?;
    Ok(u64::from_be_bytes(tail))
}

/// Longest LEB128 encoding of a `u64`.
pub const MAX_VARINT_BYTES: usize = 10;

/// A posting-list row's value. The row holds the events of one write that carry the tag and
/// is keyed by the first of them; its value is the write's commit position as its (small,
/// positive) distance from that first prepare — one byte for writes of up to 127 events —
/// followed by the gap from each further member to the next. A write of 100 events that
/// share a tag thus costs one row instead of 100, and a one-event row is just the commit
/// distance (format 2's row).
///
/// Written into `value` (cleared first), so one buffer serves every row of a batch.
pub fn encode_row(
    first: u64,
    commit: u64,
    later: impl IntoIterator<Item = u64>,
    value: &mut Vec<u8>,
) {
    value.clear();
    let mut buf = [0; MAX_VARINT_BYTES];
    value.extend_from_slice(varint(commit - first, &mut buf));
    let mut previous = first;
    for member in later {
        value.extend_from_slice(varint(member - previous, &mut buf));
        previous = member;
    }
}

/// Decodes a posting-list row keyed by `first` into its members (ascending, `first`
/// included) and returns the write's commit position.
pub fn decode_row(first: u64, value: &[u8], members: &mut Vec<u64>) -> Result<u64, StoreError> {
    let corrupt = || StoreError::corrupt("tags", "value is not a posting-list row");
    let (distance, mut rest) = split_varint(value).ok_or_else(corrupt)?;
    let commit = first.checked_add(distance).ok_or_else(corrupt)?;
    members.clear();
    members.push(first);
    let mut previous = first;
    while !rest.is_empty() {
        let (gap, tail) = split_varint(rest).ok_or_else(corrupt)?;
        previous = previous
            .checked_add(gap)
            .filter(|m| gap > 0 && *m < commit)
            .ok_or_else(corrupt)?;
        members.push(previous);
        rest = tail;
    }
    if first >= commit {
        return Err(corrupt());
    }
    Ok(commit)
}

/// `writes`: boundary id · commit.
pub fn write_key(bid: u32, commit: u64) -> [u8; 12] {
    event_key(bid, commit)
}

/// `event_ids`: boundary id · event id (X1). The value is the event's prepare position
/// ([`encode_event_id_value`]); the event row there has everything else.
pub fn event_id_key(bid: u32, event_id: &str) -> Vec<u8> {
    [&bid.to_be_bytes()[..], event_id.as_bytes()].concat()
}

/// An `event_ids` value: the prepare position, big-endian.
pub fn encode_event_id_value(prepare: u64) -> [u8; 8] {
    prepare.to_be_bytes()
}

/// Prepare position of an `event_ids` value.
pub fn decode_event_id_value(value: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| StoreError::corrupt("event_ids", "value is not 8 bytes"))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Typed keys of `sm_meta`.
pub mod meta {
    /// Opaque applied-state marker of the Raft layer (last applied log id, membership).
    pub const APPLIED: &[u8] = b"applied";
    /// Catalog sequence (boundary definition/status positions).
    pub const CATALOG_SEQ: &[u8] = b"catalog_seq";
    /// Next boundary id.
    pub const NEXT_BOUNDARY_ID: &[u8] = b"next_boundary_id";
    /// Session-token key.
    pub const TOKEN_KEY: &[u8] = b"token_key";
    /// The session-token key the current one replaced (absent before the first rotation).
    pub const PREVIOUS_TOKEN_KEY: &[u8] = b"token_key_previous";
    /// Rotation state of the session-token key, JSON (absent before the first rotation).
    pub const TOKEN_KEY_STATE: &[u8] = b"token_key_state";
    /// Prefix of boundary records, by name.
    pub const BOUNDARY: &[u8] = b"bnd/";
    /// Prefix of user records, by id.
    pub const USER: &[u8] = b"usr/";
    /// Prefix of index records, by boundary id and name.
    pub const INDEX: &[u8] = b"idx/";
    /// Prefix of subscription leases, by boundary id and subscriber name.
    pub const LEASE: &[u8] = b"lse/";
    /// On-disk format of the state machine ([`crate::STORE_FORMAT`]).
    pub const FORMAT: &[u8] = b"format";

    /// `prefix` · `name`.
    pub fn named(prefix: &[u8], name: &str) -> Vec<u8> {
        [prefix, name.as_bytes()].concat()
    }

    /// `prefix` · boundary id · `name`.
    pub fn scoped(prefix: &[u8], bid: u32, name: &str) -> Vec<u8> {
        [prefix, &bid.to_be_bytes(), name.as_bytes()].concat()
    }
}

/// Encodes an `events` value.
pub fn encode_event(
    commit: u64,
    created_unix_nanos: i64,
    event_id: &str,
    event_type: &str,
    data: &str,
    metadata: &str,
) -> Vec<u8> {
    let mut v = Vec::with_capacity(
        16 + 16 + event_id.len() + event_type.len() + data.len() + metadata.len(),
    );
    v.extend_from_slice(&commit.to_be_bytes());
    v.extend_from_slice(&created_unix_nanos.to_be_bytes());
    for s in [event_id, event_type, data, metadata] {
        v.extend_from_slice(&(s.len() as u32).to_be_bytes());
        v.extend_from_slice(s.as_bytes());
    }
    v
}

/// Commit position stored at the head of an `events` value.
pub fn commit_of_event_value(value: &[u8]) -> Result<u64, StoreError> {
    let head: [u8; 8] = value
        .get(..8)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| StoreError::corrupt("events", "value shorter than 8 bytes"))?;
    Ok(u64::from_be_bytes(head))
}

/// Decodes an `events` value at `prepare`.
pub fn decode_event(prepare: u64, value: &[u8]) -> Result<StoredEvent, StoreError> {
    let bad = |what: &str| StoreError::corrupt("events", &format!("event {prepare}: {what}"));
    let commit = commit_of_event_value(value)?;
    // Positions are non-negative i64s on the wire: a larger one is damage, not a position.
    let (Ok(commit_at), Ok(prepare_at)) = (i64::try_from(commit), i64::try_from(prepare)) else {
        return Err(bad("position beyond 2^63"));
    };
    let created: [u8; 8] = value
        .get(8..16)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| bad("truncated timestamp"))?;
    let mut rest = &value[16..];
    let mut strings = Vec::with_capacity(4);
    for _ in 0..4 {
        let len: [u8; 4] = rest
            .get(..4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("truncated length"))?;
        let len = u32::from_be_bytes(len) as usize;
        let bytes = rest
            .get(4..4 + len)
            .ok_or_else(|| bad("truncated string"))?;
        strings.push(String::from_utf8(bytes.to_vec()).map_err(|_| bad("invalid UTF-8"))?);
        rest = &rest[4 + len..];
    }
    let metadata = strings.pop().unwrap_or_default();
    let data = strings.pop().unwrap_or_default();
    let event_type = strings.pop().unwrap_or_default();
    let event_id = strings.pop().unwrap_or_default();
    Ok(StoredEvent {
        position: Position::new(commit_at, prepare_at),
        event_id,
        event_type,
        data,
        metadata,
        created_unix_nanos: i64::from_be_bytes(created),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_position_beyond_i64_is_damage_not_a_negative_position() {
        let v = encode_event(1 << 63, 0, "", "", "", "");
        assert!(matches!(
            decode_event(5, &v),
            Err(StoreError::Corrupt { .. })
        ));
        let v = encode_event(7, 0, "", "", "", "");
        assert!(decode_event(1 << 63, &v).is_err());
        assert!(
            decode_event(
                i64::MAX as u64,
                &encode_event(i64::MAX as u64, 0, "", "", "", "")
            )
            .is_ok()
        );
    }

    #[test]
    fn event_roundtrip() {
        let v = encode_event(7, -3, "id", "T", "{\"a\":1}", "{}");
        let e = decode_event(5, &v).expect("decodes");
        assert_eq!(e.position, Position::new(7, 5));
        assert_eq!(e.event_id, "id");
        assert_eq!(e.event_type, "T");
        assert_eq!(e.data, "{\"a\":1}");
        assert_eq!(e.metadata, "{}");
        assert_eq!(e.created_unix_nanos, -3);
        assert!(decode_event(5, &v[..v.len() - 1]).is_err());
    }

    #[test]
    fn big_endian_order_is_numeric_order() {
        assert!(event_key(1, 255) < event_key(1, 256));
        assert!(event_key(1, u64::MAX) < event_key(2, 0));
        let p = tag_prefix(1, "k", "v");
        assert!(with_prepare(&p, 9) < with_prepare(&p, 10));
        assert_eq!(prepare_suffix(&with_prepare(&p, 42)).expect("suffix"), 42);
    }

    #[test]
    fn tag_prefixes_do_not_collide() {
        // Length prefixes keep ("ab","c") and ("a","bc") apart.
        assert_ne!(tag_prefix(1, "ab", "c"), tag_prefix(1, "a", "bc"));
        // Prefix-free across boundary ids of any width and parts of any length: no list's
        // prefix starts another list's prefix, so a seek never strays into another list.
        let long = "z".repeat(MAX_VERBATIM_TAG_BYTES + 1);
        let mut prefixes = Vec::new();
        for bid in [0, 1, 127, 128, 300, u32::MAX] {
            for key in ["", "a", "ab", "\u{1}", long.as_str()] {
                for value in ["", "b", "ab", "\u{80}", long.as_str()] {
                    prefixes.push(tag_prefix(bid, key, value));
                }
            }
        }
        for (i, a) in prefixes.iter().enumerate() {
            for (j, b) in prefixes.iter().enumerate() {
                assert!(i == j || !b.starts_with(a), "{a:?} starts {b:?}");
            }
        }
        assert_eq!(tag_prefix(u32::MAX, "", "").len(), 5 + 1 + 1);
        assert_eq!(tag_prefix(1, "", "").len(), MIN_TAG_PREFIX_BYTES);
    }

    #[test]
    fn commit_distances_round_trip() {
        let (mut members, mut value) = (Vec::new(), Vec::new());
        for (prepare, commit) in [(0, 1), (5, 105), (7, 7 + 127), (7, 7 + 128), (0, u64::MAX)] {
            encode_row(prepare, commit, [], &mut value);
            assert_eq!(
                decode_row(prepare, &value, &mut members).expect("decodes"),
                commit
            );
        }
        encode_row(10, 11, [], &mut value);
        assert_eq!(value, [1]);
        assert!(decode_row(0, &[], &mut members).is_err());
        assert!(
            decode_row(0, &[0x80], &mut members).is_err(),
            "unterminated"
        );
        assert!(
            decode_row(0, &[1, 1], &mut members).is_err(),
            "trailing bytes"
        );
        assert!(
            decode_row(u64::MAX, &[1], &mut members).is_err(),
            "overflow"
        );
    }

    #[test]
    fn rows_of_several_events_round_trip() {
        let (mut members, mut value) = (Vec::new(), Vec::new());
        encode_row(10, 110, [11, 12, 50, 109], &mut value);
        assert_eq!(decode_row(10, &value, &mut members).expect("decodes"), 110);
        assert_eq!(members, [10, 11, 12, 50, 109]);
        // A single event's row is exactly its commit distance, as before rows were merged.
        encode_row(7, 9, [], &mut value);
        assert_eq!(value, [2]);
        assert_eq!(decode_row(7, &value, &mut members).expect("decodes"), 9);
        assert_eq!(members, [7]);
        encode_row(
            1 << 40,
            (1 << 40) + 100_000,
            [(1 << 40) + 99_999],
            &mut value,
        );
        decode_row(1 << 40, &value, &mut members).expect("decodes");
        assert_eq!(members, [1 << 40, (1 << 40) + 99_999]);
        for bad in [
            vec![],
            vec![0x80],     // unterminated
            vec![0],        // commit at the first member
            vec![5, 0],     // a member repeated
            vec![5, 5],     // a member at the commit position
            vec![5, 0x80],  // unterminated gap
            vec![0xff; 11], // longer than any u64
        ] {
            assert!(decode_row(10, &bad, &mut members).is_err(), "{bad:?}");
        }
        let overflow = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(
            decode_row(0, &overflow, &mut members).is_err(),
            "bits beyond the 64th"
        );
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(
            decode_row(0, &max, &mut members).expect("u64::MAX"),
            u64::MAX
        );
    }

    #[test]
    fn long_tag_parts_are_digested_and_stay_distinct() {
        let long_a = "x".repeat(MAX_VERBATIM_TAG_BYTES + 1);
        let long_b = format!("{}y", "x".repeat(MAX_VERBATIM_TAG_BYTES));
        let at_limit = "x".repeat(MAX_VERBATIM_TAG_BYTES);
        let digested = tag_prefix(1, "payload", &long_a);
        assert_eq!(digested.len(), 1 + 1 + 7 + 1 + DIGEST_BYTES);
        assert_ne!(digested, tag_prefix(1, "payload", &long_b));
        assert_eq!(digested, tag_prefix(1, "payload", &long_a.clone()));
        // At the limit the value is kept verbatim.
        assert_eq!(
            tag_prefix(1, "payload", &at_limit).len(),
            1 + 1 + 7 + 1 + MAX_VERBATIM_TAG_BYTES
        );
        // Long keys are digested too, and key/value digests do not mix.
        assert_ne!(tag_prefix(1, &long_a, "v"), tag_prefix(1, "v", &long_a));
    }
}
