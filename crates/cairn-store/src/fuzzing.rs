//! The crate-private storage codecs, for the fuzz targets in `fuzz/` only: cargo-fuzz
//! builds with `--cfg fuzzing`, no other build compiles this module.

use crate::StoreError;
use crate::keys::MAX_VARINT_BYTES;
use crate::planned::{EncodedRows, RowCf, RowSink, decode_rows};

/// A LEB128 varint as the store writes it.
pub fn varint(n: u64) -> Vec<u8> {
    crate::keys::varint(n, &mut [0; MAX_VARINT_BYTES]).to_vec()
}

/// A varint read off the front of `bytes`, and what follows it.
pub fn split_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    crate::keys::split_varint(bytes)
}

/// One planned row: its column family's tag (0..4), key and value.
pub type Row = (u8, Vec<u8>, Vec<u8>);

/// Planned rows as a leader encodes them into a log entry; a tag beyond the four column
/// families wraps onto them.
pub fn encode_rows(rows: &[Row]) -> Vec<u8> {
    let mut out = EncodedRows::default();
    for (cf, key, value) in rows {
        out.put(RowCf::ALL[usize::from(*cf) % RowCf::ALL.len()], key, value);
    }
    out.0
}

/// Planned rows decoded as a replica decodes them before writing them.
pub fn decode_planned_rows(bytes: &[u8]) -> Result<Vec<Row>, StoreError> {
    let mut rows = Vec::new();
    decode_rows(bytes, |cf, key, value| {
        rows.push((cf as u8, key.to_vec(), value.to_vec()))
    })?;
    Ok(rows)
}
