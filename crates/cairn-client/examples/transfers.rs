//! Commands with `Client::decide`: concurrent money transfers between two accounts, each
//! decided from the accounts' events and committed only if they did not change meanwhile.
//! No overdraft, no lost update, however the transfers interleave.
//!
//! Start a server (`cairn serve`), then:
//! `cargo run -p cairn-client --example transfers -- http://127.0.0.1:5005`
//! (credentials: `CAIRN_USER` / `CAIRN_PASSWORD`, default admin / changeit).

use anyhow::bail;
use cairn_client::{
    Client, ClientConfig, Context, ContextQuery, Criterion, DecideError, NewEvent, Outcome,
};
use serde_json::json;

const BOUNDARY: &str = "default";
const TRANSFERS: usize = 16;
const OPENING_BALANCE: i64 = 100;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:5005".to_string());
    run(&endpoint).await.map(|_| ())
}

/// An account's context: its opening and every transfer from or to it.
fn account_context(account: &str) -> Vec<Criterion> {
    vec![
        Criterion::of([("opened", account)]),
        Criterion::of([("from", account)]),
        Criterion::of([("to", account)]),
    ]
}

/// The balance of `account` from its events.
fn balance(context: &Context, account: &str) -> i64 {
    let mut balance = 0;
    for event in &context.events {
        let data = event.data_json().unwrap_or_default();
        let amount = data["amount"].as_i64().unwrap_or(0);
        if data["opened"] == account {
            balance += amount;
        }
        if data["from"] == account {
            balance -= amount;
        }
        if data["to"] == account {
            balance += amount;
        }
    }
    balance
}

/// The transfers against the server at `endpoint`; returns the final balances.
pub async fn run(endpoint: &str) -> anyhow::Result<(i64, i64)> {
    let user = std::env::var("CAIRN_USER").unwrap_or_else(|_| "admin".into());
    let password = std::env::var("CAIRN_PASSWORD").unwrap_or_else(|_| "changeit".into());
    let client = Client::connect(ClientConfig::new([endpoint]).credentials(user, password)).await?;
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let (alice, bob) = (format!("alice-{run_id}"), format!("bob-{run_id}"));

    // Open each account once: the decision appends only to an empty context.
    for account in [&alice, &bob] {
        let context = ContextQuery::Latest(vec![Criterion::of([("opened", account.as_str())])]);
        client
            .decide(BOUNDARY, &context, |seen| {
                Ok::<_, std::convert::Infallible>(match seen.latest[0] {
                    Some(_) => vec![],
                    None => vec![NewEvent::new(
                        "AccountOpened",
                        &json!({ "opened": account, "amount": OPENING_BALANCE }),
                    )],
                })
            })
            .await?;
    }

    // Sixteen concurrent transfers of 30 from alice to bob: only three fit her balance.
    let mut tasks = Vec::new();
    for _ in 0..TRANSFERS {
        let (client, alice, bob) = (client.clone(), alice.clone(), bob.clone());
        tasks.push(tokio::spawn(async move {
            let mut criteria = account_context(&alice);
            criteria.extend(account_context(&bob));
            client
                .decide(BOUNDARY, &ContextQuery::All(criteria), |seen| {
                    if balance(seen, &alice) < 30 {
                        return Err("insufficient funds");
                    }
                    Ok(vec![NewEvent::new(
                        "MoneyTransferred",
                        &json!({ "from": alice, "to": bob, "amount": 30 }),
                    )])
                })
                .await
        }));
    }
    let (mut committed, mut refused, mut conflicts) = (0, 0, 0);
    for task in tasks {
        match task.await? {
            Ok(decided) => {
                conflicts += decided.conflicts;
                if let Outcome::Committed(_) = decided.outcome {
                    committed += 1;
                }
            }
            Err(DecideError::Rejected(_)) => refused += 1,
            Err(other) => bail!("a transfer failed: {other}"),
        }
    }
    let mut criteria = account_context(&alice);
    criteria.extend(account_context(&bob));
    let everything = client
        .read_all(BOUNDARY, Some(&cairn_client::Query::of(criteria)), None)
        .await?;
    let seen = Context {
        latest: vec![],
        events: everything,
        position: cairn_client::Position::NONE,
    };
    let balances = (balance(&seen, &alice), balance(&seen, &bob));
    println!(
        "{committed} transfers committed, {refused} refused for insufficient funds, \
         {conflicts} conflicts re-decided; balances: alice {}, bob {}",
        balances.0, balances.1
    );
    if committed != 3 || balances != (10, 190) {
        bail!("expected 3 transfers and balances (10, 190), got {committed} and {balances:?}");
    }
    Ok(balances)
}
