//! Reads: positions, filtered pages, latest-by-criteria, write contexts.
//!
//! Every criterion is answered from the `tags` posting lists by a leapfrog cursor
//! ([`crate::posting`]). A query (OR) is the max (latest) or a k-way merge (pages) of its
//! criteria.

use cairn_core::event::StoredEvent;
use cairn_core::{Criterion, Observation, Position, Query};
use std::sync::RwLockReadGuard;

use rocksdb::{DB, ReadOptions, SnapshotWithThreadMode};

use crate::catalog::decode_json;
use crate::keys;
use crate::posting::{CriterionCursor, Posting};
use crate::{CF_EVENT_IDS, CF_EVENTS, CF_TAGS, CF_WRITES, Store, StoreError};

/// Read direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Oldest first.
    Asc,
    /// Newest first.
    Desc,
}

/// Where a page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStart {
    /// The oldest event (ASC) or the newest (DESC).
    Edge,
    /// At or after (ASC) / at or before (DESC) a position (G1).
    Inclusive(Position),
    /// Strictly after a position (ASC only: subscriptions, S2).
    After(Position),
    /// At or after a prepare position (ASC only: subscription cursors).
    Prepare(u64),
}

/// A RocksDB snapshot taken and read with the read gate open (see [`Store::read_gate`]):
/// an install cannot start while it is read, so the files an install drops never vanish
/// from under it.
struct Consistent<'a> {
    snapshot: SnapshotWithThreadMode<'a, DB>,
    _gate: RwLockReadGuard<'a, Option<String>>,
}

/// A consistent view of one boundary: a RocksDB snapshot, or the live DB for the writer.
struct View<'a> {
    db: &'a DB,
    snapshot: Option<&'a SnapshotWithThreadMode<'a, DB>>,
    bid: u32,
    store: &'a Store,
}

impl<'a> View<'a> {
    fn read_opts(&self) -> ReadOptions {
        let mut opts = ReadOptions::default();
        if let Some(s) = self.snapshot {
            opts.set_snapshot(s);
        }
        opts
    }

