//! Running one scenario with N clients: warm up, measure, merge per-client statistics.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use cairn_proto::orisun as pb;
use cairn_proto::status::code_name;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use tonic::{Code, Status};

use crate::client::{ConnectOptions, Connection};
use crate::scenario::{
    READ_COUNT, Scenario, context_criterion, event, random_seed_context, seed_context,
};

/// Run-independent settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Boundary.
    pub boundary: String,
    /// Warm-up time.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
    /// Background readers (with-readers scenario).
    pub background_clients: usize,
    /// Seeded contexts.
    pub seeded_contexts: u64,
    /// Contexts command-cycle picks from.
    pub hot_contexts: u64,
    /// Show progress.
    pub progress: bool,
    /// HTTP/2 connections per endpoint and client group (0 = one per client). Clients
    /// share them round-robin, as goroutines share one gRPC channel in Go clients; with
    /// several endpoints, consecutive connections go to consecutive endpoints, so the
    /// clients are spread over every endpoint.
    pub connections: usize,
}

/// What one client (or one group of clients) measured.
struct Stats {
    latency_us: Histogram<u64>,
    requests: u64,
    events: u64,
    errors: BTreeMap<&'static str, u64>,
    retries: u64,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            // 1µs .. 1h, 3 significant digits.
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap_or_else(|_| {
                Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits are valid"))
            }),
            requests: 0,
            events: 0,
            errors: BTreeMap::new(),
            retries: 0,
        }
    }

    fn merge(&mut self, other: &Stats) {
        let _ = self.latency_us.add(&other.latency_us);
        self.requests += other.requests;
        self.events += other.events;
        self.retries += other.retries;
        for (k, v) in &other.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }

    fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    fn ms(&self, q: f64) -> f64 {
        if self.latency_us.is_empty() {
            return 0.0;
        }
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Scenario name.
    pub scenario: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Events per write request (0 for reads).
    pub events_per_request: usize,
    /// Completed requests in the measured window.
    pub requests: u64,
    /// Events written (writes) or returned (reads).
    pub events: u64,
    /// Failed requests.
    pub errors: u64,
    /// Requests per second.
    pub requests_per_second: f64,
    /// Events per second.
    pub events_per_second: f64,
    /// Latency percentiles and maximum, milliseconds.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
    /// Background load kind (with-readers), empty otherwise.
    pub background_kind: String,
    /// Background clients.
    pub background_clients: usize,
    /// Background requests.
    pub background_requests: u64,
    /// Background events.
    pub background_events: u64,
    /// Background errors.
    pub background_errors: u64,
    /// Background requests per second.
    pub background_requests_per_second: f64,
    /// Background events per second.
    pub background_events_per_second: f64,
    /// Failed requests by gRPC code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// command-cycle: writes retried after ALREADY_EXISTS.
    pub retries: u64,
    /// Measured seconds.
    pub duration_secs: f64,
}

impl RunResult {
    /// One line for the terminal.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{:<36} clients={:<4} req/s={:>10.1} events/s={:>11.1} p50={:.3}ms p99={:.3}ms errors={}",
            self.scenario,
            self.clients,
            self.requests_per_second,
            self.events_per_second,
            self.p50_ms,
            self.p99_ms,
            self.errors
        );
        if self.retries > 0 {
            s.push_str(&format!(" retries={}", self.retries));
        }
        if !self.background_kind.is_empty() {
            s.push_str(&format!(
                " | {} x{}: req/s={:.1} events/s={:.1}",
                self.background_kind,
                self.background_clients,
                self.background_requests_per_second,
                self.background_events_per_second
            ));
        }
        s
    }
}

/// A client's loop state.
struct Client {
    conn: Connection,
    rng: StdRng,
    boundary: String,
    seeded_contexts: u64,
    hot_contexts: u64,
    nonce: u64,
    seq: u64,
    read_cursor: Option<pb::Position>,
}

/// Outcome of one request: events written or read, and retries.
type Done = Result<(u64, u64), Status>;

impl Client {
    /// A context nobody has written to: unique per client, run and request.
    fn fresh_context(&mut self) -> String {
        self.seq += 1;
        format!("w-{:016x}-{}", self.nonce, self.seq)
    }

