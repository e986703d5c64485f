//! Conversions between wire (`orisun`, and Cairn's `cairn.v1` boundaries) messages and domain
//! types.
//!
//! Wire → domain conversions are structural; validation rules live in `cairn-core` so that
//! every entry point (gRPC, tests, tools) enforces the same contract.

use cairn_core::auth::UserRecord;
use cairn_core::boundary::{BoundaryInfo, BoundaryStatus, Placement};
use cairn_core::command::{Combinator, IndexCondition, IndexDefinition, IndexField, ValueType};
use cairn_core::event::{RawEvent, StoredEvent};
use cairn_core::{Criterion, Error, Observation, Position, Query, Tag};

use crate::cairn_v1;
use crate::orisun as pb;

/// Wire → domain position.
pub fn position_from_wire(p: &pb::Position) -> Position {
    Position::new(p.commit_position, p.prepare_position)
}

/// Domain → wire position.
pub fn position_to_wire(p: Position) -> pb::Position {
    pb::Position {
        commit_position: p.commit,
        prepare_position: p.prepare,
    }
}

/// Wire → domain criterion.
pub fn criterion_from_wire(c: pb::Criterion) -> Criterion {
    Criterion {
        tags: c
            .tags
            .into_iter()
            .map(|t| Tag {
                key: t.key,
                value: t.value,
            })
            .collect(),
    }
}

/// Domain → wire criterion.
pub fn criterion_to_wire(c: &Criterion) -> pb::Criterion {
    pb::Criterion {
        tags: c
            .tags
            .iter()
            .map(|t| pb::Tag {
                key: t.key.clone(),
                value: t.value.clone(),
            })
            .collect(),
    }
}

/// Wire → domain query; an absent query has no criteria.
pub fn query_from_wire(q: Option<pb::Query>) -> Query {
    Query {
        criteria: q
            .map(|q| q.criteria.into_iter().map(criterion_from_wire).collect())
            .unwrap_or_default(),
    }
}

/// Domain → wire query.
pub fn query_to_wire(q: &Query) -> pb::Query {
    pb::Query {
        criteria: q.criteria.iter().map(criterion_to_wire).collect(),
    }
}

/// Wire → domain observation; the position is required.
pub fn observation_from_wire(
    o: pb::ConsistencyObservation,
    index: usize,
) -> Result<Observation, Error> {
    let position = o.position.as_ref().map(position_from_wire).ok_or_else(|| {
        Error::invalid(format!(
            "consistency observation {index}: position is required (use (-1, -1) for \"no matching event\")"
        ))
    })?;
    Ok(Observation {
        query: query_from_wire(o.query),
        position,
    })
}

/// Domain → wire observation.
pub fn observation_to_wire(o: &Observation) -> pb::ConsistencyObservation {
    pb::ConsistencyObservation {
        query: Some(query_to_wire(&o.query)),
        position: Some(position_to_wire(o.position)),
    }
}

/// Wire → domain event to save.
pub fn raw_event_from_wire(e: pb::EventToSave) -> RawEvent {
    RawEvent {
        event_id: e.event_id,
        event_type: e.event_type,
        data: e.data,
        metadata: e.metadata,
    }
}

/// Nanoseconds since the epoch → protobuf timestamp.
pub fn timestamp(unix_nanos: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: unix_nanos.div_euclid(1_000_000_000),
        nanos: unix_nanos.rem_euclid(1_000_000_000) as i32,
    }
}

/// Stored event → wire event.
pub fn event_to_wire(e: StoredEvent) -> pb::Event {
    let write_id = e.write_id();
    pb::Event {
        event_id: e.event_id,
        event_type: e.event_type,
        data: e.data,
        metadata: e.metadata,
        position: Some(position_to_wire(e.position)),
        date_created: Some(timestamp(e.created_unix_nanos)),
        write_id,
    }
}

/// Boundary → wire.
pub fn boundary_to_wire(b: &BoundaryInfo) -> pb::BoundaryInfo {
    let status = match b.status {
        BoundaryStatus::Provisioning => pb::BoundaryLifecycleStatus::Provisioning,
        BoundaryStatus::Active => pb::BoundaryLifecycleStatus::Active,
        BoundaryStatus::Failed => pb::BoundaryLifecycleStatus::Failed,
    };
    pb::BoundaryInfo {
        name: b.name.clone(),
        description: described_with_options(b),
        placement: b.placement.as_ref().map(|p| pb::BoundaryPlacementInput {
            backend: p.backend.clone(),
            namespace: p.namespace.clone(),
        }),
        status: status as i32,
        existed_before_catalog: b.existed_before_catalog,
        last_error: b.last_error.clone(),
        definition_position: Some(position_to_wire(b.definition_position)),
        status_position: Some(position_to_wire(b.status_position)),
    }
}

/// What Orisun's boundary messages add to the description of a boundary with idempotent
/// event ids: they have no field for Cairn's options, and a user reading a boundary with an
/// Orisun client should still see that its duplicate ids are refused.
pub const IDEMPOTENT_DESCRIPTION_NOTE: &str = "[cairn: idempotent event ids]";

/// A boundary's description as Orisun's messages show it (see
/// [`IDEMPOTENT_DESCRIPTION_NOTE`]).
fn described_with_options(b: &BoundaryInfo) -> String {
    match (b.idempotent_event_ids, b.description.is_empty()) {
        (false, _) => b.description.clone(),
        (true, true) => IDEMPOTENT_DESCRIPTION_NOTE.to_string(),
        (true, false) => format!("{} {IDEMPOTENT_DESCRIPTION_NOTE}", b.description),
    }
}

