//! The client's request and reply types, and their conversions from and to the wire.

use std::time::{Duration, SystemTime};

use cairn_core::{Position, Query};
use cairn_proto::convert::{position_to_wire, query_to_wire};
use cairn_proto::orisun as pb;

use crate::Error;

/// An event to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The event's id; [`NewEvent::new`] draws a UUIDv7. [`crate::Client::decide`] replaces
    /// it with the command's own ids, so that every attempt of a command carries the same.
    pub id: String,
    /// Type name (non-empty).
    pub event_type: String,
    /// JSON object text.
    pub data: String,
    /// JSON object text (may be empty).
    pub metadata: String,
}

impl NewEvent {
    /// An event of `event_type` with `data` as its JSON object, a fresh UUIDv7 id and no
    /// metadata.
    pub fn new(event_type: impl Into<String>, data: &serde_json::Value) -> NewEvent {
        NewEvent {
            id: uuid::Uuid::now_v7().to_string(),
            event_type: event_type.into(),
            data: data.to_string(),
            metadata: String::new(),
        }
    }

    /// The same event with `metadata` as its metadata object.
    pub fn with_metadata(mut self, metadata: &serde_json::Value) -> NewEvent {
        self.metadata = metadata.to_string();
        self
    }

    /// The same event with id `id`.
    pub fn with_id(mut self, id: impl Into<String>) -> NewEvent {
        self.id = id.into();
        self
    }

    pub(crate) fn to_wire(&self) -> pb::EventToSave {
        pb::EventToSave {
            event_id: self.id.clone(),
            event_type: self.event_type.clone(),
            data: self.data.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The id its writer gave.
    pub id: String,
    /// Its type.
    pub event_type: String,
    /// JSON object text.
    pub data: String,
    /// JSON object text.
    pub metadata: String,
    /// Where it sits in its boundary.
    pub position: Position,
    /// When the leader accepted its write.
    pub date_created: SystemTime,
    /// `"<commit>:<prepare>"` of the last event of its write.
    pub write_id: String,
}

impl Event {
    /// The data parsed as JSON.
    pub fn data_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.data)
    }

    pub(crate) fn from_wire(event: pb::Event) -> Result<Event, Error> {
        let position = position_from(event.position.as_ref(), "event")?;
        let created = event
            .date_created
            .ok_or_else(|| Error::InvalidResponse("an event without date_created".into()))?;
        let date_created = u64::try_from(created.seconds)
            .ok()
            .zip(u32::try_from(created.nanos).ok())
            .map(|(s, n)| SystemTime::UNIX_EPOCH + Duration::new(s, n))
            .ok_or_else(|| {
                Error::InvalidResponse(format!("date_created {created:?} is before 1970"))
            })?;
        Ok(Event {
            id: event.event_id,
            event_type: event.event_type,
            data: event.data,
            metadata: event.metadata,
            position,
            date_created,
            write_id: event.write_id,
        })
    }
}

/// The outcome of a committed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteResult {
    /// Position of the write's last event.
    pub position: Position,
    /// `"<commit>:<prepare>"` of the write's last event.
    pub write_id: String,
}

impl WriteResult {
    pub(crate) fn from_wire(result: pb::WriteResult) -> Result<WriteResult, Error> {
        Ok(WriteResult {
            position: position_from(result.log_position.as_ref(), "write result")?,
            write_id: result.write_id,
        })
    }
}

/// "The context matched by `query` was at `position` when I decided": a write carrying it
/// commits only if that still holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The context query (at least one criterion).
    pub query: Query,
    /// The greatest position the query matched when read, or [`Position::NONE`].
    pub position: Position,
}

impl Observation {
    pub(crate) fn to_wire(&self) -> pb::ConsistencyObservation {
        pb::ConsistencyObservation {
            query: Some(query_to_wire(&self.query)),
            position: Some(position_to_wire(self.position)),
        }
    }
}

/// Read order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// Oldest first.
    #[default]
    Ascending,
    /// Newest first.
    Descending,
}

/// A page of events to read with [`crate::Client::get_events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    /// Boundary to read.
    pub boundary: String,
    /// Filter; `None` reads every event.
    pub query: Option<Query>,
    /// Inclusive start; `None` is the start (ascending) or the newest event (descending).
    pub from: Option<Position>,
    /// Page size, 1..=10,000.
    pub count: u32,
    /// Order.
    pub direction: Direction,
}

impl ReadRequest {
    /// The first `count` events of `boundary`, oldest first.
    pub fn new(boundary: impl Into<String>, count: u32) -> ReadRequest {
        ReadRequest {
            boundary: boundary.into(),
            query: None,
            from: None,
            count,
            direction: Direction::Ascending,
        }
    }

    pub(crate) fn to_wire(&self) -> pb::GetEventsRequest {
        pb::GetEventsRequest {
            query: self.query.as_ref().map(query_to_wire),
            from_position: self.from.map(position_to_wire),
            count: self.count,
            direction: match self.direction {
                Direction::Ascending => pb::Direction::Asc,
                Direction::Descending => pb::Direction::Desc,
            } as i32,
            boundary: self.boundary.clone(),
        }
    }
}

/// The newest event of each criterion, read from one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latest {
    /// Per criterion, in request order: its newest event, if any.
    pub events: Vec<Option<Event>>,
    /// The greatest of their positions, or [`Position::NONE`]: with the criteria, an
    /// observation of the current context.
    pub context_position: Position,
}

/// A boundary as Cairn's `cairn.v1.Boundaries` extension describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundaryInfo {
    /// Name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Whether event ids are idempotent on it (see [`crate::Client::decide`]).
    pub idempotent_event_ids: bool,
    /// Lifecycle state, e.g. `ACTIVE`.
    pub status: String,
    /// Events stored.
    pub event_count: u64,
}

/// Reads a wire position that the protocol requires.
pub(crate) fn position_from(p: Option<&pb::Position>, what: &str) -> Result<Position, Error> {
    p.map(cairn_proto::convert::position_from_wire)
        .ok_or_else(|| Error::InvalidResponse(format!("a {what} without a position")))
}
