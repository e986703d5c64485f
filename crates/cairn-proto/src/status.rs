//! The one mapping between domain errors and gRPC statuses, in both directions.
//!
//! `to_status` is exhaustive over [`cairn_core::Error`] with no wildcard: adding a variant
//! forces a decision here. `from_status` lets clients (the benchmark, tests, forwarding
//! nodes) recover the domain error from a status.
//!
//! Errors a client must act on carry their fields as a standard `google.rpc.ErrorInfo`
//! detail (domain [`ERROR_DOMAIN`]) besides the message, so clients decode them without
//! parsing text. Orisun clients keep seeing the same code and message; the detail is the
//! gRPC richer error model (`grpc-status-details-bin`), which every gRPC library either
//! understands or ignores.

use std::collections::HashMap;

use cairn_core::error::EventIdReuse;
use cairn_core::{Error, Position};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, ErrorInfo, StatusExt};

/// `ErrorInfo.domain` of Cairn's structured errors.
pub const ERROR_DOMAIN: &str = "cairn.dev";
/// `ErrorInfo.reason` of a consistency conflict (C2).
pub const REASON_CONFLICT: &str = "CONTEXT_CHANGED";
/// `ErrorInfo.reason` of a reused event id on an idempotent boundary (X1).
pub const REASON_EVENT_ID_EXISTS: &str = "EVENT_ID_EXISTS";
/// `ErrorInfo.reason` of a write to a boundary that does not exist or is not active (B2).
pub const REASON_BOUNDARY_NOT_ACTIVE: &str = "BOUNDARY_NOT_ACTIVE";

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
    let (code, info) = match error {
        Error::InvalidArgument(_) => (Code::InvalidArgument, None),
        Error::Unauthenticated(_) => (Code::Unauthenticated, None),
        Error::PermissionDenied(_) => (Code::PermissionDenied, None),
        Error::BoundaryNotActive(boundary) => (
            Code::FailedPrecondition,
            Some((
                REASON_BOUNDARY_NOT_ACTIVE,
                HashMap::from([("boundary".to_string(), boundary)]),
            )),
        ),
        Error::FailedPrecondition(_) => (Code::FailedPrecondition, None),
        Error::Conflict { expected, actual } => (
            Code::AlreadyExists,
            Some((
                REASON_CONFLICT,
                HashMap::from([
                    ("expected".to_string(), expected.write_id()),
                    ("actual".to_string(), actual.write_id()),
                ]),
            )),
        ),
        Error::AlreadyExists(_) => (Code::AlreadyExists, None),
        Error::NotFound(_) => (Code::NotFound, None),
        Error::Unavailable(_) => (Code::Unavailable, None),
        Error::Internal(_) => (Code::Internal, None),
        Error::ResourceExhausted(_) => (Code::ResourceExhausted, None),
        Error::EventIdExists {
            boundary,
            event_id,
            position,
            reason,
        } => (
            Code::AlreadyExists,
            Some((
                REASON_EVENT_ID_EXISTS,
                HashMap::from([
                    ("boundary".to_string(), boundary),
                    ("event_id".to_string(), event_id),
                    ("position".to_string(), position.write_id()),
                    ("reuse".to_string(), reuse_name(reason).to_string()),
                ]),
            )),
        ),
    };
    match info {
        Some((reason, metadata)) => Status::with_error_details(
            code,
            message,
            ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata),
        ),
        None => Status::new(code, message),
    }
}

/// Reads a position written as [`Position::write_id`] does; unlike a write id it may be
/// `-1:-1` (an observed empty context).
fn parse_position_text(text: &str) -> Option<Position> {
    let (c, p) = text.split_once(':')?;
    Some(Position::new(c.parse().ok()?, p.parse().ok()?))
}

fn reuse_name(reuse: EventIdReuse) -> &'static str {
    match reuse {
        EventIdReuse::PartialOverlap => "PARTIAL_OVERLAP",
        EventIdReuse::SeveralWrites => "SEVERAL_WRITES",
        EventIdReuse::Altered => "ALTERED",
    }
}

fn parse_reuse(name: &str) -> Option<EventIdReuse> {
    [
        EventIdReuse::PartialOverlap,
        EventIdReuse::SeveralWrites,
        EventIdReuse::Altered,
    ]
    .into_iter()
    .find(|r| reuse_name(*r) == name)
}

/// The domain error a Cairn `ErrorInfo` detail describes, if the status carries one.
fn from_error_info(info: &ErrorInfo) -> Option<Error> {
    if info.domain != ERROR_DOMAIN {
        return None;
    }
    let field = |key: &str| info.metadata.get(key);
    match info.reason.as_str() {
        REASON_CONFLICT => Some(Error::Conflict {
            expected: parse_position_text(field("expected")?)?,
            actual: parse_position_text(field("actual")?)?,
        }),
        REASON_EVENT_ID_EXISTS => Some(Error::EventIdExists {
            boundary: field("boundary")?.clone(),
            event_id: field("event_id")?.clone(),
            position: parse_position_text(field("position")?)?,
            reason: parse_reuse(field("reuse")?)?,
        }),
        REASON_BOUNDARY_NOT_ACTIVE => Some(Error::BoundaryNotActive(field("boundary")?.clone())),
        _ => None,
    }
}

/// Recovers a domain error from a status produced by [`to_status`] (or any gRPC peer).
/// Structured details win; without them (an Orisun server, an older Cairn) the message is
/// parsed where its text is part of the contract.
pub fn from_status(status: &Status) -> Error {
    if let Some(error) = status
        .get_error_details()
        .error_info()
        .and_then(from_error_info)
    {
        return error;
    }
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
        Code::ResourceExhausted => Error::ResourceExhausted(message),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
            Error::Unavailable(message)
        }
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
            Error::EventIdExists {
                boundary: "orders".into(),
                event_id: "id \"7\"".into(),
                position: Position::new(9, 8),
                reason: EventIdReuse::Altered,
            },
        ];
        for e in errors {
            let status = to_status(e.clone());
            assert_eq!(from_status(&status), e, "{status:?}");
        }
    }

    #[test]
    fn structured_errors_decode_without_their_message() {
        for e in [
            Error::Conflict {
                expected: Position::new(3, 2),
                actual: Position::new(7, 6),
            },
            Error::BoundaryNotActive("b".into()),
            Error::EventIdExists {
                boundary: "b".into(),
                event_id: "e".into(),
                position: Position::new(2, 1),
                reason: EventIdReuse::PartialOverlap,
            },
        ] {
            let status = to_status(e.clone());
            let stripped = Status::with_details(
                status.code(),
                "a message no parser knows",
                status.details().to_vec().into(),
            );
            assert_eq!(from_status(&stripped), e);
        }
    }

    #[test]
    fn conflicts_without_details_are_parsed_from_the_orisun_message() {
        let status = Status::new(
            Code::AlreadyExists,
            "OptimisticConcurrencyException:StreamVersionConflict: Expected (1, 0), Actual (3, 2)",
        );
        assert_eq!(
            from_status(&status),
            Error::Conflict {
                expected: Position::new(1, 0),
                actual: Position::new(3, 2),
            }
        );
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
