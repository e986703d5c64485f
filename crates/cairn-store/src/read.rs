//! Reads: positions, filtered pages, latest-by-criteria, write contexts.
//!
//! Every criterion is answered from the `tags` posting lists. A criterion (AND of tags) is a
//! leapfrog intersection: seek each tag's list to the current candidate; a list that lands
//! elsewhere moves the candidate; when all lists agree, the candidate matches. Backwards
//! (seek_for_prev) it finds the newest match, forwards (seek) the next one. A query (OR) is
//! the max (latest) or a k-way merge (pages) of its criteria.

use cairn_core::event::StoredEvent;
use cairn_core::{Criterion, Observation, Position, Query};
use rocksdb::{DB, DBRawIterator, ReadOptions, SnapshotWithThreadMode};

use crate::catalog::decode_json;
use crate::keys;
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

/// One tag's posting list, positioned by seeks. A row holds the events of one write that
/// carry the tag (see `keys::encode_row`); the row under the iterator is kept decoded, so
/// successive lookups inside it, or in the row next to it, need no new seek.
struct Posting<'a> {
    prefix: Vec<u8>,
    it: DBRawIterator<'a>,
    /// Members (ascending) of the row under the iterator; empty when it is on none.
    members: Vec<u64>,
    /// Commit position of that row's write.
    commit: u64,
}

impl Posting<'_> {
    /// Greatest prepare ≤ `at` in this list.
    fn at_or_before(&mut self, at: u64) -> Result<Option<(u64, u64)>, StoreError> {
        if !self.row_spans(at) {
            let stepped_back = match self.members.first() {
                // Scanning newest-first: the answer is often in the previous row.
                Some(&first) if at < first => {
                    self.it.prev();
                    self.load()? && self.members[0] <= at
                }
                _ => false,
            };
            if !stepped_back {
                self.it.seek_for_prev(keys::with_prepare(&self.prefix, at));
                if !self.load()? {
                    return Ok(None);
                }
            }
        }
        // The row starts at or before `at`, so some member qualifies.
        Ok(self
            .members
            .iter()
            .rev()
            .find(|m| **m <= at)
            .map(|m| (*m, self.commit)))
    }

    /// Smallest prepare ≥ `at` in this list.
    fn at_or_after(&mut self, at: u64) -> Result<Option<(u64, u64)>, StoreError> {
        if self.row_spans(at) {
            return Ok(self.first_member_from(at));
        }
        if self.members.last().is_some_and(|last| *last < at) {
            // Scanning oldest-first: the answer is often the next row's first member.
            self.it.next();
            if !self.load()? {
                return Ok(None);
            }
            if self.members[0] >= at {
                return Ok(Some((self.members[0], self.commit)));
            }
        }
        // The row starting at or before `at` may still reach it; if not, the next row does.
        self.it.seek_for_prev(keys::with_prepare(&self.prefix, at));
        if self.load()? {
            if self.members.last().is_some_and(|last| *last >= at) {
                return Ok(self.first_member_from(at));
            }
            self.it.next();
        } else {
            self.it.seek(keys::with_prepare(&self.prefix, at));
        }
        Ok(self.load()?.then(|| (self.members[0], self.commit)))
    }

    /// Whether the decoded row has members on both sides of (or at) `at`.
    fn row_spans(&self, at: u64) -> bool {
        match (self.members.first(), self.members.last()) {
            (Some(first), Some(last)) => *first <= at && at <= *last,
            _ => false,
        }
    }

    fn first_member_from(&self, at: u64) -> Option<(u64, u64)> {
        self.members
            .iter()
            .find(|m| **m >= at)
            .map(|m| (*m, self.commit))
    }

    /// Decodes the row under the iterator; false (and no row) when it is outside this list.
    fn load(&mut self) -> Result<bool, StoreError> {
        match self.it.item() {
            Some((k, v))
                if k.starts_with(&self.prefix)
                    && k.len() == self.prefix.len() + keys::PREPARE_BYTES =>
            {
                let first = keys::prepare_suffix(k)?;
                self.commit = keys::decode_row(first, v, &mut self.members)?;
                Ok(true)
            }
            _ => {
                self.members.clear();
                self.it.status()?;
                Ok(false)
            }
        }
    }
}