    fn posting(&self, key: &str, value: &str) -> Result<Posting<'a>, StoreError> {
        let prefix = keys::tag_prefix(self.bid, key, value);
        Ok(Posting::open(
            self.db,
            self.store.cf(CF_TAGS)?,
            self.read_opts(),
            prefix,
        ))
    }

    fn cursor(&self, criterion: &Criterion) -> Result<CriterionCursor<'a>, StoreError> {
        let lists = criterion
            .tags
            .iter()
            .map(|t| self.posting(&t.key, &t.value))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CriterionCursor { lists })
    }

    fn get_event_raw(&self, prepare: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let cf = self.store.cf(CF_EVENTS)?;
        Ok(self
            .db
            .get_cf_opt(cf, keys::event_key(self.bid, prepare), &self.read_opts())?)
    }

    fn event(&self, prepare: u64) -> Result<StoredEvent, StoreError> {
        let raw = self.get_event_raw(prepare)?.ok_or_else(|| {
            StoreError::corrupt("events", &format!("event {prepare} is indexed but missing"))
        })?;
        keys::decode_event(prepare, &raw)
    }

    fn position_of(&self, prepare: u64) -> Result<Position, StoreError> {
        let raw = self.get_event_raw(prepare)?.ok_or_else(|| {
            StoreError::corrupt(
                "events",
                &format!("event {prepare} is below the head but missing"),
            )
        })?;
        Ok(Position::of_event(
            prepare,
            keys::commit_of_event_value(&raw)?,
        ))
    }

    /// Number of events visible in this view.
    fn head(&self) -> Result<u64, StoreError> {
        let cf = self.store.cf(CF_EVENTS)?;
        let mut it = self.db.raw_iterator_cf_opt(cf, self.read_opts());
        it.seek_for_prev(keys::event_key(self.bid, u64::MAX));
        match it.key() {
            Some(k) if k.starts_with(&self.bid.to_be_bytes()) => {
                Ok(keys::prepare_of_event_key(k)? + 1)
            }
            _ => {
                it.status()?;
                Ok(0)
            }
        }
    }

    /// First prepare in `[0, head)` whose position satisfies `!below(pos)`; positions grow
    /// with prepare, so this is a binary search over point reads.
    fn partition_point(
        &self,
        head: u64,
        below: impl Fn(Position) -> bool,
    ) -> Result<u64, StoreError> {
        let (mut lo, mut hi) = (0u64, head);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if below(self.position_of(mid)?) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// First prepare whose position is ≥ `pos` (or `head` if none).
    fn first_at_or_after(&self, head: u64, pos: Position) -> Result<u64, StoreError> {
        if pos.commit < 1 {
            return Ok(0);
        }
        // Fast path: `pos` is an event's own position.
        if pos.prepare >= 0 && (pos.prepare as u64) < head {
            let p = pos.prepare as u64;
            if self.position_of(p)? == pos {
                return Ok(p);
            }
        }
        // Every event at prepare ≥ commit has a commit > `pos.commit`: search below it.
        let bound = head.min(pos.commit as u64);
        let q = self.partition_point(bound, |p| p < pos)?;
        Ok(if q < bound { q } else { bound })
    }

    /// First prepare whose position is > `pos` (or `head` if none).
    fn first_after(&self, head: u64, pos: Position) -> Result<u64, StoreError> {
        if pos.commit < 1 {
            return Ok(0);
        }
        if pos.prepare >= 0 && (pos.prepare as u64) < head {
            let p = pos.prepare as u64;
            if self.position_of(p)? == pos {
                return Ok(p + 1);
            }
        }
        let bound = head.min(pos.commit as u64);
        let q = self.partition_point(bound, |p| p <= pos)?;
        Ok(if q < bound { q } else { bound })
    }

    /// Newest (prepare, commit) matching `query` below `head` (empty query: newest event).
    fn latest(&self, head: u64, query: &Query) -> Result<Option<(u64, u64)>, StoreError> {
        if head == 0 {
            return Ok(None);
        }
        if query.criteria.is_empty() {
            let p = self.position_of(head - 1)?;
            return Ok(Some((head - 1, p.commit as u64)));
        }
        let mut best: Option<(u64, u64)> = None;
        for criterion in &query.criteria {
            if let Some(found) = self.cursor(criterion)?.latest_at_or_before(head - 1)?
                && best.is_none_or(|b| found.0 > b.0)
            {
                best = Some(found);
            }
        }
        Ok(best)
    }

    /// A page of events matching `query`, from prepare `start` in `direction`: `count`
    /// events, or fewer once they reach `max_bytes` (never fewer than one).
    fn page(
        &self,
        query: &Query,
        start: Option<u64>,
        head: u64,
        direction: Direction,
        limit: PageLimit,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut out = PageBuilder::new(limit);
        let Some(start) = start else {
            return Ok(out.events);
        };
        if query.criteria.is_empty() {
            return self.scan(start, head, direction, limit);
        }
        let mut cursors = query
            .criteria
            .iter()
            .map(|c| self.cursor(c))
            .collect::<Result<Vec<_>, _>>()?;
        match direction {
            Direction::Asc => {
                let mut next = start;
                while !out.is_full() && next < head {
                    let mut best: Option<u64> = None;
                    for c in &mut cursors {
                        if let Some((p, _)) = c.first_at_or_after(next)?
                            && p < head
                            && best.is_none_or(|b| p < b)
                        {
                            best = Some(p);
                        }
                    }
                    let Some(p) = best else { break };
                    out.push(self.event(p)?);
                    next = p + 1;
                }
            }
            Direction::Desc => {
                let mut next = Some(start.min(head.saturating_sub(1)));
                if head == 0 {
                    next = None;
                }
                while let Some(upper) = next {
                    if out.is_full() {
                        break;
                    }
                    let mut best: Option<u64> = None;
                    for c in &mut cursors {
                        if let Some((p, _)) = c.latest_at_or_before(upper)?
                            && best.is_none_or(|b| p > b)
                        {
                            best = Some(p);
                        }
                    }
                    let Some(p) = best else { break };
                    out.push(self.event(p)?);
                    next = p.checked_sub(1);
                }
            }
        }
        Ok(out.events)
    }

    fn scan(
        &self,
        start: u64,
        head: u64,
        direction: Direction,
        limit: PageLimit,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let cf = self.store.cf(CF_EVENTS)?;
        let mut opts = self.read_opts();
        opts.set_iterate_lower_bound(keys::event_key(self.bid, 0).to_vec());
        opts.set_iterate_upper_bound(keys::event_key(self.bid, head).to_vec());
        let mut it = self.db.raw_iterator_cf_opt(cf, opts);
        let mut out = PageBuilder::new(limit);
        match direction {
            Direction::Asc => it.seek(keys::event_key(self.bid, start)),
            Direction::Desc => it.seek_for_prev(keys::event_key(self.bid, start)),
        }
        while !out.is_full() {
            let Some((k, v)) = it.item() else {
                it.status()?;
                break;
            };
            out.push(keys::decode_event(keys::prepare_of_event_key(k)?, v)?);
            match direction {
                Direction::Asc => it.next(),
                Direction::Desc => it.prev(),
            }
        }
        Ok(out.events)
    }
}

/// How much one page may hold: `events` events, and no more once their size reaches
/// `bytes` (a page always has room for its first event, however large).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit {
    /// Events.
    pub events: usize,
    /// Bytes of event text (id, type, data, metadata).
    pub bytes: usize,
}

