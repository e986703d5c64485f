//! The replicated commands and their outcomes.
//!
//! Every state change is a [`Command`] that goes through the Raft log and is applied in log
//! order by every replica. Commands carry everything needed to apply them deterministically:
//! validated events with their tags, hashed passwords, the leader's clock.

use serde::{Deserialize, Serialize};

use crate::auth::UserRecord;
use crate::boundary::{BoundaryInfo, Placement};
use crate::event::NewEvent;
use crate::{Error, Observation, Position};

/// One value type of an index field (wire `ValueType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValueType {
    /// Text.
    Text,
    /// Number.
    Numeric,
    /// Boolean.
    Boolean,
    /// Timestamp with time zone.
    Timestamptz,
}

/// One indexed key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexField {
    /// Top-level data key.
    pub json_key: String,
    /// Declared type.
    pub value_type: ValueType,
}

/// A partial-index condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexCondition {
    /// Top-level data key.
    pub key: String,
    /// One of `= > < >= <=`.
    pub operator: String,
    /// Comparison value.
    pub value: String,
}

/// How conditions combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Combinator {
    /// All.
    And,
    /// Any.
    Or,
}

/// A recorded index (I1). Cairn serves every scalar key from its tag index already (X2), so
/// a definition changes nothing but what ListIndexes reports (I2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDefinition {
    /// Name (identifier).
    pub name: String,
    /// Keys.
    pub fields: Vec<IndexField>,
    /// Conditions.
    pub conditions: Vec<IndexCondition>,
    /// Combinator.
    pub combinator: Combinator,
}

/// Operators allowed in index conditions (I1).
pub const INDEX_OPERATORS: [&str; 5] = ["=", ">", "<", ">=", "<="];

impl IndexDefinition {
    /// Validates a definition (I1).
    pub fn validate(&self) -> Result<(), Error> {
        crate::boundary::validate_identifier(&self.name, "index name")?;
        if self.fields.is_empty() {
            return Err(Error::invalid("index needs at least one field"));
        }
        if let Some(i) = self.fields.iter().position(|f| f.json_key.is_empty()) {
            return Err(Error::invalid(format!(
                "index field {i}: json_key is empty"
            )));
        }
        for (i, c) in self.conditions.iter().enumerate() {
            if c.key.is_empty() {
                return Err(Error::invalid(format!("index condition {i}: key is empty")));
            }
            if !INDEX_OPERATORS.contains(&c.operator.as_str()) {
                return Err(Error::invalid(format!(
                    "index condition {i}: operator {:?} is invalid: use one of = > < >= <=",
                    c.operator
                )));
            }
        }
        Ok(())
    }
}

/// Append events if every observation still holds (C2, C3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Append {
    /// Target boundary name.
    pub boundary: String,
    /// Normalised observations; empty = unconditional.
    pub observations: Vec<Observation>,
    /// Validated events.
    pub events: Vec<NewEvent>,
    /// Leader's clock, ns since the Unix epoch (becomes `date_created`); set by the
    /// leader's proposer ([`Command::stamp`]).
    pub at_unix_nanos: i64,
}

/// A state change, applied in Raft log order by every replica.
///
/// This is the Raft log's on-disk and on-the-wire format: entries hold commands encoded by
/// postcard, which identifies enum variants and struct fields by position, not by name. So
/// it may evolve only by appending: a new variant goes after the last one, a new field is
/// never inserted before existing ones, and nothing is reordered or removed while a log or
/// a peer of an older version may still hold entries that use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Conditional or unconditional append.
    Append(Append),
    /// Create a boundary.
    CreateBoundary {
        /// Name (validated).
        name: String,
        /// Free text.
        description: String,
        /// Placement as given.
        placement: Option<Placement>,
        /// As given.
        existed_before_catalog: bool,
        /// X1 opt-in.
        idempotent_event_ids: bool,
        /// Start-up declaration: an existing boundary is fine (B4), not ALREADY_EXISTS.
        if_absent: bool,
    },
    /// Record an index.
    CreateIndex {
        /// Boundary name.
        boundary: String,
        /// Validated definition.
        index: IndexDefinition,
    },
    /// Forget an index.
    DropIndex {
        /// Boundary name.
        boundary: String,
        /// Index name.
        name: String,
    },
    /// Create a user.
    CreateUser {
        /// The new user with hashed password.
        user: UserRecord,
        /// Bootstrap: an existing username is fine, not ALREADY_EXISTS.
        if_absent: bool,
    },
    /// Delete a user.
    DeleteUser {
        /// Id of the user.
        user_id: String,
    },
    /// Replace a user's password hash; bumps the credential generation (revokes tokens).
    SetPassword {
        /// Id of the user.
        user_id: String,
        /// New PHC hash.
        password_hash: String,
        /// Leader's clock.
        at_unix_nanos: i64,
    },
    /// Take or renew the exclusive subscription lease (S1).
    AcquireLease {
        /// Boundary name.
        boundary: String,
        /// Subscriber name.
        subscriber: String,
        /// Unique id of the holding stream.
        holder: String,
        /// Leader's clock.
        at_unix_nanos: i64,
        /// Lease length.
        ttl_nanos: i64,
    },
    /// Give a lease back (no-op when held by someone else).
    ReleaseLease {
        /// Boundary name.
        boundary: String,
        /// Subscriber name.
        subscriber: String,
        /// Id of the stream giving it back.
        holder: String,
    },
    /// Install the cluster-wide session-token key once (first start).
    InitTokenKey {
        /// Random key; ignored when one exists.
        key: Vec<u8>,
    },
    /// Several commands proposed as one Raft entry (group commit). Applied in order, each
    /// seeing the effects of the ones before it (C3), each with its own outcome.
    Batch(Vec<Command>),
    /// Appends the leader has already checked and turned into rows (pre-execution, see
    /// docs/design.md): every replica writes `rows` as they are, without repeating the
    /// consistency checks, but only on the state the plan was made on (`base`); on any
    /// other state the entry changes nothing and the leader proposes the appends again.
    /// Never sent by a client and never forwarded: only a leader's proposer makes one.
    Planned(PlannedAppends),
    /// Replace the session-token key (an administrator's rotation). Tokens signed with the
    /// key it replaces stay valid until `at_unix_nanos + grace_nanos` (the leader's clock);
    /// a key retired by an earlier rotation stops being accepted at once. Last among the
    /// variants: postcard numbers them, and the earlier ones keep their numbers.
    RotateTokenKey {
        /// New random key.
        key: Vec<u8>,
        /// How long tokens of the replaced key stay valid, in nanoseconds (0: not at all).
        grace_nanos: i64,
        /// Leader's clock.
        at_unix_nanos: i64,
    },
}

