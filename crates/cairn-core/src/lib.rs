//! Cairn's domain: the vocabulary of a Command Context Consistency event store.
//!
//! Everything here is pure (no I/O, no async) so that the rules of the wire contract can be
//! unit-tested in isolation and shared verbatim by the state machine, the server and the
//! tests. The rules referenced as (A1), (C2), … are listed in `docs/rules.md`.

pub mod age;
pub mod auth;
pub mod boundary;
pub mod command;
pub mod error;
pub mod event;
pub mod json;
pub mod limits;
pub mod position;
pub mod query;

pub use error::Error;
pub use position::Position;
pub use query::{Criterion, Observation, Query, Tag};

/// Result type of the domain layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;
