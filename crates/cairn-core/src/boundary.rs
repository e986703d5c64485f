//! Boundaries (B1–B4) and the identifier rule shared with index names (I1).

use serde::{Deserialize, Serialize};

use crate::limits::MAX_NAME_LEN;
use crate::{Error, Position};

/// True for 1–63 ASCII chars matching `^[A-Za-z_][A-Za-z0-9_]*$` (B1, I1).
fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    match bytes.next() {
        Some(first) => {
            (first.is_ascii_alphabetic() || first == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && name.len() <= MAX_NAME_LEN
        }
        None => false,
    }
}

/// Checks an identifier such as an index name (I1).
pub fn validate_identifier(name: &str, what: &str) -> Result<(), Error> {
    if is_identifier(name) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} {name:?} is invalid: use 1-{MAX_NAME_LEN} characters matching ^[A-Za-z_][A-Za-z0-9_]*$"
        )))
    }
}

/// Checks a boundary name (B1). Every call that takes a boundary checks it first, before
/// the catalog is consulted, with the message Orisun clients know ("invalid boundary …").
pub fn validate_boundary_name(name: &str) -> Result<(), Error> {
    if is_identifier(name) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid boundary {name:?}: use 1-{MAX_NAME_LEN} characters matching ^[A-Za-z_][A-Za-z0-9_]*$"
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
    /// Reserved for idempotent retries by event id (X1), not implemented yet: always false.
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
            let message = validate_boundary_name(bad).expect_err(bad).to_string();
            assert!(message.starts_with("invalid boundary "), "{message}");
        }
        assert!(validate_boundary_name("orisun_admin").is_ok());
    }
}
