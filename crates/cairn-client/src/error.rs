//! What a call can fail with, decoded from the gRPC status (its `google.rpc.ErrorInfo`
//! detail where the server sends one), never by matching message text on Cairn.

use cairn_core::Position;
use cairn_core::error::EventIdReuse;
use tonic::{Code, Status};

/// A failed call.
///
/// [`Error::is_ambiguous`] tells the failures after which a write may or may not have been
/// committed (the reply was lost) from those after which it certainly was not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A consistency observation no longer held: the context moved from `expected` to
    /// `actual` since it was read. Nothing was written; re-read and decide again.
    #[error("the context changed: observed at {expected}, now at {actual}")]
    Conflict {
        /// The position the write observed.
        expected: Position,
        /// Where the context is now.
        actual: Position,
    },
    /// On a boundary with idempotent event ids, the write reused a stored event id other
    /// than by repeating that id's whole write unchanged. Nothing was written.
    #[error(
        "event id {event_id:?} already exists in boundary {boundary:?} at {position}: {reason}"
    )]
    EventIdExists {
        /// Boundary name.
        boundary: String,
        /// The first reused id.
        event_id: String,
        /// Where the stored event with that id is.
        position: Position,
        /// Why the write is not an identical retry of the stored one.
        reason: EventIdReuse,
    },
    /// The boundary does not exist or is not active.
    #[error("boundary {boundary:?} is not active")]
    BoundaryNotActive {
        /// Boundary name.
        boundary: String,
    },
    /// The request was malformed; nothing was changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Missing or wrong credentials.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The user lacks the role the call needs.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The thing asked for does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The thing to create exists already (index, user, a subscription's lease, ...).
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The call is not allowed in the current state.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// No server could be reached, or the one reached had no leader: a write's outcome is
    /// unknown.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The call's deadline passed before a reply arrived: a write's outcome is unknown.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// The connection broke while the call was in flight: a write's outcome is unknown.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The server does not offer the call (e.g. a Cairn extension on an Orisun server).
    #[error("unimplemented: {0}")]
    Unimplemented(String),
    /// A fault in the server.
    #[error("internal server error: {0}")]
    Internal(String),
    /// The server is at one of its documented limits (password checks, subscriptions per
    /// user, bytes in flight): nothing was changed; retry after a pause.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// The client's configuration is unusable (bad endpoint, credentials that are not
    /// ASCII, TLS asked of a build without it).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The server's reply broke the protocol (a missing position, an unparsable timestamp).
    #[error("invalid response from the server: {0}")]
    InvalidResponse(String),
}

impl Error {
    /// True when a write that failed this way may nevertheless have been committed: the
    /// request may have reached the leader and only the reply was lost. Reads fail this
    /// way when no server answered.
    pub fn is_ambiguous(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::DeadlineExceeded(_) | Error::ConnectionLost(_)
        )
    }

    /// Decodes a status from Cairn (or any Orisun-compatible server).
    pub fn from_status(status: &Status) -> Error {
        let message = status.message().to_string();
        // Transport failures first: they carry no domain error to decode, and which one it
        // was matters to a retry loop.
        match status.code() {
            Code::Unavailable => return Error::Unavailable(message),
            Code::DeadlineExceeded => return Error::DeadlineExceeded(message),
            Code::Cancelled | Code::Unknown => return Error::ConnectionLost(message),
            Code::Unimplemented => return Error::Unimplemented(message),
            _ => {}
        }
        match cairn_proto::from_status(status) {
            cairn_core::Error::Conflict { expected, actual } => {
                Error::Conflict { expected, actual }
            }
            cairn_core::Error::EventIdExists {
                boundary,
                event_id,
                position,
                reason,
            } => Error::EventIdExists {
                boundary,
                event_id,
                position,
                reason,
            },
            cairn_core::Error::BoundaryNotActive(boundary) => Error::BoundaryNotActive { boundary },
            cairn_core::Error::InvalidArgument(m) => Error::InvalidArgument(m),
            cairn_core::Error::Unauthenticated(m) => Error::Unauthenticated(m),
            cairn_core::Error::PermissionDenied(m) => Error::PermissionDenied(m),
            cairn_core::Error::FailedPrecondition(m) => Error::FailedPrecondition(m),
            cairn_core::Error::AlreadyExists(m) => Error::AlreadyExists(m),
            cairn_core::Error::NotFound(m) => Error::NotFound(m),
            cairn_core::Error::Unavailable(m) => Error::Unavailable(m),
            cairn_core::Error::Internal(m) => Error::Internal(m),
            cairn_core::Error::ResourceExhausted(m) => Error::ResourceExhausted(m),
        }
    }
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        Error::from_status(&status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_errors_decode_from_the_server_mapping() {
        let conflict = cairn_proto::to_status(cairn_core::Error::Conflict {
            expected: Position::new(3, 2),
            actual: Position::new(9, 8),
        });
        assert_eq!(
            Error::from_status(&conflict),
            Error::Conflict {
                expected: Position::new(3, 2),
                actual: Position::new(9, 8)
            }
        );
        let reused = cairn_proto::to_status(cairn_core::Error::EventIdExists {
            boundary: "orders".into(),
            event_id: "e-1".into(),
            position: Position::new(5, 4),
            reason: EventIdReuse::Altered,
        });
        assert!(matches!(
            Error::from_status(&reused),
            Error::EventIdExists { ref event_id, position, reason: EventIdReuse::Altered, .. }
                if event_id == "e-1" && position == Position::new(5, 4)
        ));
        let gate = cairn_proto::to_status(cairn_core::Error::BoundaryNotActive("b".into()));
        assert_eq!(
            Error::from_status(&gate),
            Error::BoundaryNotActive {
                boundary: "b".into()
            }
        );
    }

    #[test]
    fn only_lost_replies_are_ambiguous() {
        let ambiguous = [
            Status::unavailable("no leader"),
            Status::deadline_exceeded("slow"),
            Status::cancelled("connection closed"),
            Status::unknown("h2 protocol error"),
        ];
        for status in ambiguous {
            assert!(Error::from_status(&status).is_ambiguous(), "{status:?}");
        }
        let definite = [
            Status::invalid_argument("bad"),
            Status::already_exists("dup"),
            Status::permission_denied("no"),
            Status::internal("disk"),
            Status::unimplemented("cairn.v1.Boundaries"),
        ];
        for status in definite {
            assert!(!Error::from_status(&status).is_ambiguous(), "{status:?}");
        }
    }
}
