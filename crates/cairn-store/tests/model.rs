//! Model-based test of the CCC store: random operations run against the RocksDB store and a
//! naive in-memory model (a Vec scanned linearly) must produce identical outcomes,
//! positions and results. Runs ≥ 10,000 operations per run (CASES × OPS_PER_CASE), once on
//! a plain boundary and once on a boundary with idempotent event ids (X1), where the
//! generated writes also reuse ids: identical retries, retries with altered payloads, and
//! ids taken from several earlier writes.

use std::collections::BTreeMap;

use cairn_core::command::{Append, Applied, Command, Outcome};
use cairn_core::error::EventIdReuse;
use cairn_core::event::{NewEvent, RawEvent};
use cairn_core::query::normalize_observations;
use cairn_core::{Criterion, Error, Observation, Position, Query};
use cairn_store::{Direction, PageLimit, ReadStart, Store, StoreOptions};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::cell::Cell;

/// Outcome tallies of the current thread's run, so each test proves it exercised both
/// sides of the CCC rule (and of X1) on its own.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    commits: usize,
    conflicts: usize,
    conditional_commits: usize,
    non_empty_reads: usize,
    /// Identical retries answered with their original result.
    retries: usize,
    /// Id reuses refused (EventIdExists) and ids twice in one write (InvalidArgument).
    id_refusals: usize,
}

thread_local! {
    static TALLY: Cell<Tally> = Cell::new(Tally::default());
}

fn tally(f: impl FnOnce(&mut Tally)) {
    TALLY.with(|t| {
        let mut tally = t.get();
        f(&mut tally);
        t.set(tally);
    });
}

const CASES: u32 = 50;
const OPS_PER_CASE: usize = 220;

#[derive(Debug, Clone)]
struct ModelEvent {
    position: Position,
    event_id: String,
    event_type: String,
    data: String,
    metadata: String,
    scalars: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Model {
    events: Vec<ModelEvent>,
    /// X1: the boundary refuses reused event ids unless a write is repeated exactly.
    idempotent: bool,
}

impl Model {
    fn latest(&self, q: &Query) -> Position {
        self.events
            .iter()
            .rev()
            .find(|e| q.matches(&e.scalars))
            .map_or(Position::NONE, |e| e.position)
    }

    /// X1, naively: scan the whole log for each id.
    fn check_ids(&self, events: &[NewEvent]) -> Option<Outcome> {
        let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
        if (1..ids.len()).any(|i| ids[..i].contains(&ids[i])) {
            return Some(Err(Error::invalid("duplicate id")));
        }
        let hits: Vec<Option<&ModelEvent>> = ids
            .iter()
            .map(|id| self.events.iter().find(|m| m.event_id == *id))
            .collect();
        let hit = hits.iter().flatten().next()?;
        let hit_id = ids[hits.iter().position(Option::is_some)?];
        let refuse = |reason| {
            Some(Err(Error::EventIdExists {
                boundary: "b".into(),
                event_id: hit_id.to_string(),
                position: hit.position,
                reason,
            }))
        };
        if hits.iter().any(Option::is_none) {
            return refuse(EventIdReuse::PartialOverlap);
        }
        let commit = hit.position.commit;
        if hits.iter().flatten().any(|m| m.position.commit != commit) {
            return refuse(EventIdReuse::SeveralWrites);
        }
        let write: Vec<&ModelEvent> = self
            .events
            .iter()
            .filter(|m| m.position.commit == commit)
            .collect();
        if write.len() != events.len() {
            return refuse(EventIdReuse::PartialOverlap);
        }
        let identical = write.iter().zip(events).all(|(m, e)| {
            m.event_id == e.event_id
                && m.event_type == e.event_type
                && m.data == e.data
                && m.metadata == e.metadata
        });
        if !identical {
            return refuse(EventIdReuse::Altered);
        }
        tally(|t| t.retries += 1);
        Some(Ok(Applied::Appended {
            last: write[write.len() - 1].position,
        }))
    }