/// The effects of a run of appends, computed by the leader against a known state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedAppends {
    /// Token of the state the plan was computed on (the replication layer's, opaque here).
    pub base: u128,
    /// Token of the state once `rows` are written.
    pub token: u128,
    /// Each touched boundary's id and its head (next prepare position) afterwards.
    pub heads: Vec<(u32, u64)>,
    /// The rows to write, in the store's encoding (opaque here).
    pub rows: Bytes,
}

/// A byte string that serialises as one (serde's `Vec<u8>` goes element by element, which
/// costs a call per byte to decode; the encoded bytes are the same either way in postcard).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.0.len())
    }
}

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Bytes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = seq.next_element()? {
                    out.push(b);
                }
                Ok(Bytes(out))
            }
        }
        deserializer.deserialize_byte_buf(Visitor)
    }
}

impl Command {
    /// Whether the command is one of the few bytes a node itself writes to keep serving:
    /// a subscription's lease (a row that exists while the subscription does) or a start-up
    /// declaration (the admin user, the declared boundaries, the token key; written once,
    /// no-ops afterwards). A node short of disk space still takes these, so that a full
    /// disk neither ends every subscription nor keeps a restarted node from serving reads,
    /// while it refuses everything a client adds.
    pub fn is_upkeep(&self) -> bool {
        match self {
            Command::AcquireLease { .. }
            | Command::ReleaseLease { .. }
            | Command::InitTokenKey { .. } => true,
            Command::CreateBoundary { if_absent, .. } | Command::CreateUser { if_absent, .. } => {
                *if_absent
            }
            Command::Batch(commands) => commands.iter().all(Command::is_upkeep),
            Command::Append(_)
            | Command::CreateIndex { .. }
            | Command::DropIndex { .. }
            | Command::DeleteUser { .. }
            | Command::SetPassword { .. }
            | Command::RotateTokenKey { .. }
            | Command::Planned(_) => false,
        }
    }

    /// Sets every timestamp the command carries into the state to `now_unix_nanos`. The
    /// leader's proposer calls it just before proposing, so the clock that stamps an entry is
    /// the leader's, whichever node received the request, and every replica stores the same
    /// bytes (they apply the entry, they never read their own clock).
    pub fn stamp(&mut self, now_unix_nanos: i64) {
        match self {
            Command::Append(append) => append.at_unix_nanos = now_unix_nanos,
            Command::CreateUser { user, .. } => {
                user.created_unix_nanos = now_unix_nanos;
                user.updated_unix_nanos = now_unix_nanos;
            }
            Command::SetPassword { at_unix_nanos, .. }
            | Command::AcquireLease { at_unix_nanos, .. }
            | Command::RotateTokenKey { at_unix_nanos, .. } => *at_unix_nanos = now_unix_nanos,
            Command::Batch(commands) => {
                for command in commands {
                    command.stamp(now_unix_nanos);
                }
            }
            Command::CreateBoundary { .. }
            | Command::CreateIndex { .. }
            | Command::DropIndex { .. }
            | Command::DeleteUser { .. }
            | Command::ReleaseLease { .. }
            | Command::InitTokenKey { .. }
            | Command::Planned(_) => {}
        }
    }

