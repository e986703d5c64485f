//! Pre-execution: the leader plans a run of appends once, and every replica writes the
//! rows it planned instead of repeating the consistency checks and building the rows again.
//!
//! [`Store::plan_appends`] runs exactly what [`Store::apply_appends`] runs (the same
//! `plan_append` on the same overlay), against the applied state plus the entries still in
//! flight ([`Speculation`]), and returns the rows in a compact encoding instead of writing
//! them. [`Store::apply_rows`] writes such rows. Whether a plan still holds when its entry
//! is applied (the state it was made on is the state the entry meets) is the replication
//! layer's decision: it alone names states.
//!
//! Rows encoding: for each row, one byte naming its column family ([`RowCf`]), the key's
//! length (LEB128), the key, the value's length, the value. Column families are named, not
//! numbered by RocksDB's ids, so a replica whose families were created in another order
//! still writes every row where it belongs.

use std::sync::Arc;

use cairn_core::command::{Append, Outcome};
use rocksdb::{ColumnFamily, WriteBatch};

use crate::apply::{Pending, TagRow};
use crate::keys::{self, MAX_VARINT_BYTES, meta, split_varint, varint};
use crate::{CF_EVENT_IDS, CF_EVENTS, CF_SM_META, CF_TAGS, CF_WRITES, Store, StoreError};

/// The column families a planned append writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RowCf {
    Events = 0,
    Tags = 1,
    EventIds = 2,
    Writes = 3,
}

impl RowCf {
    pub(crate) const ALL: [RowCf; 4] = [RowCf::Events, RowCf::Tags, RowCf::EventIds, RowCf::Writes];

    fn name(self) -> &'static str {
        match self {
            RowCf::Events => CF_EVENTS,
            RowCf::Tags => CF_TAGS,
            RowCf::EventIds => CF_EVENT_IDS,
            RowCf::Writes => CF_WRITES,
        }
    }
}

/// Where an append's rows go: straight into a RocksDB batch (applying) or into an entry
/// (planning).
pub(crate) trait RowSink {
    fn put(&mut self, cf: RowCf, key: &[u8], value: &[u8]);
}

/// Rows written into a RocksDB batch.
pub(crate) struct BatchRows<'a> {
    batch: &'a mut WriteBatch,
    cfs: [&'a ColumnFamily; 4],
}

impl RowSink for BatchRows<'_> {
    fn put(&mut self, cf: RowCf, key: &[u8], value: &[u8]) {
        self.batch.put_cf(self.cfs[cf as usize], key, value);
    }
}

/// Rows encoded for a log entry.
#[derive(Default)]
pub(crate) struct EncodedRows(pub(crate) Vec<u8>);

impl RowSink for EncodedRows {
    fn put(&mut self, cf: RowCf, key: &[u8], value: &[u8]) {
        let mut buf = [0; MAX_VARINT_BYTES];
        self.0.push(cf as u8);
        self.0.extend_from_slice(varint(key.len() as u64, &mut buf));
        self.0.extend_from_slice(key);
        self.0
            .extend_from_slice(varint(value.len() as u64, &mut buf));
        self.0.extend_from_slice(value);
    }
}

/// Calls `put` for every row of `rows` (see the module docs for the encoding).
pub(crate) fn decode_rows(
    mut rows: &[u8],
    mut put: impl FnMut(RowCf, &[u8], &[u8]),
) -> Result<(), StoreError> {
    let corrupt = |what: &str| StoreError::corrupt("planned rows", what);
    let take = |bytes: &[u8]| -> Option<(usize, usize)> {
        // (length, bytes the length took)
        let (len, rest) = split_varint(bytes)?;
        let len = usize::try_from(len).ok()?;
        (len <= rest.len()).then_some((len, bytes.len() - rest.len()))
    };
    while let Some((&cf, rest)) = rows.split_first() {
        let cf = *RowCf::ALL
            .get(usize::from(cf))
            .ok_or_else(|| corrupt("unknown column family"))?;
        let (key_len, skip) = take(rest).ok_or_else(|| corrupt("truncated key"))?;
        let (key, rest) = rest[skip..].split_at(key_len);
        let (value_len, skip) = take(rest).ok_or_else(|| corrupt("truncated value"))?;
        let (value, rest) = rest[skip..].split_at(value_len);
        put(cf, key, value);
        rows = rest;
    }
    Ok(())
}

