//! The seed's command loop: read the context, decide, append with the observation, and
//! retry until the command is committed exactly once, or certainly not at all.
//!
//! The command's event ids are drawn once (UUIDv7) and carried by every attempt. After a
//! conflict (the context moved; nothing was written) the loop reads and decides again.
//! After an ambiguous failure (the reply was lost; the write may have committed):
//! - on a boundary with idempotent event ids it sends the very same request again: if the
//!   first one committed, the server answers with that write's original result and writes
//!   nothing; if not, the retry is an ordinary attempt;
//! - on any other boundary it looks, through the index, for the command's first event
//!   among those written since the context it observed: found, the command is done;
//!   absent, it decides again.
//!   This is exact when the command's events match its own context query (the seed's
//!   pattern: a decision appends to the context it read), since then a late commit of the
//!   lost attempt also conflicts with the next one; see docs/idempotency.md.
//!
//! "Absent" is only true when asked: a lost attempt may still be on its way (in a
//! forwarding queue, in a leader's log) and commit later. So once an attempt was
//! ambiguous, every later context read is searched for the command's ids before the
//! decision runs again: a late commit that made the next attempt conflict is found there,
//! and the command ends committed instead of being decided a second time.

use cairn_core::{Criterion, Position, Query, Tag};
use cairn_proto::orisun as pb;

use crate::types::{Event, NewEvent, Observation, WriteResult};
use crate::{Client, Error};

/// How [`Client::decide`] reads a command's context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContextQuery {
    /// GetLatestByCriteria: the newest event of each criterion (at least one).
    Latest(Vec<Criterion>),
    /// GetEvents: every event matching any of the criteria (at least one), oldest first.
    All(Vec<Criterion>),
}

impl ContextQuery {
    fn criteria(&self) -> &[Criterion] {
        match self {
            ContextQuery::Latest(c) | ContextQuery::All(c) => c,
        }
    }
}

/// What a decision sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// Per criterion, its newest event ([`ContextQuery::Latest`]; empty otherwise).
    pub latest: Vec<Option<Event>>,
    /// Every matching event, oldest first ([`ContextQuery::All`]; empty otherwise).
    pub events: Vec<Event>,
    /// Where the context was when read: the write's observation.
    pub position: Position,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The command's events were committed, once.
    Committed(WriteResult),
    /// The decision appended nothing.
    Nothing,
}

/// A finished command: its outcome and how it got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The outcome.
    pub outcome: Outcome,
    /// The ids the command's events carried (its last decision's, one per event).
    pub event_ids: Vec<String>,
    /// Writes sent.
    pub attempts: u32,
    /// Attempts refused because the context had moved.
    pub conflicts: u32,
    /// Attempts whose reply was lost.
    pub ambiguous: u32,
    /// Lost replies found, by reading, to have committed.
    pub resolved_by_reading: u32,
}

/// Why [`Client::decide`] failed.
#[derive(Debug, thiserror::Error)]
pub enum DecideError<E> {
    /// The decision function refused the command.
    #[error("the command was rejected: {0}")]
    Rejected(E),
    /// A call failed in a way no retry changes (permissions, a missing boundary, a reused
    /// id); the command was not committed.
    #[error(transparent)]
    Failed(Error),
    /// The attempts ran out; `last` is the final failure. The command was not committed,
    /// unless `last` [is ambiguous](Error::is_ambiguous).
    #[error("gave up after {attempts} attempts: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: Error,
    },
}

/// The command's event ids: drawn once, extended if a later decision appends more events.
struct CommandIds(Vec<String>);

impl CommandIds {
    fn assign(&mut self, events: &mut [NewEvent]) {
        while self.0.len() < events.len() {
            self.0.push(uuid::Uuid::now_v7().to_string());
        }
        for (event, id) in events.iter_mut().zip(&self.0) {
            event.id.clone_from(id);
        }
    }
}

