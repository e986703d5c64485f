//! Serialisation of openraft values stored in RocksDB (log entries, vote, applied marker).
//!
//! postcard: compact and fast, which matters because every log entry is encoded once when
//! appended and decoded once more when openraft hands it to the state machine. Every value
//! starts with a format byte so that a future encoding can coexist with this one and an
//! unknown one is reported instead of misread.

use serde::Serialize;
use serde::de::DeserializeOwned;

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
}