/// What an entry planned and still in flight adds, for the plans made after it: each
/// touched boundary's head and the posting-list rows it writes.
#[derive(Debug, Default)]
pub struct Speculation {
    heads: Vec<(u32, u64)>,
    /// Sorted by key.
    tag_rows: Vec<TagRow>,
}

/// A run of appends planned against the applied state and the entries in flight.
#[derive(Debug)]
pub struct PlannedRun {
    /// Each append's outcome, as applying the run would produce it.
    pub outcomes: Vec<Outcome>,
    /// Each touched boundary's id and head afterwards.
    pub heads: Vec<(u32, u64)>,
    /// The rows to write (see the module docs).
    pub rows: Vec<u8>,
    /// What plans made while this one is in flight must see.
    pub speculation: Arc<Speculation>,
}

impl Store {
    pub(crate) fn batch_rows<'a>(
        &'a self,
        batch: &'a mut WriteBatch,
    ) -> Result<BatchRows<'a>, StoreError> {
        Ok(BatchRows {
            batch,
            cfs: self.row_cfs()?,
        })
    }

    fn row_cfs(&self) -> Result<[&ColumnFamily; 4], StoreError> {
        Ok([
            self.cf(RowCf::ALL[0].name())?,
            self.cf(RowCf::ALL[1].name())?,
            self.cf(RowCf::ALL[2].name())?,
            self.cf(RowCf::ALL[3].name())?,
        ])
    }

    /// Plans `appends` as [`Store::apply_appends`] would apply them on the state this store
    /// has applied plus `in_flight` (the plans proposed and not yet applied, oldest first),
    /// without writing anything. `None` when the run cannot be planned here: an append to
    /// a boundary with idempotent event ids (X1) while plans are in flight, whose event ids
    /// the speculation does not carry.
    ///
    /// The caller must make sure the plan is only used on the state it assumed: the
    /// applied state it read (read its name before calling) plus exactly `in_flight`.
    pub fn plan_appends(
        &self,
        appends: &[&Append],
        in_flight: &[Arc<Speculation>],
    ) -> Result<Option<PlannedRun>, StoreError> {
        if !in_flight.is_empty() {
            let idempotent = appends.iter().any(|a| {
                self.with_catalog(|c| {
                    c.active_boundary(&a.boundary)
                        .is_some_and(|b| b.idempotent_event_ids)
                })
            });
            if idempotent {
                return Ok(None);
            }
        }
        let mut pending = Pending::default();
        pending.observed = if in_flight.is_empty() {
            self.observed_prefixes(appends)
        } else {
            // The first append must see the entries in flight too.
            self.observed_prefixes_of(appends)
        };
        for speculation in in_flight {
            pending.heads.extend(speculation.heads.iter().copied());
        }
        let seeded_heads = pending.heads.clone();
        for list in &pending.observed {
            let mut postings = Vec::new();
            for speculation in in_flight {
                let start = speculation
                    .tag_rows
                    .partition_point(|r| r.key.as_slice() < list.as_slice());
                for row in speculation.tag_rows[start..]
                    .iter()
                    .take_while(|r| r.key.starts_with(list))
                    .filter(|r| r.list() == list.as_slice())
                {
                    postings.push((row.first, row.commit));
                    postings.extend(row.later.iter().map(|p| (*p, row.commit)));
                }
            }
            if !postings.is_empty() {
                pending.postings.insert(list.clone(), postings);
            }
        }
        let mut rows = EncodedRows::default();
        let (outcomes, tag_rows) = self.plan_run(appends, &mut rows, &mut pending)?;
        let mut heads: Vec<(u32, u64)> = pending
            .heads
            .iter()
            .filter(|(bid, head)| seeded_heads.get(bid) != Some(head))
            .map(|(bid, head)| (*bid, *head))
            .collect();
        heads.sort_unstable();
        Ok(Some(PlannedRun {
            outcomes,
            speculation: Arc::new(Speculation {
                heads: heads.clone(),
                tag_rows,
            }),
            heads,
            rows: rows.0,
        }))
    }

    /// Writes planned `rows` with `marker` in one atomic batch and moves the heads on;
    /// returns the names of the boundaries that got events. Must be called in log order by
    /// a single writer, only on the state the plan was made on.
    pub fn apply_rows(
        &self,
        heads: &[(u32, u64)],
        rows: &[u8],
        marker: &[u8],
    ) -> Result<Vec<String>, StoreError> {
        let _writer = self.lock_writer();
        let mut batch = WriteBatch::default();
        let cfs = self.row_cfs()?;
        decode_rows(rows, |cf, key, value| {
            batch.put_cf(cfs[cf as usize], key, value)
        })?;
        batch.put_cf(self.cf(CF_SM_META)?, meta::APPLIED, marker);
        self.write(batch)?;
        Ok(self.with_catalog_mut(|c| {
            c.applied_marker = Some(marker.to_vec());
            for (bid, head) in heads {
                c.heads.insert(*bid, *head);
            }
            c.boundaries
                .values()
                .filter(|b| heads.iter().any(|(bid, _)| *bid == b.id))
                .map(|b| b.name.clone())
                .collect()
        }))
    }
}

