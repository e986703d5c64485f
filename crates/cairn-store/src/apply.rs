//! Applying replicated commands: the deterministic heart of the store.

use std::collections::{HashMap, HashSet};

use cairn_core::auth::TOKEN_KEY_BYTES;
use cairn_core::boundary::{BoundaryInfo, BoundaryStatus};
use cairn_core::command::{Append, Applied, Command, Outcome, TokenKeyState};
use cairn_core::error::EventIdReuse;
use cairn_core::event::NewEvent;
use cairn_core::{Criterion, Error, Position, Query, Tag};
use rocksdb::{WriteBatch, WriteOptions};

use crate::catalog::{Catalog, Lease, encode_json};
use crate::keys::{self, meta};
use crate::planned::{RowCf, RowSink};
use crate::{CF_EVENT_IDS, CF_SM_META, Store, StoreError};

/// Catalog changes to publish once the batch holding them is durable in RocksDB.
type CatalogUpdate = Box<dyn FnOnce(&mut Catalog) + Send>;

impl Store {
    /// Applies one committed command and records `marker` (the Raft layer's applied state)
    /// in the same atomic batch. Must be called in log order by a single writer.
    ///
    /// The returned [`Outcome`] is the deterministic domain result (e.g. a CCC conflict);
    /// `Err` means storage failed and the node must stop applying.
    pub fn apply(&self, command: &Command, marker: &[u8]) -> Result<Outcome, StoreError> {
        let _writer = self.lock_writer();
        let mut batch = WriteBatch::default();
        let (outcome, update) = match self.plan(command, &mut batch) {
            Ok(planned) => planned,
            Err(Planned::Rejected(e)) => (Err(e), None),
            Err(Planned::Storage(e)) => return Err(e),
        };
        batch.put_cf(self.cf(CF_SM_META)?, meta::APPLIED, marker);
        self.write(batch)?;
        self.with_catalog_mut(|c| {
            c.applied_marker = Some(marker.to_vec());
            if let Some(update) = update {
                update(c);
            }
        });
        Ok(outcome)
    }