impl Client {
    /// Runs a command: reads its context from `boundary`, calls `decision` with it, and
    /// appends the events it returns on condition that the context is unchanged, retrying
    /// as the module documentation describes. `decision` may run several times (once per
    /// read); it should be a pure function of the context. An empty list of events ends the
    /// command with [`Outcome::Nothing`].
    pub async fn decide<E, F>(
        &self,
        boundary: &str,
        context: &ContextQuery,
        mut decision: F,
    ) -> Result<Decided, DecideError<E>>
    where
        F: FnMut(&Context) -> Result<Vec<NewEvent>, E>,
    {
        let max = self.config().decide_attempts;
        let idempotent = self
            .idempotent(boundary)
            .await
            .map_err(DecideError::Failed)?;
        let query = Query::of(context.criteria().iter().cloned());
        let mut ids = CommandIds(Vec::new());
        let mut done = Decided {
            outcome: Outcome::Nothing,
            event_ids: Vec::new(),
            attempts: 0,
            conflicts: 0,
            ambiguous: 0,
            resolved_by_reading: 0,
        };
        let mut failures = 0u32;
        let give_up = |failures: &mut u32, error: Error| -> Option<DecideError<E>> {
            *failures += 1;
            if *failures >= max {
                Some(DecideError::GaveUp {
                    attempts: *failures,
                    last: error,
                })
            } else {
                None
            }
        };
        // Attempts whose outcome was lost: where their context was, and their first event
        // (every decision's first event carries the command's first id).
        let mut lost: Vec<(Position, NewEvent)> = Vec::new();
        'decide: loop {
            let read = match self.read_context(boundary, context, &query).await {
                Ok(seen) => self
                    .find_lost(boundary, &query, &lost)
                    .await
                    .map(|f| (seen, f)),
                Err(error) => Err(error),
            };
            let seen = match read {
                Ok((_, Some(result))) => {
                    done.resolved_by_reading += 1;
                    done.outcome = Outcome::Committed(result);
                    return Ok(done);
                }
                Ok((seen, None)) => seen,
                Err(error) if error.is_ambiguous() => {
                    if let Some(e) = give_up(&mut failures, error) {
                        return Err(e);
                    }
                    tokio::time::sleep(self.backoff(failures)).await;
                    continue;
                }
                Err(error) => return Err(DecideError::Failed(error)),
            };
            let mut events = decision(&seen).map_err(DecideError::Rejected)?;
            if events.is_empty() {
                return Ok(done);
            }
            ids.assign(&mut events);
            done.event_ids = ids.0[..events.len()].to_vec();
            // Built once: every retry of this decision sends the same bytes.
            let request = pb::SaveEventsV2Request {
                boundary: boundary.to_string(),
                events: events.iter().map(NewEvent::to_wire).collect(),
                consistency: vec![
                    Observation {
                        query: query.clone(),
                        position: seen.position,
                    }
                    .to_wire(),
                ],
            };
            loop {
                done.attempts += 1;
                let error = match self.save(&request).await {
                    Ok(result) => {
                        done.outcome = Outcome::Committed(result);
                        return Ok(done);
                    }
                    Err(error) => error,
                };
                if let Error::Conflict { .. } = error {
                    done.conflicts += 1;
                    if let Some(e) = give_up(&mut failures, error) {
                        return Err(e);
                    }
                    // The seed re-reads at once; under contention, jittered pauses let
                    // the competing commands through one at a time.
                    if done.conflicts > 1 {
                        tokio::time::sleep(self.backoff(done.conflicts - 1)).await;
                    }
                    continue 'decide;
                }
                if !error.is_ambiguous() {
                    return Err(DecideError::Failed(error));
                }
                done.ambiguous += 1;
                if !lost.iter().any(|(_, first)| {
                    first.event_type == events[0].event_type && first.data == events[0].data
                }) {
                    lost.push((seen.position, events[0].clone()));
                }
                if let Some(e) = give_up(&mut failures, error) {
                    return Err(e);
                }
                tokio::time::sleep(self.backoff(failures)).await;
                if idempotent {
                    continue;
                }
                // Did the lost attempt commit? The next context read looks for it.
                continue 'decide;
            }
        }
    }

    /// The write of any lost attempt that committed, searched since the earliest context
    /// any of them observed (a no-op without lost attempts).
    async fn find_lost(
        &self,
        boundary: &str,
        query: &Query,
        lost: &[(Position, NewEvent)],
    ) -> Result<Option<WriteResult>, Error> {
        let Some(since) = lost.iter().map(|(observed, _)| *observed).min() else {
            return Ok(None);
        };
        for (_, first) in lost {
            if let Some(found) = self.find_write(boundary, query, since, first).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Reads the context; `query` is its criteria as one query (built once per command).
    async fn read_context(
        &self,
        boundary: &str,
        context: &ContextQuery,
        query: &Query,
    ) -> Result<Context, Error> {
        match context {
            ContextQuery::Latest(criteria) => {
                let latest = self.latest_by_criteria(boundary, criteria).await?;
                Ok(Context {
                    position: latest.context_position,
                    latest: latest.events,
                    events: Vec::new(),
                })
            }
            ContextQuery::All(_) => {
                let events = self.read_all(boundary, Some(query), None).await?;
                Ok(Context {
                    position: events.last().map_or(Position::NONE, |e| e.position),
                    latest: Vec::new(),
                    events,
                })
            }
        }
    }

    /// The result of the write that stored the command's first event (`first`, with id
    /// `ids[0]`), if one did. Such a write came after the context was read at `observed`, so
    /// only later events are searched, through the index: those matching the context
    /// (where a decision's events usually are), then those matching the event's own type and
    /// string fields, which it matches by construction — never a scan of the boundary.
    async fn find_write(
        &self,
        boundary: &str,
        query: &Query,
        observed: Position,
        first: &NewEvent,
    ) -> Result<Option<WriteResult>, Error> {
        let after = (!observed.is_none()).then_some(observed);
        if !query.criteria.is_empty() {
            let in_context = self.read_all(boundary, Some(query), after).await?;
            if let Some(found) = written(&in_context, &first.id) {
                return Ok(Some(found));
            }
        }
        let own = Query::of([identity_criterion(first)]);
        let alike = self.read_all(boundary, Some(&own), after).await?;
        Ok(written(&alike, &first.id))
    }
}

/// Top-level string fields an identity criterion uses at most, besides the type.
const IDENTITY_FIELDS: usize = 8;

/// A criterion `event` matches once stored: its type and some of its top-level string fields
/// (the server indexes every top-level scalar and the type). Strings only: their tag text is
/// the string itself, whereas a number's is its canonical form.
fn identity_criterion(event: &NewEvent) -> Criterion {
    let mut tags = vec![Tag::new("eventType", event.event_type.clone())];
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(&event.data) {
        let usable = |key: &str, text: &str| {
            !key.is_empty() && key != "eventType" && !key.contains('\0') && !text.contains('\0')
        };
        for (key, value) in fields {
            if let serde_json::Value::String(text) = value
                && usable(&key, &text)
            {
                tags.push(Tag::new(key, text));
                if tags.len() > IDENTITY_FIELDS {
                    break;
                }
            }
        }
    }
    Criterion { tags }
}

/// The write that stored the event with id `id` among `events` (a write is all or nothing,
/// so finding one of the command's events finds the command).
fn written(events: &[Event], id: &str) -> Option<WriteResult> {
    let event = events.iter().find(|e| e.id == id)?;
    // A write's commit position is its last event's prepare position + 1.
    Some(WriteResult {
        position: Position::new(event.position.commit, event.position.commit - 1),
        write_id: event.write_id.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(id: &str, prepare: i64, commit: i64) -> Event {
        Event {
            id: id.into(),
            event_type: "T".into(),
            data: "{}".into(),
            metadata: "{}".into(),
            position: Position::new(commit, prepare),
            date_created: std::time::SystemTime::UNIX_EPOCH,
            write_id: format!("{commit}:{}", commit - 1),
        }
    }

    #[test]
    fn a_command_keeps_its_ids_across_decisions() {
        let mut ids = CommandIds(Vec::new());
        let mut first = vec![NewEvent::new("A", &serde_json::json!({}))];
        ids.assign(&mut first);
        let mut second = vec![
            NewEvent::new("A", &serde_json::json!({ "again": true })),
            NewEvent::new("B", &serde_json::json!({})),
        ];
        ids.assign(&mut second);
        assert_eq!(
            second[0].id, first[0].id,
            "the first event keeps the command's id"
        );
        assert_ne!(second[1].id, first[0].id);
        let mut third = vec![NewEvent::new("B", &serde_json::json!({}))];
        ids.assign(&mut third);
        assert_eq!(third[0].id, first[0].id);
    }

    #[test]
    fn a_write_is_found_by_any_of_its_events() {
        let events = [stored("x", 3, 4), stored("a", 4, 6), stored("b", 5, 6)];
        let whole = Some(WriteResult {
            position: Position::new(6, 5),
            write_id: "6:5".into(),
        });
        assert_eq!(written(&events, "a"), whole);
        assert_eq!(written(&events, "b"), whole);
        assert_eq!(written(&events, "c"), None);
    }

    #[test]
    fn an_event_matches_its_identity_criterion() {
        let event = NewEvent::new(
            "Deposited",
            &serde_json::json!({ "account": "a-1", "amount": 5, "note": "", "eventType": "X" }),
        );
        let criterion = identity_criterion(&event);
        assert_eq!(
            criterion.tags,
            vec![
                Tag::new("eventType", "Deposited"),
                Tag::new("account", "a-1"),
                Tag::new("note", ""),
            ]
        );
        let wide: serde_json::Map<String, serde_json::Value> = (0..20)
            .map(|i| (format!("k{i}"), serde_json::Value::String(i.to_string())))
            .collect();
        let many = NewEvent::new("T", &serde_json::Value::Object(wide));
        assert_eq!(identity_criterion(&many).tags.len(), IDENTITY_FIELDS + 1);
    }
}
