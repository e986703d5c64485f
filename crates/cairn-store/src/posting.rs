//! Posting lists and the leapfrog intersection that answers a criterion.
//!
//! A criterion (AND of tags) is a leapfrog intersection: seek each tag's list to the current
//! candidate; a list that lands elsewhere moves the candidate; when all lists agree, the
//! candidate matches. Backwards (seek_for_prev) it finds the newest match, forwards (seek)
//! the next one.

use rocksdb::{ColumnFamily, DB, DBRawIterator, ReadOptions};

use crate::StoreError;
use crate::keys;

/// One tag's posting list, positioned by seeks. A row holds the events of one write that
/// carry the tag (see `keys::encode_row`); the row under the iterator is kept decoded, so
/// successive lookups inside it, or in the row next to it, need no new seek.
pub(crate) struct Posting<'a> {
    prefix: Vec<u8>,
    it: DBRawIterator<'a>,
    /// Members (ascending) of the row under the iterator; empty when it is on none.
    members: Vec<u64>,
    /// Commit position of that row's write.
    commit: u64,
}

impl<'a> Posting<'a> {
    /// The posting list `prefix` (see [`keys::tag_prefix`]) read with `opts` (a snapshot,
    /// or none for the live state); no row is loaded until the first lookup.
    pub(crate) fn open(
        db: &'a DB,
        tags_cf: &ColumnFamily,
        mut opts: ReadOptions,
        prefix: Vec<u8>,
    ) -> Posting<'a> {
        opts.set_iterate_lower_bound(prefix.clone());
        let mut upper = prefix.clone();
        upper.extend_from_slice(&[0xff; 9]);
        opts.set_iterate_upper_bound(upper);
        opts.set_prefix_same_as_start(true);
        Posting {
            it: db.raw_iterator_cf_opt(tags_cf, opts),
            prefix,
            members: Vec::new(),
            commit: 0,
        }
    }

    /// Greatest prepare ≤ `at` in this list.
    pub(crate) fn at_or_before(&mut self, at: u64) -> Result<Option<(u64, u64)>, StoreError> {
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
    pub(crate) fn at_or_after(&mut self, at: u64) -> Result<Option<(u64, u64)>, StoreError> {
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

/// One list's lookup in one direction: [`Posting::at_or_before`] or [`Posting::at_or_after`].
type Step<'a> = fn(&mut Posting<'a>, u64) -> Result<Option<(u64, u64)>, StoreError>;

/// Leapfrog cursor over one criterion (an AND of tags).
pub(crate) struct CriterionCursor<'a> {
    pub(crate) lists: Vec<Posting<'a>>,
}

impl<'a> CriterionCursor<'a> {
    /// Newest (prepare, commit) ≤ `upper` matching every tag.
    pub(crate) fn latest_at_or_before(
        &mut self,
        upper: u64,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        self.leapfrog(upper, Posting::at_or_before)
    }

    /// Oldest (prepare, commit) ≥ `lower` matching every tag.
    pub(crate) fn first_at_or_after(
        &mut self,
        lower: u64,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        self.leapfrog(lower, Posting::at_or_after)
    }

    /// Seeks each list in turn to the candidate with `step`; a list that answers another
    /// position makes it the candidate; once every list has answered the candidate itself,
    /// it matches. `step` moves in one direction, so the candidate only moves that way.
    fn leapfrog(&mut self, start: u64, step: Step<'a>) -> Result<Option<(u64, u64)>, StoreError> {
        let n = self.lists.len();
        let (mut candidate, mut agree, mut i) = (start, 0usize, 0usize);
        loop {
            let Some((p, commit)) = step(&mut self.lists[i], candidate)? else {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{CF_TAGS, Store, StoreOptions};

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
            let mut posting = Posting::open(store.db(), cf, ReadOptions::default(), prefix.clone());
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