/// The name of a boundary status, as Cairn's messages carry it.
pub fn boundary_status_name(status: BoundaryStatus) -> &'static str {
    match status {
        BoundaryStatus::Provisioning => "PROVISIONING",
        BoundaryStatus::Active => "ACTIVE",
        BoundaryStatus::Failed => "FAILED",
    }
}

/// Boundary → Cairn's boundary message (`cairn.v1.Boundary`), with its options.
pub fn boundary_to_cairn_wire(b: &BoundaryInfo, event_count: u64) -> cairn_v1::Boundary {
    cairn_v1::Boundary {
        name: b.name.clone(),
        description: b.description.clone(),
        options: Some(cairn_v1::BoundaryOptions {
            idempotent_event_ids: b.idempotent_event_ids,
        }),
        status: boundary_status_name(b.status).to_string(),
        event_count,
    }
}

/// Wire placement → domain.
pub fn placement_from_wire(p: Option<pb::BoundaryPlacementInput>) -> Option<Placement> {
    p.map(|p| Placement {
        backend: p.backend,
        namespace: p.namespace,
    })
}

/// User → wire (never with the password hash).
pub fn user_to_wire(u: &UserRecord) -> pb::AdminUser {
    pb::AdminUser {
        user_id: u.user_id.clone(),
        name: u.name.clone(),
        username: u.username.clone(),
        roles: u.roles.iter().map(|r| r.as_str().to_string()).collect(),
        created_at: Some(timestamp(u.created_unix_nanos)),
        updated_at: Some(timestamp(u.updated_unix_nanos)),
    }
}

fn value_type_from_wire(v: i32) -> Result<ValueType, Error> {
    match pb::ValueType::try_from(v) {
        Ok(pb::ValueType::Text) => Ok(ValueType::Text),
        Ok(pb::ValueType::Numeric) => Ok(ValueType::Numeric),
        Ok(pb::ValueType::Boolean) => Ok(ValueType::Boolean),
        Ok(pb::ValueType::Timestamptz) => Ok(ValueType::Timestamptz),
        Err(_) => Err(Error::invalid(format!(
            "value_type {v} is not a known ValueType"
        ))),
    }
}

fn value_type_to_wire(v: ValueType) -> pb::ValueType {
    match v {
        ValueType::Text => pb::ValueType::Text,
        ValueType::Numeric => pb::ValueType::Numeric,
        ValueType::Boolean => pb::ValueType::Boolean,
        ValueType::Timestamptz => pb::ValueType::Timestamptz,
    }
}

/// CreateIndex request → definition (structure only; `IndexDefinition::validate` checks).
pub fn index_from_wire(req: pb::CreateIndexRequest) -> Result<IndexDefinition, Error> {
    let combinator = match pb::ConditionCombinator::try_from(req.condition_combinator) {
        Ok(pb::ConditionCombinator::And) => Combinator::And,
        Ok(pb::ConditionCombinator::Or) => Combinator::Or,
        Err(_) => {
            return Err(Error::invalid(format!(
                "condition_combinator {} is not AND or OR",
                req.condition_combinator
            )));
        }
    };
    Ok(IndexDefinition {
        name: req.name,
        fields: req
            .fields
            .into_iter()
            .map(|f| {
                Ok(IndexField {
                    json_key: f.json_key,
                    value_type: value_type_from_wire(f.value_type)?,
                })
            })
            .collect::<Result<_, Error>>()?,
        conditions: req
            .conditions
            .into_iter()
            .map(|c| IndexCondition {
                key: c.key,
                operator: c.operator,
                value: c.value,
            })
            .collect(),
        combinator,
    })
}

/// Definition → wire (always READY: every key is index-served, X2).
pub fn index_to_wire(d: &IndexDefinition) -> pb::IndexDefinition {
    pb::IndexDefinition {
        name: d.name.clone(),
        fields: d
            .fields
            .iter()
            .map(|f| pb::IndexField {
                json_key: f.json_key.clone(),
                value_type: value_type_to_wire(f.value_type) as i32,
            })
            .collect(),
        conditions: d
            .conditions
            .iter()
            .map(|c| pb::IndexCondition {
                key: c.key.clone(),
                operator: c.operator.clone(),
                value: c.value.clone(),
            })
            .collect(),
        condition_combinator: match d.combinator {
            Combinator::And => pb::ConditionCombinator::And,
            Combinator::Or => pb::ConditionCombinator::Or,
        } as i32,
        state: pb::IndexState::Ready as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_split_nanos() {
        let t = timestamp(1_500_000_000_123);
        assert_eq!((t.seconds, t.nanos), (1500, 123));
        let t = timestamp(-1);
        assert_eq!((t.seconds, t.nanos), (-1, 999_999_999));
    }

    #[test]
    fn observation_needs_a_position() {
        let o = pb::ConsistencyObservation {
            query: None,
            position: None,
        };
        assert!(observation_from_wire(o, 0).is_err());
    }

    #[test]
    fn query_round_trip() {
        let q = Query::of([Criterion::of([("a", "1"), ("b", "2")])]);
        assert_eq!(query_from_wire(Some(query_to_wire(&q))), q);
    }
}
