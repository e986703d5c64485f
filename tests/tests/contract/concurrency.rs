use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_tests::orisun as pb;
use cairn_tests::*;
use tokio::sync::Barrier;
use tonic::Code;

/// `n` connections as the admin user, each its own HTTP/2 connection.
async fn racers(server: &TestServer, n: usize) -> Vec<Client> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(
            server
                .new_connection(Credentials::basic("admin", "changeit"))
                .await,
        );
    }
    clients
}

/// One round: every client saves `events_of(its index)` under `observation` at the same
/// moment. Losers must be refused with a CCC conflict; returns the winners' indexes and
/// results.
async fn race(
    clients: &[Client],
    observation: &pb::ConsistencyObservation,
    events_of: impl Fn(usize) -> Vec<pb::EventToSave>,
) -> Vec<(usize, pb::WriteResult)> {
    let barrier = Arc::new(Barrier::new(clients.len()));
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (mut c, barrier) = (c.clone(), barrier.clone());
        let (observation, events) = (observation.clone(), events_of(i));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.save("default", events, vec![observation])
                .await
                .map(|r| (i, r))
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(won) => winners.push(won),
            Err(status) => {
                assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
                assert!(
                    status
                        .message()
                        .starts_with("OptimisticConcurrencyException")
                );
            }
        }
    }
    winners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c3_sixteen_racers_on_one_context_exactly_one_wins_per_round() {
    const ROUNDS: usize = 20;
    let server = TestServer::start().await;
    let context = query(vec![criterion(&[("counter", "c1")])]);
    let clients = racers(&server, 16).await;
    let mut observed = none_pos();
    for round in 0..ROUNDS {
        let winners = race(&clients, &observe(context.clone(), observed), |i| {
            vec![event(
                "Incremented",
                &format!(r#"{{"counter":"c1","by":{i}}}"#),
            )]
        })
        .await;
        assert_eq!(winners.len(), 1, "round {round}: exactly one commit");
        observed = winners[0].1.log_position.expect("position");
    }
    let all = server.client().read_all("default").await;
    assert_eq!(all.len(), ROUNDS, "one event per round, nothing else");
}

/// The seed scenario: accounts opened with a balance; concurrent debits decided from the
/// latest event of the account's context, committed under that observation, retried on
/// conflict. No account is ever overdrawn and balances equal the replay of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_account_scenario_never_overdraws() {
    const ACCOUNTS: usize = 4;
    const CLIENTS: usize = 8;
    const ATTEMPTS_PER_CLIENT: usize = 30;
    const OPENING_BALANCE: i64 = 100;
    let server = TestServer::start().await;
    let mut admin = server.client();
    for a in 0..ACCOUNTS {
        admin
            .save(
                "default",
                vec![event(
                    "AccountOpened",
                    &format!(r#"{{"accountId":"acc-{a}","balance":{OPENING_BALANCE}}}"#),
                )],
                vec![],
            )
            .await
            .expect("open");
    }
    let context = |a: usize| {
        vec![
            criterion(&[
                ("eventType", "AccountOpened"),
                ("accountId", &format!("acc-{a}")),
            ]),
            criterion(&[
                ("eventType", "MoneyDebited"),
                ("scopes.accountOpenedId", &format!("acc-{a}")),
            ]),
        ]
    };
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let mut c = server
            .new_connection(Credentials::basic("admin", "changeit"))
            .await;
        tasks.push(tokio::spawn(async move {
            let (mut debits, mut refusals, mut retries) = (0, 0, 0);
            for attempt in 0..ATTEMPTS_PER_CLIENT {
                let a = (client + attempt) % ACCOUNTS;
                let amount = 7 + ((client * 13 + attempt * 5) % 11) as i64;
                loop {
                    let latest = c.latest("default", context(a)).await.expect("read context");
                    let newest = latest
                        .results
                        .iter()
                        .filter_map(|r| r.event.as_ref())
                        .max_by_key(|e| pair(&e.position))
                        .expect("account opened");
                    let data: serde_json::Value = serde_json::from_str(&newest.data).expect("json");
                    let balance = data["balance"].as_i64().expect("balance");
                    if balance < amount {
                        refusals += 1;
                        break;
                    }
                    let debit = event(
                        "MoneyDebited",
                        &format!(
                            r#"{{"scopes.accountOpenedId":"acc-{a}","amount":{amount},"balance":{}}}"#,
                            balance - amount
                        ),
                    );
                    let observation = observe(query(context(a)), latest.context_position.expect("p"));
                    match c.save("default", vec![debit], vec![observation]).await {
                        Ok(_) => {
                            debits += 1;
                            break;
                        }
                        Err(status) if status.code() == Code::AlreadyExists => retries += 1,
                        Err(status) => panic!("unexpected {status:?}"),
                    }
                }
            }
            (debits, refusals, retries)
        }));
    }
    let (mut debits, mut refusals, mut retries) = (0, 0, 0);
    for t in tasks {
        let (d, r, x) = t.await.expect("client");
        debits += d;
        refusals += r;
        retries += x;
    }
    assert!(retries > 0, "the clients really raced");
    assert!(refusals > 0, "some debits were refused for lack of funds");

    // Replay the log: balances never go negative and match the last recorded balance.
    let all = admin.read_all("default").await;
    let mut balances: BTreeMap<String, i64> = BTreeMap::new();
    let mut debited = 0;
    for e in &all {
        let data: serde_json::Value = serde_json::from_str(&e.data).expect("json");
        match e.event_type.as_str() {
            "AccountOpened" => {
                balances.insert(
                    data["accountId"].as_str().expect("id").into(),
                    OPENING_BALANCE,
                );
            }
            "MoneyDebited" => {
                debited += 1;
                let account = data["scopes.accountOpenedId"]
                    .as_str()
                    .expect("scope")
                    .to_string();
                let b = balances.get_mut(&account).expect("opened before debited");
                *b -= data["amount"].as_i64().expect("amount");
                assert!(*b >= 0, "{account} overdrawn at {:?}", e.position);
                assert_eq!(
                    data["balance"].as_i64(),
                    Some(*b),
                    "recorded balance equals replay"
                );
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!(
        debited, debits,
        "every acknowledged debit is in the log, nothing else"
    );
    let _ = pb::Direction::Asc;
}

/// The value of an unlabelled-or-labelled sample in a Prometheus text exposition.
fn sample(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Writes big enough to pipeline (a second batch entry proposed while the first is still
/// being applied) keep CCC exact: of eight racers appending 100 events of ~1 KiB each under
/// the same observation, exactly one wins per round and its events land together.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c3_large_racers_pipeline_and_still_exactly_one_wins_per_round() {
    const ROUNDS: usize = 10;
    const EVENTS_PER_WRITE: usize = 100;
    let server = TestServer::start().await;
    let context = query(vec![criterion(&[("ledger", "big")])]);
    let clients = racers(&server, 8).await;
    let padding = "p".repeat(1000);
    let mut observed = none_pos();
    for round in 0..ROUNDS {
        let winners = race(&clients, &observe(context.clone(), observed), |i| {
            (0..EVENTS_PER_WRITE)
                .map(|n| {
                    event(
                        "Posted",
                        &format!(r#"{{"ledger":"big","racer":{i},"n":{n},"pad":"{padding}"}}"#),
                    )
                })
                .collect()
        })
        .await;
        assert_eq!(winners.len(), 1, "round {round}: exactly one commit");
        observed = winners[0].1.log_position.expect("position");
    }
    let all = server.client().read_all("default").await;
    assert_eq!(all.len(), ROUNDS * EVENTS_PER_WRITE);
    for (round, write) in all.chunks(EVENTS_PER_WRITE).enumerate() {
        let racer = |e: &pb::Event| {
            serde_json::from_str::<serde_json::Value>(&e.data).expect("json")["racer"].clone()
        };
        assert!(
            write.iter().all(|e| racer(e) == racer(&write[0])),
            "round {round}: one racer's events, contiguous"
        );
    }
    let metrics = http_get(server.http_addr, "/metrics").await;
    assert!(
        sample(
            &metrics,
            r#"cairn_raft_proposals_total{overlapping="true"}"#
        ) > 0.0,
        "large concurrent writes were proposed while others were in flight"
    );
}
