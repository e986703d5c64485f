//! The client against a real in-process Cairn server: typed errors, failover, and a
//! subscription that resumes after its connection breaks.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_client::{
    Client, ClientConfig, Criterion, Error, NewEvent, Observation, Position, Query, ReadRequest,
    SubscribeRequest,
};
use futures::StreamExt;
use serde_json::json;
use support::server;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

fn admin(endpoints: &[String]) -> Client {
    Client::new(
        ClientConfig::new(endpoints.iter().cloned())
            .in_order()
            .credentials("admin", "changeit"),
    )
    .expect("client")
}

/// A TCP relay whose open connections the test can cut at once.
#[derive(Clone)]
struct Relay {
    addr: SocketAddr,
    cut: Arc<Mutex<CancellationToken>>,
    accepted: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let relay = Relay {
            addr: listener.local_addr().expect("address"),
            cut: Arc::default(),
            accepted: Arc::default(),
        };
        let (cut, accepted) = (relay.cut.clone(), relay.accepted.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                let token = cut.lock().unwrap_or_else(|p| p.into_inner()).clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = token.cancelled() => {}
                    }
                });
            }
        });
        relay
    }

    /// Closes every open connection (new ones still go through).
    fn cut(&self) {
        let mut token = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        token.cancel();
        *token = CancellationToken::new();
    }
}

fn deposit(account: &str, n: u64) -> NewEvent {
    NewEvent::new("Deposited", &json!({ "account": account, "n": n }))
}

#[tokio::test]
async fn errors_are_typed_from_the_status() {
    let (server, _dir) = server().await;
    let endpoint = format!("http://{}", server.grpc_addr);
    let client = admin(std::slice::from_ref(&endpoint));
    let context = Query::of([Criterion::of([("account", "a")])]);
    let empty = Observation {
        query: context.clone(),
        position: Position::NONE,
    };
    let first = client
        .append("default", &[deposit("a", 1)], std::slice::from_ref(&empty))
        .await
        .expect("first write");
    assert_eq!(
        client.append("default", &[deposit("a", 2)], &[empty]).await,
        Err(Error::Conflict {
            expected: Position::NONE,
            actual: first.position
        })
    );
    assert_eq!(
        client.append("nowhere", &[deposit("a", 3)], &[]).await,
        Err(Error::BoundaryNotActive {
            boundary: "nowhere".into()
        })
    );
    let mut bad = deposit("a", 4);
    bad.event_type.clear();
    assert!(matches!(
        client.append("default", &[bad], &[]).await,
        Err(Error::InvalidArgument(_))
    ));
    let stranger =
        Client::new(ClientConfig::new([endpoint]).credentials("admin", "wrong")).expect("client");
    assert!(matches!(
        stranger.ping().await,
        Err(Error::Unauthenticated(_))
    ));
    // Nothing but the first write was stored.
    let stored = client.read_all("default", None, None).await.expect("read");
    assert_eq!(stored.len(), 1);
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn reads_fail_over_to_the_next_endpoint() {
    let (server, _dir) = server().await;
    // A port nothing listens on any more: connections to it are refused.
    let dead = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead_addr = dead.local_addr().expect("address");
    drop(dead);
    let live = format!("http://{}", server.grpc_addr);
    let client = admin(&[format!("http://{dead_addr}"), live.clone()]);
    let page = client
        .get_events(&ReadRequest::new("default", 10))
        .await
        .expect("a read served by the live node");
    assert!(page.is_empty());
    assert_eq!(
        client.current_endpoint(),
        live,
        "later calls stay on the live node"
    );
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_subscription_resumes_after_its_connection_breaks() {
    let (server, _dir) = server().await;
    let relay = Relay::start(server.grpc_addr).await;
    let writer = admin(&[format!("http://{}", server.grpc_addr)]);
    let follower = admin(&[format!("http://{}", relay.addr)]);
    let mut events = follower.subscribe(SubscribeRequest {
        boundary: "default".into(),
        query: Some(Query::of([Criterion::of([("account", "a")])])),
        after: Some(Position::BEGINNING),
        subscriber_name: "resuming".into(),
    });
    let mut written = Vec::new();
    let mut seen = Vec::new();
    for round in 0..3u64 {
        for n in 0..5 {
            let event = deposit("a", round * 5 + n);
            written.push(event.id.clone());
            writer
                .append("default", &[event, deposit("b", n)], &[])
                .await
                .expect("write");
        }
        while seen.len() < written.len() {
            let event = tokio::time::timeout(Duration::from_secs(30), events.next())
                .await
                .expect("an event within 30 s")
                .expect("the stream goes on")
                .expect("an event");
            seen.push(event);
        }
        // Break the connection under the subscription: it must pick up where it was.
        relay.cut();
    }
    let ids: Vec<&String> = seen.iter().map(|e| &e.id).collect();
    assert_eq!(
        ids,
        written.iter().collect::<Vec<_>>(),
        "every event once, in order"
    );
    assert!(seen.windows(2).all(|w| w[0].position < w[1].position));
    assert!(
        relay.accepted.load(Ordering::Relaxed) >= 3,
        "the subscription reconnected after each cut"
    );
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn the_legacy_write_and_the_index_calls_are_typed_too() {
    let (server, _dir) = server().await;
    let client = admin(&[format!("http://{}", server.grpc_addr)]);
    let context = Query::of([Criterion::of([("account", "a")])]);
    let unset = Observation {
        query: context,
        position: Position::NONE,
    };
    let first = client
        .append_legacy("default", &[deposit("a", 1)], Some(&unset))
        .await
        .expect("the legacy write");
    assert_eq!(
        client
            .append_legacy("default", &[deposit("a", 2)], Some(&unset))
            .await,
        Err(Error::Conflict {
            expected: Position::NONE,
            actual: first.position
        })
    );
    client
        .create_index(cairn_client::wire::CreateIndexRequest {
            boundary: "default".into(),
            name: "by_account".into(),
            fields: vec![cairn_client::wire::IndexField {
                json_key: "account".into(),
                value_type: cairn_client::wire::ValueType::Text as i32,
            }],
            ..Default::default()
        })
        .await
        .expect("create an index");
    let listed = client.list_indexes("default").await.expect("list");
    assert_eq!(listed.len(), 1);
    let got = client
        .get_index("default", "by_account")
        .await
        .expect("get")
        .expect("the index");
    assert_eq!(got.fields[0].json_key, "account");
    client
        .drop_index(cairn_client::wire::DropIndexRequest {
            boundary: "default".into(),
            name: "by_account".into(),
        })
        .await
        .expect("drop");
    assert!(matches!(
        client.get_index("default", "by_account").await,
        Err(Error::NotFound(_))
    ));
    server.shutdown().await.expect("clean shutdown");
}
