//! The one mapping between domain errors and gRPC statuses, in both directions.
//!
//! `to_status` is exhaustive over [`cairn_core::Error`] with no wildcard: adding a variant
//! forces a decision here. `from_status` lets clients (the benchmark, tests, forwarding
//! nodes) recover the domain error from a status.

use cairn_core::{Error, Position};
use tonic::{Code, Status};

/// The canonical upper-case name of a gRPC code (metric labels, reports).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Maps a domain error to its gRPC status (wire contract, "Status codes").
pub fn to_status(error: Error) -> Status {
    let message = error.to_string();
    let code = match error {
        Error::InvalidArgument(_) => Code::InvalidArgument,
        Error::Unauthenticated(_) => Code::Unauthenticated,
        Error::PermissionDenied(_) => Code::PermissionDenied,
        Error::BoundaryNotActive(_) => Code::FailedPrecondition,
        Error::FailedPrecondition(_) => Code::FailedPrecondition,
        Error::Conflict { .. } => Code::AlreadyExists,
        Error::AlreadyExists(_) => Code::AlreadyExists,
        Error::NotFound(_) => Code::NotFound,
        Error::Unavailable(_) => Code::Unavailable,
        Error::Internal(_) => Code::Internal,
    };
    Status::new(code, message)
}

/// Recovers a domain error from a status produced by [`to_status`] (or any gRPC peer).
pub fn from_status(status: &Status) -> Error {
    let message = status.message().to_string();
    match status.code() {
        Code::InvalidArgument | Code::OutOfRange => Error::InvalidArgument(message),
        Code::Unauthenticated => Error::Unauthenticated(message),
        Code::PermissionDenied => Error::PermissionDenied(message),
        Code::FailedPrecondition => match parse_boundary_gate(&message) {
            Some(name) => Error::BoundaryNotActive(name),
            None => Error::FailedPrecondition(message),
        },
        Code::AlreadyExists => match parse_conflict(&message) {
            Some((expected, actual)) => Error::Conflict { expected, actual },
            None => Error::AlreadyExists(message),
        },
        Code::NotFound => Error::NotFound(message),
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Aborted
        | Code::ResourceExhausted => Error::Unavailable(message),
        Code::Internal | Code::Unknown | Code::Unimplemented | Code::DataLoss | Code::Ok => {
            Error::Internal(message)
        }
    }
}

fn parse_boundary_gate(message: &str) -> Option<String> {
    let rest = message.strip_prefix("boundary \"")?;
    let name = rest.strip_suffix("\" is not active")?;
    Some(name.to_string())
}

/// Parses `OptimisticConcurrencyException:StreamVersionConflict: Expected (c, p), Actual (c, p)`.
pub fn parse_conflict(message: &str) -> Option<(Position, Position)> {
    let rest =
        message.strip_prefix("OptimisticConcurrencyException:StreamVersionConflict: Expected ")?;
    let (expected, actual) = rest.split_once(", Actual ")?;
    Some((parse_pair(expected)?, parse_pair(actual)?))
}

fn parse_pair(text: &str) -> Option<Position> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    let (c, p) = inner.split_once(", ")?;
    Some(Position::new(c.parse().ok()?, p.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_round_trips() {
        let errors = [
            Error::InvalidArgument("bad".into()),
            Error::Unauthenticated("who".into()),
            Error::PermissionDenied("no".into()),
            Error::BoundaryNotActive("orders".into()),
            Error::FailedPrecondition("self".into()),
            Error::Conflict {
                expected: Position::new(3, 2),
                actual: Position::NONE,
            },
            Error::AlreadyExists("dup".into()),
            Error::NotFound("gone".into()),
            Error::Unavailable("later".into()),
            Error::Internal("oops".into()),
        ];
        for e in errors {
            let status = to_status(e.clone());
            assert_eq!(from_status(&status), e, "{status:?}");
        }
    }

    #[test]
    fn codes() {
        assert_eq!(
            to_status(Error::BoundaryNotActive("x".into())).code(),
            Code::FailedPrecondition
        );
        let s = to_status(Error::Conflict {
            expected: Position::new(1, 0),
            actual: Position::new(3, 2),
        });
        assert_eq!(s.code(), Code::AlreadyExists);
        assert_eq!(
            s.message(),
            "OptimisticConcurrencyException:StreamVersionConflict: Expected (1, 0), Actual (3, 2)"
        );
    }
}