/// Where a point-in-time restore stops inside a planned entry: boundary `bid` keeps its
/// events before prepare position `limit` and none from there on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowCut {
    /// The boundary the restore position names.
    pub bid: u32,
    /// The first prepare position not restored.
    pub limit: u64,
}

impl Store {
    /// The writes a plan's `rows` make to boundary `bid`, in the plan's order: each one's
    /// first prepare position and its commit position.
    pub fn planned_writes(&self, rows: &[u8], bid: u32) -> Result<Vec<(u64, u64)>, StoreError> {
        let mut writes: Vec<(u64, u64)> = Vec::new();
        let mut failed = None;
        decode_rows(rows, |cf, key, value| {
            if cf != RowCf::Events || key.get(..4) != Some(&bid.to_be_bytes()[..]) {
                return;
            }
            match (
                keys::prepare_of_event_key(key),
                keys::commit_of_event_value(value),
            ) {
                (Ok(prepare), Ok(commit)) => {
                    if writes.last().is_none_or(|(_, c)| *c != commit) {
                        writes.push((prepare, commit));
                    }
                }
                (Err(e), _) | (_, Err(e)) => failed = Some(e),
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(writes),
        }
    }

    /// Writes the part of a plan's `rows` that precedes `cut`, with `marker`: every row of
    /// the writes planned before boundary `cut.bid`'s first event at or after `cut.limit`
    /// (in the plan's order, whichever boundary they went to), none of that write's or of
    /// any write planned after it. Each row belongs to one write (a posting-list row holds
    /// the events of one write), which is what makes a plan divisible between writes.
    /// Returns the names of the boundaries that got events. For restores only: the rows
    /// written are a prefix of the plan, not the state any replica ever had.
    pub fn apply_rows_cut(
        &self,
        rows: &[u8],
        cut: RowCut,
        marker: &[u8],
    ) -> Result<Vec<String>, StoreError> {
        let mut all: Vec<(RowCf, Vec<u8>, Vec<u8>)> = Vec::new();
        decode_rows(rows, |cf, key, value| {
            all.push((cf, key.to_vec(), value.to_vec()))
        })?;
        let event_of = |key: &[u8]| -> Result<(u32, u64), StoreError> {
            let bid = key
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes)
                .ok_or_else(|| StoreError::corrupt("planned rows", "short events key"))?;
            Ok((bid, keys::prepare_of_event_key(key)?))
        };
        let mut cut_at = all.len();
        for (i, (cf, key, _)) in all.iter().enumerate() {
            if *cf == RowCf::Events {
                let (bid, prepare) = event_of(key)?;
                if bid == cut.bid && prepare >= cut.limit {
                    cut_at = i;
                    break;
                }
            }
        }
        let mut events = std::collections::HashSet::new();
        let mut writes = std::collections::HashSet::new();
        let mut heads: std::collections::BTreeMap<u32, u64> = Default::default();
        for (cf, key, value) in &all[..cut_at] {
            if *cf == RowCf::Events {
                let (bid, prepare) = event_of(key)?;
                events.insert((bid, prepare));
                writes.insert((bid, keys::commit_of_event_value(value)?));
                let head = heads.entry(bid).or_default();
                *head = (*head).max(prepare + 1);
            }
        }
        let _writer = self.lock_writer();
        let mut batch = WriteBatch::default();
        let cfs = self.row_cfs()?;
        let mut members = Vec::new();
        for (cf, key, value) in &all {
            let bid_be = || {
                key.get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_be_bytes)
                    .ok_or_else(|| StoreError::corrupt("planned rows", "short key"))
            };
            let keep = match cf {
                RowCf::Events => events.contains(&event_of(key)?),
                RowCf::Writes => writes.contains(&(bid_be()?, keys::prepare_of_event_key(key)?)),
                RowCf::EventIds => {
                    events.contains(&(bid_be()?, keys::decode_event_id_value(value)?))
                }
                RowCf::Tags => {
                    let (bid, _) = split_varint(key)
                        .ok_or_else(|| StoreError::corrupt("planned rows", "tags key"))?;
                    let bid = u32::try_from(bid)
                        .map_err(|_| StoreError::corrupt("planned rows", "tags key"))?;
                    let first = keys::prepare_suffix(key)?;
                    let commit = keys::decode_row(first, value, &mut members)?;
                    writes.contains(&(bid, commit))
                }
            };
            if keep {
                batch.put_cf(cfs[*cf as usize], key, value);
            }
        }
        batch.put_cf(self.cf(CF_SM_META)?, meta::APPLIED, marker);
        self.write(batch)?;
        Ok(self.with_catalog_mut(|c| {
            c.applied_marker = Some(marker.to_vec());
            for (bid, head) in &heads {
                c.heads.insert(*bid, *head);
            }
            c.boundaries
                .values()
                .filter(|b| heads.contains_key(&b.id))
                .map(|b| b.name.clone())
                .collect()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_decode_as_encoded_and_corrupt_rows_are_refused() {
        let mut rows = EncodedRows::default();
        let long = vec![7u8; 300];
        rows.put(RowCf::Events, b"k1", b"v1");
        rows.put(RowCf::Tags, &long, b"");
        rows.put(RowCf::Writes, b"", &long);
        rows.put(RowCf::EventIds, b"id", b"p");
        let mut seen = Vec::new();
        decode_rows(&rows.0, |cf, k, v| seen.push((cf, k.to_vec(), v.to_vec()))).expect("rows");
        assert_eq!(
            seen,
            vec![
                (RowCf::Events, b"k1".to_vec(), b"v1".to_vec()),
                (RowCf::Tags, long.clone(), Vec::new()),
                (RowCf::Writes, Vec::new(), long.clone()),
                (RowCf::EventIds, b"id".to_vec(), b"p".to_vec()),
            ]
        );
        for cut in 1..rows.0.len() {
            let mut count = 0;
            let result = decode_rows(&rows.0[..cut], |_, _, _| count += 1);
            assert!(
                result.is_err() || count < 4,
                "a truncated encoding ({cut} bytes) decoded every row"
            );
        }
        assert!(
            decode_rows(&[9, 0, 0], |_, _, _| {}).is_err(),
            "unknown family"
        );
    }

    use std::collections::VecDeque;

    use cairn_core::command::Command;
    use cairn_core::event::{NewEvent, RawEvent};
    use cairn_core::{Criterion, Observation, Position, Query};
    use proptest::prelude::*;

    use crate::{STATE_MACHINE_CFS, StoreOptions};

    /// An append as generated: boundary (0 plain, 1 idempotent ids), events as (id, c, t)
    /// tag values, and observations as (c value, whether to observe the true position).
    #[derive(Debug, Clone)]
    struct GenAppend {
        boundary: usize,
        events: Vec<(u32, u8, u8)>,
        observations: Vec<(u8, Option<u8>, bool)>,
    }

    fn gen_append() -> impl Strategy<Value = GenAppend> {
        (
            0..2usize,
            prop::collection::vec((0..40u32, 0..3u8, 0..2u8), 1..4),
            prop::collection::vec((0..3u8, prop::option::of(0..2u8), any::<bool>()), 0..3),
        )
            .prop_map(|(boundary, events, observations)| GenAppend {
                boundary,
                events,
                observations,
            })
    }

    const BOUNDARIES: [&str; 2] = ["plain", "ids"];

    fn open_with_boundaries(dir: &std::path::Path) -> Store {
        let store = Store::open(dir, &StoreOptions::default()).expect("open");
        for (i, name) in BOUNDARIES.iter().enumerate() {
            let created = store.apply(
                &Command::CreateBoundary {
                    name: (*name).into(),
                    description: String::new(),
                    placement: None,
                    existed_before_catalog: false,
                    idempotent_event_ids: i == 1,
                    if_absent: false,
                },
                b"m",
            );
            assert!(matches!(created, Ok(Ok(_))), "{created:?}");
        }
        store
    }

    fn query(c: u8, t: Option<u8>) -> Query {
        let mut tags = vec![("c".to_string(), c.to_string())];
        if let Some(t) = t {
            tags.push(("t".to_string(), t.to_string()));
        }
        Query::of([Criterion::of(tags)])
    }

    /// Turns a generated append into a real one; observed positions come from `truth`
    /// (the store that has applied everything before), or are stale on purpose.
    fn realize(truth: &Store, g: &GenAppend, seq: u64) -> Append {
        let bid = truth.with_catalog(|c| c.boundaries[BOUNDARIES[g.boundary]].id);
        let events = g
            .events
            .iter()
            .enumerate()
            .map(|(i, (id, c, t))| {
                let raw = RawEvent {
                    event_id: format!("e{id}"),
                    event_type: "T".into(),
                    data: format!(r#"{{"c":"{c}","t":"{t}"}}"#),
                    metadata: String::new(),
                };
                NewEvent::validate(raw, i).expect("valid")
            })
            .collect();
        let observations = g
            .observations
            .iter()
            .map(|(c, t, exact)| {
                let query = query(*c, *t);
                let actual = truth.latest_position(bid, &query).expect("latest");
                Observation {
                    position: if *exact { actual } else { Position::NONE },
                    query,
                }
            })
            .collect();
        Append {
            boundary: BOUNDARIES[g.boundary].into(),
            observations,
            events,
            at_unix_nanos: seq as i64,
        }
    }

    type Rows = Vec<(Box<[u8]>, Box<[u8]>)>;

    fn contents(store: &Store) -> Vec<(&'static str, Rows)> {
        STATE_MACHINE_CFS
            .iter()
            .map(|name| {
                let cf = store.cf(name).expect("cf");
                let rows = store
                    .db()
                    .iterator_cf(cf, rocksdb::IteratorMode::Start)
                    .map(|r| r.expect("row"))
                    .collect();
                (*name, rows)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Planning a run (with up to `depth` planned runs in flight, unapplied) and writing
        /// its rows gives the outcomes and the bytes that applying the run gives.
        ///
        /// It also covers the proposer's concurrent window: the oldest entry in flight may
        /// be applied before the next plan is made while its speculation is still counted
        /// (the waiter that forgets it has not run yet), or applied on another thread while
        /// the plan reads the state. The overlay must count such an entry once.
        #[test]
        fn planned_runs_write_what_applying_them_writes(
            batches in prop::collection::vec(
                (prop::collection::vec(gen_append(), 1..5), 0..3u8), 1..12),
            depth in 0..4usize,
            retries in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            let (a_dir, b_dir) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
            let applied = open_with_boundaries(a_dir.path());
            let planned = open_with_boundaries(b_dir.path());
            // Each run in flight, and whether its rows are written already.
            let mut in_flight: VecDeque<(PlannedRun, bool)> = VecDeque::new();
            let write = |store: &Store, plan: &PlannedRun| {
                store.apply_rows(&plan.heads, &plan.rows, b"m").expect("rows");
            };
            let mut history: Vec<Append> = Vec::new();
            for (seq, (batch, window)) in batches.iter().enumerate() {
                let mut run: Vec<Append> =
                    batch.iter().map(|g| realize(&applied, g, seq as u64)).collect();
                // Exact retries of earlier writes (X1 answers them with the first result).
                for index in &retries {
                    if !history.is_empty() && seq % 3 == 1 {
                        run.push(history[index.index(history.len())].clone());
                    }
                }
                let refs: Vec<&Append> = run.iter().collect();
                let expected = applied.apply_appends(&refs, b"m").expect("apply");
                let speculations: Vec<Arc<Speculation>> =
                    in_flight.iter().map(|(p, _)| p.speculation.clone()).collect();
                // 0: the oldest entry stays unapplied; 1: it is applied before planning
                // and still counted; 2: it is applied on another thread while planning.
                let unwritten_front = in_flight.front().filter(|(_, written)| !written);
                let plan = match (window, unwritten_front) {
                    (1, Some((front, _))) => {
                        write(&planned, front);
                        in_flight[0].1 = true;
                        planned.plan_appends(&refs, &speculations).expect("plan")
                    }
                    (2, Some((front, _))) => {
                        let start = std::sync::Barrier::new(2);
                        let plan = std::thread::scope(|scope| {
                            scope.spawn(|| {
                                start.wait();
                                write(&planned, front);
                            });
                            start.wait();
                            planned.plan_appends(&refs, &speculations).expect("plan")
                        });
                        in_flight[0].1 = true;
                        plan
                    }
                    _ => planned.plan_appends(&refs, &speculations).expect("plan"),
                };
                match plan {
                    Some(plan) => {
                        prop_assert_eq!(&plan.outcomes, &expected, "batch {}", seq);
                        in_flight.push_back((plan, false));
                    }
                    None => {
                        // Not plannable here: proposed as it is, so it applies after the
                        // runs in flight.
                        prop_assert!(!in_flight.is_empty());
                        for (plan, written) in in_flight.drain(..) {
                            if !written {
                                write(&planned, &plan);
                            }
                        }
                        let outcomes = planned.apply_appends(&refs, b"m").expect("apply");
                        prop_assert_eq!(&outcomes, &expected, "batch {} unplanned", seq);
                    }
                }
                // An entry applied early is forgotten once planning is over, as the
                // waiter forgets it.
                while in_flight.front().is_some_and(|(_, written)| *written) {
                    in_flight.pop_front();
                }
                while in_flight.len() > depth {
                    let (plan, _) = in_flight.pop_front().expect("plan");
                    write(&planned, &plan);
                }
                history.extend(run);
            }
            for (plan, written) in in_flight.drain(..) {
                if !written {
                    write(&planned, &plan);
                }
            }
            prop_assert_eq!(contents(&planned), contents(&applied));
            prop_assert_eq!(
                planned.with_catalog(|c| c.heads.clone()),
                applied.with_catalog(|c| c.heads.clone())
            );
        }
    }
}
