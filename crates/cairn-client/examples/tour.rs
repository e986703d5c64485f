//! A tour of cairn-client: append with an observation, read the context, meet a conflict
//! as a typed error, follow a subscription, and retry a write on a boundary with idempotent
//! event ids.
//!
//! Start a server (`cairn serve`), then:
//! `cargo run -p cairn-client --example tour -- http://127.0.0.1:5005`
//! (credentials: `CAIRN_USER` / `CAIRN_PASSWORD`, default admin / changeit).

use anyhow::{Context as _, bail};
use cairn_client::{
    Client, ClientConfig, Criterion, Error, NewEvent, Observation, Position, Query,
    SubscribeRequest,
};
use futures::StreamExt;
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:5005".to_string());
    run(&endpoint).await
}

/// The tour against the server at `endpoint`.
pub async fn run(endpoint: &str) -> anyhow::Result<()> {
    let user = std::env::var("CAIRN_USER").unwrap_or_else(|_| "admin".into());
    let password = std::env::var("CAIRN_PASSWORD").unwrap_or_else(|_| "changeit".into());
    let client = Client::connect(ClientConfig::new([endpoint]).credentials(user, password))
        .await
        .with_context(|| format!("failed to reach {endpoint}"))?;

    // A fresh account per run, so the tour can run again against the same server.
    let account = format!("acct-{}", uuid_suffix());
    let context = Query::of([Criterion::of([("accountId", account.as_str())])]);
    let boundary = "default";

    // 1. Open the account on condition that nothing about it exists yet.
    let empty = Observation {
        query: context.clone(),
        position: Position::NONE,
    };
    let opened = client
        .append(
            boundary,
            &[NewEvent::new(
                "AccountOpened",
                &json!({ "accountId": account, "balance": 100 }),
            )],
            std::slice::from_ref(&empty),
        )
        .await?;
    println!(
        "opened {account} at {} (write {})",
        opened.position, opened.write_id
    );

    // 2. Read the context: the newest event per criterion and the position to observe.
    let latest = client
        .latest_by_criteria(boundary, &context.criteria)
        .await?;
    println!("context is at {}", latest.context_position);

    // 3. The same stale observation again is a conflict, decoded into positions.
    match client
        .append(
            boundary,
            &[NewEvent::new(
                "AccountOpened",
                &json!({ "accountId": account }),
            )],
            &[empty],
        )
        .await
    {
        Err(Error::Conflict { expected, actual }) => {
            println!("refused: the context moved from {expected} to {actual}");
        }
        other => bail!("expected a conflict, got {other:?}"),
    }

    // 4. Follow the account from the beginning; then a debit arrives live.
    let mut events = client.subscribe(SubscribeRequest {
        boundary: boundary.to_string(),
        query: Some(context.clone()),
        after: Some(Position::BEGINNING),
        subscriber_name: format!("tour-{account}"),
    });
    let first = events.next().await.context("the subscription ended")??;
    println!("subscription: {} at {}", first.event_type, first.position);
    client
        .append(
            boundary,
            &[NewEvent::new(
                "MoneyDebited",
                &json!({ "accountId": account, "amount": 30 }),
            )],
            &[Observation {
                query: context.clone(),
                position: latest.context_position,
            }],
        )
        .await?;
    let second = events.next().await.context("the subscription ended")??;
    println!("subscription: {} at {}", second.event_type, second.position);
    if second.event_type != "MoneyDebited" {
        bail!("expected the debit, got {second:?}");
    }

    // 5. On a boundary with idempotent event ids, sending a write again (as a client does
    //    when a reply is lost) returns the first write's result and stores nothing new.
    let ledger = format!("ledger_{}", uuid_suffix());
    let info = client.create_boundary(&ledger, "tour", true).await?;
    println!(
        "created {} (idempotent event ids: {})",
        info.name, info.idempotent_event_ids
    );
    let deposit = [NewEvent::new(
        "Deposited",
        &json!({ "accountId": account, "amount": 5 }),
    )];
    let first_try = client.append(&ledger, &deposit, &[]).await?;
    let retry = client.append(&ledger, &deposit, &[]).await?;
    println!(
        "first write at {}, its retry answered {}",
        first_try.position, retry.position
    );
    if retry != first_try || client.boundary(&ledger).await?.event_count != 1 {
        bail!("the retry was applied again");
    }
    Ok(())
}

/// A suffix unique to this run (names may hold letters, digits and underscores).
fn uuid_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}")
}
