//! The domain error: every way a request can fail that a client must be told about.
//!
//! `cairn-proto` maps each variant to exactly one gRPC status code, exhaustively; lower
//! layers convert their own errors into these variants (mostly `Internal`/`Unavailable`).

use serde::{Deserialize, Serialize};

use crate::Position;

/// A request-level failure with its client-facing message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Error {
    /// Malformed input; nothing was changed.
    #[error("{0}")]
    InvalidArgument(String),
    /// Missing or invalid credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller lacks the role the operation needs.
    #[error("{0}")]
    PermissionDenied(String),
    /// The named boundary does not exist or is not ACTIVE (B2).
    #[error("boundary \"{0}\" is not active")]
    BoundaryNotActive(String),
    /// The operation is not allowed in the current state (e.g. deleting oneself).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A consistency observation no longer holds (C2); nothing was written.
    #[error(
        "OptimisticConcurrencyException:StreamVersionConflict: Expected ({}, {}), Actual ({}, {})",
        expected.commit, expected.prepare, actual.commit, actual.prepare
    )]
    Conflict {
        /// The position the client observed.
        expected: Position,
        /// The position the context is at now.
        actual: Position,
    },
    /// The thing to create exists already (boundary, index, user, lease).
    #[error("{0}")]
    AlreadyExists(String),
    /// The thing asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Retryable: no leader, shutting down, storage not open yet.
    #[error("{0}")]
    Unavailable(String),
    /// A real server fault; the message is for operators.
    #[error("{0}")]
    Internal(String),
    /// On a boundary with idempotent event ids (X1), a write reuses a stored event id other
    /// than by repeating that id's whole write unchanged; nothing was written.
    #[error(
        "event_id {event_id:?} already exists in boundary {boundary:?} at position ({}, {}): {reason}",
        position.commit, position.prepare
    )]
    EventIdExists {
        /// Boundary name.
        boundary: String,
        /// The first reused id of the write.
        event_id: String,
        /// Where the stored event with that id is.
        position: Position,
        /// Why this is not a retry of the stored write.
        reason: EventIdReuse,
    },
    /// A server-side limit on concurrent work or memory is reached (password checks,
    /// subscriptions, bytes in flight); nothing was changed, retry later. Last, so that
    /// the encoding of the variants before it is unchanged.
    #[error("{0}")]
    ResourceExhausted(String),
}

/// Why a write that reuses a stored event id is not an identical retry (X1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventIdReuse {
    /// The write repeats some of a stored write's ids but not all of them, or adds new ones.
    PartialOverlap,
    /// The ids belong to more than one stored write.
    SeveralWrites,
    /// Same ids as a stored write, but an event's type, data, metadata or order differs.
    Altered,
}

impl std::fmt::Display for EventIdReuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EventIdReuse::PartialOverlap => {
                "the write's ids are not exactly that write's ids (a retry must repeat the whole write)"
            }
            EventIdReuse::SeveralWrites => "the write's ids belong to more than one stored write",
            EventIdReuse::Altered => {
                "the stored write has the same ids but a different event type, data, metadata or order"
            }
        })
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    /// Shorthand for [`Error::Internal`].
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_message_is_the_orisun_text() {
        let e = Error::Conflict {
            expected: Position::new(3, 2),
            actual: Position::new(5, 4),
        };
        assert_eq!(
            e.to_string(),
            "OptimisticConcurrencyException:StreamVersionConflict: Expected (3, 2), Actual (5, 4)"
        );
    }

    #[test]
    fn boundary_gate_message() {
        assert_eq!(
            Error::BoundaryNotActive("x".into()).to_string(),
            "boundary \"x\" is not active"
        );
    }
}
