//! What cairn-store reads back from its own disk or from a leader's planned entry: LEB128
//! varints, posting-list rows, planned rows, `events` values and `sm_meta` catalog rows.
//! None may panic on any bytes; each decoding is checked against its encoder: what
//! decodes encodes to bytes that decode to the same value, and what is encoded decodes
//! back to what was encoded.
#![no_main]

use cairn_store::Catalog;
use cairn_store::fuzzing::{Row, decode_planned_rows, encode_rows, split_varint, varint};
use cairn_store::keys::{self, meta};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 6 {
        0 => varints(bytes),
        1 => posting_row(bytes),
        2 => planned_rows_decoded(bytes),
        3 => planned_rows_encoded(bytes),
        4 => event_value(bytes),
        _ => catalog_rows(bytes),
    }
});

fn u64_at(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*head), rest))
}

fn varints(bytes: &[u8]) {
    if let Some((n, rest)) = split_varint(bytes) {
        let used = bytes.len() - rest.len();
        assert!((1..=10).contains(&used));
        // A varint of k bytes carries at most 7k bits.
        if used < 10 {
            assert!(n < 1u64 << (7 * used), "{n} from {used} bytes");
        }
        let canonical = varint(n);
        assert!(canonical.len() <= used);
        assert_eq!(split_varint(&canonical), Some((n, &[][..])));
    }
    if let Some((n, rest)) = u64_at(bytes) {
        let mut encoded = varint(n);
        encoded.extend_from_slice(rest);
        assert_eq!(split_varint(&encoded), Some((n, rest)));
    }
}

fn posting_row(bytes: &[u8]) {
    let Some((first, value)) = u64_at(bytes) else {
        return;
    };
    let mut members = Vec::new();
    let Ok(commit) = keys::decode_row(first, value, &mut members) else {
        return;
    };
    assert_eq!(members.first(), Some(&first));
    assert!(members.windows(2).all(|w| w[0] < w[1]), "{members:?}");
    assert!(members.iter().all(|&m| m < commit));
    let mut encoded = Vec::new();
    keys::encode_row(first, commit, members[1..].iter().copied(), &mut encoded);
    let mut again = Vec::new();
    assert_eq!(
        keys::decode_row(first, &encoded, &mut again).ok(),
        Some(commit)
    );
    assert_eq!(again, members);
}

fn planned_rows_decoded(bytes: &[u8]) {
    let Ok(rows) = decode_planned_rows(bytes) else {
        return;
    };
    let payload: usize = rows.iter().map(|(_, k, v)| k.len() + v.len()).sum();
    assert!(payload <= bytes.len());
    let encoded = encode_rows(&rows);
    assert_eq!(
        decode_planned_rows(&encoded).expect("re-encoded rows"),
        rows
    );
}

/// Rows read off the input as [cf, key length, key, value length, value]...
fn planned_rows_encoded(mut bytes: &[u8]) {
    let mut rows: Vec<Row> = Vec::new();
    let take = |bytes: &mut &[u8]| -> Option<Vec<u8>> {
        let (&len, rest) = bytes.split_first()?;
        let len = usize::from(len).min(rest.len());
        let (part, rest) = rest.split_at(len);
        *bytes = rest;
        Some(part.to_vec())
    };
    while let Some((&cf, rest)) = bytes.split_first() {
        bytes = rest;
        let key = take(&mut bytes).unwrap_or_default();
        let value = take(&mut bytes).unwrap_or_default();
        rows.push((cf % 4, key, value));
    }
    let decoded = decode_planned_rows(&encode_rows(&rows)).expect("encoded rows decode");
    assert_eq!(decoded, rows);
}

fn event_value(bytes: &[u8]) {
    let Some((prepare, value)) = u64_at(bytes) else {
        return;
    };
    let Ok(event) = keys::decode_event(prepare, value) else {
        return;
    };
    assert!(event.position.commit >= 0 && event.position.prepare >= 0);
    assert_eq!(event.position.prepare as u64, prepare);
    let encoded = keys::encode_event(
        event.position.commit as u64,
        event.created_unix_nanos,
        &event.event_id,
        &event.event_type,
        &event.data,
        &event.metadata,
    );
    assert!(value.starts_with(&encoded), "not what was stored");
    let again = keys::decode_event(prepare, &encoded).expect("re-encoded event");
    assert_eq!(again, event);
}

/// Rows read off the input as [kind, key length, key, value length (2 bytes), value]...
/// where `kind` picks one of the catalog's key prefixes for the key.
fn catalog_rows(mut bytes: &[u8]) {
    const PREFIXES: [&[u8]; 9] = [
        meta::APPLIED,
        meta::CATALOG_SEQ,
        meta::NEXT_BOUNDARY_ID,
        meta::TOKEN_KEY,
        meta::BOUNDARY,
        meta::USER,
        meta::INDEX,
        meta::LEASE,
        b"",
    ];
    let mut catalog = Catalog::empty();
    while let Some((&kind, rest)) = bytes.split_first() {
        let Some((&key_len, rest)) = rest.split_first() else {
            return;
        };
        let key_len = usize::from(key_len).min(rest.len());
        let (key_tail, rest) = rest.split_at(key_len);
        let Some((value_len, rest)) = rest.split_first_chunk::<2>() else {
            return;
        };
        let value_len = usize::from(u16::from_le_bytes(*value_len)).min(rest.len());
        let (value, rest) = rest.split_at(value_len);
        bytes = rest;
        let key = [PREFIXES[usize::from(kind) % PREFIXES.len()], key_tail].concat();
        if catalog.load_meta_row(&key, value).is_err() {
            return;
        }
    }
    // Written back the way the store writes each kind of row, it loads as the same catalog.
    let mut rows: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (meta::CATALOG_SEQ.to_vec(), json(&catalog.catalog_seq)),
        (
            meta::NEXT_BOUNDARY_ID.to_vec(),
            json(&catalog.next_boundary_id),
        ),
    ];
    if let Some(marker) = &catalog.applied_marker {
        rows.push((meta::APPLIED.to_vec(), marker.clone()));
    }
    if let Some(key) = &catalog.token_key {
        rows.push((meta::TOKEN_KEY.to_vec(), key.clone()));
    }
    for (name, boundary) in &catalog.boundaries {
        rows.push((meta::named(meta::BOUNDARY, name), json(boundary)));
    }
    for (id, user) in &catalog.users {
        rows.push((meta::named(meta::USER, id), json(user)));
    }
    for ((bid, name), index) in &catalog.indexes {
        rows.push((meta::scoped(meta::INDEX, *bid, name), json(index)));
    }
    for ((bid, name), lease) in &catalog.leases {
        rows.push((meta::scoped(meta::LEASE, *bid, name), json(lease)));
    }
    let mut again = Catalog::empty();
    for (key, value) in &rows {
        again
            .load_meta_row(key, value)
            .expect("a written-back row loads");
    }
    assert_eq!(again, catalog);
}

/// serde_json, as the store's `encode_json` writes catalog values.
fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("catalog values serialise")
}