    /// Rough size in bytes, to bound batches.
    pub fn approx_bytes(&self) -> usize {
        match self {
            Command::Append(a) => {
                64 + a
                    .events
                    .iter()
                    .map(|e| {
                        e.data.len()
                            + e.metadata.len()
                            + e.event_id.len()
                            + e.event_type.len()
                            + e.tags
                                .iter()
                                .map(|t| t.key.len() + t.value.len() + 8)
                                .sum::<usize>()
                    })
                    .sum::<usize>()
                    + a.observations
                        .iter()
                        .map(|o| o.query.tag_count() * 32)
                        .sum::<usize>()
            }
            Command::Batch(commands) => commands.iter().map(Command::approx_bytes).sum(),
            Command::Planned(planned) => planned.rows.0.len() + 64,
            _ => 256,
        }
    }
}

/// What applying a command produced, when it succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    /// Events appended; the position of the last one.
    Appended {
        /// Position of the write's last event.
        last: Position,
    },
    /// The boundary as it now is.
    Boundary(BoundaryInfo),
    /// The user as it now is.
    User(UserRecord),
    /// Nothing to report.
    Done,
    /// The outcomes of a [`Command::Batch`], in order.
    Batch(Vec<Outcome>),
    /// The session-token key was replaced (last among the variants, see
    /// [`Command::RotateTokenKey`]).
    TokenKeyRotated(TokenKeyState),
}

/// Which session-token key signs new tokens, and which retired one is still accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenKeyState {
    /// Number of rotations so far: 0 for the key of the first start.
    pub generation: u64,
    /// When the current key replaced the previous one (leader's clock; 0 for the first).
    pub rotated_unix_nanos: i64,
    /// Until when tokens of the previous key are still accepted (leader's clock; 0 when
    /// there is no previous key).
    pub previous_accepted_until_unix_nanos: i64,
}

/// Result of applying a command; errors are deterministic outcomes (conflicts, duplicates),
/// identical on every replica.
pub type Outcome = Result<Applied, Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::UserRecord;

    fn user() -> UserRecord {
        UserRecord {
            user_id: "u".into(),
            name: "n".into(),
            username: "n".into(),
            password_hash: String::new(),
            roles: vec![],
            created_unix_nanos: 1,
            updated_unix_nanos: 1,
            credential_generation: 0,
        }
    }

    #[test]
    fn only_leases_and_start_up_declarations_are_upkeep() {
        let acquire = Command::AcquireLease {
            boundary: "b".into(),
            subscriber: "s".into(),
            holder: "h".into(),
            at_unix_nanos: 1,
            ttl_nanos: 1,
        };
        let release = Command::ReleaseLease {
            boundary: "b".into(),
            subscriber: "s".into(),
            holder: "h".into(),
        };
        let append = Command::Append(Append {
            boundary: "b".into(),
            observations: vec![],
            events: vec![],
            at_unix_nanos: 1,
        });
        assert!(acquire.is_upkeep());
        assert!(Command::Batch(vec![acquire.clone(), release.clone()]).is_upkeep());
        assert!(!append.is_upkeep());
        assert!(!Command::Batch(vec![acquire, append]).is_upkeep());
        assert!(
            !Command::DeleteUser {
                user_id: "u".into()
            }
            .is_upkeep()
        );
        assert!(
            !Command::RotateTokenKey {
                key: vec![1; 32],
                grace_nanos: 0,
                at_unix_nanos: 1,
            }
            .is_upkeep(),
            "an administrator's rotation is refused on a full disk like any client change"
        );
    }

    #[test]
    fn stamp_sets_every_timestamp_a_command_carries() {
        let mut batch = Command::Batch(vec![
            Command::Append(Append {
                boundary: "b".into(),
                observations: vec![],
                events: vec![],
                at_unix_nanos: 1,
            }),
            Command::CreateUser {
                user: user(),
                if_absent: false,
            },
            Command::SetPassword {
                user_id: "u".into(),
                password_hash: String::new(),
                at_unix_nanos: 1,
            },
            Command::AcquireLease {
                boundary: "b".into(),
                subscriber: "s".into(),
                holder: "h".into(),
                at_unix_nanos: 1,
                ttl_nanos: 5,
            },
            Command::DeleteUser {
                user_id: "u".into(),
            },
            Command::RotateTokenKey {
                key: vec![1; 32],
                grace_nanos: 7,
                at_unix_nanos: 1,
            },
        ]);
        let untouched = Command::DeleteUser {
            user_id: "u".into(),
        };
        batch.stamp(42);
        let Command::Batch(commands) = batch else {
            unreachable!()
        };
        for command in &commands {
            match command {
                Command::Append(a) => assert_eq!(a.at_unix_nanos, 42),
                Command::CreateUser { user, .. } => {
                    assert_eq!((user.created_unix_nanos, user.updated_unix_nanos), (42, 42));
                }
                Command::SetPassword { at_unix_nanos, .. } => assert_eq!(*at_unix_nanos, 42),
                Command::AcquireLease {
                    at_unix_nanos,
                    ttl_nanos,
                    ..
                } => assert_eq!((*at_unix_nanos, *ttl_nanos), (42, 5)),
                Command::RotateTokenKey {
                    at_unix_nanos,
                    grace_nanos,
                    ..
                } => assert_eq!((*at_unix_nanos, *grace_nanos), (42, 7)),
                other => assert_eq!(other, &untouched),
            }
        }
    }
}