    /// Records `marker` for an entry that carries no command (blank, membership).
    pub fn apply_marker(&self, marker: &[u8]) -> Result<(), StoreError> {
        let _writer = self.lock_writer();
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_SM_META)?, meta::APPLIED, marker);
        self.write(batch)?;
        self.with_catalog_mut(|c| c.applied_marker = Some(marker.to_vec()));
        Ok(())
    }

    pub(crate) fn write(&self, batch: WriteBatch) -> Result<(), StoreError> {
        // Not in the WAL at all: the Raft log entry this batch applies is already durable,
        // and the applied marker travels in the same batch, so after a crash the log replays
        // exactly what the state machine lost (everything after the last flushed marker;
        // flushes are atomic across column families, and the log is only purged behind a
        // snapshot, whose checkpoint flushes first). Logging the state machine too would
        // write every event twice to the WAL and make every group fsync carry both copies.
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.inner.db.write_opt(batch, &opts)?;
        Ok(())
    }

    fn plan(
        &self,
        command: &Command,
        batch: &mut WriteBatch,
    ) -> Result<(Outcome, Option<CatalogUpdate>), Planned> {
        match command {
            Command::Append(append) => {
                let mut pending = Pending::default();
                let mut rows = self.batch_rows(batch)?;
                let outcome = self.plan_append(append, &mut rows, &mut pending)?;
                pending.write_tags(&mut rows);
                Ok((outcome, Some(pending.into_update())))
            }
            Command::CreateBoundary {
                name,
                description,
                placement,
                existed_before_catalog,
                idempotent_event_ids,
                if_absent,
            } => {
                if let Some(existing) = self.with_catalog(|c| c.boundaries.get(name).cloned()) {
                    return if *if_absent {
                        Ok((Ok(Applied::Boundary(existing)), None))
                    } else {
                        Err(Planned::Rejected(Error::AlreadyExists(format!(
                            "boundary \"{name}\" already exists"
                        ))))
                    };
                }
                let (seq, id) = self.with_catalog(|c| (c.catalog_seq, c.next_boundary_id));
                // Boundaries are ACTIVE as soon as their creation is applied: there is
                // nothing to provision beyond the catalog row. The catalog sequence gives
                // them stable positions, shaped like event positions (commit = prepare + 1).
                let position = Position::new(seq + 1, seq);
                let info = BoundaryInfo {
                    id,
                    name: name.clone(),
                    description: description.clone(),
                    placement: placement.clone(),
                    status: BoundaryStatus::Active,
                    existed_before_catalog: *existed_before_catalog,
                    last_error: String::new(),
                    definition_position: position,
                    status_position: position,
                    idempotent_event_ids: *idempotent_event_ids,
                };
                let meta_cf = self.cf(CF_SM_META)?;
                batch.put_cf(
                    meta_cf,
                    meta::named(meta::BOUNDARY, name),
                    encode_json(&info),
                );
                batch.put_cf(meta_cf, meta::CATALOG_SEQ, encode_json(&(seq + 1)));
                batch.put_cf(meta_cf, meta::NEXT_BOUNDARY_ID, encode_json(&(id + 1)));
                let stored = info.clone();
                Ok((
                    Ok(Applied::Boundary(info)),
                    Some(Box::new(move |c: &mut Catalog| {
                        c.catalog_seq = seq + 1;
                        c.next_boundary_id = id + 1;
                        c.heads.insert(id, 0);
                        c.boundaries.insert(stored.name.clone(), stored);
                    })),
                ))
            }
            Command::CreateIndex { boundary, index } => {
                let bid = self.active_boundary_id(boundary)?;
                let key = (bid, index.name.clone());
                match self.with_catalog(|c| c.indexes.get(&key).cloned()) {
                    Some(existing) if existing == *index => Ok((Ok(Applied::Done), None)),
                    Some(_) => Err(Planned::Rejected(Error::AlreadyExists(format!(
                        "index \"{}\" already exists in boundary \"{boundary}\" with a different definition",
                        index.name
                    )))),
                    None => {
                        batch.put_cf(
                            self.cf(CF_SM_META)?,
                            meta::scoped(meta::INDEX, bid, &index.name),
                            encode_json(index),
                        );
                        let index = index.clone();
                        Ok((
                            Ok(Applied::Done),
                            Some(Box::new(move |c: &mut Catalog| {
                                c.indexes.insert(key, index);
                            })),
                        ))
                    }
                }
            }
            Command::DropIndex { boundary, name } => {
                let bid = self.active_boundary_id(boundary)?;
                let key = (bid, name.clone());
                if !self.with_catalog(|c| c.indexes.contains_key(&key)) {
                    return Err(Planned::Rejected(Error::NotFound(format!(
                        "index \"{name}\" not found in boundary \"{boundary}\""
                    ))));
                }
                batch.delete_cf(self.cf(CF_SM_META)?, meta::scoped(meta::INDEX, bid, name));
                Ok((
                    Ok(Applied::Done),
                    Some(Box::new(move |c: &mut Catalog| {
                        c.indexes.remove(&key);
                    })),
                ))
            }
            Command::CreateUser { user, if_absent } => {
                if let Some(existing) =
                    self.with_catalog(|c| c.user_by_name(&user.username).cloned())
                {
                    return if *if_absent {
                        Ok((Ok(Applied::User(existing)), None))
                    } else {
                        Err(Planned::Rejected(Error::AlreadyExists(format!(
                            "user \"{}\" already exists",
                            user.username
                        ))))
                    };
                }
                batch.put_cf(
                    self.cf(CF_SM_META)?,
                    meta::named(meta::USER, &user.user_id),
                    encode_json(user),
                );
                let stored = user.clone();
                Ok((
                    Ok(Applied::User(user.clone())),
                    Some(Box::new(move |c: &mut Catalog| {
                        c.users.insert(stored.user_id.clone(), stored);
                    })),
                ))
            }
            Command::DeleteUser { user_id } => {
                if !self.with_catalog(|c| c.users.contains_key(user_id)) {
                    return Err(Planned::Rejected(Error::NotFound(format!(
                        "user \"{user_id}\" not found"
                    ))));
                }
                batch.delete_cf(self.cf(CF_SM_META)?, meta::named(meta::USER, user_id));
                let user_id = user_id.clone();
                Ok((
                    Ok(Applied::Done),
                    Some(Box::new(move |c: &mut Catalog| {
                        c.users.remove(&user_id);
                    })),
                ))
            }
            Command::SetPassword {
                user_id,
                password_hash,
                at_unix_nanos,
            } => {
                let Some(mut user) = self.with_catalog(|c| c.users.get(user_id).cloned()) else {
                    return Err(Planned::Rejected(Error::NotFound(format!(
                        "user \"{user_id}\" not found"
                    ))));
                };
                user.password_hash = password_hash.clone();
                user.updated_unix_nanos = *at_unix_nanos;
                user.credential_generation += 1;
                batch.put_cf(
                    self.cf(CF_SM_META)?,
                    meta::named(meta::USER, user_id),
                    encode_json(&user),
                );
                let stored = user.clone();
                Ok((
                    Ok(Applied::User(user)),
                    Some(Box::new(move |c: &mut Catalog| {
                        c.users.insert(stored.user_id.clone(), stored);
                    })),
                ))
            }
            Command::AcquireLease {
                boundary,
                subscriber,
                holder,
                at_unix_nanos,
                ttl_nanos,
            } => {
                let bid = self.active_boundary_id(boundary)?;
                let key = (bid, subscriber.clone());
                if let Some(lease) = self.with_catalog(|c| c.leases.get(&key).cloned()) {
                    // Expiry is judged against the leader's clock carried in the command, so
                    // every replica reaches the same verdict.
                    if lease.holder != *holder && lease.expires_unix_nanos > *at_unix_nanos {
                        return Err(Planned::Rejected(Error::AlreadyExists(format!(
                            "subscriber \"{subscriber}\" already has an open subscription on boundary \"{boundary}\""
                        ))));
                    }
                }
                let lease = Lease {
                    holder: holder.clone(),
                    expires_unix_nanos: at_unix_nanos.saturating_add(*ttl_nanos),
                };
                let meta_cf = self.cf(CF_SM_META)?;
                batch.put_cf(
                    meta_cf,
                    meta::scoped(meta::LEASE, bid, subscriber),
                    encode_json(&lease),
                );
                // Leases of holders that vanished without releasing (a node crashed) would
                // stay forever: each acquisition removes a few expired ones after its own,
                // judged by the same leader clock on every replica.
                let expired = self.with_catalog(|c| expired_leases_after(c, &key, *at_unix_nanos));
                for (bid, subscriber) in &expired {
                    batch.delete_cf(meta_cf, meta::scoped(meta::LEASE, *bid, subscriber));
                }
                Ok((
                    Ok(Applied::Done),
                    Some(Box::new(move |c: &mut Catalog| {
                        for expired in &expired {
                            c.leases.remove(expired);
                        }
                        c.leases.insert(key, lease);
                    })),
                ))
            }
            Command::ReleaseLease {
                boundary,
                subscriber,
                holder,
            } => {
                let Some(bid) = self.with_catalog(|c| c.boundaries.get(boundary).map(|b| b.id))
                else {
                    return Ok((Ok(Applied::Done), None));
                };
                let key = (bid, subscriber.clone());
                let held =
                    self.with_catalog(|c| c.leases.get(&key).is_some_and(|l| l.holder == *holder));
                if !held {
                    return Ok((Ok(Applied::Done), None));
                }
                batch.delete_cf(
                    self.cf(CF_SM_META)?,
                    meta::scoped(meta::LEASE, bid, subscriber),
                );
                Ok((
                    Ok(Applied::Done),
                    Some(Box::new(move |c: &mut Catalog| {
                        c.leases.remove(&key);
                    })),
                ))
            }
            Command::Batch(_) => Err(Planned::Rejected(Error::internal(
                "a batch is applied command by command, never as one command",
            ))),
            Command::Planned(_) => Err(Planned::Rejected(Error::internal(
                "planned appends are written with apply_rows, never applied as a command",
            ))),
            Command::InitTokenKey { key } => {
                if self.with_catalog(|c| c.token_key.is_some()) {
                    return Ok((Ok(Applied::Done), None));
                }
                batch.put_cf(self.cf(CF_SM_META)?, meta::TOKEN_KEY, key);
                let key = key.clone();
                Ok((
                    Ok(Applied::Done),
                    Some(Box::new(move |c: &mut Catalog| c.token_key = Some(key))),
                ))
            }
            Command::RotateTokenKey {
                key,
                grace_nanos,
                at_unix_nanos,
            } => {
                let Some((current, generation)) = self.with_catalog(|c| {
                    c.token_key
                        .clone()
                        .map(|k| (k, c.token_key_state.generation))
                }) else {
                    return Err(Planned::Rejected(Error::FailedPrecondition(
                        "the cluster has no session-token key to rotate yet".into(),
                    )));
                };
                if key.len() < TOKEN_KEY_BYTES {
                    return Err(Planned::Rejected(Error::InvalidArgument(format!(
                        "a session-token key needs at least {TOKEN_KEY_BYTES} bytes, got {}",
                        key.len()
                    ))));
                }
                let state = TokenKeyState {
                    generation: generation + 1,
                    rotated_unix_nanos: *at_unix_nanos,
                    previous_accepted_until_unix_nanos: at_unix_nanos
                        .saturating_add((*grace_nanos).max(0)),
                };
                let cf = self.cf(CF_SM_META)?;
                batch.put_cf(cf, meta::TOKEN_KEY, key);
                batch.put_cf(cf, meta::PREVIOUS_TOKEN_KEY, &current);
                batch.put_cf(cf, meta::TOKEN_KEY_STATE, encode_json(&state));
                let key = key.clone();
                Ok((
                    Ok(Applied::TokenKeyRotated(state.clone())),
                    Some(Box::new(move |c: &mut Catalog| {
                        c.token_key = Some(key);
                        c.previous_token_key = Some(current);
                        c.token_key_state = state;
                    })),
                ))
            }
        }
    }

    fn active_boundary_id(&self, name: &str) -> Result<u32, Planned> {
        self.active_boundary(name).map(|(bid, _)| bid)
    }

    /// Id of an active boundary and whether its event ids are idempotent (X1).
    fn active_boundary(&self, name: &str) -> Result<(u32, bool), Planned> {
        self.with_catalog(|c| {
            c.active_boundary(name)
                .map(|b| (b.id, b.idempotent_event_ids))
        })
        .ok_or_else(|| Planned::Rejected(Error::BoundaryNotActive(name.to_string())))
    }

    /// Applies a run of appends as ONE atomic RocksDB batch, with `marker`. Each append's
    /// consistency check sees the appends before it in the run (C3) through the in-memory
    /// overlay of what the batch adds; each gets its own outcome.
    pub fn apply_appends(
        &self,
        appends: &[&Append],
        marker: &[u8],
    ) -> Result<Vec<Outcome>, StoreError> {
        let _writer = self.lock_writer();
        let mut batch = WriteBatch::default();
        let mut pending = Pending {
            observed: self.observed_prefixes(appends),
            ..Pending::default()
        };
        let mut rows = self.batch_rows(&mut batch)?;
        let (outcomes, _) = self.plan_run(appends, &mut rows, &mut pending)?;
        batch.put_cf(self.cf(CF_SM_META)?, meta::APPLIED, marker);
        self.write(batch)?;
        let update = pending.into_update();
        self.with_catalog_mut(|c| {
            c.applied_marker = Some(marker.to_vec());
            update(c);
        });
        Ok(outcomes)
    }

    /// Plans each append of a run in turn on `pending` (each sees the ones before it), then
    /// the run's posting-list rows; returns each append's outcome and the rows as written.
    pub(crate) fn plan_run<'a>(
        &self,
        appends: &[&'a Append],
        rows: &mut impl RowSink,
        pending: &mut Pending<'a>,
    ) -> Result<(Vec<Outcome>, Vec<TagRow>), StoreError> {
        let mut outcomes = Vec::with_capacity(appends.len());
        for append in appends {
            match self.plan_append(append, rows, pending) {
                Ok(outcome) => outcomes.push(outcome),
                Err(Planned::Rejected(e)) => outcomes.push(Err(e)),
                Err(Planned::Storage(e)) => return Err(e),
            }
        }
        let tag_rows = pending.write_tags(rows);
        Ok((outcomes, tag_rows))
    }

    /// The posting lists that appends of a run check after the first one: only those can
    /// be looked up in the overlay, so only those are recorded there.
    pub(crate) fn observed_prefixes(&self, appends: &[&Append]) -> HashSet<Vec<u8>> {
        self.observed_prefixes_of(appends.get(1..).unwrap_or_default())
    }

    /// The posting lists any of `appends` checks.
    pub(crate) fn observed_prefixes_of(&self, appends: &[&Append]) -> HashSet<Vec<u8>> {
        let mut observed = HashSet::new();
        for append in appends {
            let Some(bid) = self.with_catalog(|c| c.boundaries.get(&append.boundary).map(|b| b.id))
            else {
                continue;
            };
            for obs in &append.observations {
                for criterion in &obs.query.criteria {
                    for tag in &criterion.tags {
                        observed.insert(keys::tag_prefix(bid, &tag.key, &tag.value));
                    }
                }
            }
        }
        observed
    }

    fn plan_append<'a>(
        &self,
        append: &'a Append,
        rows: &mut impl RowSink,
        pending: &mut Pending<'a>,
    ) -> Result<Outcome, Planned> {
        let (bid, idempotent_ids) = self.active_boundary(&append.boundary)?;
        if append.events.is_empty() {
            // Validated before proposing; kept so a malformed entry cannot underflow below.
            return Err(Planned::Rejected(Error::invalid("events is empty")));
        }
        // X1 before C2: an identical retry answers with its write's original result whatever
        // its observations say now (they held when that write committed).
        if idempotent_ids
            && let Some(last) =
                self.check_event_ids(&append.boundary, bid, &append.events, pending)?
        {
            return Ok(Ok(Applied::Appended { last }));
        }
        // C2: every observation must hold exactly. Earlier entries are already written and
        // earlier appends of this batch are in `pending`, so both count (C3); this append's
        // own events are not there yet, so they do not.
        for obs in &append.observations {
            let actual = match pending.latest(bid, &obs.query) {
                // Anything pending is newer than everything stored.
                Some(p) => p,
                None => self.latest_position(bid, &obs.query)?,
            };
            if actual != obs.position {
                return Err(Planned::Rejected(Error::Conflict {
                    expected: obs.position,
                    actual,
                }));
            }
        }
        let first = match pending.heads.get(&bid) {
            Some(head) => *head,
            None => self.with_catalog(|c| c.head(bid)),
        };
        let n = append.events.len() as u64;
        let commit = first + n;
        // The rows the previous event's tags went to, by tag index: consecutive events of a
        // write usually share most tags (their type, their context), and such an event joins
        // the row already started instead of building (and hashing, for long values) the
        // same posting-list prefix again.
        let mut previous: Vec<(&Tag, usize)> = Vec::new();
        let mut current: Vec<(&Tag, usize)> = Vec::new();
        for (i, event) in append.events.iter().enumerate() {
            let prepare = first + i as u64;
            rows.put(
                RowCf::Events,
                &keys::event_key(bid, prepare),
                &keys::encode_event(
                    commit,
                    append.at_unix_nanos,
                    &event.event_id,
                    &event.event_type,
                    &event.data,
                    &event.metadata,
                ),
            );
            current.clear();
            for (j, tag) in event.tags.iter().enumerate() {
                let shared = previous
                    .get(j)
                    .filter(|(t, _)| *t == tag)
                    .map(|(_, row)| *row);
                let row = match shared {
                    Some(row) => {
                        pending.tag_rows[row].later.push(prepare);
                        row
                    }
                    None => {
                        let mut key = keys::tag_prefix(bid, &tag.key, &tag.value);
                        let observed = pending.observed.contains(&key);
                        keys::push_prepare(&mut key, prepare);
                        pending.tag_rows.push(TagRow {
                            key,
                            first: prepare,
                            commit,
                            later: Vec::new(),
                            observed,
                        });
                        pending.tag_rows.len() - 1
                    }
                };
                let tag_row = &pending.tag_rows[row];
                if tag_row.observed {
                    let list = tag_row.list();
                    match pending.postings.get_mut(list) {
                        Some(postings) => postings.push((prepare, commit)),
                        None => {
                            pending
                                .postings
                                .insert(list.to_vec(), vec![(prepare, commit)]);
                        }
                    }
                }
                current.push((tag, row));
            }
            std::mem::swap(&mut previous, &mut current);
        }
        if idempotent_ids {
            for (i, event) in append.events.iter().enumerate() {
                let prepare = first + i as u64;
                rows.put(
                    RowCf::EventIds,
                    &keys::event_id_key(bid, &event.event_id),
                    &keys::encode_event_id_value(prepare),
                );
                pending.ids.insert(
                    (bid, event.event_id.as_str()),
                    PendingEvent {
                        prepare,
                        commit,
                        write_first: first,
                        event,
                    },
                );
            }
        }
        if !append.observations.is_empty() {
            rows.put(
                RowCf::Writes,
                &keys::write_key(bid, commit),
                &encode_json(&append.observations),
            );
        }
        pending.heads.insert(bid, commit);
        Ok(Ok(Applied::Appended {
            last: Position::of_event(commit - 1, commit),
        }))
    }

    /// X1: `Some(last)` when `events` repeat one committed write exactly (its result is
    /// the answer), `None` when no id is stored yet; any other reuse of a stored id, or an
    /// id twice in `events`, is a rejection.
    fn check_event_ids(
        &self,
        boundary: &str,
        bid: u32,
        events: &[NewEvent],
        pending: &Pending<'_>,
    ) -> Result<Option<Position>, Planned> {
        let mut seen = HashSet::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            if !seen.insert(event.event_id.as_str()) {
                return Err(Planned::Rejected(Error::invalid(format!(
                    "event {i}: event_id {:?} appears more than once in the write; boundary \
                     {boundary:?} has idempotent event ids, so an id names one event",
                    event.event_id
                ))));
            }
        }
        let mut found = Vec::with_capacity(events.len());
        for event in events {
            found.push(self.find_event_id(bid, &event.event_id, pending)?);
        }
        let Some((hit_index, hit)) = found
            .iter()
            .enumerate()
            .find_map(|(i, f)| f.as_ref().map(|f| (i, f)))
        else {
            return Ok(None);
        };
        let exists = |reason| {
            Planned::Rejected(Error::EventIdExists {
                boundary: boundary.to_string(),
                event_id: events[hit_index].event_id.clone(),
                position: Position::of_event(hit.prepare, hit.commit),
                reason,
            })
        };
        let found: Vec<&Found> = found.iter().flatten().collect();
        if found.len() < events.len() {
            return Err(exists(EventIdReuse::PartialOverlap));
        }
        let commit = found[0].commit;
        if found.iter().any(|f| f.commit != commit) {
            return Err(exists(EventIdReuse::SeveralWrites));
        }
        // The ids are distinct events of one write, all in [lowest, commit): they are that
        // whole write exactly when they fill the range and the range starts the write.
        let lowest = found
            .iter()
            .copied()
            .min_by_key(|f| f.prepare)
            .unwrap_or(found[0]);
        if lowest.prepare + events.len() as u64 != commit || !self.write_starts_at(bid, lowest)? {
            return Err(exists(EventIdReuse::PartialOverlap));
        }
        if found
            .iter()
            .enumerate()
            .any(|(i, f)| f.prepare != lowest.prepare + i as u64)
        {
            return Err(exists(EventIdReuse::Altered));
        }
        let same = events.iter().zip(&found).all(|(e, f)| {
            e.event_type == f.event_type && e.data == f.data && e.metadata == f.metadata
        });
        if !same {
            return Err(exists(EventIdReuse::Altered));
        }
        Ok(Some(Position::of_event(commit - 1, commit)))
    }

    /// The event with `event_id` in boundary `bid`, pending in this batch or stored.
    fn find_event_id(
        &self,
        bid: u32,
        event_id: &str,
        pending: &Pending<'_>,
    ) -> Result<Option<Found>, StoreError> {
        if let Some(p) = pending.ids.get(&(bid, event_id)) {
            return Ok(Some(Found {
                prepare: p.prepare,
                commit: p.commit,
                write_first: Some(p.write_first),
                event_type: p.event.event_type.clone(),
                data: p.event.data.clone(),
                metadata: p.event.metadata.clone(),
            }));
        }
        let key = keys::event_id_key(bid, event_id);
        let Some(value) = self.inner.db.get_cf(self.cf(CF_EVENT_IDS)?, key)? else {
            return Ok(None);
        };
        let prepare = keys::decode_event_id_value(&value)?;
        let stored = self.live_event(bid, prepare)?;
        Ok(Some(Found {
            prepare,
            commit: stored.position.commit as u64,
            write_first: None,
            event_type: stored.event_type,
            data: stored.data,
            metadata: stored.metadata,
        }))
    }

    /// Whether `found` is the first event of its write.
    fn write_starts_at(&self, bid: u32, found: &Found) -> Result<bool, StoreError> {
        if let Some(first) = found.write_first {
            return Ok(first == found.prepare);
        }
        // A stored event's whole write is stored, so its predecessor is too.
        Ok(match found.prepare.checked_sub(1) {
            None => true,
            Some(before) => self.live_position(bid, before)?.commit as u64 != found.commit,
        })
    }
}

