use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cairn_tests::orisun as pb;
use cairn_tests::*;

#[tokio::test]
async fn p1_p2_positions_are_dense_and_shared_by_a_write() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let first = c
        .save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("first");
    assert_eq!(pair(&first.log_position), (1, 0));
    assert_eq!(first.write_id, "1:0");
    let second = c
        .save(
            "default",
            vec![event("T", "{}"), event("T", "{}"), event("T", "{}")],
            vec![],
        )
        .await
        .expect("second");
    assert_eq!(pair(&second.log_position), (4, 3));
    assert_eq!(second.write_id, "4:3");
    let all = c.read_all("default").await;
    let positions: Vec<(i64, i64)> = all.iter().map(|e| pair(&e.position)).collect();
    assert_eq!(positions, vec![(1, 0), (4, 1), (4, 2), (4, 3)]);
    let write_ids: Vec<&str> = all.iter().map(|e| e.write_id.as_str()).collect();
    assert_eq!(write_ids, vec!["1:0", "4:3", "4:3", "4:3"]);
}

#[tokio::test]
async fn p1_a_first_three_event_write_is_3_0_to_3_2() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let r = c
        .save(
            "default",
            vec![event("A", "{}"), event("B", "{}"), event("C", "{}")],
            vec![],
        )
        .await
        .expect("write");
    assert_eq!(pair(&r.log_position), (3, 2));
    let all = c.read_all("default").await;
    let got: Vec<(String, (i64, i64))> = all
        .iter()
        .map(|e| (e.event_type.clone(), pair(&e.position)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("A".into(), (3, 0)),
            ("B".into(), (3, 1)),
            ("C".into(), (3, 2))
        ],
        "request order is position order"
    );
    let created = all[0].date_created.as_ref().expect("date_created");
    assert!(
        created.seconds > 1_700_000_000,
        "stamped by the server clock"
    );
}

#[tokio::test]
async fn p3_rejected_writes_consume_no_positions() {
    let server = TestServer::start().await;
    let mut c = server.client();
    let q = query(vec![criterion(&[("k", "v")])]);
    c.save("default", vec![event("T", r#"{"k":"v"}"#)], vec![])
        .await
        .expect("first");
    for _ in 0..3 {
        c.save(
            "default",
            vec![event("T", "{}")],
            vec![observe(q.clone(), none_pos())],
        )
        .await
        .expect_err("stale");
        c.save("default", vec![], vec![])
            .await
            .expect_err("invalid");
    }
    let next = c
        .save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("next");
    assert_eq!(pair(&next.log_position), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn p4_readers_never_see_positions_go_backwards() {
    let server = TestServer::start().await;
    let done = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for _ in 0..4 {
        let mut c = server
            .new_connection(Credentials::basic("admin", "changeit"))
            .await;
        writers.push(tokio::spawn(async move {
            for i in 0..100 {
                let n = 1 + i % 3;
                c.save(
                    "default",
                    (0..n).map(|_| event("T", "{}")).collect(),
                    vec![],
                )
                .await
                .expect("write");
            }
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..2 {
        let mut c = server
            .new_connection(Credentials::basic("admin", "changeit"))
            .await;
        let done = done.clone();
        readers.push(tokio::spawn(async move {
            let mut seen = (-1, -1);
            let mut observations = 0;
            while !done.load(Ordering::Acquire) {
                let newest = c
                    .read("default", None, None, 1, pb::Direction::Desc)
                    .await
                    .expect("read");
                if let Some(e) = newest.first() {
                    let p = pair(&e.position);
                    assert!(p >= seen, "saw {p:?} after {seen:?}");
                    seen = p;
                    observations += 1;
                }
                let latest = c
                    .latest("default", vec![criterion(&[("eventType", "T")])])
                    .await
                    .expect("latest");
                let p = pair(&latest.context_position);
                assert!(p >= seen, "latest {p:?} after {seen:?}");
                seen = p;
            }
            observations
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    done.store(true, Ordering::Release);
    for r in readers {
        assert!(r.await.expect("reader") > 0);
    }
    let all = server.client().read_all("default").await;
    let prepares: Vec<i64> = all.iter().map(|e| pair(&e.position).1).collect();
    assert_eq!(prepares, (0..all.len() as i64).collect::<Vec<_>>(), "dense");
    assert!(
        all.windows(2)
            .all(|w| pair(&w[0].position) < pair(&w[1].position))
    );
}

/// Waits until the node has built a snapshot and purged its log; the last purged index.
async fn wait_for_purge(server: &TestServer) -> u64 {
    let raft = server.server().node().raft.raft().clone();
    let mut metrics = raft.metrics();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        metrics.wait_for(|m| m.snapshot.is_some() && m.purged.is_some()),
    )
    .await
    .expect("a snapshot is built and the log purged in time")
    .expect("metrics")
    .purged
    .expect("purged")
    .index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_commands_trigger_snapshots_long_before_the_entry_count_does() {
    let server = TestServer::start_with(|c| {
        c.snapshot_every_entries = 1_000_000;
        c.snapshot_every_bytes = 64 * 1024;
    })
    .await;
    let mut c = server.client();
    let pad = "x".repeat(1_000);
    // ~1.3 MB of commands in 1,200 entries: the entry policy alone would never snapshot.
    for i in 0..1_200 {
        c.save(
            "default",
            vec![event("T", &format!(r#"{{"i":{i},"pad":"{pad}"}}"#))],
            vec![],
        )
        .await
        .expect("write");
    }
    assert!(wait_for_purge(&server).await > 0);
    assert_eq!(c.read_all("default").await.len(), 1_200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_truncate_the_log_and_a_restart_keeps_everything() {
    let server = TestServer::start_with(|c| c.snapshot_every_entries = 50).await;
    let mut c = server.client();
    // The node keeps 1,000 entries behind its latest snapshot; write well past that.
    for i in 0..1_300 {
        c.save(
            "default",
            vec![event("T", &format!(r#"{{"i":{i}}}"#))],
            vec![],
        )
        .await
        .expect("write");
    }
    assert!(wait_for_purge(&server).await > 0);
    let before = c.read_all("default").await;
    let dir = server.stop().await;

    let server = TestServer::start_in(dir, |c| c.snapshot_every_entries = 50).await;
    let mut c = server.client();
    assert_eq!(
        c.read_all("default").await,
        before,
        "state survives log truncation"
    );
    let next = c
        .save("default", vec![event("T", "{}")], vec![])
        .await
        .expect("write");
    assert_eq!(pair(&next.log_position), (1_301, 1_300));
}
