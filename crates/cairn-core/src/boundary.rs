//! Boundaries (B1–B4) and the identifier rule shared with index names (I1).

use serde::{Deserialize, Serialize};

use crate::limits::MAX_NAME_LEN;
use crate::{Error, Position};

/// Checks an identifier: 1–63 ASCII chars matching `^[A-Za-z_][A-Za-z0-9_]*$` (B1).
pub fn validate_identifier(name: &str, what: &str) -> Result<(), Error> {
    let mut bytes = name.bytes();
    let ok = match bytes.next() {
        Some(first) => {
            (first.is_ascii_alphabetic() || first == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && name.len() <= MAX_NAME_LEN
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} {name:?} is invalid: use 1-{MAX_NAME_LEN} characters matching ^[A-Za-z_][A-Za-z0-9_]*$"
        )))
    }
}

/// Lifecycle of a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BoundaryStatus {
    /// Being created.
    Provisioning,
    /// Usable.
    Active,
    /// Creation failed.
    Failed,
}

/// Placement as a client gave it; stored, never interpreted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Placement {
    /// Backend name.
    pub backend: String,
    /// Namespace.
    pub namespace: String,
}

/// A boundary in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundaryInfo {
    /// Numeric id used as the key prefix of the boundary's data.
    pub id: u32,
    /// Name (B1).
    pub name: String,
    /// Free text.
    pub description: String,
    /// Placement as given.
    pub placement: Option<Placement>,
    /// Lifecycle status.
    pub status: BoundaryStatus,
    /// As given at creation.
    pub existed_before_catalog: bool,
    /// Error of a FAILED boundary.
    pub last_error: String,
    /// Catalog position of the definition.
    pub definition_position: Position,
    /// Catalog position of the latest status change.
    pub status_position: Position,
    /// Events are indexed by id for idempotent retries (X1).
    pub idempotent_event_ids: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b1_names() {
        for good in ["a", "_", "default", "Orders_2", &"x".repeat(63)] {
            assert!(validate_identifier(good, "boundary").is_ok(), "{good}");
        }
        for bad in ["", "1a", "a-b", "a b", "é", &"x".repeat(64), "a.b"] {
            assert!(validate_identifier(bad, "boundary").is_err(), "{bad}");
        }
    }
}