impl PageLimit {
    /// At most `events` events, whatever their size.
    pub fn events(events: usize) -> Self {
        PageLimit {
            events,
            bytes: usize::MAX,
        }
    }
}

/// A page being filled up to its [`PageLimit`].
struct PageBuilder {
    events: Vec<StoredEvent>,
    bytes: usize,
    limit: PageLimit,
}

impl PageBuilder {
    fn new(limit: PageLimit) -> Self {
        PageBuilder {
            events: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    fn is_full(&self) -> bool {
        self.events.len() >= self.limit.events || self.bytes >= self.limit.bytes
    }

    fn push(&mut self, event: StoredEvent) {
        self.bytes = self.bytes.saturating_add(event_bytes(&event));
        self.events.push(event);
    }
}

/// The size a page counts for an event.
pub fn event_bytes(event: &StoredEvent) -> usize {
    event.event_id.len() + event.event_type.len() + event.data.len() + event.metadata.len()
}

impl Store {
    fn live_view(&self, bid: u32) -> View<'_> {
        View {
            db: &self.inner.db,
            snapshot: None,
            bid,
            store: self,
        }
    }

    /// The stored event at `prepare` on the live state (the writer's view), for an index
    /// that points at it.
    pub(crate) fn live_event(&self, bid: u32, prepare: u64) -> Result<StoredEvent, StoreError> {
        self.live_view(bid).event(prepare)
    }

    /// The position of the stored event at `prepare`, below the head, on the live state.
    pub(crate) fn live_position(&self, bid: u32, prepare: u64) -> Result<Position, StoreError> {
        self.live_view(bid).position_of(prepare)
    }

    /// `L(Q)` of the CCC rule (C2) on the live state: the greatest committed position
    /// matching `query`, or `(-1,-1)`. Used by the single writer during apply.
    pub(crate) fn latest_position(&self, bid: u32, query: &Query) -> Result<Position, StoreError> {
        let head = self.with_catalog(|c| c.head(bid));
        let view = self.live_view(bid);
        Ok(match view.latest(head, query)? {
            Some((p, c)) => Position::of_event(p, c),
            None => Position::NONE,
        })
    }

    /// Greatest position matching `query` in a consistent snapshot, or `(-1,-1)`.
    pub fn query_position(&self, bid: u32, query: &Query) -> Result<Position, StoreError> {
        let consistent = self.consistent()?;
        let snapshot = &consistent.snapshot;
        let view = self.snapshot_view(snapshot, bid);
        let head = view.head()?;
        Ok(match view.latest(head, query)? {
            Some((p, c)) => Position::of_event(p, c),
            None => Position::NONE,
        })
    }

    fn consistent(&self) -> Result<Consistent<'_>, StoreError> {
        let gate = self.read_gate()?;
        Ok(Consistent {
            snapshot: self.inner.db.snapshot(),
            _gate: gate,
        })
    }

