use std::time::{Duration, Instant};

use cairn_core::command::Command;
use cairn_tests::orisun as pb;
use cairn_tests::*;
use futures::StreamExt;
use tonic::Code;
use tonic::codec::Streaming;

fn request(
    name: &str,
    after: Option<pb::Position>,
    q: Option<pb::Query>,
) -> pb::CatchUpSubscribeToEventStoreRequest {
    pb::CatchUpSubscribeToEventStoreRequest {
        after_position: after,
        query: q,
        subscriber_name: name.to_string(),
        boundary: "default".to_string(),
    }
}

async fn subscribe(
    c: &mut Client,
    r: pb::CatchUpSubscribeToEventStoreRequest,
) -> Result<Streaming<pb::Event>, tonic::Status> {
    c.es.catch_up_subscribe_to_events(r)
        .await
        .map(|s| s.into_inner())
}

async fn take(stream: &mut Streaming<pb::Event>, n: usize) -> Vec<pb::Event> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("event within 30s")
            .expect("stream open")
            .expect("event");
        out.push(next);
    }
    out
}

async fn write_n(c: &mut Client, data: &[&str]) {
    for d in data {
        c.save("default", vec![event("T", d)], vec![])
            .await
            .expect("write");
    }
}

#[tokio::test]
async fn s1_gate_comes_first_and_subscriber_name_is_required() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let mut r = request("s", None, None);
    r.boundary = "nope".into();
    assert_eq!(
        subscribe(&mut c, r).await.expect_err("gate").code(),
        Code::FailedPrecondition
    );
    let status = subscribe(&mut c, request("", None, None))
        .await
        .expect_err("name");
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn s1_leases_are_exclusive_and_released_on_close() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let first = subscribe(&mut c, request("worker", Some(pos(0, 0)), None))
        .await
        .expect("first");
    let second = subscribe(&mut c, request("worker", Some(pos(0, 0)), None))
        .await
        .expect_err("held");
    assert_eq!(second.code(), Code::AlreadyExists);
    let _other = subscribe(&mut c, request("other-worker", Some(pos(0, 0)), None))
        .await
        .expect("another name is independent");
    drop(first);
    // The server notices the closed stream and releases the lease right away.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match subscribe(&mut c, request("worker", Some(pos(0, 0)), None)).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::AlreadyExists && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("lease not released after close: {status:?}"),
        }
    }
}

#[tokio::test]
async fn s1_a_vanished_holders_lease_expires_after_15_seconds() {
    let server = TestServer::start().await;
    let mut c = server.client();
    // A holder that took the lease and vanished without releasing it (e.g. a crashed node).
    let node = server.server().node().clone();
    let taken = Instant::now();
    node.router
        .execute(Command::AcquireLease {
            boundary: "default".into(),
            subscriber: "ghosted".into(),
            holder: "vanished-holder".into(),
            at_unix_nanos: cairn_server::state::unix_nanos(),
            ttl_nanos: Duration::from_secs(15).as_nanos() as i64,
        })
        .await
        .expect("lease taken");
    tokio::time::sleep(Duration::from_secs(12)).await;
    let status = subscribe(&mut c, request("ghosted", Some(pos(0, 0)), None))
        .await
        .expect_err("still held at 12s");
    assert_eq!(status.code(), Code::AlreadyExists);
    tokio::time::sleep_until((taken + Duration::from_millis(15_200)).into()).await;
    subscribe(&mut c, request("ghosted", Some(pos(0, 0)), None))
        .await
        .expect("expired after 15s");
}

#[tokio::test]
async fn s2_after_position_is_exclusive() {
    let server = TestServer::start().await;
    let mut c = server.client();
    write_n(&mut c, &["{}", "{}", "{}", "{}"]).await;
    let mut all = subscribe(&mut c, request("a", Some(pos(0, 0)), None))
        .await
        .expect("sub");
    let got: Vec<(i64, i64)> = take(&mut all, 4)
        .await
        .iter()
        .map(|e| pair(&e.position))
        .collect();
    assert_eq!(got, vec![(1, 0), (2, 1), (3, 2), (4, 3)]);
    let mut after = subscribe(&mut c, request("b", Some(pos(2, 1)), None))
        .await
        .expect("sub");
    let got: Vec<(i64, i64)> = take(&mut after, 2)
        .await
        .iter()
        .map(|e| pair(&e.position))
        .collect();
    assert_eq!(got, vec![(3, 2), (4, 3)]);
    // Live: the next write arrives on both.
    write_n(&mut c, &["{}"]).await;
    assert_eq!(pair(&take(&mut all, 1).await[0].position), (5, 4));
    assert_eq!(pair(&take(&mut after, 1).await[0].position), (5, 4));
}