    fn apply(&mut self, observations: &[Observation], events: &[NewEvent]) -> Outcome {
        if self.idempotent
            && let Some(outcome) = self.check_ids(events)
        {
            return outcome;
        }
        for o in observations {
            let actual = self.latest(&o.query);
            if actual != o.position {
                return Err(Error::Conflict {
                    expected: o.position,
                    actual,
                });
            }
        }
        let first = self.events.len() as i64;
        let commit = first + events.len() as i64;
        for (i, e) in events.iter().enumerate() {
            self.events.push(ModelEvent {
                position: Position::new(commit, first + i as i64),
                event_id: e.event_id.clone(),
                event_type: e.event_type.clone(),
                data: e.data.clone(),
                metadata: e.metadata.clone(),
                scalars: e
                    .tags
                    .iter()
                    .map(|t| (t.key.clone(), t.value.clone()))
                    .collect(),
            });
        }
        Ok(Applied::Appended {
            last: Position::new(commit, commit - 1),
        })
    }

    fn read(&self, q: &Query, start: ReadStart, dir: Direction, count: usize) -> Vec<Position> {
        let keep = |p: Position| match (start, dir) {
            (ReadStart::Edge, _) => true,
            (ReadStart::Inclusive(s), Direction::Asc) => p >= s,
            (ReadStart::Inclusive(s), Direction::Desc) => p <= s,
            (ReadStart::After(s), Direction::Asc) => p > s,
            (ReadStart::After(s), Direction::Desc) => p < s,
            (ReadStart::Prepare(s), Direction::Asc) => p.prepare >= s as i64,
            (ReadStart::Prepare(s), Direction::Desc) => p.prepare <= s as i64,
        };
        let it = self
            .events
            .iter()
            .filter(|e| q.matches(&e.scalars) && keep(e.position))
            .map(|e| e.position);
        match dir {
            Direction::Asc => it.take(count).collect(),
            Direction::Desc => it.rev().take(count).collect(),
        }
    }
}

/// A query as generated: criteria of (key index, value index) tags.
type QuerySpec = Vec<Vec<(u8, u8)>>;

#[derive(Debug, Clone)]
enum Op {
    /// Appends applied as one atomic group (one Raft batch entry); usually just one.
    Append(Vec<AppendSpec>),
    Read {
        query: QuerySpec,
        start: StartChoice,
        desc: bool,
        count: usize,
    },
    Latest {
        criteria: QuerySpec,
    },
    /// Flush memtables, so later reads also go through SST files and their prefix blooms.
    Flush,
}

#[derive(Debug, Clone)]
struct AppendSpec {
    events: Vec<Vec<(u8, u8)>>,
    observations: Vec<(QuerySpec, PositionChoice)>,
    ids: IdChoice,
}

/// Where an append's event ids come from.
#[derive(Debug, Clone, Copy)]
enum IdChoice {
    /// Fresh ids.
    Fresh,
    /// Resend an earlier append (by index, modulo) exactly: a retry.
    Retry(usize),
    /// Resend an earlier append with one event's data changed.
    RetryAltered(usize),
    /// Fresh ids, but the first one taken from an earlier append.
    ReuseOne(usize),
    /// The first id twice.
    Duplicate,
}

#[derive(Debug, Clone, Copy)]
enum PositionChoice {
    /// The current L(Q): should commit (unless another observation fails).
    Current,
    /// A position remembered from an earlier read: may be stale.
    Remembered(usize),
    /// (-1,-1).
    None,
    /// An arbitrary, probably future, position.
    Arbitrary(i64, i64),
}

#[derive(Debug, Clone, Copy)]
enum StartChoice {
    Edge,
    EventInclusive(usize),
    EventAfter(usize),
    ArbitraryInclusive(i64, i64),
}

const KEYS: [&str; 4] = ["a", "b", "scopes.accountOpenedId", "n"];
const VALUES: [&str; 3] = ["\"1\"", "2", "\"x\""];

fn tag_strategy() -> impl Strategy<Value = (u8, u8)> {
    (0..KEYS.len() as u8, 0..VALUES.len() as u8)
}

fn query_strategy(min: usize) -> impl Strategy<Value = QuerySpec> {
    prop::collection::vec(prop::collection::vec(tag_strategy(), 1..3), min..3)
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let position = prop_oneof![
        4 => Just(PositionChoice::Current),
        3 => (0..64usize).prop_map(PositionChoice::Remembered),
        1 => Just(PositionChoice::None),
        1 => (0..80i64, 0..80i64).prop_map(|(c, p)| PositionChoice::Arbitrary(c, p)),
    ];
    let start = prop_oneof![
        Just(StartChoice::Edge),
        (0..200usize).prop_map(StartChoice::EventInclusive),
        (0..200usize).prop_map(StartChoice::EventAfter),
        (-2..90i64, -2..90i64).prop_map(|(c, p)| StartChoice::ArbitraryInclusive(c, p)),
    ];
    prop_oneof![
        5 => {
            let spec = (
                prop::collection::vec(prop::collection::vec(tag_strategy(), 0..4), 1..8),
                prop::collection::vec((query_strategy(1), position), 0..3),
                prop_oneof![
                    12 => Just(IdChoice::Fresh),
                    3 => (0..64usize).prop_map(IdChoice::Retry),
                    1 => (0..64usize).prop_map(IdChoice::RetryAltered),
                    1 => (0..64usize).prop_map(IdChoice::ReuseOne),
                    1 => Just(IdChoice::Duplicate),
                ],
            )
                .prop_map(|(events, observations, ids)| AppendSpec { events, observations, ids })
                .boxed();
            prop_oneof![
                3 => prop::collection::vec(spec.clone(), 1..=1),
                1 => prop::collection::vec(spec, 2..5),
            ]
            .prop_map(Op::Append)
        },
        3 => (query_strategy(0), start, any::<bool>(), 1..12usize)
            .prop_map(|(query, start, desc, count)| Op::Read { query, start, desc, count }),
        2 => query_strategy(1).prop_map(|criteria| Op::Latest { criteria }),
        1 => Just(Op::Flush),
    ]
}

fn criterion(tags: &[(u8, u8)]) -> Criterion {
    // One value per key (a key with two values is a validation error, tested elsewhere).
    let mut seen = std::collections::BTreeSet::new();
    let tags: Vec<(u8, u8)> = tags
        .iter()
        .copied()
        .filter(|(k, _)| seen.insert(*k))
        .collect();
    // Values are JSON literals in data; as tag values they are their scalar text.
    Criterion::of(tags.iter().map(|&(k, v)| {
        (
            KEYS[k as usize].to_string(),
            VALUES[v as usize].trim_matches('"').to_string(),
        )
    }))
}

fn query(spec: &[Vec<(u8, u8)>]) -> Query {
    Query::of(spec.iter().map(|c| criterion(c)))
}

fn new_event(id: u64, tags: &[(u8, u8)]) -> NewEvent {
    let mut data = String::from("{");
    let mut seen = std::collections::BTreeSet::new();
    for &(k, v) in tags {
        if seen.insert(k) {
            if data.len() > 1 {
                data.push(',');
            }
            data.push_str(&format!("\"{}\":{}", KEYS[k as usize], VALUES[v as usize]));
        }
    }
    data.push('}');
    NewEvent::validate(
        RawEvent {
            event_id: format!("id-{id}"),
            event_type: if id.is_multiple_of(3) {
                "A".into()
            } else {
                "B".into()
            },
            data,
            metadata: String::new(),
        },
        0,
    )
    .expect("generated events are valid")
}

/// Same outcome, comparing validation errors by kind only (their wording is not modelled).
fn same_outcome(actual: &Outcome, expected: &Outcome) -> bool {
    match (actual, expected) {
        (Err(Error::InvalidArgument(_)), Err(Error::InvalidArgument(_))) => true,
        _ => actual == expected,
    }
}

fn run_ops(ops: Vec<Op>, idempotent: bool) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let store = Store::open(dir.path(), &StoreOptions::default())
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let created = store
        .apply(
            &Command::CreateBoundary {
                name: "b".into(),
                description: String::new(),
                placement: None,
                existed_before_catalog: false,
                idempotent_event_ids: idempotent,
                if_absent: false,
            },
            b"m",
        )
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let Ok(Applied::Boundary(info)) = created else {
        return Err(TestCaseError::fail("boundary not created"));
    };
    let bid = info.id;
    let mut model = Model {
        idempotent,
        ..Model::default()
    };
    let mut remembered: Vec<Position> = vec![Position::NONE];
    let mut next_id = 0u64;
    // Every append sent so far, for retries and reuse.
    let mut sent: Vec<Vec<NewEvent>> = Vec::new();

