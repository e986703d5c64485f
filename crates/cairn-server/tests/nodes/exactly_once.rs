//! Exactly once through lost replies (issue 13, items 2 and 3): 1,000 commands from eight
//! concurrent clients using `cairn_client::Client::decide`, through proxies that close the
//! client's connection on some SaveEventsV2 calls, once the reply's headers arrive (the
//! write decided, the client none the wiser) or before the request reaches the node. On a boundary with idempotent event ids the client retries
//! blindly; on a plain one it looks for the command's ids before deciding again. Either
//! way every command must be stored exactly once, where the client was told it is.

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cairn_client::{Client, ClientConfig, ContextQuery, Criterion, Decided, NewEvent, Outcome};
use serde_json::json;
use support::Node;
use support::cluster::{Cluster, wait_for};
use support::lossy::LossyProxy;

const COMMANDS: u64 = 1_000;
const CLIENTS: usize = 8;
/// Commands spread over these accounts, so concurrent ones conflict now and then.
const ACCOUNTS: u64 = 16;
/// Share of SaveEventsV2 calls the proxies lose (half before the node, half after).
const LOSS: f64 = 0.2;
const IDEMPOTENT: &str = "ledger";
const PLAIN: &str = "plain";
/// A plain boundary whose commands write events outside their own context: the client
/// finds a lost write by the event's own type and fields instead.
const ELSEWHERE: &str = "elsewhere";

fn client(endpoints: &[String]) -> Client {
    Client::new(
        ClientConfig::new(endpoints.iter().cloned())
            .credentials("admin", "changeit")
            .request_timeout(Duration::from_secs(5))
            .decide_attempts(100),
    )
    .expect("client")
}

/// Runs the commands through `endpoints`; `progress` counts finished ones. Returns each
/// command's result by number. A command observes its account's context and appends one
/// event to it — except on [`ELSEWHERE`], where the event names the account under another
/// key and so lies outside the context it observed.
async fn run_commands(
    endpoints: Vec<String>,
    boundary: &'static str,
    progress: Arc<AtomicU64>,
) -> BTreeMap<u64, Decided> {
    let key = if boundary == ELSEWHERE {
        "posted_to"
    } else {
        "account"
    };
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (client, next, progress) = (client(&endpoints), next.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            loop {
                let command = next.fetch_add(1, Ordering::Relaxed);
                if command >= COMMANDS {
                    return results;
                }
                let account = format!("acct{}", command % ACCOUNTS);
                let context = ContextQuery::Latest(vec![Criterion::of([("account", &*account)])]);
                let decided = client
                    .decide(boundary, &context, |_| {
                        Ok::<_, std::convert::Infallible>(vec![NewEvent::new(
                            "Deposited",
                            &json!({ key: account, "command": command, "amount": 1 }),
                        )])
                    })
                    .await
                    .unwrap_or_else(|e| panic!("command {command} on {boundary} failed: {e}"));
                progress.fetch_add(1, Ordering::Relaxed);
                results.push((command, decided));
            }
        }));
    }
    let mut all = BTreeMap::new();
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    all
}

