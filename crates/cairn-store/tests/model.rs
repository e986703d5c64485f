//! Model-based test of the CCC store: random operations run against the RocksDB store and a
//! naive in-memory model (a Vec scanned linearly) must produce identical outcomes,
//! positions and results. Runs ≥ 10,000 operations per run (CASES × OPS_PER_CASE).

use std::collections::BTreeMap;

use cairn_core::command::{Append, Applied, Command, Outcome};
use cairn_core::event::{NewEvent, RawEvent};
use cairn_core::query::normalize_observations;
use cairn_core::{Criterion, Error, Observation, Position, Query};
use cairn_store::{Direction, ReadStart, Store, StoreOptions};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Outcome tallies, so the test proves it exercised both sides of the CCC rule.
static COMMITS: AtomicUsize = AtomicUsize::new(0);
static CONFLICTS: AtomicUsize = AtomicUsize::new(0);
static CONDITIONAL_COMMITS: AtomicUsize = AtomicUsize::new(0);
static NON_EMPTY_READS: AtomicUsize = AtomicUsize::new(0);

const CASES: u32 = 50;
const OPS_PER_CASE: usize = 220;

#[derive(Debug, Clone)]
struct ModelEvent {
    position: Position,
    event_id: String,
    event_type: String,
    data: String,
    scalars: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Model {
    events: Vec<ModelEvent>,
}

impl Model {
    fn latest(&self, q: &Query) -> Position {
        self.events
            .iter()
            .rev()
            .find(|e| q.matches(&e.scalars))
            .map_or(Position::NONE, |e| e.position)
    }

    fn apply(&mut self, observations: &[Observation], events: &[NewEvent]) -> Outcome {
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
            )
                .prop_map(|(events, observations)| AppendSpec { events, observations })
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

fn run_ops(ops: Vec<Op>) -> Result<(), TestCaseError> {
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
                idempotent_event_ids: false,
                if_absent: false,
            },
            b"m",
        )
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let Ok(Applied::Boundary(info)) = created else {
        return Err(TestCaseError::fail("boundary not created"));
    };
    let bid = info.id;
    let mut model = Model::default();
    let mut remembered: Vec<Position> = vec![Position::NONE];
    let mut next_id = 0u64;

    for op in ops {
        match op {
            Op::Append(specs) => {
                let mut group = Vec::new();
                let mut expected = Vec::new();
                for spec in specs {
                    let events: Vec<NewEvent> = spec
                        .events
                        .iter()
                        .map(|tags| {
                            next_id += 1;
                            new_event(next_id, tags)
                        })
                        .collect();
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
                    prop_assert_eq!(&actual, &expected);
                    match actual {
                        Ok(Applied::Appended { last }) => {
                            COMMITS.fetch_add(1, Ordering::Relaxed);
                            if conditional {
                                CONDITIONAL_COMMITS.fetch_add(1, Ordering::Relaxed);
                            }
                            remembered.push(last);
                        }
                        Err(Error::Conflict { .. }) => {
                            CONFLICTS.fetch_add(1, Ordering::Relaxed);
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
                    .read_events(bid, &q, start, dir, count)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let got_positions: Vec<Position> = got.iter().map(|e| e.position).collect();
                if !got.is_empty() {
                    NON_EMPTY_READS.fetch_add(1, Ordering::Relaxed);
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

#[test]
fn store_matches_naive_model() {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &prop::collection::vec(op_strategy(), OPS_PER_CASE..=OPS_PER_CASE),
        run_ops,
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(CASES as usize * OPS_PER_CASE >= 10_000);
    let (commits, conflicts, conditional, reads) = (
        COMMITS.load(Ordering::Relaxed),
        CONFLICTS.load(Ordering::Relaxed),
        CONDITIONAL_COMMITS.load(Ordering::Relaxed),
        NON_EMPTY_READS.load(Ordering::Relaxed),
    );
    println!(
        "commits {commits} (conditional {conditional}), conflicts {conflicts}, non-empty reads {reads}"
    );
    assert!(commits > 1000 && conditional > 300 && conflicts > 300 && reads > 500);
}
