//! Events as submitted (validated, canonical) and as stored (E1–E3, P2).

use serde::{Deserialize, Serialize};

use crate::json::{Payload, canonicalize, tag_set};
use crate::limits::{
    MAX_EVENT_ID_BYTES, MAX_EVENT_TYPE_BYTES, MAX_EVENTS_PER_WRITE, MAX_TAGS_PER_EVENT,
};
use crate::{Error, Position, Tag};

/// An event exactly as a client sent it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawEvent {
    /// Client-chosen id.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// JSON object text (or empty / `null`).
    pub data: String,
    /// JSON object text (or empty / `null`).
    pub metadata: String,
}

/// A validated event ready to append.
///
/// Validation and tag extraction happen once, on the node that received the request; the
/// replicated command carries the result so that applying it needs no JSON parsing and every
/// replica derives the same tags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEvent {
    /// Client-chosen id.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// Compact JSON object text without the canonical `eventType` key.
    pub data: String,
    /// Compact JSON object text.
    pub metadata: String,
    /// Every top-level scalar of the data plus `eventType`, sorted by key (X2).
    pub tags: Vec<Tag>,
}

impl NewEvent {
    /// Validates one event (E1–E3); `index` names it in error messages.
    pub fn validate(raw: RawEvent, index: usize) -> Result<NewEvent, Error> {
        if raw.event_id.is_empty() {
            return Err(Error::invalid(format!("event {index}: event_id is empty")));
        }
        if raw.event_id.len() > MAX_EVENT_ID_BYTES {
            return Err(Error::invalid(format!(
                "event {index}: event_id is longer than {MAX_EVENT_ID_BYTES} bytes"
            )));
        }
        if raw.event_type.is_empty() {
            return Err(Error::invalid(format!(
                "event {index}: event_type is empty"
            )));
        }
        if raw.event_type.len() > MAX_EVENT_TYPE_BYTES {
            return Err(Error::invalid(format!(
                "event {index}: event_type is longer than {MAX_EVENT_TYPE_BYTES} bytes"
            )));
        }
        if raw.event_type.contains('\0') {
            return Err(Error::invalid(format!(
                "event {index}: event_type contains a NUL character"
            )));
        }
        // E3: the request's event_type overwrites an application key of the same name; the
        // returned data omits it, so it is simply not kept in the stored text.
        let data = canonicalize(&raw.data, Payload::Data, &|| format!("event {index} data"))?;
        let metadata = canonicalize(&raw.metadata, Payload::Metadata, &|| {
            format!("event {index} metadata")
        })?;
        // Every tag is a posting-list row written with the event.
        if data.scalars.len() >= MAX_TAGS_PER_EVENT {
            return Err(Error::invalid(format!(
                "event {index} data has {} top-level scalars; the limit is {} (each is indexed)",
                data.scalars.len(),
                MAX_TAGS_PER_EVENT - 1
            )));
        }
        let tags = tag_set(data.scalars, &raw.event_type)
            .into_iter()
            .map(|(key, value)| Tag { key, value })
            .collect();
        Ok(NewEvent {
            event_id: raw.event_id,
            event_type: raw.event_type,
            data: data.text,
            metadata: metadata.text,
            tags,
        })
    }
}

/// Validates the events of one write (E1), each at most `max_event_bytes`.
pub fn validate_events(raw: Vec<RawEvent>, max_event_bytes: usize) -> Result<Vec<NewEvent>, Error> {
    if raw.is_empty() {
        return Err(Error::invalid(
            "events is empty: a write needs at least one event",
        ));
    }
    if raw.len() > MAX_EVENTS_PER_WRITE {
        return Err(Error::invalid(format!(
            "write has {} events; the limit is {MAX_EVENTS_PER_WRITE}",
            raw.len()
        )));
    }
    raw.into_iter()
        .enumerate()
        .map(|(index, e)| {
            let size = e.event_id.len() + e.event_type.len() + e.data.len() + e.metadata.len();
            if size > max_event_bytes {
                return Err(Error::invalid(format!(
                    "event {index} is {size} bytes (id, type, data and metadata); the limit is {max_event_bytes} (--max-event-bytes)"
                )));
            }
            NewEvent::validate(e, index)
        })
        .collect()
}