    async fn write(&mut self, n: usize, conditional: bool) -> Done {
        let context = self.fresh_context();
        let seq = self.seq;
        let events = (0..n).map(|i| event(&context, i, seq)).collect();
        let consistency = if conditional {
            vec![pb::ConsistencyObservation {
                query: Some(pb::Query {
                    criteria: vec![context_criterion(&context)],
                }),
                position: Some(pb::Position {
                    commit_position: -1,
                    prepare_position: -1,
                }),
            }]
        } else {
            vec![]
        };
        self.conn
            .calls
            .save_events_v2(pb::SaveEventsV2Request {
                boundary: self.boundary.clone(),
                events,
                consistency,
            })
            .await?;
        Ok((n as u64, 0))
    }

    async fn read_conditional(&mut self) -> Done {
        let context = random_seed_context(&mut self.rng, self.seeded_contexts);
        let events = self
            .conn
            .calls
            .get_events(pb::GetEventsRequest {
                query: Some(pb::Query {
                    criteria: vec![context_criterion(&context)],
                }),
                from_position: None,
                count: READ_COUNT,
                direction: pb::Direction::Asc as i32,
                boundary: self.boundary.clone(),
            })
            .await?
            .events;
        Ok((events.len() as u64, 0))
    }

    /// Pages through the whole boundary from the start, 1,000 events at a time, wrapping
    /// around at the end (each client keeps its own cursor).
    async fn read_unconditional(&mut self) -> Done {
        let events = self
            .conn
            .calls
            .get_events(pb::GetEventsRequest {
                query: None,
                from_position: self.read_cursor,
                count: READ_COUNT,
                direction: pb::Direction::Asc as i32,
                boundary: self.boundary.clone(),
            })
            .await?
            .events;
        // The next page starts just after the last event read: (commit, prepare + 1) lies
        // between it and the event that follows.
        self.read_cursor = events
            .last()
            .and_then(|e| e.position)
            .map(|p| pb::Position {
                commit_position: p.commit_position,
                prepare_position: p.prepare_position + 1,
            });
        Ok((events.len() as u64, 0))
    }

    async fn latest(
        &mut self,
        criteria: Vec<pb::Criterion>,
    ) -> Result<pb::GetLatestByCriteriaResponse, Status> {
        self.conn
            .calls
            .get_latest_by_criteria(pb::GetLatestByCriteriaRequest {
                boundary: self.boundary.clone(),
                criteria,
            })
            .await
    }

    async fn latest_by_criteria(&mut self) -> Done {
        let criteria = (0..4)
            .map(|_| context_criterion(&random_seed_context(&mut self.rng, self.seeded_contexts)))
            .collect();
        let r = self.latest(criteria).await?;
        Ok((
            r.results.iter().filter(|x| x.event.is_some()).count() as u64,
            0,
        ))
    }

    /// Read the context, decide, write under the observation; retry on conflict.
    async fn command_cycle(&mut self) -> Done {
        let context = seed_context(
            self.rng
                .gen_range(0..self.hot_contexts.min(self.seeded_contexts).max(1)),
        );
        let criteria = vec![context_criterion(&context)];
        let mut retries = 0;
        loop {
            let latest = self.latest(criteria.clone()).await?;
            self.seq += 1;
            let result = self
                .conn
                .calls
                .save_events_v2(pb::SaveEventsV2Request {
                    boundary: self.boundary.clone(),
                    events: vec![event(&context, 0, self.seq)],
                    consistency: vec![pb::ConsistencyObservation {
                        query: Some(pb::Query {
                            criteria: criteria.clone(),
                        }),
                        position: latest.context_position,
                    }],
                })
                .await;
            match result {
                Ok(_) => return Ok((1, retries)),
                Err(status) if status.code() == Code::AlreadyExists => retries += 1,
                Err(status) => return Err(status),
            }
        }
    }

    async fn request(&mut self, scenario: Scenario) -> Done {
        match scenario {
            Scenario::WriteConditional1 => self.write(1, true).await,
            Scenario::WriteConditional100 => self.write(100, true).await,
            Scenario::WriteUnconditional1 | Scenario::WriteUnconditional1WithReaders => {
                self.write(1, false).await
            }
            Scenario::WriteUnconditional100 => self.write(100, false).await,
            Scenario::ReadConditional => self.read_conditional().await,
            Scenario::ReadUnconditional => self.read_unconditional().await,
            Scenario::LatestByCriteria => self.latest_by_criteria().await,
            Scenario::CommandCycle => self.command_cycle().await,
        }
    }
}

async fn client_loop(
    mut client: Client,
    scenario: Scenario,
    measure_from: Instant,
    end: Instant,
) -> Stats {
    let mut stats = Stats::new();
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let outcome = client.request(scenario).await;
        if started < measure_from {
            continue;
        }
        let elapsed = started.elapsed();
        let _ = stats.latency_us.record((elapsed.as_micros() as u64).max(1));
        stats.requests += 1;
        match outcome {
            Ok((events, retries)) => {
                stats.events += events;
                stats.retries += retries;
            }
            Err(status) => {
                *stats.errors.entry(code_name(status.code())).or_default() += 1;
            }
        }
    }
    stats
}

