//! Event payload canonicalisation (E2, E3, Q3): the one-pass fast path must give exactly what
//! the `serde_json` tree gives, and a stored payload must canonicalise to itself.
#![no_main]

use cairn_core::json::{Payload, canonicalize, canonicalize_tree};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let what = || "fuzz".to_string();
    for payload in [Payload::Data, Payload::Metadata] {
        let either = canonicalize(text, payload, &what);
        let tree = canonicalize_tree(text, payload, &what);
        match (&either, &tree) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "fast and tree paths differ on {text:?}"),
            (Err(_), Err(_)) => {}
            _ => panic!("one path accepts {text:?}, the other refuses it: {either:?} / {tree:?}"),
        }
        if let Ok(stored) = either {
            let again = canonicalize(&stored.text, payload, &what).expect("stored text parses");
            assert_eq!(
                again.text, stored.text,
                "canonical text is not a fixed point"
            );
            if payload == Payload::Data {
                assert_eq!(
                    again.scalars, stored.scalars,
                    "scalars change on re-canonicalising"
                );
            }
        }
    }
});
