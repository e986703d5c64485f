//! A typed async client for [Cairn](https://github.com/cairn-db/cairn), the replicated
//! event database for Command Context Consistency, and for any server speaking Orisun's
//! gRPC protocol.
//!
//! - **Connections**: a list of endpoints (every node of a Cairn cluster accepts every
//!   call); connections open lazily; a call that a node leaves unanswered moves the client
//!   to the next one, and reads are retried there. HTTP Basic credentials on the first call,
//!   then the session token the server returns. `https://` endpoints with the `tls` feature.
//! - **Typed calls and errors**: [`Client::append`], [`Client::get_events`],
//!   [`Client::latest_by_criteria`], ... return [`Error`]s decoded from the status's
//!   structured details: [`Error::Conflict`] with the expected and actual positions,
//!   [`Error::EventIdExists`], [`Error::Unavailable`], ... and
//!   [`Error::is_ambiguous`] says whether a failed write may have committed.
//! - **Subscriptions** ([`Client::subscribe`]) are a [`futures::Stream`] that resumes after
//!   a disconnect from the last event delivered.
//! - **Commands** ([`Client::decide`]): read the context, decide, append on condition that
//!   the context is unchanged, and retry until the command is committed exactly once —
//!   blindly on boundaries with idempotent event ids, by looking for the command's ids on
//!   others.
//!
//! ```no_run
//! use cairn_client::{Client, ClientConfig, ContextQuery, Criterion, NewEvent, Outcome};
//! use serde_json::json;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect(
//!     ClientConfig::new(["http://127.0.0.1:5005"]).credentials("admin", "changeit"),
//! )
//! .await?;
//! // Register a user name once, however many clients try at the same time.
//! let name = Criterion::of([("username", "ada")]);
//! let decided = client
//!     .decide("default", &ContextQuery::Latest(vec![name]), |context| {
//!         if context.latest[0].is_some() {
//!             return Err("the name is taken");
//!         }
//!         Ok(vec![NewEvent::new("UserRegistered", &json!({ "username": "ada" }))])
//!     })
//!     .await?;
//! if let Outcome::Committed(result) = decided.outcome {
//!     println!("registered at {}", result.position);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Runnable examples: `examples/` in the crate (`cargo run -p cairn-client --example tour`).

#![warn(missing_docs)]

mod client;
mod config;
mod decide;
mod error;
mod subscribe;
mod types;

pub use cairn_core::error::EventIdReuse;
pub use cairn_core::{Criterion, Position, Query, Tag};
pub use client::{Client, MAX_PAGE};
pub use config::{
    ClientConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DECIDE_ATTEMPTS, DEFAULT_MAX_BACKOFF,
    DEFAULT_MIN_BACKOFF, DEFAULT_READ_ATTEMPTS, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RESUME_TIMEOUT,
};
pub use decide::{Context, ContextQuery, DecideError, Decided, Outcome};
pub use error::Error;
pub use subscribe::{EventStream, SubscribeRequest};
pub use types::{
    BoundaryInfo, Direction, Event, Latest, NewEvent, Observation, ReadRequest, WriteResult,
};

/// The generated wire types, for the calls that take them as they are (indexes, server
/// information).
pub mod wire {
    pub use cairn_proto::orisun::*;
}