/// An event found by its id (X1), with what an identical retry must repeat.
struct Found {
    prepare: u64,
    commit: u64,
    /// First prepare of its write, when known without a read (pending in this batch).
    write_first: Option<u64>,
    event_type: String,
    data: String,
    metadata: String,
}

/// An event of an idempotent boundary appended earlier in the same batch.
struct PendingEvent<'a> {
    prepare: u64,
    commit: u64,
    write_first: u64,
    event: &'a NewEvent,
}

/// What a batch of appends adds before it is written: heads, posting lists and event ids,
/// so later appends of the batch see earlier ones.
#[derive(Default)]
pub(crate) struct Pending<'a> {
    /// Next prepare position per boundary.
    pub(crate) heads: HashMap<u32, u64>,
    /// Posting lists some later append of the run observes (see
    /// [`Store::observed_prefixes`]); postings of any other list are not kept.
    pub(crate) observed: HashSet<Vec<u8>>,
    /// Posting-list rows to write, added to the batch in key order by [`Pending::write_tags`].
    tag_rows: Vec<TagRow>,
    /// Pending (prepare, commit) per posting list (keyed by its `tags` prefix, which names
    /// boundary, key and value and is computed for the RocksDB row anyway), ascending.
    pub(crate) postings: HashMap<Vec<u8>, Vec<(u64, u64)>>,
    /// Event ids appended to idempotent boundaries (X1), by boundary id.
    ids: HashMap<(u32, &'a str), PendingEvent<'a>>,
}