/// A committed event as read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// Where it sits.
    pub position: Position,
    /// Client-chosen id.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// Compact JSON object text without `eventType`.
    pub data: String,
    /// Compact JSON object text.
    pub metadata: String,
    /// Leader's clock when the write was accepted, nanoseconds since the Unix epoch.
    pub created_unix_nanos: i64,
}

impl StoredEvent {
    /// `"<commit>:<prepare>"` of the last event of this event's write (P2): the write's
    /// commit is its last prepare + 1.
    pub fn write_id(&self) -> String {
        Position::new(self.position.commit, self.position.commit - 1).write_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(id: &str, ty: &str, data: &str) -> RawEvent {
        RawEvent {
            event_id: id.into(),
            event_type: ty.into(),
            data: data.into(),
            metadata: String::new(),
        }
    }

    /// The documented nesting limit holds: data as deep as the limit is accepted, one level
    /// deeper is refused as invalid (not a stack overflow, not an internal error).
    #[test]
    fn json_nesting_is_limited_to_max_json_depth() {
        let nested = |depth: usize| format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        NewEvent::validate(raw("a", "T", &nested(crate::limits::MAX_JSON_DEPTH)), 0)
            .expect("as deep as the limit");
        let too_deep =
            NewEvent::validate(raw("a", "T", &nested(crate::limits::MAX_JSON_DEPTH + 1)), 0)
                .expect_err("one level deeper");
        assert!(
            matches!(too_deep, Error::InvalidArgument(_)),
            "{too_deep:?}"
        );
    }

    const MAX: usize = crate::limits::DEFAULT_MAX_EVENT_BYTES;

    #[test]
    fn e1_required_fields() {
        assert!(validate_events(vec![], MAX).is_err());
        assert!(validate_events(vec![raw("", "T", "")], MAX).is_err());
        let err =
            validate_events(vec![raw("a", "T", ""), raw("b", "", "")], MAX).expect_err("type");
        assert_eq!(err.to_string(), "event 1: event_type is empty");
    }

    #[test]
    fn events_are_limited_in_bytes_and_tags() {
        let at_limit = format!(r#"{{"b":"{}"}}"#, "x".repeat(100 - 10));
        assert_eq!(at_limit.len() + 2, 100);
        validate_events(vec![raw("a", "T", &at_limit)], 100).expect("at the limit");
        let err = validate_events(
            vec![raw("a", "T", &at_limit), raw("bb", "T", &at_limit)],
            100,
        )
        .expect_err("one byte over");
        assert_eq!(
            err.to_string(),
            "event 1 is 101 bytes (id, type, data and metadata); the limit is 100 (--max-event-bytes)"
        );
        let wide = |keys: usize| {
            let fields: Vec<String> = (0..keys).map(|k| format!(r#""k{k}":{k}"#)).collect();
            format!("{{{}}}", fields.join(","))
        };
        let widest = validate_events(vec![raw("a", "T", &wide(MAX_TAGS_PER_EVENT - 1))], MAX)
            .expect("eventType makes the last tag");
        assert_eq!(widest[0].tags.len(), MAX_TAGS_PER_EVENT);
        let err = validate_events(vec![raw("a", "T", &wide(MAX_TAGS_PER_EVENT))], MAX)
            .expect_err("one tag too many");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }

    #[test]
    fn e2_e3_data_is_canonical() {
        let e =
            NewEvent::validate(raw("a", "Opened", r#"{"eventType":"X","n":1}"#), 0).expect("valid");
        assert_eq!(e.data, r#"{"n":1}"#);
        assert_eq!(e.metadata, "{}");
        assert_eq!(
            e.tags,
            vec![Tag::new("eventType", "Opened"), Tag::new("n", "1")]
        );
        let err = NewEvent::validate(raw("a", "T", "[]"), 4).expect_err("array");
        assert!(err.to_string().starts_with("event 4 data"), "{err}");
    }

    #[test]
    fn write_id_of_an_event() {
        let e = StoredEvent {
            position: Position::new(3, 1),
            event_id: "x".into(),
            event_type: "T".into(),
            data: "{}".into(),
            metadata: "{}".into(),
            created_unix_nanos: 0,
        };
        assert_eq!(e.write_id(), "3:2");
    }
}
