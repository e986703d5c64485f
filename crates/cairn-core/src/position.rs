//! Positions (P1–P4): `(commit, prepare)` ordered lexicographically.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Error;

/// A position in a boundary's log.
///
/// `prepare` is the dense per-boundary sequence number of an event; `commit` is shared by
/// all events of one write and equals the write's last prepare + 1. Field order makes the
/// derived `Ord` lexicographic on (commit, prepare), which is the contract's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Position {
    /// Commit position of the write.
    pub commit: i64,
    /// Prepare position of the event.
    pub prepare: i64,
}

impl Position {
    /// `(-1,-1)`: no matching event.
    pub const NONE: Position = Position {
        commit: -1,
        prepare: -1,
    };
    /// `(0,0)`: the beginning cursor, never an event position.
    pub const BEGINNING: Position = Position {
        commit: 0,
        prepare: 0,
    };

    /// Builds a position.
    pub const fn new(commit: i64, prepare: i64) -> Self {
        Position { commit, prepare }
    }

    /// Position of the event with `prepare` in a write whose last prepare is `last`.
    pub fn of_event(prepare: u64, commit: u64) -> Self {
        Position::new(commit as i64, prepare as i64)
    }

    /// True for `(-1,-1)`.
    pub fn is_none(&self) -> bool {
        *self == Position::NONE
    }

    /// A position a client may observe: `(-1,-1)` or both parts non-negative (C1).
    pub fn validate_observed(&self) -> Result<(), Error> {
        if self.is_none() || (self.commit >= 0 && self.prepare >= 0) {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "position ({}, {}) is invalid: use (-1, -1) or non-negative parts",
                self.commit, self.prepare
            )))
        }
    }

    /// The canonical write id `"<commit>:<prepare>"` of a write whose last event is here (P2).
    pub fn write_id(&self) -> String {
        format!("{}:{}", self.commit, self.prepare)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.commit, self.prepare)
    }
}

/// Parses a canonical write id `^\d+:\d+$` without leading zeros (C7).
pub fn parse_write_id(s: &str) -> Result<Position, Error> {
    let bad = || {
        Error::invalid(format!(
            "write_id {s:?} is not canonical: expected \"<commit>:<prepare>\" with no leading zeros"
        ))
    };
    let (c, p) = s.split_once(':').ok_or_else(bad)?;
    let part = |t: &str| -> Result<i64, Error> {
        let canonical = !t.is_empty()
            && t.bytes().all(|b| b.is_ascii_digit())
            && (t == "0" || !t.starts_with('0'));
        if !canonical {
            return Err(bad());
        }
        t.parse::<i64>().map_err(|_| bad())
    };
    Ok(Position::new(part(c)?, part(p)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_lexicographic() {
        assert!(Position::new(3, 2) > Position::new(3, 1));
        assert!(Position::new(4, 0) > Position::new(3, 2));
        assert!(Position::NONE < Position::BEGINNING);
    }

    #[test]
    fn write_ids_must_be_canonical() {
        assert_eq!(parse_write_id("3:2"), Ok(Position::new(3, 2)));
        assert_eq!(parse_write_id("0:0"), Ok(Position::new(0, 0)));
        for bad in [
            "",
            ":",
            "3",
            "3:",
            ":2",
            "03:2",
            "3:02",
            "-3:2",
            "3:2:1",
            " 3:2",
            "a:b",
            "+3:2",
            "99999999999999999999:1",
        ] {
            assert!(parse_write_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn observed_positions() {
        assert!(Position::NONE.validate_observed().is_ok());
        assert!(Position::new(0, 0).validate_observed().is_ok());
        assert!(Position::new(-1, 0).validate_observed().is_err());
        assert!(Position::new(5, -2).validate_observed().is_err());
    }
}