    fn snapshot_view<'a>(
        &'a self,
        snapshot: &'a SnapshotWithThreadMode<'a, DB>,
        bid: u32,
    ) -> View<'a> {
        View {
            db: &self.inner.db,
            snapshot: Some(snapshot),
            bid,
            store: self,
        }
    }

    /// A page of events of boundary `bid` matching `query` (G1, S2), within `limit`.
    pub fn read_events(
        &self,
        bid: u32,
        query: &Query,
        start: ReadStart,
        direction: Direction,
        limit: PageLimit,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        Ok(self.read_with_head(bid, query, start, direction, limit)?.0)
    }

    /// An ascending page for a subscription, and the prepare position to continue from:
    /// after the last event if the page is full (by count or bytes), else the head of the
    /// snapshot read (every event below it has been considered, matching or not).
    pub fn read_page(
        &self,
        bid: u32,
        query: &Query,
        start: ReadStart,
        limit: PageLimit,
    ) -> Result<(Vec<StoredEvent>, u64), StoreError> {
        let (events, head) = self.read_with_head(bid, query, start, Direction::Asc, limit)?;
        let bytes: usize = events.iter().map(event_bytes).sum();
        let next = match events.last() {
            Some(last) if events.len() >= limit.events || bytes >= limit.bytes => {
                last.position.prepare as u64 + 1
            }
            _ => head,
        };
        Ok((events, next))
    }

    /// Where a subscription without `after_position` starts (S2): at the newest event
    /// matching `query`, or at the head when nothing matches yet. One snapshot.
    pub fn newest_match_cursor(&self, bid: u32, query: &Query) -> Result<u64, StoreError> {
        let consistent = self.consistent()?;
        let snapshot = &consistent.snapshot;
        let view = self.snapshot_view(snapshot, bid);
        let head = view.head()?;
        Ok(match view.latest(head, query)? {
            Some((prepare, _)) => prepare,
            None => head,
        })
    }

    fn read_with_head(
        &self,
        bid: u32,
        query: &Query,
        start: ReadStart,
        direction: Direction,
        limit: PageLimit,
    ) -> Result<(Vec<StoredEvent>, u64), StoreError> {
        let consistent = self.consistent()?;
        let snapshot = &consistent.snapshot;
        let view = self.snapshot_view(snapshot, bid);
        let head = view.head()?;
        let start = match (start, direction) {
            (ReadStart::Edge, Direction::Asc) => Some(0),
            (ReadStart::Edge, Direction::Desc) => head.checked_sub(1),
            (ReadStart::Inclusive(pos), Direction::Asc) => Some(view.first_at_or_after(head, pos)?),
            (ReadStart::Inclusive(pos), Direction::Desc) => {
                view.first_after(head, pos)?.checked_sub(1)
            }
            (ReadStart::After(pos), Direction::Asc) => Some(view.first_after(head, pos)?),
            (ReadStart::After(pos), Direction::Desc) => {
                view.first_at_or_after(head, pos)?.checked_sub(1)
            }
            (ReadStart::Prepare(p), Direction::Asc) => Some(p),
            (ReadStart::Prepare(p), Direction::Desc) => Some(p),
        };
        Ok((view.page(query, start, head, direction, limit)?, head))
    }

    /// The newest event per criterion, all from one snapshot (G2), and the context
    /// position: the max of the found positions or `(-1,-1)`.
    pub fn latest_by_criteria(
        &self,
        bid: u32,
        criteria: &[Criterion],
    ) -> Result<(Vec<Option<StoredEvent>>, Position), StoreError> {
        let consistent = self.consistent()?;
        let snapshot = &consistent.snapshot;
        let view = self.snapshot_view(snapshot, bid);
        let head = view.head()?;
        let mut context = Position::NONE;
        let mut results = Vec::with_capacity(criteria.len());
        for criterion in criteria {
            let found = if head == 0 {
                None
            } else {
                view.cursor(criterion)?.latest_at_or_before(head - 1)?
            };
            match found {
                Some((p, _)) => {
                    let event = view.event(p)?;
                    context = context.max(event.position);
                    results.push(Some(event));
                }
                None => results.push(None),
            }
        }
        Ok((results, context))
    }

    /// The normalised observations a write committed with (C7): `None` when no write ends
    /// at `last` (its last event's position), `Some(vec![])` for unconditional writes.
    pub fn write_context(
        &self,
        bid: u32,
        last: Position,
    ) -> Result<Option<Vec<Observation>>, StoreError> {
        // The write id is the client's: `0:9223372036854775807` must not overflow.
        if last.prepare < 0 || last.prepare.checked_add(1) != Some(last.commit) {
            return Ok(None);
        }
        let consistent = self.consistent()?;
        let snapshot = &consistent.snapshot;
        let view = self.snapshot_view(snapshot, bid);
        match view.get_event_raw(last.prepare as u64)? {
            Some(raw) if keys::commit_of_event_value(&raw)? == last.commit as u64 => {}
            _ => return Ok(None),
        }
        let key = keys::write_key(bid, last.commit as u64);
        let mut opts = ReadOptions::default();
        opts.set_snapshot(snapshot);
        match self.inner.db.get_cf_opt(self.cf(CF_WRITES)?, key, &opts)? {
            Some(bytes) => Ok(Some(decode_json("write context", &bytes)?)),
            None => Ok(Some(Vec::new())),
        }
    }

    /// Number of events in a boundary.
    pub fn event_count(&self, bid: u32) -> u64 {
        self.with_catalog(|c| c.head(bid))
    }

    /// The idempotent-id index of boundary `bid` (X1): every indexed event id with the
    /// position of its event, in id order. Empty for a boundary without the option. For
    /// checks that replicas agree and for offline inspection; it reads the whole index.
    pub fn event_id_index(&self, bid: u32) -> Result<Vec<(String, Position)>, StoreError> {
        let _gate = self.read_gate()?;
        let cf = self.cf(CF_EVENT_IDS)?;
        let prefix = bid.to_be_bytes();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(keys::event_id_key(bid, "").to_vec());
        if let Some(next) = bid.checked_add(1) {
            opts.set_iterate_upper_bound(keys::event_id_key(next, "").to_vec());
        }
        let mut it = self.inner.db.raw_iterator_cf_opt(cf, opts);
        it.seek(prefix);
        let mut out = Vec::new();
        while let Some((key, value)) = it.item() {
            let id = std::str::from_utf8(&key[prefix.len()..])
                .map_err(|_| StoreError::corrupt("event_ids", "an id is not UTF-8"))?;
            let prepare = keys::decode_event_id_value(value)?;
            out.push((id.to_string(), self.live_position(bid, prepare)?));
            it.next();
        }
        it.status()?;
        Ok(out)
    }
}