async fn spawn_group(
    connect: &ConnectOptions,
    scenario: Scenario,
    clients: usize,
    first_index: usize,
    settings: &Settings,
    measure_from: Instant,
    end: Instant,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<Stats>>> {
    let mut handles = Vec::with_capacity(clients);
    let connections = if settings.connections == 0 {
        clients
    } else {
        (settings.connections * connect.endpoints.len()).min(clients)
    };
    let mut conns = Vec::with_capacity(connections);
    for c in 0..connections {
        conns.push(
            Connection::open(connect, first_index + c)
                .await
                .with_context(|| format!("connection {c} could not be opened"))?,
        );
    }
    for i in 0..clients {
        let client = Client {
            conn: conns[i % connections].clone(),
            rng: StdRng::from_entropy(),
            boundary: settings.boundary.clone(),
            seeded_contexts: settings.seeded_contexts,
            hot_contexts: settings.hot_contexts,
            nonce: rand::random(),
            seq: 0,
            read_cursor: None,
        };
        handles.push(tokio::spawn(client_loop(
            client,
            scenario,
            measure_from,
            end,
        )));
    }
    Ok(handles)
}

async fn collect(handles: Vec<tokio::task::JoinHandle<Stats>>) -> anyhow::Result<Stats> {
    let mut total = Stats::new();
    for h in handles {
        total.merge(&h.await.context("client task panicked")?);
    }
    Ok(total)
}

/// Runs `scenario` with `clients` clients.
pub async fn run(
    connect: &ConnectOptions,
    scenario: Scenario,
    clients: usize,
    settings: &Settings,
) -> anyhow::Result<RunResult> {
    // Connections are opened before the clock starts, so login does not count.
    let start =
        Instant::now() + Duration::from_millis(50) + Duration::from_millis(2 * clients as u64);
    let measure_from = start + settings.warmup;
    let end = measure_from + settings.duration;
    let main = spawn_group(connect, scenario, clients, 0, settings, measure_from, end).await?;
    let background = if scenario == Scenario::WriteUnconditional1WithReaders {
        spawn_group(
            connect,
            Scenario::ReadUnconditional,
            settings.background_clients,
            clients,
            settings,
            measure_from,
            end,
        )
        .await?
    } else {
        Vec::new()
    };
    let bar = if settings.progress {
        let total = (end - Instant::now()).as_millis() as u64;
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{msg:48} {bar:30} {elapsed}/{duration}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{} x{clients}", scenario.name()));
        let ticker = bar.clone();
        tokio::spawn(async move {
            let begun = Instant::now();
            while Instant::now() < end {
                ticker.set_position(begun.elapsed().as_millis() as u64);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        bar
    } else {
        ProgressBar::hidden()
    };
    let stats = collect(main).await?;
    let bg = collect(background).await?;
    bar.finish_and_clear();
    let secs = settings.duration.as_secs_f64();
    let mut errors_by_code: BTreeMap<String, u64> = stats
        .errors
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    for (k, v) in &bg.errors {
        *errors_by_code.entry(format!("background:{k}")).or_default() += v;
    }
    let with_readers = scenario == Scenario::WriteUnconditional1WithReaders;
    Ok(RunResult {
        scenario: scenario.name().to_string(),
        clients,
        events_per_request: scenario.events_per_request(),
        requests: stats.requests,
        events: stats.events,
        errors: stats.error_count(),
        requests_per_second: stats.requests as f64 / secs,
        events_per_second: stats.events as f64 / secs,
        p50_ms: stats.ms(0.50),
        p95_ms: stats.ms(0.95),
        p99_ms: stats.ms(0.99),
        max_ms: if stats.latency_us.is_empty() {
            0.0
        } else {
            stats.latency_us.max() as f64 / 1000.0
        },
        background_kind: if with_readers {
            Scenario::ReadUnconditional.name().to_string()
        } else {
            String::new()
        },
        background_clients: if with_readers {
            settings.background_clients
        } else {
            0
        },
        background_requests: bg.requests,
        background_events: bg.events,
        background_errors: bg.error_count(),
        background_requests_per_second: bg.requests as f64 / secs,
        background_events_per_second: bg.events as f64 / secs,
        errors_by_code,
        retries: stats.retries,
        duration_secs: secs,
    })
}