impl Pending<'_> {
    /// Newest pending position matching `query`, if any.
    fn latest(&self, bid: u32, query: &Query) -> Option<Position> {
        if self.postings.is_empty() {
            return None;
        }
        query
            .criteria
            .iter()
            .filter_map(|c| self.latest_of(bid, c))
            .max_by_key(|(prepare, _)| *prepare)
            .map(|(prepare, commit)| Position::of_event(prepare, commit))
    }

    fn latest_of(&self, bid: u32, criterion: &Criterion) -> Option<(u64, u64)> {
        let lists = criterion
            .tags
            .iter()
            .map(|t| self.postings.get(&keys::tag_prefix(bid, &t.key, &t.value)))
            .collect::<Option<Vec<_>>>()?;
        let shortest = lists.iter().min_by_key(|l| l.len())?;
        shortest.iter().rev().copied().find(|(prepare, _)| {
            lists
                .iter()
                .all(|l| l.binary_search_by_key(prepare, |(p, _)| *p).is_ok())
        })
    }

    /// Adds the posting-list rows to `batch` sorted by key, one row per list and write: the
    /// events of one write that share a tag are adjacent once sorted (a write's positions are
    /// contiguous and its rows share the commit), and become one row keyed by the first of
    /// them (see [`keys::encode_row`]). RocksDB's skiplist memtable reuses the previous
    /// insert's search path, so sorted rows are inserted far more cheaply than in event order,
    /// where each row starts a fresh search in a memtable of hundreds of thousands of rows.
    ///
    /// Rows of one list and write that were started separately (events sharing a tag with
    /// others in between) cover disjoint runs of ascending positions, so once sorted, their
    /// members follow one another in order.
    /// Writes the posting-list rows started so far, merging rows of one list and write
    /// that were started apart; returns them as written (sorted by key).
    fn write_tags(&mut self, sink: &mut impl RowSink) -> Vec<TagRow> {
        self.tag_rows.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let mut rows = self.tag_rows.drain(..).peekable();
        let mut written = Vec::with_capacity(rows.len());
        let mut value = Vec::new();
        while let Some(mut row) = rows.next() {
            while let Some(next) =
                rows.next_if(|next| next.commit == row.commit && next.list() == row.list())
            {
                row.later.push(next.first);
                row.later.extend_from_slice(&next.later);
            }
            keys::encode_row(row.first, row.commit, row.later.iter().copied(), &mut value);
            sink.put(RowCf::Tags, &row.key, &value);
            written.push(row);
        }
        written
    }

    fn into_update(self) -> CatalogUpdate {
        let heads = self.heads;
        Box::new(move |c: &mut Catalog| {
            for (bid, head) in heads {
                c.heads.insert(bid, head);
            }
        })
    }
}