/// Leapfrog cursor over one criterion.
struct CriterionCursor<'a> {
    lists: Vec<Posting<'a>>,
}

impl CriterionCursor<'_> {
    /// Newest (prepare, commit) ≤ `upper` matching every tag.
    fn latest_at_or_before(&mut self, upper: u64) -> Result<Option<(u64, u64)>, StoreError> {
        let n = self.lists.len();
        let (mut candidate, mut agree, mut i) = (upper, 0usize, 0usize);
        loop {
            let Some((p, commit)) = self.lists[i].at_or_before(candidate)? else {
                return Ok(None);
            };
            if p == candidate {
                agree += 1;
            } else {
                candidate = p;
                agree = 1;
            }
            if agree == n {
                return Ok(Some((candidate, commit)));
            }
            i = (i + 1) % n;
        }
    }

    /// Oldest (prepare, commit) ≥ `lower` matching every tag.
    fn first_at_or_after(&mut self, lower: u64) -> Result<Option<(u64, u64)>, StoreError> {
        let n = self.lists.len();
        let (mut candidate, mut agree, mut i) = (lower, 0usize, 0usize);
        loop {
            let Some((p, commit)) = self.lists[i].at_or_after(candidate)? else {
                return Ok(None);
            };
            if p == candidate {
                agree += 1;
            } else {
                candidate = p;
                agree = 1;
            }
            if agree == n {
                return Ok(Some((candidate, commit)));
            }
            i = (i + 1) % n;
        }
    }
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
        let mut opts = self.read_opts();
        opts.set_iterate_lower_bound(prefix.clone());
        let mut upper = prefix.clone();
        upper.extend_from_slice(&[0xff; 9]);
        opts.set_iterate_upper_bound(upper);
        opts.set_prefix_same_as_start(true);
        let it = self.db.raw_iterator_cf_opt(self.store.cf(CF_TAGS)?, opts);
        Ok(Posting {
            prefix,
            it,
            members: Vec::new(),
            commit: 0,
        })
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

    /// A page of events matching `query`, from prepare `start` in `direction`.
    fn page(
        &self,
        query: &Query,
        start: Option<u64>,
        head: u64,
        direction: Direction,
        count: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut out = Vec::new();
        let Some(start) = start else { return Ok(out) };
        if query.criteria.is_empty() {
            return self.scan(start, head, direction, count);
        }
        let mut cursors = query
            .criteria
            .iter()
            .map(|c| self.cursor(c))
            .collect::<Result<Vec<_>, _>>()?;
        match direction {
            Direction::Asc => {
                let mut next = start;
                while out.len() < count && next < head {
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
                    if out.len() >= count {
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
        Ok(out)
    }

    fn scan(
        &self,
        start: u64,
        head: u64,
        direction: Direction,
        count: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let cf = self.store.cf(CF_EVENTS)?;
        let mut opts = self.read_opts();
        opts.set_iterate_lower_bound(keys::event_key(self.bid, 0).to_vec());
        opts.set_iterate_upper_bound(keys::event_key(self.bid, head).to_vec());
        let mut it = self.db.raw_iterator_cf_opt(cf, opts);
        let mut out = Vec::new();
        match direction {
            Direction::Asc => it.seek(keys::event_key(self.bid, start)),
            Direction::Desc => it.seek_for_prev(keys::event_key(self.bid, start)),
        }
        while out.len() < count {
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
        Ok(out)
    }
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
        let snapshot = self.inner.db.snapshot();
        let view = self.snapshot_view(&snapshot, bid);
        let head = view.head()?;
        Ok(match view.latest(head, query)? {
            Some((p, c)) => Position::of_event(p, c),
            None => Position::NONE,
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

    /// A page of events of boundary `bid` matching `query` (G1, S2).
    pub fn read_events(
        &self,
        bid: u32,
        query: &Query,
        start: ReadStart,
        direction: Direction,
        count: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        Ok(self.read_with_head(bid, query, start, direction, count)?.0)
    }

    /// An ascending page for a subscription, and the prepare position to continue from:
    /// after the last event if the page is full, else the head of the snapshot read (every
    /// event below it has been considered, matching or not).
    pub fn read_page(
        &self,
        bid: u32,
        query: &Query,
        start: ReadStart,
        limit: usize,
    ) -> Result<(Vec<StoredEvent>, u64), StoreError> {
        let (events, head) = self.read_with_head(bid, query, start, Direction::Asc, limit)?;
        let next = match events.last() {
            Some(last) if events.len() >= limit => last.position.prepare as u64 + 1,
            _ => head,
        };
        Ok((events, next))
    }

    /// Where a subscription without `after_position` starts (S2): at the newest event
    /// matching `query`, or at the head when nothing matches yet. One snapshot.
    pub fn newest_match_cursor(&self, bid: u32, query: &Query) -> Result<u64, StoreError> {
        let snapshot = self.inner.db.snapshot();
        let view = self.snapshot_view(&snapshot, bid);
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
        count: usize,
    ) -> Result<(Vec<StoredEvent>, u64), StoreError> {
        let snapshot = self.inner.db.snapshot();
        let view = self.snapshot_view(&snapshot, bid);
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
        Ok((view.page(query, start, head, direction, count)?, head))
    }

    /// The newest event per criterion, all from one snapshot (G2), and the context
    /// position: the max of the found positions or `(-1,-1)`.
    pub fn latest_by_criteria(
        &self,
        bid: u32,
        criteria: &[Criterion],
    ) -> Result<(Vec<Option<StoredEvent>>, Position), StoreError> {
        let snapshot = self.inner.db.snapshot();
        let view = self.snapshot_view(&snapshot, bid);
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
        if last.prepare < 0 || last.commit != last.prepare + 1 {
            return Ok(None);
        }
        let snapshot = self.inner.db.snapshot();
        let view = self.snapshot_view(&snapshot, bid);
        match view.get_event_raw(last.prepare as u64)? {
            Some(raw) if keys::commit_of_event_value(&raw)? == last.commit as u64 => {}
            _ => return Ok(None),
        }
        let key = keys::write_key(bid, last.commit as u64);
        let mut opts = ReadOptions::default();
        opts.set_snapshot(&snapshot);
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::StoreOptions;

    /// Writes as (gap after the previous write, events, which events carry the tag).
    fn writes() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
        prop::collection::vec((0..3u64, 1..8u64, 1..256u64), 0..12)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any sequence of lookups, in any order (so every path of the cursor — the decoded
        /// row, its neighbour, a fresh seek — is taken), answers what a scan of every member
        /// would.
        #[test]
        fn posting_cursor_agrees_with_a_scan(
            writes in writes(),
            lookups in prop::collection::vec((any::<bool>(), 0..80u64), 1..40),
        ) {
            let dir = tempfile::tempdir().expect("dir");
            let store = Store::open(dir.path(), &StoreOptions::default()).expect("open");
            let cf = store.cf(CF_TAGS).expect("cf");
            let prefix = keys::tag_prefix(1, "k", "v");
            // Neighbouring lists, which the cursor must never stray into.
            for other in [keys::tag_prefix(1, "k", "u"), keys::tag_prefix(1, "k", "w")] {
                for p in [0, 5, 40] {
                    store.db().put_cf(cf, keys::with_prepare(&other, p), [1]).expect("put");
                }
            }
            let (mut members, mut next, mut value) = (Vec::new(), 0u64, Vec::new());
            for (gap, len, mask) in writes {
                let first = next + gap;
                let commit = first + len;
                let tagged: Vec<u64> = (0..len).filter(|i| mask & (1 << i) != 0).map(|i| first + i).collect();
                next = commit;
                let Some((&head, later)) = tagged.split_first() else { continue };
                keys::encode_row(head, commit, later.iter().copied(), &mut value);
                store.db().put_cf(cf, keys::with_prepare(&prefix, head), &value).expect("put");
                members.extend(tagged.iter().map(|m| (*m, commit)));
            }
            let view = View { db: store.db(), snapshot: None, bid: 1, store: &store };
            let mut posting = view.posting("k", "v").expect("posting");
            for (before, at) in lookups {
                let (got, want) = if before {
                    (posting.at_or_before(at).expect("read"), members.iter().rev().find(|(m, _)| *m <= at).copied())
                } else {
                    (posting.at_or_after(at).expect("read"), members.iter().find(|(m, _)| *m >= at).copied())
                };
                prop_assert_eq!(got, want, "{} {}", if before { "at_or_before" } else { "at_or_after" }, at);
            }
        }
    }
}