/// Every command stored exactly once, at the position its client was told; returns a
/// summary of how the clients got there.
async fn verify(reader: &Client, boundary: &str, decided: &BTreeMap<u64, Decided>) -> String {
    let events = reader.read_all(boundary, None, None).await.expect("read");
    assert_eq!(events.len() as u64, COMMANDS, "{boundary}: events stored");
    let mut by_command: HashMap<u64, usize> = HashMap::new();
    let mut by_id = HashMap::new();
    for event in &events {
        let command = event.data_json().expect("JSON")["command"]
            .as_u64()
            .expect("command number");
        *by_command.entry(command).or_default() += 1;
        assert!(
            by_id.insert(event.id.clone(), event.position).is_none(),
            "{boundary}: event id {} stored twice",
            event.id
        );
    }
    assert!(
        by_command.values().all(|&n| n == 1) && by_command.len() as u64 == COMMANDS,
        "{boundary}: a command stored twice or not at all"
    );
    let (mut ambiguous, mut resolved, mut conflicts, mut attempts) = (0, 0, 0, 0);
    for (command, d) in decided {
        let Outcome::Committed(result) = &d.outcome else {
            panic!("{boundary}: command {command} ended without a write");
        };
        assert_eq!(
            by_id.get(&d.event_ids[0]),
            Some(&result.position),
            "{boundary}: command {command} is not where its client was told"
        );
        ambiguous += d.ambiguous;
        resolved += d.resolved_by_reading;
        conflicts += d.conflicts;
        attempts += d.attempts;
    }
    assert!(
        ambiguous > 0,
        "{boundary}: no reply was lost; the test tested nothing"
    );
    format!(
        "{boundary}: {} commands committed once each; {attempts} writes sent, {ambiguous} \
         outcomes lost, {resolved} of them found committed by reading, {conflicts} conflicts",
        decided.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_commits_every_command_once_though_replies_are_lost() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plain = format!("{PLAIN},{ELSEWHERE}");
    let node = Node::spawn(
        dir.path(),
        &[
            "--idempotent-boundaries",
            IDEMPOTENT,
            "--boundaries",
            &plain,
        ],
    );
    let proxy = LossyProxy::start(node.addr, LOSS).await;
    let reader = client(&[format!("http://{}", node.addr)]);
    // One node and losses only before or after the node decides: no lost write is still in
    // flight when the client looks for it, so even commands writing outside their context
    // are exactly once (docs/client.md says why a cluster needs the context for that).
    for boundary in [IDEMPOTENT, PLAIN, ELSEWHERE] {
        let decided = run_commands(vec![proxy.endpoint()], boundary, Arc::default()).await;
        let summary = verify(&reader, boundary, &decided).await;
        eprintln!("{summary}");
        if boundary != IDEMPOTENT {
            assert!(
                decided.values().any(|d| d.resolved_by_reading > 0),
                "no lost reply was resolved by reading"
            );
        }
    }
    let counts = &proxy.counts;
    eprintln!(
        "proxy: {} SaveEventsV2 calls, {} replies lost after the node decided, {} requests \
         lost before it",
        counts.saves.load(Ordering::Relaxed),
        counts.lost.load(Ordering::Relaxed),
        counts.unsent.load(Ordering::Relaxed)
    );
    assert!(counts.lost.load(Ordering::Relaxed) > 0 && counts.unsent.load(Ordering::Relaxed) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_commits_once_through_random_nodes_and_a_leader_kill() {
    let mut cluster = Cluster::start(
        3,
        &["--idempotent-boundaries", IDEMPOTENT, "--boundaries", PLAIN],
    )
    .await;
    let mut proxies = BTreeMap::new();
    for id in cluster.ids() {
        proxies.insert(id, LossyProxy::start(cluster.node(id).addr, LOSS).await);
    }
    let endpoints: Vec<String> = proxies.values().map(LossyProxy::endpoint).collect();
    for boundary in [IDEMPOTENT, PLAIN] {
        let progress = Arc::new(AtomicU64::new(0));
        let run = tokio::spawn(run_commands(endpoints.clone(), boundary, progress.clone()));
        // Halfway through, the leader dies (SIGKILL) and comes back.
        wait_for("half of the commands", || {
            let progress = progress.clone();
            async move { (progress.load(Ordering::Relaxed) >= COMMANDS / 2).then_some(()) }
        })
        .await;
        let leader = cluster.leader_among(&cluster.ids()).await;
        cluster.kill(leader);
        let others: Vec<u64> = cluster.ids().into_iter().filter(|&i| i != leader).collect();
        let successor = cluster.leader_among(&others).await;
        cluster.restart(leader).await;
        proxies[&leader].retarget(cluster.node(leader).addr);
        let decided = run.await.expect("commands");
        let reader = client(&[format!("http://{}", cluster.node(successor).addr)]);
        let summary = verify(&reader, boundary, &decided).await;
        eprintln!("{summary}; leader {leader} killed at half-time, {successor} took over");
    }

    // Every replica holds the same id index, and it indexes exactly the ledger's events.
    let leader = cluster.leader_among(&cluster.ids()).await;
    let last = cluster.status(leader).await.expect("status").last_log_index;
    cluster.applied_everywhere(&cluster.ids(), last).await;
    let mut indexes = BTreeMap::new();
    for id in cluster.ids() {
        let node = cluster.members.get_mut(&id).expect("member").node.take();
        let status = node.expect("running").terminate().await;
        assert!(status.success(), "node {id} stopped cleanly: {status:?}");
        let db = cluster.member(id).data_dir().join("db");
        let index = tokio::task::spawn_blocking(move || {
            let store = cairn_store::Store::open(&db, &cairn_store::StoreOptions::default())
                .expect("open the stopped node's store");
            let bid = store
                .with_catalog(|c| c.active_boundary(IDEMPOTENT).map(|b| b.id))
                .expect("the ledger boundary");
            let events = store.event_count(bid);
            (store.event_id_index(bid).expect("the id index"), events)
        })
        .await
        .expect("join");
        indexes.insert(id, index);
    }
    let (first, events) = indexes.values().next().expect("a replica").clone();
    assert_eq!(first.len() as u64, COMMANDS, "the index holds every event");
    assert_eq!(events, COMMANDS);
    for (id, index) in &indexes {
        assert_eq!(index.0, first, "replica {id}'s id index differs");
    }
    eprintln!(
        "id indexes: {} entries, identical on {} replicas",
        first.len(),
        indexes.len()
    );
}

/// Hole 3 of the replication review: an attempt whose reply was lost and that the client
/// looked for and did not find commits after all, late, before the next attempt. That
/// attempt conflicts (the late write moved the context); before the fix the client read the
/// context again and decided again: a second deposit of a command that had committed. Now
/// every context read after an ambiguous attempt is searched for the command's ids first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_attempt_that_commits_late_is_found_not_decided_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let node = Node::spawn(dir.path(), &["--boundaries", PLAIN]);
    let proxy = LossyProxy::holding_first_save(node.addr).await;
    let through_proxy = client(&[proxy.endpoint()]);
    let context = ContextQuery::All(vec![Criterion::of([("account", "a")])]);
    let decisions = AtomicU64::new(0);
    let decided = through_proxy
        .decide(PLAIN, &context, |_| {
            decisions.fetch_add(1, Ordering::Relaxed);
            Ok::<_, std::convert::Infallible>(vec![NewEvent::new(
                "Deposited",
                &json!({ "account": "a", "amount": 10 }),
            )])
        })
        .await
        .expect("the command ends");

    let reader = client(&[format!("http://{}", node.addr)]);
    let events = reader.read_all(PLAIN, None, None).await.expect("read");
    assert_eq!(events.len(), 1, "the deposit is stored once: {events:?}");
    let Outcome::Committed(result) = &decided.outcome else {
        panic!("the command committed, but the client says {decided:?}");
    };
    assert_eq!(result.position, events[0].position, "{decided:?}");
    assert_eq!(events[0].id, decided.event_ids[0]);
    // The lost attempt, the one that conflicted with it, and the read that found it.
    assert_eq!(
        (
            decided.ambiguous,
            decided.conflicts,
            decided.resolved_by_reading
        ),
        (1, 1, 1),
        "{decided:?}"
    );
    assert_eq!(
        decisions.load(Ordering::Relaxed),
        2,
        "decided twice, not three times"
    );
    assert_eq!(proxy.counts.unsent.load(Ordering::Relaxed), 1);
}
