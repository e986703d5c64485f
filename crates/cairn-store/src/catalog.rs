//! The in-memory mirror of `sm_meta`: boundaries, users, indexes, leases and the heads of
//! the event logs. Loaded at open, updated by the single writer after each committed batch,
//! read by everyone else under a read lock.

use std::collections::BTreeMap;

use cairn_core::auth::UserRecord;
use cairn_core::boundary::{BoundaryInfo, BoundaryStatus};
use cairn_core::command::{IndexDefinition, TokenKeyState};
use rocksdb::{DB, IteratorMode};
use serde::{Deserialize, Serialize};

use crate::keys::{self, meta};
use crate::{CF_EVENTS, CF_SM_META, StoreError};

/// An exclusive subscription lease (S1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Id of the holding stream.
    pub holder: String,
    /// Leader clock after which the lease is free.
    pub expires_unix_nanos: i64,
}

/// Catalog state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Catalog {
    /// Boundaries by name.
    pub boundaries: BTreeMap<String, BoundaryInfo>,
    /// Next prepare position (= number of events) per boundary id.
    pub heads: BTreeMap<u32, u64>,
    /// Users by id.
    pub users: BTreeMap<String, UserRecord>,
    /// Indexes by (boundary id, name).
    pub indexes: BTreeMap<(u32, String), IndexDefinition>,
    /// Leases by (boundary id, subscriber name).
    pub leases: BTreeMap<(u32, String), Lease>,
    /// Session-token key.
    pub token_key: Option<Vec<u8>>,
    /// The key `token_key` replaced, accepted until `token_key_state` says.
    pub previous_token_key: Option<Vec<u8>>,
    /// Rotations of the session-token key.
    pub token_key_state: TokenKeyState,
    /// Number of catalog changes so far (boundary positions are drawn from it).
    pub catalog_seq: i64,
    /// Id the next boundary gets.
    pub next_boundary_id: u32,
    /// Raft layer's applied marker.
    pub applied_marker: Option<Vec<u8>>,
}

pub(crate) fn decode_json<T: serde::de::DeserializeOwned>(
    what: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|e| StoreError::corrupt("sm_meta", &format!("{what}: {e}")))
}

pub(crate) fn encode_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Our catalog types serialise infallibly (plain structs, string keys).
    serde_json::to_vec(value).unwrap_or_default()
}

fn scoped_name(key: &[u8], prefix: &[u8]) -> Result<(u32, String), StoreError> {
    let rest = &key[prefix.len()..];
    let bid: [u8; 4] = rest
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| StoreError::corrupt("sm_meta", "scoped key too short"))?;
    let name = String::from_utf8(rest[4..].to_vec())
        .map_err(|_| StoreError::corrupt("sm_meta", "scoped key is not UTF-8"))?;
    Ok((u32::from_be_bytes(bid), name))
}

impl Catalog {
    /// The catalog of a state machine with no `sm_meta` rows yet.
    pub fn empty() -> Catalog {
        Catalog {
            next_boundary_id: 1,
            ..Catalog::default()
        }
    }

    /// Adds one `sm_meta` row, as read back from disk: a row that does not decode is
    /// corrupt (an error naming the row's kind, never a panic), a key of no known kind is
    /// ignored (a newer version's). Heads come from `events`, not from here.
    pub fn load_meta_row(&mut self, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        if k == meta::APPLIED {
            self.applied_marker = Some(v.to_vec());
        } else if k == meta::CATALOG_SEQ {
            self.catalog_seq = decode_json("catalog_seq", v)?;
        } else if k == meta::NEXT_BOUNDARY_ID {
            self.next_boundary_id = decode_json("next_boundary_id", v)?;
        } else if k == meta::TOKEN_KEY {
            self.token_key = Some(v.to_vec());
        } else if k == meta::PREVIOUS_TOKEN_KEY {
            self.previous_token_key = Some(v.to_vec());
        } else if k == meta::TOKEN_KEY_STATE {
            self.token_key_state = decode_json("token_key_state", v)?;
        } else if k.starts_with(meta::BOUNDARY) {
            let b: BoundaryInfo = decode_json("boundary", v)?;
            self.boundaries.insert(b.name.clone(), b);
        } else if k.starts_with(meta::USER) {
            let u: UserRecord = decode_json("user", v)?;
            self.users.insert(u.user_id.clone(), u);
        } else if k.starts_with(meta::INDEX) {
            self.indexes
                .insert(scoped_name(k, meta::INDEX)?, decode_json("index", v)?);
        } else if k.starts_with(meta::LEASE) {
            self.leases
                .insert(scoped_name(k, meta::LEASE)?, decode_json("lease", v)?);
        }
        Ok(())
    }

    /// Reads the catalog from `sm_meta` and the heads from `events`.
    pub(crate) fn load(db: &DB) -> Result<Catalog, StoreError> {
        let meta_cf = db
            .cf_handle(CF_SM_META)
            .ok_or(StoreError::MissingColumnFamily(CF_SM_META))?;
        let mut c = Catalog::empty();
        for item in db.iterator_cf(meta_cf, IteratorMode::Start) {
            let (k, v) = item?;
            c.load_meta_row(&k, &v)?;
        }
        let events_cf = db
            .cf_handle(CF_EVENTS)
            .ok_or(StoreError::MissingColumnFamily(CF_EVENTS))?;
        for b in c.boundaries.values() {
            let mut it = db.raw_iterator_cf(events_cf);
            it.seek_for_prev(keys::event_key(b.id, u64::MAX));
            let head = match it.key() {
                Some(k) if k.starts_with(&b.id.to_be_bytes()) => keys::prepare_of_event_key(k)? + 1,
                _ => {
                    it.status()?;
                    0
                }
            };
            c.heads.insert(b.id, head);
        }
        Ok(c)
    }

    /// An ACTIVE boundary by name.
    pub fn active_boundary(&self, name: &str) -> Option<&BoundaryInfo> {
        self.boundaries
            .get(name)
            .filter(|b| b.status == BoundaryStatus::Active)
    }

    /// Number of events (= next prepare position) of a boundary.
    pub fn head(&self, bid: u32) -> u64 {
        self.heads.get(&bid).copied().unwrap_or(0)
    }

    /// A user by login name.
    pub fn user_by_name(&self, username: &str) -> Option<&UserRecord> {
        self.users.values().find(|u| u.username == username)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_rows_load_into_the_catalog_and_damaged_ones_are_named() {
        let mut c = Catalog::empty();
        c.load_meta_row(meta::CATALOG_SEQ, b"7").expect("seq");
        c.load_meta_row(
            &meta::scoped(meta::LEASE, 3, "sub"),
            br#"{"holder":"h","expires_unix_nanos":5}"#,
        )
        .expect("lease");
        c.load_meta_row(b"written-by-a-newer-version", b"?")
            .expect("ignored");
        assert_eq!(c.catalog_seq, 7);
        assert_eq!(c.next_boundary_id, 1);
        assert_eq!(c.leases[&(3, "sub".to_owned())].expires_unix_nanos, 5);
        let before = c.clone();
        for (key, value) in [
            (meta::CATALOG_SEQ.to_vec(), b"seven".to_vec()),
            (meta::named(meta::BOUNDARY, "b"), b"{}".to_vec()),
            (meta::LEASE.to_vec(), b"{}".to_vec()),
            ([meta::INDEX, &[0, 0, 0, 1, 0xff]].concat(), b"{}".to_vec()),
        ] {
            let err = c.load_meta_row(&key, &value).expect_err("damaged row");
            assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        }
        assert_eq!(c, before, "a damaged row changes nothing");
    }
}
