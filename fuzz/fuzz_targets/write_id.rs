//! Write ids (C7): whatever parses is canonical (printing it gives the input back), and
//! every position's write id parses back to it.
#![no_main]

use cairn_core::position::{Position, parse_write_id};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(position) = parse_write_id(text)
    {
        assert_eq!(position.write_id(), text, "a non-canonical write id parsed");
        assert!(position.commit >= 0 && position.prepare >= 0);
    }
    if data.len() >= 16 {
        let commit = i64::from_le_bytes(data[..8].try_into().expect("8 bytes")) & i64::MAX;
        let prepare = i64::from_le_bytes(data[8..16].try_into().expect("8 bytes")) & i64::MAX;
        let position = Position::new(commit, prepare);
        assert_eq!(parse_write_id(&position.write_id()).ok(), Some(position));
    }
});