    for op in ops {
        match op {
            Op::Append(specs) => {
                let mut group = Vec::new();
                let mut expected = Vec::new();
                for spec in specs {
                    let mut fresh = |tags: &Vec<(u8, u8)>| {
                        next_id += 1;
                        new_event(next_id, tags)
                    };
                    let earlier = |i: usize| sent.get(i % sent.len().max(1)).cloned();
                    let events: Vec<NewEvent> = match spec.ids {
                        IdChoice::Retry(i) => earlier(i)
                            .unwrap_or_else(|| spec.events.iter().map(&mut fresh).collect()),
                        IdChoice::RetryAltered(i) => match earlier(i) {
                            Some(mut events) => {
                                let last = events.len() - 1;
                                events[last].data = r#"{"altered":true}"#.into();
                                events
                            }
                            None => spec.events.iter().map(&mut fresh).collect(),
                        },
                        IdChoice::ReuseOne(i) => {
                            let mut events: Vec<NewEvent> =
                                spec.events.iter().map(&mut fresh).collect();
                            if let Some(earlier) = earlier(i) {
                                events[0].event_id = earlier[0].event_id.clone();
                            }
                            events
                        }
                        IdChoice::Duplicate => {
                            let mut events: Vec<NewEvent> =
                                spec.events.iter().map(&mut fresh).collect();
                            let first = events[0].clone();
                            events.push(first);
                            events
                        }
                        IdChoice::Fresh => spec.events.iter().map(&mut fresh).collect(),
                    };
                    sent.push(events.clone());
                    let raw_obs: Vec<Observation> = spec
                        .observations
                        .iter()
                        .map(|(q, choice)| {
                            let query = query(q);
                            // Chosen against the model as it stands after the earlier
                            // appends of the group: that is what the group must honour.
                            let position = match *choice {
                                PositionChoice::Current => model.latest(&query),
                                PositionChoice::Remembered(i) => remembered[i % remembered.len()],
                                PositionChoice::None => Position::NONE,
                                PositionChoice::Arbitrary(c, p) => Position::new(c, p),
                            };
                            Observation { query, position }
                        })
                        .collect();
                    let Ok(observations) = normalize_observations(raw_obs) else {
                        // Contradictory observations are rejected before reaching the store.
                        continue;
                    };
                    let conditional = !observations.is_empty();
                    expected.push((model.apply(&observations, &events), conditional));
                    group.push(Append {
                        boundary: "b".into(),
                        observations,
                        events,
                        at_unix_nanos: 1,
                    });
                }
                if group.is_empty() {
                    continue;
                }
                let actual: Vec<Outcome> = if group.len() == 1 {
                    let single = Command::Append(group.remove(0));
                    vec![
                        store
                            .apply(&single, b"m")
                            .map_err(|e| TestCaseError::fail(e.to_string()))?,
                    ]
                } else {
                    let refs: Vec<&Append> = group.iter().collect();
                    store
                        .apply_appends(&refs, b"m")
                        .map_err(|e| TestCaseError::fail(e.to_string()))?
                };
                prop_assert_eq!(actual.len(), expected.len());
                for (actual, (expected, conditional)) in actual.into_iter().zip(expected) {
                    prop_assert!(
                        same_outcome(&actual, &expected),
                        "store {:?}, model {:?}",
                        actual,
                        expected
                    );
                    match actual {
                        Ok(Applied::Appended { last }) => {
                            tally(|t| {
                                t.commits += 1;
                                t.conditional_commits += usize::from(conditional);
                            });
                            remembered.push(last);
                        }
                        Err(Error::Conflict { .. }) => {
                            tally(|t| t.conflicts += 1);
                        }
                        Err(Error::EventIdExists { .. } | Error::InvalidArgument(_)) => {
                            tally(|t| t.id_refusals += 1);
                        }
                        _ => {}
                    }
                }
            }
            Op::Read {
                query: q,
                start,
                desc,
                count,
            } => {
                let q = query(&q).normalize_filter().expect("valid query");
                let event_pos = |i: usize| {
                    model
                        .events
                        .get(i % model.events.len().max(1))
                        .map_or(Position::new(1, 0), |e| e.position)
                };
                let start = match start {
                    StartChoice::Edge => ReadStart::Edge,
                    StartChoice::EventInclusive(i) => ReadStart::Inclusive(event_pos(i)),
                    StartChoice::EventAfter(i) => ReadStart::After(event_pos(i)),
                    StartChoice::ArbitraryInclusive(c, p) => {
                        ReadStart::Inclusive(Position::new(c, p))
                    }
                };
                let dir = if desc {
                    Direction::Desc
                } else {
                    Direction::Asc
                };
                let expected = model.read(&q, start, dir, count);
                let got = store
                    .read_events(bid, &q, start, dir, PageLimit::events(count))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let got_positions: Vec<Position> = got.iter().map(|e| e.position).collect();
                if !got.is_empty() {
                    tally(|t| t.non_empty_reads += 1);
                }
                prop_assert_eq!(
                    &got_positions,
                    &expected,
                    "query {:?} start {:?} dir {:?}",
                    q,
                    start,
                    dir
                );
                for e in &got {
                    let m = &model.events[e.position.prepare as usize];
                    prop_assert_eq!(&e.event_id, &m.event_id);
                    prop_assert_eq!(&e.event_type, &m.event_type);
                    prop_assert_eq!(&e.data, &m.data);
                }
                let latest = store
                    .query_position(bid, &q)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(latest, model.latest(&q));
                remembered.push(latest);
            }
            Op::Flush => {
                store
                    .flush()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Latest { criteria } => {
                let criteria: Vec<Criterion> = criteria
                    .iter()
                    .map(|c| criterion(c).normalize(&|| "c".into()).expect("valid"))
                    .collect();
                let (results, context) = store
                    .latest_by_criteria(bid, &criteria)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let mut expected_context = Position::NONE;
                for (c, r) in criteria.iter().zip(&results) {
                    let want = model.latest(&Query::of([c.clone()]));
                    expected_context = expected_context.max(want);
                    prop_assert_eq!(r.as_ref().map_or(Position::NONE, |e| e.position), want);
                }
                prop_assert_eq!(context, expected_context);
                // G2: the criteria as one query, at the context position, is current.
                prop_assert_eq!(model.latest(&Query::of(criteria)), context);
                remembered.push(context);
            }
        }
    }
    Ok(())
}

/// Runs the model test on a plain or an idempotent boundary; returns the run's tally.
fn run_model_test(idempotent: bool) -> Tally {
    TALLY.with(|t| t.set(Tally::default()));
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &prop::collection::vec(op_strategy(), OPS_PER_CASE..=OPS_PER_CASE),
        |ops| run_ops(ops, idempotent),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(CASES as usize * OPS_PER_CASE >= 10_000);
    let tally = TALLY.with(Cell::get);
    println!("idempotent event ids: {idempotent}: {tally:?}");
    assert!(
        tally.commits > 1000
            && tally.conditional_commits > 300
            && tally.conflicts > 300
            && tally.non_empty_reads > 500,
        "{tally:?}"
    );
    tally
}

#[test]
fn store_matches_naive_model() {
    let tally = run_model_test(false);
    // Reused ids are just more events on a plain boundary (Orisun's behaviour).
    assert_eq!((tally.retries, tally.id_refusals), (0, 0), "{tally:?}");
}

#[test]
fn idempotent_store_matches_naive_model() {
    let tally = run_model_test(true);
    assert!(tally.retries > 300 && tally.id_refusals > 300, "{tally:?}");
}