#[tokio::test]
async fn s2_without_after_position_starts_at_the_newest_match() {
    let server = TestServer::start().await;
    let mut c = server.client();
    write_n(&mut c, &[r#"{"k":"x"}"#, r#"{"k":"x"}"#, r#"{"k":"y"}"#]).await;
    let q = Some(query(vec![criterion(&[("k", "x")])]));
    let mut s = subscribe(&mut c, request("newest", None, q.clone()))
        .await
        .expect("sub");
    assert_eq!(
        pair(&take(&mut s, 1).await[0].position),
        (2, 1),
        "newest matching event first"
    );
    write_n(&mut c, &[r#"{"k":"y"}"#, r#"{"k":"x"}"#]).await;
    assert_eq!(
        pair(&take(&mut s, 1).await[0].position),
        (5, 4),
        "then newer matches only"
    );
    // Nothing matches yet: only future events.
    let mut empty = subscribe(
        &mut c,
        request(
            "none-yet",
            None,
            Some(query(vec![criterion(&[("k", "z")])])),
        ),
    )
    .await
    .expect("sub");
    write_n(&mut c, &[r#"{"k":"z"}"#]).await;
    assert_eq!(pair(&take(&mut empty, 1).await[0].position), (6, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s2_catch_up_then_live_with_no_gap_or_duplicate_under_a_concurrent_writer() {
    const TOTAL: usize = 10_000;
    const BATCH: usize = 20;
    let server = TestServer::start().await;
    let mut writer = server
        .new_connection(Credentials::basic("admin", "changeit"))
        .await;
    let writing = tokio::spawn(async move {
        for b in 0..TOTAL / BATCH {
            let events = (0..BATCH)
                .map(|i| event("T", &format!(r#"{{"seq":{}}}"#, b * BATCH + i)))
                .collect();
            writer.save("default", events, vec![]).await.expect("write");
        }
    });
    // Start while the writer is busy: part catch-up, part live.
    let mut c = server.client();
    while c.read_all("default").await.len() < TOTAL / 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut s = subscribe(&mut c, request("tail", Some(pos(0, 0)), None))
        .await
        .expect("sub");
    let received = take(&mut s, TOTAL).await;
    writing.await.expect("writer");
    for (i, e) in received.iter().enumerate() {
        assert_eq!(
            pair(&e.position).1,
            i as i64,
            "event {i} out of order, missing or duplicated"
        );
        assert_eq!(e.data, format!(r#"{{"seq":{i}}}"#));
    }
    // Nothing extra arrives.
    let extra = tokio::time::timeout(Duration::from_millis(300), s.next()).await;
    assert!(extra.is_err(), "no events beyond the {TOTAL} written");
}

#[tokio::test]
async fn s2_filtered_subscriptions_deliver_only_matches() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let q = Some(query(vec![
        criterion(&[("color", "red")]),
        criterion(&[("size", "L"), ("color", "blue")]),
    ]));
    let mut s = subscribe(&mut c, request("filtered", Some(pos(0, 0)), q))
        .await
        .expect("sub");
    write_n(
        &mut c,
        &[
            r#"{"color":"red"}"#,
            r#"{"color":"blue","size":"S"}"#,
            r#"{"color":"blue","size":"L"}"#,
            r#"{"color":"green"}"#,
            r#"{"color":"red","size":"S"}"#,
        ],
    )
    .await;
    let got: Vec<i64> = take(&mut s, 3)
        .await
        .iter()
        .map(|e| pair(&e.position).1)
        .collect();
    assert_eq!(got, vec![0, 2, 4]);
}

#[tokio::test]
async fn s3_a_slow_consumer_loses_nothing() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let mut s = subscribe(&mut c, request("slow", Some(pos(0, 0)), None))
        .await
        .expect("sub");
    // Write far more than any buffer holds while the consumer reads nothing.
    for b in 0..60 {
        let events = (0..50)
            .map(|i| event("T", &format!(r#"{{"i":{}}}"#, b * 50 + i)))
            .collect();
        c.save("default", events, vec![]).await.expect("write");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got = take(&mut s, 3000).await;
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, e)| pair(&e.position).1 == i as i64)
    );
}