/// A posting-list row being built: the events of one write that carry one tag.
#[derive(Debug)]
pub(crate) struct TagRow {
    /// The list's prefix followed by the first event's prepare position.
    pub(crate) key: Vec<u8>,
    pub(crate) first: u64,
    pub(crate) commit: u64,
    /// Further events of the write in the row, ascending.
    pub(crate) later: Vec<u64>,
    /// Whether a later append of the batch observes this list (see [`Pending::postings`]).
    observed: bool,
}

impl TagRow {
    /// The posting list's prefix (the key without the prepare position).
    pub(crate) fn list(&self) -> &[u8] {
        crate::posting_list_prefix(&self.key)
    }
}

/// Why planning stopped.
enum Planned {
    /// A deterministic domain rejection.
    Rejected(Error),
    /// Storage failed.
    Storage(StoreError),
}

impl From<StoreError> for Planned {
    fn from(e: StoreError) -> Self {
        Planned::Storage(e)
    }
}

/// Leases swept by one acquisition: deterministic, and little work per write.
const LEASES_SWEPT_PER_ACQUIRE: usize = 4;

/// Up to [`LEASES_SWEPT_PER_ACQUIRE`] leases expired at `now`, looked for among the ones
/// after `key` in key order (wrapping around), `key` itself excluded. Every replica holds
/// the same leases and the command carries the leader's clock, so all sweep the same ones.
fn expired_leases_after(catalog: &Catalog, key: &(u32, String), now: i64) -> Vec<(u32, String)> {
    use std::ops::Bound::{Excluded, Unbounded};
    catalog
        .leases
        .range((Excluded(key.clone()), Unbounded))
        .chain(catalog.leases.range(..key.clone()))
        .take(LEASES_SWEPT_PER_ACQUIRE)
        .filter(|(_, lease)| lease.expires_unix_nanos <= now)
        .map(|(k, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use cairn_core::event::RawEvent;

    use super::*;
    use crate::StoreOptions;

    fn event(id: &str, data: &str) -> NewEvent {
        let raw = RawEvent {
            event_id: id.into(),
            event_type: "T".into(),
            data: data.into(),
            metadata: String::new(),
        };
        NewEvent::validate(raw, 0).expect("valid event")
    }

    /// The rows of list `key=value` in boundary `bid`: (first prepare, members, commit).
    fn rows(store: &Store, bid: u32, key: &str, value: &str) -> Vec<(u64, Vec<u64>, u64)> {
        let prefix = keys::tag_prefix(bid, key, value);
        let cf = store.cf(crate::CF_TAGS).expect("cf");
        let mut out = Vec::new();
        let start = keys::with_prepare(&prefix, 0);
        let mode = rocksdb::IteratorMode::From(&start, rocksdb::Direction::Forward);
        for item in store.db().iterator_cf(cf, mode) {
            let (k, v) = item.expect("row");
            if !k.starts_with(&prefix) || k.len() != prefix.len() + keys::PREPARE_BYTES {
                break;
            }
            let first = keys::prepare_suffix(&k).expect("prepare");
            let mut members = Vec::new();
            let commit = keys::decode_row(first, &v, &mut members).expect("row");
            out.push((first, members, commit));
        }
        out
    }

    #[test]
    fn acquiring_a_lease_sweeps_expired_leases_of_vanished_holders() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path(), &StoreOptions::default()).expect("open");
        store
            .apply(
                &Command::CreateBoundary {
                    name: "b".into(),
                    description: String::new(),
                    placement: None,
                    existed_before_catalog: false,
                    idempotent_event_ids: false,
                    if_absent: false,
                },
                b"m",
            )
            .expect("create")
            .expect("created");
        let acquire = |subscriber: &str, at: i64| {
            store
                .apply(
                    &Command::AcquireLease {
                        boundary: "b".into(),
                        subscriber: subscriber.into(),
                        holder: format!("holder-of-{subscriber}"),
                        at_unix_nanos: at,
                        ttl_nanos: 10,
                    },
                    b"m",
                )
                .expect("apply")
                .expect("acquired");
        };
        // Ten holders that vanish (expire at 10 + their start), one that stays alive.
        for i in 0..10 {
            acquire(&format!("gone-{i}"), i);
        }
        acquire("live", 100);
        let names = |store: &Store| -> Vec<String> {
            store.with_catalog(|c| c.leases.keys().map(|(_, s)| s.clone()).collect())
        };
        // None had expired while the ten were taken; "live" (at 100) swept a few.
        assert_eq!(names(&store).len(), 11 - LEASES_SWEPT_PER_ACQUIRE);
        // Each renewal of "live" (expiring at 110) removes a few more, never its own.
        for renewal in 0..3 {
            acquire("live", 100 + renewal);
        }
        let left = names(&store);
        assert_eq!(left, vec!["live".to_string()], "all expired leases swept");
        // Swept from disk too: a reopened store loads the same leases.
        drop(store);
        let reopened = Store::open(dir.path(), &StoreOptions::default()).expect("reopen");
        assert_eq!(names(&reopened), left);
    }

    #[test]
    fn a_rotated_token_key_keeps_only_the_key_it_replaced_and_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path(), &StoreOptions::default()).expect("open");
        let rotate = |store: &Store, key: u8, at: i64| {
            store
                .apply(
                    &Command::RotateTokenKey {
                        key: vec![key; TOKEN_KEY_BYTES],
                        grace_nanos: 10,
                        at_unix_nanos: at,
                    },
                    b"m",
                )
                .expect("apply")
        };
        assert!(
            matches!(rotate(&store, 2, 5), Err(Error::FailedPrecondition(_))),
            "nothing to rotate before the first start's key"
        );
        store
            .apply(&Command::InitTokenKey { key: vec![1; 32] }, b"m")
            .expect("apply")
            .expect("installed");
        let short = store
            .apply(
                &Command::RotateTokenKey {
                    key: vec![9; 16],
                    grace_nanos: 0,
                    at_unix_nanos: 1,
                },
                b"m",
            )
            .expect("apply");
        assert!(matches!(short, Err(Error::InvalidArgument(_))), "{short:?}");
        let keys = |store: &Store| {
            store.with_catalog(|c| {
                (
                    c.token_key.clone(),
                    c.previous_token_key.clone(),
                    c.token_key_state.clone(),
                )
            })
        };
        assert_eq!(
            keys(&store),
            (Some(vec![1; 32]), None, TokenKeyState::default())
        );
        let first = TokenKeyState {
            generation: 1,
            rotated_unix_nanos: 100,
            previous_accepted_until_unix_nanos: 110,
        };
        assert_eq!(rotate(&store, 2, 100), Ok(Applied::TokenKeyRotated(first)));
        let second = TokenKeyState {
            generation: 2,
            rotated_unix_nanos: 200,
            previous_accepted_until_unix_nanos: 210,
        };
        assert_eq!(
            rotate(&store, 3, 200),
            Ok(Applied::TokenKeyRotated(second.clone()))
        );
        let expected = (Some(vec![3; 32]), Some(vec![2; 32]), second);
        assert_eq!(keys(&store), expected, "the first key is forgotten");
        drop(store);
        let reopened = Store::open(dir.path(), &StoreOptions::default()).expect("reopen");
        assert_eq!(keys(&reopened), expected);
    }

    #[test]
    fn events_of_a_write_sharing_a_tag_make_one_row_wherever_they_stand() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path(), &StoreOptions::default()).expect("open");
        let created = store
            .apply(
                &Command::CreateBoundary {
                    name: "b".into(),
                    description: String::new(),
                    placement: None,
                    existed_before_catalog: false,
                    idempotent_event_ids: false,
                    if_absent: false,
                },
                b"m",
            )
            .expect("create");
        let Ok(Applied::Boundary(info)) = created else {
            panic!("boundary not created: {created:?}");
        };
        // "ctx":"a" on events 0, 1, 3 and 4 (two runs, interrupted by event 2); event 3 also
        // carries one more tag before "ctx", so its tags no longer line up with event 2's.
        let long = "v".repeat(200);
        let events = vec![
            event("0", &format!(r#"{{"ctx":"a","long":"{long}"}}"#)),
            event("1", &format!(r#"{{"ctx":"a","long":"{long}"}}"#)),
            event("2", &format!(r#"{{"ctx":"b","long":"{long}"}}"#)),
            event("3", &format!(r#"{{"aa":1,"ctx":"a","long":"{long}"}}"#)),
            event("4", &format!(r#"{{"ctx":"a","long":"{long}"}}"#)),
        ];
        let append = Append {
            boundary: "b".into(),
            observations: vec![],
            events,
            at_unix_nanos: 1,
        };
        let outcome = store.apply(&Command::Append(append), b"m").expect("apply");
        assert_eq!(
            outcome,
            Ok(Applied::Appended {
                last: Position::of_event(4, 5)
            })
        );
        let bid = info.id;
        assert_eq!(
            rows(&store, bid, "ctx", "a"),
            vec![(0, vec![0, 1, 3, 4], 5)]
        );
        assert_eq!(rows(&store, bid, "ctx", "b"), vec![(2, vec![2], 5)]);
        assert_eq!(
            rows(&store, bid, "long", &long),
            vec![(0, vec![0, 1, 2, 3, 4], 5)]
        );
        assert_eq!(
            rows(&store, bid, "eventType", "T"),
            vec![(0, vec![0, 1, 2, 3, 4], 5)]
        );
        assert_eq!(rows(&store, bid, "aa", "1"), vec![(3, vec![3], 5)]);
    }
}
